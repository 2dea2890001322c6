"""``to_cfa(mode="a")``: growing an existing aggregation, as ``xarray.Dataset.to_zarr`` grows a store.

With ``append_dim`` the new data extend every variable along that dimension:
aggregated variables get new fragments after their last one (the existing
fragments are referenced unchanged), ordinary variables of the aggregation
file along it (the coordinate variable, its bounds) are extended in the file.
Without it the data add new variables beside the existing ones. Either way the
result is a :class:`~daskcfa.write.request.WriteRequest` of the whole new
aggregation, whose existing fragments the write graph references as ``r+``
updates do. New values are stored with the existing variables' encoding
(packing, fill value, time units), so they read back like the old ones.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from .lazy import dask_array as da
import numpy as np

from .decode import STORAGE_ATTRS, Encoding, same_value
from .errors import ArgumentError
from .units import same_units
from .fragments.write import encode_values
from .write.request import (WriteRequest, WriteSource, as_array, dataset_model, is_xarray, values_and_attrs,
                            xarray_encoded)
from .dataset import OpenedDataset
from .model import AggregatedVariable, AggregationDataset, Dimension, PlainVariable, ancestry

__all__ = ["request_for_append", "request_for_addition"]

#: Attributes that say how values are stored or what they mean: new data must agree with the file on them.
_BINDING_ATTRS = ("units", "calendar", *STORAGE_ATTRS)


@dataclass
class _Piece:
    """New values of one variable: decoded (``encoded=False``) or as stored."""

    values: Any
    dims: tuple[str, ...]
    attrs: dict[str, Any]
    encoded: bool = False


def request_for_append(existing: Any, url: str, version: tuple[int, str] | None, data: Any, append_dim: str, *,
                       variable: str | None = None, dims: Sequence[str] | None = None,
                       attrs: Mapping[str, Any] | None = None, coords: Mapping[str, Any] | None = None,
                       fragment_shape: Any = None) -> WriteRequest:
    """The aggregation ``existing`` (a :class:`daskcfa.Dataset` read from ``url`` at ``version``)
    with ``data`` appended along ``append_dim``.

    Every variable along ``append_dim`` (aggregated, or ordinary in the
    aggregation file) must be given, with the file's dimensions, dtype kind and
    encoding attributes; variables without ``append_dim`` are kept as stored.
    The new fragments have the existing fragments' shape (along
    ``append_dim``: the first fragment's length, or ``fragment_shape``'s).
    """
    model, aggregated = dataset_model(existing)
    dimension = _dimension(model, append_dim, url)
    old = dimension.size
    spanning = {v.path: v for v in aggregated if _spans(model, v.path, v.dims, dimension)}
    plain = {v.name: v for v in model.variables if _spans(model, v.name, v.dims, dimension)}
    pieces = _pieces(existing, data, url, {**{p: v.aggregation for p, v in spanning.items()}, **plain},
                     variable=variable, dims=dims, attrs=attrs, coords=coords)
    known = {v.path for v in aggregated} | {v.name for v in model.variables}
    unknown = sorted(set(pieces) - known)
    if unknown:
        raise ArgumentError(f"{', '.join(unknown)}: not in the aggregation file; appending adds no variables "
                            "(add them with mode='a' and no append_dim)", file=url)
    absent = sorted((set(spanning) | set(plain)) - set(pieces))
    if absent:
        raise ArgumentError(f"appending along {append_dim!r} needs every variable along it; missing: "
                            f"{', '.join(absent)}", file=url)
    grown: dict[str, int] = {}
    for path, piece in pieces.items():
        target = spanning.get(path) or plain.get(path)
        if target is not None:
            grown[path] = _check_piece(path, piece, target, dimension, url)
    lengths = set(grown.values())
    if len(lengths) > 1:
        raise ArgumentError(f"the variables to append differ in length along {append_dim!r}: "
                            + ", ".join(f"{p}: {n}" for p, n in sorted(grown.items())), file=url)
    added = lengths.pop() if lengths else 0
    if added == 0:
        raise ArgumentError(f"nothing to append along {append_dim!r}: the data have length 0 there", file=url)

    dimension.size = old + added
    model.variables = [_extended(v, pieces[v.name], v.dims.index(posixpath.basename(dimension.name)))
                       if v.name in plain else v for v in model.variables]
    model.aggregated = [v.aggregation for v in aggregated if v.path not in spanning]
    sources = []
    for path, var in spanning.items():
        piece = pieces[path]
        axis = var.dims.index(posixpath.basename(dimension.name))
        fragments = var.aggregation.fragments.grown(axis, _new_sizes(var.aggregation, axis, added, fragment_shape))
        sources.append(WriteSource(path, as_array(piece.values), tuple(var.dims), np.dtype(var.dtype), dict(var.attrs),
                                   encoded=piece.encoded, existing=replace(var.aggregation, fragments=fragments),
                                   region={var.dims[axis]: slice(old, old + added)}))
    return WriteRequest(model, sources, version)


def request_for_addition(existing: Any, url: str, version: tuple[int, str] | None,
                         new: WriteRequest) -> WriteRequest:
    """The aggregation ``existing`` with the variables of ``new`` added (``mode="a"`` without
    ``append_dim``): a variable of that name must not exist yet, and the dimensions and
    ordinary variables they share with the file must have its sizes (the file's are kept)."""
    model, aggregated = dataset_model(existing)
    taken = {v.path for v in aggregated} | {v.name for v in model.variables}
    clash = sorted(s.name for s in new.sources if s.name in taken)
    if clash:
        raise ArgumentError(f"{', '.join(clash)} already in the aggregation file: mode='a' without append_dim adds "
                            "variables; update one with mode='r+' and region=, or grow it with append_dim=", file=url)
    sizes = {d.name: d for d in model.dimensions}
    for dim in new.model.dimensions:
        if dim.name not in sizes:
            model.dimensions.append(dim)
        elif sizes[dim.name].size != dim.size:
            raise ArgumentError(f"dimension {dim.name!r} has size {sizes[dim.name].size} in the aggregation file, "
                                f"the new data give it {dim.size}", file=url)
    shapes = {v.name: v for v in model.variables}
    for var in new.model.variables:
        kept = shapes.get(var.name)
        if kept is None:
            model.variables.append(var)
        elif tuple(kept.dims) != tuple(var.dims):
            raise ArgumentError(f"{var.name!r} has dimensions {kept.dims} in the aggregation file, the new data give "
                                f"it {tuple(var.dims)}", file=url)
    model.attrs = {**new.model.attrs, **model.attrs}
    model.aggregated = [v.aggregation for v in aggregated]
    return WriteRequest(model, new.sources, version)


# --------------------------------------------------------------------------
# The new values, by variable path
# --------------------------------------------------------------------------


def _pieces(existing: Any, data: Any, url: str, along: Mapping[str, Any], *, variable: str | None,
            dims: Sequence[str] | None, attrs: Mapping[str, Any] | None,
            coords: Mapping[str, Any] | None) -> dict[str, _Piece]:
    if isinstance(data, OpenedDataset):
        _no_array_arguments(variable, dims, attrs, coords, "a daskcfa.Dataset")
        return {v.path: _Piece(v.characters, tuple(v.dims), dict(v.attrs)) for g in data.walk()
                for v in g.variables.values()}
    if is_xarray(data):
        _no_array_arguments(None, dims, attrs, coords, "an xarray object")
        return _xarray_pieces(data, variable, existing, url)
    aggregated = [p for p, v in along.items() if isinstance(v, AggregatedVariable)]
    if variable is None:
        if len(aggregated) != 1:
            raise ArgumentError("choose the variable to append to with variable=: the aggregation has "
                                f"{len(aggregated)} aggregated variables along the dimension", file=url)
        variable = aggregated[0]
    path = variable if variable.startswith("/") else f"/{variable}"
    if path not in aggregated:
        raise ArgumentError(f"{variable!r} is not an aggregated variable along the append dimension; those along "
                            f"it: {', '.join(aggregated) or 'none'}", file=url)
    pieces = {path: _Piece(as_array(data), tuple(along[path].dims if dims is None else dims), dict(attrs or {}))}
    group = posixpath.dirname(path) or "/"
    for name, given in (coords or {}).items():
        values, coord_attrs = values_and_attrs(given)
        found = next((p for g in ancestry(group) if (p := posixpath.join(g, name)) in along), posixpath.join(group, name))
        target = along.get(found)
        pieces[found] = _Piece(values, tuple(target.dims) if target is not None else (), coord_attrs)
    return pieces


def _xarray_pieces(obj: Any, variable: str | None, existing: Any, url: str) -> dict[str, _Piece]:
    """An xarray object's variables encoded by xarray's CF encoder with the file's encoding:
    its stored dtype, fill value, packing and (for times) units and calendar."""
    import xarray as xr

    if isinstance(obj, xr.DataArray):
        name = variable or obj.name
        if name is None:
            raise ArgumentError("the DataArray has no name: pass variable=")
        obj = obj.to_dataset(name=name)
    obj = obj.copy(deep=False)
    for name, var in obj.variables.items():
        path = f"/{name}"
        if path not in existing:
            continue
        stored = existing[path]
        _check_kind(path, np.dtype(var.dtype), stored, url)
        encoding = {"dtype": np.dtype(stored.dtype)}
        for key in ("_FillValue", "scale_factor", "add_offset", "missing_value"):
            if key in stored.attrs and key not in var.attrs:
                encoding[key] = stored.attrs[key]
        if var.dtype.kind in "mMO":  # times: encoded in the file's units
            encoding.update({k: stored.attrs[k] for k in ("units", "calendar") if k in stored.attrs})
        var.encoding = encoding
    variables, _ = xarray_encoded(obj)
    return {f"/{name}": _Piece(var.data, tuple(var.dims), dict(var.attrs), encoded=True)
            for name, var in variables.items()}


def _no_array_arguments(variable: Any, dims: Any, attrs: Any, coords: Any, what: str) -> None:
    given = [n for n, v in (("variable", variable), ("dims", dims), ("attrs", attrs), ("coords", coords)) if v]
    if given:
        raise ArgumentError(f"{', '.join(given)}= describe an array; {what} describes its own variables")


# --------------------------------------------------------------------------
# Checks and growth
# --------------------------------------------------------------------------


def _dimension(model: AggregationDataset, name: str, url: str) -> Dimension:
    path = name if name.startswith("/") else f"/{name}"
    found = next((d for d in model.dimensions if d.name == path), None)
    if found is None:
        names = ", ".join(d.name.lstrip("/") for d in model.dimensions) or "none"
        raise ArgumentError(f"append_dim {name!r} is not a dimension of the aggregation file (its dimensions: "
                            f"{names})", file=url)
    return found


def _spans(model: AggregationDataset, path: str, dims: Sequence[str], dimension: Dimension) -> bool:
    """Whether the variable at ``path`` has ``dimension`` (netCDF's scoping: the innermost
    dimension of that name visible from its group)."""
    base = posixpath.basename(dimension.name)
    if base not in dims:
        return False
    names = {d.name for d in model.dimensions}
    group = posixpath.dirname(path) or "/"
    return next((p for g in ancestry(group) if (p := posixpath.join(g, base)) in names), None) == dimension.name


def _check_piece(path: str, piece: _Piece, target: Any, dimension: Dimension, url: str) -> int:
    """The piece's length along the dimension, once its dims, shape, dtype and attributes agree with the file."""
    dims = tuple(target.dims)
    if piece.dims != dims:
        raise ArgumentError(f"{path}: the data have dimensions {piece.dims}, the aggregation file's variable has "
                            f"{dims}", file=url, variable=path)
    values = piece.values
    axis = dims.index(posixpath.basename(dimension.name))
    shape = tuple(target.shape) if hasattr(target, "shape") else np.shape(target.data)  # aggregated, or plain
    if np.ndim(values) != len(dims) or any(np.shape(values)[d] != n for d, n in enumerate(shape) if d != axis):
        raise ArgumentError(f"{path}: the data have shape {np.shape(values)}, the aggregation file's variable "
                            f"{shape} (only {dims[axis]!r} may differ)", file=url, variable=path)
    stored_attrs = target.attrs
    for key in _BINDING_ATTRS:
        if key in piece.attrs and key in stored_attrs and \
                not same_value(piece.attrs[key], stored_attrs[key], target.dtype) and \
                not (key == "units" and same_units(piece.attrs[key], stored_attrs[key])):
            raise ArgumentError(f"{path}: the data's {key} {piece.attrs[key]!r} differs from the aggregation file's "
                                f"{stored_attrs[key]!r}", file=url, variable=path)
    if piece.encoded:
        if np.dtype(values.dtype) != np.dtype(target.dtype):
            raise ArgumentError(f"{path}: the data are stored as {values.dtype}, the aggregation file's variable as "
                                f"{np.dtype(target.dtype)}", file=url, variable=path)
    else:
        _check_kind(path, np.dtype(values.dtype), target, url)
    return int(np.shape(values)[axis])


def _check_kind(path: str, given: np.dtype, target: Any, url: str) -> None:
    """Refuse values the variable's type cannot take (numbers for strings, floats for integers)."""
    stored = np.dtype(target.dtype)
    decoded = Encoding.from_attrs(target.attrs, stored).decoded_dtype if stored.kind in "biuf" else stored
    if given.kind in "mMO" and "since" in str(target.attrs.get("units", "")):
        return  # times, encoded in the file's units
    if (given.kind in "OUS") != (decoded.kind in "OUS") or (
            given.kind in "biuf" and not np.can_cast(given, decoded, "same_kind")):
        raise ArgumentError(f"{path}: the data have dtype {given}, which the aggregation file's variable "
                            f"({decoded}) cannot take", file=url, variable=path)


def _extended(var: PlainVariable, piece: _Piece, axis: int) -> PlainVariable:
    """An ordinary variable of the aggregation file with the new values after its own."""
    values = piece.values.compute() if isinstance(piece.values, da.Array) else piece.values
    values = np.asarray(values).astype(var.dtype) if piece.encoded else encode_values(values, var.attrs, var.dtype)
    return replace(var, data=np.concatenate([np.asarray(var.data), np.asarray(values)], axis=axis))


def _new_sizes(av: AggregatedVariable, axis: int, added: int, fragment_shape: Any) -> tuple[int, ...]:
    """Fragment sizes along the append axis for ``added`` new elements: the length
    ``fragment_shape`` gives that axis, else the existing first fragment's."""
    length = 0
    if isinstance(fragment_shape, Mapping):
        length = int(fragment_shape.get(av.dims[axis], 0))
    elif fragment_shape is not None:
        length = int(list(fragment_shape)[axis])
    if length <= 0:
        length = av.fragments.grid.sizes[axis][0] if av.fragments.grid.sizes[axis] else added
    length = max(1, min(length, added))
    return (length,) * (added // length) + ((added % length,) if added % length else ())
