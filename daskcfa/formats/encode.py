"""Encoders: write an :class:`~daskcfa.model.AggregationDataset` as an aggregation file.

One dataset can be written in any of the dialects in :data:`WRITE_FORMATS`,
laid out as the reference tools lay them out, because what those tools write
is what other readers expect: CF-1.13 as cfdm writes it, CFA-0.6.2 as
cf-python 3.15 does, CFA-0.5 and CFA-0.4 as S3netCDF4 does. Whatever is
written reads back through :func:`daskcfa.formats.aggregated_variables` into
the same model.

Writing has two stages, so that nothing is written unless everything can be:

1. :class:`_Layout` turns the dataset into a *flat* one (groups, dimensions
   and plain variables only): each aggregated variable becomes its scalar
   aggregation variable plus the dialect's instruction variables, dimensions
   and groups, under names that clash with nothing in the dataset. Every rule
   of the dialect and of the netCDF file format is checked here.
2. :func:`_emit` writes the flat dataset with netCDF4-python, always to a
   file (the bytes of a remote target are read back from a temporary one).

Instruction names (``<v>`` is the aggregated variable's name; a ``_1``,
``_2``... suffix is added when a name is already used anywhere in the file):

* CF-1.13: variables ``<v>_map``, ``<v>_uris``, ``<v>_identifiers`` (or
  ``<v>_unique_values``); fragment-grid dimensions ``f_<dim>``; the map's
  dimensions ``f_map_j<ndim>`` and ``f_map_i<max fragments>`` (cfdm's ``j``
  and ``i``). Dimensions are shared between variables wherever the sizes
  agree.
* CFA-0.6.2: variables ``<v>_location``, ``<v>_file``, ``<v>_format``,
  ``<v>_address`` over the same dimensions; when fragments have alternative
  URIs, ``<v>_file`` and (unless one name serves all) ``<v>_address`` span
  ``f_alternatives`` too, one address per URI.
* CFA-0.5: the group ``cfa_<v>`` beside the variable, its contents named as
  S3netCDF4 names them. CFA-0.5 and CFA-0.4 variables in a group get their
  dimensions in that group (copies of ancestors' where needed), where
  S3netCDF4 looks for them.
* netCDF-3 and NETCDF4_CLASSIC files hold strings as ``char`` arrays whose
  last dimension is ``strlen<n>``.

Fragment URIs are written as given: the caller makes them relative to the
aggregation file (what every dialect resolves them against).
"""

from __future__ import annotations

import json
import posixpath
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import netCDF4
import numpy as np

from ..choices import DEFAULT_FORMAT, WRITE_FORMATS
from .capabilities import CAPABILITIES, can, dialects_that, listed
from ..decode import default_fill_value
from ..errors import ArgumentError, CFAFormatError
from ..locks import NETCDF_LOCK
from ..model import AggregatedVariable, AggregationDataset, Dimension, FragmentGrid, PlainVariable, ancestry
from ..storage.uri import absolute, is_local, normalise
from .netcdf import INSTRUCTION_ATTRS, OPEN_HINT, OPEN_HINT_ATTR, Where, partition_grid

__all__ = ["WRITE_FORMATS", "FILE_FORMATS", "WRITABLE_DIALECTS", "encode_aggregation", "fragment_conventions",
           "absolute_reference", "common_format"]

FILE_FORMATS = ("NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET")

#: Conventions each dialect declares, as its reference writer does. CFA-0.5
#: and CFA-0.4 append to whatever the dataset declares (S3netCDF4); CF-1.13 and
#: CFA-0.6.2 replace any CF or CFA version (cfdm, cf-python).
_CONVENTIONS = {"CF-1.13": ("CF-1.13",), "CFA-0.6.2": ("CF-1.11", "CFA-0.6.2")}
#: The formats that give a fragment several URIs (what an error names to use instead).
_ALTERNATIVES = listed(dialects_that("alternatives"))
_VERSION_WORD = re.compile(r"CFA?-\S*$")

_INT32_MAX = np.iinfo(np.int32).max


