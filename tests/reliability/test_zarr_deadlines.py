"""Zarr fragments and reference sets on S3 and HTTP(S) read within the body deadline of every other
remote read (zarr17: storage/timed.py, ``daskcfa.storage.min-throughput``), never waited on for ever.

Real parts only: the raw-socket server of tests/remote_helpers.py on 127.0.0.1 (a byte every 0.05 s,
each wait far below the read timeout), Zarr stores written by zarr-python, reference sets by hand.
docs/reliability.md, "Zarr fragments and reference-set chunks bounded in time (zarr17)", says which
failed on main ("still reading" at the test's bound).
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import dask
import numpy as np
import pytest

import daskcfa
from daskcfa import storage
from daskcfa.fragments.zarr import ZarrFile

from remote_helpers import failure_within, trickling_server, write_cf113

from .test_direct_s3_attacks import KEY, SECRET

#: the test's own bound on each read: far beyond the deadline
_BOUND = 30
#: a 1 s grace on HTTP (aiohttp's ``sock_read``, never reached by a byte every 0.05 s)
_HTTP = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_read=1)}}
#: the rate asked of a body: Zarr metadata is read as a range as long as the largest JSON document
#: daskcfa reads (``max-memory`` / 24: 44 MB by default, 11 minutes at 64 KiB/s), the deadline's length
_CONFIG = {"daskcfa.storage.retries": 0, "daskcfa.storage.min-throughput": "16MiB"}
#: floats in a chunk
_CHUNK = 10_000


def _s3(endpoint: str) -> dict:
    """The slow server as an S3 endpoint (a fake login; botocore's read timeout 2 s, never reached)."""
    return {"key": KEY, "secret": SECRET, "config_kwargs": {"read_timeout": 2},
            "client_kwargs": {"endpoint_url": endpoint}}


def _expect_too_slow(failure: BaseException | None, where: str) -> None:
    assert isinstance(failure, daskcfa.errors.StorageError), f"after {_BOUND} s: {failure!r} (None: still reading)"
    assert "too slowly" in str(failure) and failure.file.startswith(where), failure
    assert KEY not in str(failure) and SECRET not in str(failure)


@pytest.mark.parametrize("protocol", ["http", "s3"])
def test_a_zarr_store_whose_metadata_is_trickled_ends_within_its_deadline(protocol):
    """zarr-python reads a store's metadata through fsspec's ``_cat_file``, which sets no deadline
    (aiohttp's 5 minutes a request on HTTP; on S3 none past each socket wait): on main, opening
    the store was still reading at the test's bound. Now a ``StorageError`` "too slowly" naming
    the object."""
    endpoint, stop, listener = trickling_server("trickle", 100_000)
    if protocol == "http":
        uri, profile = f"{endpoint}/dir/f0.zarr", storage.profiles.register(_HTTP, protocol="http")
    else:
        uri, profile = "s3://bucket/f0.zarr", storage.profiles.register(_s3(endpoint), protocol="s3")

    def attempt() -> None:
        with dask.config.set(_CONFIG):
            ZarrFile(uri, profile)

    _expect_too_slow(failure_within(attempt, stop, listener, _BOUND), uri)


def _zarr_store(tmp_path: Path, prefix: str, chunk: int = _CHUNK) -> dict[str, bytes | None]:
    """A Zarr v2 store of ``x`` (2 chunks of ``chunk`` floats; by default longer than a trickle brings in
    the grace) as the server's paths under ``prefix``:
    its metadata answered at once, the names zarr-python looks for first absent (404), its
    chunks left out (trickled)."""
    import zarr

    store = tmp_path / "f0.zarr"
    array = zarr.create_array(str(store), name="x", shape=(2 * chunk,), chunks=(chunk,), dtype="f4", zarr_format=2,
                              compressors=None, attributes={"_ARRAY_DIMENSIONS": ["n"]})
    array[:] = np.arange(2 * chunk, dtype="f4")
    files = {f"{prefix}/{p.relative_to(store).as_posix()}": p.read_bytes() for p in store.rglob("*")
             if p.is_file() and p.name.startswith(".")}
    for name in ("zarr.json", ".zmetadata", "x/zarr.json", "x/.zgroup", ".zattrs"):
        files.setdefault(f"{prefix}/{name}", None)
    return files


def test_a_zarr_fragment_whose_chunk_is_trickled_is_a_storage_error_naming_fragment_and_variable(tmp_path):
    """The same for a chunk, through ``from_cfa``: a Zarr fragment at an ``http://`` URL whose metadata
    comes at once and whose chunks are trickled (main: still reading at the test's bound), with a login
    given for its origin, which the error does not show."""
    endpoint, stop, listener = trickling_server("trickle", 100_000, prompt=_zarr_store(tmp_path, "/dir/f0.zarr"))
    uri = f"{endpoint}/dir/f0.zarr"
    aggregation = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[2 * _CHUNK]], [[uri]])
    password = "pw-zarr17-secret"

    def read() -> None:
        with dask.config.set(_CONFIG):
            options = {"http": _HTTP, f"{endpoint}/": {"headers": {"Authorization": f"Bearer {password}"}}}
            daskcfa.from_cfa(str(aggregation), "x", storage_options=options,
                             allowed_locations=[f"{endpoint}/"]).compute(scheduler="sync")

    failure = failure_within(read, stop, listener, _BOUND)
    assert isinstance(failure, daskcfa.errors.CFAError), f"after {_BOUND} s: {failure!r} (None: still reading)"
    assert "too slowly" in str(failure) and f"{uri}/x/" in str(failure)  # (zarr reads both chunks at once)
    assert "variable '/x'" in str(failure) and "fragment (0,)" in str(failure)
    assert password not in str(failure) and password not in repr(failure)


