"""Attacks on whole S3 objects received by the blocking botocore GET (storage/direct.py)
and by the lean signed GET (storage/lean.py).

Each attack is a real HTTP server on 127.0.0.1 answering as S3 (``_FakeS3``:
whatever status, headers and body the test says), or the real SeaweedFS.
Every case runs the blocking GET (objects of at least 1 MiB expected, with a
setting the lean GET leaves to the client: TCP keep-alive), the lean GET (any
size: objects of under and over 1 MiB expected) and, for comparison, the GET on fsspec's event
loop (smaller objects, with that setting), all through ``storage.read_whole`` as
the fragment readers call it. A second
server (``elsewhere``) stands for another origin: nothing may reach it.
"""

from __future__ import annotations

import http.server
import socketserver
import threading
from typing import Callable

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa import storage

KEY, SECRET, TOKEN = "AKIDATTACK12", "SeCrEt-attack12-never-shown", "ToKeN-attack12-never-shown"
URI = "s3://bucket/f/0.nc"
BODY = b"CDF\x01" + bytes(4096)
#: ``size_hint`` of each way a whole object is received
WAYS = {"blocking": 2 << 20, "lean": 0, "lean-large": 2 << 20, "event-loop": 0}
#: S3 settings the lean GET leaves to others: a small object then goes to fsspec's event loop, a large one
#: to the blocking client
_NOT_LEAN = {"config_kwargs": {"tcp_keepalive": True}}

Answer = tuple[int, dict[str, str], bytes]


class _FakeS3:
    """An HTTP/1.1 server answering every request with ``respond(method, path, headers)``,
    keeping each request's method, path and headers in ``log``."""

    def __init__(self, respond: Callable[[str, str, dict], Answer]) -> None:
        self.respond, self.log = respond, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))  # (a PUT's body)
                outer.log.append((self.command, self.path, dict(self.headers)))
                status, headers, body = outer.respond(self.command, self.path, dict(self.headers))
                self.send_response(status)
                for name, value in {"Content-Length": str(len(body)), **headers}.items():
                    if value is not None:
                        self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers():
    """``make(respond)`` -> a fake S3 endpoint; ``elsewhere``: another origin serving a valid-looking body."""
    made = []

    def make(respond):
        made.append(_FakeS3(respond))
        return made[-1]

    make.elsewhere = make(lambda *_: (200, {}, BODY))
    yield make
    for server in made:
        server.close()


def _read(endpoint: str, way: str, *, anon: bool = False, max_bytes: int | None = 1 << 30):
    options = {"anon": True} if anon else {"key": KEY, "secret": SECRET, "token": TOKEN}
    options = {**options, **({} if way.startswith("lean") else _NOT_LEAN)}
    profile = storage.profiles.register({**options, "client_kwargs": {"endpoint_url": endpoint}}, protocol="s3")
    with dask.config.set({"daskcfa.storage.retries": 1}):
        return storage.read_whole(URI, profile, size_hint=WAYS[way], max_bytes=max_bytes)


def _refused(info: pytest.ExceptionInfo) -> None:
    """A daskcfa error naming the object, no credential in it."""
    assert isinstance(info.value, daskcfa.CFAError), f"{type(info.value).__name__}: {info.value}"
    assert info.value.file == URI
    for value in (KEY, SECRET, TOKEN):
        assert value not in str(info.value)


def _error(code: str) -> bytes:
    return f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>x</Message></Error>".encode()


# ---------------------------------------------------------------------------
# Secrets and bytes from another origin
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("status", [301, 302, 307])
def test_s3_redirect_to_another_origin_reaches_nothing_there(servers, way, status):
    """An S3 endpoint answering a GET with a redirect to another host (``Location``, and the host in the
    error body's ``Endpoint``): the request, its signature and session token never go there."""
    other = servers.elsewhere
    endpoint = servers(lambda method, path, headers: (
        status, {"Location": other.url + path, "Content-Type": "application/xml"},
        _error("PermanentRedirect" if status == 301 else "TemporaryRedirect")[:-8]
        + f"<Endpoint>{other.url[7:]}</Endpoint></Error>".encode()))
    with pytest.raises(Exception) as info:
        _read(endpoint.url, way)
    assert other.log == [], f"another origin received {other.log}"
    _refused(info)
    assert endpoint.log, "the endpoint was not asked"


