"""FragmentBudget on a real distributed cluster: open files and memory stay in budget.

Each worker process's open files are sampled with psutil throughout the run,
from outside the workers, and compared with the budget.
"""

from __future__ import annotations

import os
import threading
import time

import cloudpickle
import dask
import distributed
import numpy as np
import psutil
import pytest
from distributed import Client, LocalCluster

import daskcfa
from builders import assert_matches, build_cf113, make_truth
from remote_helpers import upload

pytestmark = pytest.mark.usefixtures("other_cwd")


class OpenFileSampler:
    """Polls the open files of some processes; remembers the most open under a directory."""

    def __init__(self, pids, directory):
        self.procs = [psutil.Process(p) for p in pids]
        self.directory = str(directory)
        self.peak = {p: 0 for p in pids}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self, proc) -> int:
        try:
            return sum(1 for f in proc.open_files() if f.path.startswith(self.directory))
        except psutil.NoSuchProcess:
            return 0

    def _run(self):
        while not self._stop.is_set():
            for proc in self.procs:
                self.peak[proc.pid] = max(self.peak[proc.pid], self.count(proc))
            self.samples += 1
            time.sleep(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def cluster_of_processes():
    return LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None,
                        worker_dashboard_address=None)


def config_text() -> str:
    """This process's whole dask config, as text (run on each worker too)."""
    return repr(dask.config.config)


def test_clients_made_after_from_cfa_compute_with_no_secret_in_config_or_graph(s3_server, s3_bucket, tmp_path):
    """Open first, start the cluster later: each client the process makes (here two, on two
    clusters) gets the storage profiles; the secret is in no dask config (client, scheduler,
    worker) and no task."""
    with pytest.raises(ValueError):
        distributed.default_client()  # (no client when from_cfa runs)
    truth = make_truth((8, 6, 8), "f4", seed=14, masked=0.05)
    built = build_cf113(tmp_path / "late", truth, ("time", "lat", "lon"), ((1,) * 8, (6,), (8,)))
    base = upload(s3_server.filesystem(), tmp_path / "late", s3_bucket, "late")
    secret = s3_server.secret
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", storage_options=s3_server.storage_options)
    graph = cloudpickle.dumps(dict(x.__dask_graph__()))
    assert secret.encode() not in graph and s3_server.key.encode() not in graph
    for part in (slice(None), slice(2, 5)):
        with cluster_of_processes() as cluster, Client(cluster) as client:
            assert_matches(x[part].compute(), built.expected[part])
            texts = [config_text(), client.run_on_scheduler(config_text), *client.run(config_text).values()]
            assert len(texts) == 3
            assert not [t for t in texts if secret in t or s3_server.key in t]


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """500 small netCDF-4 fragments along time."""
    directory = tmp_path_factory.mktemp("budget")
    truth = make_truth((500, 6, 8), "f4", seed=11, masked=0.05)
    return build_cf113(directory, truth, ("time", "lat", "lon"), ((1,) * 500, (6,), (8,)))


