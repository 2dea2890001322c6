"""netCDF-C beside xarray: one lock for both libraries, or the process crashes.

netCDF-C is not thread-safe. A threaded dask graph reading through xarray's
netcdf4 engine and through daskcfa's netCDF4 engine at once crashed with
SIGSEGV (or "NetCDF: HDF error") while each library took its own lock
(observed before the fix: 5 of 20 child processes of five rounds each
failed). ``daskcfa.locks.NETCDF_LOCK`` is now built on xarray's own lock
objects. The test runs the 20 trials the issue asked for, as 10 child
processes of two rounds each (a crash ends its process, so a round is a
trial; it ran 20 x 5 = 100 rounds: 103 s of a CI run).
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask.array as da
import netCDF4
import numpy as np
import pytest

import daskcfa
from daskcfa import locks

xarray_locks = pytest.importorskip("xarray.backends.locks")

TRIALS = 10  #: child processes
ROUNDS = 2  #: rounds of the mixed graph per child process
PLAIN_FILES = 8
SHAPE = (64, 40, 30)

#: One child process: a mixed graph, many small chunks and files, 8 threads, ``rounds`` times.
CHILD = """
import sys, dask, numpy as np, xarray as xr, daskcfa
from daskcfa.fragments.manager import manager
d, plain, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = np.load(f"{d}/truth.npy")
with dask.config.set({"daskcfa.io.engine": "netcdf4", "scheduler": "threads", "num_workers": 8}):
    for _ in range(rounds):
        manager().close_all()  # every round opens its fragments again, beside xarray's opens
        xs = [xr.open_dataset(f"{d}/plain{i}.nc", engine="netcdf4", chunks={"t": 1}, cache=False)["v"].data
              for i in range(plain)]
        agg = daskcfa.from_cfa(f"{d}/agg.nc", "v", chunks=(1, 40, 30))
        sums = dask.compute(*[x.sum(axis=(1, 2)) for x in xs], agg.sum(axis=(1, 2)))
        for i, got in enumerate(sums):
            offset = i if i < plain else 0
            np.testing.assert_allclose(got, (data + offset).sum(axis=(1, 2), dtype="f8"), rtol=1e-5)
print("ok")
"""


def test_daskcfa_lock_is_xarrays_netcdf4_lock():
    """Holding daskcfa's lock holds both locks xarray's netcdf4 engine takes; reentrant; pickles to itself."""
    with locks.NETCDF_LOCK:
        assert xarray_locks.NETCDFC_LOCK.locked() and xarray_locks.HDF5_LOCK.locked()
        with locks.NETCDF_LOCK:  # daskcfa nests library calls
            pass
        assert xarray_locks.HDF5_LOCK.locked()
        taken = []
        other = threading.Thread(target=lambda: taken.append(xarray_locks.NETCDFC_LOCK.acquire(blocking=False)))
        other.start()
        other.join()
        assert taken == [False]
    assert not xarray_locks.NETCDFC_LOCK.locked() and not xarray_locks.HDF5_LOCK.locked()
    assert pickle.loads(pickle.dumps(locks.NETCDF_LOCK)) is locks.NETCDF_LOCK
    with pytest.raises(RuntimeError):
        locks.NETCDF_LOCK.release()


@pytest.fixture(scope="module")
def mixed_files(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("mixed")
    data = np.random.default_rng(11).random(SHAPE).astype("f4")
    np.save(directory / "truth.npy", data)
    for i in range(PLAIN_FILES):
        with netCDF4.Dataset(directory / f"plain{i}.nc", "w") as ds:
            for name, size in zip(("t", "y", "x"), SHAPE):
                ds.createDimension(name, size)
            v = ds.createVariable("v", "f4", ("t", "y", "x"), zlib=True, complevel=1, chunksizes=(2, 40, 30))
            v[:] = data + i
    daskcfa.to_cfa(da.from_array(data, chunks=(1, 40, 30)), str(directory / "agg.nc"), variable="v",
                   dims=("t", "y", "x"), fragment_shape=(1, 40, 30))
    return directory


def test_mixed_xarray_and_daskcfa_graph_never_crashes(mixed_files):
    def trial(_: int) -> tuple[int, str, str]:
        run = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, str(mixed_files), str(PLAIN_FILES),
                              str(ROUNDS)],
                             capture_output=True, text=True, timeout=600)
        return run.returncode, run.stdout.strip(), run.stderr[-2000:]

    with ThreadPoolExecutor(2) as pool:  # two children at a time: the machine has two cores
        outcomes = list(pool.map(trial, range(TRIALS)))
    failed = [o for o in outcomes if o[:2] != (0, "ok")]
    print(f"mixed xarray+daskcfa graph: {TRIALS - len(failed)} of {TRIALS} child processes ok; exit codes of "
          f"the others: {sorted(code for code, _, _ in failed)}")
    assert not failed, (f"{len(failed)} of {TRIALS} child processes ({ROUNDS} rounds each) failed "
                        f"(-11: SIGSEGV): {failed[0]}")


#: A child process: daskcfa's lock first, xarray imported later, while another thread holds daskcfa's lock.
LATE_XARRAY = """
import sys, threading, time
from daskcfa.locks import NETCDF_LOCK
assert "xarray" not in sys.modules, "daskcfa.locks imported xarray"
holding, times = threading.Event(), {}
def section():
    with NETCDF_LOCK:
        holding.set()
        time.sleep(1.5)
        times["released"] = time.monotonic()