@pytest.mark.parametrize("way", list(WAYS))
def test_s3_region_redirect_goes_back_to_the_same_endpoint(servers, way):
    """A 301 naming another region (``x-amz-bucket-region``): botocore signs again for that region,
    and sends it to the endpoint the user configured, never to another host."""
    other = servers.elsewhere
    endpoint = servers(lambda method, path, headers: (
        301, {"x-amz-bucket-region": "eu-west-2", "Content-Type": "application/xml"},
        _error("PermanentRedirect")[:-8] + f"<Endpoint>{other.url[7:]}</Endpoint></Error>".encode()))
    with pytest.raises(Exception) as info:
        _read(endpoint.url, way)
    _refused(info)
    assert other.log == []
    assert all(h.get("Host") == endpoint.url[7:] for _, _, h in endpoint.log)


@pytest.mark.parametrize("way", list(WAYS))
def test_s3_redirects_that_never_name_a_region_end_in_a_storage_error(servers, way):
    """A redirect naming no region sends botocore's region redirector to HEAD the bucket, which is
    redirected the same way, again and again: before, a bare RecursionError after dozens of HEADs."""
    endpoint = servers(lambda method, path, headers: (307, {"Content-Type": "application/xml"},
                                                      _error("TemporaryRedirect")))
    with pytest.raises(Exception) as info:
        _read(endpoint.url, way)
    _refused(info)
    assert isinstance(info.value, daskcfa.errors.StorageError)


@pytest.mark.parametrize("way", list(WAYS))
def test_anonymous_s3_reads_send_no_signature(servers, way):
    endpoint = servers(lambda *_: (200, {}, BODY + bytes((2 << 20) - len(BODY))))
    assert bytes(_read(endpoint.url, way, anon=True).read(0, 4)) == BODY[:4]
    assert endpoint.log
    for _, _, headers in endpoint.log:
        assert not {"authorization", "x-amz-security-token"} & {name.lower() for name in headers}, headers


# ---------------------------------------------------------------------------
# Bodies
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("way", list(WAYS))
def test_partial_content_to_a_whole_get_is_refused(servers, way):
    """A whole GET (no Range asked) answered 206 with a part of the object: before, the part was
    taken for the whole object."""
    endpoint = servers(lambda *_: (206, {"Content-Range": f"bytes 0-{len(BODY) - 1}/{3 * len(BODY)}"}, BODY))
    with pytest.raises(Exception) as info:
        _read(endpoint.url, way)
    _refused(info)
    assert isinstance(info.value, daskcfa.errors.StorageError)


@pytest.mark.parametrize("way", ["blocking", "lean", "lean-large"])
def test_a_body_of_no_declared_length_is_refused(servers, way):
    """Chunked transfer encoding, no Content-Length: a blocking GET has no length to receive into."""

    def respond(*_):
        chunk = BODY + bytes(2 << 20)
        return 200, {"Content-Length": None, "Transfer-Encoding": "chunked"}, \
            b"%x\r\n" % len(chunk) + chunk + b"\r\n0\r\n\r\n"

    endpoint = servers(respond)
    with pytest.raises(daskcfa.errors.StorageError, match="did not declare") as info:
        _read(endpoint.url, way)
    _refused(info)


@pytest.mark.parametrize("way", list(WAYS))
def test_a_declared_length_beyond_the_memory_budget_is_refused_before_the_body(servers, way):
    endpoint = servers(lambda *_: (200, {"Content-Length": str(3 << 30)}, BODY))
    with pytest.raises(daskcfa.errors.BudgetError) as info:
        _read(endpoint.url, way, max_bytes=1 << 30)
    _refused(info)


