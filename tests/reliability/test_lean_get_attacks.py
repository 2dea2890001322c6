"""Attacks on the lean signed GET of small S3 objects (storage/lean.py), compared with the blocking
botocore GET and the GET on fsspec's event loop.

Each attack is a real HTTP server on 127.0.0.1 answering as S3 (``_FakeS3`` of
test_direct_s3_attacks: the status, headers and body the test says), read through
``storage.read_whole`` as the fragment readers call it, every way an object is received.
"""

from __future__ import annotations

import pytest

import daskcfa
from daskcfa import storage

from .test_direct_s3_attacks import (  # noqa: F401 (servers: a fixture)
    BODY, KEY, SECRET, TOKEN, WAYS, _NOT_LEAN, _read, _refused, servers)


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("uri", ["s3://bucket/", "s3://bucket"])
def test_a_uri_naming_no_key_is_never_read_as_the_bucket_listing(servers, way, uri):
    """A fragment URI naming a bucket and no object: the URL of the bucket, whose GET is its listing
    (a 200 with a declared length, no checksum). botocore refuses a GET of no key; before, the lean
    GET sent it and returned the listing's XML as the object's bytes."""
    endpoint = servers(lambda *_: (200, {}, b"<ListBucketResult><Name>bucket</Name></ListBucketResult>"))
    options = {"key": KEY, "secret": SECRET, "token": TOKEN, "client_kwargs": {"endpoint_url": endpoint.url},
               **({} if way.startswith("lean") else _NOT_LEAN)}
    profile = storage.profiles.register(options, protocol="s3")
    with pytest.raises(daskcfa.errors.StorageError) as info:
        storage.read_whole(uri, profile, size_hint=WAYS[way])
    assert info.value.file == uri
    assert endpoint.log == [], endpoint.log


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("header, value", [
    ("Content-Length", "\u00b2"),  # (latin-1 superscript two: str.isdigit says yes, int() says no)
    ("Content-Length", "abc"),
    ("x-amz-mp-parts-count", "abc"),
    ("Last-Modified", "garbage"),
])
def test_a_header_botocore_cannot_parse_is_a_storage_error(servers, way, header, value):
    """A 200 whose header botocore's response parser cannot read (an integer, a date): before, a bare
    ValueError from botocore's parser (the blocking GET, and the event loop's but for a Content-Length,
    which aiohttp refuses first), and from the lean GET's own reading of the length. Now a StorageError
    naming the object -- or the object itself, where the header plays no part (the lean GET reads
    only its status, length and checksum)."""
    endpoint = servers(lambda *_: (200, {header: value, "Connection": "close"}, BODY))
    if way.startswith("lean") and header != "Content-Length":
        assert bytes(_read(endpoint.url, way).read(0, len(BODY))) == BODY
        return
    with pytest.raises(daskcfa.errors.StorageError) as info:
        _read(endpoint.url, way)
    _refused(info)


@pytest.mark.parametrize("status", [500, 503])
def test_a_server_error_is_one_request_an_attempt(servers, status):
    """A server answering "slow down" (503) or failing (500): each attempt of the retry layer is one
    request, the next one after its backoff. Before, each lean GET's 5xx was sent again at once
    through the blocking client: two requests an attempt, the second without any backoff."""
    import dask

    endpoint = servers(lambda *_: (status, {"Content-Type": "application/xml"},
                                   b"<Error><Code>SlowDown</Code><Message>reduce your request rate</Message></Error>"))
    profile = storage.profiles.register({"key": KEY, "secret": SECRET, "token": TOKEN,
                                         "client_kwargs": {"endpoint_url": endpoint.url}}, protocol="s3")
    with dask.config.set({"daskcfa.storage.retries": 2}), pytest.raises(daskcfa.errors.StorageError) as info:
        storage.read_whole("s3://bucket/f/0.nc", profile, size_hint=0)
    assert len(endpoint.log) == 3, [(method, path) for method, path, _ in endpoint.log]
    _refused(info)


@pytest.mark.parametrize("way", list(WAYS))
def test_no_request_signature_in_debug_logs(servers, way):
    """botocore.auth logs each request's SigV4 signature at DEBUG ("Signature:" and the value), and
    botocore.endpoint the ``Authorization`` header holding it: with the request's other headers, a
    signature replays that GET for minutes. Before, it was in the records of every way; now blanked
    as the credentials are."""
    import io
    import logging

    endpoint = servers(lambda *_: (200, {}, BODY + bytes(WAYS[way])))
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    names = ("botocore", "urllib3", "aiobotocore", "s3fs")
    saved = {name: logging.getLogger(name).level for name in names}
    logging.getLogger().addHandler(handler)
    try:
        for name in names:
            logging.getLogger(name).setLevel(logging.DEBUG)
        _read(endpoint.url, way)
    finally:
        logging.getLogger().removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
    signatures = {headers["Authorization"].rsplit("Signature=", 1)[1] for _, _, headers in endpoint.log}
    text = captured.getvalue()
    assert signatures and "Signature" in text, "no signing captured"
    for signature in signatures:
        assert signature not in text


