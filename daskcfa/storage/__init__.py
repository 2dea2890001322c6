"""Storage: where bytes live. URIs, existence checks and opening files.

Everything that touches a location goes through here, so that remote
filesystems slot in behind the same calls.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import netCDF4

from ..errors import CFAError, NotFoundError, StorageError
from ..locks import HDF5_LOCK
from .uri import is_local, normalise, resolve, scheme_of, to_local_path

__all__ = ["exists", "open_netcdf", "normalise", "resolve", "scheme_of", "is_local", "to_local_path", "local_path"]


def local_path(uri: str) -> str:
    """The filesystem path of a local URI; a clear error for other schemes."""
    if not is_local(uri):
        raise StorageError(f"the {scheme_of(uri)!r} storage scheme is not supported yet", file=uri)
    try:
        return to_local_path(uri)
    except ValueError as exc:
        raise StorageError(str(exc), file=uri) from None


def exists(uri: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    return os.path.exists(local_path(uri))


def open_netcdf(url: str, storage_options: Mapping[str, Any] | None = None) -> netCDF4.Dataset:
    """Open an aggregation file (or any netCDF file) for reading."""
    path = local_path(url)
    if not os.path.exists(path):
        raise NotFoundError("file not found", file=url)
    try:
        with HDF5_LOCK:
            return netCDF4.Dataset(path, "r")
    except CFAError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot open as netCDF: {exc.strerror or exc}", file=url) from None
