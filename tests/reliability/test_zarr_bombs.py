"""Zarr chunk bombs (issue #27, attack 2): a chunk declared as 160 bytes whose stream inflates to
512 MiB, compressed with each compressor daskcfa allows (zlib, gzip, zstd, blosc, lz4), stored
in a Zarr v2 or v3 store and inline (``base64:``) in a reference set. Each is read in a child
process under ``daskcfa.budget.memory=64MiB``: a daskcfa error naming the fragment, and the peak
resident memory grows by less than the budget plus 64 MiB (zarr-python alone inflated it whole).
The 160-byte chunk is refused from its stored size (no compressor stores 160 bytes in 0.5 MB);
the same streams declared as 4 MiB chunks reach the decoders, which stop at 4 MiB.
"""

from __future__ import annotations

import base64
import functools
import json
import zlib
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from remote_helpers import write_cf113

from .test_bombs import run_isolated

#: The chunk as declared (40 float32 values) and what its stream inflates to.
ELEMENTS, INFLATED = 40, 512 << 20
BUDGET = 64 << 20
_PIECE = 16 << 20


@functools.lru_cache
def _deflate_body() -> bytes:
    """Raw deflate blocks of INFLATED zeros, built fast: after a full flush the compressor emits
    the same bytes for the same input, so one 16 MiB block is compressed once and repeated."""
    piece = bytes(_PIECE)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = compressor.compress(piece) + compressor.flush(zlib.Z_FULL_FLUSH)
    again = compressor.compress(piece) + compressor.flush(zlib.Z_FULL_FLUSH)
    return first + again * (INFLATED // _PIECE - 1) + compressor.flush()


def _checksums() -> tuple[int, int]:
    piece, adler, crc = bytes(_PIECE), 1, 0
    for _ in range(INFLATED // _PIECE):
        adler, crc = zlib.adler32(piece, adler), zlib.crc32(piece, crc)
    return adler, crc


@functools.lru_cache
def bomb(codec: str) -> bytes:
    """A valid ``codec`` stream of INFLATED zero bytes (numcodecs' formats, which Zarr v3's use too)."""
    if codec in ("zlib", "gzip"):
        adler, crc = _checksums()
        if codec == "zlib":
            return b"\x78\xda" + _deflate_body() + adler.to_bytes(4, "big")
        header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
        return header + _deflate_body() + crc.to_bytes(4, "little") + (INFLATED & 0xFFFFFFFF).to_bytes(4, "little")
    zeros = np.zeros(INFLATED, np.uint8)
    compressor = {"zstd": numcodecs.Zstd(level=1), "lz4": numcodecs.LZ4(),
                  "blosc": numcodecs.Blosc(cname="lz4", clevel=9, shuffle=numcodecs.Blosc.NOSHUFFLE)}[codec]
    return bytes(compressor.encode(zeros))


V2_COMPRESSORS = {"zlib": {"id": "zlib", "level": 1}, "gzip": {"id": "gzip", "level": 1},
                  "zstd": {"id": "zstd", "level": 1}, "lz4": {"id": "lz4", "acceleration": 1},
                  "blosc": {"id": "blosc", "cname": "lz4", "clevel": 9, "shuffle": 0, "blocksize": 0}}
V3_COMPRESSORS = {"zlib": {"name": "numcodecs.zlib", "configuration": {"level": 1}},
                  "gzip": {"name": "gzip", "configuration": {"level": 1}},
                  "zstd": {"name": "zstd", "configuration": {"level": 1, "checksum": False}},
                  "lz4": {"name": "numcodecs.lz4", "configuration": {"acceleration": 1}},
                  "blosc": {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 9, "shuffle": "noshuffle",
                                                               "typesize": 4, "blocksize": 0}}}


def _documents(fmt: int, codec: str, elements: int = ELEMENTS) -> tuple[dict[str, dict], str]:
    """The metadata documents of a store holding ``x(n=elements)`` float32 in one ``codec`` chunk,
    and its chunk key."""
    if fmt == 2:
        return {".zgroup": {"zarr_format": 2}, "x/.zattrs": {"_ARRAY_DIMENSIONS": ["n"]},
                "x/.zarray": {"zarr_format": 2, "shape": [elements], "chunks": [elements], "dtype": "<f4",
                              "compressor": V2_COMPRESSORS[codec], "filters": None, "fill_value": None,
                              "order": "C"}}, "x/0"
    return {"zarr.json": {"zarr_format": 3, "node_type": "group", "attributes": {}},
            "x/zarr.json": {"zarr_format": 3, "node_type": "array", "shape": [elements], "data_type": "float32",
                            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [elements]}},
                            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                            "fill_value": 0.0, "dimension_names": ["n"], "attributes": {},
                            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                       V3_COMPRESSORS[codec]]}}, "x/c/0"


