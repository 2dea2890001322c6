"""Re-fragmenting benchmark: daskcfa.refragment against serial netCDF4 loops, side by side.

    python -m benchmarks.refragment [--quick] [--repeats 5] [--variants raw,zlib] [--tools a,b]
        [--datadir DIR] [--scratch DIR]
    python -m benchmarks.refragment --run TOOL --variant VARIANT [--quick]   # one measured run

The data are the read benchmarks' datasets (:mod:`benchmarks.generate`, in
``--datadir``, default ``benchmarks/data``, git-ignored): 100 time-slice
files of (10, 512, 512) float32 = 1.05 GB, uncompressed and contiguous
(``raw``) or zlib level 1 in HDF5 chunks of one time step (``zlib``).
``--quick``: 10 files of (4, 64, 64). The outputs and the warm-up data go
under ``--scratch`` (default: the data directory).

Every tool turns the time slices into 16 spatial tiles of 1000 x 128 x 128
(64 MiB each; the zlib variant: zlib level 1 in HDF5 chunks of
100 x 128 x 128), each measured in its own fresh process, one run of each
tool a round, ``--repeats`` rounds:

* ``memory-loop`` (the limit): a serial netCDF4-python loop holding the whole
  array in memory: every file read into one array, then every tile written
  with netCDF4-python. The least code a user writes, and memory no budget
  allows.
* ``raw-copy``: a serial netCDF4-python loop that copies every file to a new
  file of the same layout (no re-fragmenting at all: the least work any copy
  must do). Not run unless asked for with ``--tools``.
* ``daskcfa-threads``: ``daskcfa.refragment("frag/tas_*.nc", ...)`` with
  ``max_mem="256MiB"`` on dask's default threaded scheduler (one thread a
  core), in the measuring process.
* ``daskcfa``: the same on a ``LocalCluster(n_workers=2,
  threads_per_worker=1)`` started before the clock; every worker's peak RSS
  growth is measured on the worker
  (:class:`daskcfa_testing.memory.WorkerPeakMemory`) and compared with the
  budget.

The clocks cover the metadata scan of the 100 files, planning, every
fragment and the aggregation file, and start and stop after an
``os.sync()``: a copy is done when its bytes are on disk, and the page
cache's write-back of one run must not land in the next one's time. Peak
RSS is the kernel's mark (``VmHWM``) of the measuring process (of each
worker for ``daskcfa``), imports included. After the clock (untimed) the
output is checked: every tile read back with ``daskcfa.from_cfa`` (the
loops': every file) equals :func:`benchmarks.generate.values` bit for bit.
The ratio reported is each tool's time over the memory loop's, round by
round, and its median; targets: daskcfa at most 0.4x the loop, peak RSS at
most 556 MB. CPU seconds (user + system, every thread; the cluster's
workers too) are reported beside, and their ratio: on a loaded machine
they move less than wall time.
"""

from __future__ import annotations

import argparse
import glob
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
from benchmarks.measure import cpu_seconds

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
MARK = "@@RESULT@@"
MAX_MEM = "256MiB"
TILE = 128
LIMIT = "memory-loop"
TARGET_RATIO = 0.4
TARGET_PEAK = 556e6
VARIANTS = {
    "raw": (generate.DatasetSpec(100, (10, 512, 512)), generate.DatasetSpec(10, (4, 64, 64))),
    "zlib": (generate.DatasetSpec(100, (10, 512, 512), zlib=True, chunks=(1, 512, 512)),
             generate.DatasetSpec(10, (4, 64, 64), zlib=True, chunks=(1, 64, 64))),
}


def _spec(variant: str, quick: bool) -> generate.DatasetSpec:
    full, small = VARIANTS[variant]
    return small if quick else full


