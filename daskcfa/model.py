"""The one in-memory model of an aggregation that every dialect reads into.

Dialect parsers (:mod:`daskcfa.formats`) build these objects; the read graph
(:mod:`daskcfa.graph`) and the writers consume them. Per-fragment facts are
kept as numpy columns over the fragment grid rather than as one Python object
per fragment, so that aggregations with a million fragments stay cheap.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import posixpath
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator, Sequence

import numpy as np

__all__ = ["FragmentGrid", "Fragments", "FragmentRef", "AggregatedVariable", "PlainVariable", "Dimension",
           "AggregationDataset", "ancestry", "BOUNDS_ATTRS", "is_coordinate_variable"]

#: Attributes by which a coordinate variable names the variable holding its cell boundaries (CF 7.1, 7.4).
BOUNDS_ATTRS = ("bounds", "climatology")


@dataclass(frozen=True)
class FragmentGrid:
    """Where the fragments sit: the fragment sizes along every dimension.

    Every fragment boundary runs across the whole array, so the grid is fully
    described by one list of sizes per dimension (the rows of a CF ``map``).
    """

    sizes: tuple[tuple[int, ...], ...]

    @classmethod
    def from_sizes(cls, sizes: Any) -> "FragmentGrid":
        return cls(tuple(tuple(int(s) for s in row) for row in sizes))

    @cached_property
    def offsets(self) -> tuple[tuple[int, ...], ...]:
        """Start of every fragment along each dimension, plus the dimension size last."""
        return tuple(tuple(itertools.accumulate(row, initial=0)) for row in self.sizes)

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the aggregated array."""
        return tuple(off[-1] for off in self.offsets)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Number of fragments along each dimension."""
        return tuple(len(row) for row in self.sizes)

    @property
    def nfragments(self) -> int:
        return int(np.prod(self.grid_shape, dtype=np.int64))

    def fragment_at(self, dim: int, position: int) -> int:
        """Index of the fragment holding ``position`` along ``dim`` (O(log n))."""
        return bisect.bisect_right(self.offsets[dim], position) - 1

    def fragments_between(self, dim: int, start: int, stop: int) -> range:
        """Fragment indices along ``dim`` that overlap ``[start, stop)`` (O(log n))."""
        if stop <= start:
            return range(0)
        return range(self.fragment_at(dim, start), self.fragment_at(dim, stop - 1) + 1)

    def fragment_slices(self, index: tuple[int, ...]) -> tuple[slice, ...]:
        """Where fragment ``index`` sits in the aggregated array."""
        return tuple(slice(off[i], off[i + 1]) for off, i in zip(self.offsets, index))

    def fragment_shape(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(row[i] for row, i in zip(self.sizes, index))

    def indices(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(n) for n in self.grid_shape))


@dataclass(frozen=True)
class FragmentRef:
    """Everything needed to produce one fragment's data, in canonical form.

    Exactly one of three cases holds: ``uris`` is non-empty (data in a file),
    ``value`` is set (one value fills the fragment), or neither (the fragment
    is wholly missing and reads as missing data).
    """

    index: tuple[int, ...]
    shape: tuple[int, ...]
    uris: tuple[str, ...] = ()
    identifier: str | None = None
    #: the variable name in each of ``uris``, where they differ (CFA-0.6.2
    #: addresses one per alternative URI); empty: ``identifier`` in all
    identifiers: tuple[str | None, ...] = ()
    value: Any = None
    units: str | None = None
    #: Fragment-file dimension order, as positions of aggregated dimensions
    #: (only NCA partitions may be transposed; -1: a size-1 file dimension the
    #: aggregation does not span); ``None`` = same order.
    axes: tuple[int, ...] | None = None
    #: Per aggregated dimension, True where the fragment stores it reversed.
    reversed: tuple[bool, ...] | None = None
    #: Group of the fragment file where a bare ``identifier`` is looked up
    #: before the root (S3netCDF4 writes a grouped variable at its group path).
    identifier_group: str | None = None
    #: NCA virtual partition: per file dimension, the indices of the file
    #: variable that make up the fragment (a ``range`` or a tuple); None = all.
    part: tuple[range | tuple[int, ...], ...] | None = None

    @property
    def is_missing(self) -> bool:
        return not self.uris and self.value is None

    def at_alternative(self, position: int) -> "FragmentRef":
        """This fragment as found at its ``position``-th URI (whose own variable name it takes)."""
        if not self.identifiers or self.identifiers[position] == self.identifier:
            return self
        return dataclasses.replace(self, identifier=self.identifiers[position])

    def variable_names(self, default: str) -> tuple[str, ...]:
        """The names to look the fragment's variable up by in its file, in order."""
        name = self.identifier or default
        if self.identifier_group in (None, "", "/") or "/" in name:
            return (name,)
        return (f"{self.identifier_group.rstrip('/')}/{name}", name)


