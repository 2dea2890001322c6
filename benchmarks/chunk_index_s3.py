"""A point time series on the S3 test server, with and without the chunk index (issue #17's S3 target).

    python -m benchmarks.chunk_index_s3 [--fragments 10] [--steps 100] [--repeats 3]

Data, written by ``daskcfa.to_cfa`` straight to a SeaweedFS server started
here: ``--fragments`` fragments of ``(--steps, 500, 500)`` float32 (100 MB
each at 100 steps), zlib level 1, HDF5 chunks ``(steps, 50, 50)`` (so a point
series is one chunk of each fragment); values from
:func:`benchmarks.generate.values`. ``daskcfa.index`` writes the chunk index,
untimed. Each measured run is a fresh process reading ``x[:, 123, 321]``
(the clock starts after the imports: daskcfa's modules, s3fs, and
``distributed``, which dask imports at a process's first ``compute`` when it
is installed; the clock includes the first connection to the server):

* ``daskcfa``: ``from_cfa(..., chunk_index=False)`` (HDF5 metadata by ranged GETs);
* ``daskcfa+index``: ``from_cfa(..., chunk_index=True)`` (no HDF5 metadata).

Reported: the median seconds of ``--repeats`` runs after a warm-up, the ratio
of the two, and the server's requests per run by type (its Prometheus
counters), which for the index should be one GET per fragment. Every answer
is checked against the generating function.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

POINT = (123, 321)
NY = NX = 500


def _run(url: str, options: dict, use_index: bool, steps: int, fragments: int) -> None:
    """One measured run (in its own process): print seconds as JSON."""
    import importlib.util

    import s3fs  # noqa: F401  (imports are not the read: s3fs and aiobotocore, imported by the first S3 access,
    import daskcfa  # dask.array, netCDF4, h5py, and distributed, which dask imports at the first compute
    import daskcfa.api  # noqa: F401  wherever it is installed, come before the clock)
    from benchmarks import generate

    if importlib.util.find_spec("distributed"):
        import distributed  # noqa: F401

    t0 = time.perf_counter()
    got = daskcfa.from_cfa(url, "tas", storage_options=options, chunk_index=use_index)[:, POINT[0], POINT[1]].compute()
    seconds = time.perf_counter() - t0
    truth = generate.values(np.arange(steps * fragments), POINT[0], POINT[1], NY, NX)
    np.testing.assert_array_equal(np.ma.getdata(got), truth)
    print(json.dumps({"seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fragments", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run", choices=["index", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _run(args.url, json.loads(os.environ["DASKCFA_BENCH_OPTIONS"]), args.run == "index", args.steps,
             args.fragments)
        return

    import dask.array as da

    import daskcfa
    from benchmarks import generate
    from benchmarks.s3 import Stage, scrape, traffic_delta

    with Stage() as stage:
        target = stage.target
        options = target.storage_options
        url = f"s3://{target.bucket}/point/tas.nc"
        shape = (args.steps * args.fragments, NY, NX)
        def block(block_info=None):
            where = [np.arange(a, b) for a, b in block_info[None]["array-location"]]
            return generate.values(*np.ix_(*where), NY, NX)

        x = da.map_blocks(block, dtype="f4", chunks=((args.steps,) * args.fragments, (NY,), (NX,)))
        t0 = time.perf_counter()
        daskcfa.to_cfa(x, url, variable="tas", dims=("time", "lat", "lon"), fragment_shape=(args.steps, NY, NX),
                       compression={"zlib": True, "complevel": 1, "chunksizes": (args.steps, 50, 50)},
                       storage_options=options)
        written = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = daskcfa.index(url, storage_options=options)
        print(f"wrote {args.fragments} fragments of {shape[1:]} x {args.steps} in {written:.1f} s; "
              f"index: {report} in {time.perf_counter() - t0:.1f} s", flush=True)
        env = {**os.environ, "DASKCFA_BENCH_OPTIONS": json.dumps(options)}
        results: dict[str, list[float]] = {"plain": [], "index": []}
        traffic: dict[str, dict | None] = {}
        for repeat in range(args.repeats + 1):  # (the first round warms the page cache and the server)
            for tool in ("plain", "index"):
                before = scrape(target.metrics_url, target.bucket)
                done = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "benchmarks.chunk_index_s3", "--run", tool, "--url", url,
                                       "--steps", str(args.steps), "--fragments", str(args.fragments)],
                                      env=env, capture_output=True, text=True)
                if done.returncode:
                    raise RuntimeError(f"{tool} run failed (exit {done.returncode}): {done.stderr[-3000:]}")
                traffic[tool] = traffic_delta(before, scrape(target.metrics_url, target.bucket))
                if repeat:
                    results[tool].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
        plain, indexed = (statistics.median(results[t]) for t in ("plain", "index"))
        for name, seconds, tool in (("daskcfa", plain, "plain"), ("daskcfa+index", indexed, "index")):
            print(f"{name:14s} {seconds:7.3f} s (median of {args.repeats})  requests per run: "
                  f"{(traffic[tool] or {}).get('by_type')}")
        print(f"with the index: {indexed / plain:.2f}x the time without it; "
              f"{args.fragments} fragments")


if __name__ == "__main__":
    main()
