"""The small sample archive the documentation and the examples use: :func:`sample`.

Ten years of monthly near-surface temperature on a 4-degree grid,
``tas(time, lat, lon)``, float32, 1.9 MB: a smooth function of the indices,
so any piece of it can be computed anywhere (on a worker, in a test) and
compared with what was read. Written with :func:`daskcfa.to_cfa` as a CF-1.13
aggregation of one fragment per year, the layout of a typical model archive.
It lives in the package (as ``xarray.tutorial`` does) so that every snippet
of the documentation runs in an empty directory, with nothing hidden.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .lazy import dask_array as da

__all__ = ["VARIABLE", "DIMS", "SHAPE", "FRAGMENT_SHAPE", "ATTRS", "temperature", "truth", "lazy", "coords",
           "sample"]

VARIABLE = "tas"
DIMS = ("time", "lat", "lon")
SHAPE = (120, 45, 90)
FRAGMENT_SHAPE = (12, 45, 90)  # one fragment per year
ATTRS = {"units": "K", "standard_name": "air_temperature", "long_name": "near-surface air temperature"}


def temperature(t: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Values at integer indices (broadcast): a latitude profile, a seasonal cycle and a trend."""
    t, y, x = (np.asarray(i, dtype="f8") for i in (t, y, x))  # dask hands over indices as float32
    lat = np.deg2rad(-88.0 + 4.0 * y)
    season = np.sin(2 * np.pi * (t % 12) / 12) * np.sin(lat)
    return (250.0 + 40.0 * np.cos(lat) + 12.0 * season + 0.002 * t + 0.01 * x).astype("f4")


def truth() -> np.ndarray:
    """The whole dataset, computed in memory (the ground truth to check what was read against)."""
    return temperature(*np.indices(SHAPE))


def lazy(chunks: tuple[int, ...] = FRAGMENT_SHAPE) -> da.Array:
    """The dataset as a dask array: each chunk is computed where it is needed."""
    return da.fromfunction(temperature, shape=SHAPE, chunks=chunks, dtype="f4")


def coords() -> dict[str, tuple[np.ndarray, dict[str, str]]]:
    """Coordinates with their CF attributes, in ``to_cfa``'s ``(values, attrs)`` form."""
    return {
        "time": (np.arange(SHAPE[0]) * 30.0 + 15.0,
                 {"units": "days since 2000-01-01", "calendar": "360_day", "standard_name": "time", "axis": "T"}),
        "lat": (-88.0 + 4.0 * np.arange(SHAPE[1]), {"units": "degrees_north", "standard_name": "latitude", "axis": "Y"}),
        "lon": (4.0 * np.arange(SHAPE[2]), {"units": "degrees_east", "standard_name": "longitude", "axis": "X"}),
    }


def sample(url: str, *, storage_options: Mapping[str, Any] | None = None, **to_cfa_options: Any) -> str:
    """Write the sample archive at ``url`` (its fragments in the directory named after its stem,
    ``tas/`` beside ``tas.nca``), anywhere :func:`daskcfa.to_cfa` writes; return its URL.

    ``to_cfa_options`` go to :func:`daskcfa.to_cfa` (``format=``, ``mode="w"``, ...);
    ``fragment_shape`` defaults to one fragment per year.
    """
    from .api import to_cfa

    to_cfa_options.setdefault("fragment_shape", FRAGMENT_SHAPE)
    return to_cfa(lazy(), url, variable=VARIABLE, dims=DIMS, attrs=ATTRS, coords=coords(),
                  storage_options=storage_options, **to_cfa_options)
