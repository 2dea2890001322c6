"""The generation a killed (or paused) writer leaves, deleted by the successor that takes over its lease
(lease18). Real netCDF files, real writer processes SIGKILLed, the real S3 server.

The successor records the stale holder's generation (``<stem>/.daskcfa/abandoned.json``) and deletes
it at its commit, under its lease, unless a kept version references it, it is the successor's own
generation (the same ``to_cfa`` re-run: it resumes), or it is not a directory ``<stem>/g-<16 hex>/``
reached through no link. Each test fails on the code before lease18 (the dead generation stays).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa import WriteConflictError
from daskcfa.fragments.manager import manager
from daskcfa.netcdf4 import Dataset
from daskcfa.storage import register
from daskcfa.storage.access import open_aggregation
from daskcfa.storage.lease import GENERATION, Lease, lease_uri
from daskcfa.write.commit import kept_fragments

from .conftest import wait_for
from .test_session16_write_attacks import DIMS, SHAPE, assert_tidy, read, values, write

#: ``Dataset(url, "a")`` assigning every time step (each fragment written when complete), then waiting
#: to be killed before close(); storage options (JSON) in argv[2]
DATASET_WRITER = """
import json, sys, time
import numpy as np
from daskcfa.netcdf4 import Dataset
ds = Dataset(sys.argv[1], "a", buffer_size=1, storage_options=json.loads(sys.argv[2]) or None)
for t in range(%d):
    ds["tas"][t] = np.full(%r, 5.0, "f4")
print("assigned", flush=True)
time.sleep(600)
""" % (SHAPE[0], SHAPE[1:])

#: ``to_cfa`` of a constant field (argv[2]) killed right before its commit: every fragment and marker is
#: stored, the aggregation file not switched (the commit task stands still until the kill)
TO_CFA_WRITER = """
import sys, time
import dask
import numpy as np
import daskcfa
import daskcfa.graph.write as graph_write

def stand_still(*args):
    print("fragments written", flush=True)
    time.sleep(600)

graph_write.commit_aggregation = stand_still
with dask.config.set(scheduler="synchronous"):
    daskcfa.to_cfa(np.full(%r, float(sys.argv[2]), "f4"), sys.argv[1], variable="tas", dims=%r,
                   fragment_shape=(2, 30, 40), mode="w")
""" % (SHAPE, DIMS)


def _child(script: str, *args: str) -> subprocess.Popen:
    source = str(Path(daskcfa.__file__).parents[1])  # (the child imports this daskcfa)
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": source})


def _kill_after(proc: subprocess.Popen, line: str, settled=None) -> None:
    """Kill the child (SIGKILL) once it has printed ``line`` (and ``settled()`` holds)."""
    try:
        assert proc.stdout.readline().strip() == line
        if settled is not None:
            wait_for(settled, what="the writer's fragments")
            time.sleep(0.5)  # (its last fragment renamed into place: nothing more to come)
    finally:
        proc.kill()
        proc.wait(60)


def _generations(url: str) -> set[str]:
    return {p.name for p in Path(url).with_suffix("").iterdir() if GENERATION.fullmatch(p.name)}


def _new_generation(url: str, before: set[str], fragments: int) -> set[str] | None:
    """The one generation not in ``before``, once it holds ``fragments`` fragments."""
    new = _generations(url) - before
    if len(new) == 1 and len(list((Path(url).with_suffix("") / next(iter(new))).glob("*.nc"))) == fragments:
        return new
    return None


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _dead_lease(url: str, generation: str) -> None:
    """The lease a writer killed on this host left, naming ``generation`` (as a hostile tool may write it)."""
    record = {"owner": "dead", "host": socket.gethostname(), "pid": _dead_pid(), "generation": generation,
              "expires": time.time() + 600, "seconds": 600.0}
    Path(lease_uri(url)).write_text(json.dumps(record))


def _take_over(url: str) -> None:
    """A writer that takes the stale lease over and gives it back without committing (``aggregate`` failing,
    say): what it recorded stays for the next commit."""
    Lease.new(url, register(None, protocol="file"), "g-" + "f" * 16).acquire().release()


def _update(url: str, value: float, **options) -> np.ndarray:
    """The successor: ``Dataset(url, "a")`` sets step 0 and commits; the values expected after."""
    expected = read(url) if not options else None
    with Dataset(url, "a", **options) as ds:
        ds["tas"][0] = np.full(SHAPE[1:], value, "f4")
    if expected is not None:
        expected[0] = value
    return expected


@pytest.fixture
def short_lease():
    """Leases of 2 s: a writer taken over alive has its generation deleted a lease's time later."""
    with dask.config.set({"daskcfa.write.lease-seconds": 2}):
        yield


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_ino, p.lstat().st_mtime_ns) for p in sorted(directory.rglob("*"))}


