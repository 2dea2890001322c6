"""Small helpers over netCDF4-python objects shared by the dialect parsers.

They read instruction variables into plain numpy columns and resolve names
the way CF asks (group search), raising :class:`CFAFormatError` with the
file and variable named.
"""

from __future__ import annotations

from typing import Any, Iterable

import netCDF4
import numpy as np

from ..errors import CFAFormatError

#: Attributes that carry aggregation instructions, never data attributes.
INSTRUCTION_ATTRS = frozenset(
    {
        "aggregated_dimensions",
        "aggregated_data",
        "cf_role",
        "cfa_dimensions",
        "cf_dimensions",
        "cfa_array",
        "cfa_group",
        "nca_dimensions",
        "nca_array",
    }
)


def group_path(group: netCDF4.Group) -> str:
    path = group.path
    return path if path.endswith("/") else path + "/"


def variable_path(var: netCDF4.Variable) -> str:
    return group_path(var.group()) + var.name


def source_of(group: netCDF4.Group) -> str:
    while group.parent is not None:
        group = group.parent
    return group.filepath()


def root_of(group: netCDF4.Group) -> netCDF4.Group:
    while group.parent is not None:
        group = group.parent
    return group


def find_group(group: netCDF4.Group, path: str) -> netCDF4.Group | None:
    """Resolve a group path relative to ``group`` (or absolute)."""
    if path.startswith("/"):
        group, path = root_of(group), path[1:]
    for part in filter(None, path.split("/")):
        if part == "..":
            group = group.parent
        elif part == ".":
            continue
        else:
            group = group.groups.get(part)
        if group is None:
            return None
    return group


def find_variable(group: netCDF4.Group, name: str) -> netCDF4.Variable | None:
    """Find ``name`` by CF group search: absolute path, relative path, or a bare
    name looked up in ``group`` and then in each ancestor group."""
    if "/" in name:
        head, _, base = name.rpartition("/")
        owner = find_group(group, head or "/")
        return None if owner is None else owner.variables.get(base)
    while group is not None:
        if name in group.variables:
            return group.variables[name]
        group = group.parent
    return None


def find_dimension(group: netCDF4.Group, name: str) -> netCDF4.Dimension | None:
    """Find dimension ``name`` in ``group`` or its ancestors (netCDF scoping)."""
    if "/" in name:
        head, _, base = name.rpartition("/")
        owner = find_group(group, head or "/")
        return None if owner is None else owner.dimensions.get(base)
    while group is not None:
        if name in group.dimensions:
            return group.dimensions[name]
        group = group.parent
    return None


def require_variable(group: netCDF4.Group, name: str, *, variable: str, role: str) -> netCDF4.Variable:
    var = find_variable(group, name)
    if var is None:
        raise CFAFormatError(
            f"{role} variable {name!r} named by the aggregation instructions does not exist",
            file=source_of(group),
            variable=variable,
        )
    return var


def read_raw(var: netCDF4.Variable) -> Any:
    """All of a variable's values, without netCDF4's automatic masking/scaling."""
    var.set_auto_maskandscale(False)
    try:
        return var[...]
    finally:
        var.set_auto_maskandscale(True)


def read_strings(var: netCDF4.Variable) -> np.ndarray:
    """A string variable as an object array of ``str`` (``""`` where missing).

    Handles vlen ``string`` variables and ``char`` arrays whose last dimension
    is the string length (always so in netCDF-3 files).
    """
    raw = read_raw(var)
    if var.dtype == str or (isinstance(raw, np.ndarray) and raw.dtype == object):
        out = np.empty(np.shape(raw), dtype=object)
        out[...] = raw
        flat = out.reshape(-1)
        for i, v in enumerate(flat):
            flat[i] = "" if v is None else (v.decode("utf-8") if isinstance(v, bytes) else str(v))
        return out
    raw = np.asarray(raw)
    if raw.dtype.kind in "SU" and raw.dtype.itemsize > 1 or raw.ndim == 0:
        chars = raw
    else:  # char array: join the trailing dimension
        if raw.dtype.kind not in "SU":
            raise CFAFormatError(
                f"variable {var.name!r} should hold strings but has dtype {raw.dtype}",
                file=source_of(var.group()),
                variable=variable_path(var),
            )
        chars = netCDF4.chartostring(raw, encoding="utf-8") if raw.ndim else raw
    out = np.empty(np.shape(chars), dtype=object)
    flat_in = np.asarray(chars).reshape(-1)
    flat = out.reshape(-1)
    for i, v in enumerate(flat_in):
        flat[i] = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)).rstrip("\x00").strip()
    return out


def read_integers(var: netCDF4.Variable) -> np.ma.MaskedArray:
    """An integer instruction variable, masked where values are missing."""
    if var.dtype == str or np.dtype(var.dtype).kind not in "iu":
        raise CFAFormatError(
            f"variable {var.name!r} must be of integer type, not {var.dtype}",
            file=source_of(var.group()),
            variable=variable_path(var),
        )
    values = np.ma.asarray(var[...])
    return np.ma.MaskedArray(values.data.astype(np.int64), mask=np.ma.getmaskarray(values))


def data_attributes(var: netCDF4.Variable) -> dict[str, Any]:
    """The attributes that describe the aggregated data (instructions removed)."""
    return {k: var.getncattr(k) for k in var.ncattrs() if k not in INSTRUCTION_ATTRS}


def split_words(text: Any) -> list[str]:
    return str(text).split()


def dimension_sizes(group: netCDF4.Group, names: Iterable[str], *, variable: str) -> list[int]:
    sizes = []
    for name in names:
        dim = find_dimension(group, name)
        if dim is None:
            raise CFAFormatError(
                f"aggregated dimension {name!r} does not exist",
                file=source_of(group),
                variable=variable,
            )
        sizes.append(len(dim))
    return sizes