def _bomb_aggregation(directory: Path, form: str, codec: str, elements: int = ELEMENTS) -> tuple[Path, str]:
    """``agg.nc`` whose one fragment holds the bomb: a store (``v2-store``, ``v3-store``) or a
    reference set with the chunk inline (``v2-inline``, ``v3-inline``); and the fragment's name."""
    fmt = int(form[1])
    documents, key = _documents(fmt, codec, elements)
    directory.mkdir(parents=True, exist_ok=True)
    if form.endswith("store"):
        name = "bomb.zarr"
        for path, doc in documents.items():
            (directory / name / path).parent.mkdir(parents=True, exist_ok=True)
            (directory / name / path).write_text(json.dumps(doc))
        (directory / name / key).parent.mkdir(parents=True, exist_ok=True)
        (directory / name / key).write_bytes(bomb(codec))
    else:
        name = "bomb.json"
        refs = {**documents, key: "base64:" + base64.b64encode(bomb(codec)).decode()}
        (directory / name).write_text(json.dumps({"version": 1, "refs": refs}))
    return write_cf113(directory / "agg.nc", "x", ("n",), [[elements]], [[name]]), name


@pytest.mark.parametrize("form", ["v2-store", "v3-store", "v2-inline", "v3-inline"])
@pytest.mark.parametrize("codec", ["zlib", "gzip", "zstd", "blosc", "lz4"])
def test_zarr_chunk_bombs_are_refused_within_the_memory_budget(tmp_path, form, codec):
    path, name = _bomb_aggregation(tmp_path, form, codec)
    result = run_isolated(path, action="read", variable="x", index=[ELEMENTS - 1],
                          config={"daskcfa.budget.memory": "64MiB"})
    print(f"\nZarr bomb, {form}, {codec}: peak growth {result['growth'] / 2**20:.0f} MiB: {result.get('message')}")
    assert result["error"] == "FragmentReadError", result
    assert result["file"].endswith(name) and result["variable"] == "/x", result
    assert result["growth"] < BUDGET + (64 << 20), result


@pytest.mark.parametrize("form", ["v2-store", "v3-inline"])
@pytest.mark.parametrize("codec", ["zlib", "gzip", "zstd", "blosc", "lz4"])
def test_bombs_declared_as_large_chunks_stop_at_their_size(tmp_path, form, codec):
    """The 512 MiB streams declared as one 4 MiB chunk: stored within what a 4 MiB chunk may take,
    so the bounded decoder sees them, and stops at 4 MiB (or refuses the header's claim)."""
    elements = 1 << 20
    assert len(bomb(codec)) < 4 * elements
    path, name = _bomb_aggregation(tmp_path, form, codec, elements)
    result = run_isolated(path, action="read", variable="x", index=[elements - 1],
                          config={"daskcfa.budget.memory": "64MiB"})
    print(f"\nZarr bomb in 4 MiB, {form}, {codec}: peak growth {result['growth'] / 2**20:.0f} MiB: "
          f"{result.get('message')}")
    assert result["error"] == "FragmentReadError" and "stores more" not in result["message"], result
    assert result["file"].endswith(name), result
    assert result["growth"] < BUDGET + (64 << 20), result


