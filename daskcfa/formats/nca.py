"""Readers of the JSON partition dialects: NCA 0.1-0.2 and, through the same code, CFA-0.4/0.3.

Early cf-python wrote NCA: one JSON attribute listing every partition with its
index in the partition matrix, its location in the aggregated array and the
file variable holding its data. CFA-0.4 (S3netCDF4, old cf-python) kept that
layout, renamed the attributes and made location ends inclusive. Only listed
partitions exist; the others read as missing data.

Both dialects' per-partition extras are honoured: own units, dimension order
and directions, file variables with size-1 dimensions the aggregation does
not span, and virtual partitions (``part``: the indices of the file variable
that make up the partition, so several partitions may share one file).
Refused with a CFAFormatError, because ignoring them would return wrong data:
non-netCDF fragment formats (PP) and a partition calendar other than the
aggregated variable's.

The convention's own examples write the JSON, and ``part``, as Python
literals (single quotes, tuples, True/None): when the text is not JSON it is
read by a small literal parser (no ``eval``; memory in proportion to the
text, nesting bounded).
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import netCDF4
import numpy as np

from ..errors import CFAFormatError
from ..model import AggregatedVariable, Fragments
from .netcdf import (
    Where,
    data_attributes,
    data_dtype,
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
from ..limits import JSON_EXPANSION, charge

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
    identifier_group: str | None = None,
) -> AggregatedVariable:
    """Read a variable whose partitions are listed in the JSON attribute ``array_attr``.

    ``identifier_group``: where in the sub-array files a bare ``ncvar`` is looked up first.
    """
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
        parts=_optional_column(grid_shape, index, [p.part for p in partitions]),
        identifier_group=identifier_group,
    )
    return AggregatedVariable(
        name=where.variable,
        dims=tuple(dims),
        dtype=data_dtype(var),
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
    part: tuple[range | tuple[int, ...], ...] | None


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
    shape = _first(data, ("shape", "pshape"), None)
    if shape is not None:
        shape = _integers(shape, None, f"{label} shape", where, index)
    names = _first(record, ("dimensions", "pdimensions"), None)
    axes = _axes(names, label, context, index)
    ndim = len(axes) if axes is not None else len(dims)
    part = _part(record.get("part"), ndim, shape, label, where, index)
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
        # (capped: beyond int64 never fits)
        count=min(math.prod(map(len, part)) if part is not None else math.prod(shape), _HUGE)
        if part is not None or shape is not None else -1,
        uri=uri,
        identifier=identifier,
        in_file=in_file,
        units=_optional_string(_first(record, ("units", "punits"), None), f"{label} units", where, index),
        axes=axes,
        reversed=_reversed(_first(record, ("directions", "pdirections"), None), label, context, index,
                           extra=set(names or ()) - set(dims)),
        part=part,
    )


def _axes(value: Any, label: str, context: _Context, index: list[int]) -> tuple[int, ...] | None:
    """The partition's dimension order as positions of aggregated dimensions (None: same order)."""
    if value is None:
        return None
    names = _strings(value, f"{label} dimensions", context.where, index)
    if len(set(names)) != len(names):
        raise context.where.error(f"{label} dimensions {names} repeat a dimension", index)
    # a dimension the aggregation does not span is a size-1 one of the file variable (-1)
    axes = tuple(context.dims.index(name) if name in context.dims else -1 for name in names)
    return None if axes == tuple(range(len(context.dims))) else axes


def _reversed(value: Any, label: str, context: _Context, index: list[int], *, extra: set[str]
              ) -> tuple[bool, ...] | None:
    """Per aggregated dimension, whether the partition runs against the aggregated data
    (``extra``: the partition's size-1 dimensions the aggregation lacks, which may be named too)."""
    if value is None:
        return None
    own = _directions(value, [*context.dims, *extra], context.where, index, scalar_ok=not context.dims)
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
        raise where.error(f"directions {_show(value)} should map dimensions {list(dims)} to true or false", index)
    return value


def _check_omitted_dims(partition: _Partition, start: np.ndarray, stop: np.ndarray, context: _Context) -> None:
    """A partition may leave out aggregated dimensions only where it spans one element, and
    its ``part`` must select as many elements as it spans along each dimension."""
    axes = partition.axes if partition.axes is not None else tuple(range(len(context.dims)))
    for axis, selection in zip(axes, partition.part or ()):
        spans = 1 if axis < 0 else stop[axis] - start[axis]
        if len(selection) != spans:
            along = "a dimension the aggregation does not span" if axis < 0 else repr(context.dims[axis])
            raise context.where.error(
                f"partition part selects {len(selection)} elements along {along}, but it spans {spans}",
                partition.index,
            )
    for axis in set(range(len(context.dims))) - set(axes):
        if stop[axis] - start[axis] != 1:
            raise context.where.error(
                f"partition leaves out dimension {context.dims[axis]!r} but spans "
                f"{stop[axis] - start[axis]} elements along it",
                partition.index,
            )