# ---------------------------------------------------------------------------
# Credentials: one endpoint, two secrets in one process (the real SeaweedFS)
# ---------------------------------------------------------------------------
def test_one_endpoint_two_secrets_each_sends_its_own(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """A blocking client made for the right secret is not reused for a filesystem given a wrong one
    (nor the other way round), in either order."""
    from remote_helpers import large_fragments

    url, data = large_fragments(tmp_path, s3fs_fs, s3_bucket, "two")
    fragment = url.rsplit("/", 1)[0] + "/f/0.nc"
    right = storage.profiles.register(s3_server.storage_options, protocol="s3")
    wrong = storage.profiles.register({**s3_server.storage_options, "secret": "wrong-" + s3_server.secret[::-1]},
                                      protocol="s3")
    for profile, works in [(right, True), (wrong, False), (right, True), (wrong, False)]:
        if works:
            assert len(storage.read_whole(fragment, profile, size_hint=2 << 20)) > 1 << 20
        else:
            with pytest.raises(daskcfa.errors.StorageError, match="access denied"):
                storage.read_whole(fragment, profile, size_hint=2 << 20)
    x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
    np.testing.assert_array_equal(np.ma.getdata(x.compute(scheduler="threads")), data)


# ---------------------------------------------------------------------------
# Processes and threads
# ---------------------------------------------------------------------------
_EXITING = """
import sys, time
from daskcfa import storage
lean = sys.argv[3].startswith("lean")
profile = storage.profiles.register({"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": sys.argv[1]},
                                     "config_kwargs": {"read_timeout": 300, "tcp_keepalive": not lean}},
                                    protocol="s3")
for i in range(8):
    storage.fetch_soon(f"s3://bucket/f/{i}.nc", profile, size_hint=int(sys.argv[2]))
time.sleep(1)
print("leaving", flush=True)
"""


@pytest.mark.parametrize("way", list(WAYS))
def test_an_interpreter_with_stalled_read_ahead_exits(servers, way):
    """Objects fetched ahead whose bodies never come (the server stalls after the request): the
    process that asked for them, done with its work, still ends. Before, the blocking GETs ran on a
    concurrent.futures pool, whose threads the interpreter joins at exit: each stalled GET held the
    exit for its read timeout (15 s by default, here 300 s), the queued ones in turn."""
    import os
    import subprocess
    import sys
    import time

    stall = threading.Event()
    endpoint = servers(lambda method, *_: (stall.wait(120), (200, {}, BODY))[1])
    root = os.path.dirname(os.path.dirname(os.path.abspath(daskcfa.__file__)))  # (the child imports the same daskcfa)
    try:
        done = subprocess.run([sys.executable, "-c", _EXITING, endpoint.url, str(WAYS[way]), way], cwd=root,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the interpreter did not exit within 60 s of its last statement")
    finally:
        stall.set()
        time.sleep(0.1)
    assert "leaving" in done.stdout, done.stderr
    assert endpoint.log, "no GET was started"


def test_a_forked_process_makes_its_own_blocking_client(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """A process forked after the parent made its blocking client (and its connection pool) reads
    with a client of its own, and reads right."""
    import multiprocessing

    from remote_helpers import large_fragments
    from daskcfa.storage import direct, objects

    url, _ = large_fragments(tmp_path, s3fs_fs, s3_bucket, "fork")
    fragment = url.rsplit("/", 1)[0] + "/f/0.nc"
    profile = storage.profiles.register(s3_server.storage_options, protocol="s3")
    expected = bytes(storage.read_whole(fragment, profile, size_hint=2 << 20).read(0, 1 << 20))
    parent = id(direct.client_for(objects.filesystem(fragment, profile)[0]))

    def child(queue):
        try:
            got = bytes(storage.read_whole(fragment, profile, size_hint=2 << 20).read(0, 1 << 20))
            mine = id(direct.client_for(objects.filesystem(fragment, profile)[0]))
            queue.put((got == expected, mine != parent))
        except BaseException as exc:  # (reported to the parent, which asserts)
            queue.put(repr(exc))

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    answer = queue.get(timeout=120)
    process.join(30)
    assert answer == (True, True), answer


def test_many_threads_at_once_through_one_blocking_client(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """More threads than the client's connection pool holds, each a whole GET at once: none waits
    for a connection forever, every body is whole."""
    from concurrent.futures import ThreadPoolExecutor

    from remote_helpers import large_fragments

    url, _ = large_fragments(tmp_path, s3fs_fs, s3_bucket, "threads")
    fragment = url.rsplit("/", 1)[0] + "/f/0.nc"
    profile = storage.profiles.register(s3_server.storage_options, protocol="s3")
    expected = s3fs_fs.cat_file(fragment.removeprefix("s3://"))
    barrier = threading.Barrier(32)

    def read(_):
        barrier.wait(60)
        return bytes(storage.read_whole(fragment, profile, size_hint=2 << 20).read(0, len(expected))) == expected

    with ThreadPoolExecutor(32) as pool:
        assert all(pool.map(read, range(32), timeout=300))


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("header", ["x-amz-checksum-crc32", "x-amz-checksum-sha256"])
def test_a_checksum_header_that_is_not_base64_is_a_storage_error(servers, way, header):
    """botocore decodes the server's checksum at the body's end: before, a bare binascii.Error."""
    endpoint = servers(lambda *_: (200, {header: "!!notbase64"}, BODY + bytes((2 << 20) - len(BODY))))
    with pytest.raises(Exception) as info:
        _read(endpoint.url, way)
    _refused(info)
    assert isinstance(info.value, daskcfa.errors.StorageError)


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("header", ["x-amz-checksum-crc32", "x-amz-checksum-sha256"])
def test_a_wrong_checksum_of_either_algorithm_is_refused(servers, way, header):
    import base64

    wrong = base64.b64encode(bytes(4 if header.endswith("crc32") else 32)).decode()
    endpoint = servers(lambda *_: (200, {header: wrong}, BODY + bytes((2 << 20) - len(BODY))))
    with pytest.raises(daskcfa.errors.StorageError) as info:
        _read(endpoint.url, way)
    _refused(info)


def test_no_key_secret_or_session_token_in_debug_logs_or_reprs(servers):
    """Every logger at DEBUG (botocore prints request headers, urllib3 requests) through a read,
    a region redirect, endless redirects and a refusal, every way; and the blocking clients' and
    lean GETs' reprs."""
    import io
    import logging

    from daskcfa.storage import direct, lean, objects

    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    handler.setLevel(logging.DEBUG)
    names = ("", "botocore", "urllib3", "aiobotocore", "s3fs", "fsspec", "daskcfa")
    saved = {name: logging.getLogger(name).level for name in names}
    logging.getLogger().addHandler(handler)
    whole = BODY + bytes((2 << 20) - len(BODY))
    answers = [lambda *_: (200, {}, whole),
               lambda *_: (301, {"x-amz-bucket-region": "eu-west-2"}, _error("PermanentRedirect")),
               lambda *_: (307, {}, _error("TemporaryRedirect")),
               lambda *_: (403, {}, _error("AccessDenied"))]
    clients, leans = [], []
    try:
        for name in names:
            logging.getLogger(name).setLevel(logging.DEBUG)
        for answer in answers:
            for way in WAYS:
                endpoint = servers(answer)
                try:
                    _read(endpoint.url, way)
                except daskcfa.CFAError:
                    pass
                profile = storage.profiles.register({"key": KEY, "secret": SECRET, "token": TOKEN,
                                                     "client_kwargs": {"endpoint_url": endpoint.url}}, protocol="s3")
                clients.append(direct.client_for(objects.filesystem(URI, profile)[0]))
                leans.append(lean.lean_for(objects.filesystem(URI, profile)[0]))
    finally:
        logging.getLogger().removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
    text = captured.getvalue()
    assert "X-Amz-Security-Token" in text or "x-amz-security-token" in text.lower(), "no request headers captured"
    everything = text + "".join(repr(c) + repr(c.meta.config) for c in clients if c is not None) + repr(leans)
    assert any(g is not None for g in leans)
    for value in (KEY, SECRET, TOKEN):
        assert value not in everything


def test_an_aggregation_elsewhere_reaches_no_s3_object(tmp_path, servers, make_http_server):
    """An aggregation on an HTTP origin naming a large fragment on S3, the user's S3 options given
    (keyed): the safe-URI policy refuses it, and the S3 endpoint receives no request."""
    from remote_helpers import DIMS, write_cf113

    endpoint = servers(lambda *_: (200, {}, BODY))
    write_cf113(tmp_path / "www" / "agg.nc", "tas", DIMS, ((24,), (128,), (128,)), [[URI]])
    http = make_http_server(tmp_path / "www")
    options = {"s3": {"key": KEY, "secret": SECRET, "token": TOKEN, "client_kwargs": {"endpoint_url": endpoint.url}}}
    x = daskcfa.from_cfa(http.url_for("agg.nc"), "tas", storage_options=options)
    with dask.config.set({"daskcfa.io.small-object": 64 << 20}), pytest.raises(daskcfa.UnsafeURIError) as info:
        x.compute(scheduler="threads")
    for value in (KEY, SECRET, TOKEN):
        assert value not in str(info.value)
    assert endpoint.log == []


# ---------------------------------------------------------------------------
# The lean GET (storage/lean.py): its own request, and every other answer through the client
# ---------------------------------------------------------------------------
def test_a_small_object_is_one_lean_get_signed_in_its_header(servers):
    """One GET, path-style as botocore addresses this endpoint, signed (SigV4) in the ``Authorization``
    header with the session token beside it, the checksum asked for: no SDK's request machinery
    (before: aiobotocore's, on fsspec's event loop) and no credential in the URL."""
    endpoint = servers(lambda *_: (200, {}, BODY))
    assert bytes(_read(endpoint.url, "lean").read(0, len(BODY))) == BODY
    assert len(endpoint.log) == 1, endpoint.log
    method, path, headers = endpoint.log[0]
    assert (method, path) == ("GET", "/bucket/f/0.nc")
    assert headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEY}/")
    assert headers["X-Amz-Security-Token"] == TOKEN
    assert headers["x-amz-checksum-mode"] == "ENABLED"
    assert "botocore" not in headers.get("User-Agent", "").lower(), headers


@pytest.mark.parametrize("status, code, error, match", [
    (403, "AccessDenied", daskcfa.errors.StorageError, "access denied"),
    (404, "NoSuchKey", daskcfa.NotFoundError, "not found"),
    (400, "AuthorizationHeaderMalformed", daskcfa.errors.StorageError, "storage error"),
])  # (a 503: tests/reliability/test_lean_get_attacks.py, tried again by the retry layer only)
def test_an_error_answer_to_a_lean_get_is_the_clients_to_map(servers, status, code, error, match):
    """Any answer but a plain 200 (its body is never the object) is sent again through the blocking
    botocore client, whose error the one retry layer maps: the same daskcfa error as before."""
    endpoint = servers(lambda *_: (status, {"Content-Type": "application/xml", "x-amz-bucket-region": "eu-west-2"},
                                   _error(code)))
    with pytest.raises(error, match=match) as info:
        _read(endpoint.url, "lean")
    _refused(info)
    agents = [headers.get("User-Agent", "") for _, _, headers in endpoint.log]
    assert any("botocore" in agent.lower() for agent in agents), agents


def test_a_lean_body_cut_short_is_a_storage_error(servers):
    """The server declares 64 KiB, sends 100 bytes and closes the connection: retried, then a
    StorageError naming the object (never the short bytes as the object, never a bare urllib3 error)."""
    endpoint = servers(lambda *_: (200, {"Content-Length": str(64 << 10), "Connection": "close"}, BODY[:100]))
    with pytest.raises(daskcfa.errors.StorageError) as info:
        _read(endpoint.url, "lean")
    _refused(info)
    assert len(endpoint.log) >= 2, "the cut body was not retried"


def test_a_lean_body_that_stalls_ends_at_the_read_timeout(servers):
    """Headers, part of the body, then nothing: the read timeout ends the GET with a StorageError."""
    import time

    def respond(*_):
        return 200, {"Content-Length": str(len(BODY) + 1)}, BODY

    endpoint = servers(respond)
    profile = storage.profiles.register({"key": KEY, "secret": SECRET, "token": TOKEN, "config_kwargs": {"read_timeout": 1},
                                         "client_kwargs": {"endpoint_url": endpoint.url}}, protocol="s3")
    began = time.monotonic()
    with dask.config.set({"daskcfa.storage.retries": 0}), pytest.raises(daskcfa.errors.StorageError) as info:
        storage.read_whole(URI, profile, size_hint=0)
    _refused(info)
    assert time.monotonic() - began < 30


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy"])
def test_a_proxy_in_the_environment_leaves_small_objects_to_the_sdk(servers, monkeypatch, variable):
    """botocore sends through a proxy named in the environment; the lean GET would not: not taken."""
    from daskcfa.storage import lean, objects

    endpoint = servers(lambda *_: (200, {}, BODY))
    monkeypatch.setenv(variable, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    profile = storage.profiles.register({"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint.url}},
                                        protocol="s3")
    assert lean.lean_for(objects.filesystem(URI, profile)[0]) is None


@pytest.mark.parametrize("length", [None, "-5"])
def test_a_head_answer_giving_no_valid_length_is_a_storage_error(servers, length):
    """The one HEAD looking for a chunk index (``stat(..., objects_only=True)``, session 16) answered
    200 with no ``Content-Length``, or a negative one: a ``StorageError`` naming the object, not a bare
    ``KeyError`` from the answer's parsed fields (the first form failed so on the branch that added it)."""
    endpoint = servers(lambda *_: (200, {"Content-Length": length, "Connection": "close"}, b""))
    profile = storage.profiles.register({"key": KEY, "secret": SECRET,
                                         "client_kwargs": {"endpoint_url": endpoint.url}}, protocol="s3")
    with dask.config.set({"daskcfa.storage.retries": 0}), pytest.raises(daskcfa.errors.StorageError) as info:
        storage.stat(URI, profile, objects_only=True)
    assert info.value.file == URI