def test_a_killed_dataset_writer_s_fragments_are_removed_by_its_successor_on_s3(s3_server):
    """The session 16 case on the real S3 server: the dead writer's six objects (a whole copy) are deleted by
    the successor's commit, and the parts of an upload it left incomplete aborted; the bucket holds only what
    the kept versions reference (and bookkeeping)."""
    bucket, client = s3_server.new_bucket(), s3_server.client()
    options = s3_server.storage_options
    url = f"s3://{bucket}/t.nc"
    write(url, values(1), storage_options=options)

    def fragments() -> set[str]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix="t/").get("Contents", [])
        keys = [o["Key"] for o in listed]
        return {f"s3://{bucket}/{k}" for k in keys if k.endswith(".nc") and "/.daskcfa/" not in k}

    before = fragments()
    proc = _child(DATASET_WRITER, url, json.dumps(options))
    _kill_after(proc, "assigned", lambda: len(fragments() - before) == 6)
    (dead,) = {u.split("/")[-2] for u in fragments() - before}
    client.put_object(Bucket=bucket, Key=f"t/{dead}x/keep.bin", Body=b"beside it, not in it")
    for key in (f"t/{dead}/t.tas.9.nc", f"t/{dead}x/other.nc"):  # (a large fragment's upload cut short)
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)
        client.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"p" * (5 << 20))

    def uploads(prefix: str) -> list[str]:
        return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])]

    assert uploads(f"t/{dead}/") == [f"t/{dead}/t.tas.9.nc"]
    manager().close_all()
    assert np.array_equal(np.ma.getdata(daskcfa.from_cfa(url, storage_options=options).compute()), values(1))
    _update(url, 7.0, storage_options=options)
    expected = values(1)
    expected[0] = 7.0
    manager().close_all()
    assert np.array_equal(np.ma.getdata(daskcfa.from_cfa(url, storage_options=options).compute()), expected)
    referenced = kept_fragments(url, open_aggregation(url, options)[1].profile)
    assert fragments() == referenced, sorted(fragments() - referenced)[:3]
    record = json.loads(client.get_object(Bucket=bucket, Key="t/.daskcfa/abandoned.json")["Body"].read())
    assert record["abandoned"] == [] and len(record["owners"]) == 1  # (the dead writer's: never to commit)
    assert client.get_object(Bucket=bucket, Key=f"t/{dead}x/keep.bin")["Body"].read() == b"beside it, not in it"
    # the parts of its cut-short upload, which no listing of objects shows, aborted with it; the one beside kept
    assert uploads(f"t/{dead}/") == [] and uploads(f"t/{dead}x/") == [f"t/{dead}x/other.nc"]


@pytest.mark.usefixtures("short_lease")
def test_a_paused_writer_whose_generation_was_retired_cannot_commit(tmp_path):
    """A writer paused (alive) until its lease expired: the successor takes the lease over and commits;
    the paused writer, resumed, is refused at its commit (its lease check), so no aggregation ever
    references a deleted fragment; the first commit a lease's time after the takeover deletes its
    generation (attack18: not the successor's, as the writer might be past its last check)."""
    url = str(tmp_path / "t.nc")
    write(url, values(1))
    before = _generations(url)
    paused = Dataset(url, "a", buffer_size=1)
    for t in range(SHAPE[0]):
        paused["tas"][t] = np.full(SHAPE[1:], 5.0, "f4")
    (mine,) = wait_for(lambda: _new_generation(url, before, 6), what="the paused writer's 6 fragments")
    time.sleep(0.5)
    record = json.loads(Path(lease_uri(url)).read_text())
    Path(lease_uri(url)).write_text(json.dumps({**record, "expires": time.time() - 1}))  # (its lease ran out)
    expected = _update(url, 7.0)
    with pytest.raises(WriteConflictError, match="lost its lease"):
        paused.close()
    assert np.array_equal(read(url), expected)
    time.sleep(2.5)  # (a lease's time since the takeover)
    expected = _update(url, 8.0)
    assert mine not in _generations(url)  # (before lease18: its 6 fragments stayed)
    assert np.array_equal(read(url), expected)
    assert_tidy(url)


