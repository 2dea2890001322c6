"""The file-handle budget counts every file really open, in-process and on distributed workers.

Fragments are netCDF-4 files compressed with zstd (decoded by the direct
reader: one open file each) and szip (which only netCDF4-python decodes: the
direct reader's handle plus netCDF4-python's, both counted by the file
manager). Open files are counted in ``/proc/<pid>/fd``, not taken from the
manager's word.
"""

from __future__ import annotations

import os
from pathlib import Path

import dask
import netCDF4
import numpy as np
import pytest

import daskcfa
from daskcfa.fragments.manager import Budget, manager
from remote_helpers import write_cf113

FRAGMENTS = 12
LENGTH = 50


def open_fragment_files(directory: str) -> int:
    """How many of this process's file descriptors are fragment files under ``directory``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(directory) and target.endswith(".nc") and "agg" not in target
    return count


def handles_now(directory: str) -> dict[str, int]:
    return {"real": open_fragment_files(directory), "counted": manager().stats()["files"]}


def build(directory: Path, compressions: list[str]) -> tuple[Path, np.ndarray]:
    """An aggregation of ``x(n)`` over one fragment per compression, with its numpy truth."""
    directory.mkdir(parents=True, exist_ok=True)
    truth = np.arange(len(compressions) * LENGTH, dtype="i4") * 3 - 7
    names = []
    for i, compression in enumerate(compressions):
        name = f"f{i:02d}.nc"
        extra = {"szip_coding": "nn", "szip_pixels_per_block": 8} if compression == "szip" else {}
        with netCDF4.Dataset(directory / name, "w") as ds:
            ds.createDimension("n", LENGTH)
            ds.createVariable("x", "i4", ("n",), compression=compression, chunksizes=(LENGTH,), **extra)[...] = (
                truth[i * LENGTH:(i + 1) * LENGTH])
        names.append(name)
    path = write_cf113(directory / "agg.nc", "x", ("n",), [[LENGTH] * len(names)], [names])
    return path, truth


@pytest.fixture
def four_handles():
    manager().close_all()
    manager().configure(Budget.parse(filehandles=4, memory="256MiB"))
    yield
    manager().close_all()
    manager().configure(None)  # (the config's budgets again: a later test's dask.config.set applies)


@pytest.mark.parametrize("kinds", [["zstd"], ["szip"], ["zstd", "szip"]], ids=["zstd", "szip", "mixed"])
def test_open_files_stay_within_the_budget_in_process(tmp_path, four_handles, kinds):
    """12 fragments read by 4 threads with ``filehandles=4``: never more than 4 fragment files
    really open, and the manager's count is the real one (zstd is decoded directly: one file per
    fragment; szip needs netCDF4-python beside it: two, both counted)."""
    path, truth = build(tmp_path, [kinds[i % len(kinds)] for i in range(FRAGMENTS)])
    seen: list[dict[str, int]] = []

    def watch(key, dsk, state, *args):  # after every task: what is really open, what is counted
        seen.append(handles_now(str(tmp_path)))

    x = daskcfa.from_cfa(str(path), "x")
    with dask.config.set(scheduler="threads", num_workers=4), dask.callbacks.Callback(posttask=watch):
        np.testing.assert_array_equal(x.compute(), truth)
    assert seen and max(s["real"] for s in seen) <= 4, seen
    final = handles_now(str(tmp_path))
    assert final["real"] == final["counted"], final
    if "szip" in kinds:
        assert final["real"] >= 2  # the last szip fragment still cached: both of its handles


def _read_and_count(directory: str) -> dict[str, int]:
    return handles_now(directory)


def test_open_files_stay_within_the_budget_on_a_worker(tmp_path):
    """The same on a LocalCluster worker configured by ``FragmentBudget(filehandles=4)``."""
    from distributed import Client, LocalCluster

    path, truth = build(tmp_path, ["zstd", "szip"] * (FRAGMENTS // 2))
    with LocalCluster(n_workers=1, threads_per_worker=4, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.register_plugin(daskcfa.FragmentBudget(memory="256MiB", filehandles=4))
        x = daskcfa.from_cfa(str(path), "x")
        for step in (1, 7, 3):
            np.testing.assert_array_equal(x[::step].compute(), truth[::step])
            (counts,) = client.run(_read_and_count, str(tmp_path)).values()
            assert counts["real"] <= 4 and counts["real"] == counts["counted"], counts
        stats = next(iter(client.run(daskcfa.fragment_stats).values()))
        assert stats["peak_files"] <= 4, stats
