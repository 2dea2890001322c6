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

import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest

import daskcfa
from daskcfa.fragments.manager import manager
from daskcfa.storage.access import open_aggregation
from daskcfa.write.commit import kept_fragments
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
    assert len(daskcfa.history(str(target))) == 1  # (the one commit: a version, its objects under versions/)
    listing = [p for p in _listing(tmp_path / "out") if not p.startswith("tas/.daskcfa/versions/")]
    assert listing == sorted(["tas.nca", "tas/.daskcfa/manifest.json", *fragments, *marker_files])


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


# ---------------------------------------------------------------------------
# Kill trials and racing writers (issue 14): a writer process SIGKILLed at a
# random moment of its write, two writers started together, a reader looping
# while a dataset is overwritten. The target must always read exactly the old
# data, exactly the new data, or (``w-``) not exist -- never a mix.
# ---------------------------------------------------------------------------
TRIAL_SHAPE = (12, 60, 80)  # 12 fragments of 19 kB
TRIAL_WRITER = textwrap.dedent("""
    import json, os, sys, time
    import dask
    import numpy as np
    import daskcfa
    url, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    options = json.loads(os.environ.get("TRIAL_STORAGE_OPTIONS") or "null")
    x = np.random.default_rng(seed).random(%r).astype("f4") + seed
    kw = json.loads(sys.argv[4] if len(sys.argv) > 4 else "{}")
    if "time_region" in kw:  # mode r+: only these time steps
        a, b = kw.pop("time_region")
        x, kw["region"] = x[a:b], {"time": slice(a, b)}
    print("start", flush=True)
    t0 = time.perf_counter()
    try:
        with dask.config.set(scheduler="synchronous"):
            daskcfa.to_cfa(x, url, variable="tas", dims=("time", "lat", "lon"), fragment_shape=(1, 60, 80),
                           mode=mode, storage_options=options, **kw)
    except daskcfa.CFAError as exc:
        print("conflict" if isinstance(exc, daskcfa.WriteConflictError) else "cfaerror", type(exc).__name__, exc,
              flush=True)
        sys.exit(3)
    except FileExistsError as exc:
        print("exists", exc, flush=True)
        sys.exit(4)
    print("done", time.perf_counter() - t0, flush=True)
""" % (TRIAL_SHAPE,))


def trial_data(seed: int) -> np.ndarray:
    """The values a trial writer writes (distinct everywhere for distinct seeds)."""
    return np.random.default_rng(seed).random(TRIAL_SHAPE).astype("f4") + seed


def write_trial(url: str, seed: int, mode: str, options=None, **kw) -> str:
    """The trial writers' call, in this process."""
    return daskcfa.to_cfa(trial_data(seed), url, variable="tas", dims=("time", "lat", "lon"),
                          fragment_shape=(1, 60, 80), mode=mode, storage_options=options, **kw)


