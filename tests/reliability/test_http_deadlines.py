"""Every remote read bounded in time (http17): HTTP(S) objects under the body deadline of S3's
(storage/deadline.py, ``daskcfa.storage.min-throughput``), through storage/timed.py.

Real parts only: a server on 127.0.0.1 (raw sockets, threads) answering a byte now and then, each wait
far below the read timeout, so that no socket timeout fires; netCDF files by netCDF4-python. Each test
of a deadline failed on main (8e760ed): its reader still receiving at the test's bound (docs/reliability.md,
"Every remote read bounded in time (http17)").
"""

from __future__ import annotations

import aiohttp
import dask
import pytest

import daskcfa
from daskcfa import storage
from daskcfa.storage.lease import Lease

from remote_helpers import failure_within, trickling_server, write_cf113

from .test_direct_s3_attacks import KEY, SECRET

#: the test's own bound on each read: far beyond the deadline (1 s grace, a few bytes at 64 KiB/s)
_BOUND = 30
#: the objects' length (the server's)
_LENGTH = 100_000


#: a 1 s grace (aiohttp's ``sock_read``: each wait for the socket, never reached by a byte every 0.05 s)
_OPTIONS = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_read=1)}}
_READS = {
    "a whole object (GET)": ("trickle", lambda uri, p: storage.read_whole(uri, p)),
    "a whole object within a memory bound": ("trickle", lambda uri, p: storage.read_whole(uri, p, max_bytes=10**9)),
    "a whole object read ahead": ("trickle", lambda uri, p: storage.fetch_soon(uri, p).result()),
    "a body without end (chunked)": ("chunked", lambda uri, p: storage.read_whole(uri, p, max_bytes=10**9)),
    "the size (HEAD), headers trickled": ("headers", lambda uri, p: storage.stat(uri, p)),
    "whether it exists, headers trickled": ("headers", lambda uri, p: storage.exists(uri, p)),
    "h5py's metadata block": ("trickle", lambda uri, p: storage.open_file(uri, p, known_size=_LENGTH).read(8)),
    "byte ranges": ("trickle", lambda uri, p: storage.read_ranges(uri, [(0, 100), (500, 100)], p)),
    "a checksum's stream": ("trickle", lambda uri, p: list(storage.objects.read_stream(uri, p))),
}


@pytest.mark.parametrize("door", list(_READS))
def test_an_http_read_trickled_a_byte_at_a_time_ends_within_its_deadline(door):
    """aiohttp bounds a request at 5 minutes whatever its size, and fsspec sets no bound of its own: on
    main each of these reads was still receiving at the test's bound. Now the deadline of S3's bodies:
    a ``StorageError`` "too slowly" naming the object, not retried."""
    way, read = _READS[door]
    endpoint, stop, listener = trickling_server(way, _LENGTH)
    uri = f"{endpoint}/dir/f0.nc"
    profile = storage.profiles.register(_OPTIONS, protocol="http")

    def attempt() -> None:
        with dask.config.set({"daskcfa.storage.retries": 0}):
            read(uri, profile)

    failure = failure_within(attempt, stop, listener, _BOUND)
    assert isinstance(failure, daskcfa.errors.StorageError), f"after {_BOUND} s: {failure!r} (None: still reading)"
    assert "too slowly" in str(failure) and failure.file == uri


def test_an_http_fragment_trickled_is_a_storage_error_naming_fragment_and_variable(tmp_path):
    """The same through ``from_cfa``: a netCDF fragment at an ``http://`` URL whose server trickles it
    (main: still reading at the test's bound), with a login given for its origin, which the error does
    not show."""
    endpoint, stop, listener = trickling_server("trickle", _LENGTH)
    uri = f"{endpoint}/dir/f0.nc"
    aggregation = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[4]], [[uri]])
    password = "pw-http17-secret"

    def read() -> None:
        with dask.config.set({"daskcfa.storage.retries": 0}):
            options = {"http": _OPTIONS, f"{endpoint}/": {"headers": {"Authorization": f"Bearer {password}"}}}
            daskcfa.from_cfa(str(aggregation), "x", storage_options=options,
                             allowed_locations=[f"{endpoint}/"]).compute(scheduler="sync")

    failure = failure_within(read, stop, listener, _BOUND)
    assert isinstance(failure, daskcfa.errors.CFAError), f"after {_BOUND} s: {failure!r} (None: still reading)"
    assert "too slowly" in str(failure) and uri in str(failure)
    assert "variable '/x'" in str(failure) and "fragment (0,)" in str(failure)
    assert password not in str(failure) and password not in repr(failure)