def encode_aggregation(
    dataset: AggregationDataset, *, format: str = DEFAULT_FORMAT, file_format: str = "NETCDF4"
) -> bytes:
    """The bytes of the aggregation file of ``dataset`` (put in place by :mod:`daskcfa.storage.publish`).

    Built as a file in a private temporary directory, not in netCDF-C's
    memory: an in-memory netCDF-4 image has a root group without link
    creation order, and netCDF-C then refuses to open the file for writing
    (``NC_ECANTWRITE``), so data-centre staff could not edit its metadata.
    """
    layout = _Layout.of(dataset, format, file_format)
    with tempfile.TemporaryDirectory(prefix="daskcfa-encode-") as scratch:
        path = Path(scratch) / "aggregation.nc"
        _write_file(path, layout, file_format)
        return path.read_bytes()


def _write_file(path: Path, layout: "_Layout", file_format: str) -> None:
    with NETCDF_LOCK:
        nc = netCDF4.Dataset(str(path), "w", clobber=False, format=file_format)
        try:
            _emit(nc, layout.flat)
        finally:
            nc.close()


# --------------------------------------------------------------------------
# Stage 1: the flat layout
# --------------------------------------------------------------------------


class _Layout:
    """The flat dataset being built, and the names already used in it."""

    def __init__(self, dataset: AggregationDataset, format: str, file_format: str) -> None:
        self.format = format
        self.file_format = file_format
        self.flat = AggregationDataset(
            attrs=dict(dataset.attrs),
            group_attrs={path: dict(attrs) for path, attrs in dataset.group_attrs.items()},
            dimensions=list(dataset.dimensions),
        )
        self.sizes = {dim.name: dim.size for dim in dataset.dimensions}
        names = [dim.name for dim in dataset.dimensions] + [v.name for v in dataset.variables]
        names += [v.name for v in dataset.aggregated] + list(dataset.group_attrs)
        # Names are unique across the whole file, so no new dimension can
        # shadow one that a variable in a child group relies on.
        self.taken = {part for path in names for part in path.split("/") if part}
        self.made: dict[tuple[str, int], list[str]] = {}  # (name, size) -> paths of dimensions made here

    @classmethod
    def of(cls, dataset: AggregationDataset, format: str, file_format: str) -> "_Layout":
        """Check the request and build the whole flat dataset (nothing is written yet)."""
        if format not in WRITE_FORMATS:
            raise ArgumentError(f"unknown aggregation format {format!r}; choose one of {', '.join(WRITE_FORMATS)}")
        if file_format not in FILE_FORMATS:
            raise ArgumentError(f"unknown netCDF file format {file_format!r}; choose one of {', '.join(FILE_FORMATS)}")
        if format == "CFA-0.5" and file_format != "NETCDF4":
            raise CFAFormatError(f"CFA-0.5 keeps its partition matrices in groups: it needs NETCDF4, not {file_format}")
        layout = cls(dataset, format, file_format)
        if file_format != "NETCDF4":
            grouped = sorted({g for g in layout.groups_used(dataset) if g != "/"})
            if grouped:
                raise CFAFormatError(f"{file_format} files have no groups, but the dataset uses {', '.join(grouped)}")
        for var in dataset.variables:
            layout.add(var.name, var.dims, var.dtype, var.data, var.attrs)
        encoder = _ENCODERS[format]
        for av in dataset.aggregated:
            layout.check_dimensions(av)
            encoder(layout, av)
        layout.flat.attrs["Conventions"] = _conventions(dataset.attrs.get("Conventions"), format)
        if dataset.aggregated:
            layout.flat.attrs[OPEN_HINT_ATTR] = OPEN_HINT
        return layout

    @staticmethod
    def groups_used(dataset: AggregationDataset) -> set[str]:
        paths = [d.name for d in dataset.dimensions] + [v.name for v in dataset.variables + dataset.aggregated]
        return {_split(p)[0] for p in paths} | set(dataset.group_attrs)

    def name(self, wanted: str) -> str:
        """``wanted``, or ``wanted_1``, ``wanted_2``... whichever is not used yet."""
        name, n = wanted, 0
        while name in self.taken:
            n += 1
            name = f"{wanted}_{n}"
        self.taken.add(name)
        return name

    def dimension(self, group: str, wanted: str, size: int) -> str:
        """A dimension of ``size`` for variables in ``group``: one made earlier when visible, else a new one."""
        for path in self.made.get((wanted, size), ()):
            owner, name = _split(path)
            if owner in ancestry(group):
                return name
        name = self.name(wanted)
        self.flat.dimensions.append(Dimension(_join(group, name), size))
        self.made.setdefault((wanted, size), []).append(_join(group, name))
        return name

    def add(self, path: str, dims: Sequence[str], dtype: Any, data: Any, attrs: dict[str, Any] | None = None) -> None:
        """Add a variable; strings become ``char`` arrays where the file format has no ``string`` type."""
        dtype = np.dtype(dtype)
        if _is_text(dtype) and data is not None:
            data = _text(data, np.shape(data))
            if self.file_format != "NETCDF4":
                encoded = np.asarray(np.frompyfunc(str.encode, 1, 1)(data), dtype=object).astype(bytes)
                width = max(encoded.dtype.itemsize, 1)
                dims = (*dims, self.dimension(_split(path)[0], f"strlen{width}", width))
                chars = np.ascontiguousarray(encoded, dtype=f"S{width}").view("S1")
                data, dtype = chars.reshape(encoded.shape + (width,)), np.dtype("S1")
        self.flat.variables.append(PlainVariable(path, tuple(dims), dtype, dict(attrs or {}), data))

    def instruction(self, group: str, wanted: str, dims: Sequence[str], dtype: Any, data: Any) -> str:
        """Add an instruction variable under a new name in ``group``; returns the name."""
        name = self.name(wanted)
        self.add(_join(group, name), dims, dtype, data)
        return name

    def integers(self, values: np.ndarray) -> np.dtype:
        """int32 for instruction integers, int64 only where needed (and allowed)."""
        if values.size == 0 or int(np.max(values)) <= _INT32_MAX:
            return np.dtype(np.int32)
        if self.file_format != "NETCDF4":
            raise CFAFormatError(f"fragment sizes beyond int32 need int64, which {self.file_format} files cannot hold")
        return np.dtype(np.int64)

    def grid_dimensions(self, group: str, av: AggregatedVariable) -> list[str]:
        """The fragment-grid dimensions ``f_<dim>`` of an aggregated variable."""
        return [
            self.dimension(group, f"f_{posixpath.basename(dim)}", n)
            for dim, n in zip(av.dims, av.fragments.grid.grid_shape)
        ]

    def sizes_variable(self, group: str, wanted: str, grid: FragmentGrid) -> str:
        """The CF ``map`` (CFA-0.6 ``location``): fragment sizes, one row per dimension.

        Rows are padded with the netCDF default fill and no ``_FillValue``
        attribute, as cfdm writes them. Scalar data: a scalar 1 (CF-1.13), or
        [1] for CFA-0.6 (whose readers expect one dimension).
        """
        if grid.ndim == 0:
            dims = () if self.format == "CF-1.13" else (self.dimension(group, "f_map_i1", 1),)
            return self.instruction(group, wanted, dims, np.int32, np.ones((1,) * len(dims), dtype=np.int32))
        width = max(grid.grid_shape)
        dtype = self.integers(np.array([max(row, default=0) for row in grid.sizes]))
        values = np.full((grid.ndim, width), default_fill_value(dtype), dtype=dtype)
        for d, row in enumerate(grid.sizes):
            values[d, : len(row)] = row
        dims = (
            self.dimension(group, f"f_map_j{grid.ndim}", grid.ndim),
            self.dimension(group, f"f_map_i{width}", width),
        )
        return self.instruction(group, wanted, dims, dtype, values)

    def aggregation_variable(self, av: AggregatedVariable, instructions: dict[str, Any]) -> None:
        """The scalar variable standing for the aggregated data: its attributes, then the instructions."""
        attrs = {k: v for k, v in av.attrs.items() if k not in INSTRUCTION_ATTRS}
        self.add(av.name, (), av.dtype, None, {**attrs, **instructions})

    def dimensions_in_group(self, av: AggregatedVariable) -> None:
        """S3netCDF4 looks a variable's dimensions up in its own group only: those defined in an
        ancestor group get a copy there (same name and size; netCDF scoping finds it first)."""
        group = _split(av.name)[0]
        for dim, size in zip(av.dims, av.fragments.grid.shape):
            path = _join(group, dim)
            if group != "/" and "/" not in dim and path not in self.sizes:
                self.flat.dimensions.append(Dimension(path, size))
                self.sizes[path] = size

    def check_dimensions(self, av: AggregatedVariable) -> None:
        """The aggregated dimensions must exist (by netCDF scoping) with the sizes the grid gives."""
        group = _split(av.name)[0]
        if len(av.dims) != av.fragments.grid.ndim:
            ndim = av.fragments.grid.ndim
            raise _error(av, f"{len(av.dims)} dimensions {list(av.dims)} but a {ndim}-d fragment grid")
        for dim, size in zip(av.dims, av.fragments.grid.shape):
            if "/" in dim:
                candidates = [posixpath.normpath(_join(group, dim))]
            else:
                candidates = [_join(g, dim) for g in ancestry(group)]
            found = next((self.sizes[c] for c in candidates if c in self.sizes), None)
            if found is None:
                raise _error(av, f"aggregated dimension {dim!r} is not a dimension of the dataset")
            if found != size:
                raise _error(av, f"the fragments span {size} along {dim!r}, but the dimension has size {found}")


