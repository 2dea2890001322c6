"""Readers of the S3netCDF4 dialects: CFA-0.5 (partition matrix in a group) and CFA-0.4/0.3 (JSON).

S3netCDF4 v2 writes CFA-0.5 into netCDF-4 files: the aggregated variable is a
scalar whose ``cfa_group`` names a group holding the partition matrix as
variables over dimensions sized like the matrix. Partitions never written
(sparse data) are masked in its integer variables and ``""`` in its strings,
and read as missing data. CFA-0.4 keeps the matrix in the ``cfa_array`` JSON
attribute, NCA's layout, and is read by the code shared with NCA.

S3netCDF4 writes the sub-array variable of a variable in a group at the same
group path of each sub-array file, although ``ncvar`` holds the bare name:
the name is looked up there first, then at the root.

Location ends are exclusive in CFA-0.5 and inclusive in CFA-0.4 as
documented, but S3netCDF4 versions have written either into CFA-0.5 groups:
the partition shapes recorded beside the locations decide, with a CFAWarning.
"""

from __future__ import annotations

import netCDF4
import numpy as np

from ..model import AggregatedVariable, Fragments
from .netcdf import (
    Where,
    data_attributes,
    data_dtype,
    dimension_sizes,
    find_group,
    group_path,
    is_netcdf_format,
    legacy_dimensions,
    location_stops,
    matrix_layout,
    partition_grid,
    read_integers,
    read_strings,
    scatter,
    variable_path,
    with_base,
)
from .nca import parse_json_partitions

__all__ = ["parse_cfa05", "parse_cfa04"]

_DIMENSION_ATTRS = ("cfa_dimensions", "cf_dimensions")


def parse_cfa04(var: netCDF4.Variable, source: str) -> AggregatedVariable:
    """Read a ``cfa_variable`` described by its ``cfa_array`` JSON (location ends inclusive)."""
    return parse_json_partitions(
        var, source, dialect="CFA-0.4", array_attr="cfa_array", dims_attrs=_DIMENSION_ATTRS, inclusive_ends=True,
        identifier_group=group_path(var.group()),
    )


def parse_cfa05(var: netCDF4.Variable, source: str) -> AggregatedVariable:
    """Read a ``cfa_variable`` whose partition matrix is the group named by ``cfa_group``.

    Everything is read column-wise: files with 10^5 partitions stay cheap.
    """
    where = Where(source, variable_path(var))
    dims = legacy_dimensions(var, _DIMENSION_ATTRS)
    sizes = dimension_sizes(var.group(), dims, variable=where.variable)
    group = _partition_group(var, where)
    pm_shape_var = _member(group, "pmshape", None, where)
    if pm_shape_var.ndim != 1:
        raise where.error(f"variable 'pmshape' of group {group.path!r} should be one-dimensional")
    pm_shape = read_integers(pm_shape_var)
    if np.ma.is_masked(pm_shape):
        raise where.error(f"variable 'pmshape' of group {group.path!r} has missing values")
    pm_shape = tuple(int(n) for n in pm_shape)
    pm_axes, grid_shape = matrix_layout(_pm_dimensions(group, dims, where), pm_shape, dims, where)

    npm = len(pm_shape)
    files = read_strings(_member(group, "file", pm_shape, where, strings=True)).reshape(-1)
    ncvars = read_strings(_member(group, "ncvar", pm_shape, where, strings=True)).reshape(-1)
    positions = _positions(pm_shape)
    n = len(positions)  # (explicit reshapes: n may be 0, along a zero-length dimension)
    location = read_integers(_member(group, "location", pm_shape + (npm, 2), where)).reshape(n, npm, 2)
    index = np.zeros((n, len(dims)), dtype=np.int64)
    index[:, pm_axes] = positions
    _check_index(group, pm_shape, positions, index, where)

    known = ~np.ma.getmaskarray(location).reshape(n, 2 * npm).any(axis=1)
    lo, hi = location[..., 0].filled(0), location[..., 1].filled(0)
    counts = _recorded_counts(group, pm_shape, known, where)
    stop_pm = location_stops(lo, hi, counts, index, inclusive=False, where=where)
    start = np.zeros((n, len(dims)), dtype=np.int64)
    stop = np.tile(np.asarray(sizes, dtype=np.int64), (n, 1))
    start[:, pm_axes], stop[:, pm_axes] = lo, stop_pm
    grid = partition_grid(dims, sizes, grid_shape, index, start, stop, known, where)

    present = files != ""
    unnamed = np.flatnonzero(present & (ncvars == ""))
    if unnamed.size:
        raise where.error("partition has a file but no variable name ('ncvar')", fragment=index[unnamed[0]])
    _check_formats(group, pm_shape, present, index, where)
    base_var = group.variables.get("base")
    base = "".join(read_strings(base_var).reshape(-1)) if base_var is not None else None
    uris = [with_base(base, f) if f else "" for f in files] if base else files
    fragments = Fragments(
        grid,
        uris=scatter(grid_shape, index, uris, ""),
        identifiers=scatter(grid_shape, index, np.where(present, ncvars, None), None),
        identifier_group=group_path(var.group()),
    )
    return AggregatedVariable(
        name=where.variable,
        dims=tuple(dims),
        dtype=data_dtype(var),
        attrs=data_attributes(var),
        fragments=fragments,
        dialect="CFA-0.5",
        source=source,
        extra={"instructions": {group.path}},
    )