@pytest.mark.parametrize("way", list(WAYS))
def test_a_body_trickled_a_byte_at_a_time_ends_within_its_deadline(way):
    """Headers declaring 400 bytes, then one byte every 0.05 s (``read_timeout`` 2 s, no retry): each
    wait far below the read timeout, so on main (bfd4ce5) the GET lasted 20 s, every way (a gigabyte's
    body: for ever). Now the body must arrive at ``daskcfa.storage.min-throughput`` after one read
    timeout's grace: a ``StorageError`` saying so, naming the object, within a few seconds."""
    import socket
    import threading

    import dask

    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n")
                try:
                    while not stop.wait(0.05):
                        connection.sendall(b"x")
                except OSError:  # (the reader shut the connection)
                    pass

    threading.Thread(target=serve, daemon=True).start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    options = {"key": KEY, "secret": SECRET, "config_kwargs": {"read_timeout": 2},
               "client_kwargs": {"endpoint_url": endpoint}}
    if not way.startswith("lean"):
        options["config_kwargs"] = {**options["config_kwargs"], **_NOT_LEAN["config_kwargs"]}
    profile = storage.profiles.register(options, protocol="s3")
    outcome = []

    def read():
        with dask.config.set({"daskcfa.storage.retries": 0}):
            try:
                storage.read_whole("s3://bucket/f/0.nc", profile, size_hint=WAYS[way])
            except daskcfa.CFAError as exc:
                outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    still_reading = reader.is_alive()
    stop.set()  # (the server closes: the GET ends)
    reader.join(30)
    listener.close()
    assert not still_reading, "the GET was still receiving after 10 s (read_timeout 2 s)"
    assert len(outcome) == 1 and isinstance(outcome[0], daskcfa.errors.StorageError), outcome
    assert "too slowly" in str(outcome[0]) and outcome[0].file == "s3://bucket/f/0.nc"


def test_no_deadline_with_min_throughput_zero_and_a_slow_body_still_read():
    """``min-throughput`` 0 turns the deadline off; and a body slower than the read timeout's grace
    alone but within its deadline is read whole (the deadline is for trickles, not slow links)."""
    import socket
    import threading
    import time

    import dask

    listener = socket.create_server(("127.0.0.1", 0))
    body = b"y" * 40

    def serve():
        for _ in range(2):
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\nConnection: close\r\n\r\n")
                for k in range(len(body)):
                    time.sleep(0.04)
                    connection.sendall(body[k:k + 1])

    threading.Thread(target=serve, daemon=True).start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    profile = storage.profiles.register({"key": KEY, "secret": SECRET, "config_kwargs": {"read_timeout": 1},
                                         "client_kwargs": {"endpoint_url": endpoint}}, protocol="s3")
    try:
        for setting in (0, 20):  # (off; then 20 bytes a second: a deadline of 1 s + 2 s for a 1.6 s body)
            with dask.config.set({"daskcfa.storage.retries": 0, "daskcfa.storage.min-throughput": setting}):
                assert bytes(storage.read_whole("s3://bucket/f/0.nc", profile, size_hint=0).read(0, 40)) == body
    finally:
        listener.close()


def test_the_object_urls_kept_for_buckets_are_bounded():
    """An aggregation naming a new bucket in each of its fragment URIs: the lean GETs kept each
    bucket's object URL for the filesystem's life, without bound (main, bfd4ce5: 3,000 buckets,
    3,000 entries). Now at most ``lean._MAX_BUCKETS``, each URL still botocore's own."""
    from daskcfa.storage import lean, objects

    profile = storage.profiles.register({"key": KEY, "secret": SECRET,
                                         "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}, protocol="s3")
    gets = lean.lean_for(objects.filesystem("s3://bucket/f.nc", profile)[0])
    assert gets is not None
    for k in range(3000):
        assert gets.prefix(f"bucket-{k}") == f"http://127.0.0.1:9/bucket-{k}/"
    assert len(repr(gets)) < 2 ** 20 and gets.prefix("bucket-0") == "http://127.0.0.1:9/bucket-0/"
    assert 0 < sum(1 for k in range(3000) if f"bucket-{k}/" in repr(gets)) <= 1024


def test_a_connection_given_back_to_the_pool_is_not_shut_by_a_late_deadline(servers):
    """urllib3 gives a response's connection back to its pool in the read that ends the body, inside
    the deadline's block: a deadline passing just then shut a connection another GET may have taken
    (attack16c's note). The shut of a whole response's connection is now a no-op once it is given back."""
    from botocore.awsrequest import AWSRequest

    from daskcfa.storage import deadline, lean, objects

    endpoint = servers(lambda *_: (200, {}, BODY))
    profile = storage.profiles.register({"key": KEY, "secret": SECRET,
                                         "client_kwargs": {"endpoint_url": endpoint.url}}, protocol="s3")
    gets = lean.lean_for(objects.filesystem("s3://bucket/f.nc", profile)[0])

    prepared = AWSRequest(method="GET", url=endpoint.url + "/bucket/f.nc").prepare()
    prepared.stream_output = True
    response = gets.http.send(prepared).raw
    shut = deadline.shut_connection_of(response)
    sock = response.connection.sock
    assert shut is not None and response.read(len(BODY)) == BODY and response.read(1) == b""
    response.release_conn()  # (as urllib3 does at the body's end)
    shut()
    again = gets.http.send(prepared).raw  # (the pooled connection: not found shut, so not replaced)
    reused = again.connection.sock is sock
    assert again.read(len(BODY)) == BODY and reused
