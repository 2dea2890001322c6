"""Open one variable of one fragment file with the best engine and strategy.

Engines: HDF5-based files (netCDF-4) are read *directly* — h5py locates the
chunks, and the bytes are read and decompressed outside the HDF5 lock, so
threads decode in parallel. Everything else (netCDF-3, filters or types the
direct reader does not handle, OPeNDAP) goes through netCDF4-python under the
lock.

Strategies for remote objects, chosen per read: when most of a fragment is
wanted, one GET (concurrent ranged GETs for large objects) brings the whole
object into memory; when a small part of a large fragment is wanted, only
the byte ranges of the HDF5 chunks holding it are fetched (plus the
metadata, through a block cache).
"""

from __future__ import annotations

import errno
import io
import zlib
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import dask.config

from .. import storage
from ..errors import CFAError, FragmentReadError, NotFoundError
from ..storage.profiles import ProfileRef
from .netcdf import NetCDF4File

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NETCDF3_SIGNATURE = b"CDF"


def _engine() -> str:
    engine = dask.config.get("daskcfa.io.engine", "auto")
    if engine not in ("auto", "netcdf4", "direct"):
        raise ValueError(f"daskcfa.io.engine must be 'auto', 'netcdf4' or 'direct', not {engine!r}")
    return engine


class _Variable:
    """A fragment variable whose direct reads fall back to netCDF4 when needed."""

    def __init__(self, var: Any, name: str, fallback: Any) -> None:
        self._var = var
        self._name = name
        self._fallback = fallback  # opens the same file with netCDF4 (a NetCDF4File factory)
        self.name, self.dims, self.shape, self.dtype, self.attrs = var.name, var.dims, var.shape, var.dtype, var.attrs

    def read(self, key: tuple) -> Any:
        try:
            return self._var.read(key)
        except CFAError:
            raise
        except Exception as exc:
            if self._fallback is not None and _unsupported(exc):
                with self._fallback() as nc:
                    return nc.variable(self._name).read(key)
            if isinstance(exc, (OSError, RuntimeError, ValueError, IndexError, zlib.error)):
                raise FragmentReadError(f"cannot read variable {self._name!r}: {exc}") from None
            raise


def _unsupported(exc: Exception) -> bool:
    from .hdf5 import DirectReadUnsupported

    return isinstance(exc, DirectReadUnsupported)


def _variable(file: Any, name: str) -> Any:
    try:
        return file.variable(name)
    except (KeyError, IndexError):
        raise FragmentReadError(f"variable {name!r} not found in the fragment file") from None


def _direct(source: Any, name: str, stack: ExitStack, **kwargs: Any) -> Any:
    """The variable through the direct HDF5 reader, or None when it cannot be read so."""
    from .hdf5 import DirectReadUnsupported, HDF5File

    try:
        file = HDF5File(source, **kwargs)
    except (OSError, DirectReadUnsupported):
        return None
    stack.callback(file.close)
    try:
        return file.variable(name)
    except (DirectReadUnsupported, OSError, RuntimeError):
        return None
    except KeyError:
        raise FragmentReadError(f"variable {name!r} not found in the fragment file") from None


def _netcdf4(stack: ExitStack, path: str, **kwargs: Any) -> NetCDF4File:
    try:
        file = NetCDF4File(path, **kwargs)
    except FileNotFoundError:
        raise NotFoundError("not found", file=path) from None
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise NotFoundError("not found", file=path) from None
        raise FragmentReadError(f"not a readable netCDF file ({exc.strerror or exc})") from None
    stack.callback(file.close)
    return file


@contextmanager
def open_fragment(uri: str, name: str, *, profile: ProfileRef = storage.NO_PROFILE,
                  fraction: float = 1.0) -> Iterator[_Variable]:
    """Open variable ``name`` of fragment ``uri`` for reading raw values.

    ``fraction`` is the share of the fragment's elements the caller wants; it
    decides between fetching a whole remote object and fetching byte ranges.
    Raises :class:`NotFoundError` when the file does not exist.
    """
    with ExitStack() as stack:
        if storage.is_local(uri):
            yield _open_local(storage.local_path(uri), name, stack)
        elif storage.is_opendap(uri):
            url = storage.opendap_url(uri)
            yield _Variable(_variable(_netcdf4(stack, url), name), name, None)
        else:
            yield _open_remote(uri, name, profile, fraction, stack)


def _open_local(path: str, name: str, stack: ExitStack) -> _Variable:
    if _engine() != "netcdf4" and _signature(path) == HDF5_SIGNATURE:
        var = _direct(path, name, stack)
        if var is not None:
            return _Variable(var, name, lambda: NetCDF4File(path))
    return _Variable(_variable(_netcdf4(stack, path), name), name, None)


def _signature(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except FileNotFoundError:
        raise NotFoundError("not found", file=path) from None
    except OSError as exc:
        raise FragmentReadError(f"cannot open ({exc.strerror or exc})") from None


def _whole_object_wanted(fraction: float, nbytes: int) -> bool:
    threshold = float(dask.config.get("daskcfa.io.whole-fragment-fraction", 0.5))
    small = int(dask.config.get("daskcfa.io.small-object", 4 << 20))
    return fraction >= threshold or nbytes <= small


def _open_remote(uri: str, name: str, profile: ProfileRef, fraction: float, stack: ExitStack) -> _Variable:
    nbytes = storage.size(uri, profile)
    head = bytes(storage.read_ranges(uri, [(0, min(8, nbytes))], profile)[0]) if nbytes else b""
    direct_ok = _engine() != "netcdf4" and head == HDF5_SIGNATURE
    if direct_ok and not _whole_object_wanted(fraction, nbytes):
        # Ranged: metadata through a block cache, chunk bytes fetched concurrently.
        fileobj = storage.open_file(uri, profile)
        stack.callback(fileobj.close)
        var = _direct(fileobj, name, stack,
                      read_ranges=lambda ranges: storage.read_ranges(uri, ranges, profile), label=uri)
        if var is not None:
            return _Variable(var, name, lambda: NetCDF4File(storage.memory_label(uri), memory=storage.read_bytes(uri, profile)))
    data = storage.read_bytes(uri, profile)
    if direct_ok:
        view = memoryview(data)
        var = _direct(io.BytesIO(data), name, stack,
                      read_ranges=lambda ranges: [view[o:o + n] for o, n in ranges], label=uri)
        if var is not None:
            return _Variable(var, name, lambda: NetCDF4File(storage.memory_label(uri), memory=data))
    if not (head.startswith(NETCDF3_SIGNATURE) or head == HDF5_SIGNATURE):
        raise FragmentReadError("not a netCDF file (unknown signature)")
    return _Variable(_variable(_netcdf4(stack, storage.memory_label(uri), memory=data), name), name, None)
