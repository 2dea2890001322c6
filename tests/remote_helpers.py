"""Helpers shared by the tests that read from S3, HTTP and OPeNDAP."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

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
    """A TCP proxy on 127.0.0.1 to ``target`` (``(host, port)``) that changes one byte of the body
    of every successful GET response of at least ``min_body`` bytes, as a faulty network, NIC or
    middlebox would: the headers (the server's checksum among them) arrive as sent. Requests
    must have no body (GET, HEAD). A context manager; ``endpoint_url`` names it, ``corrupted``
    counts the bodies changed."""

    def __init__(self, target: tuple[str, int], min_body: int = 1) -> None:
        super().__init__()
        self.target, self.min_body, self.corrupted = target, min_body, 0

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
                if lines[0].split(b" ")[1] == b"200" and length >= self.min_body:
                    body[length // 2] ^= 0x01
                    self.corrupted += 1
                sink.sendall(head + b"\r\n\r\n" + bytes(body))
        except OSError:
            pass
        finally:
            _Proxy._close(source, sink)