class Trials:
    """Writer processes for one storage: spawn, classify what a target reads, check it is tidy."""

    def __init__(self, tmp_path: Path, base: str, options: dict | None, fs=None) -> None:
        self.script = tmp_path / "trial_writer.py"
        self.script.write_text(TRIAL_WRITER)
        self.base, self.options, self.fs = base, options, fs
        self.name = "local" if fs is None else "S3"
        # (the writers import this daskcfa, not whichever the interpreter would find from the script's directory)
        source = str(Path(daskcfa.__file__).parents[1])
        self.env = {**os.environ, "TRIAL_STORAGE_OPTIONS": json.dumps(options),
                    "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)}

    def url(self, name: str) -> str:
        return f"{self.base}/{name}/t.nca"

    def spawn(self, url: str, mode: str, seed: int, **kw) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(self.script), url, mode, str(seed), json.dumps(kw)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)

    def read(self, url: str) -> np.ndarray | None:
        try:
            return np.ma.getdata(daskcfa.from_cfa(url, storage_options=self.options).compute(scheduler="sync"))
        except daskcfa.NotFoundError as exc:
            if exc.file is not None and exc.file.endswith("t.nca"):
                return None  # no aggregation file
            raise

    def outcome(self, url: str, old: int | None, new: int) -> str:
        got = self.read(url)
        if got is None:
            return "absent"
        for name, seed in (("old", old), ("new", new)):
            if seed is not None and np.array_equal(got, trial_data(seed)):
                return name
        mixed = sorted({int(v) for v in np.unique(np.floor(got))})
        raise AssertionError(f"{url} reads neither the old nor the new data (integer parts {mixed}): MIXED")

    def versions(self, url: str) -> list:
        try:
            return daskcfa.history(url, storage_options=self.options)
        except daskcfa.NotFoundError:
            return []

    def assert_history(self, url: str, before: list, outcome: str, old: int | None, new: int) -> None:
        """A killed write is a version only if its switch happened (the target reads its data): no
        half version; and every version kept reads back whole, old or new data (none of its
        fragments was deleted)."""
        after = self.versions(url)
        if outcome == "new":
            assert after[0].operation == "to_cfa" and after[0].parent == (before[0].id if before else None)
            assert [v.id for v in after[1:]] == [v.id for v in before][:len(after) - 1]
        else:
            assert after == before
        for version in after:
            got = np.ma.getdata(daskcfa.from_cfa(url, storage_options=self.options, version=version.id)
                                .compute(scheduler="sync"))
            assert any(seed is not None and np.array_equal(got, trial_data(seed)) for seed in (old, new)), version

    def files(self, url: str) -> list[str]:
        """Every object under the target's directory, as absolute URIs."""
        directory = url.rsplit("/", 1)[0]
        if self.fs is None:
            return sorted(str(p) for p in Path(directory).rglob("*") if p.is_file())
        return sorted(f"s3://{p}" for p in self.fs.find(directory.removeprefix("s3://")))

    def assert_tidy(self, url: str, stale_lease: bool = False) -> None:
        """Exactly the referenced fragments (and their markers, the manifest), no temporary, and no
        lease (but ``stale_lease``: a writer killed after its commit, never re-run, leaves its lease)."""
        profile = open_aggregation(url, self.options)[1].profile
        referenced = kept_fragments(url, profile)  # (the current version's, and those of the versions kept)
        av = daskcfa.read_aggregation(url, "tas", storage_options=self.options)
        assert {daskcfa.storage.resolve(u, url) for u in av.fragments.locations()} <= referenced
        fragments = {f for f in self.files(url) if f.endswith(".nc")}
        assert fragments == referenced, f"unreferenced: {sorted(fragments - referenced)[:4]}"
        leftovers = [f for f in self.files(url) if (f.endswith(".lease") and not stale_lease) or f.endswith(".part")]
        assert not leftovers, leftovers


def _first_line(proc: subprocess.Popen, timeout: float = 180) -> str:
    line = wait_for(lambda: proc.stdout.readline() or proc.poll() is not None, timeout=timeout, what="the writer")
    return line if isinstance(line, str) else ""


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out + err


@pytest.fixture(params=["local", "s3"])
def trials(request, tmp_path):
    if request.param == "local":
        return Trials(tmp_path, str(tmp_path / "targets"), None)
    server = request.getfixturevalue("s3_server")
    return Trials(tmp_path, f"s3://{server.new_bucket()}", server.storage_options, server.filesystem())


def _writer_child(url: str, mode: str, seed: int, options, started) -> None:
    """A kill-trial writer: a child forked from this process (no interpreter start-up, so
    the trial's clock is the write's), writing with the synchronous scheduler."""
    started.set()
    with dask.config.set(scheduler="synchronous"):
        write_trial(url, seed, mode, options)


def _fork_writer(url: str, mode: str, seed: int, options) -> multiprocessing.Process:
    context = multiprocessing.get_context("fork")
    started = context.Event()
    proc = context.Process(target=_writer_child, args=(url, mode, seed, options, started))
    proc.start()
    assert started.wait(120), "the forked writer did not start"
    return proc


def _calibrate(trials: Trials) -> float:
    """Seconds one complete write takes in a forked writer."""
    t0 = time.perf_counter()
    proc = _fork_writer(trials.url("calibration"), "w-", 9, trials.options)
    proc.join(300)
    assert proc.exitcode == 0
    return time.perf_counter() - t0


