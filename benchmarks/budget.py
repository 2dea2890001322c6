"""File-handle budget cost: a full read of 1,000 fragments with and without a budget.

Each configuration runs in its own fresh process (budgets are per process),
alternating, after a warm-up; the median of the repeats is reported with the
ratio budget / no budget. Uses the ``timeseries`` dataset of ``benchmarks.generate``
(1,000 zlib fragments of (1, 180, 360) float32).

    python -m benchmarks.budget [--repeats 5] [--filehandles 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.generate import DEFAULT_DATADIR, dataset_dir, ensure, spec_for

CHILD = """
import json, os, sys, time
import dask, daskcfa
path, handles = sys.argv[1], int(sys.argv[2])
with dask.config.set({"daskcfa.budget.filehandles": handles}):
    x = daskcfa.from_cfa(path, "tas")
    x[:20].mean().compute()  # warm-up (imports, page cache)
    daskcfa.fragments.manager.manager().close_all()
    t = time.perf_counter()
    value = float(x.mean().compute())
    elapsed = time.perf_counter() - t
    print(json.dumps({"seconds": elapsed, "mean": value, "stats": daskcfa.fragment_stats()}))
"""


def run_once(path: str, handles: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, path, str(handles)], check=True, capture_output=True,
                         text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--filehandles", type=int, default=16)
    parser.add_argument("--datadir", default=DEFAULT_DATADIR)
    args = parser.parse_args()
    spec = spec_for("timeseries")
    ensure(spec, args.datadir)
    path = os.path.join(dataset_dir(spec, args.datadir), "aggregation.nc")
    runs: dict[str, list[dict]] = {"budget": [], "none": []}
    for _ in range(args.repeats):
        runs["budget"].append(run_once(path, args.filehandles))
        runs["none"].append(run_once(path, 1_000_000))
    budget = statistics.median(r["seconds"] for r in runs["budget"])
    none = statistics.median(r["seconds"] for r in runs["none"])
    peak = max(r["stats"]["peak_files"] for r in runs["budget"])
    print(f"full read + mean of 1,000 fragments ({args.repeats} runs each, medians)")
    print(f"| budget | seconds | ratio | peak open fragment files |")
    print(f"|---|---|---|---|")
    print(f"| filehandles={args.filehandles} | {budget:.3f} | {budget / none:.3f} | {peak} |")
    print(f"| no budget | {none:.3f} | 1.000 | {max(r['stats']['peak_files'] for r in runs['none'])} |")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "budget.json"), "w") as f:
        json.dump({"when": time.strftime("%Y-%m-%d %H:%M"), "runs": runs, "ratio": budget / none}, f, indent=1)


if __name__ == "__main__":
    main()
