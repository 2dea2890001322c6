"""Readers of the JSON partition dialects: NCA 0.1-0.2 and, through the same code, CFA-0.4/0.3.

Early cf-python wrote NCA: one JSON attribute listing every partition with its
index in the partition matrix, its location in the aggregated array and the
file variable holding its data. CFA-0.4 (S3netCDF4, old cf-python) kept that
layout, renamed the attributes and made location ends inclusive. Only listed
partitions exist; the others read as missing data.

Both dialects' per-partition extras are honoured: own units, dimension order
and directions. Refused with a CFAFormatError, because no reader could apply
them and ignoring them would return wrong data: a ``part`` selecting less than
the whole file variable, non-netCDF fragment formats, a partition calendar
other than the aggregated variable's, and partition dimensions that are not
aggregated dimensions (extra size-1 axes).
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import netCDF4
import numpy as np

from ..model import AggregatedVariable, Fragments
from ._netcdf import (
    Where,
    data_attributes,
    dimension_sizes,
    find_variable,
    is_netcdf_format,
    legacy_dimensions,
    location_stops,
    matrix_layout,
    partition_grid,
    scatter,
    variable_path,
    with_base,
)
from .limits import JSON_EXPANSION, charge

__all__ = ["parse_nca", "parse_json_partitions"]

#: Integers are kept within int64; larger ones cannot describe a real array.
_HUGE = 2**62


def parse_nca(var: netCDF4.Variable, source: str) -> AggregatedVariable:
    """Read an ``nca_variable`` (``nca_array`` JSON; location ends exclusive)."""
    return parse_json_partitions(
        var, source, dialect="NCA", array_attr="nca_array", dims_attrs=("nca_dimensions",), inclusive_ends=False
    )


def parse_json_partitions(
    var: netCDF4.Variable,
    source: str,
    *,
    dialect: str,
    array_attr: str,
    dims_attrs: Sequence[str],
    inclusive_ends: bool,
) -> AggregatedVariable:
    """Read a variable whose partitions are listed in the JSON attribute ``array_attr``."""
    where = Where(source, variable_path(var))
    dims = legacy_dimensions(var, dims_attrs)
    sizes = dimension_sizes(var.group(), dims, variable=where.variable)
    array = _load_json(var, array_attr, where)
    pm_dims = _strings(_first(array, ("pmdimensions", "pdimensions"), []), "pmdimensions", where)
    pm_shape = _integers(_first(array, ("pmshape", "pshape"), []), None, "pmshape", where)
    pm_axes, grid_shape = matrix_layout(pm_dims, pm_shape, dims, where)
    records = array.get("Partitions")
    if not isinstance(records, list):
        raise where.error(f"{array_attr} has no 'Partitions' list")
    context = _Context(
        where=where,
        dims=tuple(dims),
        pm_axes=tuple(pm_axes),
        base=_optional_string(array.get("base"), "base", where),
        directions=_directions(array.get("directions"), dims, where, None, scalar_ok=not dims),
        calendar=_calendar(var.getncattr("calendar") if "calendar" in var.ncattrs() else None),
        group=var.group(),
    )
    partitions = [_read_partition(record, position, context) for position, record in enumerate(records)]

    n, ndim = len(partitions), len(dims)
    index = np.array([p.index for p in partitions], dtype=np.int64).reshape(n, ndim)
    location = np.array([p.location for p in partitions], dtype=np.int64).reshape(n, ndim, 2)
    counts = np.array([p.count for p in partitions], dtype=np.int64)
    start = location[..., 0]
    stop = location_stops(start, location[..., 1], counts, index, inclusive=inclusive_ends, where=where)
    grid = partition_grid(dims, sizes, grid_shape, index, start, stop, np.ones(n, dtype=bool), where)
    for row, partition in enumerate(partitions):
        _check_omitted_dims(partition, start[row], stop[row], context)

    fragments = Fragments(
        grid,
        uris=scatter(grid_shape, index, [p.uri for p in partitions], ""),
        identifiers=scatter(grid_shape, index, [p.identifier for p in partitions], None),
        units=_optional_column(grid_shape, index, [p.units for p in partitions]),
        axes=_optional_column(grid_shape, index, [p.axes for p in partitions]),
        reversed=_optional_column(grid_shape, index, [p.reversed for p in partitions]),
    )
    return AggregatedVariable(
        name=where.variable,
        dims=tuple(dims),
        dtype=np.dtype(var.dtype),
        attrs=data_attributes(var),
        fragments=fragments,
        dialect=dialect,
        source=source,
        extra={"instructions": {p.identifier for p in partitions if p.in_file}},
    )


@dataclass(frozen=True)
class _Context:
    """What every partition of one variable is read against."""

    where: Where
    dims: tuple[str, ...]
    pm_axes: tuple[int, ...]
    base: str | None
    directions: dict[str, bool]  # of the aggregated data; absent = increasing
    calendar: str
    group: netCDF4.Group


@dataclass(frozen=True)
class _Partition:
    """One listed partition, with its index in aggregated dimension order."""

    index: list[int]
    location: list[list[int]]  # as written (end convention not yet settled)
    count: int  # elements its recorded shape holds; -1 if not recorded
    uri: str
    identifier: str
    in_file: bool  # data in a private variable of the aggregation file
    units: str | None
    axes: tuple[int, ...] | None
    reversed: tuple[bool, ...] | None


def _read_partition(record: Any, position: int, context: _Context) -> _Partition:
    """Check and decode one element of ``Partitions``."""
    where, dims = context.where, context.dims
    label = f"Partitions[{position}]"
    if not isinstance(record, dict):
        raise where.error(f"{label} is not a JSON object")
    default_index = None if context.pm_axes else []  # a scalar partition matrix needs none
    pm_index = _integers(record.get("index", default_index), len(context.pm_axes), f"{label} index", where)
    index = [0] * len(dims)
    for axis, i in zip(context.pm_axes, pm_index):
        index[axis] = i
    location = record.get("location", [] if not dims else None)
    if not isinstance(location, list) or len(location) != len(dims):
        raise where.error(f"{label} location should list one [start, end] pair per dimension {list(dims)}", index)
    location = [_integers(pair, 2, f"{label} location", where, index) for pair in location]

    data = _first(record, ("subarray", "data"), None)
    if not isinstance(data, dict):
        raise where.error(f"{label} has no 'subarray' (or 'data') object", index)
    fmt = data.get("format", record.get("format"))
    if fmt is not None and not is_netcdf_format(fmt):
        raise where.error(f"{label} is stored in format {fmt!r}; only netCDF fragments can be read", index)
    ncvar = data.get("ncvar")
    if not isinstance(ncvar, str) or not ncvar:
        raise where.error(f"{label} names no variable ('ncvar')", index)
    file = _optional_string(data.get("file"), f"{label} file", where, index)
    shape = data.get("shape")
    if shape is not None:
        shape = _integers(shape, None, f"{label} shape", where, index)
    _check_part(record.get("part"), shape, label, where, index)
    calendar = _first(record, ("calendar", "pcalendar"), None)
    if calendar is not None and _calendar(calendar) != context.calendar:
        raise where.error(f"{label} has its own calendar; partitions in other calendars are not supported", index)

    if file:
        uri, identifier, in_file = with_base(context.base, file), ncvar, False
    else:  # the data are a private variable of the aggregation file itself
        private = find_variable(context.group, ncvar)
        if private is None:
            raise where.error(f"{label} has no file and the aggregation file has no variable {ncvar!r}", index)
        uri, identifier, in_file = where.file, variable_path(private), True
    return _Partition(
        index=index,
        location=location,
        count=min(math.prod(shape), _HUGE) if shape is not None else -1,  # capped: beyond int64 never fits
        uri=uri,
        identifier=identifier,
        in_file=in_file,
        units=_optional_string(_first(record, ("units", "punits"), None), f"{label} units", where, index),
        axes=_axes(_first(record, ("dimensions", "pdimensions"), None), label, context, index),
        reversed=_reversed(_first(record, ("directions", "pdirections"), None), label, context, index),
    )


def _axes(value: Any, label: str, context: _Context, index: list[int]) -> tuple[int, ...] | None:
    """The partition's dimension order as positions of aggregated dimensions (None: same order)."""
    if value is None:
        return None
    names = _strings(value, f"{label} dimensions", context.where, index)
    for name in names:
        if name not in context.dims:
            raise context.where.error(
                f"{label} has dimension {name!r}, which is not an aggregated dimension {list(context.dims)}", index
            )
    if len(set(names)) != len(names):
        raise context.where.error(f"{label} dimensions {names} repeat a dimension", index)
    axes = tuple(context.dims.index(name) for name in names)
    return None if axes == tuple(range(len(context.dims))) else axes


