"""Read-ahead: a one-point time series through small remote objects, with and without it.

On a real object store every GET waits tens of milliseconds for its first
byte, so a time series through many small fragments is bound by how many
requests are in flight. The loopback S3 server answers in about a
millisecond and hides that; here the fragments are served by the test HTTP
server (:class:`daskcfa_testing.servers.HTTPServer`) with a fixed
``latency`` added to every response.

    python -m benchmarks.readahead [--latency 0.02] [--latency 0] [--steps 300] [--repeats 3]

Data: the ``timeseries`` dataset of :mod:`benchmarks.generate` (1,000 zlib
fragments of (1, 180, 360) float32, 0.2 MB each); the series is
``x[:steps, 90, 180]``. Tools, each in its own fresh process, alternating:

* ``raw-serial``: a serial loop that GETs each fragment object (fsspec HTTP)
  and decodes the point with netCDF4 from memory: the limit for one thread.
* ``daskcfa readahead=0``: ``from_cfa`` with read-ahead off (dask threads).
* ``daskcfa readahead=8``: the default.

Every answer is checked against :func:`benchmarks.generate.values`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

from benchmarks import generate

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
POINT = (90, 180)

CHILD = r"""
import json, sys, time
import numpy as np
tool, base, steps, py, px = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if tool == "raw-serial":
    import fsspec, netCDF4
    fs = fsspec.filesystem("http")
    names = json.loads(sys.argv[6])
    fs.cat_file(base + "/frag/" + names[0])  # warm-up: connection, imports
    t = time.perf_counter()
    out = []
    for name in names[:steps]:
        with netCDF4.Dataset("mem", memory=fs.cat_file(base + "/frag/" + name)) as ds:
            out.append(ds["tas"][0, py, px])
    seconds = time.perf_counter() - t
    got = np.array(out, "f4")
else:
    import dask, daskcfa
    depth = int(tool.rpartition("=")[2])
    with dask.config.set({"daskcfa.io.readahead": depth}):
        x = daskcfa.from_cfa(base + "/aggregation.nc", "tas")
        x[-2:, 0, 0].compute()  # warm-up: connection, imports (other fragments than measured)
        t = time.perf_counter()
        got = np.ma.getdata(x[:steps, py, px].compute())
        seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "values": np.asarray(got, "f8").tolist()}))
"""

TOOLS = ["raw-serial", "daskcfa readahead=0", "daskcfa readahead=8"]


def run_once(tool: str, base: str, steps: int, names: list[str]) -> dict:
    cmd = [sys.executable, "-c", CHILD, tool, base, str(steps), *map(str, POINT), json.dumps(names)]
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS="ignore")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, action="append", help="seconds per response (repeatable)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    latencies = args.latency or [0.02, 0.0]

    from daskcfa_testing.servers import HTTPServer

    data = generate.Dataset.load(generate.ensure(generate.spec_for("timeseries", False)))
    names = sorted(os.listdir(os.path.join(data.dir, "frag")))
    want = generate.values(np.arange(args.steps), POINT[0], POINT[1], ny=data.shape[1], nx=data.shape[2])
    results = []
    for latency in latencies:
        server = HTTPServer(data.dir, latency=latency).start()
        try:
            times: dict[str, list[float]] = {tool: [] for tool in TOOLS}
            for _ in range(args.repeats):
                for tool in TOOLS:
                    res = run_once(tool, server.url, args.steps, names)
                    if not np.array_equal(np.asarray(res["values"], "f4"), want):
                        raise SystemExit(f"{tool}: wrong answer")
                    times[tool].append(res["seconds"])
        finally:
            server.stop()
        raw = statistics.median(times["raw-serial"])
        print(f"\n### latency {latency * 1000:.0f} ms per response, x[:{args.steps}, {POINT[0]}, {POINT[1]}]\n")
        print("| tool | seconds (median) | x raw serial | runs |\n|---|---|---|---|")
        for tool in TOOLS:
            median = statistics.median(times[tool])
            print(f"| {tool} | {median:.2f} | {median / raw:.2f}x | {', '.join(f'{t:.2f}' for t in times[tool])} |")
            results.append({"latency": latency, "tool": tool, "seconds": times[tool], "ratio": median / raw})
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "readahead.json"), "w") as f:
        json.dump({"steps": args.steps, "point": POINT, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
