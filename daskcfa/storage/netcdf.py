"""Opening a netCDF file (an aggregation file, a file to scan) wherever it lives,
under the netCDF-C lock: one place that opens, locks and closes."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import netCDF4

from ..errors import CFAError, StorageError, redact
from ..locks import NETCDF_LOCK
from .local import local_path, local_stat
from .nesting import check_nesting
from .objects import is_opendap, memory_label, netcdf_memory, opendap_url, read_bytes
from .profiles import ProfileRef, register
from .uri import is_local, scheme_of

__all__ = ["open_netcdf", "netcdf_file"]


def open_netcdf(url: str, storage_options: Mapping[str, Any] | None = None, *,
                profile: ProfileRef | None = None) -> netCDF4.Dataset:
    """Open an aggregation file (or any netCDF file) for reading, wherever it is."""
    profile = profile if profile is not None else register(storage_options, protocol=scheme_of(url))
    try:
        if is_local(url):
            local_stat(url)  # (a FIFO would block netCDF-C for ever)
            with NETCDF_LOCK:
                check_nesting(local_path(url), label=url)
                return netCDF4.Dataset(local_path(url), "r")
        if is_opendap(url):
            with NETCDF_LOCK:
                return netCDF4.Dataset(opendap_url(url), "r")
        data = netcdf_memory(read_bytes(url, profile))
        with NETCDF_LOCK:
            check_nesting(data, label=url)
            return netCDF4.Dataset(memory_label(url), "r", memory=data)
    except CFAError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot open as netCDF: {redact(str(exc.strerror or exc))}", file=url) from None


@contextmanager
def netcdf_file(url: str, storage_options: Mapping[str, Any] | None = None, *,
                profile: ProfileRef | None = None) -> Iterator[netCDF4.Dataset]:
    """:func:`open_netcdf` for the body of a ``with`` block, which runs under the
    netCDF-C lock (netCDF4-python objects are only touched under it); closed after."""
    ds = open_netcdf(url, storage_options, profile=profile)
    try:
        with NETCDF_LOCK:
            yield ds
    finally:
        with NETCDF_LOCK:
            ds.close()