@dataclass(frozen=True)
class Fragments:
    """Per-fragment instructions, as columns over the fragment grid.

    ``uris`` has the grid's shape plus one trailing axis of alternative
    locations (tried in order); empty strings or ``None`` pad it. The optional
    columns broadcast against the grid shape: a 0-d ``identifiers`` means
    "the same variable name in every fragment". ``identifiers`` may also have
    the shape of ``uris``: one name per alternative URI (CFA-0.6.2), where a
    missing one means the fragment's first name.
    """

    grid: FragmentGrid
    uris: np.ndarray | None = None
    identifiers: np.ndarray | None = None
    unique_values: np.ma.MaskedArray | None = None
    units: np.ndarray | None = None
    axes: np.ndarray | None = None
    reversed: np.ndarray | None = None
    parts: np.ndarray | None = None  #: :attr:`FragmentRef.part` per fragment
    #: see :attr:`FragmentRef.identifier_group` (one group for every fragment)
    identifier_group: str | None = None

    def __post_init__(self) -> None:
        if self.uris is not None and self.uris.ndim == self.grid.ndim:
            object.__setattr__(self, "uris", self.uris[..., np.newaxis])

    def _cell(self, column: np.ndarray | None, index: tuple[int, ...]) -> Any:
        if column is None:
            return None
        if column.ndim == 0:
            return column[()]
        return column[index]

    def __getitem__(self, index: tuple[int, ...]) -> FragmentRef:
        index = tuple(int(i) for i in index)
        uris: tuple[str, ...] = ()
        names = self._cell(self.identifiers, index)
        rank = np.ndim(names)
        identifier = _str_or_none(names) if rank == 0 else None
        identifiers: tuple[str | None, ...] = ()
        kept: list[int] = []
        if self.uris is not None:
            row = list(self.uris[index])  # (indexed once: each fragment read looks its row up)
            kept = [i for i, u in enumerate(row) if u is not None and str(u) != ""]
            uris = tuple(str(row[i]) for i in kept)
        if rank == 1:  # one name per alternative URI; a missing one: the first name given
            fallback = next(filter(None, map(_str_or_none, names)), None)
            identifiers = tuple(_str_or_none(names[i]) or fallback for i in kept)
            identifier = identifiers[0] if identifiers else _str_or_none(names[0]) or fallback
        value = None
        if self.unique_values is not None:
            cell = self.unique_values[index]
            if cell is not np.ma.masked:
                value = cell
        return FragmentRef(
            index=index,
            shape=self.grid.fragment_shape(index),
            uris=uris,
            identifier=identifier,
            identifiers=identifiers,
            value=value,
            units=_str_or_none(self._cell(self.units, index)),
            axes=_tuple_or_none(self._cell(self.axes, index)),
            reversed=_tuple_or_none(self._cell(self.reversed, index)),
            identifier_group=self.identifier_group,
            part=_tuple_or_none(self._cell(self.parts, index)),
        )

    def __iter__(self) -> Iterator[FragmentRef]:
        return (self[index] for index in self.grid.indices())

    def __len__(self) -> int:
        return self.grid.nfragments

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the fragment grid (fragments along each dimension)."""
        return self.grid.grid_shape

    def grown(self, axis: int, sizes: Sequence[int]) -> "Fragments":
        """These fragments with new fragments of ``sizes`` after the last along ``axis``, each
        wholly missing (no URI, no value) until a writer fills it in; ``unique_values``,
        per-fragment ``identifiers``, ``uris``, ``axes``, ``reversed`` and ``parts`` are
        padded, ``units`` must be absent or uniform."""
        rows = list(self.grid.sizes)
        rows[axis] = rows[axis] + tuple(int(n) for n in sizes)
        grid = FragmentGrid.from_sizes(rows)

        def pad(column: np.ndarray | None, fill: Any) -> np.ndarray | None:
            if column is None or column.ndim == 0:
                return column
            widths = [(0, 0)] * column.ndim
            widths[axis] = (0, len(sizes))
            if isinstance(column, np.ma.MaskedArray):
                return np.ma.concatenate([column, np.ma.masked_all(
                    column.shape[:axis] + (len(sizes),) + column.shape[axis + 1:], column.dtype)], axis=axis)
            return np.pad(column, widths, constant_values=fill)

        return dataclasses.replace(self, grid=grid, uris=pad(self.uris, ""), identifiers=pad(self.identifiers, ""),
                                   unique_values=pad(self.unique_values, None), axes=pad(self.axes, None),
                                   reversed=pad(self.reversed, None), parts=pad(self.parts, None))

    def locations(self) -> set[str]:
        """Every distinct URI named by these fragments."""
        if self.uris is None:
            return set()
        return {str(u) for u in self.uris.ravel() if u is not None and str(u) != ""}


def _str_or_none(value: Any) -> str | None:
    if value is None or value is np.ma.masked:
        return None
    value = str(value)
    return value or None


def _tuple_or_none(value: Any) -> tuple | None:
    return None if value is None else tuple(value)


@dataclass
class AggregatedVariable:
    """An aggregated variable: what the data are (dims, dtype, attributes) and where."""

    name: str  #: full path, e.g. ``"/tas"`` or ``"/grp/tas"``
    dims: tuple[str, ...]
    dtype: np.dtype
    attrs: dict[str, Any]
    fragments: Fragments
    dialect: str
    #: URL of the aggregation file (relative fragment URIs are resolved against it)
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: the name of the storage profile (``daskcfa.storage.ProfileRef``) holding the logins
    #: (``user:pw@``) taken out of its fragment URIs, which are kept without them; None: none
    logins: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.fragments.grid.shape

    @property
    def basename(self) -> str:
        return self.name.rsplit("/", 1)[-1]


@dataclass
class PlainVariable:
    """A variable stored whole in the aggregation file (coordinates, bounds, small data)."""

    name: str  #: full path, e.g. ``"/lat"`` or ``"/grp/lat"``
    dims: tuple[str, ...]
    dtype: np.dtype
    attrs: dict[str, Any]
    data: Any  #: numpy array (or masked array) of the stored values, already encoded


@dataclass
class Dimension:
    name: str  #: full path, e.g. ``"/time"`` or ``"/grp/x"``
    size: int
    unlimited: bool = False


@dataclass
class AggregationDataset:
    """What an aggregation file holds, independent of dialect: the model writers encode.

    Group structure is implied by the paths of dimensions and variables.
    Fragment URIs in ``aggregated`` are stored as given (writers make them
    relative to the aggregation file).
    """

    attrs: dict[str, Any] = field(default_factory=dict)
    group_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)  #: group path -> attributes
    dimensions: list[Dimension] = field(default_factory=list)
    variables: list[PlainVariable] = field(default_factory=list)
    aggregated: list[AggregatedVariable] = field(default_factory=list)

    @property
    def nfragments(self) -> int:
        """The fragments of every aggregated variable (one a file names twice counted twice)."""
        return sum(len(av.fragments) for av in self.aggregated)

    def dimension_size(self, group: str, name: str) -> int | None:
        """The size of dimension ``name`` as seen from ``group`` (None: not visible there)."""
        sizes = {d.name: d.size for d in self.dimensions}
        return next((sizes[p] for g in ancestry(group) if (p := posixpath.join(g, name)) in sizes), None)

    def find_variable(self, group: str, name: str) -> PlainVariable | None:
        """The ordinary variable ``name`` as seen from ``group``."""
        by_path = {v.name: v for v in self.variables}
        return next((by_path[p] for g in ancestry(group) if (p := posixpath.join(g, name)) in by_path), None)


def ancestry(group: str) -> Iterator[str]:
    """``group`` and its ancestors, innermost first: where netCDF looks for a name
    used in ``group`` (dimension scoping; CF's search for coordinates)."""
    while True:
        yield group
        if group == "/":
            return
        group = posixpath.dirname(group.rstrip("/")) or "/"


def is_coordinate_variable(name: str, dims: Sequence[str]) -> bool:
    """A CF coordinate variable: one-dimensional and named after its dimension (``name`` may be a path)."""
    return tuple(dims) == (posixpath.basename(name),)
