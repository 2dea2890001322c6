"""Open one variable of one fragment file with the best engine available.

HDF5-based files (netCDF-4) are read *directly*: h5py locates the chunks, and
the bytes are read and decompressed outside the HDF5 lock, so threads decode
in parallel. Everything else — netCDF-3 files, filters or types the direct
reader does not handle — goes through netCDF4-python under the lock.
"""

from __future__ import annotations

import zlib
from contextlib import contextmanager
from typing import Any, Iterator

import dask.config

from .. import storage
from ..errors import CFAError, FragmentReadError
from .netcdf import NetCDF4File

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _engine() -> str:
    engine = dask.config.get("daskcfa.io.engine", "auto")
    if engine not in ("auto", "netcdf4", "direct"):
        raise ValueError(f"daskcfa.io.engine must be 'auto', 'netcdf4' or 'direct', not {engine!r}")
    return engine


def _is_hdf5(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == HDF5_SIGNATURE
    except OSError:
        return False


class _Variable:
    """A fragment variable whose direct reads fall back to netCDF4 when needed."""

    def __init__(self, var: Any, path: str, name: str, *, direct: bool) -> None:
        self._var = var
        self._path = path
        self._name = name
        self._direct = direct
        self.name, self.dims, self.shape, self.dtype, self.attrs = var.name, var.dims, var.shape, var.dtype, var.attrs

    def read(self, key: tuple) -> Any:
        try:
            return self._var.read(key)
        except CFAError:
            raise
        except Exception as exc:
            if self._direct and _unsupported(exc):
                with NetCDF4File(self._path) as nc:
                    return nc.variable(self._name).read(key)
            if isinstance(exc, (OSError, RuntimeError, ValueError, IndexError, zlib.error)):
                raise FragmentReadError(f"cannot read variable {self._name!r}: {exc}") from None
            raise


def _unsupported(exc: Exception) -> bool:
    from .hdf5 import DirectReadUnsupported

    return isinstance(exc, DirectReadUnsupported)


def _open_direct(path: str, name: str):
    from .hdf5 import DirectReadUnsupported, HDF5File

    try:
        file = HDF5File(path)
    except (OSError, DirectReadUnsupported):
        return None, None
    try:
        return file, file.variable(name)
    except (DirectReadUnsupported, OSError, RuntimeError):
        file.close()
        return None, None
    except KeyError:
        file.close()
        raise FragmentReadError(f"variable {name!r} not found in the fragment file") from None


@contextmanager
def open_fragment(uri: str, name: str) -> Iterator[_Variable]:
    """Open variable ``name`` of fragment ``uri`` for reading raw values."""
    path = storage.local_path(uri)
    file = var = None
    if _engine() != "netcdf4" and _is_hdf5(path):
        file, var = _open_direct(path, name)
    try:
        if file is None:
            try:
                file = NetCDF4File(path)
            except OSError as exc:
                raise FragmentReadError(f"not a readable netCDF file ({exc.strerror or exc})") from None
            try:
                var = file.variable(name)
            except (KeyError, IndexError):
                raise FragmentReadError(f"variable {name!r} not found in the fragment file") from None
        yield _Variable(var, path, name, direct=not isinstance(file, NetCDF4File))
    finally:
        if file is not None:
            file.close()
