"""Which aggregation variables a file holds, and the dialect parser for each.

Each dialect is detected from the attributes of the variable itself, never
from the global ``Conventions`` attribute (real files carry wrong or stale
ones); the legacy parsers are imported on first use.
"""


from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import netCDF4
import numpy as np

from ..errors import ArgumentError, CFAError, CFAFormatError
from ..model import AggregatedVariable
from . import netcdf as nc
from . import cf
from ..limits import check_group_depth, parsing
from ..storage.profiles import register, take_login

__all__ = ["dialect_of", "parse_variable", "aggregated_variables", "walk"]


def dialect_of(var: netCDF4.Variable) -> str | None:
    """The family of aggregation instructions a variable carries, if any."""
    attrs = set(var.ncattrs())
    if "aggregated_dimensions" in attrs:
        return "aggregated_dimensions"
    role = var.getncattr("cf_role") if "cf_role" in attrs else None
    if role == "cfa_variable":
        return "cfa_group" if "cfa_group" in attrs else "cfa_array"
    if role == "nca_variable" or "nca_array" in attrs:
        return "nca_array"  # (``nca_array`` marks NCA even without cf_role: never read as a scalar)
    return None


def _parser(family: str) -> Callable[[netCDF4.Variable, str], AggregatedVariable]:
    if family == "aggregated_dimensions":
        return cf.parse
    from . import nca, s3netcdf  # legacy dialects, imported on first use

    return {"cfa_group": s3netcdf.parse_cfa05, "cfa_array": s3netcdf.parse_cfa04, "nca_array": nca.parse_nca}[family]


def parse_variable(var: netCDF4.Variable, source: str) -> AggregatedVariable:
    """Parse one aggregation variable into the model, whatever its dialect."""
    family = dialect_of(var)
    if family is None:
        raise CFAFormatError("not an aggregation variable", file=source, variable=nc.variable_path(var))
    try:
        with parsing(source):
            return _without_logins(_parser(family)(var, source))
    except CFAError:
        raise
    except (KeyError, IndexError, ValueError, TypeError, AttributeError, RuntimeError) as exc:
        # A malformed file must never surface as a bare Python error.
        raise CFAFormatError(
            f"malformed aggregation instructions ({type(exc).__name__}: {exc})",
            file=source,
            variable=nc.variable_path(var),
        ) from exc


def _without_logins(parsed: AggregatedVariable) -> AggregatedVariable:
    """``parsed`` with any ``user:pw@`` taken out of its fragment URIs into a storage profile it
    names (sent to each URI's origin only): the URIs then go into graphs, reprs, errors and logs,
    and into files written from this one, without the password. Of different logins for one
    origin, the last fragment's in the file's order is sent (one per origin, the same in every run)."""
    uris = parsed.fragments.uris
    with_login = {u for u in parsed.fragments.locations() if "@" in u}
    try:
        taken = {u: take_login(u) for u in with_login}
    except ArgumentError as exc:  # (the file's own URI: the file is malformed)
        raise CFAFormatError(f"a fragment URI: {exc.reason}", file=parsed.source, variable=parsed.name) from None
    logins = {origin: options for u in (uris.ravel() if taken else ()) if u in taken
              for origin, options in taken[u][1].items()}
    if not logins:
        return parsed
    clean = np.array([taken[u][0] if u in taken else u for u in uris.ravel()], dtype=object).reshape(uris.shape)
    fragments = dataclasses.replace(parsed.fragments, uris=clean)
    return dataclasses.replace(parsed, fragments=fragments, logins=register(logins, protocol="http").name)


def walk(group: netCDF4.Group) -> Iterator[netCDF4.Group]:
    """``group`` and every group below it, parents first, in file order (iteratively:
    a file nests groups as deep as it likes; deeper than ``max-group-depth`` is refused)."""
    stack = [(group, 0)]
    while stack:
        group, depth = stack.pop()
        check_group_depth(depth, file=nc.source_of(group), variable=nc.group_path(group))
        yield group
        stack.extend((child, depth + 1) for child in reversed(group.groups.values()))


def aggregated_variables(dataset: netCDF4.Dataset, source: str) -> dict[str, AggregatedVariable]:
    """Every aggregation variable of a file, keyed by full path (``/tas``, ``/grp/tas``)."""
    found: dict[str, AggregatedVariable] = {}
    with parsing(source):
        for group in walk(dataset):
            for var in group.variables.values():
                if dialect_of(var) is not None:
                    parsed = parse_variable(var, source)
                    found[parsed.name] = parsed
    return found
