"""Session 18's doors attacked (attack18): abandoned generations, HTTP ranges, attribute spellings
(docs/reliability.md, "Session 18's doors attacked (attack18)").

Real parts only: real netCDF files on local disk, the standard library's HTTP server. Each test failed
on main (81e4dc6) as its docstring says.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa import WriteConflictError
from daskcfa.netcdf4 import Dataset
from daskcfa.storage import history
from daskcfa.fragments.manager import manager
from daskcfa.storage.access import open_aggregation
from daskcfa.storage.lease import GENERATION, lease_uri
from daskcfa.write.commit import kept_fragments

from .test_abandoned_generations import _update
from .test_session16_write_attacks import SHAPE, assert_tidy, read, values, write


def _expire_lease(url: str) -> None:
    """The lease's holder paused (alive) past its lease: its record has expired."""
    record = json.loads(Path(lease_uri(url)).read_text())
    Path(lease_uri(url)).write_text(json.dumps({**record, "expires": time.time() - 1}))


def test_a_writer_paused_inside_its_commit_never_publishes_a_deleted_generation(tmp_path, monkeypatch):
    """A writer paused after its commit's lease check (a GC pause, a stopped VM, a slow version record)
    until its lease ran out: the successor takes the lease over, commits and deletes the paused writer's
    generation. The paused writer, resumed, must not then put an aggregation referencing that deleted
    generation (on main it did: every read of the dataset then failed on a missing fragment). Now it is
    refused at its put, and its generation (its process alive when taken over) is deleted by the first
    commit a lease's time after the takeover."""
    with dask.config.set({"daskcfa.write.lease-seconds": 2}):
        _pause_inside_the_commit(str(tmp_path / "t.nc"), monkeypatch)


def test_a_writer_paused_inside_its_commit_never_publishes_a_deleted_generation_on_s3(s3_server, monkeypatch):
    """The same on the real S3 server (on main: the aggregation referenced six deleted objects)."""
    bucket = s3_server.new_bucket()
    with dask.config.set({"daskcfa.write.lease-seconds": 2}):
        _pause_inside_the_commit(f"s3://{bucket}/t.nc", monkeypatch, s3_server)


def _pause_inside_the_commit(url: str, monkeypatch, s3_server=None) -> None:
    options = {} if s3_server is None else {"storage_options": s3_server.storage_options}
    write(url, values(1), **options)
    where = _Where(url, s3_server)
    paused, mine = _writer_with_its_fragments_written(url, where, **options)
    record = history.record
    state = {"paused": False}

    def pause_then_record(*args, **kwargs):
        if not state["paused"]:  # the paused writer's commit, past its check: the successor runs meanwhile
            state["paused"] = True
            where.expire_lease()
            state["expected"] = _update(url, 7.0, **options) if options else _update(url, 7.0)
        return record(*args, **kwargs)

    monkeypatch.setattr(history, "record", pause_then_record)
    with pytest.raises(WriteConflictError, match="lost its lease"):
        paused.close()
    monkeypatch.undo()
    assert state["paused"]
    if s3_server is None:
        np.testing.assert_array_equal(read(url), state["expected"])  # (main: a missing fragment)
    else:
        manager().close_all()
        expected = values(1)
        expected[0] = 7.0  # (the successor's)
        np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(url, **options).compute()), expected)
    time.sleep(2.5)  # (a lease's time after the takeover: the paused writer can publish nothing more)
    if s3_server is None:
        expected = _update(url, 8.0)
        assert mine not in where.generations()
        np.testing.assert_array_equal(read(url), expected)
        assert_tidy(url)
    else:
        _update(url, 8.0, **options)
        assert mine not in where.generations()
        manager().close_all()
        expected = values(1)
        expected[0] = 8.0
        np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(url, **options).compute()), expected)


