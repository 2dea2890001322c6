"""Leases on write targets (``daskcfa.storage.lease``), on local disk and on the real S3 server.

Exclusive creation, stale leases of dead or expired writers taken over by
exactly one successor, a writer that lost its lease stopped, and first of all
what SeaweedFS honours: ``If-None-Match: *`` and ``If-Match`` on PUT.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import botocore.exceptions
import dask
import pytest

from daskcfa import StorageError, WriteConflictError
from daskcfa.storage import register
from daskcfa.storage.lease import (GENERATION, Lease, generation_name, generation_of, in_generation, lease_uri,
                                   marker_of)
from daskcfa.storage.uri import is_local


class Place:
    """A target URL, its storage profile, and raw access to its lease object."""

    def __init__(self, url: str, profile, read, write) -> None:
        self.url, self.profile, self.read, self.write = url, profile, read, write

    def plant(self, **record) -> None:
        """A lease as another (possibly dead) writer left it."""
        data = {"owner": "someone", "host": "elsewhere", "pid": 1, "generation": "g-0000000000000000",
                "expires": time.time() + 600, **record}
        self.write(json.dumps(data).encode())


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path):
    if request.param == "local":
        url = str(tmp_path / "t.nca")
        path = lease_uri(url)
        return Place(url, register(None, protocol="file"), lambda: open(path, "rb").read(),
                     lambda data: open(path, "wb").write(data))
    server = request.getfixturevalue("s3_server")
    bucket, client = server.new_bucket(), server.client()
    return Place(f"s3://{bucket}/d/t.nca", register(server.storage_options, protocol="s3"),
                 lambda: client.get_object(Bucket=bucket, Key="d/.t.nca.lease")["Body"].read(),
                 lambda data: client.put_object(Bucket=bucket, Key="d/.t.nca.lease", Body=data))


def test_s3_server_honours_conditional_puts(s3_server):
    """SeaweedFS 4.48: a second create-if-absent and a PUT with a wrong ETag are refused (412)."""
    client, bucket = s3_server.client(), s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="k", Body=b"one", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=bucket, Key="k", Body=b"two", IfMatch='"0123"')
    etag = client.head_object(Bucket=bucket, Key="k")["ETag"]
    client.put_object(Bucket=bucket, Key="k", Body=b"three", IfMatch=etag)
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"three"


def test_a_live_lease_excludes_others(place):
    url, profile, raw = place.url, place.profile, place.read
    first = Lease.new(url, profile, "g-1111111111111111").acquire()
    assert json.loads(raw())["owner"] == first.owner
    first.acquire()  # the holder again: fine
    with pytest.raises(WriteConflictError, match=r"another writer holds the target: a write by process \d+"):
        Lease.new(url, profile, "g-2222222222222222").acquire()
    first.release()
    Lease.new(url, profile, "g-2222222222222222").acquire()


def test_dead_or_expired_holders_are_taken_over(place, caplog):
    caplog.set_level(logging.WARNING, logger="daskcfa")
    url, profile, raw = place.url, place.profile, place.read
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    place.plant(host=socket.gethostname(), pid=int(dead.stdout))  # a killed writer on this host
    successor = Lease.new(url, profile, "g-3333333333333333").acquire()
    assert json.loads(raw())["owner"] == successor.owner
    place.plant(expires=time.time() - 1)  # an expired lease of a writer on another host
    Lease.new(url, profile, "g-4444444444444444").acquire()
    taken = [r.getMessage() for r in caplog.records if r.name == "daskcfa.storage.lease"]
    assert len(taken) == 2 and all(r.levelno == logging.WARNING for r in caplog.records if r.name.startswith("daskcfa"))
    assert all(m.startswith(f"took over the stale write lease {lease_uri(url)} on {url}") for m in taken)
    assert f"process {int(dead.stdout)} " in taken[0] and "lease expired" in taken[1]
    with pytest.raises(WriteConflictError):
        successor.confirm(force=True)  # it lost the lease: it must not write or commit anything more


def test_one_successor_wins(place):
    """Eight writers at once on a stale lease (and eight on none): exactly one gets it each time,
    many times over (a successor that checked a lease by moving it away let a third create one
    in that instant: two winners, seen once in a few hundred races under load)."""
    url, profile = place.url, place.profile
    rounds = 40 if is_local(url) else 4
    for stale in (False,) + (True,) * rounds:
        if stale:
            place.plant(expires=time.time() - 1)
        candidates = [Lease.new(url, profile, f"g-{n:016x}") for n in range(8)]
        won, barrier = [], threading.Barrier(len(candidates))

        def take(lease: Lease) -> None:
            barrier.wait()
            try:
                lease.acquire()
                won.append(lease)
            except WriteConflictError:
                pass

        threads = [threading.Thread(target=take, args=(c,)) for c in candidates]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, won
        won[0].confirm(force=True)
        won[0].release()


def test_confirm_extends_the_lease(place):
    url, profile, raw = place.url, place.profile, place.read
    with dask.config.set({"daskcfa.write.lease-seconds": 2}):
        lease = Lease.new(url, profile, "g-5555555555555555").acquire()
        first = json.loads(raw())["expires"]
        time.sleep(1.2)  # past half its time (and past the per-process pause between looks)
        lease.confirm()
        assert json.loads(raw())["expires"] > first + 1
        time.sleep(1.2)
        with pytest.raises(WriteConflictError):  # still valid thanks to the renewal
            Lease.new(url, profile, "g-6666666666666666").acquire()


def test_generation_names():
    gen = generation_name("abc")
    assert GENERATION.fullmatch(gen) and gen == generation_name("abc") != generation_name("abd")
    assert in_generation("a7/a7.tas.0.1.nc", gen) == f"a7/{gen}/a7.tas.0.1.nc"
    assert in_generation("frag_0.nc", gen) == f"{gen}/frag_0.nc"
    assert marker_of(f"s3://b/a7/{gen}/a7.tas.0.1.nc") == f"s3://b/a7/{gen}/.daskcfa/a7.tas.0.1.nc.json"


def test_a_name_with_a_trailing_newline_is_no_generation():
    """A directory named like a generation plus a newline (a name in a hostile aggregation file or
    manifest) is not a generation of daskcfa's: nothing treats its fragments as its own."""
    gen = generation_name("abc")
    assert generation_of(f"s3://b/a7/{gen}/a7.tas.0.1.nc") == gen
    assert generation_of(f"s3://b/a7/{gen}\n/a7.tas.0.1.nc") is None
    assert not GENERATION.fullmatch(gen + "\n")


