"""Objects made once per process.

Threads, their queues and connections do not survive a fork: a forked child (a
multiprocessing pool, a worker started by fork) that used its parent's would
wait on threads that do not run there. So each process makes its own.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Generic, TypeVar

__all__ = ["PerProcess"]

T = TypeVar("T")


class PerProcess(Generic[T]):
    """``make()``'s result, made on first use in each process."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._made: tuple[int, T] | None = None

    def get(self) -> T:
        with self._lock:
            if self._made is None or self._made[0] != os.getpid():
                self._made = (os.getpid(), self._make())
            return self._made[1]
