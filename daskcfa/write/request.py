"""What a write is asked to write: the aggregation's contents minus fragments, and each variable's source.

A :class:`WriteRequest` is the dialect-independent
:class:`~daskcfa.model.AggregationDataset` with its ordinary variables, plus
the values of each variable to aggregate; :func:`daskcfa.graph.write.write_graph`
writes it. New data become one here: a numpy or dask array with its name,
dimensions and coordinates (:func:`request_from_array`), a
:class:`daskcfa.Dataset` (every aggregated variable re-fragmented, ordinary
variables copied: :func:`request_from_dataset`, and :func:`dataset_model` for
``refragment`` and ``relocate``) or an xarray object (encoded by xarray's own
CF encoder: :func:`request_from_xarray`). An update, which reads the
existing aggregation's stored values, is made above, by
:func:`daskcfa.inputs.write_request` (docs/architecture.md says why).
"""

from __future__ import annotations

import numbers
import posixpath
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..decode import PACKING_ATTRS, default_fill_value
from ..errors import ArgumentError
from ..fragments.write import encode_values
from ..lazy import dask_array as da
from ..model import AggregatedVariable, AggregationDataset, Dimension, FragmentGrid, PlainVariable

__all__ = ["FragmentSource", "WriteSource", "WriteRequest", "request_from_array", "request_from_dataset",
           "request_from_xarray", "xarray_encoded", "dataset_model", "as_array", "values_and_attrs", "is_xarray",
           "write_region"]


class FragmentSource:
    """Data that produce each fragment's values themselves, instead of dask chunks.

    The split graph (:mod:`daskcfa.graph.split`) reads each target fragment's
    region straight from the source, slab by slab. It is a dask collection
    (its graph holds any tasks the fragment tasks depend on) whose
    :meth:`fragment_values` gives the ``values`` argument of one fragment task.
    """

    name: str  #: identifies the data (part of the fragments' resume tokens)

    def fragment_values(self, grid: FragmentGrid, index: tuple[int, ...]) -> Any:
        raise NotImplementedError


@dataclass
class WriteSource:
    """One variable to aggregate."""

    name: str  #: path, e.g. ``"/tas"``
    #: dask or numpy array of the values (decoded, or stored when ``encoded``), or a FragmentSource
    data: Any
    dims: tuple[str, ...]
    dtype: np.dtype  #: stored dtype
    attrs: dict[str, Any]
    encoded: bool = False  #: ``data`` already holds stored values (xarray encodes its own)
    #: r+: the variable as the existing aggregation file describes it
    existing: AggregatedVariable | None = None
    region: dict[str, slice] = field(default_factory=dict)
    #: this variable's ``createVariable`` compression keywords (None: the write's ``compression``)
    compression: dict[str, Any] | None = None
    #: the fragment grid of the aggregation the data come from: kept unless a fragment plan is asked for
    grid: FragmentGrid | None = None

    @property
    def group(self) -> str:
        return posixpath.dirname(self.name) or "/"

    @property
    def basename(self) -> str:
        return posixpath.basename(self.name)


@dataclass
class WriteRequest:
    """What to write: the aggregation file's contents minus fragments, and the sources."""

    model: AggregationDataset
    sources: list[WriteSource]
    #: r+: the existing aggregation file's (size, version) when it was read; the commit checks it is unchanged
    version: tuple[int, str] | None = None


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
    region = write_region(region, dims)
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
    variables, attrs = xarray_encoded(obj)
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


def xarray_encoded(obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """An xarray ``Dataset``'s variables and attributes as xarray's CF encoder stores them (the one
    place daskcfa calls it). What it cannot encode (a ``_FillValue`` and another ``missing_value``:
    netCDF4-python writes both, xarray refuses) is an :class:`ArgumentError` naming the variable,
    before anything is written: xarray's own is a bare ``ValueError`` naming it in its text only."""
    import xarray as xr

    variables, attrs = xr.conventions.encode_dataset_coordinates(obj)
    try:
        return xr.conventions.cf_encoder(variables, attrs)
    except ValueError as exc:
        reason = str(exc)
    for name, var in variables.items():  # (only once it failed: which variable, by xarray's own rule)
        try:
            xr.conventions.encode_cf_variable(var, name=name)
        except ValueError:
            raise ArgumentError(f"xarray cannot encode the variable: {reason}", variable=f"/{name}") from None
    raise ArgumentError(f"xarray cannot encode the dataset: {reason}")


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


def write_region(region: Mapping[str, slice] | None, dims: tuple[str, ...]) -> dict[str, slice]:
    """``region=`` of a write, checked: a slice of integers with step 1 along some of ``dims``."""
    region = dict(region or {})
    for dim, sl in region.items():
        if dim not in dims:
            raise ArgumentError(f"region names {dim!r}, which is not one of the dimensions {dims!r}")
        if not isinstance(sl, slice) or sl.step not in (None, 1) or not all(
                b is None or isinstance(b, numbers.Integral) for b in (sl.start, sl.stop)):
            raise ArgumentError(f"region[{dim!r}] must be a slice of integers with step 1, got {sl!r}")
    return region