def _workdir(scratch: str, variant: str, tool: str) -> str:
    path = os.path.join(scratch, "refragment-out", f"{variant}-{tool}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _tiles(spec: generate.DatasetSpec, shape: tuple[int, ...]) -> tuple[dict, dict | None]:
    """The target fragment shape and the tiles' compression (zlib level 1, chunks of 100 time steps)."""
    nt, ny, nx = shape
    tile = min(TILE, ny)
    compression = {"zlib": True, "complevel": 1, "chunksizes": (min(100, nt), tile, tile)} if spec.zlib else None
    return {"time": nt, "lat": tile, "lon": tile}, compression


def _peak() -> int:
    from daskcfa_testing.memory import peak_rss

    return int(peak_rss() or 0)


# ----------------------------------------------------------------------------
# Tools (one measured run each, in this process)
# ----------------------------------------------------------------------------


def _copy_header(s, d, var_keywords) -> None:
    """Global attributes, dimensions and variables of ``s`` defined in ``d`` (``tas`` with ``var_keywords``)."""
    d.setncatts({k: s.getncattr(k) for k in s.ncattrs()})
    for name, var in s.variables.items():
        var.set_auto_maskandscale(False)
        attrs = {k: var.getncattr(k) for k in var.ncattrs()}
        keywords = var_keywords(var) if name == generate.VARNAME else {}
        new = d.createVariable(name, var.dtype, var.dimensions, fill_value=attrs.pop("_FillValue", None), **keywords)
        new.setncatts(attrs)
        new.set_auto_maskandscale(False)


def raw_copy(variant: str, quick: bool, datadir: str, scratch: str) -> dict:
    import netCDF4

    data = generate.Dataset.load(generate.ensure(_spec(variant, quick), datadir, verbose=False))
    out = _workdir(scratch, variant, "raw-copy")

    def same(var) -> dict:
        filters = var.filters() or {}
        chunking = var.chunking()
        return {"zlib": bool(filters.get("zlib")), "complevel": filters.get("complevel", 4) or 4,
                "shuffle": bool(filters.get("shuffle")), "chunksizes": None if chunking == "contiguous" else chunking}

    os.sync()  # earlier runs' dirty pages are not this run's cost
    t0, c0 = time.perf_counter(), cpu_seconds()
    for src in data.fragments:
        with netCDF4.Dataset(src) as s, netCDF4.Dataset(os.path.join(out, os.path.basename(src)), "w") as d:
            for name, dim in s.dimensions.items():
                d.createDimension(name, None if dim.isunlimited() else len(dim))
            _copy_header(s, d, same)
            for name, var in s.variables.items():
                d[name][...] = var[...]
    os.sync()  # a copy is done when it is on disk
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    peak = _peak()
    nt, ny, nx = data.frag_shape
    with netCDF4.Dataset(os.path.join(out, os.path.basename(data.fragments[-1]))) as d:
        t = np.arange(data.shape[0] - nt, data.shape[0])
        ok = np.array_equal(d["tas"][...], generate.values(*np.ix_(t, np.arange(ny), np.arange(nx)), ny=ny, nx=nx))
    shutil.rmtree(out)
    return {"tool": "raw-copy", "variant": variant, "seconds": seconds, "cpu_seconds": cpu, "ok": bool(ok),
            "nbytes": _nbytes(data), "peak_rss_mb": round(peak / 1e6, 1)}


def memory_loop(variant: str, quick: bool, datadir: str, scratch: str) -> dict:
    """Every file read into one array, then every tile written: serial netCDF4-python, no budget."""
    import netCDF4

    spec = _spec(variant, quick)
    data = generate.Dataset.load(generate.ensure(spec, datadir, verbose=False))
    out = _workdir(scratch, variant, LIMIT)
    nt, ny, nx = data.shape
    shape, compression = _tiles(spec, data.shape)
    tile = shape["lat"]
    os.sync()
    t0, c0 = time.perf_counter(), cpu_seconds()
    whole = np.empty(data.shape, np.float32)
    t = 0
    for src in data.fragments:
        with netCDF4.Dataset(src) as s:
            var = s[generate.VARNAME]
            var.set_auto_maskandscale(False)
            whole[t:t + var.shape[0]] = var[...]
            t += var.shape[0]
    with netCDF4.Dataset(data.fragments[0]) as s:
        for j in range(0, ny, tile):
            for i in range(0, nx, tile):
                with netCDF4.Dataset(os.path.join(out, f"tile_{j}_{i}.nc"), "w") as d:
                    d.createDimension("time", nt)
                    d.createDimension("lat", min(tile, ny - j))
                    d.createDimension("lon", min(tile, nx - i))
                    _copy_header(s, d, lambda var: dict(compression or {}))
                    d["time"][...] = np.arange(nt, dtype=d["time"].dtype)
                    d["lat"][...] = s["lat"][j:j + tile]
                    d["lon"][...] = s["lon"][i:i + tile]
                    d[generate.VARNAME][...] = whole[:, j:j + tile, i:i + tile]
    del whole
    os.sync()
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    peak = _peak()
    ok = True
    for j in range(0, ny, tile):
        for i in range(0, nx, tile):
            with netCDF4.Dataset(os.path.join(out, f"tile_{j}_{i}.nc")) as d:
                want = generate.values(*np.ix_(np.arange(nt), np.arange(j, min(j + tile, ny)),
                                               np.arange(i, min(i + tile, nx))), ny=ny, nx=nx)
                ok &= bool(np.array_equal(d[generate.VARNAME][...], want))
    shutil.rmtree(out)
    return {"tool": LIMIT, "variant": variant, "seconds": seconds, "cpu_seconds": cpu, "ok": ok,
            "nbytes": _nbytes(data), "peak_rss_mb": round(peak / 1e6, 1)}


def _refragment(variant: str, quick: bool, datadir: str, scratch: str, tool: str, client=None) -> dict:
    """One measured ``daskcfa.refragment`` (after a warm-up), on the current scheduler."""
    import daskcfa

    spec = _spec(variant, quick)
    data = generate.Dataset.load(generate.ensure(spec, datadir, verbose=False))
    warm = generate.Dataset.load(generate.ensure(generate.WARMUP_SPEC, scratch, verbose=False))
    out = _workdir(scratch, variant, tool)
    shape, compression = _tiles(spec, data.shape)
    daskcfa.refragment(os.path.join(warm.dir, "frag", "*.nc"), os.path.join(out, "warm.nca"),
                       fragment_shape={"lat": 3, "lon": 4}, max_mem=MAX_MEM, mode="w")
    source = os.path.join(data.dir, "frag", "*.nc")
    plan = daskcfa.plan_refragment(source, fragment_shape=shape, max_mem=MAX_MEM, compression=compression)
    target = os.path.join(out, "tiles.nca")
    memory = None
    if client is not None:
        from daskcfa_testing.memory import WorkerPeakMemory

        memory = WorkerPeakMemory(client).__enter__()
    os.sync()
    t0, c0 = time.perf_counter(), cpu_seconds(client)
    daskcfa.refragment(source, target, fragment_shape=shape, max_mem=MAX_MEM, compression=compression)
    os.sync()
    seconds, cpu = time.perf_counter() - t0, cpu_seconds(client) - c0
    result = {"tool": tool, "variant": variant, "seconds": seconds, "cpu_seconds": cpu, "nbytes": _nbytes(data),
              "plan": str(plan),
              "output_bytes": sum(os.path.getsize(f) for f in glob.glob(os.path.join(out, "tiles", "**", "*.nc"),
                                                                       recursive=True))}
    if memory is not None:
        memory.__exit__(None, None, None)
        growth = sorted(memory.growth.values())
        result.update(worker_growth_mib=[round(g / 2**20, 1) for g in growth],
                      peak_rss_mb=round(max(memory.peak.values()) / 1e6, 1),
                      under_budget=all(g < parse_bytes(MAX_MEM) for g in growth))
    else:
        result["peak_rss_mb"] = round(_peak() / 1e6, 1)
    result["ok"] = _check_tiles(target, data)
    shutil.rmtree(out)
    return result


def daskcfa_threads(variant: str, quick: bool, datadir: str, scratch: str) -> dict:
    return _refragment(variant, quick, datadir, scratch, "daskcfa-threads")


def daskcfa_cluster(variant: str, quick: bool, datadir: str, scratch: str) -> dict:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="2GiB",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.run(lambda: __import__("daskcfa") and None)
        return _refragment(variant, quick, datadir, scratch, "daskcfa", client)


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


TOOLS = {LIMIT: memory_loop, "raw-copy": raw_copy, "daskcfa-threads": daskcfa_threads, "daskcfa": daskcfa_cluster}
DEFAULT_TOOLS = (LIMIT, "daskcfa-threads", "daskcfa")


# ----------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------


def _measure(tool: str, variant: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.refragment", "--run", tool, "--variant", variant,
           "--datadir", args.datadir, "--scratch", args.scratch]
    cmd += ["--quick"] if args.quick else []
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    return {"tool": tool, "variant": variant, "ok": False, "error": (proc.stderr or proc.stdout)[-2000:]}


def _summary(tools: list[str], runs: list[dict[str, dict]]) -> dict:
    """Per tool: times, peak RSS, answers; per daskcfa tool: its time over the limit's, round by round."""
    summary: dict = {}
    for tool in tools:
        mine = [r[tool] for r in runs]
        entry = {"seconds": [round(m["seconds"], 3) for m in mine if "seconds" in m],
                 "cpu_seconds": [round(m["cpu_seconds"], 2) for m in mine if "cpu_seconds" in m],
                 "peak_rss_mb": [m.get("peak_rss_mb") for m in mine],
                 "output_equals_input": [m.get("ok") for m in mine]}
        if tool != LIMIT and LIMIT in tools:
            ratios = [r[tool]["seconds"] / r[LIMIT]["seconds"] for r in runs
                      if r[tool].get("ok") and r[LIMIT].get("ok")]
            entry["ratio_to_limit"] = [round(x, 3) for x in ratios]
            entry["median_ratio_to_limit"] = round(statistics.median(ratios), 3) if ratios else None
            cpu = [r[tool]["cpu_seconds"] / r[LIMIT]["cpu_seconds"] for r in runs
                   if r[tool].get("ok") and r[LIMIT].get("ok")]
            entry["median_cpu_ratio_to_limit"] = round(statistics.median(cpu), 3) if cpu else None
        for key in ("worker_growth_mib", "under_budget", "output_bytes"):
            if any(key in m for m in mine):
                entry[key] = [m.get(key) for m in mine]
        entry["errors"] = [m["error"] for m in mine if "error" in m]
        summary[tool] = entry
    summary["plan"] = next((m.get("plan") for r in runs for m in r.values() if m.get("plan")), None)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", choices=sorted(TOOLS), help="one measured run of TOOL in this process")
    parser.add_argument("--variant", default="zlib", choices=sorted(VARIANTS))
    parser.add_argument("--variants", default="zlib,raw")
    parser.add_argument("--tools", default=",".join(DEFAULT_TOOLS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--datadir", default=generate.DEFAULT_DATADIR, help="where the source datasets are")
    parser.add_argument("--scratch", default=None, help="where outputs and warm-up data go (default: --datadir)")
    args = parser.parse_args(argv)
    args.datadir = os.path.abspath(args.datadir)
    args.scratch = os.path.abspath(args.scratch or args.datadir)
    if args.run:
        print(MARK + json.dumps(TOOLS[args.run](args.variant, args.quick, args.datadir, args.scratch)), flush=True)
        return 0
    tools = args.tools.split(",")
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tools {unknown}; choose from {sorted(TOOLS)}")
    report: dict = {"quick": args.quick, "max_mem": MAX_MEM, "tools": tools, "variants": {}}
    failed = False
    for variant in args.variants.split(","):
        generate.ensure(_spec(variant, args.quick), args.datadir)
        generate.ensure(generate.WARMUP_SPEC, args.scratch, verbose=False)
        runs: list[dict[str, dict]] = []
        for _ in range(args.repeats):  # one run of each tool a round: machine drift hits every tool alike
            runs.append({tool: _measure(tool, variant, args) for tool in tools})
            print(f"[{variant}] " + ", ".join(f"{t} {r.get('seconds', float('nan')):.2f} s "
                                              f"(peak {r.get('peak_rss_mb')} MB)" for t, r in runs[-1].items()),
                  file=sys.stderr, flush=True)
        summary = _summary(tools, runs)
        failed |= any(not m.get("ok") or m.get("under_budget") is False for r in runs for m in r.values())
        report["variants"][variant] = summary
        print(f"\n## {variant}\n{summary['plan']}", flush=True)
        for tool in tools:
            entry = summary[tool]
            ratio = (f"; {entry['ratio_to_limit']} of {LIMIT} (median {entry['median_ratio_to_limit']}, target <= "
                     f"{TARGET_RATIO})" if "ratio_to_limit" in entry else "")
            print(f"{tool}: {entry['seconds']} s{ratio}; CPU {entry['cpu_seconds']} s; peak RSS {entry['peak_rss_mb']} MB (target <= "
                  f"{TARGET_PEAK / 1e6:.0f} MB); output equals input: {entry['output_equals_input']}", flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    name = "refragment.quick.json" if args.quick else "refragment.json"
    with open(os.path.join(RESULTS, name), "w") as f:
        json.dump(report, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
