"""A point time series through the chunk index, against no index and a serial netCDF4 loop (local).

    python -m benchmarks.chunk_index [--data benchmarks/data/n1000_f1x180x360_zlib1_c1x180x360] [--repeats 3]

Data: the ``timeseries`` dataset of :mod:`benchmarks.generate` (1,000 zlib
fragments of (1, 180, 360) float32), read only: the aggregation file is
copied into a temporary directory beside a link to its fragments, and the
chunk index (``daskcfa.index``) written there, untimed. The series is
``x[:, 90, 180]``; tools, in this one process, alternating (best of
``--repeats``):

* ``netcdf4-serial``: open each fragment with netCDF4-python, read the point.
* ``daskcfa``: ``from_cfa(..., chunk_index=False)`` (dask threads).
* ``daskcfa+index``: ``from_cfa`` with the index (no HDF5 metadata read).

Every answer is checked against :func:`benchmarks.generate.values`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import netCDF4
import numpy as np

import daskcfa
from benchmarks import generate

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "data", "n1000_f1x180x360_zlib1_c1x180x360")
POINT = (90, 180)


def netcdf4_serial(source: str) -> np.ndarray:
    names = sorted(os.listdir(os.path.join(source, "frag")))
    out = []
    for name in names:
        with netCDF4.Dataset(os.path.join(source, "frag", name)) as nc:
            out.append(np.asarray(nc["tas"][:, POINT[0], POINT[1]]))
    return np.concatenate(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEFAULT)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="daskcfa-bench-index-")
    try:
        shutil.copy(os.path.join(args.data, "aggregation.nc"), work)
        os.symlink(os.path.abspath(os.path.join(args.data, "frag")), os.path.join(work, "frag"))
        url = os.path.join(work, "aggregation.nc")
        t0 = time.perf_counter()
        report = daskcfa.index(url)
        print(f"index: {report} in {time.perf_counter() - t0:.2f} s")
        n = report.fragments
        truth = generate.values(np.arange(n), POINT[0], POINT[1], 180, 360)
        tools = {
            "netcdf4-serial": lambda: netcdf4_serial(args.data),
            "daskcfa": lambda: daskcfa.from_cfa(url, "tas", chunk_index=False)[:, POINT[0], POINT[1]].compute(),
            "daskcfa+index": lambda: daskcfa.from_cfa(url, "tas", chunk_index=True)[:, POINT[0], POINT[1]].compute(),
        }
        best = {name: float("inf") for name in tools}
        for _ in range(args.repeats):
            for name, tool in tools.items():
                t0 = time.perf_counter()
                got = tool()
                best[name] = min(best[name], time.perf_counter() - t0)
                np.testing.assert_array_equal(np.ma.getdata(got), truth)
        for name, seconds in best.items():
            print(f"{name:16s} {seconds:7.3f} s  ({seconds / best['netcdf4-serial']:.2f}x netcdf4-serial)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
