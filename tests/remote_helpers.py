"""Helpers shared by the tests that read from S3, HTTP and OPeNDAP."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import netCDF4
import numpy as np

from builders import make_truth, write_strings

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (2, 3))  # uneven fragments, a 3 x 1 x 2 grid
SHAPE = (6, 4, 5)


def truth(masked: float = 0.15, dtype: str = "f4", shape=SHAPE, seed: int = 1) -> np.ma.MaskedArray:
    return make_truth(shape, dtype, seed=seed, masked=masked)


def upload(fs, local_dir: Path, bucket: str, prefix: str) -> str:
    """Upload a whole local directory to ``s3://bucket/prefix/``; returns that base URI (no slash)."""
    prefix = prefix.strip("/")
    fs.put(str(local_dir) + "/", f"{bucket}/{prefix}/", recursive=True)
    return f"s3://{bucket}/{prefix}"


def rewrite_uris(path: Path, variable: str, change: Callable[[str], str]) -> None:
    """Rewrite, in place, every non-empty string of the URI variable of an aggregation file."""
    with netCDF4.Dataset(str(path), "a") as ds:
        var = ds[variable]
        if var.dtype is str:
            values = np.asarray(var[...], dtype=object)
            new = np.vectorize(lambda u: change(u) if u else u, otypes=[object])(values)
            if new.ndim == 0:
                var[0] = new[()]
            else:
                var[...] = new
        else:  # char array: the values must still fit the string length
            var.set_auto_chartostring(True)
            values = np.asarray(var[...]).astype(str)
            new = np.vectorize(lambda u: change(u) if u else u, otypes=[object])(values)
            width = var.shape[-1]
            assert max(len(s.encode()) for s in new.ravel()) <= width, "rewritten URI longer than the char array"
            var[...] = np.array(new.tolist(), dtype=f"S{width}")


def write_chunked_fragment(path: Path, name: str, dims: Sequence[str], data: np.ndarray, *,
                           chunks: Sequence[int], zlib: bool = False) -> Path:
    """A netCDF-4 fragment with explicit HDF5 chunking (no fill value)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(str(path), "w") as ds:
        for d, n in zip(dims, data.shape):
            ds.createDimension(d, n)
        v = ds.createVariable(name, data.dtype, tuple(dims), chunksizes=tuple(chunks), zlib=zlib,
                              fill_value=False)
        v.units = "K"
        v[...] = data
    return path


def write_cf113(path: Path, name: str, dims: Sequence[str], sizes, uris, *, identifier: str | None = None,
                units: str = "K", dtype: str = "f4") -> Path:
    """A minimal CF-1.13 aggregation file written by hand.

    ``sizes``: the fragment sizes along each dimension; ``uris``: nested
    lists shaped like the fragment grid.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    uris = np.array(uris, dtype=object)
    grid = tuple(len(r) for r in sizes)
    uris = uris.reshape(grid)
    width = max(len(r) for r in sizes)
    fmap = np.full((len(sizes), width), netCDF4.default_fillvals["i4"], dtype="i4")
    for d, row in enumerate(sizes):
        fmap[d, : len(row)] = row
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.13"
        for d, row in zip(dims, sizes):
            ds.createDimension(d, sum(row))
        ds.createDimension("i", len(sizes))
        ds.createDimension("j", width)
        m = ds.createVariable("fragment_map", "i4", ("i", "j"), fill_value=False)
        m[...] = fmap
        fdims = tuple(f"f_{d}" for d in dims)
        for d, k in zip(fdims, grid):
            ds.createDimension(d, k)
        write_strings(ds, "fragment_uris", fdims, uris)
        write_strings(ds, "fragment_identifiers", (), identifier or name)
        v = ds.createVariable(name, dtype, ())
        v.units = units
        v.aggregated_dimensions = " ".join(dims)
        v.aggregated_data = "map: fragment_map uris: fragment_uris identifiers: fragment_identifiers"
    return path
