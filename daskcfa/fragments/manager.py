"""The process-wide fragment file manager: open handles under budgets.

Opening a fragment costs far more than reading a point from it, and an
archive can hold more fragments than ``ulimit -n`` allows or memory holds.
The manager keeps open fragment handles in an LRU cache bounded by two
budgets — open files and bytes held in memory (remote objects fetched whole,
and writers' buffers) — and closes the least recently used idle handle when
a budget is reached. Handles in use are reference-counted and never closed;
when every handle is in use, callers wait (back-pressure) instead of failing.

One manager exists per process (:func:`manager`). Budgets come from dask
config (``daskcfa.budget.filehandles`` / ``daskcfa.budget.memory``), from
S3netCDF4's ``resource_allocation`` when its config file exists, or from the
:class:`daskcfa.FragmentBudget` worker plugin on a distributed cluster.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Hashable, Iterator

import dask.config

from .. import config
from ..errors import BudgetError
from ..storage.s3nc import s3nc_config

__all__ = ["FileManager", "manager", "Budget"]

#: Small (chosen when h5py's cost to close a file grew with the number of objects open in the
#: process: one-point series over 1,000 fragments 1.08x the raw loop with 8 cached handles,
#: 1.15-1.2x with 32; the direct HDF5 reader no longer pays that, see ``HDF5File.close``).
DEFAULT_FILEHANDLES = 8
DEFAULT_MEMORY = "512MiB"


@dataclass(frozen=True)
class Budget:
    """Limits for one process: open fragment files and bytes held in memory."""

    filehandles: int
    memory: int

    @classmethod
    def from_config(cls) -> "Budget":
        resources = s3nc_config().resources
        handles = dask.config.get(_FILEHANDLES, None)
        memory = dask.config.get(_MEMORY, None)
        fallback = (resources.get("filehandles", DEFAULT_FILEHANDLES), resources.get("memory", DEFAULT_MEMORY))
        try:
            return _configured_budget(handles, memory, *fallback)
        except TypeError:  # (an unhashable setting: checked, and refused, uncached)
            return _configured_budget.__wrapped__(handles, memory, *fallback)

    @classmethod
    def parse(cls, *, filehandles: Any, memory: Any) -> "Budget":
        """Budgets given as arguments, checked by the config schema's rules (an ArgumentError naming them)."""
        return cls(config.size(_FILEHANDLES, filehandles, "filehandles"), config.size(_MEMORY, memory, "memory"))


_FILEHANDLES, _MEMORY = "daskcfa.budget.filehandles", "daskcfa.budget.memory"


@lru_cache(maxsize=16)
def _configured_budget(handles: Any, memory: Any, fallback_handles: Any, fallback_memory: Any) -> Budget:
    """The dask config's budgets (a ConfigError naming the key if one is bad: set mid-session, it
    was never checked), else the fallbacks; checked once per setting, looked up at every open."""
    return Budget(config.size(_FILEHANDLES) if handles is not None else config.size(_FILEHANDLES, fallback_handles),
                  config.size(_MEMORY) if memory is not None else config.size(_MEMORY, fallback_memory))


@dataclass
class _Entry:
    resource: Any = None
    nbytes: int = 0
    files: int = 0
    refs: int = 0
    ready: bool = False
    failed: BaseException | None = None
    closer: Callable[[Any], None] | None = None
    closing: bool = False  #: taken out of the cache, not yet closed
    cache: dict = field(default_factory=dict)  #: per-handle memo (e.g. variables looked up)
    family: Hashable | None = None  #: what it is a version of (a local path): see :meth:`FileManager.open`
    retired: bool = False  #: a newer version of its family was opened: closed once released