# --------------------------------------------------------------------------
# The dialects
# --------------------------------------------------------------------------


def _encode_cf113(layout: _Layout, av: AggregatedVariable) -> None:
    """CF-1.13: ``map`` with ``uris`` and ``identifiers``, or ``map`` with ``unique_values``."""
    group, base, frags = *_split(av.name), av.fragments
    _check_plain(av)
    uris = _uri_table(av)
    unique = frags.unique_values is not None and not np.ma.getmaskarray(frags.unique_values).all()
    terms = {"map": layout.sizes_variable(group, f"{base}_map", frags.grid)}
    if frags.unique_values is not None and not (uris != "").any():
        dims = layout.grid_dimensions(group, av)
        values, fill = _unique_values(av)
        name = layout.name(f"{base}_unique_values")
        layout.add(_join(group, name), dims, av.dtype, values, {} if fill is None else {"_FillValue": fill})
        terms["unique_values"] = name
    elif unique:
        raise _error(av, "CF-1.13 cannot mix unique-valued fragments with fragments in files")
    else:
        if uris.shape[-1] > 1:
            raise _error(av, f"CF-1.13 allows one URI per fragment; alternative URIs need {_ALTERNATIVES}",
                         _first_where(uris[..., 1] != ""))
        missing = uris[..., 0] == ""
        if missing.any():
            raise _error(av, "CF-1.13 cannot describe a wholly missing fragment among fragments in files "
                         f"({listed(dialects_that('missing_fragments'))} can)", _first_where(missing))
        dims = layout.grid_dimensions(group, av)
        terms["uris"] = layout.instruction(group, f"{base}_uris", dims, object, uris[..., 0])
        ids, id_dims = _identifiers(av, dims, ~missing)
        terms["identifiers"] = layout.instruction(group, f"{base}_identifiers", id_dims, object, ids)
    layout.aggregation_variable(av, {
        "aggregated_dimensions": " ".join(av.dims),
        "aggregated_data": " ".join(f"{keyword}: {name}" for keyword, name in terms.items()),
    })


