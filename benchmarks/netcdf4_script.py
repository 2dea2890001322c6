"""An archive script written against netCDF4-python's ``Dataset`` API, as S3netCDF4 users write them.

The ``dataset-*`` write scenarios (:mod:`benchmarks.write`) run this same
function with ``daskcfa.netcdf4.Dataset`` (in the benchmark's venv) and with
S3netCDF4's ``s3Dataset`` (in its own venv, driven by
:mod:`benchmarks.s3netcdf4_peer`). It imports numpy only, so that both venvs
can run it; :func:`values` is the data of every write scenario.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

VARNAME = "tas"
DIMS = ("time", "lat", "lon")
VAR_ATTRS = {"standard_name": "air_temperature", "long_name": "Near-surface air temperature",
             "units": "K"}
COORD_ATTRS = {
    "time": {"standard_name": "time", "units": "days since 2000-01-01", "calendar": "standard",
             "axis": "T"},
    "lat": {"standard_name": "latitude", "units": "degrees_north", "axis": "Y"},
    "lon": {"standard_name": "longitude", "units": "degrees_east", "axis": "X"},
}
#: netCDF's default fill value for float32 (``netCDF4.default_fillvals["f4"]``)
FILL_F4 = np.float32(9.969209968386869e36)
#: how the script assigns the data: one time step, or one whole sub-array, per ``var[...] = ...``
ASSIGNMENTS = ("steps", "subarrays")


def values(t0: int, t1: int, ny: int, nx: int) -> np.ndarray:
    """float32 values of time steps ``t0 <= t < t1``: 250 K + 0.01 K per time
    step plus a fixed spatial pattern of 0..2 K (different in every row and
    column, so a misplaced or transposed fragment shows). Cheap: a few ms per
    10 MB fragment, bit-for-bit reproducible."""
    base = (250.0 + 0.01 * np.arange(t0, t1, dtype=np.float64)).astype(np.float32)
    return base[:, None, None] + _spatial(ny, nx)[None, :, :]


@functools.lru_cache(maxsize=4)
def _spatial(ny: int, nx: int) -> np.ndarray:
    """The fixed spatial pattern (computed once: the step-by-step scenarios ask 1,000 times)."""
    y = np.arange(ny, dtype=np.int64)[:, None]
    x = np.arange(nx, dtype=np.int64)[None, :]
    spatial = (((y * 37 + x * 11) % 1000) * 0.002).astype(np.float32)
    spatial.flags.writeable = False
    return spatial


def coordinate_values(shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """The three float64 coordinate variables of a ``(time, lat, lon)`` field."""
    nt, ny, nx = shape
    return {"time": np.arange(nt, dtype=np.float64),
            "lat": -90.0 + (np.arange(ny) + 0.5) * (180.0 / ny),
            "lon": (np.arange(nx) + 0.5) * (360.0 / nx)}


def write_dataset(Dataset: Callable[..., Any], url: str, shape: tuple[int, int, int],
                  frag_shape: tuple[int, int, int], assignment: str, format: str,
                  cfa_version: str | None = None, unlimited: bool = True, **options: Any) -> None:
    """Write ``values`` over ``shape`` to ``url``: an unlimited ``time`` dimension, coordinates
    with attributes, ``tas`` in sub-arrays of ``frag_shape``, assigned one time step at a time
    (``"steps"``: ``time[t] = t; tas[t] = step``) or one sub-array at a time (``"subarrays"``).
    ``unlimited=False``: ``time`` created at its final size (S3netCDF4 2.1rc1 cannot create an
    unlimited dimension in a CFA file: ``createDimension("time", None)`` raises TypeError)."""
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {ASSIGNMENTS}, got {assignment!r}")
    nt, ny, nx = shape
    ft = frag_shape[0]
    crd = coordinate_values(shape)
    kw = {"cfa_version": cfa_version} if cfa_version is not None else {}
    ds = Dataset(url, "w", format=format, **kw, **options)
    try:
        ds.createDimension("time", None if unlimited else nt)
        ds.createDimension("lat", ny)
        ds.createDimension("lon", nx)
        coords = {}
        for name in DIMS:
            coords[name] = ds.createVariable(name, "f8", (name,))
            coords[name].setncatts(COORD_ATTRS[name])
        coords["lat"][:] = crd["lat"]
        coords["lon"][:] = crd["lon"]
        var = ds.createVariable(VARNAME, "f4", DIMS, fill_value=FILL_F4,
                                subarray_shape=np.array(frag_shape, dtype="i8"))
        var.setncatts(VAR_ATTRS)
        if assignment == "steps":
            for t in range(nt):
                coords["time"][t] = crd["time"][t]
                var[t] = values(t, t + 1, ny, nx)[0]
        else:
            for t0 in range(0, nt, ft):
                t1 = min(t0 + ft, nt)
                coords["time"][t0:t1] = crd["time"][t0:t1]
                var[t0:t1, :, :] = values(t0, t1, ny, nx)
    finally:
        ds.close()