@pytest.mark.parametrize("count", [pytest.param(3, id="ci"), pytest.param(30, id="long", marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", ["w-", "w"])
def test_writer_killed_at_random_moments(trials, mode, count):
    """SIGKILL a writer at a random moment of its write: the target reads the old data, the new
    data or (w-) nothing -- never a mix; the same call re-run then completes with the new data
    and leaves exactly the referenced fragments."""
    rng = np.random.default_rng(14)
    manager().close_all()  # no open fragment handles shared with the children
    duration = _calibrate(trials)
    outcomes: Counter = Counter()
    old = 1 if mode == "w" else None
    url = trials.url("overwritten")
    for trial in range(count):
        if mode == "w":
            write_trial(url, old, "w", trials.options)  # the committed dataset the writer overwrites
        else:
            url = trials.url(f"created-{trial}")
        manager().close_all()
        before = trials.versions(url)
        proc = _fork_writer(url, mode, 2, trials.options)
        time.sleep(rng.uniform(0, 1.3 * duration))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)
        outcome = trials.outcome(url, old, 2)
        outcomes[(outcome, "killed" if proc.exitcode == -signal.SIGKILL else "finished")] += 1
        trials.assert_history(url, before, outcome, old, 2)
        finished = mode == "w-" and outcome == "new"  # (w- refuses to rerun over its own finished write)
        if not finished:
            before = trials.versions(url)
            write_trial(url, 2, mode, trials.options)  # the same call again
            trials.assert_history(url, before, "new", old, 2)
        assert trials.outcome(url, old, 2) == "new"
        trials.assert_tidy(url, stale_lease=finished)
    print(f"\nkill trials {mode} {trials.name}: {dict(outcomes)} (write {duration:.2f} s)")
    assert sum(outcomes.values()) == count


@pytest.mark.parametrize("races", [pytest.param(4, id="ci"), pytest.param(10, id="long", marks=pytest.mark.slow)])
def test_two_creators_race(trials, races):
    """Two ``w-`` writers of different data started together, ``races`` times: one wins, the
    dataset holds exactly its data, the other gets a clear error."""
    errors: Counter = Counter()
    for race in range(races):
        url = trials.url(f"race-{race}")
        procs = {seed: trials.spawn(url, "w-", seed) for seed in (3, 4)}
        results = {seed: _finish(proc) for seed, proc in procs.items()}
        winners = [seed for seed, (code, _) in results.items() if code == 0]
        assert len(winners) == 1, results
        loser = next(seed for seed in procs if seed not in winners)
        code, out = results[loser]
        assert code in (3, 4) and ("conflict" in out or "exists" in out), out
        errors[out.split("start", 1)[-1].split()[0]] += 1
        assert trials.outcome(url, None, winners[0]) == "new"
        trials.assert_tidy(url)
    print(f"\nraces ({trials.name}): loser's error {dict(errors)}")


@pytest.mark.parametrize("seeds", [pytest.param((6, 5), id="ci"), pytest.param((6, 5) * 3, id="long", marks=pytest.mark.slow)])
def test_reader_during_overwrites(trials, seeds):
    """A reader looping while another process overwrites the dataset (once per seed) sees old or
    new data (or, when a generation it opened is retired mid-read, a MissingFragmentError saying so)."""
    url = trials.url("busy")
    write_trial(url, 5, "w-", trials.options)
    script = trials.script.with_name("overwriter.py")
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys
        for seed in {seeds!r}:
            subprocess.run([sys.executable, {str(trials.script)!r}, {url!r}, "w", str(seed)], check=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], env=trials.env)
    seen: Counter = Counter()
    try:
        while proc.poll() is None:
            try:
                got = trials.read(url)
            except daskcfa.MissingFragmentError as exc:
                assert "overwritten or updated since it was opened" in str(exc)
                seen["retired mid-read"] += 1
                continue
            seen["5" if np.array_equal(got, trial_data(5)) else
                 "6" if np.array_equal(got, trial_data(6)) else "MIXED"] += 1
    finally:
        proc.wait(600)
    assert proc.returncode == 0
    assert seen["MIXED"] == 0 and seen["5"] + seen["6"] >= 1, seen
    print(f"\nreads during overwrites ({trials.name}): {dict(seen)}")
    trials.assert_tidy(url)


@pytest.mark.parametrize("attempts", [pytest.param(1, id="ci"), pytest.param(4, id="long", marks=pytest.mark.slow)])
@pytest.mark.parametrize("regions", [((0, 6), (6, 12)), ((2, 5), (2, 5))], ids=["different", "same"])
def test_two_region_writers(trials, regions, attempts):
    """Two ``r+`` writers at once, ``attempts`` times: on different regions both land; on the same
    region one wins cleanly (exactly its values there); everything else keeps the values it had."""
    for attempt in range(attempts):
        url = trials.url(f"regions-{attempt}")
        write_trial(url, 7, "w-", trials.options)
        procs = {seed: trials.spawn(url, "r+", seed, time_region=list(region))
                 for seed, region in zip((8, 9), regions)}
        results = {seed: _finish(proc) for seed, proc in procs.items()}
        assert all(code == 0 for code, _ in results.values()), results
        got = trials.read(url)
        expected = trial_data(7)
        if regions[0] != regions[1]:
            for seed, (a, b) in zip((8, 9), regions):
                expected[a:b] = trial_data(seed)[a:b]
            np.testing.assert_array_equal(got, expected)
        else:
            a, b = regions[0]
            winner = next(seed for seed in (8, 9) if np.array_equal(got[a:b], trial_data(seed)[a:b]))
            expected[a:b] = trial_data(winner)[a:b]
            np.testing.assert_array_equal(got, expected)
        trials.assert_tidy(url)