class FileManager:
    """An LRU cache of open fragment handles with file and memory budgets."""

    def __init__(self, budget: Budget | None = None) -> None:
        self._budget = budget
        self._cond = threading.Condition(threading.Lock())
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._families: dict[Hashable, Hashable] = {}  # family -> the key of its latest handle
        self._files = 0
        self._bytes = 0
        self._reserved = 0
        # Handles taken out of the cache and being closed (outside the lock): still open, so
        # still counted until closed, or the budget would admit more files than it allows.
        self._closing_files = 0
        self._closing_bytes = 0
        self.counters = {"hits": 0, "misses": 0, "evictions": 0, "waits": 0, "peak_files": 0, "peak_bytes": 0}

    # -- configuration -------------------------------------------------------------
    @property
    def budget(self) -> Budget:
        """The budgets given to :meth:`configure` (a worker plugin), else those of the dask
        config (or S3netCDF4's file) in force now: a ``dask.config.set`` block applies to
        what runs inside it only, whatever ran first in the process."""
        if self._budget is not None:
            return self._budget
        return Budget.from_config()

    def configure(self, budget: Budget | None) -> None:
        """Change the budgets (None: back to those of the dask config in force at each use); idle
        handles beyond the new limits are closed now."""
        with self._cond:
            self._budget = budget
            closing = self._evict_locked(0, 0, budget or Budget.from_config())
            self._cond.notify_all()
        self._close_all(closing)

    # -- use -----------------------------------------------------------------------
    @contextmanager
    def open(self, key: Hashable, opener: Callable[[], Any], *, nbytes: int = 0, files: int = 1,
             label: str = "", closer: Callable[[Any], None] | None = None,
             keep: bool = True, family: Hashable | None = None) -> Iterator[tuple[Any, dict]]:
        """The handle for ``key``, opened by ``opener()`` unless cached.

        ``nbytes``/``files`` are what the handle will hold, declared before it
        is opened so that the budgets are respected before any allocation.
        ``keep=False`` counts the handle against the budgets while in use but
        closes it when the last user releases it (for handles that cannot be
        checked for staleness cheaply). ``family``: what the handle is a version
        of (a local file's path, ``key`` holding its version): a handle of another
        version of it is closed before this one opens, or once released if in
        use (HDF5 shares one open file's metadata among the opens of an inode:
        a file rewritten in place would be read with its old metadata).
        Yields ``(resource, memo)``; ``memo`` is a dict kept with the handle.
        """
        closer = closer or _default_close
        entry = self._acquire(key, opener, nbytes, files, label, closer, family)
        closing: list[_Entry] = []
        try:
            yield entry.resource, entry.cache
        finally:
            with self._cond:
                entry.refs -= 1
                if (not keep or entry.retired) and entry.refs == 0 and entry.ready:
                    self._discard_locked(key, entry, closing=True)
                    closing.append(entry)
                self._cond.notify_all()
            self._close_all(closing)

    def _acquire(self, key: Hashable, opener: Callable[[], Any], nbytes: int, files: int, label: str,
                 closer: Callable[[Any], None], family: Hashable | None = None) -> _Entry:
        budget = self.budget  # (looked up once a pass: it reads the dask config)
        if nbytes > budget.memory:
            raise BudgetError(f"fragment needs {nbytes:,} bytes in memory, more than the memory budget of "
                              f"{budget.memory:,} bytes (daskcfa.budget.memory)", file=label or None)
        closing: list[_Entry] = []
        opening = False
        with self._cond:
            if family is not None:
                closing += self._retire_locked(family, key)
            while True:
                entry = self._entries.get(key)
                if entry is not None and entry.failed is None:
                    entry.refs += 1
                    self._entries.move_to_end(key)
                    break
                closing += self._evict_locked(files, nbytes, budget)
                if self._fits(files, nbytes, budget):
                    entry = _Entry(nbytes=nbytes, files=files, refs=1, closer=closer, family=family)
                    self._entries[key] = entry
                    self._files += files
                    self._bytes += nbytes
                    self._peaks()
                    self.counters["misses"] += 1
                    opening = True
                    break
                closing, budget = self._close_or_wait(closing, label, budget)
        self._close_all(closing)
        if opening:
            try:
                entry.resource = opener()
            except BaseException as exc:
                with self._cond:
                    entry.failed = exc
                    self._discard_locked(key, entry)
                    self._cond.notify_all()
                raise
            with self._cond:
                entry.ready = True
                self._cond.notify_all()
            return entry
        with self._cond:  # cached, or being opened by another thread
            while not entry.ready and entry.failed is None:
                self._cond.wait()
            if entry.failed is not None:
                entry.refs -= 1
                raise entry.failed
            self.counters["hits"] += 1
            return entry

    @contextmanager
    def reserve(self, nbytes: int, label: str = "", *, what: str = "", wait: bool = True) -> Iterator[None]:
        """Count ``nbytes`` (e.g. a fragment being built in memory) against the memory budget.

        ``wait=False`` is for callers already holding handles (decoding a chunk
        of an open fragment): idle handles are closed to make room, but the
        bytes are counted at once rather than waited for, since threads each
        holding a handle and waiting for memory could wait on each other forever.
        """
        budget = self.budget
        if nbytes > budget.memory:
            raise BudgetError(f"{what or 'this'} needs {nbytes:,} bytes in memory, more than the memory budget of "
                              f"{budget.memory:,} bytes (daskcfa.budget.memory)", file=label or None)
        closing: list = []
        with self._cond:
            while True:
                closing += self._evict_locked(0, nbytes, budget)
                if self._fits(0, nbytes, budget) or not wait:
                    self._reserved += nbytes
                    self._bytes += nbytes
                    self._peaks()
                    break
                closing, budget = self._close_or_wait(closing, label, budget)
        self._close_all(closing)
        try:
            yield
        finally:
            with self._cond:
                self._reserved -= nbytes
                self._bytes -= nbytes
                self._cond.notify_all()

    def grow(self, key: Hashable, *, files: int = 0, nbytes: int = 0) -> None:
        """Count more files or bytes against the handle ``key``, in use by the caller (a second
        engine opened on the same fragment); idle handles are closed to make room, but the
        caller, holding this one, is never made to wait."""
        with self._cond:
            entry = self._entries.get(key)
            if entry is None:
                return
            closing = self._evict_locked(files, nbytes, self.budget)
            entry.files += files
            entry.nbytes += nbytes
            self._files += files
            self._bytes += nbytes
            self._peaks()
        self._close_all(closing)

    # -- housekeeping --------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Counters: hits, misses, evictions, waits, current and peak files and bytes."""
        with self._cond:
            return {**self.counters, "files": self._files + self._closing_files,
                    "bytes": self._bytes + self._closing_bytes, "handles": len(self._entries),
                    "filehandles_budget": self.budget.filehandles, "memory_budget": self.budget.memory}

    def close_all(self) -> None:
        """Close every idle handle (handles in use stay open until released and evicted)."""
        with self._cond:
            closing = [(k, e) for k, e in self._entries.items() if e.refs == 0 and e.ready]
            for key, entry in closing:
                self._discard_locked(key, entry, closing=True)
        self._close_all([e for _, e in closing])

    def _fits(self, files: int, nbytes: int, budget: Budget, *, closing: bool = True) -> bool:
        """Whether ``files``/``nbytes`` more fit ``budget`` (``closing=False``: once the handles
        being closed are closed)."""
        files += self._files + (self._closing_files if closing else 0)
        nbytes += self._bytes + (self._closing_bytes if closing else 0)
        return files <= budget.filehandles and nbytes <= budget.memory

    def _evict_locked(self, files: int, nbytes: int, budget: Budget) -> list[_Entry]:
        """Drop least recently used idle handles until ``files``/``nbytes`` more would fit ``budget``."""
        closing = []
        for key in list(self._entries):
            if self._fits(files, nbytes, budget, closing=False):
                break
            entry = self._entries[key]
            if entry.refs == 0 and entry.ready:
                self._discard_locked(key, entry, closing=True)
                self.counters["evictions"] += 1
                closing.append(entry)
        return closing

    def _retire_locked(self, family: Hashable, key: Hashable) -> list[_Entry]:
        """Retire the handle of another version of ``family`` than ``key``: returned to be closed
        now when idle, else marked to be closed when released."""
        previous = self._families.get(family)
        self._families[family] = key
        entry = None if previous is None or previous == key else self._entries.get(previous)
        if entry is None:
            return []
        if entry.refs == 0 and entry.ready:
            self._discard_locked(previous, entry, closing=True)
            return [entry]
        entry.retired = True
        return []

    def _discard_locked(self, key: Hashable, entry: _Entry, *, closing: bool = False) -> None:
        if self._entries.get(key) is entry:
            del self._entries[key]
            if entry.family is not None and self._families.get(entry.family) == key:
                del self._families[entry.family]
            self._files -= entry.files
            self._bytes -= entry.nbytes
            if closing:  # counted until :meth:`_close_all` has closed it
                self._closing_files += entry.files
                self._closing_bytes += entry.nbytes
                entry.closing = True

    def _close_all(self, entries: list[_Entry]) -> None:
        """Close handles taken out of the cache (outside the lock), then stop counting them."""
        for entry in entries:
            try:
                if entry.resource is not None:
                    (entry.closer or _default_close)(entry.resource)
                    entry.resource = None
            finally:
                if entry.closing:
                    with self._cond:
                        entry.closing = False
                        self._closing_files -= entry.files
                        self._closing_bytes -= entry.nbytes
                        self._cond.notify_all()

    def _close_or_wait(self, closing: list[_Entry], label: str, budget: Budget) -> tuple[list[_Entry], Budget]:
        """With the lock held and no room under ``budget``: close the handles this caller evicted
        (releasing the lock meanwhile: they count until closed), or else wait for others to make
        room; then nothing left to close, and the budget, looked up again after a wait (``configure``
        or the dask config may have changed it meanwhile)."""
        if not closing:
            self._wait(label)
            return closing, self.budget
        self._cond.release()
        try:
            self._close_all(closing)
        finally:
            self._cond.acquire()
        return [], budget

    def _wait(self, label: str) -> None:
        self.counters["waits"] += 1
        timeout = config.number("daskcfa.budget.wait-timeout")
        start = time.monotonic()
        if not self._cond.wait(timeout):
            if time.monotonic() - start >= timeout:
                raise BudgetError(f"waited {timeout:.0f} s for a fragment handle or memory: every handle is in use "
                                  f"(budget {self.budget.filehandles} files, {self.budget.memory:,} bytes)",
                                  file=label or None)

    def _peaks(self) -> None:
        self.counters["peak_files"] = max(self.counters["peak_files"], self._files)
        self.counters["peak_bytes"] = max(self.counters["peak_bytes"], self._bytes)


def _default_close(resource: Any) -> None:
    close = getattr(resource, "close", None)
    if close is not None:
        close()


_MANAGER = FileManager()
# Open fragments are closed before the interpreter finalises: an HDF5 file h5py reads through a Python
# file object (a remote fragment's ranged reads, on fsspec's event loop) calls back into Python as it
# closes, which crashed the process at exit (SIGSEGV) once the interpreter was tearing itself down.
atexit.register(_MANAGER.close_all)


def manager() -> FileManager:
    """This process's fragment file manager."""
    return _MANAGER
