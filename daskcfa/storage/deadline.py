"""A deadline for the body of one GET.

The read timeouts of botocore, urllib3 and aiohttp bound each wait for the
socket, not a response's body: a server sending a byte now and then held a GET
for as long as its declared length lasted (a 400-byte body at a byte every
0.05 s: 20 s; a gigabyte's: for ever). A body must now arrive at
``daskcfa.storage.min-throughput`` bytes a second, after a grace of one read
timeout; past that, its connection is shut -- which ends the read blocked on it
-- and the GET is a :class:`StorageError`, not tried again (a server that slow
would hold each attempt as long).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import socket
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Callable, Iterator

from .. import config
from ..errors import StorageError
from .per_process import PerProcess

__all__ = ["body_deadline", "async_body_deadline", "shut_connection_of"]

#: seconds of grace where the client's read timeout is not known (botocore's default)
_DEFAULT_GRACE = 60.0


def _seconds(length: int, read_timeout: float | None) -> float | None:
    """How long a body of ``length`` bytes may take, or None (``min-throughput`` 0: no deadline)."""
    rate = config.size("daskcfa.storage.min-throughput")
    if not rate:
        return None
    return (read_timeout if read_timeout and read_timeout > 0 else _DEFAULT_GRACE) + length / rate


def _too_slow(length: int | None, seconds: float, uri: str) -> StorageError:
    body = "body (of no declared length)" if length is None else f"{length:,}-byte body"
    return StorageError(f"the server sent the object's {body} too slowly: not received in "
                        f"{seconds:.0f} s (dask config 'daskcfa.storage.min-throughput')", file=uri)


class _Entry:
    __slots__ = ("shut", "done", "fired")

    def __init__(self, shut: Callable[[], None]) -> None:
        self.shut, self.done, self.fired = shut, False, False


class _Watchdog:
    """One daemon thread shutting the connections of bodies past their deadlines."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Entry]] = []
        self._order = itertools.count()
        self._live = 0
        self._cond = threading.Condition()
        threading.Thread(target=self._run, name="daskcfa-body-deadlines", daemon=True).start()

    def add(self, when: float, shut: Callable[[], None]) -> _Entry:
        entry = _Entry(shut)
        with self._cond:
            if len(self._heap) > 2 * self._live + 1024:  # (entries done long before their deadlines)
                self._heap = [item for item in self._heap if not item[2].done]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (when, next(self._order), entry))
            self._live += 1
            self._cond.notify()
        return entry

    def remove(self, entry: _Entry) -> None:
        with self._cond:  # (under the lock: a body done is never shut after)
            if not entry.done:
                entry.done = True
                self._live -= 1

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                entry = heapq.heappop(self._heap)[2]
                entry.fired = entry.done = True
                self._live -= 1
                try:
                    entry.shut()
                except Exception:  # (a connection closed meanwhile)
                    pass


#: this process's watchdog (a forked child makes its own)
_WATCHDOG = PerProcess(_Watchdog)


@contextmanager
def body_deadline(length: int, read_timeout: float | None, uri: str,
                  shut: Callable[[], None] | None) -> Iterator[None]:
    """Receive a body of ``length`` bytes in this block, in this thread, within its deadline: past it,
    ``shut()`` (called from another thread) ends the blocked read, and the block's failure -- or its
    end -- is a :class:`StorageError`. ``shut`` None: the connection cannot be reached, no deadline."""
    seconds = None if shut is None else _seconds(length, read_timeout)
    if seconds is None:
        yield
        return
    watchdog = _WATCHDOG.get()
    entry = watchdog.add(time.monotonic() + seconds, shut)  # type: ignore[arg-type]
    try:
        yield
    except Exception:
        if entry.fired:
            raise _too_slow(length, seconds, uri) from None
        raise
    finally:  # (also on an interrupt: no entry is left to shut the connection later)
        watchdog.remove(entry)
    if entry.fired:  # (the body ended as its connection was shut: not trusted)
        raise _too_slow(length, seconds, uri)


@asynccontextmanager
async def async_body_deadline(length: int | None, read_timeout: float | None, uri: str,
                              received: Callable[[], int] | None = None) -> AsyncIterator[None]:
    """:func:`body_deadline` for a body received on an event loop (the read is cancelled instead).
    ``length`` None (a body of no declared length, ``received()`` its bytes so far): the deadline moves on
    as bytes arrive, so a body that never ends is cut once it falls behind the rate."""
    seconds = _seconds(length or 0, read_timeout)
    if seconds is None:
        yield
        return
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    start, expired = loop.time(), []

    def expire() -> None:
        if length is None and received is not None:
            allowed = _seconds(received(), read_timeout)
            if allowed is None:  # (the bound turned off meanwhile)
                return
            if start + allowed > loop.time():
                timer[0] = loop.call_later(start + allowed - loop.time(), expire)
                return
        expired.append(task.cancel())  # type: ignore[union-attr]

    # (the task cancelled past its deadline: ``asyncio.timeout``, which does this, is Python 3.11's)
    timer = [loop.call_later(seconds, expire)]
    try:
        yield
    except asyncio.CancelledError:
        if expired:
            if hasattr(task, "uncancel"):  # (Python 3.11: the cancel counted as handled, as asyncio.timeout does)
                task.uncancel()
            raise _too_slow(length, loop.time() - start, uri) from None
        raise
    finally:
        timer[0].cancel()


def shut_connection_of(response: Any) -> Callable[[], None] | None:
    """What shuts the socket a urllib3 response is read from (a read blocked on it then ends),
    or None where it cannot be reached. Not once the response has given its connection back to the
    pool (urllib3 does so in the read that ends the body, inside the deadline's block): another GET
    may be using it."""
    connection = getattr(response, "connection", None)
    sock = getattr(connection, "sock", None)
    if not isinstance(sock, socket.socket):
        return None

    def shut() -> None:
        if getattr(response, "connection", None) is connection:
            sock.shutdown(socket.SHUT_RDWR)

    return shut
