"""Attacks on the doors session 13 changed (attack14): the head-only inflate of a local deflated HDF5
chunk, numeric types told from the HDF5 datatype (``_plain``), fragment reads returning plain arrays
when nothing is masked, and every place a URI is written for others to read.

Real parts only: netCDF-4 files written by netCDF4-python, then changed with h5py (chunks written
raw with ``write_direct_chunk``, attributes of odd HDF5 types made with ``h5py.h5t``) or byte by byte
(a chunk index entry); the suite's HTTP server requiring a login. The ground truth is
netCDF4-python's own reading of the same file. Each test of a fix failed on the code before it
(docs/reliability.md, "Session 13's doors attacked (attack14)").
"""

from __future__ import annotations

import secrets
import struct
import zlib
from pathlib import Path

import dask
import h5py
import netCDF4
import numpy as np
import pytest

import daskcfa

from remote_helpers import write_cf113

#: elements of the one float32 chunk of the fragments below (64 KiB of values)
N = 1 << 14
VALUES = np.arange(N, dtype="f4") * 0.5


def _one_chunk_fragment(directory: Path, raw: bytes | None = None) -> tuple[Path, Path]:
    """A CF-1.13 aggregation of one netCDF-4 fragment ``x(n)``, one zlib chunk holding ``VALUES``
    (or the stored bytes ``raw``): (the aggregation, the fragment)."""
    directory.mkdir(parents=True, exist_ok=True)
    fragment = directory / "f.nc"
    with netCDF4.Dataset(fragment, "w") as nc:
        nc.createDimension("n", N)
        nc.createVariable("x", "f4", ("n",), zlib=True, shuffle=False, chunksizes=(N,))[...] = VALUES
    if raw is not None:
        with h5py.File(fragment, "r+") as h5:
            h5["x"].id.write_direct_chunk((0,), raw, 0)
    return write_cf113(directory / "agg.nc", "x", ("n",), [[N]], [["f.nc"]]), fragment


def _read_point(aggregation: Path, index) -> np.ndarray:
    with dask.config.set({"daskcfa.io.engine": "direct"}):
        got = daskcfa.open_cfa(str(aggregation))["x"][index]
    return np.ma.asarray(got.compute(scheduler="sync") if hasattr(got, "compute") else got)


def chunk_entry(fragment: Path) -> tuple[bytearray, int]:
    """The fragment's bytes and where the one chunk's entry of its v1 B-tree starts (found by its whole
    key: size (4 bytes), filter mask (4), offsets (8 each), then the chunk's address (8))."""
    with h5py.File(fragment, "r") as h5:
        info = h5["x"].id.get_chunk_info(0)
    data = bytearray(fragment.read_bytes())
    key = struct.pack("<IIQQQ", info.size, info.filter_mask, 0, 0, info.byte_offset)
    at = data.find(key)
    assert at >= 0 and data.find(key, at + 1) < 0
    return data, at


def _set_chunk_size(fragment: Path, size: int) -> None:
    """Rewrite the stored size of the one chunk in the fragment's v1 B-tree."""
    data, at = chunk_entry(fragment)
    data[at:at + 4] = struct.pack("<I", size)
    fragment.write_bytes(bytes(data))


# ---------------------------------------------------------------------------
# head-only inflate of a local deflated chunk (fragments/hdf5.py, codecs.inflate_head)
# ---------------------------------------------------------------------------
def _deflated(values: np.ndarray) -> bytes:
    return zlib.compress(values.tobytes(), 6)


