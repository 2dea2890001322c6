"""The files an aggregation is made of: URLs, directories or prefixes, and globs,
expanded to a list of file URLs (nothing is opened)."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from .. import storage
from ..errors import AggregationError, StorageError, redact

__all__ = ["sources_profile", "expand_sources"]

_NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".cdf", ".h5", ".hdf5")


def sources_profile(sources: str | Sequence[str], storage_options: Mapping[str, Any] | None) -> storage.ProfileRef:
    """The storage profile for reading ``sources`` (flat options are for the first source's protocol)."""
    first = sources if isinstance(sources, (str, os.PathLike)) else next(iter(sources), "")
    return storage.register(storage_options, protocol=storage.scheme_of(os.fspath(first)))


def expand_sources(sources: str | Sequence[str], profile: storage.ProfileRef = storage.NO_PROFILE, *,
                   recursive: bool = False) -> list[str]:
    """File URLs from URLs, directories/prefixes and globs, in the order given (globs and listings sorted).

    Hidden files and directories (``.name``: the writer's temporary files and
    ``.daskcfa`` markers) are skipped in listings; a directory contributes its
    netCDF files (by suffix), recursively when ``recursive``. Duplicates are
    dropped.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [os.fspath(sources)]
    found: list[str] = []
    for source in sources:
        source = os.fspath(source)
        if storage.GLOB_CHARS.search(source):
            matches = storage.glob(source, profile)
            if not matches:
                raise AggregationError("no file matches the pattern", file=source)
            found += matches
        elif _is_directory(source, profile):
            base = storage.normalise(source).rstrip("/")
            listed = [u for u in storage.listdir(base, profile) if _listed(u, base, recursive)]
            if not listed:
                raise AggregationError("no netCDF file in the directory", file=source)
            found += listed
        else:
            found.append(storage.normalise(source))
    if not found:
        raise AggregationError("no files to aggregate")
    return list(dict.fromkeys(found))


def _listed(uri: str, base: str, recursive: bool) -> bool:
    relative = uri[len(base):].lstrip("/")
    parts = relative.split("/")
    if any(p.startswith(".") for p in parts) or (not recursive and len(parts) > 1):
        return False
    return relative.lower().endswith(_NETCDF_SUFFIXES)


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
