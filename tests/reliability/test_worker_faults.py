"""A distributed worker is killed (SIGKILL) in the middle of a read and of a write.

Real ``LocalCluster`` with nannies: the nanny restarts the killed worker and
the scheduler recomputes what was lost. The kill lands while tasks run: every
block waits at a *gate* (a flag file) until the test has killed a worker, and
the test waits (polling, generous timeouts, no sleeps) until work is really
in progress before killing.

Then: the results equal the ground truth, and the target directory holds
exactly the referenced fragments, their markers and the manifest -- no
duplicate, no orphan, no temporary file. A writer process killed while
netCDF-C is writing a fragment leaves a temporary file; the next run of the
same ``to_cfa`` removes it when it commits.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, build_cf113, generation_dir

from .conftest import truth, wait_for

SHAPE = (16, 8, 10)
FRAGMENTS = 16


def gate(block, flag: str, block_info=None):
    """Wait (in the worker) until ``flag`` exists; all but the last block pass at once.

    One gated block holds one of its worker's two threads: the other thread
    still runs what the scheduler pins to that worker (a write task goes where
    its block is), so the rest of the graph always makes progress.
    """
    import os
    import time

    if block_info[0]["chunk-location"][0] == FRAGMENTS - 1:
        deadline = time.monotonic() + 300
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.01)
    return block


def _gates_done(dask_scheduler=None) -> int:
    return sum(1 for ts in dask_scheduler.tasks.values() if "gate" in str(ts.key) and ts.state == "memory")


def _waiting_at_gate(dask_scheduler=None) -> dict[str, int]:
    """Gate tasks running, per worker address."""
    running: dict[str, int] = {}
    for ws in dask_scheduler.workers.values():
        running[ws.address] = sum(1 for ts in ws.processing if "gate" in str(ts.key))
    return running


@pytest.fixture
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                      host="127.0.0.1", silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        yield client


def _kill_a_busy_worker(client) -> int:
    """SIGKILL a worker holding gate tasks (not its nanny); returns its pid once the nanny replaced it."""
    busy = wait_for(lambda: [a for a, n in client.run_on_scheduler(_waiting_at_gate).items() if n], what="gate tasks")
    address = busy[0]
    victim = client.run(os.getpid, workers=[address])[address]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(workers := client.scheduler_info()["workers"]) == 2 and address not in workers,
             what="the nanny to restart the worker")
    return victim


def test_worker_killed_during_a_read(tmp_path, cluster):
    client = cluster
    expected = truth(SHAPE, seed=31)
    built = build_cf113(tmp_path / "ds", expected, ("time", "lat", "lon"), ((1,) * FRAGMENTS, (8,), (10,)))
    flag = tmp_path / "release"
    x = daskcfa.from_cfa(str(built.path), "tas")
    gated = x.map_blocks(gate, str(flag), dtype=x.dtype, meta=x._meta, name="gate")
    future = client.compute(gated)
    # wait until all but the gated block have been read (results held in the workers' memory)
    wait_for(lambda: client.run_on_scheduler(_gates_done) >= FRAGMENTS - 1, what="reads")
    victim = _kill_a_busy_worker(client)
    flag.touch()
    got = future.result(timeout=300)
    assert_matches(got, expected)
    assert victim not in client.run(os.getpid).values()  # the nanny's new worker took over


def _listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_worker_killed_during_a_write(tmp_path, cluster):
    client = cluster
    expected = truth(SHAPE, seed=37)
    flag = tmp_path / "release"
    data = da.from_array(expected, chunks=(1, 8, 10)).map_blocks(gate, str(flag), dtype=expected.dtype,
                                                                  meta=np.ma.MaskedArray(np.empty((0, 0, 0), "f4")),
                                                                  name="gate")
    target = tmp_path / "out" / "tas.nca"
    delayed = daskcfa.to_cfa(data, str(target), variable="tas", dims=("time", "lat", "lon"), attrs={"units": "K"},
                             fragment_shape=(1, 8, 10), compute=False)
    future = client.compute(delayed)
    markers = tmp_path / "out" / "tas"
    wait_for(lambda: len(list(markers.glob("g-*/.daskcfa/*.json"))) >= FRAGMENTS - 1, what="fragments")
    _kill_a_busy_worker(client)
    assert not target.exists()
    flag.touch()
    assert future.result(timeout=300) == str(target)

    assert_matches(daskcfa.from_cfa(str(target)).compute(scheduler="sync"), expected)
    gen = generation_dir(tmp_path / "out" / "tas").name
    fragments = [f"tas/{gen}/tas.tas.{i}.0.0.nc" for i in range(FRAGMENTS)]
    marker_files = [f"tas/{gen}/.daskcfa/tas.tas.{i}.0.0.nc.json" for i in range(FRAGMENTS)]
    assert _listing(tmp_path / "out") == sorted(["tas.nca", "tas/.daskcfa/manifest.json", *fragments, *marker_files])


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    import dask
    import daskcfa
    rng = np.random.default_rng(5)
    x = rng.random((4, 1000, 2000)).astype("f4")  # 4 fragments of 8 MB, slow to compress at level 9
    with dask.config.set(scheduler="synchronous"):
        daskcfa.to_cfa(x, sys.argv[1], variable="tas", dims=("time", "lat", "lon"), fragment_shape=(1, 1000, 2000),
                       compression={"zlib": True, "complevel": 9, "shuffle": False})
""")


def test_writer_killed_mid_fragment_leaves_nothing_after_the_rerun(tmp_path):
    """SIGKILL a writing process while netCDF-C writes a fragment: its temporary file is left
    behind; re-running the same to_cfa resumes, and its commit removes that orphan."""
    target = tmp_path / "out" / "tas.nca"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(target)])
    try:
        wait_for(lambda: proc.poll() is not None or (
            len(list((tmp_path / "out" / "tas").glob("g-*/.daskcfa/*.json"))) >= 1 and
            list((tmp_path / "out" / "tas").glob("g-*/.*.part"))),
            timeout=300, what="a fragment written and the next one being written")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL, "the writer finished before it could be killed"
    fragment_dir = generation_dir(tmp_path / "out" / "tas")
    orphans = list(fragment_dir.glob(".*.part"))
    done = list((fragment_dir / ".daskcfa").glob("*.json"))
    assert (tmp_path / "out" / ".tas.nca.lease").exists()  # the killed writer's lease: stale, taken over below
    assert orphans and not target.exists()
    stamps = {p.name: p.stat().st_mtime_ns for p in fragment_dir.glob("*.nc")}

    rng = np.random.default_rng(5)
    x = rng.random((4, 1000, 2000)).astype("f4")
    daskcfa.to_cfa(x, str(target), variable="tas", dims=("time", "lat", "lon"), fragment_shape=(1, 1000, 2000),
                   compression={"zlib": True, "complevel": 9, "shuffle": False})  # the same call
    assert not list(fragment_dir.glob(".*.part")), "the killed writer's temporary file is still there"
    assert not (tmp_path / "out" / ".tas.nca.lease").exists()
    after = {p.name: p.stat().st_mtime_ns for p in fragment_dir.glob("*.nc")}
    kept = [name for name in stamps if after.get(name) == stamps[name]]
    assert len(kept) >= len(done) >= 1  # finished fragments were not rewritten
    assert len(after) == 4
    np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(str(target)).compute()), x)
