"""Fixity check throughput: ``verify_fixity`` against ``cat`` of the same objects.

    python -m benchmarks.fixity [--data benchmarks/data/n100_f10x512x512_zlib1_c1x512x512] [--repeats 7] [--s3]

The dataset (written by :mod:`benchmarks.generate`, read only) is given an
aggregation file with absolute fragment URIs in a scratch directory
(``relocate(..., uris="absolute")``) and checksums there (``record_fixity``,
untimed), so the dataset directory is never written. Then, alternating
(A B A B ...), each timed from outside or inside as said:

* ``verify_fixity`` in this process (imports and a first check done before the clock);
* ``daskcfa verify --fixity`` as a fresh process (whole process: imports included);
* ``cat <every fragment> > /dev/null`` as a fresh process: the bytes read, nothing computed.

All read the fragments from the page cache after the first round. The
ratios are taken pair by pair; the medians are printed, with GB/s.

``--s3``: the dataset uploaded to a local S3 server (:mod:`benchmarks.s3`),
its checksums recorded there, then ``verify_fixity`` against s3fs's ``cat``
of every fragment object (concurrent GETs), both in this process, alternating.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.join(HERE, "data", "n100_f10x512x512_zlib1_c1x512x512"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--s3", action="store_true", help="on a local S3 server instead")
    a = parser.parse_args(argv)
    if a.s3:
        return _on_s3(a.data, a.repeats)

    import daskcfa
    from daskcfa.archive.verify import record_fixity, verify_fixity

    files = sorted(glob.glob(os.path.join(a.data, "frag", "*.nc")))
    nbytes = sum(os.path.getsize(f) for f in files)
    with tempfile.TemporaryDirectory(prefix="bench-fixity-") as scratch:
        url = daskcfa.relocate(os.path.join(a.data, "aggregation.nc"), {}, target=os.path.join(scratch, "agg.nc"),
                               uris="absolute")
        record_fixity(url)
        assert verify_fixity(url).ok
        env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
        cli = [sys.executable, "-m", "daskcfa", "verify", "--fixity", url]
        times: dict[str, list[float]] = {"verify_fixity (in process)": [], "daskcfa verify --fixity (process)": [],
                                         "cat (process)": []}
        for _ in range(a.repeats):
            t = time.perf_counter()
            ok = verify_fixity(url).ok
            times["verify_fixity (in process)"].append(time.perf_counter() - t)
            t = time.perf_counter()
            done = subprocess.run(cli, env=env, capture_output=True)
            times["daskcfa verify --fixity (process)"].append(time.perf_counter() - t)
            t = time.perf_counter()
            with open(os.devnull, "wb") as null:
                subprocess.run(["cat", *files], stdout=null, check=True)
            times["cat (process)"].append(time.perf_counter() - t)
            if not ok or done.returncode != 0:
                raise SystemExit(f"a fixity check failed on the clean dataset: {done.stdout!r}")
    print(f"{len(files)} fragments, {nbytes / 1e6:.0f} MB, {a.repeats} rounds (A B C A B C ...):")
    _rows(times, "cat (process)", nbytes)
    return 0


def _rows(times: dict[str, list[float]], baseline: str, nbytes: int) -> None:
    """One line per command: median seconds (range), GB/s and the pairwise median ratio to ``baseline``."""
    width = max(map(len, times))
    for name, seconds in times.items():
        ratio = statistics.median(s / c for s, c in zip(seconds, times[baseline]))
        print(f"  {name:{width}s} median {statistics.median(seconds):.3f} s ({min(seconds):.3f}-{max(seconds):.3f}), "
              f"{nbytes / statistics.median(seconds) / 1e9:.2f} GB/s, {ratio:.2f}x {baseline} (pairwise median)")


def _on_s3(data: str, repeats: int) -> int:
    from benchmarks import s3 as s3mod
    from daskcfa.archive.verify import record_fixity, verify_fixity

    with s3mod.Stage() as stage:
        info = stage.upload(data)
        target = stage.target
        prefix = target.prefix(data)
        url, options = f"s3://{prefix}/aggregation.nc", target.storage_options
        record_fixity(url, storage_options=options)
        assert verify_fixity(url, storage_options=options).ok
        fs = target.filesystem()
        objects = sorted(p for p in fs.find(f"{prefix}/frag/"))
        times: dict[str, list[float]] = {"verify_fixity": [], "s3fs cat": []}
        for _ in range(repeats):
            t = time.perf_counter()
            ok = verify_fixity(url, storage_options=options).ok
            times["verify_fixity"].append(time.perf_counter() - t)
            t = time.perf_counter()
            got = sum(len(v) for v in fs.cat(objects).values())
            times["s3fs cat"].append(time.perf_counter() - t)
            if not ok or got != info["bytes"] - os.path.getsize(os.path.join(data, "aggregation.nc")):
                raise SystemExit("a fixity check failed, or cat read other bytes")
    print(f"S3 (local server): {len(objects)} fragments, {got / 1e6:.0f} MB, {repeats} rounds alternating:")
    _rows(times, "s3fs cat", got)
    return 0


if __name__ == "__main__":
    sys.exit(main())