def test_a_dataset_writer_abandoned_by_an_exception_leaves_its_generation_to_the_next_commit(tmp_path):
    """``Dataset(url, "a")`` whose ``with`` block raises after its fragments were written: the write is
    abandoned (the dataset unchanged), and, as a Dataset write never resumes, its generation is recorded
    for the next commit, which deletes it."""
    url = str(tmp_path / "t.nc")
    write(url, values(1))
    before = _generations(url)
    with pytest.raises(KeyboardInterrupt):
        with Dataset(url, "a", buffer_size=1) as ds:
            for t in range(SHAPE[0]):
                ds["tas"][t] = np.full(SHAPE[1:], 5.0, "f4")
            wait_for(lambda: _new_generation(url, before, 6), what="the writer's 6 fragments")
            raise KeyboardInterrupt
    (mine,) = _generations(url) - before
    assert np.array_equal(read(url), values(1))
    expected = _update(url, 7.0)
    assert mine not in _generations(url)  # (before lease18: its 6 fragments stayed)
    assert np.array_equal(read(url), expected)
    assert_tidy(url)


@pytest.mark.usefixtures("short_lease")
def test_a_writer_whose_lease_was_taken_over_cannot_take_it_again_and_commit(tmp_path):
    """A write whose first task is recomputed (a distributed worker lost) takes the lease again once its
    successor has committed and given it back: the successor deleted what the write stored, so the
    write's check at commit refuses, though the lease is its own again."""
    url = str(tmp_path / "t.nc")
    write(url, values(1))
    profile = open_aggregation(url)[1].profile
    generation = "g-" + "a" * 16
    first = Lease.new(url, profile, generation).acquire()
    stored = Path(url).with_suffix("") / generation
    stored.mkdir()
    (stored / "t.tas.0.0.0.nc").write_bytes(b"what the first writer stored")
    record = json.loads(Path(lease_uri(url)).read_text())
    Path(lease_uri(url)).write_text(json.dumps({**record, "expires": time.time() - 1}))  # (its lease ran out)
    _update(url, 7.0)  # the successor: takes the lease over, commits
    time.sleep(2.5)  # (a lease's time since the takeover: attack18)
    expected = _update(url, 8.0)  # the next commit deletes the generation
    assert not stored.exists()
    first.acquire()  # (the lease was given back: the recomputed first task gets it)
    with pytest.raises(WriteConflictError, match="taken over by another writer"):
        first.confirm(force=True)  # the commit's check (before lease18: it passed)
    first.release()
    assert np.array_equal(read(url), expected)
    assert_tidy(url)


def _two_versions(url: str) -> tuple[str, dict[str, tuple[int, int]]]:
    """A dataset of two versions; the older one's generation (kept: ``keep-versions`` is 5) and its files."""
    write(url, values(2))
    (older,) = _generations(url)
    write(url, values(1))
    return older, _snapshot(Path(url).with_suffix("") / older)


def _abandoned_copy(url: str, generation: str) -> Path:
    """What a killed writer leaves: a whole copy of a generation, under another generation name."""
    stem = Path(url).with_suffix("")
    dead = stem / ("g-" + "d" * 16)
    shutil.copytree(stem / generation, dead)
    return dead


def test_a_lease_record_naming_a_kept_version_s_generation_deletes_nothing_of_it(tmp_path):
    """A lease record (hostile, or buggy) naming the generation of a version still kept: the successor's
    commit deletes nothing of it, and the old version still reads; a real dead writer's generation,
    recorded by the same kind of takeover, is deleted."""
    url = str(tmp_path / "t.nc")
    older, files = _two_versions(url)
    dead = _abandoned_copy(url, older)
    _dead_lease(url, dead.name)
    _take_over(url)
    _dead_lease(url, older)
    expected = _update(url, 7.0)
    assert np.array_equal(read(url), expected)
    assert _snapshot(Path(url).with_suffix("") / older) == files
    oldest = daskcfa.history(url)[-1].id
    assert np.array_equal(np.ma.getdata(daskcfa.from_cfa(url, version=oldest).compute()), values(2))
    assert not dead.exists()  # (before lease18: it stayed)
    assert json.loads((Path(url).with_suffix("") / ".daskcfa" / "abandoned.json").read_text())["abandoned"] == []
    assert_tidy(url)


def test_nothing_is_deleted_while_a_kept_version_cannot_be_read(tmp_path):
    """A kept version whose copy cannot be read now (moved away, a disk not mounted): what it references is
    unknown, so a lease record naming its generation deletes nothing of it -- and the version reads again
    once its copy is back. A dead writer's generation recorded then waits for a commit that can read
    every kept version."""
    url = str(tmp_path / "t.nc")
    older, files = _two_versions(url)
    oldest = daskcfa.history(url)[-1].id
    copy = Path(url).with_suffix("") / ".daskcfa" / "versions" / f"{oldest}.aggregation"
    away = tmp_path / "away"
    copy.rename(away)
    dead = _abandoned_copy(url, older)
    _dead_lease(url, older)
    _take_over(url)
    _dead_lease(url, dead.name)
    with pytest.warns(daskcfa.CFAWarning, match="cannot be read"):
        _update(url, 7.0)
    assert _snapshot(Path(url).with_suffix("") / older) == files and dead.exists()
    away.rename(copy)
    assert np.array_equal(np.ma.getdata(daskcfa.from_cfa(url, version=oldest).compute()), values(2))
    _update(url, 8.0)
    assert _snapshot(Path(url).with_suffix("") / older) == files
    assert not dead.exists()  # (before lease18: it stayed)
    assert_tidy(url)