def test_lease_requests_on_s3_are_retried(s3_server, caplog):
    """The lease's own S3 requests (a GET, conditional PUTs) go through daskcfa's retries: an
    overloaded server's first "503" costs a retry, logged, not the write."""
    from remote_helpers import FailingProxy

    bucket = s3_server.new_bucket()
    host, port = s3_server.endpoint_url.removeprefix("http://").split(":")
    caplog.set_level(logging.WARNING, logger="daskcfa")
    with FailingProxy((host, int(port)), failures=1) as proxy:
        options = dict(s3_server.storage_options, client_kwargs={"endpoint_url": proxy.endpoint_url})
        lease = Lease.new(f"s3://{bucket}/d/t.nca", register(options, protocol="s3"), "g-5555555555555555").acquire()
        lease.confirm(force=True)
        lease.release()
    retries = [r.getMessage() for r in caplog.records if r.name == "daskcfa.storage.retry"]
    assert len(retries) == 1 and retries[0].startswith(f"storage attempt 1 of 4 on s3://{bucket}/d/.t.nca.lease")


# ---------------------------------------------------------------------------
# Issue #27, attack 5: garbage lease records
# ---------------------------------------------------------------------------
_HERE = socket.gethostname()
_GARBAGE = {
    "pid-text": {"host": _HERE, "pid": "abc"},
    "expiry-text": {"expires": "soon"},
    "expiry-nan": {"expires": float("nan")},
    "expiry-infinite": {"expires": float("inf")},
    "pid-2**80": {"host": _HERE, "pid": 2**80},
    "pid-0": {"host": _HERE, "pid": 0},  # os.kill(0, 0) signals our own process group: it "lived"
    "pid-minus-1": {"host": _HERE, "pid": -1},
    "pid-true": {"host": _HERE, "pid": True},
    "owner-list": {"owner": ["someone"]},
    "far-future-other-host": {"expires": time.time() + 10**12},
    "far-future-declared": {"expires": time.time() + 10**12, "seconds": 10**12},
    "expiry-10**400": {"expires": 10**400},  # (a JSON integer past a float: bare OverflowError)
    "seconds-10**400": {"seconds": -10**400},
}


