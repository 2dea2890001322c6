"""Open a CFA-netCDF dataset and analyse it locally: a time mean and a one-point time series.

What it shows:
1. ``daskcfa.open_cfa``: the dataset's variables and each aggregated
   variable's fragment grid, read from the aggregation file alone;
2. ``daskcfa.from_cfa``: the variable as a dask array whose chunks are the
   fragments; the time mean reads every fragment once, the time series at one
   point reads only the HDF5 chunks holding that point;
3. the same with xarray, ``xr.open_dataset(url, engine="daskcfa", chunks={})``:
   CF-decoded coordinates, selection by value, and the same answers.

Run: ``python examples/open_and_analyse.py`` (writes a small sample archive
to a temporary directory, checks every answer against numpy), or on real
data: ``python examples/open_and_analyse.py s3://bucket/tas.nca --variable tas
--at lat=51.5 --at lon=0`` (S3 credentials from the usual AWS environment
variables and files; ``AWS_ENDPOINT_URL`` for non-AWS object stores).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numpy as np
import xarray as xr

import daskcfa
import sample


def time_dimension(array: xr.DataArray) -> str:
    """The dimension whose coordinate is time (CF ``axis``/``standard_name``, decoded times), else the first."""
    for dim in array.dims:
        coord = array.coords.get(dim)
        if coord is not None and (coord.attrs.get("axis") == "T" or coord.attrs.get("standard_name") == "time"
                                  or coord.dtype.kind in "mM" or coord.dtype == object):
            return str(dim)
    return str(array.dims[0])


def point_index(array: xr.DataArray, at: dict[str, float], time_dim: str) -> dict[str, int]:
    """Integer index of the point: the nearest coordinate value for each ``--at``, else the middle."""
    index = {}
    for dim, size in zip(array.dims, array.shape):
        if dim == time_dim:
            continue
        if dim in at and dim in array.coords:
            index[dim] = int(abs(array[dim].values - at[dim]).argmin())
        else:
            index[dim] = size // 2
    return index


def analyse(url: str, variable: str | None, at: dict[str, float]) -> dict[str, Any]:
    """Print and return the time mean and the series (NaN where missing), the series' index and time axis."""
    t0 = time.perf_counter()
    with daskcfa.open_cfa(url) as ds:
        aggregated = ds.aggregated_variables
        print(f"opened {url} in {1000 * (time.perf_counter() - t0):.0f} ms")
        for var in aggregated.values():
            print(f"  {var.path}({', '.join(var.dims)}) {var.dtype}: {len(var.fragments)} fragments, "
                  f"grid {var.fragments.shape}")
        if variable is None:
            if len(aggregated) != 1:
                raise SystemExit(f"choose a variable with --variable: {', '.join(aggregated)}")
            variable = next(iter(aggregated))
    name = variable.rsplit("/", 1)[-1]
    group = variable.rpartition("/")[0] or None

    # xarray: CF-decoded coordinates tell which dimension is time and where the point is.
    xds = xr.open_dataset(url, engine="daskcfa", chunks={}, group=group)
    array = xds[name]
    time_dim = time_dimension(array)
    point = point_index(array, at, time_dim)
    where = ", ".join(f"{d}={array[d].values[i]}" if d in array.coords else f"{d}[{i}]" for d, i in point.items())

    # daskcfa: the dask array itself, chunks = fragments.
    x = daskcfa.from_cfa(url, variable)
    axis = array.dims.index(time_dim)
    key = tuple(slice(None) if d == time_dim else point[d] for d in array.dims)
    t0 = time.perf_counter()
    mean = x.mean(axis=axis).compute()
    series = x[key].compute()
    print(f"dask:   time mean over {x.shape[axis]} steps -> {mean.shape}, range {float(mean.min()):.3f} to "
          f"{float(mean.max()):.3f}; series at {where}: {np.ma.round(series[:4], 3)}... "
          f"({time.perf_counter() - t0:.2f} s)")

    t0 = time.perf_counter()
    xr_mean = array.mean(time_dim).values
    xr_series = array.isel(point).values
    print(f"xarray: time mean {xr_mean.shape}; series {xr_series.shape} from "
          f"{array[time_dim].values[0]} to {array[time_dim].values[-1]} ({time.perf_counter() - t0:.2f} s)")
    # xarray masks with NaN where dask gives a masked array: the two agree point for point.
    np.testing.assert_allclose(xr_mean, np.ma.filled(mean.astype("f8"), np.nan), rtol=1e-5)
    np.testing.assert_allclose(xr_series, np.ma.filled(series.astype("f8"), np.nan), rtol=1e-6)
    print("dask and xarray agree")
    return {"mean": np.ma.filled(mean, np.nan), "series": np.ma.filled(series, np.nan), "key": key, "axis": axis}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="aggregation file (default: write a sample to a temporary directory)")
    parser.add_argument("--variable", help="aggregated variable (path); needed when the file holds several")
    parser.add_argument("--at", action="append", default=[], metavar="DIM=VALUE",
                        help="the time series' point, by coordinate value (nearest); default: the middle")
    args = parser.parse_args()
    at = {dim: float(value) for dim, value in (item.split("=", 1) for item in args.at)}
    if args.url:
        analyse(args.url, args.variable, at)
        return
    with tempfile.TemporaryDirectory() as tmp:
        url = sample.write(f"{tmp}/tas.nca")
        result = analyse(url, None, at)
        expected = sample.truth().astype("f8")
        np.testing.assert_allclose(result["mean"], expected.mean(axis=result["axis"]), rtol=1e-5)
        np.testing.assert_allclose(result["series"], expected[result["key"]], rtol=1e-6)
        print("sample: results equal the ground truth")


if __name__ == "__main__":
    main()