OUTSIDE = ["a-link-as-the-generation", "links-inside-the-generation", "a-name-outside-the-stem",
           "a-planted-record"]


@pytest.mark.parametrize("hostile", OUTSIDE)
def test_nothing_outside_the_dataset_s_generations_or_through_a_link_is_deleted(tmp_path, hostile):
    """A lease record (or the record of abandoned generations) naming a generation that is a link to a
    directory elsewhere, one holding links out, or names that lead out of ``<stem>/``: what lies outside
    is untouched (the links themselves at most removed); a real dead writer's generation, recorded
    beside, is deleted."""
    url = str(tmp_path / "data" / "t.nc")
    os.makedirs(os.path.dirname(url))
    write(url, values(1))
    stem = Path(url).with_suffix("")
    (current,) = _generations(url)
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    for name in ("keep.nc", "deep/keep.nc"):
        (outside / name).write_bytes(b"not yours")
    before = _snapshot(outside)
    dead = _abandoned_copy(url, current)
    _dead_lease(url, dead.name)
    _take_over(url)
    hostile_generation = "g-" + "1" * 16
    if hostile == "a-link-as-the-generation":
        (stem / hostile_generation).symlink_to(outside, target_is_directory=True)
        _dead_lease(url, hostile_generation)
    elif hostile == "links-inside-the-generation":
        inside = stem / hostile_generation
        inside.mkdir()
        (inside / "t.tas.0.0.0.nc").symlink_to(outside / "keep.nc")
        (inside / "deep").symlink_to(outside / "deep", target_is_directory=True)
        _dead_lease(url, hostile_generation)
    elif hostile == "a-name-outside-the-stem":
        _dead_lease(url, "../../outside")
    else:
        record = stem / ".daskcfa" / "abandoned.json"
        listed = json.loads(record.read_text())["abandoned"]
        record.write_text(json.dumps({"abandoned": [*listed, "../../outside", str(outside), "g-1111/../../..",
                                                    "g-" + "1" * 16 + "/../../..", 7, None]}))
    expected = _update(url, 7.0)
    assert np.array_equal(read(url), expected)
    assert _snapshot(outside) == before
    assert not dead.exists()  # (before lease18: it stayed)
    if hostile == "a-link-as-the-generation":
        assert (stem / hostile_generation).is_symlink()  # (left alone: never followed)
    assert_tidy(url)


def test_a_killed_to_cfa_resumes_when_re_run_unless_another_write_committed_meanwhile(tmp_path):
    """The rule for ``to_cfa``, whose generation is named after its fragments' resume tokens: a re-run of the
    same write takes the dead run's lease over as its own generation and resumes (its fragments are not
    rewritten, nothing is deleted); but once another writer has taken the lease over and committed,
    the dead run's generation is gone, and a re-run of it rewrites its fragments: right values, never a
    lost one."""
    url = str(tmp_path / "t.nc")
    write(url, values(1))
    stem = Path(url).with_suffix("")
    before = _generations(url)
    _kill_after(_child(TO_CFA_WRITER, url, "3"), "fragments written")
    (first,) = _generations(url) - before
    stored = _snapshot(stem / first)
    assert len([p for p in stored if p.endswith(".nc")]) == 6 and np.array_equal(read(url), values(1))
    write(url, np.full(SHAPE, 3.0, "f4"))  # the same write again: it resumes
    assert _snapshot(stem / first) == stored  # (not one fragment rewritten)
    assert np.array_equal(read(url), np.full(SHAPE, 3.0, "f4"))
    assert_tidy(url)

    before = _generations(url)
    _kill_after(_child(TO_CFA_WRITER, url, "4"), "fragments written")
    (second,) = _generations(url) - before
    expected = _update(url, 7.0)  # another writer takes the lease over and commits
    assert second not in _generations(url)  # (before lease18: it stayed)
    assert np.array_equal(read(url), expected)
    assert_tidy(url)
    write(url, np.full(SHAPE, 4.0, "f4"))  # the killed write again: rewritten
    assert np.array_equal(read(url), np.full(SHAPE, 4.0, "f4"))
    assert second in _generations(url)
    assert_tidy(url)
