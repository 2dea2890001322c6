"""Building a reference set over 1,000 fragments: ``daskcfa.to_references`` against kerchunk
(``SingleHdf5ToZarr`` per file, then ``MultiZarrToZarr`` over them), and both opened with xarray
through fsspec's reference filesystem, their data checked equal (and equal to ``from_cfa``).

kerchunk runs twice: its per-file step serially (as its documentation's first example) and on
dask's threads (as its documentation recommends for many files); ``MultiZarrToZarr`` is serial.

    python -m benchmarks.references                      # the timeseries data: 1,000 zlib fragments
    python -m benchmarks.references --fragments 200      # a smaller dataset, generated on demand
    python -m benchmarks.references --datadir /elsewhere/benchmarks/data --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import time

import dask
import numpy as np

import daskcfa
from benchmarks.generate import AGG_NAME, DEFAULT_DATADIR, FRAG_DIR, DatasetSpec, ensure, spec_for


def _kerchunk(paths: list[str], parallel: bool) -> dict:
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    def one(path: str) -> dict:
        with open(path, "rb") as f:
            return SingleHdf5ToZarr(f, path, inline_threshold=0).translate()

    singles = dask.compute(*map(dask.delayed(one), paths)) if parallel else [one(p) for p in paths]
    return MultiZarrToZarr(list(singles), concat_dims=["time"], identical_dims=["lat", "lon"]).translate()


def _open(refs: dict) -> np.ndarray:
    import xarray as xr

    with xr.open_dataset("reference://", engine="zarr", chunks=None,
                         backend_kwargs={"storage_options": {"fo": refs}, "consolidated": False}) as ds:
        return ds["tas"].to_masked_array()


def _timed(run, repeats: int) -> tuple[float, dict]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fragments", type=int, help="fragments of shape (1, 180, 360) (default: the timeseries data)")
    parser.add_argument("--datadir", default=DEFAULT_DATADIR)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    spec = spec_for("timeseries") if args.fragments is None else DatasetSpec(
        args.fragments, (1, 180, 360), zlib=True, chunks=(1, 180, 360))
    directory = ensure(spec, args.datadir)
    url = os.path.join(directory, AGG_NAME)
    paths = sorted(os.path.join(directory, FRAG_DIR, name) for name in os.listdir(os.path.join(directory, FRAG_DIR)))
    daskcfa.to_references(url)  # (imports and first calls, not timed)
    ours_s, ours = _timed(lambda: daskcfa.to_references(url), args.repeats)
    serial_s, theirs = _timed(lambda: _kerchunk(paths, parallel=False), args.repeats)
    threads_s, _ = _timed(lambda: _kerchunk(paths, parallel=True), args.repeats)
    expected = daskcfa.from_cfa(url).compute()
    a, b = _open(ours), _open(theirs)
    equal = bool(np.ma.allequal(a, b) and np.ma.allequal(a, expected)
                 and (np.ma.getmaskarray(a) == np.ma.getmaskarray(b)).all())
    print(json.dumps({"fragments": spec.nfrag, "daskcfa_s": round(ours_s, 3), "kerchunk_serial_s": round(serial_s, 3),
                      "kerchunk_threads_s": round(threads_s, 3), "speedup_vs_serial": round(serial_s / ours_s, 1),
                      "speedup_vs_threads": round(threads_s / ours_s, 1), "same_data": equal,
                      "chunks": {"daskcfa": sum(1 for k in ours["refs"] if k.startswith("tas/") and "/." not in k),
                                 "kerchunk": sum(1 for k in theirs["refs"] if k.startswith("tas/") and "/." not in k)}}))
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
