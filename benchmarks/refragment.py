"""Re-fragmenting benchmark: daskcfa.refragment against a raw netCDF4 copy, side by side.

    python -m benchmarks.refragment [--quick] [--repeats 3] [--variants raw,zlib]
    python -m benchmarks.refragment --run TOOL --variant VARIANT [--quick]   # one measured run

The data are the read benchmarks' datasets (:mod:`benchmarks.generate`, in
``benchmarks/data``, git-ignored): 100 time-slice files of (10, 512, 512)
float32 = 1.05 GB, uncompressed and contiguous (``raw``) or zlib level 1 in
HDF5 chunks of one time step (``zlib``). ``--quick``: 10 files of (4, 64, 64).

Tools, each measured in its own fresh process, alternating, ``--repeats``
times:

* ``raw-copy``: a serial netCDF4-python loop that reads every byte of every
  file and writes every byte to a new file of the same layout (dimensions,
  coordinates, ``tas`` with the source's compression and chunking): the
  least work any copy must do.
* ``daskcfa``: ``daskcfa.refragment("frag/tas_*.nc", ...)`` into spatial tiles
  (``fragment_shape={"time": all, "lat": 128, "lon": 128}``: 16 tiles of
  64 MiB) with ``max_mem="256MiB"`` on a ``LocalCluster(n_workers=2,
  threads_per_worker=1)`` started before the clock; the clock covers the
  metadata scan of the 100 files, planning, every fragment and the
  aggregation file. zlib variant: tiles compressed with zlib level 1.
  Every worker's peak RSS growth over the run is measured on the worker
  (:class:`daskcfa_testing.memory.WorkerPeakMemory`: sampled RSS and the
  kernel's ``VmHWM``, reset before the run) and compared with the budget.

Both clocks start after and stop after an ``os.sync()``: a copy is done when
its bytes are on disk, and the page cache's write-back of one run must not
land in the next one's time (without it the raw copy's time varied 1.6-4.9 s
between identical runs). After the clock (untimed) the output is checked: every tile read back with
``daskcfa.from_cfa`` equals :func:`benchmarks.generate.values` bit for bit
(the raw copy: its last file). The ratio reported is the throughput of
daskcfa over the raw copy's (raw seconds / daskcfa seconds) per repeat, and
its median; the target is at least 0.7.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
from dask.utils import parse_bytes

from benchmarks import generate

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
MARK = "@@RESULT@@"
MAX_MEM = "256MiB"
TILE = 128
VARIANTS = {
    "raw": (generate.DatasetSpec(100, (10, 512, 512)), generate.DatasetSpec(10, (4, 64, 64))),
    "zlib": (generate.DatasetSpec(100, (10, 512, 512), zlib=True, chunks=(1, 512, 512)),
             generate.DatasetSpec(10, (4, 64, 64), zlib=True, chunks=(1, 64, 64))),
}


def _spec(variant: str, quick: bool) -> generate.DatasetSpec:
    full, small = VARIANTS[variant]
    return small if quick else full


def _workdir(variant: str, tool: str) -> str:
    path = os.path.join(generate.DEFAULT_DATADIR, "refragment-out", f"{variant}-{tool}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# ----------------------------------------------------------------------------
# Tools (one measured run each, in this process)
# ----------------------------------------------------------------------------


def raw_copy(variant: str, quick: bool) -> dict:
    import netCDF4

    data = generate.Dataset.load(generate.ensure(_spec(variant, quick), verbose=False))
    out = _workdir(variant, "raw-copy")
    os.sync()  # earlier runs' dirty pages are not this run's cost
    t0 = time.perf_counter()
    for src in data.fragments:
        with netCDF4.Dataset(src) as s, netCDF4.Dataset(os.path.join(out, os.path.basename(src)), "w") as d:
            d.setncatts({k: s.getncattr(k) for k in s.ncattrs()})
            for name, dim in s.dimensions.items():
                d.createDimension(name, None if dim.isunlimited() else len(dim))
            for name, var in s.variables.items():
                var.set_auto_maskandscale(False)
                filters = var.filters() or {}
                chunking = var.chunking()
                attrs = {k: var.getncattr(k) for k in var.ncattrs()}
                new = d.createVariable(name, var.dtype, var.dimensions, fill_value=attrs.pop("_FillValue", None),
                                       zlib=bool(filters.get("zlib")), complevel=filters.get("complevel", 4) or 4,
                                       shuffle=bool(filters.get("shuffle")),
                                       chunksizes=None if chunking == "contiguous" else chunking)
                new.setncatts(attrs)
                new.set_auto_maskandscale(False)
                new[...] = var[...]
    os.sync()  # a copy is done when it is on disk
    seconds = time.perf_counter() - t0
    nt, ny, nx = data.frag_shape
    with netCDF4.Dataset(os.path.join(out, os.path.basename(data.fragments[-1]))) as d:
        t = np.arange(data.shape[0] - nt, data.shape[0])
        ok = np.array_equal(d["tas"][...], generate.values(*np.ix_(t, np.arange(ny), np.arange(nx)), ny=ny, nx=nx))
    shutil.rmtree(out)
    return {"tool": "raw-copy", "variant": variant, "seconds": seconds, "ok": bool(ok), "nbytes": _nbytes(data)}


def daskcfa_refragment(variant: str, quick: bool) -> dict:
    from distributed import Client, LocalCluster

    import daskcfa
    from daskcfa_testing.memory import WorkerPeakMemory

    spec = _spec(variant, quick)
    data = generate.Dataset.load(generate.ensure(spec, verbose=False))
    warm = generate.Dataset.load(generate.ensure(generate.WARMUP_SPEC, verbose=False))
    out = _workdir(variant, "daskcfa")
    nt, ny, nx = data.shape
    tile = min(TILE, ny)
    shape = {"time": nt, "lat": tile, "lon": tile}
    compression = {"zlib": True, "complevel": 1, "chunksizes": (min(100, nt), tile, tile)} if spec.zlib else None
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="2GiB",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.run(lambda: __import__("daskcfa") and None)
        daskcfa.refragment(os.path.join(warm.dir, "frag", "*.nc"), os.path.join(out, "warm.nca"),
                           fragment_shape={"lat": 3, "lon": 4}, max_mem=MAX_MEM, mode="w")
        source = os.path.join(data.dir, "frag", "*.nc")
        plan = daskcfa.plan_refragment(source, fragment_shape=shape, max_mem=MAX_MEM)
        target = os.path.join(out, "tiles.nca")
        with WorkerPeakMemory(client) as memory:
            os.sync()
            t0 = time.perf_counter()
            daskcfa.refragment(source, target, fragment_shape=shape, max_mem=MAX_MEM, compression=compression)
            os.sync()
            seconds = time.perf_counter() - t0
    ok = _check_tiles(target, data)
    shutil.rmtree(out)
    budget = parse_bytes(MAX_MEM)
    growth = sorted(memory.growth.values())
    return {"tool": "daskcfa", "variant": variant, "seconds": seconds, "ok": ok, "nbytes": _nbytes(data),
            "worker_growth_mib": [round(g / 2**20, 1) for g in growth],
            "worker_peak_mib": [round(p / 2**20, 1) for p in sorted(memory.peak.values())],
            "under_budget": all(g < budget for g in growth), "plan": str(plan)}


def _check_tiles(target: str, data: generate.Dataset) -> bool:
    """Every tile read back equals the generating function bit for bit (one tile in memory at a time)."""
    import daskcfa

    x = daskcfa.from_cfa(target, chunks="fragments")
    nt, ny, nx = data.shape
    if x.shape != (nt, ny, nx) or x.dtype != np.float32:
        return False
    offsets = [np.cumsum((0,) + c) for c in x.chunks]
    for j0, j1 in zip(offsets[1], offsets[1][1:]):
        for i0, i1 in zip(offsets[2], offsets[2][1:]):
            got = np.ma.getdata(x[:, j0:j1, i0:i1].compute(scheduler="threads"))
            want = generate.values(*np.ix_(np.arange(nt), np.arange(j0, j1), np.arange(i0, i1)), ny=ny, nx=nx)
            if not np.array_equal(got, want):
                return False
    return True


def _nbytes(data: generate.Dataset) -> int:
    return int(np.prod(data.shape)) * 4


TOOLS = {"raw-copy": raw_copy, "daskcfa": daskcfa_refragment}


# ----------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------


def _measure(tool: str, variant: str, quick: bool, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.refragment", "--run", tool, "--variant", variant]
    cmd += ["--quick"] if quick else []
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    return {"tool": tool, "variant": variant, "ok": False, "error": (proc.stderr or proc.stdout)[-2000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", choices=sorted(TOOLS), help="one measured run of TOOL in this process")
    parser.add_argument("--variant", default="raw", choices=sorted(VARIANTS))
    parser.add_argument("--variants", default="raw,zlib")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if args.run:
        print(MARK + json.dumps(TOOLS[args.run](args.variant, args.quick)), flush=True)
        return 0
    report: dict = {"quick": args.quick, "max_mem": MAX_MEM, "variants": {}}
    failed = False
    for variant in args.variants.split(","):
        generate.ensure(_spec(variant, args.quick))
        generate.ensure(generate.WARMUP_SPEC, verbose=False)
        runs: list[tuple[dict, dict]] = []
        for _ in range(args.repeats):  # alternating, so machine noise hits both tools alike
            raw = _measure("raw-copy", variant, args.quick, args.timeout)
            ours = _measure("daskcfa", variant, args.quick, args.timeout)
            runs.append((raw, ours))
            print(f"[{variant}] raw-copy {raw.get('seconds', float('nan')):.2f} s, daskcfa "
                  f"{ours.get('seconds', float('nan')):.2f} s, worker peak growth {ours.get('worker_growth_mib')} MiB",
                  file=sys.stderr, flush=True)
        good = [(r, o) for r, o in runs if r.get("ok") and o.get("ok")]
        failed |= len(good) != len(runs) or not all(o.get("under_budget") for _, o in runs)
        ratios = [r["seconds"] / o["seconds"] for r, o in good]
        summary = {
            "raw_copy_seconds": [round(r["seconds"], 3) for r, _ in good],
            "daskcfa_seconds": [round(o["seconds"], 3) for _, o in good],
            "throughput_ratio": [round(x, 3) for x in ratios],
            "median_throughput_ratio": round(statistics.median(ratios), 3) if ratios else None,
            "worker_growth_mib": [o.get("worker_growth_mib") for _, o in runs],
            "under_budget": [o.get("under_budget") for _, o in runs],
            "output_equals_input": [o.get("ok") for _, o in runs],
            "plan": next((o.get("plan") for _, o in runs if o.get("plan")), None),
            "errors": [x["error"] for pair in runs for x in pair if "error" in x],
        }
        report["variants"][variant] = summary
        print(f"\n## {variant}\n{summary['plan']}\n"
              f"raw copy {summary['raw_copy_seconds']} s, daskcfa {summary['daskcfa_seconds']} s; throughput "
              f"ratio daskcfa/raw {summary['throughput_ratio']} (median {summary['median_throughput_ratio']}, "
              f"target >= 0.7); worker peak RSS growth {summary['worker_growth_mib']} MiB (budget {MAX_MEM}); "
              f"output equals input: {summary['output_equals_input']}", flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    name = "refragment.quick.json" if args.quick else "refragment.json"
    with open(os.path.join(RESULTS, name), "w") as f:
        json.dump(report, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
