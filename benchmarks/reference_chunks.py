"""A reference set of a whole archive as one fragment: read by its own chunks, or as one chunk.

    python -m benchmarks.reference_chunks [--data benchmarks/data/n100_f10x512x512_raw_contig] [--repeats 3]

kerchunk's reference set of the archive's fragments (``SingleHdf5ToZarr`` of
each, combined along time with ``MultiZarrToZarr``: what VirtualiZarr's
kerchunk writer produces too) is aggregated by ``daskcfa.aggregate`` in a
scratch directory (the dataset is only read). Then, alternating, the whole
array's mean in this process with the default ``chunks="fragments"`` (one
dask chunk per chunk of the set) and with one chunk of the whole array (what
the default gave before, and still gives with a size larger than the array);
both checked against the same mean read from the archive's own aggregation file.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.join(HERE, "data", "n100_f10x512x512_raw_contig"))
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args(argv)

    import daskcfa
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    files = sorted(glob.glob(os.path.join(a.data, "frag", "*.nc")))
    expected = float(daskcfa.from_cfa(os.path.join(a.data, "aggregation.nc")).mean(dtype="f8").compute())
    with tempfile.TemporaryDirectory(prefix="bench-refchunks-") as scratch:
        refs = MultiZarrToZarr([SingleHdf5ToZarr(f, inline_threshold=0).translate() for f in files],
                               concat_dims=["time"], identical_dims=["lat", "lon"]).translate()
        with open(os.path.join(scratch, "refs.json"), "w") as out:
            json.dump(refs, out)
        url = daskcfa.aggregate(os.path.join(scratch, "refs.json"), os.path.join(scratch, "agg.nc"))
        whole = daskcfa.from_cfa(url).nbytes * 2
        times: dict[str, list[float]] = {}
        for _ in range(a.repeats):
            for name, chunks in (("own chunks (default)", "fragments"), ("one chunk", whole)):
                x = daskcfa.from_cfa(url, chunks=chunks)
                t = time.perf_counter()
                got = float(x.mean(dtype="f8").compute())
                times.setdefault(f"{name}, {x.npartitions} dask chunks", []).append(time.perf_counter() - t)
                if abs(got - expected) > 1e-9 * abs(expected):
                    raise SystemExit(f"{name}: mean {got} != {expected}")
    print(f"{len(files)} files, one reference set, full mean, {a.repeats} rounds alternating:")
    for name, seconds in times.items():
        print(f"  {name:40s} median {statistics.median(seconds):.2f} s ({min(seconds):.2f}-{max(seconds):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