def _part(
    part: Any, ndim: int, shape: list[int] | None, label: str, where: Where, index: list[int]
) -> tuple[range | tuple[int, ...], ...] | None:
    """A virtual partition's ``part``: per file dimension, the indices it takes (None: all).

    ``part`` is a string like ``"[(2, 6, 1), [1, 3, 4, 7], (0, 12, 2)]"``: a
    ``(start, stop, step)`` range with stop included, or a list of indices.
    """
    if part is None or (isinstance(part, str) and part.strip() in ("", "[]")):
        return None
    try:
        selections = _python_literal(part, f"{label} part", where) if isinstance(part, str) else part
    except CFAFormatError as exc:
        raise exc.located(fragment=index) from None
    if not isinstance(selections, list) or len(selections) != ndim:
        raise where.error(f"{label} part {_show(part)} should list one index selection per dimension "
                          f"of its file variable ({ndim})", index)
    out: list[range | tuple[int, ...]] = []
    for d, selection in enumerate(selections):
        values = list(selection) if isinstance(selection, (list, tuple)) else None
        if values is None or not values or not all(type(v) is int and -_HUGE <= v <= _HUGE for v in values):
            values = None
        elif isinstance(selection, tuple):
            start, stop, step = values if len(values) == 3 else (0, 0, 0)
            values = range(start, stop + (1 if step > 0 else -1), step) if step else None
        else:
            values = tuple(values)
        size = shape[d] if shape is not None and len(shape) == ndim else None
        ends = (values[0], values[-1]) if isinstance(values, range) and values else values  # (a range: O(1))
        if not values or min(ends) < 0 or (size is not None and max(ends) >= size):
            raise where.error(f"{label} part {_show(part)}: selection {d} is not a non-empty range or list of "
                              f"indices within the file variable{f' (size {size})' if size is not None else ''}",
                              index)
        out.append(values)
    return tuple(out)


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
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        value = _python_literal(text, f"attribute {attr!r}", where)
    if not isinstance(value, dict):
        raise where.error(f"attribute {attr!r} should hold a JSON object")
    return value


#: Nesting deeper than any partition list needs is refused, not recursed into.
_MAX_DEPTH = 32
_TOKEN = re.compile(
    r"""\s*(?:(?P<open>[\[({])|(?P<close>[\])}])|(?P<comma>,)|(?P<colon>:)"""
    r"""|(?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
    r"""|(?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)|(?P<word>[A-Za-z]+))"""
)
_WORDS = {"true": True, "True": True, "false": False, "False": False, "null": None, "None": None}
_CLOSING = {"[": "]", "(": ")", "{": "}"}


def _python_literal(text: str, what: str, where: Where) -> Any:
    """A JSON or Python literal (dicts, lists, tuples, strings, numbers, True/False/None), read
    without ``eval``: a loop over tokens with an explicit stack."""
    stack: list[tuple[str, list]] = []  # open bracket, items so far
    done: list[Any] = []
    position, expect_value = 0, True
    while True:
        match = _TOKEN.match(text, position)
        if match is None:
            if text[position:].strip() == "" and not stack and done:
                return done[0]
            raise where.error(f"{what} is neither JSON nor a Python literal (at character {position}: "
                              f"{_show(text[position:position + 20])})")
        position, kind, token = match.end(), match.lastgroup, match.group(match.lastgroup)
        items = stack[-1][1] if stack else done
        if kind == "open" and expect_value:
            if len(stack) >= _MAX_DEPTH:
                raise where.error(f"{what} nests deeper than {_MAX_DEPTH} levels")
            stack.append((token, []))
            continue
        if kind in ("string", "number", "word") and expect_value:
            items.append(_scalar(kind, token, what, where))
            expect_value = False
        elif kind == "close" and stack and _CLOSING[stack[-1][0]] == token and (items or expect_value):
            bracket, values = stack.pop()
            value = _container(bracket, values, what, where)
            (stack[-1][1] if stack else done).append(value)
            expect_value = False
        elif kind == "comma" and stack and not expect_value:
            expect_value = True
        elif kind == "colon" and stack and stack[-1][0] == "{" and not expect_value and len(items) % 2:
            expect_value = True
        else:
            raise where.error(f"{what} is neither JSON nor a Python literal (unexpected {_show(token)} "
                              f"at character {match.start(kind)})")


def _scalar(kind: str, token: str, what: str, where: Where) -> Any:
    if kind == "string":
        if "\\" not in token:
            return token[1:-1]  # (nothing to unescape: by far the common case)
        try:
            return ast.literal_eval(token)  # one string literal: no more memory than the string
        except (ValueError, SyntaxError) as exc:
            raise where.error(f"{what} holds a malformed string {_show(token)} ({exc})") from None
    if kind == "word":
        if token not in _WORDS:
            raise where.error(f"{what} holds the bare word {_show(token)}")
        return _WORDS[token]
    try:
        return float(token) if any(c in token for c in ".eE") else int(token)
    except ValueError as exc:  # (e.g. more digits than int() accepts)
        raise where.error(f"{what} holds the malformed number {_show(token)} ({exc})") from None


def _container(bracket: str, values: list, what: str, where: Where) -> Any:
    if bracket == "[":
        return values
    if bracket == "(":
        return tuple(values)
    keys = values[0::2]
    if len(values) % 2 or not all(isinstance(k, str) for k in keys):
        raise where.error(f"{what} has an object whose keys are not all strings with values")
    return dict(zip(keys, values[1::2]))


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
