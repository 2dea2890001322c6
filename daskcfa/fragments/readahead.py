"""Read-ahead of small remote fragments: more requests in flight than threads.

A one-point time series through 1,000 small objects is bound by request
latency: each dask thread waits for one GET at a time, and on a real object
store a GET takes tens of milliseconds. When the reads of an aggregated
variable walk along one fragment axis, the objects of the next fragments on
that axis are fetched in the background (on fsspec's event loop) and handed
to the tasks that need them, so that up to ``daskcfa.io.readahead`` requests
(default 8, none on ``distributed`` workers; 0 turns read-ahead off) are in
flight per process.

Only objects that their own tasks would fetch whole in one GET are read ahead
(small ones, at most ``daskcfa.io.small-object`` bytes, and larger ones of
which the walk wants most: a reduction over objects of tens of megabytes then
downloads the next while the last decodes), and an object among the last
:data:`_RECENT_READS` read is not fetched again (a thread ahead of the others
read it), so read-ahead adds no bytes except at the end of a walk. A walk
done again reads ahead again, unless it is shorter than that window. Fetched
objects wait for their reader at most :data:`_KEPT_SECONDS`; at most
:data:`_AHEAD_BYTES` of them are in flight (at least one), and memory is
bounded by :data:`_KEPT_PER_REQUEST` times that. A fetch that fails is forgotten: the task
that needs the object fetches it again, with the usual retries and errors.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from collections import OrderedDict
from typing import Iterable

import dask.config

from .. import storage
from ..storage.policy import LocationPolicy
from ..storage.profiles import ProfileRef

__all__ = ["depth", "read_ahead", "take", "stats"]

#: How long a task waits for a fetch already under way before fetching itself.
_WAIT_SECONDS = 30.0
#: An object fetched and not taken in this time belongs to a walk that went elsewhere.
_KEPT_SECONDS = 30.0
#: Fetched objects kept waiting for their readers, per request allowed in flight.
_KEPT_PER_REQUEST = 4
#: Bytes of larger objects fetched ahead at a time: one or two objects of tens of megabytes
#: (fetched while the previous ones decode), as many as the depth of small ones.
_AHEAD_BYTES = 32 << 20
#: An object among this many read last is not read ahead again: a thread ahead
#: of the others has read it (threads overtake each other by about their number).
_RECENT_READS = 256

_Key = tuple[str, "str | None", "LocationPolicy | None"]


#: Read-ahead depth unless configured, in a process that runs a whole walk (local schedulers).
DEFAULT_DEPTH = 8


def depth() -> int:
    """Requests in flight ahead of the reads, per process (dask config ``daskcfa.io.readahead``).

    Unset, it is :data:`DEFAULT_DEPTH`, except on a ``distributed`` worker: there
    the scheduler spreads a walk's tasks over the workers, and a worker would
    fetch ahead objects that others then read (a one-point series over 1,000
    objects on two workers fetched 2.1x the bytes). Set it to read ahead there too.
    """
    value = dask.config.get("daskcfa.io.readahead", None)
    if value is None:
        return 0 if _on_distributed_worker() else DEFAULT_DEPTH
    return max(0, int(value))


def _on_distributed_worker() -> bool:
    worker = sys.modules.get("distributed.worker")  # (not imported: not a worker)
    if worker is None:
        return False
    try:
        worker.get_worker()
    except ValueError:
        return False
    return True


class _ReadAhead:
    """The objects fetched ahead in this process (oldest first) and those read recently."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fetches: OrderedDict[_Key, tuple[concurrent.futures.Future, float]] = OrderedDict()
        self._recent: OrderedDict[_Key, None] = OrderedDict()
        self.started = 0  # fetches started ahead
        self.used = 0  # of which handed to the read that needed them

    def start(self, uris: Iterable[str], profile: ProfileRef, policy: LocationPolicy | None, limit: int,
              size_hint: int) -> None:
        with self._lock:  # held while starting: a read must not begin between check and start
            self._expire(time.monotonic(), limit)
            in_flight = sum(not f.done() for f, _ in self._fetches.values())
            for uri in uris:
                key = (uri, profile.name, policy)
                if key in self._fetches or key in self._recent:
                    continue
                if in_flight >= limit:
                    return
                try:
                    future = storage.fetch_soon(uri, profile, policy=policy, size_hint=size_hint)  # (no wait)
                except Exception:  # best effort: the read itself reports any error
                    return
                if future is None:
                    return
                self._fetches[key] = (future, time.monotonic())
                self.started += 1
                in_flight += 1

    def take(self, uri: str, profile: ProfileRef, policy: LocationPolicy | None) -> storage.Blocks | None:
        key = (uri, profile.name, policy)
        with self._lock:
            entry = self._fetches.pop(key, None)
            self._recent[key] = None
            self._recent.move_to_end(key)
            while len(self._recent) > _RECENT_READS:
                self._recent.popitem(last=False)
        if entry is None:
            return None
        try:
            data = entry[0].result(timeout=_WAIT_SECONDS)
        except Exception:
            entry[0].cancel()
            return None
        with self._lock:
            self.used += 1
        return data

    def _expire(self, now: float, limit: int) -> None:
        for key, (future, started) in list(self._fetches.items()):
            if now - started > _KEPT_SECONDS:
                future.cancel()
                del self._fetches[key]
        while len(self._fetches) > _KEPT_PER_REQUEST * limit:
            _, (future, _) = self._fetches.popitem(last=False)
            future.cancel()


_READ_AHEAD = _ReadAhead()


def read_ahead(uris: Iterable[str], profile: ProfileRef, policy: LocationPolicy | None = None, *,
               nbytes: int = 0) -> None:
    """Start fetching these whole remote objects, nearest first (at most :func:`depth` in flight,
    and for objects of up to ``nbytes`` each, no more than :data:`_AHEAD_BYTES` of them).

    The URIs must be allowed by ``policy``, which also decides where HTTP redirects may lead.
    """
    limit = min(depth(), max(1, _AHEAD_BYTES // max(1, nbytes)))
    if limit:
        _READ_AHEAD.start(uris, profile, policy, limit, nbytes)


def take(uri: str, profile: ProfileRef, policy: LocationPolicy | None = None) -> storage.Blocks | None:
    """The bytes of ``uri`` if it was read ahead (with the same credentials and
    policy; waiting for a fetch under way), else None.

    Every whole-object read asks, so that what was read is not read ahead again.
    """
    return _READ_AHEAD.take(uri, profile, policy)


def stats() -> dict[str, int]:
    """This process's read-ahead so far: fetches ``started`` and ``used`` by a read."""
    return {"started": _READ_AHEAD.started, "used": _READ_AHEAD.used}