def _encode_cfa062(layout: _Layout, av: AggregatedVariable) -> None:
    """CFA-0.6.2 as cf-python writes it; a missing fragment has neither ``file`` nor ``address``."""
    group, base, frags = *_split(av.name), av.fragments
    _check_plain(av)
    _check_no_values(av)
    uris = _uri_table(av)
    present = (uris != "").any(axis=-1)
    dims = layout.grid_dimensions(group, av)
    if uris.shape[-1] == 1:  # no alternatives: no trailing dimension
        file_dims, files = dims, uris[..., 0]
    else:
        file_dims, files = [*dims, layout.dimension(group, "f_alternatives", uris.shape[-1])], uris
    terms = {
        "location": layout.sizes_variable(group, f"{base}_location", frags.grid),
        "file": layout.instruction(group, f"{base}_file", file_dims, object, files),
        "format": layout.instruction(group, f"{base}_format", (), object, np.array("nc", dtype=object)),
    }
    ids, id_dims = _identifiers(av, dims, present)
    if id_dims and uris.shape[-1] > 1:  # not one for all: one address per alternative URI, as file spans
        by_uri = _names_by_uri(av, uris.shape[-1])
        ids = by_uri if by_uri is not None else np.where(uris != "", ids[..., np.newaxis], "").astype(object)
        id_dims = file_dims
    terms["address"] = layout.instruction(group, f"{base}_address", id_dims, object, ids)
    layout.aggregation_variable(av, {
        "aggregated_dimensions": " ".join(av.dims),
        "aggregated_data": " ".join(f"{keyword}: {name}" for keyword, name in sorted(terms.items())),
    })