@pytest.mark.parametrize("name", sorted(_GARBAGE) + ["a-list", "not-json", "nested-100000", "huge"])
def test_malformed_or_forged_lease_records_are_stale(place, name, caplog):
    """Every one of these is taken over (with the warning naming the lease), not a bare ValueError,
    TypeError or OverflowError, nor a target blocked until someone deletes the lease."""
    caplog.set_level(logging.WARNING, logger="daskcfa")
    if name == "a-list":
        place.write(b"[1]")
    elif name == "not-json":
        place.write(b"\xff\xfe garbage")
    elif name == "nested-100000":
        place.write(b"[" * 100000 + b"]" * 100000)
    elif name == "huge":  # a live-looking record padded to 1 MiB: read no further than a record can be long
        place.write(b" " * 2**20 + json.dumps({"owner": "someone", "host": "elsewhere", "pid": 1, "generation": "g",
                                                "expires": time.time() + 600}).encode())
    else:
        place.plant(**_GARBAGE[name])
    lease = Lease.new(place.url, place.profile, "g-7777777777777777").acquire()
    assert json.loads(place.read())["owner"] == lease.owner
    taken = [r.getMessage() for r in caplog.records if r.name == "daskcfa.storage.lease"]
    assert len(taken) == 1 and taken[0].startswith(f"took over the stale write lease {lease_uri(place.url)}")
    lease.confirm(force=True)
    lease.release()


def test_a_longer_lease_of_another_writer_is_not_forged(place):
    """A writer configured with a longer lease (declared in its record) still excludes the others,
    up to the longest lease the configuration allows."""
    place.plant(expires=time.time() + 3000, seconds=3600)
    with pytest.raises(WriteConflictError, match="another writer holds the target"):
        Lease.new(place.url, place.profile, "g-8888888888888888").acquire()
    place.plant(expires=time.time() + 600 + 200)  # (another host's clock a little ahead)
    with pytest.raises(WriteConflictError, match="another writer holds the target"):
        Lease.new(place.url, place.profile, "g-8888888888888888").acquire()


def test_a_garbled_record_of_our_own_lease_is_a_lost_lease(place):
    lease = Lease.new(place.url, place.profile, "g-9999999999999999").acquire()
    place.plant(owner=lease.owner, expires="soon")
    with pytest.raises(WriteConflictError, match="lost its lease on the target \\(now held by a malformed lease"):
        lease.confirm(force=True)
    lease.release()  # (never raises)


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "link-to-a-record", "directory"])
def test_a_local_lease_that_is_not_a_regular_file(tmp_path, kind):
    """A FIFO planted as the lease blocked every writer of the target forever (reading it waited for
    a writer), a link was followed (to a FIFO: the same; to a live-looking record elsewhere: the
    target blocked), a directory was a bare IsADirectoryError. Now a FIFO or link is a malformed
    record, taken over (the link replaced, never what it points to); a directory a StorageError
    naming the lease, no temporary left."""
    url = str(tmp_path / "ds" / "t.nca")
    path = lease_uri(url)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / "ds").mkdir()
    pipe, record = outside / "pipe", outside / "record"
    os.mkfifo(pipe)
    record.write_text(json.dumps({"owner": "someone", "host": "elsewhere", "pid": 1, "generation": "g",
                                  "expires": time.time() + 600}))
    planted = record.read_bytes()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    else:
        os.symlink(pipe if kind == "link-to-fifo" else record, path)
    outcome = {}

    def take():
        try:
            outcome["lease"] = Lease.new(url, register(None, protocol="file"), "g-6666666666666666").acquire()
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        for fifo in (path, pipe):  # (let the blocked read end)
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        thread.join(10)
        pytest.fail("acquire() blocked on the planted lease")
    if kind == "directory":
        assert isinstance(outcome.get("error"), StorageError), outcome
        assert "cannot take the write lease" in str(outcome["error"]) and ".t.nca.lease" in str(outcome["error"])
        assert sorted(os.listdir(tmp_path / "ds")) == [".t.nca.lease", ".t.nca.lease.lock"]  # no temporary left
        return
    lease = outcome["lease"]
    assert stat.S_ISREG(os.lstat(path).st_mode) and json.loads(open(path, "rb").read())["owner"] == lease.owner
    assert stat.S_ISFIFO(os.stat(pipe).st_mode) and record.read_bytes() == planted  # (the link replaced, not its target)
    lease.release()


def test_a_link_planted_as_the_lease_lock_creates_nothing_elsewhere(tmp_path):
    """``.<name>.lease.lock`` planted as a link to a path that does not exist: taking the lease
    created that file (O_CREAT follows links), wherever the link pointed. Now the link is refused
    (a StorageError naming the lease), nothing created."""
    (tmp_path / "ds").mkdir()
    url = str(tmp_path / "ds" / "t.nca")
    elsewhere = tmp_path / "elsewhere" / "created"
    elsewhere.parent.mkdir()
    os.symlink(elsewhere, lease_uri(url) + ".lock")
    with pytest.raises(StorageError, match="cannot take the write lease"):
        Lease.new(url, register(None, protocol="file"), "g-5555555555555555").acquire()
    assert not os.path.lexists(elsewhere)
