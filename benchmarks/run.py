"""Run the benchmark scenarios: daskcfa against its peers and the raw limits.

    python -m benchmarks.run --scenario all            # full sizes (~10-15 min)
    python -m benchmarks.run --quick --scenario all    # small smoke test
    python -m benchmarks.run --scenario read-zlib --tools daskcfa,cfdm --repeats 5

Every measured run is a fresh ``python -m benchmarks.tools`` process (see
that module for what is timed). Per tool and scenario: one warm-up run
(discarded; it warms the page cache), then the median of K runs. Tools whose
warm-up is slow get fewer repeats (``--budget``). Answers are checked
against the ground truth written by :mod:`benchmarks.generate`.

Output: a markdown table per scenario on stdout, and JSON in
``benchmarks/results/<scenario>.json`` (``<scenario>.quick.json`` with
``--quick``); the stderr of failed runs goes to ``<scenario>[.quick].raw``.

The ``s3-*`` scenarios need a local S3 server: the run starts one SeaweedFS
server (:mod:`benchmarks.s3`) before the first of them, uploads each dataset
once (untimed), passes the server to the tool processes through the
environment, and stops it at the end.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata

import numpy as np

from benchmarks.measure import TABLE_HEADER, cannot_row, interleaved_runs, repeated_runs, runs_note

from benchmarks import generate
from benchmarks import s3 as s3mod
from benchmarks import write as wmod
from benchmarks.generate import REDUCTIONS, S3_SCENARIOS, Dataset, climatology_summary
from benchmarks.tools import CLIMATOLOGY, REDUCE, SCENARIO_KIND, TOOLS, applicable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")

SCENARIOS = list(SCENARIO_KIND) + list(wmod.SCENARIOS)  # fixed order; writers last
# Run order: raw-bytes first (it pulls every fragment into the page cache);
# raw-s3-cat first on S3 (it reads every object once through the server).
DEFAULT_TOOLS = ["raw-bytes", "raw-s3-cat", "raw-agg", "raw-loop", "raw-s3-serial", "raw-s3-parallel", "daskcfa",
                 "daskcfa-processes", "daskcfa-distributed", "cfdm", "cfapyx",
                 "xarray-mfdataset"]
RAW_LIMIT = {"open": "raw-agg", "read": "raw-loop", "timeseries": "raw-loop",
             **dict.fromkeys(REDUCTIONS, "raw-loop")}
RAW_LIMIT_S3 = {"read": "raw-s3-cat", "timeseries": "raw-s3-parallel",
                **dict.fromkeys(REDUCTIONS, "raw-s3-cat")}
CONTEXT_ONLY = {"raw-bytes", "dask-floor", "dask-floor-masked", "dask-memory", "decode-floor"}
# Run on S3 only when named in --tools (its cluster start-up, ~4 s per process,
# would add ~1.5 min to the S3 scenarios).
S3_OPT_IN = {"daskcfa-distributed"}
WHAT = {
    "open": "open + build the lazy dask array (no data read)",
    "read": "full read + mean over (lat, lon) of every time step",
    "timeseries": "one-point time series x[:, {py}, {px}]",
    "mean": "whole-array mean accumulated in float64, default masking",
    "mean32": "whole-array mean x.mean() (float32 accumulation), default masking",
    "sum": "whole-array sum x.sum() (float32 accumulation), default masking",
    "std": "whole-array standard deviation x.std() (float32, ddof 0), default masking",
    "max": "whole-array maximum x.max(), default masking",
    "climatology": "xarray monthly climatology groupby('time.month').mean(), default masking",
}
# Relative tolerance of a reduction's answer, by the dtype it accumulates in. numpy (and dask
# per chunk) sums float32 pairwise: worst-case error about (128 + log2 N) * 2**-24 of the sum of
# the values' magnitudes (here all positive), 9e-6 for N = 2.6e8; in float64 the same bound
# is 2e-14. A tool that accumulates a float32 operation in float64 passes too.
RTOL = {"f8": 1e-9, "f4": 1e-5}
ACCUMULATES = {"mean": "f8", "mean32": "f4", "sum": "f4", "std": "f4", "climatology": "f4"}
TOOL_LABEL = {
    "raw-agg": "raw: netCDF4 read of the aggregation instructions",
    "raw-loop": "raw: serial netCDF4 loop over the fragments",
    "raw-bytes": "raw: os.read of every fragment file (context)",
    "dask-floor": "dask alone: the same chunks, no I/O (context)",
    "dask-floor-masked": "dask alone: the same chunks as masked arrays, no I/O (context)",
    "dask-memory": "dask alone over daskcfa's chunks read before the clock, no I/O (context)",
    "decode-floor": "pread (S3: GET, 4 threads) (+ ISA-L inflate) + sum, nothing else (context; masked data: + the fill test)",
    "raw-s3-cat": "raw: parallel s3fs cat of every fragment object",
    "raw-s3-serial": "raw: serial S3 download + netCDF4 decode loop",
    "raw-s3-serial-one-get": "raw: the same loop, one GET per object (no s3fs HEAD)",
    "raw-s3-parallel": "raw: parallel s3fs cat of every object, then serial netCDF4 decode from memory",
    "daskcfa-indexed": "daskcfa with the chunk index (daskcfa.index)",
    "daskcfa": "daskcfa (threads)",
    "daskcfa-processes": "daskcfa (scheduler='processes')",
    "daskcfa-distributed": "daskcfa (distributed LocalCluster 2x1)",
    "daskcfa-merged": "daskcfa, chunks='256MiB' (fragments merged)",
    "cfdm": "cfdm",
    "cfapyx": "cfapyx (xarray engine 'CFA')",
    "xarray-mfdataset": "xarray.open_mfdataset",
}
VERSIONED = ["daskcfa", "cfdm", "cfapyx", "xarray", "dask", "distributed", "netCDF4",
             "h5py", "h5netcdf", "numpy"]


def raw_limit(scenario: str) -> str:
    kind = SCENARIO_KIND[scenario]
    return (RAW_LIMIT_S3 if scenario in S3_SCENARIOS else RAW_LIMIT)[kind]


def is_context(tool: str, scenario: str) -> bool:
    """Shown for context only (not a tool a user would compute with, nor the limit)."""
    if tool in CONTEXT_ONLY:
        return True
    return tool == "raw-s3-cat" and raw_limit(scenario) != tool


# Strings never written to results or logs (the S3 server's credentials).
_REDACT: list[str] = []


# ----------------------------------------------------------------------------
# One run in a fresh process
# ----------------------------------------------------------------------------
def run_once(tool, scenario, dsdir, warm_dir, timeout, raw_log, strace_to=None, probe=True,
             extra_env=None):
    cmd = [sys.executable, "-m", "benchmarks.tools", tool, scenario, dsdir]
    if warm_dir:
        cmd.append(f"--warm={warm_dir}")
    if not probe:
        cmd.append("--no-probe")
    if strace_to:
        cmd = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", strace_to] + cmd
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.update(extra_env or {})
    try:
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        _log(raw_log, tool, "timeout", e.stderr)
        return {"status": "cannot", "reason": f"timeout after {timeout:.0f} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("@@RESULT@@ "):
            res = json.loads(line[len("@@RESULT@@ "):])
            if res.get("status") != "ok":
                _log(raw_log, tool, res.get("reason"), (res.get("traceback") or "") + p.stderr)
            return res
    sig = f"signal {-p.returncode}" if p.returncode < 0 else f"exit code {p.returncode}"
    _log(raw_log, tool, f"crashed ({sig})", p.stdout[-3000:] + p.stderr)
    return {"status": "cannot", "reason": f"crashed ({sig})"}


def _log(raw_log, tool, what, text):
    if not raw_log:
        return
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    for secret in _REDACT:
        text = (text or "").replace(secret, "<redacted>")
        what = str(what).replace(secret, "<redacted>")
    with open(raw_log, "a") as f:
        f.write(f"===== {time.strftime('%H:%M:%S')} {tool}: {what}\n{(text or '')[-6000:]}\n")


_OPEN_RE = re.compile(r'open(?:at2?)?\((?:[^,]*, )?"([^"]+)"')


def count_fragment_opens(tool, scenario, ds, warm_dir, timeout, raw_log):
    """Distinct fragment files (and total open syscalls) seen by strace in one
    untimed run. netCDF-C opens a file 3 times (format sniffing, then HDF5),
    so 3 opens per file is what plain netCDF4-python does."""
    if not shutil.which("strace"):
        return None
    with tempfile.NamedTemporaryFile(suffix=".strace", delete=False) as f:
        trace = f.name
    try:
        # No warm-up run here, so every fragment path seen belongs to ``ds``
        # (some tools open them by relative path).
        res = run_once(tool, scenario, ds.dir, None, timeout, raw_log,
                       strace_to=trace, probe=False)
        if res.get("status") != "ok":
            return None
        frag = re.compile(r"(?:^|/)" + re.escape(generate.FRAG_DIR) + r"/[^/]+\.nc$")
        paths = []
        with open(trace, errors="replace") as fh:
            for line in fh:
                m = _OPEN_RE.search(line)
                if m and frag.search(m.group(1)):
                    paths.append(os.path.basename(m.group(1)))
        return {"distinct": len(set(paths)), "opens": len(paths), "fragments": ds.nfrag}
    finally:
        os.unlink(trace)


# ----------------------------------------------------------------------------
# Checks against the ground truth
# ----------------------------------------------------------------------------
def check(tool, kind, ds: Dataset, res: dict) -> tuple[bool, str, list[str]]:
    """Return (correct, detail, notes)."""
    r = res.get("result", {})
    notes = []
    if tool in ("raw-bytes", "raw-s3-cat"):
        ok = r.get("bytes") == ds.params["fragment_bytes"]
        detail = f"{r.get('bytes', 0) / 1e9:.3f} GB"
        return ok, (f"ok ({detail})" if ok and tool == "raw-s3-cat" else detail), notes
    if tool in ("dask-floor", "dask-floor-masked"):
        return True, "context (no I/O: not an answer)", notes
    dtype = r.get("dtype")
    if dtype and dtype != "float32":
        notes.append(f"returns {dtype}")
    if kind == "open":
        if r.get("shape") != list(ds.shape):
            return False, f"shape {r.get('shape')} != {list(ds.shape)}", notes
        if "numblocks" not in r:
            notes.append("no dask array")
        elif r.get("fragment_chunks") is False:
            notes.append(f"chunks not per fragment (numblocks {r['numblocks']})")
        if r.get("note"):
            notes.append(r["note"])
        if "probe" in r:
            t, y, x = ds.shape[0] - 1, 1, 2
            want = ds.value(t, y, x)
            if np.float32(r["probe"]) != np.float32(want):
                return False, f"x[{t},{y},{x}] = {r['probe']} != {want}", notes
        return True, "ok", notes
    if kind in REDUCE:
        truth = ds.reductions()["mean" if kind == "mean32" else kind]
        return check_reduction(kind, r.get("value"), truth, notes)
    if kind == CLIMATOLOGY:
        truth = ds.reductions()
        return check_climatology(r, climatology_summary(truth["clim_months"],
                                                        truth["climatology"]), notes)
    if kind == "read":
        got = np.asarray(r.get("spatial_mean", []), dtype=np.float64)
        want = ds.spatial_mean()
        if got.shape != want.shape:
            return False, f"{got.size} values, want {want.size}", notes
        err = float(np.max(np.abs(got - want)))
        if not err <= 1e-3:  # K; consecutive time steps differ by >= 0.01 K on average
            bad = int(np.sum(np.abs(got - want) > 1e-3))
            return False, f"{bad} of {want.size} means wrong (max error {err:.3g})", notes
        return True, f"ok (mean {got.mean():.6f}, max err {err:.1g})", notes
    got = np.asarray(r.get("series", []))
    want = ds.timeseries()
    if got.shape != want.shape:
        return False, f"{got.size} values, want {want.size}", notes
    bad = int(np.sum(got.astype(np.float32) != want))
    if bad:
        return False, f"{bad} of {want.size} values wrong", notes
    return True, "ok (exact)", notes


def check_reduction(kind, got, want, notes) -> tuple[bool, str, list[str]]:
    """A whole-array reduction: the maximum exactly (as float32), the others within
    :data:`RTOL` of the float64 truth."""
    want = float(want)
    if got is None:
        return False, "no answer", notes
    if kind == "max":
        ok = bool(np.float32(got) == np.float32(want))
        return ok, (f"ok (max {got!r}, exact)" if ok else f"max {got!r} != {want!r}"), notes
    err = abs(got - want) / abs(want)
    tol = RTOL[ACCUMULATES[kind]]
    if not err <= tol:
        return False, f"{kind} {got!r} != {want:.9g} (relative error {err:.1g} > {tol:g})", notes
    return True, f"ok ({kind} {got:.9g}, relative err {err:.1g})", notes


def check_climatology(r, want, notes) -> tuple[bool, str, list[str]]:
    """The months, each month's mean over the grid and the probe points' values, within the
    float32 :data:`RTOL`; undefined (NaN or masked) exactly where the truth is."""
    if r.get("months") != want["months"]:
        return False, f"months {r.get('months')} != {want['months']}", notes
    if r.get("shape") != want["shape"]:
        return False, f"shape {r.get('shape')} != {want['shape']}", notes
    if r.get("undefined") != want["undefined"]:
        return False, f"{r.get('undefined')} undefined values, want {want['undefined']}", notes
    got = np.array([r["month_mean"]] + r["points"], dtype=np.float64)
    ref = np.array([want["month_mean"]] + want["points"], dtype=np.float64)
    if not np.allclose(got, ref, rtol=RTOL["f4"], atol=0, equal_nan=True):
        err = float(np.nanmax(np.abs(got - ref) / np.abs(ref)))
        return False, f"climatology wrong (relative error up to {err:.1g})", notes
    err = float(np.nanmax(np.abs(got - ref) / np.abs(ref)))
    return True, (f"ok ({len(want['months'])} months, grid mean {np.mean(got[0]):.6f}, "
                  f"relative err {err:.1g})"), notes


# ----------------------------------------------------------------------------
# One scenario
# ----------------------------------------------------------------------------
def describe_dataset(kind, ds: Dataset, scenario: str = "") -> str:
    p = ds.params
    comp = f"zlib level {p['complevel']}" if p["zlib"] else "uncompressed"
    chunks = "contiguous" if p["chunks"] is None else f"HDF5 chunks {tuple(p['chunks'])}"
    what = WHAT[kind].format(py=ds.point[0], px=ds.point[1])
    where = ("fragment objects on a local S3 server (SeaweedFS, loopback)"
             if scenario in S3_SCENARIOS else "fragment files")
    miss = (f", {p['missing']:.0%} of the elements missing (_FillValue {p['fill_value']:g})"
            if p.get("missing") else "")
    return (f"{what}; {ds.nfrag} fragments {tuple(ds.frag_shape)} -> {tuple(ds.shape)} float32 "
            f"= {np.prod(ds.shape) * 4 / 1e9:.3f} GB{miss}, {comp}, {chunks}; {where} "
            f"{p['fragment_bytes'] / 1e9:.3f} GB")


def run_scenario(scenario, args, warm_dir, stage=None):
    kind = SCENARIO_KIND[scenario]
    spec = generate.spec_for(scenario, args.quick)
    ds = generate.at_scenario_point(Dataset.load(generate.ensure(spec, args.datadir)), scenario)
    suffix = ".quick" if args.quick else ""
    raw_log = os.path.join(RESULTS, f"{scenario}{suffix}.raw")
    if os.path.exists(raw_log):
        os.unlink(raw_log)
    tools = [t for t in args.tools if applicable(t, scenario)]
    on_s3 = scenario in S3_SCENARIOS
    if on_s3 and not args.tools_given:
        tools = [t for t in tools if t not in S3_OPT_IN]
    budget = args.s3_budget if on_s3 else args.budget
    print(f"\n### {scenario}\n\n{describe_dataset(kind, ds, scenario)}\n", flush=True)
    t_scen = time.perf_counter()
    s3_info, extra_env = None, None
    if on_s3:  # untimed, once per run per dataset
        s3_info = {"upload": stage.upload(ds.dir), "fragment_bytes": ds.params["fragment_bytes"]}
        stage.upload(warm_dir)
        if kind == "timeseries":
            s3_info["point_chunks"] = s3mod.point_chunk_bytes(ds)
        extra_env = stage.env()

    def once(tool):
        return run_once(tool, scenario, ds.dir, warm_dir, args.timeout, raw_log,
                        extra_env=extra_env)

    out = {}
    interleaved = interleaved_runs({t: functools.partial(once, t) for t in tools}, args.repeats, budget) \
        if args.interleave else {}
    for tool in tools:
        t_tool = time.perf_counter()
        rec = {"label": TOOL_LABEL.get(tool, tool)}
        warm, runs, reason = interleaved[tool] if args.interleave else \
            repeated_runs(lambda: once(tool), args.repeats, budget)
        if reason is not None:
            rec.update(status="cannot", reason=reason)
        else:
            verdicts = [check(tool, kind, ds, r) for r in [warm] + runs]
            ok = all(v[0] for v in verdicts)
            bad = next((v for v in verdicts if not v[0]), verdicts[0])
            times = [r["seconds"] for r in runs]
            rec.update(
                status="ok" if ok else "wrong",
                check=bad[1], notes=bad[2], times=times,
                warmup_seconds=warm["seconds"], median=statistics.median(times),
                setup_seconds=statistics.median(r.get("setup_seconds", 0) for r in runs),
                maxrss_mb=max(r.get("maxrss_mb", 0) for r in runs),
                cpu_median=statistics.median(r.get("cpu_seconds", 0) for r in runs),
            )
            for r in runs:
                if r.get("warmup_error"):
                    rec["notes"].append("warm-up on the tiny dataset failed: "
                                        + r["warmup_error"])
                    break
            traffic = [r.get("s3_traffic") for r in runs]
            if on_s3 and all(traffic):
                rec["s3_traffic"] = {
                    "bytes": int(statistics.median(t["bytes"] for t in traffic)),
                    "requests": int(statistics.median(t["requests"] for t in traffic)),
                    "by_type": traffic[0]["by_type"], "runs": traffic}
            if tool in args.count_tools and not args.no_count and not on_s3:
                rec["fragment_opens"] = count_fragment_opens(
                    tool, scenario, ds, warm_dir, args.timeout, raw_log)
        rec["wall_seconds"] = time.perf_counter() - t_tool
        out[tool] = rec
        print(f"  {tool:20s} {_fmt_status(rec)}  [{rec['wall_seconds']:.1f} s wall]",
              file=sys.stderr, flush=True)
    # Ratios.
    raw = out.get(raw_limit(scenario), {})
    raw_t = raw.get("median") if raw.get("status") == "ok" else None
    dc = out.get("daskcfa", {})
    dc_t = dc.get("median") if dc.get("status") == "ok" else None
    for tool, rec in out.items():
        if rec.get("status") != "ok":
            continue
        rec["x_raw_limit"] = rec["median"] / raw_t if raw_t else None
        rec["daskcfa_over_tool"] = dc_t / rec["median"] if dc_t else None
    table = render_table(scenario, kind, ds, out, s3_info)
    print(table, flush=True)
    doc = {
        "scenario": scenario, "kind": kind, "quick": args.quick,
        "description": describe_dataset(kind, ds, scenario),
        "dataset": {k: v for k, v in ds.params.items() if k != "fragments"},
        "raw_limit": raw_limit(scenario), "repeats": args.repeats, "budget": budget,
        "interleaved": args.interleave,
        "s3": s3_info,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info(),
        "wall_seconds": time.perf_counter() - t_scen, "tools": out, "table": table,
    }
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{scenario}{suffix}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return doc


def _fmt_status(rec):
    if rec["status"] == "ok":
        return f"{rec['median']:.4f} s"
    if rec["status"] == "wrong":
        return f"WRONG ANSWER {rec['check']} ({rec['median']:.4f} s)"
    return f"cannot do this ({rec['reason']})"


def _fmt_s(t):
    return f"{t:.3g}" if t >= 0.001 else f"{t * 1e3:.2g} ms"


def _traffic_note(rec, s3_info) -> str | None:
    tr = rec.get("s3_traffic")
    if not tr or not s3_info:
        return None
    note = f"fetched {tr['bytes'] / 1e6:.3g} MB in {tr['requests']} requests"
    ref = s3_info.get("point_chunks") or {"bytes": s3_info["fragment_bytes"]}
    what = "the chunks holding the point" if "point_chunks" in s3_info else "the fragment objects"
    if ref["bytes"]:
        note += f" ({tr['bytes'] / ref['bytes']:.3g}x {what})"
    return note


def render_table(scenario, kind, ds, out, s3_info=None) -> str:
    limit = raw_limit(scenario)
    raw = out.get(limit, {})
    lines = list(TABLE_HEADER)
    for tool, rec in out.items():
        label = rec["label"]
        if rec["status"] == "cannot":
            lines.append(cannot_row(label, rec["reason"]))
            continue
        notes = list(rec.get("notes", []))
        notes.append(runs_note(rec["times"], _fmt_s))
        tn = _traffic_note(rec, s3_info)
        if tn:
            notes.append(tn)
        fo = rec.get("fragment_opens")
        if fo:
            notes.append(f"opened {fo['distinct']} of {fo['fragments']} fragment files "
                         f"({fo['opens']} opens)")
        notes.append(f"RSS {rec['maxrss_mb']:.0f} MB")
        if rec.get("cpu_median"):
            notes.append(f"CPU {_fmt_s(rec['cpu_median'])} s (median, this process)")
        xr_ = rec.get("x_raw_limit")
        dr = rec.get("daskcfa_over_tool")
        answer = rec["check"] if rec["status"] == "ok" else f"**wrong answer**: {rec['check']}"
        if is_context(tool, scenario):
            answer = f"context: {rec['check']}"
        lines.append(
            f"| {label} | {_fmt_s(rec['median'])} | {f'{xr_:.2f}x' if xr_ else '-'} | "
            f"{f'{dr:.3g}' if dr and tool != 'daskcfa' else '-'} | {answer} | "
            f"{'; '.join(notes)} |")
    raw_desc = (f"raw limit = {raw.get('label', limit)}: "
                f"{_fmt_s(raw['median'])} s" if raw.get("status") == "ok" else "raw limit: n/a")
    bytes_desc = ""
    if s3_info:
        bytes_desc = (f" Bytes fetched = the S3 server's own counter of response bytes for the "
                      f"bucket during the timed part (median run); fragment objects "
                      f"{s3_info['fragment_bytes'] / 1e6:.4g} MB")
        pc = s3_info.get("point_chunks")
        if pc:
            bytes_desc += (f", HDF5 chunks holding the point {pc['bytes'] / 1e6:.4g} MB "
                           f"({pc['chunks']} chunks; h5py get_chunk_info_by_coord)")
        bytes_desc += "."
    return (f"{raw_desc}. `x raw limit` = tool time / raw limit (lower is better); "
            f"`daskcfa / tool` = daskcfa time / tool time (< 1: daskcfa faster).{bytes_desc}\n\n"
            + "\n".join(lines) + "\n")


def machine_info():
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions}


def select_scenarios(patterns: list[str], known: list[str]) -> list[str]:
    """The scenarios of ``known`` that ``patterns`` name (shell-style, e.g. ``'std-*'``; ``all``:
    every one), in the patterns' order, each once."""
    chosen: list[str] = []
    for pattern in (["*"] if "all" in patterns else patterns):
        match = [s for s in known if fnmatch.fnmatchcase(s, pattern)]
        if not match:
            raise ValueError(f"unknown scenario {pattern!r}; choose from {', '.join(known)}")
        chosen += [s for s in match if s not in chosen]
    return chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", action="append",
                   help=f"scenario to run (repeatable; shell-style patterns such as 'std-*' "
                   f"or '*-missing' select several): {', '.join(SCENARIOS)}, or all")
    p.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    p.add_argument("--repeats", type=int, help="measured runs per tool after the warm-up "
                   "(default 3; 1 with --quick)")
    p.add_argument("--tools", help=f"comma-separated subset of: {', '.join(DEFAULT_TOOLS)} "
                   f"(default all that apply; on S3 without {', '.join(sorted(S3_OPT_IN))}); "
                   f"write scenarios: {', '.join(wmod.TOOL_NAMES)}")
    p.add_argument("--datadir", default=generate.DEFAULT_DATADIR)
    p.add_argument("--budget", type=float, default=40.0,
                   help="max seconds of measured runs per tool (fewer repeats for slow "
                   "tools; at least one); default 40")
    p.add_argument("--s3-budget", type=float, default=15.0,
                   help="the same for the s3-* scenarios; default 15")
    p.add_argument("--timeout", type=float, help="seconds per run (default 600; 120 quick)")
    p.add_argument("--interleave", action="store_true",
                   help="take the tools' measured runs in rounds (one run of each tool a round) "
                   "instead of one tool after another: a machine whose speed drifts then slows "
                   "every tool alike (read scenarios; [N s wall] then counts only the tool's own "
                   "counting run)")
    p.add_argument("--count-tools", default="daskcfa",
                   help="tools whose fragment-file opens are counted with strace in one "
                   "extra untimed run (default daskcfa)")
    p.add_argument("--no-count", action="store_true", help="skip the strace counting run")
    a = p.parse_args(argv)
    if not a.scenario:
        p.error("give --scenario NAME (repeatable) or --scenario all")
    try:
        scenarios = select_scenarios(a.scenario, SCENARIOS)
    except ValueError as e:
        p.error(str(e))
    a.tools_given = bool(a.tools)
    a.tools = DEFAULT_TOOLS if not a.tools else [t.strip() for t in a.tools.split(",")]
    for t in a.tools:
        if t not in TOOLS and t not in wmod.TOOL_NAMES:
            p.error(f"unknown tool {t!r}; choose from {', '.join(dict.fromkeys([*TOOLS, *wmod.TOOL_NAMES]))}")
    a.count_tools = [t.strip() for t in a.count_tools.split(",") if t.strip()]
    if a.repeats is None:
        a.repeats = 1 if a.quick else 3
    if a.timeout is None:
        a.timeout = 120.0 if a.quick else 600.0
    t0 = time.perf_counter()
    warm_dir = generate.ensure(generate.WARMUP_SPEC, a.datadir)
    for s in scenarios:  # generate everything first (not timed); writers need nothing
        if s in SCENARIO_KIND:
            generate.ensure(generate.spec_for(s, a.quick), a.datadir)
    t_gen = time.perf_counter() - t0
    mi = machine_info()
    print(f"# daskcfa benchmarks{' (--quick)' if a.quick else ''}\n\n"
          f"{mi['cpus']} CPUs, Python {mi['python']}; "
          + ", ".join(f"{k} {v}" for k, v in mi["versions"].items() if v)
          + f". Warm-up run + median of up to {a.repeats} fresh-process runs per tool.",
          flush=True)
    stage = None
    try:
        for s in scenarios:
            if (s in S3_SCENARIOS or s in wmod.S3_SCENARIOS) and stage is None:
                stage = s3mod.Stage().__enter__()
                _REDACT.extend(stage.secrets)
            if s in wmod.SCENARIOS:
                wmod.run_scenario(s, a, stage, machine=mi)
            else:
                run_scenario(s, a, warm_dir, stage)
    finally:
        if stage is not None:
            stage.__exit__(None, None, None)
    print(f"\nTotal wall time {time.perf_counter() - t0:.0f} s "
          f"(data generation/check {t_gen:.0f} s).", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