def _reversed(value: Any, label: str, context: _Context, index: list[int]) -> tuple[bool, ...] | None:
    """Per aggregated dimension, whether the partition runs against the aggregated data."""
    if value is None:
        return None
    own = _directions(value, context.dims, context.where, index, scalar_ok=not context.dims)
    flags = tuple(
        name in own and own[name] != context.directions.get(name, True) for name in context.dims
    )
    return flags if any(flags) else None


def _directions(
    value: Any, dims: Sequence[str], where: Where, index: list[int] | None, *, scalar_ok: bool
) -> dict[str, bool]:
    """A ``directions`` mapping (dimension -> increasing); scalar data may give one boolean."""
    if value is None or (scalar_ok and isinstance(value, bool)):
        return {}
    if not isinstance(value, dict) or not all(name in dims and isinstance(v, bool) for name, v in value.items()):
        raise where.error(f"directions {_show(value)} should map aggregated dimensions to true or false", index)
    return value


def _check_omitted_dims(partition: _Partition, start: np.ndarray, stop: np.ndarray, context: _Context) -> None:
    """A partition may leave out aggregated dimensions only where it spans one element."""
    if partition.axes is None:
        return
    for axis in set(range(len(context.dims))) - set(partition.axes):
        if stop[axis] - start[axis] != 1:
            raise context.where.error(
                f"partition leaves out dimension {context.dims[axis]!r} but spans "
                f"{stop[axis] - start[axis]} elements along it",
                partition.index,
            )


