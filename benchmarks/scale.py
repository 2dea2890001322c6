"""Graph scale: build the dask array of an aggregation with up to 1,000,000 fragments.

Writes a synthetic CF-1.13 aggregation file (no fragment files are needed:
opening is lazy), then, in a fresh process, times ``daskcfa.from_cfa`` and
the growth of the process's resident memory, and the graph optimization
that ``compute()`` of a 2-fragment slice performs.

    python -m benchmarks.scale [--fragments 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import netCDF4
import numpy as np

CHILD = """
import json, sys, time, psutil
import daskcfa
rss = psutil.Process().memory_info().rss
t = time.perf_counter(); x = daskcfa.from_cfa(sys.argv[1]); build = time.perf_counter() - t
grow = psutil.Process().memory_info().rss - rss
t = time.perf_counter(); y = x[5:7, 1]; y.__dask_optimize__(y.__dask_graph__(), y.__dask_keys__())
sliced = time.perf_counter() - t  # what compute() does before running: cull to the 2 needed tasks
print(json.dumps({"seconds": build, "rss_growth_mb": grow / 1e6, "numblocks": x.numblocks, "slice_seconds": sliced}))
"""


def write_aggregation(path: str, n: int) -> None:
    """A (n, 4) float32 aggregation of n one-row fragments, CF-1.13."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.Conventions = "CF-1.13"
        for name, size in (("time", n), ("lat", 4), ("f_time", n), ("f_lat", 1), ("i", 2), ("j", n)):
            ds.createDimension(name, size)
        tas = ds.createVariable("tas", "f4", ())
        tas.aggregated_dimensions = "time lat"
        tas.aggregated_data = "map: fragment_map uris: fragment_uris identifiers: fragment_id"
        sizes = np.ma.masked_all((2, n), "i4")
        sizes[0], sizes[1, 0] = 1, 4
        ds.createVariable("fragment_map", "i4", ("i", "j"))[:] = sizes
        uris = np.array([f"frag/tas_{i:07d}.nc" for i in range(n)], dtype=object).reshape(n, 1)
        ds.createVariable("fragment_uris", str, ("f_time", "f_lat"))[:] = uris
        ds.createVariable("fragment_id", str, ())[...] = "tas"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fragments", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "scale.nc")
        write_aggregation(path, args.fragments)
        out = subprocess.run([sys.executable, "-c", CHILD, path], check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.fragments:,} fragments: from_cfa {result['seconds']:.2f} s, resident memory "
          f"+{result['rss_growth_mb']:.0f} MB, dask blocks {tuple(result['numblocks'])}, "
          f"slicing 2 fragments and optimizing the graph as compute() does {result['slice_seconds']:.2f} s")


if __name__ == "__main__":
    main()
