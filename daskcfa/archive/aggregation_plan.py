"""Planning an aggregation of scanned files: pure, on the client, no I/O.

Coordinates are brought to common units (time coordinates through cftime:
different reference dates and time units compare correctly; calendars must
agree), the concatenation dimensions are inferred (those whose coordinates
differ between files), the files are ordered along each of them and checked
to tile the whole domain -- no gap, no overlap, no missing or duplicate tile
-- and every variable is checked to agree across files (dimensions, dtype
kind, convertible units). The result is the in-memory model
(:class:`~daskcfa.model.AggregationDataset`): coordinate variables
concatenated in the earliest file's units, variables without the
concatenation dimensions copied, and every other variable aggregated with
one fragment per file. What the model needs beyond the files' metadata (the
values of ordinary variables) the planner asks for (:meth:`Planner.plain_reads`)
and :mod:`.scan` reads.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import cftime
import numpy as np

from ..decode import STORAGE_ATTRS, Encoding, default_fill_value, same_value
from ..errors import AggregationError, CFAWarning, redact
from ..model import (BOUNDS_ATTRS, AggregatedVariable, AggregationDataset, Dimension, FragmentGrid, Fragments,
                     PlainVariable, is_coordinate_variable)
from ..units import unit

__all__ = ["VariableInfo", "FileInfo", "PlainReads", "Planner", "digest", "FILES_NAMED"]

#: Files named in one error message before "and N more".
FILES_NAMED = 6


@dataclass(frozen=True)
class VariableInfo:
    """One variable of one file, as stored."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype  #: stored dtype (``object`` for netCDF strings)
    attrs: dict[str, Any]

    @property
    def is_numeric(self) -> bool:
        return self.dtype.kind in "biuf"


@dataclass
class FileInfo:
    """What the metadata scan learns about one file (small: it travels to the client)."""

    uri: str
    attrs: dict[str, Any]
    dims: dict[str, int]
    variables: dict[str, VariableInfo]
    #: stored values of the coordinate variables and their bounds
    values: dict[str, np.ndarray] = field(default_factory=dict)
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlainReads:
    """The ordinary variables' values the model needs, and what to read of each file."""

    copied: tuple[str, ...]  #: from the earliest file; the others must agree (their digests)
    concatenated: tuple[str, ...]  #: from every file
    #: per file: (URI, variables to read, variables to digest); empty when nothing is needed
    files: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]


def digest(values: np.ndarray) -> str:
    h = hashlib.md5(usedforsecurity=False)
    h.update(f"{values.dtype.str}{values.shape}".encode())
    if values.dtype.kind == "O":
        h.update("\x00".join(map(str, values.ravel().tolist())).encode())
    else:
        h.update(np.ascontiguousarray(values).tobytes())
    return h.hexdigest()


@dataclass
class _Segment:
    """One stretch of a concatenation dimension: the files that cover it, and its coordinates."""

    key: Any
    files: list[int]  #: indices into the planner's ``infos``
    size: int
    values: np.ndarray | None = None  #: coordinate values in common units
    order: Any = None


