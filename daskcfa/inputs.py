"""What :func:`daskcfa.to_cfa` (and ``refragment``) accept, brought to one form.

A numpy or dask array with its name, dimensions and coordinates, a
:class:`daskcfa.Dataset` (every aggregated variable re-fragmented, ordinary
variables copied), an xarray object (encoded by xarray's own CF encoder), or
new values for a region of an existing aggregation (``mode="r+"``) all become
a :class:`~daskcfa.write.request.WriteRequest`: the dialect-independent
:class:`~daskcfa.model.AggregationDataset` with its ordinary variables, plus
the values of each variable to aggregate. Kept apart from the graph builder,
which only builds graphs from a request.
"""

from __future__ import annotations

import numbers
import posixpath
from dataclasses import replace
from functools import partial
from typing import Any, Mapping, Sequence

from .lazy import dask_array as da
import numpy as np

from .decode import PACKING_ATTRS, default_fill_value
from .errors import ArgumentError, VariableNotFoundError
from .fragments.write import encode_values
from .graph.read import to_dask
from .graph.write import region_bounds
from .write.request import WriteRequest, WriteSource
from .model import AggregationDataset, Dimension, PlainVariable

__all__ = ["request_from_array", "request_from_dataset", "request_for_update", "request_from_xarray",
           "dataset_model", "as_array", "values_and_attrs", "is_xarray", "stored_values"]


def request_from_array(data: Any, variable: str | None, dims: Sequence[str] | None, attrs: Mapping[str, Any] | None,
                       coords: Mapping[str, Any] | None, region: Mapping[str, slice] | None) -> WriteRequest:
    """A numpy or dask array with its name, dimensions, attributes and 1-D coordinates.

    With ``region``, ``data`` is only that part of the array: the full size of
    every dimension in ``region`` comes from its coordinates.
    """
    if variable is None or dims is None:
        raise ArgumentError("writing an array needs variable= (its name) and dims= (its dimension names)")
    data = as_array(data)
    dims = tuple(dims)
    if len(dims) != data.ndim:
        raise ArgumentError(f"dims {dims!r} name {len(dims)} dimensions, the data have {data.ndim}")
    attrs = dict(attrs or {})
    packing = [k for k in PACKING_ATTRS if k in attrs]
    if packing:
        raise ArgumentError(f"attrs carry {', '.join(packing)}: to_cfa writes an array's values as they are; "
                         "to store packed values, write an xarray object with the packing in its encoding")
    dtype = _storable(np.dtype(data.dtype), variable)
    if "_FillValue" not in attrs and "missing_value" not in attrs:
        # An explicit fill value: tools that only honour _FillValue (xarray) still see masked points.
        attrs["_FillValue"] = default_fill_value(dtype)
    region = _region(region, dims)
    sizes = dict(zip(dims, data.shape))
    model = AggregationDataset()
    for dim, given in (coords or {}).items():
        if dim not in dims:
            raise ArgumentError(f"coords names {dim!r}, which is not one of the dimensions {dims!r}")
        values, coord_attrs = _coordinate(given, dim)
        if dim in region:
            sizes[dim] = len(values)
        elif len(values) != sizes[dim]:
            raise ArgumentError(f"coordinate {dim!r} has {len(values)} values, the dimension has size {sizes[dim]}")
        dtype_c = _storable(values.dtype, dim)
        model.variables.append(PlainVariable(f"/{dim}", (dim,), dtype_c, coord_attrs,
                                             encode_values(values, coord_attrs, dtype_c)))
    missing = [d for d in region if d not in (coords or {})]
    if missing:
        raise ArgumentError(f"region along {missing}: give coords= for those dimensions (they set the full size)")
    model.dimensions = [Dimension(f"/{d}", sizes[d]) for d in dims]
    name = variable if variable.startswith("/") else f"/{variable}"
    return WriteRequest(model, [WriteSource(name, data, dims, dtype, attrs, region=region)])


def request_from_dataset(ds: Any) -> WriteRequest:
    """A :class:`daskcfa.Dataset`: aggregated variables on their own fragment grids (unless the
    write asks for another plan), ordinary ones copied."""
    model, aggregated = dataset_model(ds)
    sources = [WriteSource(v.path, v.characters, tuple(v.dims), np.dtype(v.dtype), dict(v.attrs),
                           grid=v.aggregation.fragments.grid) for v in aggregated]
    return WriteRequest(model, sources)


