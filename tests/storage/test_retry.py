"""daskcfa's retries are the only ones: s3fs and botocore make one attempt per call,
every attempt is logged at WARNING, and the total time is bounded."""

from __future__ import annotations

import logging
import re
import socket
import time

import dask
import pytest

import daskcfa
from daskcfa import storage

from remote_helpers import FailingProxy

RETRY_LOGGER = "daskcfa.storage.retry"


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _options(endpoint_url: str) -> dict:
    return {"key": "AKIDRETRYTEST1", "secret": "retry-test-secret-value", "client_kwargs": {"endpoint_url": endpoint_url}}


def _attempts(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == RETRY_LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize("retries", [0, 2])
def test_unreachable_endpoint_fails_after_daskcfa_retries_only(caplog, retries):
    url = "s3://bucket/archive/tas.nca"
    caplog.set_level(logging.WARNING, logger="daskcfa")
    started = time.monotonic()
    with dask.config.set({"daskcfa.storage.retries": retries}), pytest.raises(daskcfa.StorageError) as info:
        daskcfa.from_cfa(url, storage_options=_options(f"http://127.0.0.1:{_closed_port()}"))
    assert time.monotonic() - started < 60  # (only a guard against hangs)
    assert info.value.file == url and url in str(info.value)
    attempts = _attempts(caplog)
    assert len(attempts) == retries + 1
    for k, record in enumerate(attempts, 1):
        message = record.getMessage()
        assert f"attempt {k} of {retries + 1} on {url}" in message
        assert "EndpointConnectionError" in message
        assert ("giving up" if k == retries + 1 else "retrying in") in message
        assert "retry-test-secret-value" not in message


@pytest.mark.parametrize("retries", [0, 3])
def test_each_attempt_is_one_connection(caplog, retries):
    """Counted by a real TCP server answering every request "503" (botocore alone would retry that
    four times, s3fs each of those five times): botocore and s3fs add no attempt."""
    caplog.set_level(logging.WARNING, logger="daskcfa")
    # (a deadline no busy machine reaches: this counts attempts, and the deadline has a test of its own)
    with FailingProxy() as server, dask.config.set({"daskcfa.storage.retries": retries,
                                                    "daskcfa.storage.retry-deadline": 600}):
        with pytest.raises(daskcfa.StorageError) as info:
            storage.read_bytes("s3://bucket/x.nc", storage.register(_options(server.endpoint_url), protocol="s3"))
        assert server.connections == retries + 1
    assert info.value.file == "s3://bucket/x.nc"
    assert len(_attempts(caplog)) == retries + 1


def test_retries_stop_at_the_deadline(caplog):
    caplog.set_level(logging.WARNING, logger="daskcfa")
    config = {"daskcfa.storage.retries": 1000, "daskcfa.storage.retry-deadline": 0.5}
    started = time.monotonic()
    with FailingProxy() as server, dask.config.set(config), pytest.raises(daskcfa.StorageError):
        storage.read_bytes("s3://bucket/x.nc", storage.register(_options(server.endpoint_url), protocol="s3"))
    assert time.monotonic() - started < 60
    attempts = _attempts(caplog)
    assert 1 <= len(attempts) < 20 and server.connections == len(attempts)
    assert "giving up" in attempts[-1].getMessage()
    assert all(re.search(r"attempt \d+ of 1001 ", r.getMessage()) for r in attempts)


def test_a_retry_that_succeeds_reads_the_object(s3_server, s3_bucket, caplog):
    s3_server.filesystem().pipe_file(f"{s3_bucket}/x.bin", b"payload")
    caplog.set_level(logging.WARNING, logger="daskcfa")
    host, port = s3_server.endpoint_url.removeprefix("http://").split(":")
    with FailingProxy((host, int(port)), failures=2) as proxy, dask.config.set({"daskcfa.storage.retries": 3}):
        options = dict(s3_server.storage_options, client_kwargs={"endpoint_url": proxy.endpoint_url})
        assert storage.read_bytes(f"s3://{s3_bucket}/x.bin", storage.register(options, protocol="s3")) == b"payload"
    assert len(_attempts(caplog)) == 2
