"""Parsers for every dialect marked by ``aggregated_dimensions``.

CF-1.13, the cfdm and CFAPyX interim dialects and CFA-0.6.x share one shape:
a scalar variable whose ``aggregated_data`` attribute names instruction
variables by keyword. They differ only in the keywords, so each dialect is a
table mapping its keywords onto *roles* (fragment sizes, URIs, identifiers,
unique values), and one parser serves them all.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

import netCDF4
import numpy as np

from ..errors import CFAFormatError, CFAWarning
from ..model import AggregatedVariable, FragmentGrid, Fragments
from . import netcdf as nc
from ..limits import charge, check_fragment_count, max_string_length


@dataclass(frozen=True)
class KeywordDialect:
    name: str
    #: keyword -> role; roles: sizes, uris, identifiers, values, format
    roles: dict[str, str]
    #: keyword sets that identify the dialect (any one of them, exactly or as a superset)
    signatures: tuple[frozenset[str], ...]
    case_sensitive: bool = True
    #: roles that may be absent (for CFA-0.6 missing ``file`` means "in this file")
    optional: frozenset[str] = frozenset()


CF_1_13 = KeywordDialect(
    "CF-1.13",
    {"map": "sizes", "uris": "uris", "identifiers": "identifiers", "unique_values": "values"},
    (frozenset({"map", "uris", "identifiers"}), frozenset({"map", "unique_values"})),
)
CFDM_INTERIM = KeywordDialect(
    "cfdm-interim",
    {"map": "sizes", "location": "uris", "variable": "identifiers", "unique_value": "values"},
    (frozenset({"map", "location", "variable"}), frozenset({"map", "unique_value"})),
)
CFAPYX_INTERIM = KeywordDialect(
    "CFAPyX-interim",
    {"shape": "sizes", "location": "uris", "address": "identifiers", "value": "values"},
    (frozenset({"shape", "location", "address"}), frozenset({"shape", "value"})),
)
CFA_0_6 = KeywordDialect(
    "CFA-0.6",
    {"location": "sizes", "file": "uris", "address": "identifiers", "format": "format"},
    (frozenset({"location", "file", "format", "address"}), frozenset({"location", "address"})),
    case_sensitive=False,
    optional=frozenset({"uris", "identifiers", "format"}),
)
#: Order matters only for tie-breaking; a dialect must match its whole signature.
KEYWORD_DIALECTS = (CF_1_13, CFA_0_6, CFDM_INTERIM, CFAPYX_INTERIM)

_PAIR = re.compile(r"([^\s:]+)\s*:\s*(\S+)")
_SUBSTITUTION = re.compile(r"(\$\{[^}\s]+\})\s*:\s*(\S+)")


def parse_aggregated_data(text: Any, *, file: str, variable: str) -> dict[str, str]:
    """Split ``"map: m uris: u"`` (any whitespace, several lines) into a dict."""
    if not isinstance(text, str):
        raise CFAFormatError("aggregated_data must be a text attribute", file=file, variable=variable)
    pairs = _PAIR.findall(text)
    leftover = _PAIR.sub(" ", text).strip()
    if leftover or not pairs:
        raise CFAFormatError(
            f"cannot parse aggregated_data {text!r}: expected blank-separated 'keyword: variable' pairs",
            file=file,
            variable=variable,
        )
    terms: dict[str, str] = {}
    for keyword, name in pairs:
        if keyword in terms:
            raise CFAFormatError(f"keyword {keyword!r} appears twice in aggregated_data", file=file, variable=variable)
        terms[keyword] = name
    return terms


def detect(terms: dict[str, str]) -> KeywordDialect | None:
    """Choose the dialect from the whole keyword set (``location`` alone is ambiguous)."""
    exact = set(terms)
    lower = {k.lower() for k in terms}
    best: KeywordDialect | None = None
    best_score = -1
    for dialect in KEYWORD_DIALECTS:
        keys = exact if dialect.case_sensitive else lower
        for signature in dialect.signatures:
            if signature <= keys:
                score = len(signature) * 10 - len(keys - set(dialect.roles))
                if score > best_score:
                    best, best_score = dialect, score
    return best


def parse(var: netCDF4.Variable, source: str) -> AggregatedVariable:
    """Parse one variable carrying ``aggregated_dimensions``/``aggregated_data``."""
    group = var.group()
    path = nc.variable_path(var)
    where = {"file": source, "variable": path}
    if var.ndim != 0:
        raise CFAFormatError(f"an aggregation variable must be scalar, this one has dimensions {var.dimensions}", **where)
    dims_text = var.getncattr("aggregated_dimensions")
    if not isinstance(dims_text, str):
        raise CFAFormatError("aggregated_dimensions must be a text attribute", **where)
    dims = tuple(dims_text.split())
    shape = nc.dimension_sizes(group, dims, variable=path)
    if "aggregated_data" not in var.ncattrs():
        raise CFAFormatError("aggregated_dimensions is present but aggregated_data is missing", **where)
    terms = parse_aggregated_data(var.getncattr("aggregated_data"), **where)
    dialect = detect(terms)
    if dialect is None:
        raise CFAFormatError(
            f"aggregated_data keywords {sorted(terms)} match no known dialect "
            "(CF-1.13 needs 'map' with 'uris' and 'identifiers', or 'map' with 'unique_values')",
            **where,
        )
    roles: dict[str, netCDF4.Variable] = {}
    for keyword, name in terms.items():
        key = keyword if dialect.case_sensitive else keyword.lower()
        role = dialect.roles.get(key)
        if role is None:
            warnings.warn(
                f"{source}: {path}: ignoring non-standard aggregation term {keyword!r}: {name!r}",
                CFAWarning,
                stacklevel=4,
            )
            continue
        roles[role] = nc.require_variable(group, name, variable=path, role=f"{keyword!r}")

    grid = _grid(roles["sizes"], shape, dims, where)
    fragments = _fragments(dialect, roles, grid, source, where, group)
    return AggregatedVariable(
        name=path,
        dims=dims,
        dtype=nc.data_dtype(var),
        attrs=nc.data_attributes(var),
        fragments=fragments,
        dialect=dialect.name,
        source=source,
        extra={"instructions": {nc.variable_path(v) for v in roles.values()}},
    )


def _grid(map_var: netCDF4.Variable, shape: list[int], dims: tuple[str, ...], where: dict) -> FragmentGrid:
    """Fragment sizes from a ``map`` (CFA-0.6: ``location``): one row per dimension,
    padded with missing or negative values. 0 is a size: a zero-length dimension
    has one fragment of size 0 (a row of padding alone is read as no fragments)."""
    values = nc.read_integers(map_var, owner=where["variable"])
    ndim = len(shape)
    if ndim == 0:
        if values.size != 1:
            raise CFAFormatError(f"scalar aggregated data needs a map of one value, not shape {values.shape}", **where)
        return FragmentGrid(())
    if values.ndim == 1 and ndim == 1:
        values = values[np.newaxis, :]
    if values.ndim != 2 or values.shape[0] != ndim:
        raise CFAFormatError(
            f"map {map_var.name!r} has shape {values.shape}; expected ({ndim}, n) for dimensions {dims}", **where
        )
    rows = values.filled(-1)
    valid = rows >= 0
    check_fragment_count(valid.sum(axis=1), **where)
    sizes = []
    for d, (row, ok) in enumerate(zip(rows, valid)):
        row_sizes = row[ok]
        problem = f"map {map_var.name!r} row {d} (dimension {dims[d]!r}, size {shape[d]})"
        if not ok[: len(row_sizes)].all():
            raise CFAFormatError(f"{problem} has padding before its last size", **where)
        if len(row_sizes) and row_sizes.max() > shape[d]:
            raise CFAFormatError(f"{problem} lists a fragment size {int(row_sizes.max())} larger than the dimension",
                                 **where)
        if len(row_sizes) == 0 and shape[d] > 0:
            raise CFAFormatError(f"{problem} lists no fragment sizes", **where)
        # (exact: every size is at most the dimension's, but many of them may overflow int64)
        total = int(row_sizes.sum()) if len(row_sizes) * shape[d] < 2**63 else sum(row_sizes.tolist())
        if total != shape[d]:
            raise CFAFormatError(f"{problem} sums to {total}", **where)
        sizes.append(row_sizes)
    return FragmentGrid.from_sizes(sizes)


def _check_shape(var: netCDF4.Variable, values: np.ndarray, grid: FragmentGrid, role: str, where: dict,
                 *, extra_axis: bool = False, scalar_ok: bool = False, also: tuple[int, ...] | None = None) -> None:
    shape = np.shape(values)
    if (scalar_ok and shape == ()) or shape == also:
        return
    if shape == grid.grid_shape or (extra_axis and shape[:-1] == grid.grid_shape and len(shape) == grid.ndim + 1):
        return
    zeros = any(0 in row[1:] for row in grid.sizes)
    hint = " (a 0 in the map is a fragment size, not padding: pad with missing or negative values)" if zeros else ""
    raise CFAFormatError(
        f"{role} variable {var.name!r} has shape {shape} but the fragment grid has shape {grid.grid_shape}{hint}",
        **where,
    )


def _fragments(dialect: KeywordDialect, roles: dict, grid: FragmentGrid, source: str, where: dict,
               group: netCDF4.Group) -> Fragments:
    required = {"sizes"} if "values" in roles else {"sizes", "uris", "identifiers"}
    missing = required - set(roles) - dialect.optional
    if missing:
        raise CFAFormatError(f"aggregated_data lacks the term(s) for {sorted(missing)}", **where)

    unique_values = None
    if "values" in roles:
        values = nc.read_unique_values(roles["values"], owner=where["variable"])
        _check_shape(roles["values"], values, grid, "unique values", where, scalar_ok=grid.ndim == 0)
        unique_values = np.ma.MaskedArray(values).reshape(grid.grid_shape)

    uris = identifiers = None
    file_shape = None  # CFA-0.6.2: address and format may span the dimensions of file
    if "uris" in roles:
        uris = nc.read_strings(roles["uris"], owner=where["variable"])
        _check_shape(roles["uris"], uris, grid, "URI", where, extra_axis=dialect is CFA_0_6, scalar_ok=grid.ndim == 0)
        uris = _substitute(roles["uris"], uris, grid.ndim, where)
        file_shape = uris.shape if dialect is CFA_0_6 else None
        if uris.ndim == grid.ndim:
            uris = uris[..., np.newaxis]
    if "identifiers" in roles:
        identifiers = nc.read_strings(roles["identifiers"], owner=where["variable"])
        _check_shape(roles["identifiers"], identifiers, grid, "identifier", where, scalar_ok=True, also=file_shape)
    if "format" in roles and dialect is CFA_0_6:
        _check_formats(roles["format"], grid, file_shape, uris, where)

    if dialect is CFA_0_6 and identifiers is not None:
        if identifiers.ndim == grid.ndim + 1:
            identifiers = _per_alternative(identifiers, uris)
        # No file but an address: the fragment is a variable of the aggregation file itself
        # (whose address is the first one).
        no_file = np.ones(grid.grid_shape, bool) if uris is None else ~(uris != "").any(axis=-1)
        first = identifiers[..., 0] if identifiers.ndim == grid.ndim + 1 else identifiers
        has_address = np.broadcast_to(first != "", grid.grid_shape)
        in_file = no_file & has_address
        if in_file.any():
            if uris is None:
                uris = np.full(grid.grid_shape + (1,), "", dtype=object)
            uris[in_file, 0] = source
            identifiers = _in_file_paths(identifiers, in_file, roles["identifiers"], group)
    if "uris" in roles and dialect is not CFA_0_6:
        empty = ~(uris != "").any(axis=-1)
        if empty.any() and unique_values is None:
            index = tuple(int(i) for i in np.argwhere(empty)[0])
            raise CFAFormatError("a fragment has an empty URI", fragment=index, **where)
    return Fragments(grid, uris=uris, identifiers=identifiers, unique_values=unique_values)


def _in_file_paths(identifiers: np.ndarray, in_file: np.ndarray, address: netCDF4.Variable,
                   group: netCDF4.Group) -> np.ndarray:
    """``identifiers`` with the addresses of in-file fragments made absolute paths, found as CF
    resolves a reference: from the ``address`` variable's group upward, then from the aggregated
    variable's ``group`` upward. A name found nowhere becomes the path CF looks at first (relative to
    the ``address`` variable's group), for the read to report: kept as given, a relative path would be
    read from the root, where another variable of that name may be."""
    def path(name: str) -> str:
        found = nc.find_variable(address.group(), name)
        if found is None:  # (not ``or``: a scalar or empty variable is falsy, or has no len())
            found = nc.find_variable(group, name)
        if found is not None:
            return nc.variable_path(found)
        return name if name.startswith("/") else nc.group_path(address.group()) + name

    per_alternative = identifiers.ndim == in_file.ndim + 1
    first = identifiers[..., 0] if per_alternative else identifiers
    found = np.broadcast_to(first, in_file.shape)
    paths = {name: path(name) for name in set(found[in_file].tolist())}
    if all(name == resolved for name, resolved in paths.items()):
        return identifiers
    names = np.array(found, dtype=object)
    names[in_file] = [paths[n] for n in found[in_file].tolist()]
    if not per_alternative:
        return names
    result = np.array(identifiers, dtype=object)
    result[..., 0] = names
    return result


def _per_alternative(addresses: np.ndarray, uris: np.ndarray) -> np.ndarray:
    """CFA-0.6.2 addresses given one per alternative URI: one per fragment where all its
    alternatives name the same variable, as they almost always do; else as given."""
    used = (addresses != "") & (uris != "")
    if not used.any():
        return addresses[..., 0]
    first = np.take_along_axis(addresses, np.argmax(used, axis=-1)[..., np.newaxis], axis=-1)[..., 0]
    if ((addresses != first[..., np.newaxis]) & used).any():
        return addresses
    return np.where(used.any(axis=-1), first, addresses[..., 0])


def _check_formats(var: netCDF4.Variable, grid: FragmentGrid, file_shape: tuple[int, ...] | None,
                   uris: np.ndarray | None, where: dict) -> None:
    """CFA-0.6.2 ``format``: scalar, per fragment or over the dimensions of ``file``; netCDF wherever a
    fragment is in a file (no other fragment format can be read)."""
    formats = nc.read_strings(var, owner=where["variable"])
    _check_shape(var, formats, grid, "format", where, scalar_ok=True, also=file_shape)
    if uris is None:
        return
    if formats.ndim == grid.ndim:
        formats = formats[..., np.newaxis]
    present = np.broadcast_to(uris != "", np.broadcast_shapes(uris.shape, formats.shape))
    formats = np.broadcast_to(formats, present.shape)
    bad = present & ~np.frompyfunc(nc.is_netcdf_format, 1, 1)(formats).astype(bool)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CFAFormatError(f"fragment format {formats[at]!r} is not netCDF (only netCDF fragments can be read)",
                             fragment=at[: grid.ndim], **where)


def _substitute(var: netCDF4.Variable, uris: np.ndarray, ndim: int, where: dict) -> np.ndarray:
    """Expand CFA-0.6 ``${NAME}`` prefixes declared by the ``substitutions`` attribute."""
    if "substitutions" not in var.ncattrs():
        return uris
    text = str(var.getncattr("substitutions"))
    pairs = _SUBSTITUTION.findall(text)
    if not pairs or _SUBSTITUTION.sub(" ", text).strip():
        raise CFAFormatError(f"cannot parse substitutions {text!r}", **where)
    flat = uris.reshape(-1)
    longest = max_string_length()
    for i, uri in enumerate(flat):
        for name, value in pairs:  # (each applied to the last one's output: k copies n times grow k**n-fold)
            grown = len(uri) + uri.count(name) * (len(value) - len(name))
            if grown > longest:
                at = tuple(int(j) for j in np.unravel_index(i, uris.shape))[:ndim]
                raise CFAFormatError(f"substitutions {text[:80]!r} expand the fragment URI {flat[i][:80]!r} beyond "
                                     f"{longest:,} characters (dask config 'daskcfa.limits.max-string-length')",
                                     fragment=at, **where)
            charge(max(0, grown - len(uri)), "URIs expanded by substitutions", **where)
            uri = uri.replace(name, value)
        flat[i] = uri
    return uris