def request_for_update(existing: Any, url: str, version: tuple[int, str] | None, data: Any, variable: str | None,
                       region: Mapping[str, slice] | None) -> WriteRequest:
    """``mode="r+"``: the aggregation ``existing`` (a :class:`daskcfa.Dataset` read from ``url``
    when it had ``version``), with ``data`` going to ``region`` of one variable."""
    model, aggregated = dataset_model(existing)
    by_path = {v.path: v for v in aggregated}
    if variable is None:
        if len(by_path) != 1:
            raise VariableNotFoundError(f"choose the variable to update with variable=: {', '.join(sorted(by_path))}",
                                        file=url)
        variable = next(iter(by_path))
    path = variable if variable.startswith("/") else f"/{variable}"
    if path not in by_path:
        raise VariableNotFoundError(f"{variable!r} is not an aggregated variable of the file; aggregated variables: "
                                    f"{', '.join(sorted(by_path))}", file=url)
    target = by_path[path]
    model.aggregated = [v.aggregation for v in aggregated if v.path != path]
    source = WriteSource(path, as_array(data), tuple(target.dims), np.dtype(target.dtype), dict(target.attrs),
                         existing=target.aggregation, region=_region(region, tuple(target.dims)))
    return WriteRequest(model, [_merged(source, target)], version)


def stored_values(var: Any) -> da.Array:
    """An aggregated variable of a :class:`daskcfa.Dataset` as stored: packed integers, fill and
    missing values, unique-valued and missing fragments as the values they stand for. What an
    update merges new values with, so that what it does not assign stays bit for bit."""
    return to_dask(var.aggregation, access=var.read_access, strings=False, decode=False)


def _merged(source: WriteSource, target: Any) -> WriteSource:
    """An update of a region that does not fall on fragment boundaries, as an update of the
    fragments it touches: their stored values, with the new values encoded in their place.

    Stored values, not decoded ones, pass through: a fill value, a packed integer or
    a missing fragment's fill is written back bit for bit as it was.
    """
    grid = source.existing.fragments.grid
    inner, outer = [], []
    for d, (dim, n) in enumerate(zip(source.dims, grid.shape)):
        a, b = region_bounds(source.region.get(dim, slice(None)), n, dim)
        inner.append((a, b))
        offsets = grid.offsets[d]
        outer.append((offsets[grid.fragment_at(d, a)], offsets[grid.fragment_at(d, b - 1) + 1]))
    shape = tuple(b - a for a, b in inner)
    if source.data.shape != shape:
        raise ArgumentError(f"{source.name}: the data have shape {source.data.shape}, the region to write has shape "
                            f"{shape}")
    if inner == outer:
        return source
    merged = stored_values(target)[tuple(slice(a, b) for a, b in outer)].copy()
    if not isinstance(source.data, da.Array):  # one chunk per fragment touched (dask sizes no strings itself)
        cuts = [[a, *(o for o in grid.offsets[d] if a < o < b), b] for d, (a, b) in enumerate(inner)]
        chunks = tuple(tuple(int(n) for n in np.diff(c)) for c in cuts)
        source = replace(source, data=da.from_array(source.data, chunks=chunks, asarray=False))
    new = source.data
    new = new.map_blocks(partial(encode_values, attrs=source.attrs, dtype=source.dtype, variable=source.name),
                         dtype=source.dtype, meta=np.empty((0,) * new.ndim, source.dtype))
    merged[tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(inner, outer))] = new
    region = {dim: slice(a, b) for dim, (a, b) in zip(source.dims, outer)}
    return replace(source, data=merged, encoded=True, region=region)