def _encode_cfa05(layout: _Layout, av: AggregatedVariable) -> None:
    """CFA-0.5 (S3netCDF4 v2): the partition matrix as variables of the group ``cfa_<v>``.

    Missing partitions are left unwritten, as S3netCDF4 leaves them: default
    fill in the integer variables, ``""`` in the strings.
    """
    group, base = _split(av.name)
    if not av.dims:
        raise _error(av, "CFA-0.5 cannot describe scalar aggregated data (its partition matrix needs a dimension)")
    parts = _Partitions.of(av)
    layout.dimensions_in_group(av)
    grid_shape = av.fragments.grid.grid_shape
    ndim = len(grid_shape)
    pm_group = _join(group, layout.name(f"cfa_{base}"))
    for name, size in zip(map(posixpath.basename, av.dims), grid_shape):
        if name in ("ndimensions", "bounds"):
            raise _error(av, f"CFA-0.5 reserves the dimension name {name!r} inside its partition group")
        layout.flat.dimensions.append(Dimension(_join(pm_group, name), size))
    layout.flat.dimensions += [
        Dimension(_join(pm_group, "ndimensions"), ndim),
        Dimension(_join(pm_group, "bounds"), 2),
    ]
    pm_dims = tuple(posixpath.basename(d) for d in av.dims)

    dtype = layout.integers(parts.stop)
    fill = default_fill_value(dtype)
    index = np.full(grid_shape + (ndim,), fill, dtype=dtype)
    location = np.full(grid_shape + (ndim, 2), fill, dtype=dtype)
    shape = np.full(grid_shape + (ndim,), fill, dtype=dtype)
    cells = tuple(parts.index.T)
    index[cells] = parts.index
    location[cells] = np.stack([parts.start, parts.stop], axis=-1)
    shape[cells] = parts.stop - parts.start
    strings = {name: np.full(grid_shape, "", dtype=object) for name in ("ncvar", "file", "format")}
    strings["ncvar"][cells] = parts.ncvars
    strings["file"][cells] = parts.files
    strings["format"][cells] = layout.file_format

    layout.add(_join(pm_group, "pmshape"), ("ndimensions",), np.int32, np.asarray(grid_shape, dtype=np.int32))
    layout.add(_join(pm_group, "pmdimensions"), (), object, np.array(", ".join(pm_dims), dtype=object))
    layout.add(_join(pm_group, "index"), (*pm_dims, "ndimensions"), dtype, index)
    layout.add(_join(pm_group, "location"), (*pm_dims, "ndimensions", "bounds"), dtype, location)
    for name, values in strings.items():
        layout.add(_join(pm_group, name), pm_dims, object, values)
    layout.add(_join(pm_group, "shape"), (*pm_dims, "ndimensions"), dtype, shape)
    layout.aggregation_variable(av, {
        "cf_role": "cfa_variable",
        "cfa_dimensions": " ".join(av.dims),
        "cfa_group": posixpath.basename(pm_group),
    })


