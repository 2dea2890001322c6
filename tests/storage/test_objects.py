"""storage/objects.py: the filesystems daskcfa makes for S3 do not retry by themselves, unless told to."""

from __future__ import annotations

import dask
import pytest

import daskcfa
from daskcfa import storage
from daskcfa.storage.s3_http import UnredirectedSession

from remote_helpers import FailingProxy


def _options(endpoint_url: str, **extra) -> dict:
    return {"key": "AKIDOBJECTSTEST", "secret": "objects-test-secret-value",
            "client_kwargs": {"endpoint_url": endpoint_url}, **extra}


def test_s3_filesystems_make_one_attempt_per_call():
    fs, _ = storage.filesystem("s3://bucket/x.nc", storage.register(_options("http://127.0.0.1:9"), protocol="s3"))
    assert fs.retries == 1
    assert fs.config_kwargs["retries"] == {"total_max_attempts": 1, "mode": "standard"}


def test_botocore_retries_the_user_asked_for_win():
    """Storage options naming botocore's retries are kept: three attempts by botocore, none more by daskcfa."""
    retries = {"total_max_attempts": 3, "mode": "standard"}
    with FailingProxy() as server, dask.config.set({"daskcfa.storage.retries": 0}):
        options = _options(server.endpoint_url, config_kwargs={"retries": retries, "read_timeout": 30})
        with pytest.raises(daskcfa.StorageError):
            storage.read_bytes("s3://bucket/x.nc", storage.register(options, protocol="s3"))
        assert server.connections == 3
    fs, _ = storage.filesystem("s3://bucket/x.nc", storage.register(options, protocol="s3"))
    assert fs.config_kwargs == {"retries": retries, "read_timeout": 30, "http_session_cls": UnredirectedSession}
