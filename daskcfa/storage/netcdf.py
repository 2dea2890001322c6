"""Opening a netCDF file (an aggregation file, a file to scan) wherever it lives,
under the netCDF-C lock: one place that opens, locks and closes.

Two rules keep the process alive with the netCDF4 wheels 1.7.3-1.7.5 (HDF5
2.2.0; HDFGroup/hdf5#5359): HDF5 shares one state between handles of the same
file, and opening a file crashes (in ``nc_open``) once a handle of it read a
string variable and was closed while another handle of it stayed open.

- A file is opened, read and closed in *one* section under the lock, never
  left open between two: daskcfa then never holds two handles of one file
  here (two threads' interleaved sections did crash so).
- A file whose strings are read (``whole=True``: the aggregation file, whose
  instructions are strings) is read whole and opened from memory, as remote
  files are: HDF5 shares nothing with a handle of it held elsewhere in the
  process (xarray's netcdf4 engine keeps the files it opened). Up to
  :data:`WHOLE_FILE_BYTES`; a larger local file is opened from disk.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import netCDF4

from ..errors import CFAError, StorageError, redact
from ..locks import NETCDF_LOCK
from .local import local_path, local_stat
from .nesting import check_nesting
from .objects import memory_label, netcdf_memory, read_bytes
from .profiles import ProfileRef, register
from .uri import is_local, is_opendap, opendap_url, scheme_of

__all__ = ["netcdf_file", "WHOLE_FILE_BYTES"]

#: 256 MiB: the largest local file ``netcdf_file(..., whole=True)`` reads into memory.
WHOLE_FILE_BYTES = 1 << 28


@contextmanager
def netcdf_file(url: str, storage_options: Mapping[str, Any] | None = None, *,
                profile: ProfileRef | None = None, whole: bool = False,
                contents: bytes | None = None) -> Iterator[netCDF4.Dataset]:
    """A netCDF file (an aggregation file, or any) open for reading for the body of a ``with``
    block, wherever it is: opened, used and closed in one section under the netCDF-C lock.
    ``whole``: its strings are read, so a local file is read whole first (see the module doc).
    ``contents``: the file's bytes, read elsewhere (an earlier version's copy), opened as ``url``."""
    profile = profile if profile is not None else register(storage_options, protocol=scheme_of(url))
    data = None if contents is None else netcdf_memory(contents)
    with _opening(url):
        if data is None and is_local(url):
            size = local_stat(url).st_size  # (a FIFO would block netCDF-C for ever)
            if whole and size <= WHOLE_FILE_BYTES:
                data = netcdf_memory(read_bytes(url, profile))
        elif data is None and not is_opendap(url):
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
        # (a local file keeps its path as its name: errors and ``filepath()`` name it)
        return netCDF4.Dataset(local_path(url) if is_local(url) else memory_label(url), "r", memory=data)
    if is_opendap(url):
        return netCDF4.Dataset(opendap_url(url), "r")
    check_nesting(local_path(url), label=url)
    return netCDF4.Dataset(local_path(url), "r")