def request_from_xarray(obj: Any, variable: str | None) -> WriteRequest:
    """An xarray ``Dataset`` or ``DataArray``, encoded by xarray's own CF encoder.

    ``xarray.conventions`` applies each variable's ``encoding`` (``dtype``,
    ``_FillValue``, ``scale_factor``/``add_offset``, time units) and adds the
    ``coordinates`` attributes, so values are stored exactly as
    ``Dataset.to_netcdf`` would store them. Data variables with dimensions
    and a numeric dtype are aggregated; coordinates and everything else
    become ordinary variables of the aggregation file.
    """
    import xarray as xr

    if isinstance(obj, xr.DataArray):
        name = variable or obj.name
        if name is None:
            raise ArgumentError("the DataArray has no name: pass variable=")
        obj = obj.to_dataset(name=name)
    variables, attrs = xr.conventions.encode_dataset_coordinates(obj)
    variables, attrs = xr.conventions.cf_encoder(variables, attrs)
    unlimited = set(obj.encoding.get("unlimited_dims", ()) or ())
    model = AggregationDataset(attrs=dict(attrs))
    model.dimensions = [Dimension(f"/{d}", int(n), d in unlimited) for d, n in obj.sizes.items()]
    sources = []
    for name, var in variables.items():
        dtype = np.dtype(var.dtype)
        if name in obj.data_vars and var.ndim and dtype.kind in "biuf":
            sources.append(WriteSource(f"/{name}", var.data, tuple(var.dims), _storable(dtype, name), dict(var.attrs),
                                       encoded=True))
        else:
            model.variables.append(PlainVariable(f"/{name}", tuple(var.dims), dtype, dict(var.attrs),
                                                 np.asarray(var.values)))
    return WriteRequest(model, sources)


def dataset_model(ds: Any) -> tuple[AggregationDataset, list[Any]]:
    """The aggregation file's contents but the aggregated variables, and those variables."""
    model = AggregationDataset(attrs=dict(ds.attrs))
    aggregated = []
    for group in ds.walk():
        if group is not ds:
            model.group_attrs[group.path] = dict(group.attrs)
        for dim in group.dimensions.values():
            model.dimensions.append(Dimension(posixpath.join(group.path, dim.name), dim.size, dim.unlimited))
        for var in group.variables.values():
            if var.is_aggregated:
                aggregated.append(var)
            else:
                model.variables.append(PlainVariable(var.path, tuple(var.dims), var.dtype, dict(var.attrs),
                                                     encode_values(var.characters.compute(), var.attrs, var.dtype)))
    return model, aggregated


def _coordinate(given: Any, dim: str) -> tuple[np.ndarray, dict[str, Any]]:
    """Coordinate values, and attributes when given as a ``(values, attrs)`` pair."""
    values, attrs = values_and_attrs(given)
    if values.ndim != 1:
        raise ArgumentError(f"coordinate {dim!r} must be 1-D, got shape {values.shape}")
    return values, attrs


def values_and_attrs(given: Any) -> tuple[Any, dict[str, Any]]:
    """What ``coords=`` gives for a name: values, or a ``(values, attrs)`` pair."""
    attrs: Mapping[str, Any] = {}
    if isinstance(given, tuple) and len(given) == 2 and isinstance(given[1], Mapping):
        given, attrs = given
    return as_array(given), dict(attrs)


def is_xarray(data: Any) -> bool:
    """An xarray ``Dataset`` or ``DataArray`` (told by its type, without importing xarray)."""
    module = type(data).__module__
    return module.startswith("xarray.") and type(data).__name__ in ("Dataset", "DataArray")


def as_array(data: Any) -> Any:
    """A dask array as is, anything else as a numpy array (masked arrays stay masked)."""
    if isinstance(data, da.Array):
        return data
    return np.ma.asanyarray(data) if np.ma.isMaskedArray(data) else np.asarray(data)


def _storable(dtype: np.dtype, name: str) -> np.dtype:
    """``dtype`` if netCDF can store it, else a clear error."""
    if dtype.kind in "OUS" or (dtype.kind in "iuf" and dtype.str[1:] in ("i1", "u1", "i2", "u2", "i4", "u4", "i8",
                                                                        "u8", "f4", "f8")):
        return dtype
    raise ArgumentError(f"{name!r} has dtype {dtype}, which netCDF cannot store (cast it first; times need numbers "
                    "with units, as xarray encodes them)")


def _region(region: Mapping[str, slice] | None, dims: tuple[str, ...]) -> dict[str, slice]:
    region = dict(region or {})
    for dim, sl in region.items():
        if dim not in dims:
            raise ArgumentError(f"region names {dim!r}, which is not one of the dimensions {dims!r}")
        if not isinstance(sl, slice) or sl.step not in (None, 1) or not all(
                b is None or isinstance(b, numbers.Integral) for b in (sl.start, sl.stop)):
            raise ArgumentError(f"region[{dim!r}] must be a slice of integers with step 1, got {sl!r}")
    return region