def _encode_cfa04(layout: _Layout, av: AggregatedVariable) -> None:
    """CFA-0.4 (S3netCDF4): the ``cfa_array`` JSON, listing only the partitions that exist.

    Location ends are inclusive; ``format`` names the fragments' netCDF data
    model, taken to be the aggregation file's (S3netCDF4 writes both alike).
    """
    parts = _Partitions.of(av)
    layout.dimensions_in_group(av)
    partitions = [
        {
            "index": index,
            "location": [[a, b - 1] for a, b in zip(start, stop)],
            "subarray": {"ncvar": ncvar, "file": file, "format": layout.file_format,
                         "shape": [b - a for a, b in zip(start, stop)]},
        }
        for index, start, stop, ncvar, file in zip(
            parts.index.tolist(), parts.start.tolist(), parts.stop.tolist(), parts.ncvars, parts.files
        )
    ]
    array = {"pmshape": list(av.fragments.grid.grid_shape), "pmdimensions": list(av.dims), "Partitions": partitions}
    layout.aggregation_variable(av, {
        "cf_role": "cfa_variable",
        "cfa_dimensions": " ".join(av.dims),
        "cfa_array": json.dumps(array, separators=(",", ":")),
    })


_ENCODERS = {
    "CF-1.13": _encode_cf113,
    "CFA-0.6.2": _encode_cfa062,
    "CFA-0.5": _encode_cfa05,
    "CFA-0.4": _encode_cfa04,
}


@dataclass(frozen=True)
class _Partitions:
    """The fragments that exist, as the partition dialects list them (row-major order).

    Those dialects give no fragment sizes, only the locations of existing
    partitions, so a reader rebuilds the grid from them. When whole slabs are
    missing the sizes there would be guessed: such a grid is refused rather
    than written to read back differently.
    """

    index: np.ndarray  #: (n, ndim) grid index of each partition
    start: np.ndarray  #: (n, ndim) where each starts
    stop: np.ndarray  #: (n, ndim) where each ends (exclusive)
    files: list[str]
    ncvars: list[str]

    @classmethod
    def of(cls, av: AggregatedVariable) -> "_Partitions":
        _check_plain(av)
        _check_no_values(av)
        uris = _uri_table(av)
        if uris.shape[-1] > 1:
            raise _error(av, f"{listed(dialects_that('s3netcdf4'))} allow one file per partition; alternative "
                         f"URIs need {_ALTERNATIVES}",
                         _first_where(uris[..., 1] != ""))
        grid = av.fragments.grid
        present = uris[..., 0] != ""
        index = np.argwhere(present).astype(np.int64)  # also right for scalar grids: shape (0 or 1, 0)
        start, stop = np.zeros_like(index), np.zeros_like(index)
        for d, offsets in enumerate(grid.offsets):
            offsets = np.asarray(offsets, dtype=np.int64)
            start[:, d], stop[:, d] = offsets[index[:, d]], offsets[index[:, d] + 1]
        ids = _named(av, present)
        recovered = partition_grid(av.dims, grid.shape, grid.grid_shape, index, start, stop,
                                   np.ones(len(index), dtype=bool), Where("", av.name))
        if recovered.sizes != grid.sizes:
            d = next(d for d, (a, b) in enumerate(zip(recovered.sizes, grid.sizes)) if a != b)
            raise _error(av, f"so many fragments are missing along {av.dims[d]!r} that its fragment sizes "
                         "could not be recovered from the partitions listed (use CF-1.13 or CFA-0.6.2)")
        return cls(index, start, stop, list(uris[..., 0][present]), list(ids[present]))


# --------------------------------------------------------------------------
# Fragment columns
# --------------------------------------------------------------------------


def _uri_table(av: AggregatedVariable) -> np.ndarray:
    """Every fragment's URIs, left-aligned and ``""``-padded, over the grid plus a trailing
    axis as wide as the most alternatives any fragment has (at least 1)."""
    frags = av.fragments
    shape = frags.grid.grid_shape
    if frags.uris is None:
        return np.full(shape + (1,), "", dtype=object)
    rows = [[u for u in row if u] for row in _text(frags.uris, frags.uris.shape).reshape(-1, frags.uris.shape[-1])]
    width = max(map(len, rows), default=0) or 1
    table = np.full((len(rows), width), "", dtype=object)
    for i, row in enumerate(rows):
        table[i, : len(row)] = row
    return table.reshape(shape + (width,))


