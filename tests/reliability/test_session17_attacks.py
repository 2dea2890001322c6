"""Session 17's doors attacked (attack17a): HTTP(S) bodies of another length than asked for
(docs/reliability.md, "Session 17's doors attacked (attack17a)").

Real parts only: the standard library's HTTP server (which ignores ``Range``, as many simple servers
do) and a raw-socket server on 127.0.0.1 answering as scripted. Each test failed on main (320aac2):
a wrong or short value returned, or the whole object read into memory for a range.
"""

from __future__ import annotations

import functools
import http.server
import re
import threading
import zlib
from typing import Callable

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa import storage
from daskcfa.storage.fixity import file_fixity

from remote_helpers import scripted_server

BODY = np.random.default_rng(17).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
N = len(BODY)


class _IgnoringRanges(http.server.SimpleHTTPRequestHandler):
    """The standard library's file server (it answers every GET 200, whole), saying it takes ranges."""

    def end_headers(self) -> None:
        self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def ignoring_ranges(tmp_path):
    (tmp_path / "f.nc").write_bytes(BODY)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_IgnoringRanges,
                                                                                 directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/f.nc"
    server.shutdown()
    server.server_close()


def _head(request: str) -> bytes | None:
    """The answer to a HEAD: ``N`` bytes, ranges taken (None: not a HEAD)."""
    if request.startswith("HEAD"):
        return f"HTTP/1.1 200 OK\r\nContent-Length: {N}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n".encode()
    return None


def _half_without_length(request: str) -> bytes:
    """Half of what was asked for, with no ``Content-Length``: the body ends where the connection does."""
    asked = re.search(r"(?i)^range: bytes=(\d+)-(\d+)", request, re.M)
    first, last = (int(asked[1]), int(asked[2])) if asked else (0, N - 1)
    status = f"206 Partial Content\r\nContent-Range: bytes {first}-{last}/{N}" if asked else "200 OK"
    return _head(request) or (f"HTTP/1.1 {status}\r\nConnection: close\r\n\r\n".encode()
                              + BODY[first:first + (last + 1 - first) // 2])


def _read(read: Callable[[], object]) -> object:
    with dask.config.set({"daskcfa.storage.retries": 0}):
        return read()


def test_byte_ranges_answered_with_the_whole_object_are_refused(ignoring_ranges):
    """A server ignoring ``Range`` (the standard library's) answers each ranged GET 200 with the whole
    object; fsspec hands that on. On main ``read_ranges`` returned the whole object as each range (the
    chunks of netCDF-4 fragments held: hdf5.py checks their lengths; reference-set chunks and the parts
    of large objects read whole did not). Now a ``StorageError`` naming the object."""
    profile = storage.profiles.register({}, protocol="http")
    with pytest.raises(daskcfa.errors.StorageError, match="ignores byte ranges") as caught:
        parts = _read(lambda: storage.read_ranges(ignoring_ranges, [(0, 100), (5000, 100)], profile))
        assert [len(p) for p in parts] == [100, 100]  # (main: [200000, 200000])
    assert caught.value.file == ignoring_ranges


def test_a_range_answered_by_a_deflate_bomb_is_read_no_further_than_its_length():
    """A 64 KiB deflate body inflating to 64 MiB answering a 100-byte range: aiohttp inflates it, and
    fsspec's ``cat_ranges`` read each body whole (on main: 64 MiB returned as the 100 bytes; 800 MiB of
    memory for an 815 KB body, measured by hand). Now read no further than the range and one byte."""
    bomb = zlib.compress(b"\0" * (64 << 20), 9)

    def answer(request: str) -> bytes:
        return _head(request) or (f"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: {len(bomb)}\r\n"
                                  "Connection: close\r\n\r\n").encode() + bomb

    uri, listener = scripted_server(answer)
    profile = storage.profiles.register({}, protocol="http")
    try:
        with pytest.raises(daskcfa.errors.StorageError, match="with 101 or more bytes"):
            parts = _read(lambda: storage.read_ranges(uri, [(0, 100)], profile))
            assert [len(p) for p in parts] == [100]  # (main: [67108864])
    finally:
        listener.close()


@pytest.mark.parametrize("way", ["cut short", "longer"])
def test_a_whole_get_of_another_length_than_its_head_is_an_error(way):
    """A body without ``Content-Length`` ends where the connection does: cut short there, it was taken
    for the whole object (``read_whole`` with the size a HEAD gave, as a fragment fetched whole is
    read), and so was one running past it. Now an error naming the object (retried as a cut body is)."""
    def answer(request: str) -> bytes:
        body = BODY[:N // 2] if way == "cut short" else BODY + b"x" * 500
        return _head(request) or b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body

    uri, listener = scripted_server(answer)
    profile = storage.profiles.register({}, protocol="http")
    try:
        with pytest.raises(daskcfa.errors.StorageError, match="bytes (or more )?of the object's 200,000") as caught:
            got = _read(lambda: storage.read_whole(uri, profile, known_size=N))
            assert got.tobytes() == BODY  # (main: 100,000 or 200,500 bytes)
        assert caught.value.file == uri
    finally:
        listener.close()


def test_a_checksum_stream_ending_short_is_an_error_not_a_size():
    """Each block of a fixity check's stream answered with half its bytes and no ``Content-Length``:
    on main ``file_fixity`` gave the bytes that came as the object's size and CRC-32 (a fragment
    reported changed at rest for a fault in transfer). Now a ``StorageError`` naming the object
    (since trust18 at the first block, each checked as every range is: else at the stream's end)."""
    uri, listener = scripted_server(_half_without_length)
    profile = storage.profiles.register({}, protocol="http")
    try:
        with pytest.raises(daskcfa.errors.StorageError,
                           match="of the object's 200,000|bytes 0 to 199,999 with 100,000 bytes") as caught:
            nbytes, _ = _read(lambda: file_fixity(uri, profile))
            assert nbytes == N  # (main: 199,999)
        assert caught.value.file == uri
    finally:
        listener.close()



@pytest.mark.parametrize("missing", [np.uint8(255), 255, 300])
def test_masked_points_of_an_unsigned_variable_whose_missing_value_its_type_cannot_hold_are_refused_saying_so(
        tmp_path, missing):
    """An _Unsigned byte variable, masked points, a ``missing_value`` of 255 (or 300) and no _FillValue:
    netCDF4-python writes it and reads the points back as values (255, 44: checked with a plain file),
    daskcfa refuses. The refusal said the variable had no missing_value; now it says which one it has
    and why it does not count (a value the stored type int8 does not hold is never read as missing).
    Not a wrong value before: a misleading error."""
    data = np.ma.array(np.array([1, 2, 200, 4], "u1").view("i1"), mask=[0, 1, 0, 0])
    with pytest.raises(daskcfa.errors.FragmentError, match=f"a missing_value of {int(missing)} is none"):
        daskcfa.to_cfa(data, str(tmp_path / "a.nc"), variable="v", dims=["x"], fragment_shape=[2],
                       attrs={"_Unsigned": "true", "missing_value": missing})