thread = threading.Thread(target=section)
thread.start()
holding.wait()
import xarray.backends.locks as xl
times["imported"] = time.monotonic()
thread.join()
with NETCDF_LOCK:
    held = xl.NETCDFC_LOCK.locked() and xl.HDF5_LOCK.locked()
    with NETCDF_LOCK:
        pass
    still = xl.NETCDFC_LOCK.locked()
print(times["imported"] >= times["released"], held, still, xl.NETCDFC_LOCK.locked(), NETCDF_LOCK.locked())
"""


def test_xarray_imported_later_shares_the_lock():
    """daskcfa does not import xarray for its lock (metadata-only work would pay for it): once xarray is
    imported, daskcfa's lock holds xarray's locks too, and the import ends only after a daskcfa section in
    progress (which did not take them), before xarray can call netCDF-C."""
    done = subprocess.run([sys.executable, "-c", LATE_XARRAY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True", "True", "False", "False"]


#: One child process: two threads each open the same aggregation with from_cfa 20 times.
CONCURRENT_OPENS = """
import sys, threading, daskcfa
url = sys.argv[1]
start = threading.Barrier(2)
def opens():
    start.wait()
    for _ in range(20):
        daskcfa.from_cfa(url, "tas")
threads = [threading.Thread(target=opens) for _ in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def test_threads_opening_one_aggregation_at_once_never_crash(tmp_path):
    """A user's thread pool opening the same archive (a web service, a notebook's executor): each
    child process is two threads of 20 ``from_cfa`` calls; a crash ends the child with SIGSEGV.

    The netCDF4 wheels 1.7.3-1.7.5 (HDF5 2.2.0) crash in ``nc_open`` when a file is opened while
    one handle of it is open and another was opened, read and closed meanwhile: two threads whose
    open and close were separate sections under the lock did that. daskcfa opens, reads and
    closes a file in one section (``storage.netcdf_file``)."""
    url = daskcfa.sample(str(tmp_path / "tas.nca"))
    codes = [subprocess.run([sys.executable, "-W", "ignore", "-c", CONCURRENT_OPENS, url], capture_output=True,
                            timeout=300).returncode for _ in range(3)]
    assert codes == [0, 0, 0], codes


#: One child process: the aggregation file held open by xarray's netcdf4 engine (which keeps the files it
#: opened) and by the user's own ``netCDF4.Dataset``, while daskcfa opens it again and again.
HELD_ELSEWHERE = """
import sys, netCDF4, xarray as xr, daskcfa
url = sys.argv[1]
plain = xr.open_dataset(url, engine="netcdf4")
held = netCDF4.Dataset(url)
for _ in range(10):
    daskcfa.open_cfa(url)
    daskcfa.from_cfa(url, "tas")
print("ok")
"""


def test_aggregation_held_open_elsewhere_in_the_process_does_not_crash_daskcfa(tmp_path):
    """``xr.open_dataset(agg)`` then ``daskcfa.open_cfa(agg)`` twice crashed the process: HDF5 2.2.0
    crashes in ``nc_open`` on a file opened while a handle of it is open and another one of it read its
    strings and was closed meanwhile (HDFGroup/hdf5#5359). daskcfa reads the aggregation file whole and
    opens it from memory, which shares nothing with the handles held elsewhere."""
    url = daskcfa.sample(str(tmp_path / "tas.nca"))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", HELD_ELSEWHERE, url], capture_output=True,
                          text=True, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), (done.returncode, done.stderr[-2000:])
