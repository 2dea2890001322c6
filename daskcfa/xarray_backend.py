"""The xarray backend: ``xr.open_dataset(url, engine="daskcfa")``.

A thin shell over :func:`daskcfa.open_cfa`: every variable (aggregated or
not) becomes an xarray variable backed by a lazily indexed array, so
xarray's own lazy indexing reaches the fragments (a one-point time series
reads one HDF5 chunk per fragment). Values are handed over *stored* — the
variable's ``_FillValue``, packing and time units are decoded by xarray, as
for any netCDF file. With ``chunks={}`` the dask chunks are the fragments.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
from xarray import Dataset as XrDataset
from xarray import Variable as XrVariable
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.core import indexing

from .api import open_cfa
from .dataset import Dataset, FileVariableArray, Variable
from .decode import default_fill_value
from .graph.read import AggregatedArray

__all__ = ["DaskCFABackendEntrypoint", "open_dataset"]


class _LazyArray(BackendArray):
    """Hands xarray's outer indexing (one vector at most) to a daskcfa array."""

    def __init__(self, array: Any) -> None:
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER_1VECTOR,
                                                  self._read)

    def _read(self, key: tuple) -> np.ndarray:
        return np.asarray(self.array[key])


def _variable(var: Variable, url: str) -> XrVariable:
    attrs = dict(var.attrs)
    encoding: dict[str, Any] = {"source": url, "dtype": var.dtype}
    if var.aggregation is not None:
        array = AggregatedArray(var.aggregation, decode=False, access=var._access)
        # Missing fragments hold the fill value: declare it so that xarray masks them.
        if "_FillValue" not in attrs and var.dtype.kind in "iuf":
            attrs["_FillValue"] = default_fill_value(var.dtype)
        encoding["preferred_chunks"] = dict(zip(var.dims, var.aggregation.fragments.grid.sizes))
    else:
        array = FileVariableArray(url, var.path, var.shape, var.dtype, mask=False, profile=var._access.profile)
    data = indexing.LazilyIndexedArray(_LazyArray(array))
    return XrVariable(var.dims, data, attrs, encoding)


def _to_xarray(ds: Dataset, group: str | None, drop_variables: Iterable[str] | None) -> XrDataset:
    node = ds if group in (None, "", "/") else ds[group]
    dropped = set(drop_variables or ())
    variables = {name: _variable(var, ds.url) for name, var in node.variables.items() if name not in dropped}
    out = XrDataset(variables, attrs=dict(node.attrs))
    return out.set_coords([n for n in variables if n in node.dimensions and variables[n].dims == (n,)])


class DaskCFABackendEntrypoint(BackendEntrypoint):
    """``engine="daskcfa"``: CFA-netCDF aggregations in every dialect, on any storage."""

    description = "Open CFA-netCDF aggregations (CF-1.13, CFA-0.4 to 0.6, NCA) with daskcfa"
    url = "https://github.com/daskcfa/daskcfa"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "group", "storage_options",
                               "allowed_locations")

    def open_dataset(self, filename_or_obj: Any, *, drop_variables: Iterable[str] | None = None,
                     group: str | None = None, storage_options: Mapping[str, Any] | None = None,
                     allowed_locations: Iterable[str] | None = None, **decode_options: Any) -> XrDataset:
        from xarray.conventions import decode_cf

        ds = open_cfa(str(filename_or_obj), storage_options=storage_options, allowed_locations=allowed_locations)
        return decode_cf(_to_xarray(ds, group, drop_variables), **decode_options)

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        return False  # aggregation files are ordinary netCDF files: ask for engine="daskcfa"


def open_dataset(url: str, *, chunks: Any = None, **kwargs: Any) -> XrDataset:
    """``xarray.open_dataset(url, engine="daskcfa", ...)``; ``chunks={}`` gives one dask chunk per fragment."""
    import xarray

    return xarray.open_dataset(url, engine=DaskCFABackendEntrypoint, chunks=chunks, **kwargs)