class _Where:
    """A dataset's generations and lease, on local disk or the S3 test server."""

    def __init__(self, url: str, s3_server) -> None:
        self.url, self.s3 = url, s3_server
        if s3_server is not None:
            self.client, self.bucket = s3_server.client(), url.split("/")[2]

    def _fragments(self) -> list[str]:
        if self.s3 is None:
            return [str(p.relative_to(Path(self.url).with_suffix(""))) for p in Path(self.url).with_suffix("").rglob("*.nc")]
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix="t/").get("Contents", [])
        return [o["Key"][2:] for o in listed if o["Key"].endswith(".nc")]

    def generations(self) -> set[str]:
        return {f.split("/")[0] for f in self._fragments() if GENERATION.fullmatch(f.split("/")[0])}

    def new_generation(self, before: set[str], fragments: int) -> set[str] | None:
        new = self.generations() - before
        if len(new) == 1 and sum(f.startswith(next(iter(new)) + "/") and "/.daskcfa/" not in f
                                 for f in self._fragments()) == fragments:
            return new
        return None

    def expire_lease(self) -> None:
        """The lease's holder paused (alive) past its lease: its record has expired."""
        if self.s3 is None:
            return _expire_lease(self.url)
        key = lease_uri(self.url).split("/", 3)[3]
        record = json.loads(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        self.client.put_object(Bucket=self.bucket, Key=key, Body=json.dumps({**record, "expires": time.time() - 1}))


def _writer_with_its_fragments_written(url: str, where: _Where, **options):
    """A ``Dataset(url, "a")`` that assigned every step (each fragment written at once) and is not closed,
    with the generation it wrote into."""
    before = where.generations()
    writer = Dataset(url, "a", buffer_size=1, **options)
    for t in range(SHAPE[0]):
        writer["tas"][t] = np.full(SHAPE[1:], 5.0, "f4")
    (generation,) = _wait(lambda: where.new_generation(before, 6))
    return writer, generation


def _wait(found, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = found()
        if value:
            time.sleep(0.5)
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_writer_paused_at_its_put_keeps_its_generation_for_a_lease_s_time(tmp_path, monkeypatch):
    """Paused after the last lease check, right before the put itself (no check can be later): the
    successor, which took the lease over from a live process, must not delete that generation at its
    commit, as the paused writer's put may still come (on main it was deleted, and the put that came
    made every read fail on a missing fragment). It waits a lease's time: the put lands on an
    aggregation whose fragments are all there, and later commits keep what it references."""
    import daskcfa.storage.publish as publish

    url = str(tmp_path / "t.nc")
    with dask.config.set({"daskcfa.write.lease-seconds": 2}):
        write(url, values(1))
        where = _Where(url, None)
        paused, mine = _writer_with_its_fragments_written(url, where)
        refuse_existing = publish.refuse_existing
        state = {"paused": False}

        def pause_then_put(*args, **kwargs):
            if not state["paused"]:  # past the paused writer's last look at its lease
                state["paused"] = True
                where.expire_lease()
                _update(url, 7.0)
            return refuse_existing(*args, **kwargs)

        monkeypatch.setattr(publish, "refuse_existing", pause_then_put)
        paused.close()  # (its put came: nothing could stop it)
        monkeypatch.undo()
        assert state["paused"] and mine in where.generations()
        expected = np.full(SHAPE, 5.0, "f4")
        np.testing.assert_array_equal(read(url), expected)  # (main: a missing fragment)
        time.sleep(2.5)
        expected[0] = 8.0
        np.testing.assert_array_equal(_update(url, 8.0), expected)
        np.testing.assert_array_equal(read(url), expected)
        _nothing_missing(url)


def _nothing_missing(url: str) -> None:
    """Every fragment a kept version references is stored (a writer that put its aggregation over its
    successor's commit may leave fragments no kept version references: space, never data)."""
    referenced = kept_fragments(url, open_aggregation(url)[1].profile)
    assert referenced and all(Path(u).is_file() for u in referenced)
    assert not Path(lease_uri(url)).exists()


def test_a_to_cfa_re_run_after_its_generation_was_recorded_abandoned_resumes_it(tmp_path):
    """A killed ``to_cfa``; a writer takes its lease over (its generation recorded, due at once: the process
    is gone) and fails without committing; the same ``to_cfa`` re-run resumes the generation (no fragment
    rewritten) and its commit keeps it: right values, nothing missing, the record emptied. (Passed on main:
    an attack that found no hole.)"""
    from .test_abandoned_generations import TO_CFA_WRITER, _child, _kill_after, _snapshot, _take_over

    url = str(tmp_path / "t.nc")
    write(url, values(1))
    before = _Where(url, None).generations()
    _kill_after(_child(TO_CFA_WRITER, url, "3"), "fragments written")
    (dead,) = _Where(url, None).generations() - before
    stored = _snapshot(Path(url).with_suffix("") / dead)
    _take_over(url)
    record = Path(url).with_suffix("") / ".daskcfa" / "abandoned.json"
    assert json.loads(record.read_text())["abandoned"] == [dead]
    write(url, np.full(SHAPE, 3.0, "f4"))
    assert _snapshot(Path(url).with_suffix("") / dead) == stored
    np.testing.assert_array_equal(read(url), np.full(SHAPE, 3.0, "f4"))
    assert json.loads(record.read_text())["abandoned"] == []
    assert_tidy(url)
