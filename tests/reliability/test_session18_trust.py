"""Session 18's trust-boundary holes closed (trust18): hostile HTTP ranges and bodies, hostile
attribute values (docs/reliability.md, "Hostile attribute values and HTTP ranges checked (trust18)").

Real parts only: raw-socket HTTP servers on 127.0.0.1 answering as scripted, real netCDF and Zarr
files. Each test failed on main (407ffab): wrong values or bytes taken, memory read without bound,
or a bare Python error.
"""

from __future__ import annotations

import re
import socket
import threading
import zlib
from typing import Callable

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa import storage

BODY = np.random.default_rng(18).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
N = len(BODY)


def _scripted(answer: Callable[[str], bytes]):
    """A server answering each request (its text) with ``answer``'s bytes, then closing the connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                try:
                    connection.sendall(answer(connection.recv(65536).decode("latin-1")))
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/d/f.nc", listener


def _head(request: str) -> bytes | None:
    if request.startswith("HEAD"):
        return f"HTTP/1.1 200 OK\r\nContent-Length: {N}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n".encode()
    return None


def _ranges(said: Callable[[int, int], str], shift: int = 0, header: str = "Content-Range"):
    """Answers to ranged GETs: 206, the bytes ``shift`` past those asked, ``Content-Range: said(first, last)``."""
    def answer(request: str) -> bytes:
        asked = re.search(r"(?i)^range: bytes=(\d+)-(\d+)", request, re.M)
        first, last = int(asked[1]) + shift, int(asked[2]) + shift
        body = BODY[first:last + 1]
        return _head(request) or (f"HTTP/1.1 206 Partial Content\r\n{header}: {said(first, last)}\r\n"
                                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    return answer


def _read(read: Callable[[], object]) -> object:
    with dask.config.set({"daskcfa.storage.retries": 0}):
        return read()


@pytest.fixture
def profile():
    return storage.profiles.register({}, protocol="http")


def test_a_206_holding_other_bytes_than_asked_is_refused(profile):
    """A 206 naming (and holding) the bytes one past those asked for, of the right length: on main
    taken as the range asked for (the wrong bytes returned). Now a ``StorageError`` naming the object."""
    uri, listener = _scripted(_ranges(lambda first, last: f"bytes {first}-{last}/{N}", shift=1))
    try:
        with pytest.raises(daskcfa.errors.StorageError, match="not the bytes asked for") as caught:
            parts = _read(lambda: storage.read_ranges(uri, [(0, 100), (5000, 100)], profile))
            assert parts == [BODY[0:100], BODY[5000:5100]]  # (main: each one byte on)
        assert caught.value.file == uri
    finally:
        listener.close()


@pytest.mark.parametrize("said", ["bytes 7-106/1", "bytes 0-99", "bytes=0-99/200000", "", "bytes 0-99/200000, 1-2"])
def test_a_206_whose_content_range_is_not_the_range_asked_is_refused(profile, said):
    """The right bytes, but a ``Content-Range`` that does not name them (another start, no complete
    length, a malformed one, an empty one): refused, as the bytes cannot be told to be those asked for."""
    uri, listener = _scripted(_ranges(lambda first, last: said))
    try:
        with pytest.raises(daskcfa.errors.StorageError, match="not the bytes asked for"):
            _read(lambda: storage.read_ranges(uri, [(7, 100)] if said.startswith("bytes 7") else [(0, 100)], profile))
    finally:
        listener.close()


@pytest.mark.parametrize("said", ["bytes {first}-{last}/*", "BYTES  {first}-{last}/200000", "bytes {first}-{last}/200000"])
@pytest.mark.parametrize("header", ["Content-Range", "content-range", "CONTENT-RANGE"])
def test_a_206_naming_the_range_asked_is_read(profile, said, header):
    """Legitimate spellings (an unknown complete length ``*``, the unit in capitals, the header in any case)."""
    uri, listener = _scripted(_ranges(lambda first, last: said.format(first=first, last=last), header=header))
    try:
        assert _read(lambda: storage.read_ranges(uri, [(0, 100), (199_900, 100)], profile)) == [BODY[:100],
                                                                                              BODY[199_900:]]
    finally:
        listener.close()


def _endless(way: str) -> Callable[[str], bytes]:
    """A whole GET answered by 64 MiB: chunked without a declared length, or a deflate bomb."""
    if way == "chunked":
        piece = b"\0" * (1 << 20)
        body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(64)) + b"0\r\n\r\n"
        head = "Transfer-Encoding: chunked\r\n"
    else:
        body = zlib.compress(b"\0" * (64 << 20), 9)
        head = f"Content-Encoding: deflate\r\nContent-Length: {len(body)}\r\n"
    return lambda request: (f"HTTP/1.1 200 OK\r\n{head}Connection: close\r\n\r\n").encode() + body


@pytest.mark.parametrize("way", ["chunked", "deflate"])
def test_an_aggregation_file_read_whole_is_bounded(way):
    """An aggregation file over HTTP is read whole, with neither a size nor a bound: on main the 64 MiB
    body was read into memory (then not netCDF: a ``CFAFormatError``). Now read no further than
    ``daskcfa.limits.max-memory`` (here 4 MiB) and one byte: a ``BudgetError`` naming the setting."""
    uri, listener = _scripted(_endless(way))
    try:
        with dask.config.set({"daskcfa.limits.max-memory": "4MiB"}), \
                pytest.raises(daskcfa.errors.BudgetError, match="daskcfa.limits.max-memory") as caught:
            _read(lambda: daskcfa.from_cfa(uri))
        assert caught.value.file == uri
    finally:
        listener.close()


@pytest.mark.parametrize("way", ["chunked", "deflate"])
def test_an_object_read_whole_without_a_size_is_bounded(way, profile):
    """``storage.read_whole`` of neither a size nor a bound (every caller of it that passes neither:
    a file to append to, a block refragment staged, an aggregation file's versions)."""
    uri, listener = _scripted(_endless(way))
    try:
        with dask.config.set({"daskcfa.limits.max-memory": "4MiB"}), \
                pytest.raises(daskcfa.errors.BudgetError, match="daskcfa.limits.max-memory"):
            got = _read(lambda: storage.read_whole(uri, profile))
            assert len(got) <= 4 << 20  # (main: 64 MiB)
    finally:
        listener.close()
