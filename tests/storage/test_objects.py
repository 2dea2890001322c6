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


def test_an_s3_object_read_whole_without_a_size_keeps_its_declared_length_as_bound(s3_server, s3_bucket):
    """``daskcfa.limits.max-memory`` bounds an HTTP(S) body read whole with neither a size nor a bound (its
    length may be undeclared, or inflated); an S3 object's body comes against the length S3 declares, so a
    user's own object larger than the setting still reads whole (trust18 had refused it before its body)."""
    payload = bytes(range(256)) * 256  # 64 KiB
    s3_server.filesystem().pipe(f"{s3_bucket}/whole/object.bin", payload)
    profile = storage.register(s3_server.storage_options, protocol="s3")
    with dask.config.set({"daskcfa.limits.max-memory": "16KiB"}):
        assert storage.read_whole(f"s3://{s3_bucket}/whole/object.bin", profile).tobytes() == payload