DAMAGED = {
    "cut to half": lambda: _deflated(VALUES)[: len(_deflated(VALUES)) // 2],
    "garbage after the stream": lambda: _deflated(VALUES) + bytes(range(256)) * 20,
    "a stream of half the chunk": lambda: _deflated(VALUES[: N // 2]),
    "a stream of twice the chunk": lambda: _deflated(np.concatenate([VALUES, VALUES])),
    "not zlib": lambda: bytes(range(7, 250)) * 12,
}


@pytest.mark.parametrize("index", [0, 5, N // 2 - 1, N // 2, N - 1, slice(0, 10), slice(None)])
@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_chunk_read_by_its_head_gives_its_values_or_names_the_fragment(tmp_path, damage, index):
    """Point and slice reads of a chunk whose stream is cut, padded, too short, too long or not zlib:
    the values the stream holds there (equal to what was written) or a FragmentReadError naming file,
    variable and fragment; never another value nor another error. (Held: a read that needs only the
    stream's head does not see damage after it, as before session 13: the stream's checksum is checked
    by whole reads only, and the chunk has no Fletcher-32 checksum.)"""
    aggregation, fragment = _one_chunk_fragment(tmp_path, DAMAGED[damage]())
    try:
        got = _read_point(aggregation, index)
    except daskcfa.FragmentReadError as exc:
        assert exc.file == str(fragment) and exc.variable == "/x" and exc.fragment == (0,), exc
        return
    np.testing.assert_array_equal(got, VALUES[index])
    assert not np.ma.is_masked(got)


@pytest.mark.parametrize("index", [0, N // 2, N - 1, slice(None)])
def test_a_chunk_running_past_the_end_of_its_file_is_refused_at_every_point(tmp_path, index):
    """A chunk whose B-tree entry claims 100 bytes more than the file holds after it (as a file cut
    short would): netCDF4 refuses every read. Before session 13 the direct reader did too (the whole
    chunk was read); its head-only reads returned the head's values, whatever the rest."""
    aggregation, fragment = _one_chunk_fragment(tmp_path)
    with h5py.File(fragment, "r") as h5:
        info = h5["x"].id.get_chunk_info(0)
    assert info.byte_offset + info.size == fragment.stat().st_size  # (the chunk ends the file)
    _set_chunk_size(fragment, info.size + 100)
    with pytest.raises(daskcfa.FragmentReadError) as refused:
        _read_point(aggregation, index)
    assert refused.value.file == str(fragment) and refused.value.fragment == (0,)
    with netCDF4.Dataset(fragment) as nc, pytest.raises(RuntimeError):
        nc["x"][index]


def test_a_chunk_of_stored_size_zero_is_refused_as_a_corrupt_chunk(tmp_path):
    """A B-tree entry giving the one chunk 0 stored bytes: a FragmentReadError saying the chunk is
    corrupt (before: "list index out of range", from the batching of the chunks to fetch)."""
    aggregation, fragment = _one_chunk_fragment(tmp_path)
    _set_chunk_size(fragment, 0)
    for index in (0, slice(None)):
        with pytest.raises(daskcfa.FragmentReadError, match=r"chunk at \(0,\)") as refused:
            _read_point(aggregation, index)
        assert refused.value.file == str(fragment)


def test_a_chunk_index_entry_running_past_the_end_of_its_fragment_is_left_out(tmp_path):
    """The same lie in a chunk index (``daskcfa.index``'s ``.agg.nc.chunks.json``, edited: the chunk
    100 bytes longer than the file holds after it), read with ``chunk_index=True``: the entry is left
    out with a CFAWarning (the index's reader checks every byte range against the fragment's recorded
    size) and the fragment read without it, exactly. (Held.)"""
    import json

    aggregation, fragment = _one_chunk_fragment(tmp_path)
    daskcfa.index(str(aggregation))
    path = tmp_path / ".agg.nc.chunks.json"
    document = json.loads(path.read_text())
    entry = document["variables"]["/x"][0]
    assert entry["offsets"][0] + entry["sizes"][0] == fragment.stat().st_size
    entry["sizes"][0] += 100
    path.write_text(json.dumps(document))
    for index in (0, N // 2, slice(None)):
        with pytest.warns(daskcfa.CFAWarning, match="outside the fragment"):
            got = daskcfa.from_cfa(str(aggregation), "x", chunk_index=True)[index].compute(scheduler="sync")
        np.testing.assert_array_equal(got, VALUES[index])


# ---------------------------------------------------------------------------
# numeric types told from the HDF5 datatype (hdf5_netcdf._plain) and what netCDF shows
# ---------------------------------------------------------------------------
SMALL = np.array([0, 1, 2, np.nan, -0.0, 5, 6, 7], "f4")


def _scalar_attribute(dsid, name: str, tid, value: np.ndarray, mtype) -> None:
    attribute = h5py.h5a.create(dsid, name.encode(), tid, h5py.h5s.create(h5py.h5s.SCALAR))
    attribute.write(value, mtype=mtype)


def _odd_type(bits: int, *, offset: int = 0):
    """A little-endian 32-bit integer type holding ``bits`` bits from bit ``offset``."""
    tid = h5py.h5t.STD_I32LE.copy()
    tid.set_precision(bits)
    tid.set_offset(offset)
    return tid


def _odd_float():
    """A 32-bit float whose exponent bias is not IEEE's (HDF5 converts it; netCDF-C reads it as a float)."""
    tid = h5py.h5t.IEEE_F32LE.copy()
    tid.set_ebias(100)
    return tid


ATTRIBUTES = {  # case: (the attribute, how to add it to dataset x with h5py)
    "16-bit float scale_factor": ("scale_factor", lambda ds: ds.attrs.create("scale_factor", np.float16(2.0))),
    "128-bit float scale_factor": ("scale_factor", lambda ds: ds.attrs.create("scale_factor", np.longdouble(2.0))),
    "16-bit float missing_value": ("missing_value", lambda ds: ds.attrs.create("missing_value", np.float16(5.0))),
    "enum missing_value": ("missing_value", lambda ds: ds.attrs.create(
        "missing_value", np.array(5, "i4"), dtype=h5py.enum_dtype({"A": 5, "B": 6}, basetype="i4"))),
    "compound missing_value": ("missing_value", lambda ds: ds.attrs.create(
        "missing_value", np.array((5.0, 1), dtype=[("a", "f4"), ("b", "i4")]))),
    "bit-field missing_value": ("missing_value", lambda ds: _scalar_attribute(
        ds.id, "missing_value", h5py.h5t.STD_B32LE, np.array(5, "u4"), h5py.h5t.STD_B32LE)),
    "opaque missing_value": ("missing_value", lambda ds: ds.attrs.create("missing_value",
                                                                         np.void(b"\x05\x00\x00\x00"))),
    # held: types netCDF-C reads (HDF5 converting them), as the direct reader does
    "big-endian double missing_value": ("missing_value", lambda ds: ds.attrs.create(
        "missing_value", np.array([5.0], ">f8"))),
    "12-bit integer missing_value": ("missing_value", lambda ds: _scalar_attribute(
        ds.id, "missing_value", _odd_type(12), np.array(5, "i4"), h5py.h5t.NATIVE_INT32)),
    "12-bit integer at bit 4 missing_value": ("missing_value", lambda ds: _scalar_attribute(
        ds.id, "missing_value", _odd_type(12, offset=4), np.array(5, "i4"), h5py.h5t.NATIVE_INT32)),
    "non-IEEE float missing_value": ("missing_value", lambda ds: _scalar_attribute(
        ds.id, "missing_value", _odd_float(), np.array(5, "f4"), h5py.h5t.NATIVE_FLOAT)),
    "big-endian scale_factor and add_offset": ("scale_factor", lambda ds: (
        ds.attrs.create("scale_factor", np.array(2.5, ">f8")), ds.attrs.create("add_offset", np.array(1, ">f4")))),
}


@pytest.mark.parametrize("case", sorted(ATTRIBUTES))
@pytest.mark.parametrize("engine", ["direct", "netcdf4"])
def test_an_attribute_of_an_odd_hdf5_type_reads_as_netcdf4_shows_it(tmp_path, case, engine):
    """A fragment variable's ``scale_factor`` or ``missing_value`` of an HDF5 type netCDF does not
    know (16- and 128-bit floats, enum, compound, bit-field, opaque) or one HDF5 converts (big-endian,
    12-bit integers, a non-IEEE float): the values and mask netCDF4-python reads from the fragment.
    Before, the direct reader applied a 16- or 128-bit ``scale_factor`` that netCDF4 does not show
    (every value doubled), and refused the others as "KeyError: 'missing_value'" (netCDF4 reads them)."""
    _, add = ATTRIBUTES[case]
    fragment = tmp_path / "f.nc"
    with netCDF4.Dataset(fragment, "w") as nc:
        nc.createDimension("n", SMALL.size)
        nc.createVariable("x", "f4", ("n",), zlib=True)[...] = SMALL
    with h5py.File(fragment, "r+") as h5:
        add(h5["x"])
    aggregation = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[SMALL.size]], [["f.nc"]], dtype="f8")
    with netCDF4.Dataset(fragment) as nc:
        truth = np.ma.asarray(nc["x"][...]).astype("f8")
    with dask.config.set({"daskcfa.io.engine": engine}):
        got = np.ma.asarray(daskcfa.from_cfa(str(aggregation), "x").compute(scheduler="sync"))
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(truth))
    np.testing.assert_array_equal(np.ma.filled(got, -1.0), np.ma.filled(truth, -1.0))


# ---------------------------------------------------------------------------
# plain arrays when nothing is masked (fragments/canonical.py)
# ---------------------------------------------------------------------------
MASKING = {  # name: (stored dtype, stored values, attributes, _FillValue)
    "NaN _FillValue": ("f4", SMALL, {}, np.float32("nan")),
    "-0.0 _FillValue": ("f4", SMALL, {}, np.float32(-0.0)),
    "0.0 _FillValue": ("f4", SMALL, {}, np.float32(0.0)),
    "missing_value array": ("f4", SMALL, {"missing_value": np.array([1, 6], "f4")}, None),
    "NaN missing_value": ("f4", SMALL, {"missing_value": np.float32("nan")}, None),
    "valid_min above valid_max": ("f4", SMALL, {"valid_min": np.float32(6), "valid_max": np.float32(2)}, None),
    "valid_range reversed": ("f4", SMALL, {"valid_range": np.array([6, 2], "f4")}, None),
    "valid_range with NaN": ("f4", SMALL, {"valid_range": np.array([np.nan, 5], "f4")}, None),
    "packed onto the fill": ("i2", np.array([0, 1, 2, -1, 4, 5, 6, 7]), {
        "scale_factor": np.float32(0.5), "add_offset": np.float32(1.0), "missing_value": np.int16(-1)}, np.int16(5)),
    "_Unsigned with valid_max": ("i1", np.array([-1, -2, 0, 1, 2, 3, -128, 127]), {
        "_Unsigned": "true", "valid_max": np.int8(-3)}, np.int8(-2)),
    "int64 missing_value past 2**53": ("i8", np.array([2**62, 1, 2, 3, 4, 5, 6, 2**53 + 1]), {
        "missing_value": np.int64(2**53 + 1)}, None),
}


@pytest.mark.parametrize("case", sorted(MASKING))
@pytest.mark.parametrize("index", [slice(None), 3, 4, slice(2, 6, 3)])
def test_what_netcdf4_masks_is_masked_whether_or_not_the_read_is_plain(tmp_path, case, index):
    """Fill values NaN, -0.0 and 0.0, ``missing_value`` arrays and NaN, ``valid_min`` above
    ``valid_max``, a reversed or NaN ``valid_range``, packed values landing on the fill, ``_Unsigned``,
    int64 beyond float precision: every point netCDF4-python masks is masked, every other value equal,
    for whole and partial reads by both engines. (Held.)"""
    dtype, values, attrs, fill = MASKING[case]
    fragment = tmp_path / "f.nc"
    with netCDF4.Dataset(fragment, "w") as nc:
        nc.createDimension("n", len(values))
        var = nc.createVariable("x", dtype, ("n",), zlib=True, fill_value=fill)
        var.set_auto_maskandscale(False)
        var.setncatts(attrs)
        var[...] = np.asarray(values).astype(dtype)
    target = "f8" if "scale_factor" in attrs or dtype == "f4" else "i8"
    aggregation = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[len(values)]], [["f.nc"]], dtype=target)
    with netCDF4.Dataset(fragment) as nc:
        truth = np.ma.asarray(nc["x"][index])
    for engine in ("direct", "netcdf4"):
        with dask.config.set({"daskcfa.io.engine": engine}):
            got = daskcfa.from_cfa(str(aggregation), "x")[index].compute(scheduler="sync")
        np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(truth), err_msg=engine)
        np.testing.assert_array_equal(np.ma.getdata(got)[~np.ma.getmaskarray(got)],
                                      np.ma.getdata(truth)[~np.ma.getmaskarray(truth)].astype(target), err_msg=engine)


# ---------------------------------------------------------------------------
# URIs written for others to read
# ---------------------------------------------------------------------------
def _small_fragments(directory: Path, count: int) -> None:
    """``f0.nc``, ``f1.nc``... in ``directory``, each ``x(n=4)``: 0-3, 4-7..."""
    directory.mkdir()
    for k in range(count):
        with netCDF4.Dataset(directory / f"f{k}.nc", "w") as nc:
            nc.createDimension("n", 4)
            nc.createVariable("x", "f4", ("n",))[:] = np.arange(4 * k, 4 * k + 4)


def test_a_login_in_relocate_s_new_prefix_is_not_written(tmp_path, make_http_server):
    """``relocate(agg, {old: "http://reader:<pw>@host/"})``: the fragments are read with the login
    given to the reader, and neither the relocated file nor its version copy holds it (before: the
    password in clear in both; ``aggregate`` and ``rebuild`` already store URIs without a login)."""
    import base64

    password = f"moved-pw-{secrets.token_urlsafe(12)}"
    _small_fragments(tmp_path / "www", 2)
    server = make_http_server(tmp_path / "www", username="reader", password=password)
    aggregation = write_cf113(tmp_path / "out" / "agg.nc", "x", ("n",), [[4, 4]],
                              [[str(tmp_path / "www" / "f0.nc"), str(tmp_path / "www" / "f1.nc")]])
    new = server.url_for("").replace("://", f"://reader:{password}@", 1)
    moved = daskcfa.relocate(str(aggregation), {str(tmp_path / "www"): new}, target=str(tmp_path / "out" / "m.nc"))
    written = {path: path.read_bytes() for path in (tmp_path / "out").rglob("*") if path.is_file()}
    assert len(written) >= 3  # (the file, its version record and copy)
    assert not [path for path, data in written.items() if password.encode() in data or b"reader:" in data]
    login = {"headers": {"Authorization": "Basic " + base64.b64encode(f"reader:{password}".encode()).decode()}}
    got = daskcfa.from_cfa(moved, "x", storage_options={server.url_for(""): login})
    np.testing.assert_array_equal(got.compute(scheduler="sync"), np.arange(8))


def _chain(exc: BaseException) -> str:
    """The text of an exception and of every exception it chains to (what a traceback prints)."""
    texts = []
    while exc is not None:
        texts.append(f"{type(exc).__name__}: {exc} {exc.args!r}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


@pytest.mark.parametrize("where", ["the aggregation URL", "a fragment URI"])
@pytest.mark.parametrize("mark", ["/", "?", "#"])
def test_a_password_holding_a_slash_not_encoded_reaches_no_error_nor_log(tmp_path, make_http_server, caplog,
                                                                        where, mark):
    """``http://reader:pw<mark>rest@host/f.nc`` (a password holding ``/``, ``?`` or ``#`` typed as it is):
    URL parsers end the authority there, so no login is taken out and no redaction finds the password.
    Now a daskcfa error saying so, without the URL: ``ArgumentError`` (the aggregation URL) or a
    ``CFAFormatError`` naming the aggregation file and variable (a fragment URI). Before: the aggregation
    URL gave a bare ``ValueError`` whose chained error quoted the password, and fsspec's DEBUG record
    held the URL; a fragment URI gave a ``FragmentReadError`` naming it, password included."""
    import logging

    caplog.set_level(logging.DEBUG)
    password = f"{secrets.token_hex(8)}{mark}{secrets.token_hex(8)}"
    _small_fragments(tmp_path / "www", 1)
    server = make_http_server(tmp_path / "www", username="reader", password=password)
    fragment = server.url_for("f0.nc").replace("://", f"://reader:{password}@", 1)
    if where == "a fragment URI":
        aggregation = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[4]], [[fragment]])
        with pytest.raises(daskcfa.CFAFormatError) as refused:
            daskcfa.from_cfa(str(aggregation), "x").compute(scheduler="sync")
        assert refused.value.file == str(aggregation) and refused.value.variable == "/x"
    else:
        aggregation = write_cf113(tmp_path / "www" / "agg.nc", "x", ("n",), [[4]], [["f0.nc"]])
        url = server.url_for("agg.nc").replace("://", f"://reader:{password}@", 1)
        with pytest.raises(daskcfa.ArgumentError) as refused:
            daskcfa.open_cfa(url)
    assert "percent-encoded" in str(refused.value)
    texts = [_chain(refused.value)] + [record.getMessage() for record in caplog.records]
    assert not [text for text in texts for part in password.split(mark) if part in text]


# ---------------------------------------------------------------------------
# reference sets read through read_json (storage/objects.py)
# ---------------------------------------------------------------------------
@pytest.fixture
def lying_http_server():
    """An HTTP server on 127.0.0.1 whose HEAD of any path says 12 bytes and whose GET sends
    30 MiB of ``[[],...]``: its base URL."""
    import http.server
    import threading

    body = b"[" + b"[]," * (10 << 20) + b"[]]"

    class Lying(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200)
            self.send_header("Content-Length", "12")
            self.end_headers()

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:  # (the reader stopped reading: what is wanted)
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Lying)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_json_reference_set_over_http_is_bounded_at_its_get_too(lying_http_server):
    """A JSON reference set over HTTP whose HEAD says 12 bytes and whose GET sends 30 MiB, under
    ``max-memory=64MiB``: a FragmentReadError naming the set and the setting, little memory traced.
    Before: session 12 bounded the S3 GET only; fsspec's HTTP ``cat_file`` read the body whole and it
    was parsed (710 MiB traced at the peak, then "not a JSON object")."""
    import tracemalloc

    from daskcfa.fragments.reference_sets import open_reference_set

    uri = f"{lying_http_server}/refs.json"
    tracemalloc.start()
    try:
        with dask.config.set({"daskcfa.limits.max-memory": "64MiB", "daskcfa.storage.retries": 0}):
            with pytest.raises(daskcfa.FragmentReadError) as refused:
                open_reference_set(uri)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.file == uri and "max-memory" in str(refused.value), refused.value
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB traced at the peak"
