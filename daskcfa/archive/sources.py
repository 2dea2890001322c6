"""The files an aggregation is made of: URLs, directories or prefixes, and globs,
expanded to a list of file URLs (nothing is opened).

A Zarr store (a ``.zarr`` directory or prefix, or a URL with netCDF-C's
``#mode=...``) and a Parquet reference set (a ``.parq`` directory) are each
one source, never listed for files; a directory contributes the stores it
holds as well as its netCDF files. A JSON reference set is a source when
named (or matched by a glob), never picked out of a directory listing, where
JSON files may be anything.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from .. import storage
from ..errors import AggregationError, StorageError, redact
from ..fragments.zarr import is_zarr

__all__ = ["sources_profile", "expand_sources"]

_NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".cdf", ".h5", ".hdf5")
#: Directories (prefixes) that are one source each: Zarr stores and Parquet reference sets.
_STORE_SUFFIXES = (".zarr", ".parq", ".parquet")


def sources_profile(sources: str | Sequence[str], storage_options: Mapping[str, Any] | None) -> storage.ProfileRef:
    """The storage profile for reading ``sources`` (flat options are for the first source's protocol)."""
    first = sources if isinstance(sources, (str, os.PathLike)) else next(iter(sources), "")
    return storage.register(storage_options, protocol=storage.scheme_of(os.fspath(first)))


def expand_sources(sources: str | Sequence[str], profile: storage.ProfileRef = storage.NO_PROFILE, *,
                   recursive: bool = False) -> list[str]:
    """File URLs from URLs, directories/prefixes and globs, in the order given (globs and listings sorted).

    Hidden files and directories (``.name``: the writer's temporary files and
    ``.daskcfa`` markers) are skipped in listings; a directory contributes its
    netCDF files (by suffix) and Zarr stores (``.zarr``), recursively when
    ``recursive``. Duplicates are dropped.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [os.fspath(sources)]
    found: list[str] = []
    for source in sources:
        source = os.fspath(source)
        pattern, mode = storage.split_mode(source)
        if storage.GLOB_CHARS.search(pattern):  # (with netCDF-C's mode: stores matching it, in that mode)
            matches = storage.glob(pattern, profile, directories=True)
            matches = [m.rstrip("/") + mode for m in matches if is_zarr(m + mode) or not (m.endswith("/") or mode)]
            if not matches:
                raise AggregationError("no file matches the pattern", file=source)
            found += matches
        elif is_zarr(source):
            found.append(storage.normalise(source).rstrip("/"))  # (one store, however many objects it holds)
        elif _is_directory(source, profile):
            base = storage.normalise(source).rstrip("/")
            listed = _listed(storage.listdir(base, profile), base, recursive)
            if not listed:
                raise AggregationError("no netCDF file or Zarr store in the directory", file=source)
            found += listed
        else:
            found.append(storage.normalise(source))
    if not found:
        raise AggregationError("no files to aggregate")
    return list(dict.fromkeys(found))


def _listed(uris: Sequence[str], base: str, recursive: bool) -> list[str]:
    """The netCDF files and Zarr stores among the objects listed under ``base``, sorted."""
    found: dict[str, None] = {}
    for uri in uris:
        parts = uri[len(base):].lstrip("/").split("/")
        if any(p.startswith(".") for p in parts):
            continue
        store = next((k for k, p in enumerate(parts[:-1]) if p.lower().endswith(_STORE_SUFFIXES)), None)
        if store is not None:  # an object inside a store: the store is the source
            parts = parts[:store + 1]
        elif not parts[-1].lower().endswith(_NETCDF_SUFFIXES):
            continue
        if recursive or len(parts) == 1:
            found["/".join([base, *parts])] = None
    return sorted(found)


def _is_directory(source: str, profile: storage.ProfileRef) -> bool:
    if storage.is_local(source):
        return os.path.isdir(storage.local_path(source))
    if storage.is_opendap(source):
        return False
    fs, path = storage.filesystem(storage.normalise(source), profile)
    try:
        return bool(fs.isdir(path))
    except Exception as exc:  # client libraries raise their own types
        raise StorageError(f"cannot list ({type(exc).__name__}: {redact(str(exc))[:200]})", file=source) from None
