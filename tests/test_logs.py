"""daskcfa's loggers (``daskcfa/logs.py``): silent unless the application configures logging,
and at DEBUG, against the real S3 server, telling what happened without a secret."""

from __future__ import annotations

import logging
import subprocess
import sys

import dask
import dask.array as da
import numpy as np

import daskcfa

from remote_helpers import FailingProxy


def test_the_library_configures_only_a_null_handler():
    code = ("import logging, daskcfa; root = logging.getLogger('daskcfa'); "
            "print([type(h).__name__ for h in root.handlers], logging.getLogger().handlers, root.level, "
            "[n for n, l in logging.root.manager.loggerDict.items() if n.startswith('daskcfa.') "
            "and isinstance(l, logging.Logger) and l.handlers])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['NullHandler'] [] 0 []"


def test_s3_write_and_read_at_debug_log_opens_retries_and_commits_never_a_secret(s3_server, s3_bucket, caplog):
    data = np.arange(4 * 6 * 5, dtype="f4").reshape(4, 6, 5)
    url = f"s3://{s3_bucket}/logs/tas.nca"
    host, port = s3_server.endpoint_url.removeprefix("http://").split(":")
    caplog.set_level(logging.DEBUG)  # every logger: botocore's signing and s3fs's calls too
    # the first request of the write is answered "503": daskcfa's retry, logged
    with FailingProxy((host, int(port)), failures=1) as proxy, dask.config.set(scheduler="threads"):
        options = dict(s3_server.storage_options, client_kwargs={"endpoint_url": proxy.endpoint_url})
        assert daskcfa.to_cfa(da.from_array(data, chunks=(2, 6, 5)), url, variable="tas",
                              dims=("time", "lat", "lon"), fragment_shape=(2, 6, 5), storage_options=options) == url
        got = daskcfa.from_cfa(url, "tas", storage_options=options).compute()
    np.testing.assert_array_equal(got, data)

    records = caplog.records
    assert len(records) > 100  # (botocore's DEBUG records are there to be searched)
    for record in records:
        text = record.getMessage() + (record.exc_text or "")
        assert s3_server.secret not in text and s3_server.key not in text, record.name
    assert s3_server.secret not in caplog.text and s3_server.key not in caplog.text

    def daskcfa_messages(name: str, level: int) -> list[str]:
        return [r.getMessage() for r in records if r.name == name and r.levelno == level]

    retries = daskcfa_messages("daskcfa.storage.retry", logging.WARNING)
    assert len(retries) == 1 and retries[0].startswith(f"storage attempt 1 of 4 on s3://{s3_bucket}/logs/")
    assert "retrying in" in retries[0]
    commits = daskcfa_messages("daskcfa.storage.publish", logging.INFO)
    assert len(commits) == 1 and commits[0].startswith(f"committed aggregation file {url} (generation g-")
    assert "2 fragments written, 0 resumed" in commits[0]
    opened = daskcfa_messages("daskcfa.fragments.files", logging.DEBUG)
    fragment = f"s3://{s3_bucket}/logs/tas/g-"
    assert len([m for m in opened if m.startswith(f"opened fragment {fragment}")]) == 2, opened
    assert all("engine: direct HDF5" in m for m in opened if m.startswith("opened fragment"))