class Planner:
    """Checks scanned files against each other and lays them out as one aggregation (no I/O)."""

    def __init__(self, infos: list[FileInfo], concat_dims: Sequence[str] | None, variables: Sequence[str] | None,
                 positions: Mapping[str, Mapping[str, int]]) -> None:
        if not infos:
            raise AggregationError("no files to aggregate")
        self.infos = infos
        self.positions = positions
        grouped = [i.uri for i in infos if i.groups]
        if grouped:
            warnings.warn(f"only the root group is aggregated; groups are ignored in {_names(grouped)}", CFAWarning,
                          stacklevel=4)
        self.wanted = self._wanted(variables)
        self.bounds = self._bounds_of()
        self.dims = self._dimensions()
        self.units = self._coordinate_units()
        self.coords = {name: [self._coordinate(i, name) for i in range(len(infos))]
                       for name in self.wanted if self._is_coordinate(name)}
        self.concat = self._concat_dims(concat_dims)
        self.segments = {dim: self._segments(dim) for dim in self.concat}
        self.grid = self._tile()

    # ---- variables ------------------------------------------------------

    def _wanted(self, variables: Sequence[str] | None) -> list[str]:
        """The variables to aggregate or copy: as asked plus their coordinates, present in every file."""
        everywhere: dict[str, list[str]] = {}
        for info in self.infos:
            for name in info.variables:
                everywhere.setdefault(name, []).append(info.uri)
        if variables is None:
            chosen = list(everywhere)
        else:
            chosen = []
            for name in variables:
                name = name.lstrip("/")
                if name not in everywhere:
                    raise AggregationError(f"variable {name!r} is in none of the files", variable=name,
                                           file=self.infos[0].uri)
                chosen.append(name)
            for name in list(chosen):  # their coordinates, then the bounds of those
                var = next(i.variables[name] for i in self.infos if name in i.variables)
                related = list(var.dims) + str(var.attrs.get("coordinates", "")).split()
                chosen += [n for n in related if n in everywhere and n not in chosen]
            for name in list(chosen):
                var = next(i.variables[name] for i in self.infos if name in i.variables)
                if is_coordinate_variable(name, var.dims):
                    chosen += [b for b in (var.attrs.get("bounds"), var.attrs.get("climatology"))
                               if isinstance(b, str) and b in everywhere and b not in chosen]
        for name in chosen:
            missing = [i.uri for i in self.infos if name not in i.variables]
            if missing:
                raise AggregationError(
                    f"variable {name!r} is missing from {_names(missing)} (present in "
                    f"{len(self.infos) - len(missing)} other files)", variable=name, file=missing[0])
        for name in chosen:
            self._check_variable(name)
        return chosen

    def _check_variable(self, name: str) -> None:
        ref = self.infos[0].variables[name]
        other_dims = [i.uri for i in self.infos if i.variables[name].dims != ref.dims]
        if other_dims:
            found = self._var(other_dims[0], name).dims
            raise AggregationError(f"variable {name!r} has dimensions {found} in {_names(other_dims)}, but "
                                   f"{ref.dims} in {self.infos[0].uri}", variable=name, file=other_dims[0])
        kinds = {self._kind(i.variables[name]) for i in self.infos}
        if len(kinds) > 1:
            odd = [i.uri for i in self.infos if self._kind(i.variables[name]) != self._kind(ref)]
            raise AggregationError(f"variable {name!r} has incompatible types: {self._var(odd[0], name).dtype} in "
                                   f"{_names(odd)}, {ref.dtype} in {self.infos[0].uri}", variable=name, file=odd[0])
        units = [(i.uri, i.variables[name].attrs.get("units")) for i in self.infos]
        ref_units = units[0][1]
        if any(u != ref_units for _, u in units):
            bad = [uri for uri, u in units if not _convertible(u, ref_units, ref.attrs.get("calendar"))]
            if bad:
                found = self._var(bad[0], name).attrs.get("units")
                raise AggregationError(f"variable {name!r} has units {found!r} in {_names(bad)}, which cannot be "
                                       f"converted to {ref_units!r} (the units in {self.infos[0].uri})",
                                       variable=name, file=bad[0])

    def _var(self, uri: str, name: str) -> VariableInfo:
        return next(i for i in self.infos if i.uri == uri).variables[name]

    @staticmethod
    def _kind(var: VariableInfo) -> str:
        return "number" if var.is_numeric else str(var.dtype)

    def _is_coordinate(self, name: str) -> bool:
        return is_coordinate_variable(name, self.infos[0].variables[name].dims)

    def _bounds_of(self) -> dict[str, str]:
        """Bounds variable -> the coordinate variable it bounds."""
        first = self.infos[0].variables
        out = {}
        for name in self.wanted:
            if self._is_coordinate(name):
                for key in BOUNDS_ATTRS:
                    b = first[name].attrs.get(key)
                    if isinstance(b, str) and b in self.wanted and first[b].dims[:1] == (name,):
                        out[b] = name
        return out

    # ---- dimensions and coordinates -------------------------------------

    def _dimensions(self) -> list[str]:
        used = []
        for name in self.wanted:
            used += [d for d in self.infos[0].variables[name].dims if d not in used]
        return used

    def _coordinate_units(self) -> dict[str, tuple[str | None, str | None]]:
        """Per coordinate variable, (units, calendar) of the first file; calendars checked to agree."""
        out = {}
        for name in self.wanted:
            if not self._is_coordinate(name):
                continue
            attrs = self.infos[0].variables[name].attrs
            units = attrs.get("units")
            calendar = _calendar(attrs.get("calendar")) if _is_time(units) else None
            if calendar is not None:
                odd = [i.uri for i in self.infos if _calendar(i.variables[name].attrs.get("calendar")) != calendar]
                if odd:
                    found = self._var(odd[0], name).attrs.get("calendar", "standard")
                    raise AggregationError(f"coordinate {name!r} uses the calendar {found!r} in {_names(odd)}, but "
                                           f"{calendar!r} in {self.infos[0].uri}", variable=name, file=odd[0])
            out[name] = (str(units) if units is not None else None, calendar)
        return out

    def _coordinate(self, index: int, name: str, units: str | None = None) -> np.ndarray:
        """A file's coordinate (or bounds) values, unpacked, in ``units`` (default: the first file's)."""
        info = self.infos[index]
        var = info.variables[name]
        raw = info.values[name]
        parent = self.bounds.get(name, name)
        if not var.is_numeric:
            return raw
        values = np.ma.filled(Encoding.from_attrs(var.attrs, var.dtype).decode(raw, mask=False))
        target_units = units if units is not None else self.units.get(parent, (None, None))[0]
        own = self._units_of(index, name)
        if target_units is None or own is None or str(own) == target_units:
            return values
        calendar = self.units.get(parent, (None, None))[1]
        try:
            if calendar is not None:
                dates = cftime.num2date(values, str(own), calendar, only_use_cftime_datetimes=True)
                return np.asarray(cftime.date2num(dates, target_units, calendar), dtype=np.float64)
            return unit(str(own)).convert(values.astype(np.float64), unit(target_units))
        except (ValueError, TypeError) as exc:
            raise AggregationError(f"coordinate {name!r} in units {own!r} cannot be converted to {target_units!r} "
                                   f"({exc})", variable=name, file=info.uri) from None

    def _concat_dims(self, given: Sequence[str] | None) -> list[str]:
        positioned = {d for p in self.positions.values() for d in p}
        if given is not None:
            concat = [d for d in given]
            unknown = [d for d in concat if d not in self.dims]
            if unknown:
                raise AggregationError(f"concat_dims names {unknown}, which no aggregated variable has; "
                                       f"dimensions: {', '.join(self.dims)}", file=self.infos[0].uri)
        else:
            concat = [d for d in self.dims if self._varies(d) or d in positioned]
        for dim in self.dims:
            if dim in concat:
                continue
            sizes = [i.dims[dim] for i in self.infos]
            odd = [i.uri for i in self.infos if i.dims[dim] != sizes[0]]
            if odd:
                raise AggregationError(f"dimension {dim!r} has size {self.infos[self._index(odd[0])].dims[dim]} in "
                                       f"{_names(odd)}, but {sizes[0]} in {self.infos[0].uri} (and it is not "
                                       "concatenated)", file=odd[0])
            if dim in self.coords:
                odd = [self.infos[i].uri for i, v in enumerate(self.coords[dim]) if not same_value(v, self.coords[dim][0])]
                if odd:
                    raise AggregationError(f"coordinate {dim!r} has different values in {_names(odd)} than in "
                                           f"{self.infos[0].uri} (and it is not concatenated)", variable=dim,
                                           file=odd[0])
        if len(self.infos) > 1 and not concat:
            raise AggregationError(f"the {len(self.infos)} files have the same coordinates: nothing to concatenate "
                                   f"({_names([i.uri for i in self.infos])}); give concat_dims= to choose a "
                                   "dimension", file=self.infos[0].uri)
        return concat

    def _varies(self, dim: str) -> bool:
        if any(i.dims[dim] != self.infos[0].dims[dim] for i in self.infos):
            return True
        values = self.coords.get(dim)
        return values is not None and any(not same_value(v, values[0]) for v in values)

    def _index(self, uri: str) -> int:
        return next(n for n, i in enumerate(self.infos) if i.uri == uri)

    # ---- ordering and tiling --------------------------------------------

    def _segments(self, dim: str) -> list[_Segment]:
        """The stretches of ``dim`` the files cover, in order, checked for gaps and overlaps."""
        coords = self.coords.get(dim)
        by_key: dict[Any, _Segment] = {}
        for n, info in enumerate(self.infos):
            if info.uri in self.positions and dim in self.positions[info.uri]:
                key = ("position", self.positions[info.uri][dim])
            elif coords is not None:
                key = ("values", coords[n].dtype.str, coords[n].tobytes() if coords[n].dtype.kind != "O"
                       else tuple(coords[n].tolist()))
            else:
                key = ("file", n)
            segment = by_key.setdefault(key, _Segment(key, [], info.dims[dim],
                                                      None if coords is None else coords[n]))
            segment.files.append(n)
            if info.dims[dim] != segment.size:
                raise AggregationError(f"files at the same position along {dim!r} have different sizes: "
                                       f"{_names([self.infos[segment.files[0]].uri, info.uri])}", file=info.uri)
        segments = list(by_key.values())
        kinds = {s.key[0] for s in segments}
        if kinds == {"file"} and len(self.concat) > 1:
            raise AggregationError(f"dimension {dim!r} has no coordinate variable: files can be ordered along it "
                                   "(in the order given) only when it is the one concatenation dimension",
                                   file=self.infos[0].uri)
        if len(kinds) > 1:
            raise AggregationError(f"some files have a position along {dim!r} and others not: "
                                   f"{_names([self.infos[s.files[0]].uri for s in segments])}", file=self.infos[0].uri)
        if kinds == {"position"}:
            segments.sort(key=lambda s: s.key[1])
            if [s.key[1] for s in segments] != list(range(len(segments))):
                raise AggregationError(f"fragments are missing along {dim!r}: positions "
                                       f"{[s.key[1] for s in segments]} found", file=self.infos[0].uri)
        elif kinds == {"values"}:
            self._order_by_values(dim, segments)
        if coords is not None and coords[0].dtype.kind in "biuf":
            self._check_contiguous(dim, segments)
        return segments

    def _order_by_values(self, dim: str, segments: list[_Segment]) -> None:
        directions = set()
        for s in segments:
            if s.values.size > 1:
                diffs = np.diff(s.values.astype(np.float64)) if s.values.dtype.kind in "biuf" else None
                if diffs is None or not ((diffs > 0).all() or (diffs < 0).all()):
                    raise AggregationError(f"coordinate {dim!r} is not strictly monotonic in "
                                           f"{_names([self.infos[n].uri for n in s.files])}", variable=dim,
                                           file=self.infos[s.files[0]].uri)
                directions.add(bool(diffs[0] > 0))
        if len(directions) > 1:
            raise AggregationError(f"coordinate {dim!r} increases in some files and decreases in others",
                                   variable=dim, file=self.infos[0].uri)
        if any(s.values.dtype.kind not in "biuf" for s in segments):
            raise AggregationError(f"coordinate {dim!r} is not numeric: the files cannot be ordered along it",
                                   variable=dim, file=self.infos[0].uri)
        increasing = directions != {False}
        segments.sort(key=lambda s: float(s.values[0]) if s.values.size else np.inf, reverse=not increasing)

    def _check_contiguous(self, dim: str, segments: list[_Segment]) -> None:
        """No overlap, and no gap wider than the coordinate's usual step, between consecutive segments."""
        values = [np.asarray(s.values, dtype=np.float64) for s in segments]
        if any(v.size == 0 for v in values) or len(values) < 2:
            return
        inner = np.concatenate([np.abs(np.diff(v)) for v in values])
        joins = np.array([abs(b[0] - a[-1]) for a, b in zip(values, values[1:])])
        sign = 1.0 if (values[-1][-1] - values[0][0]) >= 0 else -1.0
        step = float(np.median(inner)) if inner.size else float(np.median(joins))
        widest = float(inner.max()) if inner.size else step
        for k, (a, b) in enumerate(zip(values, values[1:])):
            files_a = [self.infos[n].uri for n in segments[k].files]
            files_b = [self.infos[n].uri for n in segments[k + 1].files]
            if sign * (b[0] - a[-1]) <= 0:
                raise AggregationError(
                    f"files overlap along {dim!r}: {_names(files_a)} cover {_span(a)} and {_names(files_b)} cover "
                    f"{_span(b)} (coordinate values differ between files)", variable=dim, file=files_b[0])
            gap = abs(b[0] - a[-1])
            if gap > 1.5 * step and gap > widest * (1 + 1e-9):
                raise AggregationError(
                    f"gap along {dim!r} between {_names(files_a)} (ending at {a[-1]:g}) and {_names(files_b)} "
                    f"(starting at {b[0]:g}): a step of {gap:g} where the coordinate's step is {step:g}",
                    variable=dim, file=files_b[0])

    def _tile(self) -> dict[tuple[int, ...], int]:
        """Grid index (along the concatenation dimensions) -> file; every tile exactly once."""
        where: dict[int, list[int]] = {n: [] for n in range(len(self.infos))}
        for dim in self.concat:
            for k, segment in enumerate(self.segments[dim]):
                for n in segment.files:
                    where[n].append(k)
        grid: dict[tuple[int, ...], int] = {}
        for n, index in where.items():
            index = tuple(index)
            if index in grid:
                raise AggregationError(f"{_names([self.infos[grid[index]].uri, self.infos[n].uri])} cover the same "
                                       f"part of the domain along {', '.join(self.concat)}", file=self.infos[n].uri)
            grid[index] = n
        shape = tuple(len(self.segments[d]) for d in self.concat)
        expected = int(np.prod(shape, dtype=np.int64))
        if len(grid) != expected:
            missing = next(i for i in np.ndindex(*shape) if i not in grid)
            where_missing = ", ".join(f"{d} {self._describe_segment(d, k)}" for d, k in zip(self.concat, missing))
            neighbours = [self.infos[n].uri for i, n in grid.items()
                          if sum(a != b for a, b in zip(i, missing)) == 1]
            raise AggregationError(
                f"the files do not tile the domain: {len(grid)} files for a {' x '.join(map(str, shape))} grid "
                f"along {', '.join(self.concat)}; no file covers {where_missing} (beside {_names(neighbours)})",
                file=self.infos[0].uri)
        return grid

    def _describe_segment(self, dim: str, k: int) -> str:
        segment = self.segments[dim][k]
        if segment.values is not None and segment.values.size and segment.values.dtype.kind in "biuf":
            return _span(np.asarray(segment.values, dtype=np.float64))
        return f"part {k}"

    # ---- the model -------------------------------------------------------

    def plain_reads(self) -> PlainReads:
        """What the model needs read from the files beyond their metadata: the ordinary
        variables copied (from the earliest file; digests of the others) or concatenated."""
        order = [self.grid[i] for i in sorted(self.grid)]
        first = order[0]  # the earliest file: its units and attributes describe the aggregation
        self._rebase(first)
        aggregated, copied, concatenated = [], [], []
        for name in self.wanted:
            var = self.infos[first].variables[name]
            spans = [d for d in var.dims if d in self.concat]
            if self._is_coordinate(name) or name in self.bounds:
                continue
            if var.is_numeric and var.dims and (spans or not self.concat):
                aggregated.append(name)
            elif spans:
                concatenated.append(name)
            else:
                copied.append(name)
        self._order, self._first, self._aggregated_names = order, first, aggregated
        files = tuple((info.uri, tuple(concatenated) + (tuple(copied) if n == first else ()),
                       tuple(copied) if n != first else ()) for n, info in enumerate(self.infos))
        return PlainReads(tuple(copied), tuple(concatenated), files if copied or concatenated else ())

    def model(self, reads: PlainReads, results: Sequence[tuple[dict[str, np.ndarray], dict[str, str]] | str]
              ) -> AggregationDataset:
        """The aggregation, given what :meth:`plain_reads` asked for (per file: values and
        digests, or why the file cannot be read)."""
        order, first = self._order, self._first
        bounds = self.bounds
        plain_values = self._plain_values(first, list(reads.copied), list(reads.concatenated), results)

        model = AggregationDataset(attrs=_common_attrs([i.attrs for i in (self.infos[n] for n in order)]))
        sizes = {d: sum(s.size for s in self.segments[d]) if d in self.concat else self.infos[first].dims[d]
                 for d in self.dims}
        model.dimensions = [Dimension(f"/{d}", sizes[d]) for d in self.dims]
        for name in self.wanted:
            var = self.infos[first].variables[name]
            if self._is_coordinate(name) or name in bounds:
                model.variables.append(self._coordinate_variable(name, first, bounds))
            elif name in plain_values:
                model.variables.append(PlainVariable(f"/{name}", var.dims, var.dtype, dict(var.attrs),
                                                     plain_values[name]))
        model.aggregated = [self._aggregated(name, first) for name in self._aggregated_names]
        return model

    def _rebase(self, first: int) -> None:
        """Coordinates in the earliest file's units, when they differ from the first-listed file's."""
        changed = False
        for name, (units, calendar) in list(self.units.items()):
            own = self.infos[first].variables[name].attrs.get("units")
            if own is not None and str(own) != units:
                self.units[name] = (str(own), calendar)
                changed = True
        if changed:
            self.coords = {name: [self._coordinate(i, name) for i in range(len(self.infos))] for name in self.coords}
            for dim in self.concat:
                for segment in self.segments[dim]:
                    if segment.values is not None:
                        segment.values = self.coords[dim][segment.files[0]]

    def _units_of(self, index: int, name: str) -> Any:
        """Units of a coordinate in one file; bounds without their own take their coordinate's."""
        variables = self.infos[index].variables
        return variables[name].attrs.get("units", variables[self.bounds.get(name, name)].attrs.get("units"))

    def _coordinate_variable(self, name: str, first: int, bounds: Mapping[str, str]) -> PlainVariable:
        var = self.infos[first].variables[name]
        parent = bounds.get(name, name)
        pieces = {index: self._coordinate(n, name) for index, n in self.grid.items()}
        exact = all(self._units_of(n, name) == self._units_of(first, name)
                    and self.infos[n].variables[name].dtype == var.dtype for n in self.grid.values())
        attrs = dict(var.attrs)
        if exact and var.is_numeric and not Encoding.from_attrs(var.attrs, var.dtype).is_packed:
            pieces = {index: self.infos[n].values[name] for index, n in self.grid.items()}
            dtype = var.dtype
        elif var.is_numeric:
            attrs = {k: v for k, v in attrs.items() if k not in STORAGE_ATTRS}
            dtype = np.dtype(np.float64)
        else:
            dtype = var.dtype
        if parent == name and name in self.units and self.units[name][0] is not None:
            attrs["units"] = self.units[name][0]
        elif parent != name and "units" in attrs:
            attrs["units"] = self.units[parent][0]
        data = self._assemble(pieces, var.dims)
        return PlainVariable(f"/{name}", var.dims, dtype, attrs, np.asarray(data, dtype=dtype))

    def _plain_values(self, first: int, copied: list[str], concatenated: list[str],
                      results: Sequence[tuple[dict[str, np.ndarray], dict[str, str]] | str]) -> dict[str, np.ndarray]:
        """Values of the ordinary variables: copied from the earliest file (the others must agree) or concatenated."""
        if not copied and not concatenated:
            return {}
        failed = [(self.infos[n].uri, r) for n, r in enumerate(results) if isinstance(r, str)]
        if failed:
            raise AggregationError(f"cannot read {_names([u for u, _ in failed])}: {failed[0][1]}", file=failed[0][0])
        values = dict(results[first][0])
        reference = {name: digest(values[name]) for name in copied}
        for name in copied:
            odd = [self.infos[n].uri for n, r in enumerate(results) if n != first and r[1][name] != reference[name]]
            if odd:
                raise AggregationError(f"variable {name!r} has different values in {_names(odd)} than in "
                                       f"{self.infos[first].uri} (it has no concatenation dimension, so all files "
                                       "must agree)", variable=name, file=odd[0])
        for name in concatenated:
            pieces = {index: results[n][0][name] for index, n in self.grid.items()}
            values[name] = self._assemble(pieces, self.infos[first].variables[name].dims)
        return values

    def _assemble(self, pieces: Mapping[tuple[int, ...], np.ndarray], dims: tuple[str, ...]) -> np.ndarray:
        """Concatenate per-file pieces along the concatenation dimensions ``dims`` has (others: index 0)."""
        axes = [(k, dims.index(d)) for k, d in enumerate(self.concat) if d in dims]
        keep = {k for k, _ in axes}
        chosen = {i: v for i, v in pieces.items() if all(j == 0 for k, j in enumerate(i) if k not in keep)}

        def nest(prefix: tuple[int, ...], depth: int) -> np.ndarray:
            if depth == len(axes):
                full = [0] * len(self.concat)
                for (k, _), j in zip(axes, prefix):
                    full[k] = j
                return np.asarray(chosen[tuple(full)])
            k, axis = axes[depth]
            parts = [nest(prefix + (j,), depth + 1) for j in range(len(self.segments[self.concat[k]]))]
            return np.concatenate(parts, axis=axis)

        return nest((), 0)

    def _aggregated(self, name: str, first: int) -> AggregatedVariable:
        var = self.infos[first].variables[name]
        dtype, attrs = _aggregated_encoding([self.infos[n].variables[name] for n in self.grid.values()], var)
        sizes = [tuple(s.size for s in self.segments[d]) if d in self.concat else (self.infos[first].dims[d],)
                 for d in var.dims]
        grid = FragmentGrid.from_sizes(sizes)
        uris = np.full(grid.grid_shape, "", dtype=object)
        axes = [(k, var.dims.index(d)) for k, d in enumerate(self.concat) if d in var.dims]
        spanned = {k for k, _ in axes}
        for index, n in self.grid.items():
            if all(j == 0 for k, j in enumerate(index) if k not in spanned):  # one file per fragment
                cell = [0] * len(var.dims)
                for k, axis in axes:
                    cell[axis] = index[k]
                uris[tuple(cell)] = self.infos[n].uri
        return AggregatedVariable(name=f"/{name}", dims=var.dims, dtype=dtype, attrs=attrs,
                                  fragments=Fragments(grid, uris=uris, identifiers=np.array(name, dtype=object)),
                                  dialect="CF-1.13", source=self.infos[first].uri)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def _aggregated_encoding(fragments: list[VariableInfo], ref: VariableInfo) -> tuple[np.dtype, dict[str, Any]]:
    """The aggregation variable's dtype and attributes.

    Readers apply each fragment's own packing and missing values before
    aggregating (CF's canonical form), then the aggregation variable's. When
    every file stores the variable alike, the aggregation variable keeps that
    description. Otherwise (packing, different dtypes or missing values) it
    describes the unpacked data: the common unpacked dtype, without the
    storage attributes, with netCDF's default fill value for masked points.
    """
    storage_attrs = [{k: a.attrs.get(k) for k in STORAGE_ATTRS if k in a.attrs} for a in fragments]
    uniform = all(f.dtype == ref.dtype for f in fragments) and all(_same_attrs(s, storage_attrs[0])
                                                                   for s in storage_attrs)
    encodings = [Encoding.from_attrs(f.attrs, f.dtype) for f in fragments]
    if uniform and not encodings[0].is_packed:
        return ref.dtype, dict(ref.attrs)
    dtype = np.result_type(*(e.decoded_dtype for e in encodings))
    attrs = {k: v for k, v in ref.attrs.items() if k not in STORAGE_ATTRS}
    fill = default_fill_value(dtype)
    if fill is not None:
        attrs["_FillValue"] = fill
    return dtype, attrs


def _common_attrs(all_attrs: list[dict[str, Any]]) -> dict[str, Any]:
    """Global attributes every file has with the same value (history, creation dates... differ: dropped)."""
    first = all_attrs[0]
    return {k: v for k, v in first.items() if all(k in a and same_value(a[k], v) for a in all_attrs[1:])}


def _same_attrs(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)


def _is_time(units: Any) -> bool:
    return isinstance(units, str) and " since " in units.lower()


def _calendar(calendar: Any) -> str:
    value = str(calendar or "standard").lower()
    return "standard" if value == "gregorian" else value


def _convertible(units: Any, ref_units: Any, calendar: Any) -> bool:
    if units is None or ref_units is None:
        return units is None and ref_units is None
    try:
        return unit(str(units), calendar).is_convertible(unit(str(ref_units), calendar))
    except ValueError:
        return False


def _span(values: np.ndarray) -> str:
    return f"[{values[0]:g} .. {values[-1]:g}]"


def _names(uris: Iterable[str]) -> str:
    uris = list(dict.fromkeys(redact(u) for u in uris))
    shown = ", ".join(uris[:FILES_NAMED])
    return shown + (f" and {len(uris) - FILES_NAMED} more" if len(uris) > FILES_NAMED else "")
