"""The S3 server dies in the middle of a parallel read or of ``to_cfa`` (SIGKILL, a crash).

Real SeaweedFS, really killed (``S3Server.kill``) and restarted on the same
ports and data (``S3Server.restart``). The kill is triggered from a dask
scheduler callback after a given number of fragment tasks finished, so it
lands in the middle of the computation without any sleep.

- Read: with enough retries (``daskcfa.storage.retries``) the read rides out
  the restart and returns exactly the ground truth; with none, it fails with
  a StorageError naming the fragment -- and works again once the server is
  back. Never different data.
- Write: the write fails naming a fragment, no aggregation file is
  committed; re-running the same call after the restart resumes (rewrites
  only the fragments without a marker, counted from the PUT requests s3fs
  logs) and the result equals the input.
"""

from __future__ import annotations

import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import dask
import dask.array as da
import pytest
from dask.callbacks import Callback

import daskcfa
from builders import assert_matches, build_cf113

from .conftest import truth

SHAPE = (24, 8, 10)
FRAGMENTS = 24  # one per time step


class KillAfter(Callback):
    """Run ``action`` (once) when ``count`` tasks whose key starts with ``prefix`` have finished."""

    def __init__(self, prefix: str, count: int, action) -> None:
        super().__init__()
        self.prefix, self.count, self.action = prefix, count, action
        self.finished = 0
        self.fired = threading.Event()

    def _posttask(self, key, result, dsk, state, worker_id):
        name = key[0] if isinstance(key, tuple) else key
        if str(name).startswith(self.prefix):
            self.finished += 1
            if self.finished == self.count and not self.fired.is_set():
                self.fired.set()
                self.action()


def _options(server, attempts: int) -> dict:
    """The server's options, with botocore's own retries bounded (daskcfa's are the ones under test)."""
    return dict(server.storage_options, config_kwargs={"retries": {"max_attempts": attempts, "mode": "standard"},
                                                       "connect_timeout": 2, "read_timeout": 20})


@pytest.fixture
def s3_dataset(tmp_path, s3_server_private):
    """A 24-fragment CF-1.13 aggregation uploaded to a fresh bucket of a private server."""
    server = s3_server_private
    expected = truth(SHAPE, seed=17)
    built = build_cf113(tmp_path / "ds", expected, ("time", "lat", "lon"), ((1,) * FRAGMENTS, (8,), (10,)))
    bucket = server.new_bucket("faults")
    server.filesystem().put(str(tmp_path / "ds") + "/", f"{bucket}/ds/", recursive=True)
    return server, f"s3://{bucket}/ds/{built.path.name}", built


def test_read_rides_out_a_server_restart(s3_dataset):
    server, url, built = s3_dataset
    restarts = []
    kill = KillAfter("cfa-", 5, lambda: restarts.append(threading.Thread(target=server.restart, daemon=True)) or
                     restarts[-1].start())
    with dask.config.set({"daskcfa.storage.retries": 12, "scheduler": "threads", "num_workers": 4}):
        x = daskcfa.from_cfa(url, "tas", storage_options=_options(server, 2))
        with kill:
            got = x.compute()
    assert kill.fired.is_set() and kill.finished == FRAGMENTS
    restarts[0].join(120)
    assert server.running
    assert_matches(got, built.expected)  # exactly the truth: never wrong data


def test_streamed_read_of_large_objects_rides_out_a_server_restart(tmp_path, s3_server_private):
    """Objects over 1 MiB come down by a blocking GET each (storage/direct.py): a kill mid-read is retried whole."""
    from daskcfa import storage

    server = s3_server_private
    expected = truth((8, 600, 600), seed=29)  # 1.4 MB per one-step fragment
    built = build_cf113(tmp_path / "ds", expected, ("time", "lat", "lon"), ((1,) * 8, (600,), (600,)))
    bucket = server.new_bucket("streamed")
    server.filesystem().put(str(tmp_path / "ds") + "/", f"{bucket}/ds/", recursive=True)
    assert server.filesystem().size(f"{bucket}/ds/{built.fragment_uris[(0, 0, 0)][0]}") > storage.objects._DIRECT_FROM
    restarts = []
    kill = KillAfter("cfa-", 3, lambda: restarts.append(threading.Thread(target=server.restart, daemon=True)) or
                     restarts[-1].start())
    with dask.config.set({"daskcfa.storage.retries": 12, "scheduler": "threads", "num_workers": 4}):
        x = daskcfa.from_cfa(f"s3://{bucket}/ds/{built.path.name}", "tas", storage_options=_options(server, 2))
        with kill:
            got = x.compute()
    assert kill.fired.is_set() and kill.finished == 8
    restarts[0].join(120)
    assert_matches(got, built.expected)