def test_an_http_zarr_chunk_without_end_is_read_no_further_than_its_range(tmp_path):
    """A server answering a chunk's range with a body without end (chunked): fsspec's HTTP ``_cat_file``
    reads a body whole (main: still reading at the test's bound). Now no further than the range asked
    for (the chunk's bound and one byte): refused as a chunk larger than its array's chunks can be."""
    endpoint, stop, listener = trickling_server("chunked", 100_000, prompt=_zarr_store(tmp_path, "/dir/f0.zarr", 2))

    def attempt() -> None:
        with dask.config.set(_CONFIG):
            ZarrFile(f"{endpoint}/dir/f0.zarr", storage.profiles.register(_HTTP, protocol="http")
                     ).variable("x").read((slice(0, 4, 1),))

    failure = failure_within(attempt, stop, listener, _BOUND)
    assert isinstance(failure, daskcfa.errors.FragmentReadError), f"after {_BOUND} s: {failure!r} (None: still reading)"
    assert "stores more than 8 bytes" in str(failure)


def test_a_zarr_fragment_served_at_once_reads_as_before(tmp_path):
    """The normal way unchanged: the same store, every object answered at once, read right."""
    files = _zarr_store(tmp_path, "/dir/f0.zarr")
    files.update({f"/dir/f0.zarr/x/{k}": np.arange(k * _CHUNK, (k + 1) * _CHUNK, dtype="<f4").tobytes()
                  for k in (0, 1)})
    endpoint, stop, listener = trickling_server("trickle", 100_000, prompt=files)
    try:
        with dask.config.set({"daskcfa.storage.retries": 0}):
            variable = ZarrFile(f"{endpoint}/dir/f0.zarr").variable("x")
            assert np.array_equal(variable.read((slice(0, 2 * _CHUNK, 1),)), np.arange(2 * _CHUNK, dtype="f4"))
    finally:
        stop.set()
        listener.close()


def _reference_set(target: str) -> bytes:
    """A JSON reference set of ``x`` (2 chunks of :data:`_CHUNK` floats) whose chunks are byte ranges
    of ``target``."""
    zarray = {"shape": [2 * _CHUNK], "chunks": [_CHUNK], "dtype": "<f4", "compressor": None, "filters": None, "fill_value": None,
              "order": "C", "zarr_format": 2}
    return json.dumps({"version": 1, "refs": {
        ".zgroup": json.dumps({"zarr_format": 2}), "x/.zarray": json.dumps(zarray),
        "x/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["n"]}),
        "x/0": [target, 0, 4 * _CHUNK], "x/1": [target, 4 * _CHUNK, 4 * _CHUNK]}}).encode()


@pytest.mark.parametrize("trickled", ["the reference set", "a chunk's target", "the Parquet set's .zmetadata"])
def test_a_reference_set_or_its_target_trickled_ends_within_its_deadline(tmp_path, trickled):
    """A reference set's own files and its chunks' byte ranges are read through the storage layer
    (``read_json``, ``size``, ``read_ranges``), already under the deadline on main (these pass there:
    they guard that it stays so)."""
    prompt: dict[str, bytes | None] = {}
    if trickled == "a chunk's target":
        prompt["/refs.json"] = _reference_set("data.bin")
    endpoint, stop, listener = trickling_server("trickle", 100_000, prompt=prompt)
    uri = f"{endpoint}/refs.parq" if "Parquet" in trickled else f"{endpoint}/refs.json"
    profile = storage.profiles.register(_HTTP, protocol="http")

    def attempt() -> None:
        with dask.config.set(_CONFIG):
            ZarrFile(uri, profile).variable("x").read((slice(0, 2 * _CHUNK, 1),))

    _expect_too_slow(failure_within(attempt, stop, listener, _BOUND), endpoint)


def test_an_s3_zarr_fragment_trickled_through_from_cfa_names_fragment_and_variable_not_the_login(tmp_path):
    """The same on S3 through ``from_cfa`` (main: still reading at the test's bound): the error names the
    object, the variable and the fragment; neither the key nor the secret."""
    endpoint, stop, listener = trickling_server("trickle", 100_000)
    uri = "s3://bucket/f0.zarr"
    aggregation = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[2 * _CHUNK]], [[uri]])

    def read() -> None:
        with dask.config.set(_CONFIG):
            daskcfa.from_cfa(str(aggregation), "x", storage_options={"s3": _s3(endpoint)}).compute(scheduler="sync")

    failure = failure_within(read, stop, listener, _BOUND)
    _expect_too_slow(failure, uri)
    assert "variable '/x'" in str(failure) and "fragment (0,)" in str(failure)
    assert KEY not in repr(failure) and SECRET not in repr(failure)