def test_filehandle_budget_holds_on_every_worker(cluster, archive):
    client = cluster
    client.register_plugin(daskcfa.FragmentBudget(filehandles=8, memory="64MiB"), name="budget")
    pids = list(client.run(os.getpid).values())
    fragment_dir = os.path.dirname(next(iter(archive.fragment_files.values())))
    x = daskcfa.from_cfa(str(archive.path))
    with OpenFileSampler(pids, fragment_dir) as sampler:
        got = x.compute()
        again = x[:, 3, 4].compute()
    assert_matches(got, archive.expected)
    assert_matches(again, archive.expected[:, 3, 4])
    assert sampler.samples > 10
    assert all(0 < peak <= 8 for peak in sampler.peak.values()), sampler.peak
    stats = client.run(daskcfa.fragment_stats)
    for s in stats.values():
        assert s["filehandles_budget"] == 8 and s["peak_files"] <= 8 and s["evictions"] > 0

    # Teardown closes every cached fragment file.
    client.unregister_worker_plugin("budget")
    deadline = time.monotonic() + 10
    while any(sampler.count(psutil.Process(p)) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(sampler.count(psutil.Process(p)) == 0 for p in pids)


def test_restarted_workers_get_the_plugin_again(cluster, archive):
    client = cluster
    client.register_plugin(daskcfa.FragmentBudget(filehandles=5, memory="32MiB"), name="budget-restart")
    client.restart()
    stats = client.run(daskcfa.fragment_stats)
    assert len(stats) == 2
    assert all(s["filehandles_budget"] == 5 and s["memory_budget"] == 32 << 20 for s in stats.values())
    assert_matches(daskcfa.from_cfa(str(archive.path))[:50].compute(), archive.expected[:50])
    client.unregister_worker_plugin("budget-restart")


def test_memory_budget_holds_for_remote_fragments(cluster, s3_server, s3_bucket, tmp_path):
    # 24 uncompressed 6 MiB fragments fetched whole from S3: 144 MiB through a 64 MiB budget.
    truth = make_truth((24, 768, 1024), "f8", seed=12, masked=0.0)
    built = build_cf113(tmp_path / "s3", truth, ("time", "lat", "lon"), ((1,) * 24, (768,), (1024,)))
    base = upload(s3_server.filesystem(), tmp_path / "s3", s3_bucket, "mem")
    client = cluster
    client.register_plugin(daskcfa.FragmentBudget(filehandles=64, memory="64MiB"), name="budget-memory")
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", storage_options=s3_server.storage_options)
    means = x.mean(axis=(1, 2)).compute()
    np.testing.assert_allclose(means, built.expected.mean(axis=(1, 2)), rtol=1e-10)
    stats = client.run(daskcfa.fragment_stats)
    for s in stats.values():
        assert 0 < s["peak_bytes"] <= 64 << 20, s
    assert sum(s["misses"] for s in stats.values()) >= 24
    client.unregister_worker_plugin("budget-memory")


def test_oversized_fragment_is_a_clear_error(cluster, s3_server, s3_bucket, tmp_path):
    truth = make_truth((2, 512, 1024), "f8", seed=13, masked=0.0)  # 4 MiB fragments
    built = build_cf113(tmp_path / "big", truth, ("time", "lat", "lon"), ((1, 1), (512,), (1024,)))
    base = upload(s3_server.filesystem(), tmp_path / "big", s3_bucket, "big")
    client = cluster
    client.register_plugin(daskcfa.FragmentBudget(filehandles=8, memory="1MiB"), name="budget-tiny")
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", storage_options=s3_server.storage_options)
    with pytest.raises(daskcfa.BudgetError) as info:
        x.compute()
    assert "memory budget" in str(info.value) and "s3://" in str(info.value)
    client.unregister_worker_plugin("budget-tiny")


def test_a_budget_that_is_not_a_size_is_an_argument_error():
    """Sizes read as dask (``1GiB``) or S3netCDF4 (``2 GB``) read them, by config.py's one reader; anything
    else is a daskcfa error naming the argument, not the parser's bare ValueError."""
    assert daskcfa.FragmentBudget(memory="2 GB", filehandles=4).budget.memory == 2 * 10**9
    assert daskcfa.FragmentBudget(memory="1GiB", filehandles=4).budget.memory == 2**30
    with pytest.raises(daskcfa.ArgumentError, match="memory: the value must be a size .* not 'lots'"):
        daskcfa.FragmentBudget(memory="lots", filehandles=4)


def test_an_in_process_worker_leaves_the_budgets_to_the_dask_config_at_teardown():
    """A ``FragmentBudget`` on a cluster of threads in this process configures this process's file
    manager; once the cluster is closed, a ``dask.config.set`` budget applies again (before: the
    plugin's budget stayed in force for the rest of the session)."""
    from daskcfa.fragments.manager import manager

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.register_plugin(daskcfa.FragmentBudget(memory="3MiB", filehandles=3))
        assert manager().budget.memory == 3 << 20
    with dask.config.set({"daskcfa.budget.memory": "5MiB"}):
        assert manager().budget.memory == 5 << 20
