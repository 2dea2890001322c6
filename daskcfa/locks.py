"""The process-wide lock around the netCDF-C/HDF5 libraries.

netCDF-C and HDF5 are not thread-safe: every call into them in a process goes
through this one lock. Code holding it does as little as possible (open,
locate, read bytes); decoding, unit conversion and assembly run outside.

A lock protects the library only if *every* caller in the process takes it.
xarray's netcdf4 engine takes its own locks (``NETCDFC_LOCK``, and
``HDF5_LOCK`` for local files), so when xarray is importable this lock is
built on those very lock objects: a graph that reads through xarray and
daskcfa at once serialises on one lock instead of crashing netCDF-C.

Despite its name (xarray's), it guards the libhdf5 that netCDF-C links, not
h5py's: the direct HDF5 engine's h5py calls take h5py's own lock instead. That
is safe because the PyPI wheels of h5py and netCDF4 each load their own copy
of libhdf5 (``h5py.libs``, ``netcdf4.libs``), which share no state; a build
linking both to one libhdf5 would need those calls under this lock too
(``docs/reliability.md``).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

__all__ = ["HDF5_LOCK"]


class _Lock(Protocol):
    def acquire(self, blocking: bool = ...) -> bool: ...

    def release(self) -> None: ...

    def locked(self) -> bool: ...


def _library_lock() -> _Lock:
    """xarray's netCDF-C and HDF5 locks combined as its netcdf4 engine combines them, else a plain lock."""
    try:
        from xarray.backends.locks import HDF5_LOCK as XARRAY_HDF5_LOCK
        from xarray.backends.locks import NETCDFC_LOCK, combine_locks
    except ImportError:
        return threading.Lock()
    # combine_locks acquires the locks in xarray's own global order: no lock-order deadlock with xarray
    return combine_locks([NETCDFC_LOCK, XARRAY_HDF5_LOCK])


class _ProcessLock:
    """Reentrant for the thread holding it (daskcfa nests library calls) over
    a non-reentrant lock shared with other libraries.

    Usable wherever xarray takes a ``lock=`` argument; pickles as a reference
    to this module's single instance.
    """

    def __init__(self, base: _Lock) -> None:
        self._base = base
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, blocking: bool = True) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._base.acquire(blocking):
            return False
        self._owner, self._depth = me, 1
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("cannot release a lock this thread does not hold")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._base.release()

    def locked(self) -> bool:
        """Whether the library is locked (by daskcfa, or by xarray on the same locks)."""
        return self._base.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __reduce__(self) -> str:
        return "HDF5_LOCK"

    def __repr__(self) -> str:
        return f"<daskcfa.locks.HDF5_LOCK over {self._base!r}>"


HDF5_LOCK = _ProcessLock(_library_lock())