def test_read_without_retries_fails_clearly_then_recovers(s3_dataset):
    server, url, built = s3_dataset
    with dask.config.set({"daskcfa.storage.retries": 0, "scheduler": "threads", "num_workers": 4}):
        x = daskcfa.from_cfa(url, "tas", storage_options=_options(server, 1))
        with KillAfter("cfa-", 5, server.kill) as kill, pytest.raises(daskcfa.CFAError) as info:
            x.compute()
        assert kill.fired.is_set()
        err = info.value
        assert isinstance(err, daskcfa.StorageError), f"{type(err).__name__}: {err}"
        assert err.fragment is not None and err.variable.lstrip("/") == "tas"
        assert err.file.startswith("s3://") and err.file.endswith(".nc") and err.file in str(err)
        assert server.secret not in str(err) and server.key not in str(err)
        server.restart()
    with dask.config.set({"daskcfa.storage.retries": 8, "scheduler": "threads", "num_workers": 4}):
        # the same lazy array, once the server is back (retries ride out its first "internal error" answers)
        assert_matches(x.compute(), built.expected)


def _fragment_puts(caplog, bucket: str) -> list[str]:
    """Keys of the fragment objects PUT, from s3fs's DEBUG log of its calls."""
    keys = []
    for record in caplog.records:
        message = record.getMessage()
        if record.name.startswith("s3fs") and "CALL: put_object" in message and bucket in message:
            match = re.search(r"'Key': '([^']+)'", message)
            if match and match.group(1).endswith(".nc") and "/.daskcfa/" not in match.group(1):
                keys.append(match.group(1))
    return keys


def test_write_interrupted_by_a_crash_commits_nothing_then_resumes(tmp_path, s3_server_private, caplog):
    server = s3_server_private
    bucket = server.new_bucket("write")
    url = f"s3://{bucket}/out/tas.nca"
    expected = truth(SHAPE, seed=23)
    data = da.from_array(expected, chunks=(1, 8, 10))
    fs = server.filesystem()

    def write(options):
        return daskcfa.to_cfa(data, url, variable="tas", dims=("time", "lat", "lon"), attrs={"units": "K"},
                              fragment_shape=(1, 8, 10), storage_options=options)

    # dask's threaded scheduler raises the first failure while the other thread's task may still run (botocore
    # tries a PUT once more after a pause): waiting for that thread keeps a late PUT from landing after the
    # restart, between the markers counted below and the resume (the likely cause, not shown, of one failure
    # in session 16's runs: the resume found one marker more than counted here)
    pool = ThreadPoolExecutor(2)
    with dask.config.set({"daskcfa.storage.retries": 0, "scheduler": "threads", "pool": pool}):
        with KillAfter("cfa-write-", 6, server.kill) as kill, pytest.raises(daskcfa.CFAError) as info:
            write(_options(server, 1))
    pool.shutdown(wait=True)
    assert kill.fired.is_set()
    err = info.value
    assert isinstance(err, (daskcfa.FragmentError, daskcfa.StorageError)), f"{type(err).__name__}: {err}"
    assert err.fragment is not None
    assert err.variable == "/tas" and err.file.startswith(f"s3://{bucket}/out/tas/") and err.file in str(err)
    assert server.secret not in str(err)

    server.restart()
    objects = fs.find(f"{bucket}/out")
    assert f"{bucket}/out/tas.nca" not in objects, "an aggregation file was committed"
    # no temporary; the lease stays (the server was down when the write failed): its own re-run takes it over
    assert [o for o in objects if o.rsplit("/", 1)[-1].startswith(".tas.nca")] == [f"{bucket}/out/.tas.nca.lease"]
    assert not [o for o in objects if o.endswith("manifest.json")], objects
    markers = [o for o in objects if "/.daskcfa/" in o]
    assert 6 <= len(markers) < FRAGMENTS, markers

    caplog.set_level(logging.DEBUG, logger="s3fs")
    with dask.config.set({"daskcfa.storage.retries": 3, "scheduler": "threads", "num_workers": 2}):
        assert write(_options(server, 2)) == url  # the very same call
    rewritten = _fragment_puts(caplog, bucket)
    assert len(rewritten) == len(set(rewritten)) == FRAGMENTS - len(markers), (len(rewritten), len(markers))

    assert_matches(daskcfa.from_cfa(url, storage_options=server.storage_options).compute(), expected)
    objects = fs.find(f"{bucket}/out")
    assert len(daskcfa.history(url, storage_options=server.storage_options)) == 1  # (the one commit: a version)
    objects = [o for o in objects if "/tas/.daskcfa/versions/" not in o]
    fragments = sorted(o for o in objects if o.endswith(".nc") and "/.daskcfa/" not in o)
    assert len(fragments) == FRAGMENTS
    # (the re-run took the dead run's lease over: its owner is recorded, never to commit; lease18)
    assert f"{bucket}/out/tas/.daskcfa/abandoned.json" in objects
    assert len([o for o in objects if "/.daskcfa/" in o and not o.endswith(("manifest.json", "abandoned.json"))]) \
        == FRAGMENTS
    assert sorted(set(objects) - set(fragments)) == sorted(
        [f"{bucket}/out/tas.nca", f"{bucket}/out/tas/.daskcfa/manifest.json"]
        + [o for o in objects if "/.daskcfa/" in o and not o.endswith("manifest.json")])
    print(f"S3 crash during to_cfa: {len(markers)} of {FRAGMENTS} fragments survived; {len(rewritten)} rewritten")
