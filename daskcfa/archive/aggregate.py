"""Aggregation files over existing netCDF files (or Zarr stores, reference sets), without copying data.

:func:`aggregate` turns files that tile a larger dataset (120 five-year CMIP
files, or lat/lon tiles) into one CF aggregation file whose fragments are
those files; :func:`rebuild` recovers a lost aggregation file from the
self-describing fragments that :func:`daskcfa.to_cfa` writes. Both plan with
:func:`~daskcfa.archive.scan.scan` (parallel metadata scan and consistency
checks) and write with the same encoder and atomic commit as ``to_cfa``.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import replace
from typing import Any, Mapping, Sequence
from urllib.parse import quote

import numpy as np

from .. import storage
from ..choices import DEFAULT_FORMAT, DEFAULT_URIS
from ..decode import same_value
from ..errors import AggregationError, ArgumentError
from ..formats.encode import absolute_reference, encode_aggregation
from ..storage.history import Change
from ..storage.publish import WHOLE_FILE_MODES
from ..write.commit import publish
from ..storage.lease import generation_of
from ..storage.profiles import take_login
from ..model import (BOUNDS_ATTRS, AggregatedVariable, AggregationDataset, Dimension, PlainVariable,
                     is_coordinate_variable)
from ..storage.uri import absolute as absolute_uri, check_uri_style
from .aggregation_plan import FileInfo
from .scan import plan_aggregation, scan, scan_files
from .sources import expand_sources, sources_profile
from ..write.target import WriteTarget

__all__ = ["scan", "aggregate", "rebuild"]

def aggregate(sources: str | Sequence[str], target: str, *, concat_dims: Sequence[str] | None = None,
              variables: Sequence[str] | None = None, format: str = DEFAULT_FORMAT, uris: str = DEFAULT_URIS,
              storage_options: Mapping[str, Any] | None = None, mode: str = "w-") -> str:
    """Write an aggregation file at ``target`` over existing netCDF files (no data are copied).

    The concatenation dimensions and the order of the files are inferred
    from their coordinates (or given with ``concat_dims``); time coordinates
    in different units, reference dates included, are compared and
    concatenated in the earliest file's units. The files must agree (same
    variables with the same dimensions, compatible dtypes and convertible
    units, equal coordinates elsewhere) and tile the domain without gaps or
    overlaps; otherwise :class:`~daskcfa.errors.AggregationError` names the
    files. Variables spanning a concatenation dimension become aggregated
    variables with one fragment per file; the others (and the coordinates)
    are stored in the aggregation file. Global attributes are those every
    file has with the same value (``history``, ``creation_date``,
    ``tracking_id``... differ per file and are dropped).

    ``sources``: file URLs, directories, globs or a list of these (see
    :func:`~daskcfa.archive.scan.scan`); netCDF files, Zarr stores (v2, v3,
    NCZarr URLs with netCDF-C's ``#mode=...``, kept in the fragment URI) and
    fsspec reference sets (JSON, Parquet), mixed as needed. Fragment URIs are stored relative to
    the aggregation file when both are on the same storage (same bucket), else
    absolute; ``uris="absolute"`` always stores absolute URIs (for readers
    that resolve relative ones against their working directory); a login in a source URL
    (``http://user:pw@host/...``) reads the source but is not written into the file. ``mode``:
    ``"w-"`` refuses an existing target, ``"w"`` overwrites it. The file is
    written under a temporary name and moved into place. Returns its URL.
    """
    check_uri_style(uris)
    written = WriteTarget.open(target, storage_options, mode, modes=WHOLE_FILE_MODES)
    url, profile = written.url, written.profile
    model = scan(sources, concat_dims=concat_dims, variables=variables, storage_options=storage_options)
    return _write(model, url, profile, format=format, uris=uris, mode=mode,
                  change=Change.of("aggregate", sources=sources, concat_dims=concat_dims, variables=variables,
                                   format=format, uris=uris, mode=mode))


def rebuild(fragments: str | Sequence[str], target: str, *, format: str = DEFAULT_FORMAT, uris: str = DEFAULT_URIS,
            storage_options: Mapping[str, Any] | None = None, mode: str = "w-") -> str:
    """Reconstruct a lost aggregation file from the self-describing fragments ``to_cfa`` wrote.

    ``fragments``: the fragment directory (``tas/`` beside ``tas.nca``, its
    generation directories included), an S3 prefix, a glob or a list of
    fragment URLs. Fragments of one place in two generations (an
    interrupted write, or one kept with ``keep_previous``) are refused: pass
    the generation directory to rebuild from. Fragments are grouped by the
    variable they hold (the writer's names ``{stem}.{var}.{index}.nc`` give
    the variable and the fragment's place; files named otherwise are placed by
    their coordinates); every variable becomes an aggregated variable of the
    one aggregation file, with the coordinates recovered from the fragments.
    Hidden files (the writer's ``.daskcfa/`` markers, unfinished ``.part``
    files) are ignored. Ordinary variables that were never copied into
    fragments (neither coordinates nor named by a ``coordinates`` attribute)
    cannot be recovered. ``uris``: as for :func:`aggregate`.
    """
    check_uri_style(uris)
    written = WriteTarget.open(target, storage_options, mode, modes=WHOLE_FILE_MODES)
    url, profile = written.url, written.profile
    source_profile = sources_profile(fragments, storage_options)
    infos = scan_files(expand_sources(fragments, source_profile, recursive=True), source_profile)
    models = []
    for path, (members, positions) in _by_variable(infos).items():
        group, name = posixpath.split(path)
        model = plan_aggregation(members, variables=[name], positions=positions, profile=source_profile)
        models.append(_in_group(model, group))
    return _write(_merge(models), url, profile, format=format, uris=uris, mode=mode,
                  change=Change.of("rebuild", fragments=fragments, format=format, uris=uris, mode=mode))


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


def _write(model: AggregationDataset, url: str, profile: storage.ProfileRef, *, format: str, uris: str,
           mode: str, change: Change) -> str:
    """Fragment URIs as the aggregation file at ``url`` stores them, then encode and commit (as a version).
    A target that is one of its fragments is refused: ``mode="w"`` would replace that file's data by an
    aggregation referring to itself."""
    target = storage.real_location(url)  # (a fragment named through a linked directory is the same file)
    if any(storage.real_location(storage.resolve(u, url)) == target
           for av in model.aggregated for u in av.fragments.locations()):
        raise ArgumentError("the target is one of the files it would aggregate, whose data writing it would "
                            "replace: write the aggregation file elsewhere", file=url)
    model.aggregated = [_referenced(av, url, uris == "absolute", format) for av in model.aggregated]
    payload = encode_aggregation(model, format=format)  # every rule checked before anything is written
    publish(url, payload, mode, profile, change, detail=f"{model.nfragments} fragments referenced")
    return url


def _referenced(av: AggregatedVariable, url: str, absolute: bool, format: str) -> AggregatedVariable:
    """``av`` with its fragment URIs as the file at ``url`` stores them: relative or absolute, and
    without a login a source was given with (a file is shared: whoever reads it gives the login again)."""

    def stored_uri(uri: str) -> str:
        uri = take_login(uri)[0]
        return absolute_reference(uri, format) if absolute else reference(uri, url)

    stored = np.frompyfunc(stored_uri, 1, 1)(av.fragments.uris)
    stored = stored.astype(object)
    return replace(av, fragments=replace(av.fragments, uris=stored), source=url, dialect=format)


def reference(uri: str, base: str) -> str:
    """How the aggregation file at ``base`` refers to the file at ``uri``.

    A relative reference when both are on the same storage (the same local
    tree below the root, the same bucket or host), so that the dataset can
    be moved as a whole; an absolute URI otherwise.
    """
    uri, mode = storage.split_mode(uri)  # (netCDF-C's mode of a Zarr store, kept as written)
    if mode:
        return reference(uri, base) + mode
    if storage.is_local(uri) and storage.is_local(base):
        path, directory = storage.local_path(uri), os.path.dirname(storage.local_path(base))
        if os.path.commonpath([path, directory]) == os.path.abspath(os.sep):
            return absolute_uri(uri)
        return quote(os.path.relpath(path, directory).replace(os.sep, "/"))
    if storage.is_local(uri) or storage.is_local(base):
        return absolute_uri(uri)
    scheme, _, rest = uri.partition("://")
    base_scheme, _, base_rest = base.partition("://")
    authority, _, path = rest.partition("/")
    base_authority, _, base_path = base_rest.partition("/")
    if (scheme, authority) != (base_scheme, base_authority):
        return uri
    return posixpath.relpath("/" + path, posixpath.dirname("/" + base_path))


# --------------------------------------------------------------------------
# Rebuild: fragments grouped by variable
# --------------------------------------------------------------------------


def _by_variable(infos: Sequence[FileInfo]) -> dict[str, tuple[list[FileInfo], dict[str, dict[str, int]]]]:
    """Variable path -> its fragment files and their places ({dim: index}) where the names tell them."""
    groups: dict[str, tuple[list[FileInfo], dict[str, dict[str, int]]]] = {}
    stems: dict[str, str] = {}
    for info in infos:
        stem, path, index = _fragment_of(info)
        if stem is not None:
            stems.setdefault(stem, info.uri)
        members, positions = groups.setdefault(path, ([], {}))
        members.append(info)
        if index is not None:
            dims = info.variables[posixpath.basename(path)].dims
            positions[info.uri] = dict(zip(dims, index))
    if len(stems) > 1:
        raise AggregationError(f"fragments of {len(stems)} aggregations were found (stems {', '.join(sorted(stems))}): "
                               "rebuild one aggregation at a time", file=next(iter(stems.values())))
    for path, (members, positions) in groups.items():
        _one_per_place(path, positions)
        if positions and len(positions) != len(members):
            unnamed = [m.uri for m in members if m.uri not in positions]
            raise AggregationError(f"fragments of {path!r} are named inconsistently: {', '.join(unnamed[:6])} do not "
                                   "follow the writer's {stem}.{var}.{index}.nc names", file=unnamed[0])
    return groups


def _one_per_place(path: str, positions: dict[str, dict[str, int]]) -> None:
    """Two fragments at one place come from two writes (generations): refuse to guess which is current."""
    seen: dict[tuple, str] = {}
    for uri, where in positions.items():
        place = tuple(sorted(where.items()))
        if place in seen:
            raise AggregationError(f"two fragments of {path!r} at {dict(place)}: {seen[place]} and {uri} (from "
                                   f"generations {generation_of(seen[place])} and {generation_of(uri)}); an "
                                   "interrupted or retained write left one of them: pass the generation directory "
                                   "to rebuild", file=uri)
        seen[place] = uri


def _fragment_of(info: FileInfo) -> tuple[str | None, str, tuple[int, ...] | None]:
    """(aggregation stem, variable path, fragment index) of one fragment file.

    The writer names fragments ``{stem}/{generation}/{stem}.{var}.{index}.nc``
    (``{var}`` joins groups with dots; earlier versions wrote no generation
    directory); files named otherwise hold one data variable and have no
    known index.
    """
    candidates = _data_variables(info)
    directory, name = posixpath.split(info.uri.rstrip("/"))
    if generation_of(info.uri) is not None:  # {stem}/{generation}/{stem}.{var}.{index}.nc
        directory = posixpath.dirname(directory)
    stem = posixpath.basename(directory)
    parts = re.sub(r"\.(nc4?|zarr)$", "", name).split(".")
    if stem and parts[: len(stem.split("."))] == stem.split("."):
        parts = parts[len(stem.split(".")):]
        for var in candidates:
            dims = info.variables[var].dims
            ndim = max(len(dims), 1)
            if len(parts) <= ndim or not all(p.isdigit() for p in parts[-ndim:]):
                continue
            dotted = ".".join(parts[:-ndim])
            if dotted == var:
                path = f"/{var}"
            elif dotted.endswith("." + var):
                path = "/" + dotted.replace(".", "/")
            else:
                continue
            return stem, path, tuple(int(p) for p in parts[-ndim:]) if dims else None
    if not candidates and info.groups:
        raise AggregationError(f"the fragment holds its data in groups ({', '.join(info.groups)}), as CFA-0.5 and "
                               "CFA-0.4 fragments of variables in groups do (S3netCDF4's layout); rebuilding from "
                               "fragments in groups is not supported", file=info.uri)
    if len(candidates) != 1:
        raise AggregationError(f"cannot tell which variable the fragment holds (candidates: "
                               f"{', '.join(candidates) or 'none'})", file=info.uri)
    return None, f"/{candidates[0]}", None


def _data_variables(info: FileInfo) -> list[str]:
    """Variables that are neither coordinates, their bounds, nor named by a ``coordinates`` attribute."""
    auxiliary = set()
    for var in info.variables.values():
        auxiliary |= set(str(var.attrs.get("coordinates", "")).split())
        if is_coordinate_variable(var.name, var.dims):
            auxiliary |= {str(var.attrs[k]) for k in BOUNDS_ATTRS if k in var.attrs}
    return [n for n, v in info.variables.items()
            if not is_coordinate_variable(n, v.dims) and n not in auxiliary and v.is_numeric]


def _in_group(model: AggregationDataset, group: str) -> AggregationDataset:
    """The same aggregation with every dimension and variable inside ``group``."""
    if group in ("", "/"):
        return model

    def moved(path: str) -> str:
        return posixpath.join(group, path.lstrip("/"))

    return AggregationDataset(
        attrs=model.attrs,
        dimensions=[replace(d, name=moved(d.name)) for d in model.dimensions],
        variables=[replace(v, name=moved(v.name)) for v in model.variables],
        aggregated=[replace(a, name=moved(a.name)) for a in model.aggregated],
    )


def _merge(models: list[AggregationDataset]) -> AggregationDataset:
    """One aggregation from the per-variable ones: shared dimensions and coordinates must agree."""
    merged = AggregationDataset(attrs={k: v for k, v in models[0].attrs.items()
                                       if all(k in m.attrs and same_value(m.attrs[k], v) for m in models)})
    dims: dict[str, Dimension] = {}
    plain: dict[str, PlainVariable] = {}
    for model in models:
        for dim in model.dimensions:
            known = dims.setdefault(dim.name, dim)
            if known.size != dim.size:
                raise AggregationError(f"dimension {dim.name!r} has size {dim.size} in the fragments of "
                                       f"{_names(model)} but {known.size} in others")
        for var in model.variables:
            known_var = plain.setdefault(var.name, var)
            if known_var is not var and not same_value(known_var.data, var.data):
                raise AggregationError(f"variable {var.name!r} differs between the fragments of {_names(model)} "
                                       "and of other variables", variable=var.name)
        merged.aggregated += model.aggregated
    merged.dimensions = list(dims.values())
    merged.variables = list(plain.values())
    return merged


def _names(model: AggregationDataset) -> str:
    return ", ".join(a.name for a in model.aggregated)