def _names_by_uri(av: AggregatedVariable, width: int) -> np.ndarray | None:
    """Names given one per alternative URI (CFA-0.6.2), laid out like :func:`_uri_table`;
    None when the fragments have one name each."""
    frags = av.fragments
    if frags.identifiers is None or np.ndim(frags.identifiers) <= frags.grid.ndim:
        return None
    table = np.full(frags.grid.grid_shape + (width,), "", dtype=object)
    for index in frags.grid.indices():
        ref = frags[index]
        for position in range(min(len(ref.uris), width)):
            table[index + (position,)] = ref.at_alternative(position).identifier or ""
    return table


def _named(av: AggregatedVariable, present: np.ndarray) -> np.ndarray:
    """The identifiers over the grid (``""`` where absent; the first URI's, where each alternative
    has its own); every present fragment must have one."""
    by_uri = _names_by_uri(av, 1)
    ids = by_uri[..., 0] if by_uri is not None else _text(av.fragments.identifiers, av.fragments.grid.grid_shape)
    unnamed = present & (ids == "")
    if unnamed.any():
        raise _error(av, "a fragment has a URI but no identifier (variable name)", _first_where(unnamed))
    return ids


def _identifiers(av: AggregatedVariable, dims: list[str], present: np.ndarray) -> tuple[np.ndarray, Sequence[str]]:
    """Identifiers of the present fragments: one scalar when all agree and none is missing, else per fragment."""
    ids = np.where(present, _named(av, present), "").astype(object)
    distinct = set(ids.ravel().tolist())
    if len(distinct) == 1 and present.all():
        return np.array(distinct.pop(), dtype=object), ()
    return ids, dims


def _unique_values(av: AggregatedVariable) -> tuple[np.ndarray, Any]:
    """CF ``unique_values`` in the aggregated dtype, and the fill marking missing fragments (None: none)."""
    values = np.ma.MaskedArray(av.fragments.unique_values).astype(av.dtype).reshape(av.fragments.grid.grid_shape)
    mask = np.ma.getmaskarray(values)
    if not mask.any():
        return values.data, None
    fill = np.asarray(av.attrs.get("_FillValue", default_fill_value(av.dtype)), dtype=av.dtype)[()]
    if (values.data[~mask] == fill).any():
        raise _error(av, f"a fragment's unique value equals the fill value {fill!r} marking missing fragments")
    return values.filled(fill), fill


def _check_plain(av: AggregatedVariable) -> None:
    """Per-fragment units, dimension orders and directions (NCA only) have no place in the written dialects."""
    frags = av.fragments
    units = av.attrs.get("units")
    if frags.units is not None and any(u is not None and u != units for u in np.asarray(frags.units, object).ravel()):
        raise _error(av, "fragments in their own units cannot be written; convert them first")
    for column, what in ((frags.axes, "dimension orders"), (frags.reversed, "directions"),
                         (frags.parts, "parts of their file variables")):
        if column is not None and any(c is not None for c in np.asarray(column, object).ravel()):
            raise _error(av, f"fragments with their own {what} cannot be written")


def _check_no_values(av: AggregatedVariable) -> None:
    values = av.fragments.unique_values
    if values is not None and not np.ma.getmaskarray(values).all():
        raise _error(av, f"unique-valued fragments can only be written as {listed(dialects_that('unique_values'))}")


# --------------------------------------------------------------------------
# Stage 2: writing
# --------------------------------------------------------------------------


def _emit(nc: netCDF4.Dataset, flat: AggregationDataset) -> None:
    """Write a flat dataset (no aggregated variables left) into an open, empty netCDF dataset."""
    groups: dict[str, netCDF4.Group] = {"/": nc}

    def group(path: str) -> netCDF4.Group:
        if path not in groups:
            parent, name = _split(path)
            groups[path] = group(parent).createGroup(name)
        return groups[path]

    for path, attrs in flat.group_attrs.items():
        group(path).setncatts(attrs)
    nc.setncatts(flat.attrs)
    for dim in flat.dimensions:
        owner, name = _split(dim.name)
        group(owner).createDimension(name, None if dim.unlimited else dim.size)
    for var in flat.variables:
        owner, name = _split(var.name)
        attrs = dict(var.attrs)
        fill = attrs.pop("_FillValue", None)
        text = _is_text(var.dtype)
        out = group(owner).createVariable(name, str if text else var.dtype, var.dims, fill_value=fill)
        out.setncatts(attrs)
        if var.data is not None:
            out.set_auto_maskandscale(False)
            out[...] = var.data if text else np.ma.filled(var.data, default_fill_value(var.dtype) if fill is None else fill)
    for dim in flat.dimensions:
        owner, name = _split(dim.name)
        written = len(group(owner).dimensions[name])
        if dim.unlimited and written != dim.size:
            raise CFAFormatError(
                f"unlimited dimension {dim.name!r} has length {written} after writing, not {dim.size}: "
                "no variable with data spans it"
            )


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


