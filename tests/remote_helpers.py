"""Helpers shared by the tests that read from S3, HTTP and OPeNDAP."""

from __future__ import annotations

import concurrent.futures
import math
import re
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Mapping, Sequence

import netCDF4
import numpy as np

from builders import make_truth, write_strings

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (2, 3))  # uneven fragments, a 3 x 1 x 2 grid
SHAPE = (6, 4, 5)


def truth(masked: float = 0.15, dtype: str = "f4", shape=SHAPE, seed: int = 1) -> np.ma.MaskedArray:
    return make_truth(shape, dtype, seed=seed, masked=masked)


def upload(fs, local_dir: Path, bucket: str, prefix: str) -> str:
    """Upload a whole local directory to ``s3://bucket/prefix/``; returns that base URI (no slash)."""
    prefix = prefix.strip("/")
    fs.put(str(local_dir) + "/", f"{bucket}/{prefix}/", recursive=True)
    return f"s3://{bucket}/{prefix}"


def rewrite_uris(path: Path, variable: str, change: Callable[[str], str]) -> None:
    """Rewrite, in place, every non-empty string of the URI variable of an aggregation file."""
    with netCDF4.Dataset(str(path), "a") as ds:
        var = ds[variable]
        if var.dtype is str:
            values = np.asarray(var[...], dtype=object)
            new = np.vectorize(lambda u: change(u) if u else u, otypes=[object])(values)
            if new.ndim == 0:
                var[0] = new[()]
            else:
                var[...] = new
        else:  # char array: the values must still fit the string length
            var.set_auto_chartostring(True)
            values = np.asarray(var[...]).astype(str)
            new = np.vectorize(lambda u: change(u) if u else u, otypes=[object])(values)
            width = var.shape[-1]
            assert max(len(s.encode()) for s in new.ravel()) <= width, "rewritten URI longer than the char array"
            var[...] = np.array(new.tolist(), dtype=f"S{width}")


def write_chunked_fragment(path: Path, name: str, dims: Sequence[str], data: np.ndarray, *,
                           chunks: Sequence[int], zlib: bool = False) -> Path:
    """A netCDF-4 fragment with explicit HDF5 chunking (no fill value)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(str(path), "w") as ds:
        for d, n in zip(dims, data.shape):
            ds.createDimension(d, n)
        v = ds.createVariable(name, data.dtype, tuple(dims), chunksizes=tuple(chunks), zlib=zlib,
                              fill_value=False)
        v.units = "K"
        v[...] = data
    return path


def write_cf113(path: Path, name: str, dims: Sequence[str], sizes, uris, *, identifier: str | None = None,
                units: str = "K", dtype: str = "f4") -> Path:
    """A minimal CF-1.13 aggregation file written by hand.

    ``sizes``: the fragment sizes along each dimension; ``uris``: nested
    lists shaped like the fragment grid.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    uris = np.array(uris, dtype=object)
    grid = tuple(len(r) for r in sizes)
    uris = uris.reshape(grid)
    width = max(len(r) for r in sizes)
    fmap = np.full((len(sizes), width), netCDF4.default_fillvals["i4"], dtype="i4")
    for d, row in enumerate(sizes):
        fmap[d, : len(row)] = row
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.13"
        for d, row in zip(dims, sizes):
            ds.createDimension(d, sum(row))
        ds.createDimension("i", len(sizes))
        ds.createDimension("j", width)
        m = ds.createVariable("fragment_map", "i4", ("i", "j"), fill_value=False)
        m[...] = fmap
        fdims = tuple(f"f_{d}" for d in dims)
        for d, k in zip(fdims, grid):
            ds.createDimension(d, k)
        write_strings(ds, "fragment_uris", fdims, uris)
        write_strings(ds, "fragment_identifiers", (), identifier or name)
        v = ds.createVariable(name, dtype, ())
        v.units = units
        v.aggregated_dimensions = " ".join(dims)
        v.aggregated_data = "map: fragment_map uris: fragment_uris identifiers: fragment_identifiers"
    return path



def large_fragments(tmp_path: Path, fs, bucket: str, prefix: str, layout="chunked", seed=6):
    """A CF-1.13 aggregation of two fragment objects of 1.5 MiB on S3 (larger than
    ``storage.objects._DIRECT_FROM``: received by a blocking GET), uploaded under ``prefix``: its URL and data."""
    data = np.random.default_rng(seed).random((2 * 24, 128, 128), dtype="f4")
    for k in range(2):
        part = data[k * 24:(k + 1) * 24]
        if layout == "chunked":
            write_chunked_fragment(tmp_path / "ds" / "f" / f"{k}.nc", "tas", DIMS, part, chunks=(6, 128, 128))
        else:
            path = tmp_path / "ds" / "f" / f"{k}.nc"
            path.parent.mkdir(parents=True, exist_ok=True)
            with netCDF4.Dataset(path, "w") as nc:
                for d, n in zip(DIMS, part.shape):
                    nc.createDimension(d, n)
                v = nc.createVariable("tas", "f4", DIMS, contiguous=True, fill_value=False)
                v.units = "K"
                v[...] = part
    write_cf113(tmp_path / "ds" / "agg.nc", "tas", DIMS, ((24, 24), (128,), (128,)), [["f/0.nc"], ["f/1.nc"]])
    base = upload(fs, tmp_path / "ds", bucket, prefix)
    assert fs.size(f"{base}/f/0.nc".removeprefix("s3://")) > 1 << 20  # (storage.objects._DIRECT_FROM)
    return f"{base}/agg.nc", data