def _partition_group(var: netCDF4.Variable, where: Where) -> netCDF4.Group:
    name = var.getncattr("cfa_group") if "cfa_group" in var.ncattrs() else None
    if not isinstance(name, str) or not name.strip():
        raise where.error("attribute 'cfa_group' is missing or not a group name")
    group = find_group(var.group(), name.strip())
    if group is None:
        raise where.error(f"partition group {name!r} named by 'cfa_group' does not exist")
    return group


def _member(
    group: netCDF4.Group, name: str, shape: tuple[int, ...] | None, where: Where, *, strings: bool = False
) -> netCDF4.Variable:
    """A variable of the partition group, checked for type and the partition matrix's layout
    before anything is read (a corrupt matrix could otherwise claim terabytes)."""
    member = group.variables.get(name)
    if member is None:
        raise where.error(f"partition group {group.path!r} has no variable {name!r}")
    if strings != (member.dtype == str) or (not strings and np.dtype(member.dtype).kind not in "iu"):
        kind = "strings" if strings else "integers"
        raise where.error(f"variable {name!r} of group {group.path!r} should hold {kind}, not {member.dtype}")
    if shape is not None and member.shape != shape:
        raise where.error(
            f"variable {name!r} of group {group.path!r} has shape {member.shape}, "
            f"but the partition matrix needs {shape}"
        )
    return member


def _pm_dimensions(group: netCDF4.Group, dims: list[str], where: Where) -> list[str]:
    """Names in ``pmdimensions`` ("time, lat, lon"); S3netCDF4 always spans every dimension."""
    if "pmdimensions" not in group.variables:
        return dims
    text = ",".join(read_strings(_member(group, "pmdimensions", None, where, strings=True)).reshape(-1))
    return [name.strip() for name in text.split(",") if name.strip()]


def _positions(pm_shape: tuple[int, ...]) -> np.ndarray:
    """Every position of the partition matrix, row-major, one per row."""
    if not pm_shape:
        return np.zeros((1, 0), dtype=np.int64)
    flat = np.arange(int(np.prod(pm_shape)), dtype=np.int64)
    return np.stack(np.unravel_index(flat, pm_shape), axis=-1).astype(np.int64)


def _check_index(
    group: netCDF4.Group, pm_shape: tuple[int, ...], positions: np.ndarray, index: np.ndarray, where: Where
) -> None:
    """The optional ``index`` variable must repeat each partition's own position."""
    if "index" not in group.variables:
        return
    values = read_integers(_member(group, "index", pm_shape + (len(pm_shape),), where)).reshape(positions.shape)
    wrong = np.flatnonzero((~np.ma.getmaskarray(values) & (values.filled(0) != positions)).any(axis=1))
    if wrong.size:
        row = wrong[0]
        raise where.error(
            f"partition at {positions[row].tolist()} records index {values[row].tolist()}", fragment=index[row]
        )


def _recorded_counts(group: netCDF4.Group, pm_shape: tuple[int, ...], known: np.ndarray, where: Where) -> np.ndarray:
    """Elements each located partition's ``shape`` records (-1 where not recorded)."""
    counts = np.full(len(known), -1, dtype=np.int64)
    if "shape" in group.variables:
        shapes = read_integers(_member(group, "shape", pm_shape + (len(pm_shape),), where))
        shapes = shapes.reshape(len(known), len(pm_shape))
        usable = known & ~np.ma.getmaskarray(shapes).any(axis=1)
        counts[usable] = np.prod(shapes.filled(0)[usable], axis=1)
    return counts


def _check_formats(
    group: netCDF4.Group, pm_shape: tuple[int, ...], present: np.ndarray, index: np.ndarray, where: Where
) -> None:
    """Only netCDF fragments can be read (``format`` holds data models such as NETCDF4)."""
    if "format" not in group.variables:
        return
    formats = read_strings(_member(group, "format", pm_shape, where, strings=True)).reshape(-1)
    for fmt in set(formats[present]):
        if not is_netcdf_format(fmt):
            row = np.flatnonzero(present & (formats == fmt))[0]
            raise where.error(f"partition is stored in format {fmt!r}; only netCDF fragments can be read", index[row])
