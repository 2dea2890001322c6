"""The process-wide lock around netCDF-C (and the libhdf5 it links): :data:`NETCDF_LOCK`.

netCDF-C and HDF5 are not thread-safe: every call into netCDF-C (netCDF4-python)
in a process goes through this one lock. Code holding it does as little as possible (open,
locate, read bytes); decoding, unit conversion and assembly run outside.

A lock protects the library only if *every* caller in the process takes it.
xarray's netcdf4 engine takes its own locks (``NETCDFC_LOCK``, and
``HDF5_LOCK`` for local files), so once xarray is imported this lock takes
those very lock objects too: a graph that reads through xarray and daskcfa at
once serialises on one lock instead of crashing netCDF-C.

daskcfa does not import xarray for that (metadata-only work would pay ~0.5 s
for it): until xarray is imported nobody else can call netCDF-C through it,
so daskcfa's own lock suffices. When xarray's lock module is imported later,
its loader is wrapped (a finder on ``sys.meta_path`` that finds nothing
else) so that the import ends only after any daskcfa section in progress:
from then on every section takes xarray's locks as well, before xarray can
make its first netCDF-C call.

It guards (with xarray's ``HDF5_LOCK``) the libhdf5 that netCDF-C links, not
h5py's: the direct HDF5 engine's h5py calls take h5py's own lock instead. That
is safe because the PyPI wheels of h5py and netCDF4 each load their own copy
of libhdf5 (``h5py.libs``, ``netcdf4.libs``), which share no state; a build
linking both to one libhdf5 would need those calls under this lock too
(``docs/reliability.md``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any, Protocol

__all__ = ["NETCDF_LOCK"]

#: the module that holds xarray's netCDF-C and HDF5 locks
XARRAY_LOCKS = "xarray.backends.locks"


class _Lock(Protocol):
    def acquire(self, blocking: bool = ...) -> bool: ...

    def release(self) -> None: ...

    def locked(self) -> bool: ...


class _ProcessLock:
    """Reentrant for the thread holding it (daskcfa nests library calls); once xarray is
    imported, held together with xarray's netCDF-C and HDF5 locks (taken after daskcfa's own).

    Usable wherever xarray takes a ``lock=`` argument; pickles as a reference
    to this module's single instance.
    """

    def __init__(self) -> None:
        self._own = threading.Lock()
        self._xarray: _Lock | None = None  # xarray's locks, once imported
        self._taken: _Lock | None = None  # what the holder took of them
        self._owner: int | None = None
        self._depth = 0

    def adopt(self, xarray_locks: ModuleType) -> None:
        """Take xarray's locks as well from now on: after the sections in progress (which did not)."""
        # combine_locks acquires the locks in xarray's own global order: no lock-order deadlock with xarray
        combined = xarray_locks.combine_locks([xarray_locks.NETCDFC_LOCK, xarray_locks.HDF5_LOCK])
        if self._owner == threading.get_ident():  # imported inside a section of this thread: no other can run
            self._xarray = combined
            return
        with self._own:
            self._xarray = combined

    def acquire(self, blocking: bool = True) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._own.acquire(blocking):
            return False
        xarray = self._xarray
        if xarray is not None and not xarray.acquire(blocking):
            self._own.release()
            return False
        self._owner, self._depth, self._taken = me, 1, xarray
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("cannot release a lock this thread does not hold")
        self._depth -= 1
        if self._depth == 0:
            taken, self._owner, self._taken = self._taken, None, None
            if taken is not None:
                taken.release()
            self._own.release()

    def locked(self) -> bool:
        """Whether the library is locked (by daskcfa, or by xarray on its locks)."""
        return self._own.locked() or (self._xarray is not None and self._xarray.locked())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __reduce__(self) -> str:
        return "NETCDF_LOCK"

    def __repr__(self) -> str:
        return "<daskcfa.locks.NETCDF_LOCK" + (" with xarray's locks>" if self._xarray else ">")


class _AdoptingLoader(importlib.abc.Loader):
    """xarray's lock module, loaded by its own loader, then adopted by :data:`NETCDF_LOCK`."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        NETCDF_LOCK.adopt(module)

    def __getattr__(self, name: str) -> Any:  # (get_source for tracebacks, resource readers)
        return getattr(self._loader, name)


class _XarrayLocksFinder(importlib.abc.MetaPathFinder):
    """Finds xarray's lock module as the other finders do, with its loader wrapped; nothing else."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != XARRAY_LOCKS:
            return None
        sys.meta_path.remove(self)  # (once: the others find it)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _AdoptingLoader(spec.loader)
        return spec


NETCDF_LOCK = _ProcessLock()
if XARRAY_LOCKS in sys.modules:
    NETCDF_LOCK.adopt(sys.modules[XARRAY_LOCKS])
else:
    sys.meta_path.insert(0, _XarrayLocksFinder())