class _Proxy:
    """A TCP server on 127.0.0.1 (``endpoint_url``) that hands each connection, counted in
    ``connections``, to the subclass's ``_serve(client)`` (which must not block). A context manager."""

    def __init__(self) -> None:
        import socket
        import threading

        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint_url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._closed = False
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self):
        self._accepting.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed = True
        self._server.close()
        self._accepting.join(5)

    def _accept(self) -> None:
        self._server.settimeout(0.1)  # (closing a socket does not wake a thread blocked in accept)
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            self.connections += 1
            self._serve(client)

    @staticmethod
    def _close(*sockets) -> None:
        import socket

        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class FailingProxy(_Proxy):
    """A TCP server on 127.0.0.1 that counts the connections made to it: on the first
    ``failures`` it answers the request with S3's "503 Service Unavailable" and closes the
    connection (an overloaded or restarting server); later connections are forwarded to
    ``target`` (``(host, port)``; None: every connection fails). A real peer, so every layer of
    a client (daskcfa, s3fs, botocore, aiohttp) sees a real fault; a 503 rather than a reset,
    because aiohttp itself sends an idempotent request again once on a reset connection, at a
    moment a reset races with. A context manager; ``endpoint_url`` names it."""

    RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s")
    BODY = b"<Error><Code>ServiceUnavailable</Code><Message>Please reduce your request rate.</Message></Error>"

    def __init__(self, target: tuple[str, int] | None = None, failures: int = 10**9) -> None:
        super().__init__()
        self.target, self.failures = target, failures

    def _serve(self, client) -> None:
        import socket
        import threading

        if self.target is None or self.connections <= self.failures:
            threading.Thread(target=self._fail, args=(client,), daemon=True).start()
            return
        upstream = socket.create_connection(self.target)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _fail(self, client) -> None:
        with client:
            request = b""
            while b"\r\n\r\n" not in request:
                data = client.recv(65536)
                if not data:
                    return
                request += data
            body = b"" if request.startswith(b"HEAD ") else self.BODY
            client.sendall(self.RESPONSE % (len(self.BODY), body))

    @staticmethod
    def _pump(source, sink) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _Proxy._close(source, sink)