@pytest.mark.parametrize("form", ["v2-store", "v3-inline"])
def test_chunks_of_every_allowed_compressor_read_exactly(tmp_path, form):
    """The same layouts holding genuine chunks (each compressor's own encoding of the values): read back exactly."""
    import daskcfa

    values = np.linspace(-5, 5, ELEMENTS, dtype="<f4")
    v3 = {"zlib": numcodecs.Zlib(1), "gzip": numcodecs.GZip(1), "zstd": numcodecs.Zstd(1), "lz4": numcodecs.LZ4(),
          "blosc": numcodecs.Blosc(cname="lz4", clevel=9, shuffle=numcodecs.Blosc.NOSHUFFLE)}
    for codec, compressor in v3.items():
        directory = tmp_path / codec
        path, name = _bomb_aggregation(directory, form, codec)
        chunk = bytes(compressor.encode(values.tobytes()))
        if form.endswith("store"):
            (directory / name / _documents(2, codec)[1]).write_bytes(chunk)
        else:
            refs = json.loads((directory / name).read_text())
            refs["refs"]["x/c/0"] = "base64:" + base64.b64encode(chunk).decode()
            (directory / name).write_text(json.dumps(refs))
        np.testing.assert_array_equal(daskcfa.from_cfa(str(path), "x").compute(scheduler="sync"), values)


@pytest.mark.parametrize("lie", [{"id": "astype", "encode_dtype": "|S13421773", "decode_dtype": "<f4"},
                                 {"id": "delta", "dtype": "<f4", "astype": "<U3355444"},
                                 {"id": "fixedscaleoffset", "offset": 0, "scale": 1, "dtype": "<f4", "astype": "<f8"}],
                         ids=lambda lie: lie["id"])
def test_a_filter_storing_a_wider_type_is_charged_at_its_size(tmp_path, lie):
    """A filter's stored type wider than the array's (``x(40)`` float32 stored as 40 strings of
    13 MB): its chunks decode to that type's size, 512 MiB here, before the filter undoes it; that
    size is reserved from the budget, so the bomb is refused before it is inflated (the reservation
    counted the array's 160 bytes: 531 MiB of growth). ``<f8`` is a plain 2x: read exactly."""
    path, name = _bomb_aggregation(tmp_path, "v2-store", "zlib")
    zarray = tmp_path / name / "x" / ".zarray"
    meta = json.loads(zarray.read_text())
    zarray.write_text(json.dumps({**meta, "filters": [lie]}))
    if lie.get("astype") == "<f8":  # (a genuine wider stored type reads exactly)
        values = np.linspace(-5, 5, ELEMENTS, dtype="<f4")
        (tmp_path / name / "x" / "0").write_bytes(zlib.compress(values.astype("<f8").tobytes()))
        import daskcfa

        np.testing.assert_array_equal(daskcfa.from_cfa(str(path), "x").compute(scheduler="sync"), values)
        return
    result = run_isolated(path, action="read", variable="x", index=[ELEMENTS - 1],
                          config={"daskcfa.budget.memory": "64MiB"})
    print(f"\nZarr bomb behind {lie}: peak growth {result['growth'] / 2**20:.0f} MiB: {result.get('message')}")
    assert result["error"] == "BudgetError" and result["file"].endswith(name), result
    assert result["growth"] < BUDGET + (64 << 20), result


@pytest.mark.parametrize("codec,filters", [("zlib", [{"id": "shuffle", "elementsize": 4}]),
                                           ("blosc", [{"id": "delta", "dtype": "<f4"}])], ids=["zlib-shuffle", "blosc-delta"])
def test_bombs_inline_in_a_parquet_reference_set_behind_elementwise_filters(tmp_path, codec, filters):
    """The 512 MiB streams as a Parquet reference set's ``raw`` bytes, declared as one 4 MiB chunk
    whose compressor comes after shuffle or delta: decoded to 4 MiB (then the filter), never further."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    elements = 1 << 20
    documents, _ = _documents(2, codec, elements)
    documents["x/.zarray"]["filters"] = filters
    root = tmp_path / "bomb.parq"
    (root / "x").mkdir(parents=True)
    (root / ".zmetadata").write_text(json.dumps({"metadata": documents, "record_size": 1}))
    pq.write_table(pa.table({"raw": pa.array([bomb(codec)], pa.binary())}), root / "x" / "refs.0.parq")
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[elements]], [["bomb.parq"]])
    result = run_isolated(path, action="read", variable="x", index=[elements - 1],
                          config={"daskcfa.budget.memory": "64MiB"})
    print(f"\nZarr bomb in Parquet, {codec} after {filters[0]['id']}: peak growth {result['growth'] / 2**20:.0f} MiB: "
          f"{result.get('message')}")
    assert result["error"] == "FragmentReadError" and result["file"].endswith("bomb.parq"), result
    assert result["growth"] < BUDGET + (64 << 20), result
