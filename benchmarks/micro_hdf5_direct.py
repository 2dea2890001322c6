"""Micro-benchmark: direct HDF5 fragment reads against netCDF4-python.

    python -m benchmarks.micro_hdf5_direct [--fragments 20] [--repeats 3]

Writes N fragments of ~10 MB float32 (zlib level 1 with shuffle, and the
same uncompressed and contiguous) to a temporary directory, then times, with
the page cache warm and each file opened and closed per read as a dask task
would: full reads with netCDF4 (serial and 2 threads) and with
:class:`~daskcfa.fragments.hdf5.HDF5File` (serial and 2 threads), and one-point
reads across all fragments. Prints the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import netCDF4
import numpy as np

from daskcfa.fragments.hdf5 import HDF5File

SHAPE = (40, 256, 256)  # 10.5 MB of float32
CHUNKS = (4, 256, 256)  # ~1 MB chunks


def write_fragments(directory: Path, n: int) -> dict[str, list[Path]]:
    rng = np.random.default_rng(0)
    t, y, x = np.meshgrid(*(np.linspace(0, 3, s) for s in SHAPE), indexing="ij")
    smooth = 280 + 10 * np.sin(t + 2 * y) * np.cos(3 * x)
    paths: dict[str, list[Path]] = {"zlib": [], "raw": []}
    for i in range(n):
        values = (smooth + rng.normal(scale=0.1, size=SHAPE)).astype("f4")
        for kind, options in (
            ("zlib", dict(zlib=True, complevel=1, shuffle=True, chunksizes=CHUNKS)),
            ("raw", dict(contiguous=True)),
        ):
            path = directory / f"{kind}{i:03d}.nc"
            with netCDF4.Dataset(path, "w") as nc:
                for dim, size in zip(("time", "lat", "lon"), SHAPE):
                    nc.createDimension(dim, size)
                nc.createVariable("tas", "f4", ("time", "lat", "lon"), **options)[...] = values
            paths[kind].append(path)
    return paths


NETCDF4_LOCK = threading.Lock()  # netCDF-C is not thread-safe: concurrent calls fail


def netcdf4_read(path: Path, key: tuple) -> np.ndarray:
    with NETCDF4_LOCK, netCDF4.Dataset(path) as nc:
        var = nc["tas"]
        var.set_auto_maskandscale(False)
        return var[key]


def direct_read(path: Path, key: tuple) -> np.ndarray:
    with HDF5File(path) as f:
        return f.variable("tas").read(key)


def best_time(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fragments", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    full = (slice(None),) * 3
    point = (17, 100, 200)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        paths = write_fragments(Path(tmp), args.fragments)
        megabytes = args.fragments * np.prod(SHAPE) * 4 / 1e6
        for kind in ("zlib", "raw"):
            files = paths[kind]
            for path in files:  # same answers, and a warm page cache
                assert np.array_equal(direct_read(path, full), netcdf4_read(path, full))
            stored = sum(p.stat().st_size for p in files) / 1e6
            print(f"\n{kind}: {len(files)} fragments, {megabytes:.0f} MB of values, {stored:.0f} MB on disk")
            print(f"{'method':<28}{'seconds':>9}{'MB/s':>9}{'speed-up':>10}")
            cases = {
                "netCDF4, serial": lambda: [netcdf4_read(p, full) for p in files],
                "netCDF4, 2 threads (lock)": lambda: list(pool.map(lambda p: netcdf4_read(p, full), files)),
                "direct, serial": lambda: [direct_read(p, full) for p in files],
                "direct, 2 threads": lambda: list(pool.map(lambda p: direct_read(p, full), files)),
                "netCDF4, one point each": lambda: [netcdf4_read(p, point) for p in files],
                "direct, one point each": lambda: [direct_read(p, point) for p in files],
            }
            baseline = {}
            for name, run in cases.items():
                seconds = best_time(run, args.repeats)
                one_point = "point" in name
                baseline.setdefault(one_point, seconds)
                rate = "" if one_point else f"{megabytes / seconds:9.0f}"
                print(f"{name:<28}{seconds:9.3f}{rate:>9}{baseline[one_point] / seconds:9.2f}x")


if __name__ == "__main__":
    main()
