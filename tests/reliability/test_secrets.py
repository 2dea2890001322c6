"""Secrets stay secret through a whole distributed read *and write*, at DEBUG level.

Extends tests/test_remote_security.py (which covers reads, graphs and errors)
with ``to_cfa`` on a real LocalCluster: every logger of distributed, daskcfa,
fsspec, s3fs, botocore, aiohttp... at DEBUG in the client and in every
worker, plus the workers', nannies' and scheduler's own logs. The secret
must appear in none of them, in no exception text (a failed write, a failed
read, with tracebacks), in no pickled task graph (read and write) and in no
repr -- whether the credentials come from ``storage_options`` or from the
standard AWS environment variables.
"""

from __future__ import annotations

import logging
import pickle
import traceback

import cloudpickle
import dask.array as da
import pytest

import daskcfa
from builders import assert_matches
from test_remote_security import (LOGGERS, _start_capture, _stop_capture, _unique_options, _worker_lines,
                                  _worker_start_capture)

from .conftest import truth


def _text_of(err: BaseException) -> str:
    return "".join(traceback.format_exception(err)) + repr(err) + str(err) + repr(err.args)


def _graph_blob(collection) -> bytes:
    graph = dict(collection.__dask_graph__())
    return b"".join(pickle.dumps(k) + cloudpickle.dumps(v) for k, v in graph.items()) + cloudpickle.dumps(collection)


@pytest.fixture
def debug_everywhere():
    handler, saved = _start_capture(LOGGERS)
    yield handler.lines
    _stop_capture(handler, saved)


@pytest.mark.parametrize("credentials", ["storage_options", "environment"])
def test_distributed_write_and_read_leak_no_secret(s3_server, debug_everywhere, monkeypatch, credentials):
    from distributed import Client, LocalCluster

    secret, key = s3_server.secret, s3_server.key
    if credentials == "environment":  # the standard AWS variables, inherited by the worker processes
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        options = {"client_kwargs": {"endpoint_url": s3_server.endpoint_url}, "use_listings_cache": False,
                   "config_kwargs": {"read_timeout": 61.25}}
    else:
        options = _unique_options(s3_server)
    bucket = s3_server.new_bucket("secrets")
    url = f"s3://{bucket}/out/tas.nca"
    expected = truth((8, 6, 5), seed=59)
    data = da.from_array(expected, chunks=(2, 6, 5))
    texts: list[str] = []
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None, host="127.0.0.1",
                      silence_logs=logging.DEBUG) as cluster, Client(cluster) as client:
        client.run(_worker_start_capture)
        delayed = daskcfa.to_cfa(data, url, variable="tas", dims=("time", "lat", "lon"), attrs={"units": "K"},
                                 fragment_shape=(2, 6, 5), storage_options=options, compute=False)
        blobs = [_graph_blob(delayed)]
        texts += [repr(delayed), repr(dict(delayed.__dask_graph__()))]
        assert client.compute(delayed).result() == url

        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        blobs.append(_graph_blob(x))
        ds = daskcfa.open_cfa(url, storage_options=options)
        texts += [repr(x), repr(ds), repr(ds["tas"]), x._repr_html_()]
        assert_matches(x.compute(), expected)

        # failures, raised in the workers: a write into a bucket that does not exist, a fragment gone
        with pytest.raises(daskcfa.CFAError) as write_error:
            daskcfa.to_cfa(data, f"s3://{bucket}-missing/out/tas.nca", variable="tas", dims=("time", "lat", "lon"),
                           fragment_shape=(2, 6, 5), storage_options=options)
        fs = s3_server.filesystem()
        fs.rm(next(p for p in fs.find(f"{bucket}/out/tas") if p.endswith("/tas.tas.1.0.0.nc")))
        with pytest.raises(daskcfa.MissingFragmentError) as read_error:
            x.compute()
        texts += [_text_of(write_error.value), _text_of(read_error.value)]
        blobs += [pickle.dumps(write_error.value), pickle.dumps(read_error.value)]

        worker_lines = [line for lines in client.run(_worker_lines).values() for line in lines]
        logs = [msg for records in client.get_worker_logs().values() for _, msg in records]
        logs += [msg for records in client.get_worker_logs(nanny=True).values() for _, msg in records]
        logs += [msg for _, msg in client.get_scheduler_logs()]

    assert len(worker_lines) > 50 and any("put_object" in line for line in worker_lines), \
        "the workers' DEBUG logs did not capture the uploads"
    assert any("get_object" in line or "GetObject" in line for line in worker_lines + debug_everywhere)
    everything = "\n".join(worker_lines + logs + list(debug_everywhere) + texts)
    assert secret not in everything
    for blob in blobs:
        assert secret.encode() not in blob
    print(f"secrets: {len(worker_lines)} worker log lines, {len(debug_everywhere)} client log lines, "
          f"{len(logs)} cluster log records, {sum(map(len, blobs)):,} bytes of pickled graphs and errors checked")


def test_secret_in_a_url_is_redacted_from_errors_and_warnings(tmp_path, http_server):
    """Credentials embedded in a URI (``user:pw@`` or a signed query) never reach a message."""
    from builders import build
    from remote_helpers import rewrite_uris

    from .conftest import DIMS, SIZES, VICTIM

    secret = "pw-embedded-0123456789"
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    host = http_server.url.split("://")[1]
    rewrite_uris(built.path, built.names["uris"],
                 lambda u: f"http://reader:{secret}@{host}/gone.nc?X-Amz-Signature={secret}"
                 if u == built.fragment_uris[VICTIM][0] else u)
    # refused by a confining policy: the refusal quotes the URI, redacted
    x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=[str(tmp_path)])
    with pytest.raises(daskcfa.UnsafeURIError) as refused:
        x.compute(scheduler="sync")
    # allowed, but not there: the error, and with missing="fill" the warning, name it redacted
    x = daskcfa.from_cfa(str(built.path), "tas")
    with pytest.raises(daskcfa.MissingFragmentError) as missing:
        x.compute(scheduler="sync")
    with pytest.warns(daskcfa.CFAWarning, match="gone.nc") as record:
        daskcfa.from_cfa(str(built.path), "tas", missing="fill").compute(scheduler="sync")
    for text in (_text_of(refused.value), _text_of(missing.value), *(str(w.message) for w in record)):
        assert secret not in text and "***" in text
