"""Opening a netCDF file (an aggregation file, a file to scan) wherever it lives,
under the netCDF-C lock: one place that opens, locks and closes.

The file is opened, read and closed in *one* section under the lock, never
left open between two: the netCDF4 wheels (1.7.3-1.7.5, HDF5 2.2.0) crash in
``nc_open`` when a file is opened while another handle of it is open and a
third one of it was opened, read (a string variable) and closed meanwhile --
what two threads' interleaved sections did (``docs/reliability.md``).
"""

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

__all__ = ["netcdf_file"]


@contextmanager
def netcdf_file(url: str, storage_options: Mapping[str, Any] | None = None, *,
                profile: ProfileRef | None = None) -> Iterator[netCDF4.Dataset]:
    """A netCDF file (an aggregation file, or any) open for reading for the body of a ``with``
    block, wherever it is: opened, used and closed in one section under the netCDF-C lock."""
    profile = profile if profile is not None else register(storage_options, protocol=scheme_of(url))
    data = None
    with _opening(url):
        if is_local(url):
            local_stat(url)  # (a FIFO would block netCDF-C for ever)
        elif not is_opendap(url):
            data = netcdf_memory(read_bytes(url, profile))  # (outside the lock)
    with NETCDF_LOCK:
        with _opening(url):
            ds = _open(url, data)
        try:
            yield ds
        finally:
            ds.close()


@contextmanager
def _opening(url: str) -> Iterator[None]:
    """A failure to open ``url`` as a :class:`StorageError` naming it (daskcfa's own errors as they are)."""
    try:
        yield
    except CFAError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot open as netCDF: {redact(str(exc.strerror or exc))}", file=url) from None


def _open(url: str, data: bytes | None) -> netCDF4.Dataset:
    """The dataset at ``url`` (or of ``data``, its bytes); under the lock."""
    if data is not None:
        check_nesting(data, label=url)
        return netCDF4.Dataset(memory_label(url), "r", memory=data)
    if is_opendap(url):
        return netCDF4.Dataset(opendap_url(url), "r")
    check_nesting(local_path(url), label=url)
    return netCDF4.Dataset(local_path(url), "r")
