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
from daskcfa.storage.lease import lease_uri

from .test_abandoned_generations import _generations, _new_generation, _update
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


def _pause_inside_the_commit(url: str, monkeypatch) -> None:
    write(url, values(1))
    before = _generations(url)
    paused = Dataset(url, "a", buffer_size=1)
    for t in range(SHAPE[0]):
        paused["tas"][t] = np.full(SHAPE[1:], 5.0, "f4")
    (mine,) = _wait(lambda: _new_generation(url, before, 6))
    record = history.record
    state = {"paused": False}

    def pause_then_record(*args, **kwargs):
        if not state["paused"]:  # the paused writer's commit, past its check: the successor runs meanwhile
            state["paused"] = True
            _expire_lease(url)
            state["expected"] = _update(url, 7.0)
        return record(*args, **kwargs)

    monkeypatch.setattr(history, "record", pause_then_record)
    with pytest.raises(WriteConflictError, match="lost its lease"):
        paused.close()
    monkeypatch.undo()
    assert state["paused"]
    np.testing.assert_array_equal(read(url), state["expected"])  # (main: a missing fragment)
    time.sleep(2.5)  # (a lease's time after the takeover: the paused writer can publish nothing more)
    expected = _update(url, 8.0)
    assert mine not in _generations(url)
    np.testing.assert_array_equal(read(url), expected)
    assert_tidy(url)


def _wait(found, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = found()
        if value:
            time.sleep(0.5)
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")