def _check_part(part: Any, shape: list[int] | None, label: str, where: Where, index: list[int]) -> None:
    """Accept a ``part`` only when it selects the whole file variable (and so changes nothing).

    ``part`` is a string like ``"[(0, 11, 1), [3, 1, 2]]"``: per file dimension,
    a ``(start, stop, step)`` range with stop included, or a list of indices.
    """
    if part is None or (isinstance(part, str) and part.strip() in ("", "[]")):
        return
    try:
        selections = ast.literal_eval(part) if isinstance(part, str) else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        selections = None
    if not isinstance(selections, list):
        raise where.error(f"{label} part {_show(part)} is not a list of index selections", index)
    if shape is None or len(selections) != len(shape) or not all(
        _selects_all(selection, size) for selection, size in zip(selections, shape)
    ):
        raise where.error(
            f"{label} takes part {_show(part)} of its file variable; partitions holding only part "
            "of a variable are not supported",
            index,
        )


def _selects_all(selection: Any, size: int) -> bool:
    if isinstance(selection, tuple) and len(selection) == 3 and all(type(v) is int for v in selection):
        start, stop, step = selection
        return step != 0 and range(start, stop + (1 if step > 0 else -1), step) == range(size)
    return isinstance(selection, list) and selection == list(range(size))


def _calendar(value: Any) -> str:
    """A calendar name in one spelling per calendar (none given = standard)."""
    name = str(value).strip().lower() if value is not None else "standard"
    return "standard" if name in ("", "gregorian") else name


def _optional_column(grid_shape: Sequence[int], index: np.ndarray, values: list[Any]) -> np.ndarray | None:
    """A per-fragment column, or None when no partition sets it."""
    if all(v is None for v in values):
        return None
    return scatter(grid_shape, index, values, None)


def _load_json(var: netCDF4.Variable, attr: str, where: Where) -> dict[str, Any]:
    text = var.getncattr(attr) if attr in var.ncattrs() else None
    if not isinstance(text, str):
        raise where.error(f"attribute {attr!r} is missing or not a string")
    charge(len(text) * JSON_EXPANSION, f"the JSON of attribute {attr!r} ({len(text):,} characters)",
           file=where.file, variable=where.variable)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise where.error(f"attribute {attr!r} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise where.error(f"attribute {attr!r} should hold a JSON object")
    return value


def _first(mapping: Mapping[str, Any], keys: Sequence[str], default: Any) -> Any:
    """The value of the first of ``keys`` present (the dialects' spellings vary)."""
    return next((mapping[key] for key in keys if key in mapping), default)


def _integers(
    value: Any, length: int | None, what: str, where: Where, index: list[int] | None = None
) -> list[int]:
    if (
        not isinstance(value, list)
        or not all(type(v) is int and -_HUGE <= v <= _HUGE for v in value)
        or (length is not None and len(value) != length)
    ):
        count = f"{length} " if length is not None else ""
        raise where.error(f"{what} should be a list of {count}integers, not {_show(value)}", index)
    return value


def _strings(value: Any, what: str, where: Where, index: list[int] | None = None) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise where.error(f"{what} should be a list of names, not {_show(value)}", index)
    return value


def _optional_string(value: Any, what: str, where: Where, index: list[int] | None = None) -> str | None:
    if value is not None and not isinstance(value, str):
        raise where.error(f"{what} should be a string, not {_show(value)}", index)
    return value


def _show(value: Any) -> str:
    """A JSON value for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