def test_a_body_of_no_declared_length_arriving_at_the_rate_is_read_past_the_grace():
    """A chunked body's deadline moves on as it arrives: 60 bytes at 20 a second (3 s, the grace 1 s),
    ``min-throughput`` 10 bytes a second, read whole (a deadline fixed at the grace would cut it)."""
    endpoint, stop, listener = trickling_server("chunked 60", _LENGTH)
    profile = storage.profiles.register(_OPTIONS, protocol="http")
    try:
        with dask.config.set({"daskcfa.storage.retries": 0, "daskcfa.storage.min-throughput": 10}):
            assert storage.read_whole(f"{endpoint}/f.bin", profile, max_bytes=1000).tobytes() == b"x" * 60
    finally:
        stop.set()
        listener.close()


def test_an_http_body_within_its_deadline_is_read_whole(make_http_server, tmp_path):
    """The normal way unchanged: a real HTTP server's objects, whole, in ranges, by blocks, read right."""
    (tmp_path / "www").mkdir()
    data = bytes(range(256)) * 4000
    (tmp_path / "www" / "o.bin").write_bytes(data)
    server = make_http_server(tmp_path / "www")
    uri = server.url_for("o.bin")
    with dask.config.set({"daskcfa.storage.part-size": 100_000}):
        assert storage.read_bytes(uri) == data
        assert storage.read_whole(uri, known_size=len(data)).tobytes() == data
    assert storage.read_whole(uri, max_bytes=len(data)).tobytes() == data
    with pytest.raises(daskcfa.errors.BudgetError):
        storage.read_whole(uri, max_bytes=len(data) - 1)
    assert storage.read_ranges(uri, [(5, 10), (900_000, 3)]) == [data[5:15], data[900_000:900_003]]
    assert storage.size(uri) == len(data)
    with storage.open_file(uri) as f:
        f.seek(300_000)
        assert f.read(20) == data[300_000:300_020]
    assert b"".join(storage.objects.read_stream(uri, block=300_000)) == data
    assert storage.fetch_soon(uri).result().tobytes() == data
    with pytest.raises(daskcfa.errors.NotFoundError):
        storage.read_bytes(server.url_for("missing.bin"))


def _s3_profile(endpoint: str) -> object:
    """The slow server as an S3 endpoint (a fake login; botocore's read timeout 2 s, never reached)."""
    return storage.profiles.register({"key": KEY, "secret": SECRET, "config_kwargs": {"read_timeout": 2},
                                      "client_kwargs": {"endpoint_url": endpoint}}, protocol="s3")


_S3_READS = {
    "h5py's metadata block": lambda p: storage.open_file("s3://bucket/f/0.nc", p, known_size=_LENGTH).read(8),
    "the write lease's record": lambda p: Lease.new("s3://bucket/f/agg.nc", p).acquire(),
    "the size (HEAD), headers trickled": lambda p: storage.stat("s3://bucket/f/0.nc", p),
    "an object's HEAD, headers trickled": lambda p: storage.stat("s3://bucket/f/0.nc", p, objects_only=True),
}


@pytest.mark.parametrize("door", list(_S3_READS))
def test_an_s3_bookkeeping_or_block_read_trickled_ends_within_its_deadline(door):
    """Session 16 bounded S3's whole objects and ranged GETs, not the blocks s3fs's file objects fetch
    for h5py nor the lease record's GET: on main each read a trickled body for its length (a 256 KiB
    block at a byte every 0.05 s: 3.6 hours; the lease's 64 KiB: 55 minutes). Now a ``StorageError``
    "too slowly" naming the object, no key or secret in it. The same for a HEAD whose headers never end
    (on main: until aiohttp's 8,190-byte bound on a header line, 400 s at this pace)."""
    endpoint, stop, listener = trickling_server("headers" if "headers" in door else "trickle", _LENGTH)
    profile = _s3_profile(endpoint)

    def attempt() -> None:
        with dask.config.set({"daskcfa.storage.retries": 0}):
            _S3_READS[door](profile)

    failure = failure_within(attempt, stop, listener, _BOUND)
    assert isinstance(failure, daskcfa.errors.StorageError), f"after {_BOUND} s: {failure!r} (None: still reading)"
    assert "too slowly" in str(failure) and failure.file.startswith("s3://bucket/f/")
    assert KEY not in str(failure) and SECRET not in str(failure)
