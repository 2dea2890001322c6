"""CPU seconds of one run of tools on full-size datasets, per reduction: the work each does.

    python -m benchmarks.cpu_cost --op std,max --dataset n100_f10x512x512_raw_contig_miss5 \
        [--tools raw-loop,daskcfa] [--datadir DIR]

``time.process_time`` (every thread of the process) around the tool's timed part, best of 2
after a warm-up, all in this one process (the fragments in the page cache): a measure that
other work on a shared machine distorts much less than the wall time ``benchmarks.run``
reports, though it shows neither parallelism nor waiting. Local datasets only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks import generate
from benchmarks.tools import TOOLS


def cpu_seconds(run, repeats: int = 2) -> float:
    """The least CPU time of ``repeats`` calls of ``run`` after one untimed call."""
    run()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        run()
        best = min(best, time.process_time() - t0)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True, help=f"comma-separated: {', '.join(generate.REDUCTIONS)}")
    p.add_argument("--dataset", action="append", required=True, help="directory name under --datadir")
    p.add_argument("--tools", default="raw-loop,daskcfa")
    p.add_argument("--datadir", default=generate.DEFAULT_DATADIR)
    a = p.parse_args(argv)
    cwd = os.getcwd()
    for name in a.dataset:
        ds = generate.Dataset.load(os.path.join(a.datadir, name))
        for op in a.op.split(","):
            row = {}
            for tool in a.tools.split(","):
                run, _, _ = TOOLS[tool](op, ds)
                row[tool] = cpu_seconds(run)
                os.chdir(cwd)  # (some tools change the working directory)
            print(f"{name} {op}: " + ", ".join(f"{t} {s:.2f} s" for t, s in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