def _conventions(existing: Any, format: str) -> str:
    """The ``Conventions`` attribute: the dialect's words, the dataset's other conventions kept."""
    words = [w for w in re.split(r"[\s,]+", str(existing or "")) if w]
    if format in _CONVENTIONS:
        return " ".join([*_CONVENTIONS[format], *(w for w in words if not _VERSION_WORD.match(w))])
    return " ".join([*(w for w in words if not w.startswith("CFA-")), format])


#: The model's dialect names -> the format the encoder writes them in.
WRITABLE_DIALECTS = {capabilities.read_as: name for name, capabilities in CAPABILITIES.items()}


def common_format(variables: Sequence[AggregatedVariable], url: str, action: str) -> str:
    """The one format that writes these variables in the dialect they were read in
    (``action`` says what the user does, for the error's hint: ``"relocate it"``)."""
    dialects = sorted({av.dialect for av in variables})
    unwritable = [d for d in dialects if d not in WRITABLE_DIALECTS]
    if unwritable:
        raise CFAFormatError(
            f"the file is written in the {', '.join(unwritable)} dialect, which daskcfa reads but does not write; "
            f"{action} with format= one of {', '.join(WRITE_FORMATS)} to convert it", file=url)
    formats = sorted({WRITABLE_DIALECTS[d] for d in dialects})
    if len(formats) > 1:
        raise CFAFormatError(f"the file mixes the dialects {', '.join(dialects)}; choose one with format=", file=url)
    return formats[0] if formats else DEFAULT_FORMAT


def absolute_reference(uri: str, format: str) -> str:
    """How an aggregation file in ``format`` names the fragment at ``uri`` absolutely: a
    ``file://`` URI for a local file, except in S3netCDF4's dialects (CFA-0.5, CFA-0.4), where
    it is the plain path (S3netCDF4 takes ``file://`` for the name of an S3 host)."""
    if can(format, "s3netcdf4") and is_local(uri):
        return normalise(uri)
    return absolute(uri)


def fragment_conventions(existing: Any) -> str:
    """The ``Conventions`` of a fragment file: the dataset's, without CFA words (a fragment is a
    plain CF file; S3netCDF4 would take one declaring CFA for an aggregation file), CF-1.13 when
    it declares no CF version."""
    words = [w for w in re.split(r"[\s,]+", str(existing or "")) if w and not w.startswith("CFA-")]
    if not any(w.startswith("CF-") for w in words):
        words.insert(0, _CONVENTIONS["CF-1.13"][0])
    return " ".join(words)


def _text(column: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A string column as an object array of ``str`` over ``shape`` (``""`` where absent)."""
    out = np.empty(shape, dtype=object)
    if column is None:
        out[...] = ""
        return out
    out[...] = np.frompyfunc(_as_str, 1, 1)(np.broadcast_to(np.asarray(column, dtype=object), shape))
    return out


def _as_str(value: Any) -> str:
    if value is None or value is np.ma.masked:
        return ""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _is_text(dtype: np.dtype) -> bool:
    """Whether a dtype means netCDF strings (``S1`` is a ``char`` array and stays one)."""
    return dtype.kind in "OU" or (dtype.kind == "S" and dtype.itemsize != 1)


def _split(path: str) -> tuple[str, str]:
    """``"/g/x"`` -> ``("/g", "x")``; ``"/x"`` -> ``("/", "x")``."""
    head, _, name = path.rpartition("/")
    return head or "/", name


def _join(group: str, name: str) -> str:
    return posixpath.join(group, name)


def _first_where(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _error(av: AggregatedVariable, message: str, fragment: Sequence[int] | None = None) -> CFAFormatError:
    return CFAFormatError(message, variable=av.name, fragment=fragment)