class CorruptingProxy(_Proxy):
    """A TCP proxy on 127.0.0.1 to ``target`` (``(host, port)``) that damages the body of every
    successful GET response of at least ``min_body`` bytes, as a faulty network, NIC, middlebox or
    server would, the headers (the server's length and checksum among them) arriving as sent:
    ``how`` is ``"flip"`` (one byte changed), ``"truncate"`` (half the body, then the connection
    closed), ``"extend"`` (1,000 bytes more than the declared length), ``"stall"`` (half the
    body, then nothing until the proxy closes), ``"declare"`` (a length of 10^15 bytes declared,
    the body sent, the connection closed) or ``"redirect"`` (a 307 to ``location`` instead). Requests must have no body (GET, HEAD). A context
    manager; ``endpoint_url`` names it, ``corrupted`` counts the bodies damaged."""

    def __init__(self, target: tuple[str, int], min_body: int = 1, how: str = "flip", location: str = "") -> None:
        super().__init__()
        self.target, self.min_body, self.how, self.location, self.corrupted = target, min_body, how, location, 0

    def _serve(self, client) -> None:
        import queue
        import socket
        import threading

        upstream = socket.create_connection(self.target)
        methods: queue.Queue = queue.Queue()  # of the requests sent, in order: which responses have bodies
        threading.Thread(target=self._requests, args=(client, upstream, methods), daemon=True).start()
        threading.Thread(target=self._responses, args=(upstream, client, methods), daemon=True).start()

    @staticmethod
    def _requests(source, sink, methods) -> None:
        buffer = b""
        try:
            while data := source.recv(65536):
                buffer += data
                while b"\r\n\r\n" in buffer:
                    head, buffer = buffer.split(b"\r\n\r\n", 1)
                    methods.put(head.split(b" ", 1)[0])
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _Proxy._close(source, sink)

    def _responses(self, source, sink, methods) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = source.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
                length = 0 if methods.get() == b"HEAD" else int(fields.get(b"content-length", b"0"))
                while len(buffer) < length:
                    data = source.recv(65536)
                    if not data:
                        return
                    buffer += data
                body, buffer = bytearray(buffer[:length]), buffer[length:]
                if lines[0].split(b" ")[1] != b"200" or length < self.min_body:
                    sink.sendall(head + b"\r\n\r\n" + bytes(body))
                    continue
                self.corrupted += 1
                if self.how == "flip":
                    body[length // 2] ^= 0x01
                elif self.how == "extend":
                    body += bytes(1000)
                elif self.how == "redirect":
                    sink.sendall(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n"
                                 % self.location.encode())
                    continue
                elif self.how == "declare":
                    head = head.replace(fields[b"content-length"], str(10**15).encode())
                    sink.sendall(head + b"\r\n\r\n" + bytes(body))
                    return
                else:  # truncate, stall
                    sink.sendall(head + b"\r\n\r\n" + bytes(body[:length // 2]))
                    while self.how == "stall" and not self._closed:
                        time.sleep(0.05)
                    return
                sink.sendall(head + b"\r\n\r\n" + bytes(body))
        except OSError:
            pass
        finally:
            _Proxy._close(source, sink)


@contextmanager
def event_loop_held(seconds: float = 30.0):
    """fsspec's event loop thread (every s3fs request of the process runs on it) kept busy for
    the block, at most ``seconds``: yields a function telling whether it was held throughout
    (False: the block waited for the loop, which was let go after ``seconds``)."""
    import fsspec.asyn

    release, held, timed_out = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        if not release.wait(seconds):
            timed_out.set()

    fsspec.asyn.get_loop().call_soon_threadsafe(hold)
    assert held.wait(10)
    try:
        yield lambda: not timed_out.is_set()
    finally:
        release.set()


def trickling_server(way: str = "trickle", length: int = 100_000, prompt: Mapping[str, bytes | None] | None = None
                     ) -> tuple[str, threading.Event, socket.socket]:
    """A server answering every request one byte every 0.05 s: its headers (``way`` "headers"), else
    the body after prompt headers (a HEAD is answered at once): "trickle" declares ``length`` bytes (a 206
    of the range asked for), "chunked" sends one-byte chunks without end ("chunked 60": 60 chunks, then the
    end of the body). Each wait far below any read
    timeout: only a deadline on the whole request ends it. ``prompt``: paths answered at once, with their
    bytes (the range asked for) or a 404 (None). Returns its URL, the event that stops it
    sending, and its listening socket (close it)."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def drip(connection: socket.socket, piece: bytes, count: float = math.inf) -> None:
        while count > 0 and not stop.wait(0.05):
            connection.sendall(piece)
            count -= 1

    def answer(connection: socket.socket) -> None:
        with connection:
            try:
                request = connection.recv(65536).decode("latin-1")
                path = request.split(" ", 2)[1].split("?")[0] if request.count(" ") >= 2 else ""
                if prompt is not None and path in prompt:
                    connection.sendall(_answer_at_once(request, prompt[path]))
                    return
                if way == "headers":
                    connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                    drip(connection, b"x")  # (a header that never ends)
                    return
                asked = re.search(r"(?i)^range: bytes=(\d+)-(\d+)", request, re.M)
                first, last = (int(asked[1]), int(asked[2])) if asked else (0, length - 1)
                status = "206 Partial Content" if asked else "200 OK"
                head = (f"HTTP/1.1 {status}\r\nContent-Range: bytes {first}-{last}/{length}\r\n"
                        f"Accept-Ranges: bytes\r\nETag: \"e\"\r\nContent-Length: {last - first + 1}\r\n")
                if request.startswith("HEAD"):
                    connection.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n"
                                       f"Accept-Ranges: bytes\r\n\r\n".encode())
                elif way.startswith("chunked"):
                    connection.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    drip(connection, b"1\r\nx\r\n", int(way[len("chunked "):] or 0) or math.inf)
                    connection.sendall(b"0\r\n\r\n")
                else:
                    connection.sendall(f"{head}\r\n".encode())
                    drip(connection, b"x")
            except OSError:  # (the reader shut the connection)
                pass

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", stop, listener


def _answer_at_once(request: str, data: bytes | None) -> bytes:
    """A whole HTTP response to ``request``: ``data``, or the range of it asked for; None: a 404."""
    if data is None:
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    asked = re.search(r"(?i)^range: bytes=(\d+)-(\d+)", request, re.M)
    if request.startswith("HEAD"):
        return f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
    if not asked:
        return f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data
    first, last = int(asked[1]), min(int(asked[2]), len(data) - 1)
    return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{last}/{len(data)}\r\n"
            f"Content-Length: {last - first + 1}\r\nConnection: close\r\n\r\n").encode() + data[first:last + 1]


def failure_within(read: Callable[[], object], stop: threading.Event, listener: socket.socket,
                   bound: float) -> BaseException | None:
    """What ``read()``, in another thread, raised within ``bound`` seconds (None: still reading then);
    the :func:`trickling_server` then stopped and closed."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    reading = pool.submit(read)
    try:
        failure = reading.exception(timeout=bound)
    except concurrent.futures.TimeoutError:
        failure = None
    finally:
        stop.set()  # (the server stops sending: a read still waiting ends)
        pool.shutdown(wait=True)
        listener.close()
    return failure


def scripted_server(answer: Callable[[str], bytes]):
    """A server on 127.0.0.1 answering each request (its text) with ``answer``'s bytes, then closing the
    connection (hostile answers written byte for byte); returns a URL on it and the listener to close."""
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
