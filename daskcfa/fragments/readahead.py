"""Read-ahead of small remote fragments, and of indexed fragments' chunks: more requests in flight than threads.

A one-point time series through 1,000 small objects is bound by request
latency: each dask thread waits for one GET at a time, and on a real object
store a GET takes tens of milliseconds. When the reads of an aggregated
variable walk along one fragment axis, the objects of the next fragments on
that axis are fetched in the background (S3 objects by read-ahead threads; other
remote objects, or S3 settings only s3fs follows, on fsspec's event loop) and handed
to the tasks that need them, so that up to ``daskcfa.io.readahead`` requests
(default 8, none on ``distributed`` workers; 0 turns read-ahead off) are in
flight per process.

Only objects that their own tasks would fetch whole in one GET are read ahead
(small ones, at most ``daskcfa.io.small-object`` bytes, and larger ones of
which the walk wants most: a reduction over objects of tens of megabytes then
downloads the next while the last decodes), and an object already read in the
current walk is not fetched again (a thread ahead of the others read it), so
read-ahead adds no bytes except at the end of a walk. A walk begins again when
an object it read is read once more (the same reduction computed twice, or
another over the same fragments): from then on only the new walk's reads
count, so it reads ahead as the first did, however short. Fetched
objects wait for their reader at most :data:`_KEPT_SECONDS`; at most
:data:`_AHEAD_BYTES` of them are in flight (at least one; whole objects: at least
:data:`_OBJECTS_PER_THREAD` per dask thread, within 1/:data:`_BUDGET_SHARE` of the memory
budget), and memory is bounded by :data:`_KEPT_PER_REQUEST` times that. A fetch that fails is forgotten: the task
that needs the object fetches it again, with the usual retries and errors.

Fragments read through a chunk index (:mod:`.chunk_index`) are read by byte
range, never whole: along such a walk the chunks the next fragments' reads
will fetch are read ahead instead (:func:`read_ahead_ranges`, by
:func:`.chunk_index.read_ahead`), each range by one GET carrying the same
``If-Match`` version check as the read's own, so a fragment changed since it
was indexed is refused ahead too, and then refused again to its own read
(which falls back to reading it the usual way). Ranges are taken, and
remembered as read, one by one (:func:`take_range`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable, Sequence

import dask.config
from dask.system import CPU_COUNT

from .. import storage
from ..storage.policy import LocationPolicy
from ..storage.profiles import ProfileRef
from .manager import manager
from .worker import on_distributed_worker

__all__ = ["depth", "read_ahead", "read_ahead_ranges", "take", "take_range", "stats"]

#: How long a task waits for a fetch already under way before fetching itself.
_WAIT_SECONDS = 30.0
#: An object fetched and not taken in this time belongs to a walk that went elsewhere.
_KEPT_SECONDS = 30.0
#: Fetched objects kept waiting for their readers, per request allowed in flight.
_KEPT_PER_REQUEST = 4
#: Bytes of larger objects fetched ahead at a time: one or two objects of tens of megabytes
#: (fetched while the previous ones decode), as many as the depth of small ones.
_AHEAD_BYTES = 32 << 20
#: Whole objects in flight per dask thread at least: one received while the thread decodes another
#: (the S3 floor of issue #31 keeps four GETs in flight on two cores; three left the threads waiting).
_OBJECTS_PER_THREAD = 2
#: Whole objects fetched ahead take at most this share of the memory budget (``daskcfa.budget.memory``)
#: beyond :data:`_AHEAD_BYTES`.
_BUDGET_SHARE = 8
#: Reads remembered (each object's latest): the current walk's, up to this many.
_RECENT_READS = 256

#: An object: its URI, the name of the storage profile and the policy it is read with.
_Object = tuple[str, "str | None", "LocationPolicy | None"]
#: A fetch: of a whole object (None), or of one ``(offset, length, version token)`` range of it.
_Fetch = tuple[_Object, "tuple[int, int, str] | None"]


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
        return 0 if on_distributed_worker() else DEFAULT_DEPTH
    return max(0, int(value))


class _ReadAhead:
    """The objects and byte ranges fetched ahead in this process (oldest first) and those read recently."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fetches: OrderedDict[_Fetch, tuple[concurrent.futures.Future, float]] = OrderedDict()
        #: each read's number (``_reads`` then), latest last; those from ``_walk`` on are this walk's
        self._recent: OrderedDict[_Fetch, int] = OrderedDict()
        self._reads = 0
        self._walk = 0
        self.started = 0  # fetches started ahead
        self.used = 0  # of which handed to the read that needed them

    def start(self, wanted: Iterable[tuple[_Fetch, Callable[[], concurrent.futures.Future | None]]],
              limit: int) -> None:
        """Start the ``wanted`` fetches (each: its key, and what starts it) not under way nor read recently."""
        with self._lock:  # held while starting: a read must not begin between check and start
            self._expire(time.monotonic(), limit)
            in_flight = sum(not f.done() for f, _ in self._fetches.values())
            for key, fetch in wanted:
                if key in self._fetches or self._recent.get(key, -1) >= self._walk:
                    continue
                if in_flight >= limit:
                    return
                try:
                    future = fetch()  # (no wait)
                except Exception:  # best effort: the read itself reports any error
                    return
                if future is None:
                    return
                self._fetches[key] = (future, time.monotonic())
                self.started += 1
                in_flight += 1

    def take(self, key: _Fetch) -> Any:
        with self._lock:
            entry = self._fetches.pop(key, None)
            if self._recent.pop(key, -1) >= self._walk:  # read twice: the walk is done again
                self._walk = self._reads
            self._recent[key] = self._reads
            self._reads += 1
            while len(self._recent) > _RECENT_READS:
                self._recent.popitem(last=False)
        if entry is None:
            return None
        try:
            data = entry[0].result(timeout=_WAIT_SECONDS)
        except Exception:  # (a failed or refused fetch: the read fetches again, with its own checks and errors)
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


def _object(uri: str, profile: ProfileRef, policy: LocationPolicy | None) -> _Object:
    return (uri, profile.name, policy)


def _limit(nbytes: int, least: int = 1) -> int:
    """Fetches in flight at a time, each of up to ``nbytes``: at most :func:`depth`, and no more
    than :data:`_AHEAD_BYTES` of them (at least ``least``)."""
    return min(depth(), max(least, _AHEAD_BYTES // max(1, nbytes)))


def _objects_least(nbytes: int, memory: int) -> int:
    """Whole objects of ``nbytes`` kept in flight at least: :data:`_OBJECTS_PER_THREAD` per thread of
    the local scheduler, within 1/:data:`_BUDGET_SHARE` of the ``memory`` budget (at least one)."""
    threads = dask.config.get("num_workers", None) or CPU_COUNT
    return max(1, min(_OBJECTS_PER_THREAD * threads, memory // _BUDGET_SHARE // max(1, nbytes)))


def read_ahead(uris: Iterable[str], profile: ProfileRef, policy: LocationPolicy | None = None, *,
               nbytes: int = 0) -> None:
    """Start fetching these whole remote objects, nearest first (at most :func:`depth` in flight,
    and for objects of up to ``nbytes`` each, no more than :data:`_AHEAD_BYTES` of them, unless
    fewer than :func:`_objects_least`).

    The URIs must be allowed by ``policy``, which also decides where HTTP redirects may lead.
    """
    most = manager().budget.memory  # (an object longer than a read may hold is not fetched ahead either)
    limit = _limit(nbytes, _objects_least(nbytes, most))
    if limit:
        _READ_AHEAD.start((((_object(uri, profile, policy), None),
                            functools.partial(storage.fetch_soon, uri, profile, policy=policy, size_hint=nbytes,
                                              max_bytes=most))
                           for uri in uris), limit)


def read_ahead_ranges(ranges: Iterable[tuple[str, tuple[int, str], Sequence[tuple[int, int]]]], profile: ProfileRef,
                      policy: LocationPolicy | None = None) -> None:
    """Start fetching byte ranges of remote objects, nearest first: for each object its URI, the
    version ``(size, token)`` it must still be (:func:`daskcfa.storage.fetch_range_soon`: the check
    rides on each GET) and its ``(offset, length)`` ranges. Ranges read recently are not fetched
    again; at most :func:`depth` ranges are in flight, and no more than
    :data:`_AHEAD_BYTES` of them (none larger). The URIs must be allowed by ``policy``."""
    wanted = [((_object(uri, profile, policy), (int(offset), int(length), expected[1])),
               functools.partial(storage.fetch_range_soon, uri, offset, length, expected, profile, policy=policy))
              for uri, expected, pieces in ranges for offset, length in pieces
              if length <= _AHEAD_BYTES]  # (a larger chunk is left to its read, within its memory budget)
    limit = _limit(max((key[1][1] for key, _ in wanted), default=0))
    if limit and wanted:
        _READ_AHEAD.start(wanted, limit)


def take(uri: str, profile: ProfileRef, policy: LocationPolicy | None = None) -> storage.Blocks | None:
    """The bytes of ``uri`` if it was read ahead (with the same credentials and
    policy; waiting for a fetch under way), else None.

    Every whole-object read asks, so that what was read is not read ahead again.
    """
    return _READ_AHEAD.take((_object(uri, profile, policy), None))


def take_range(uri: str, offset: int, length: int, token: str, profile: ProfileRef,
               policy: LocationPolicy | None = None) -> bytes | None:
    """The bytes of one range of ``uri`` if it was read ahead from the version ``token`` (with the
    same credentials and policy; waiting for a fetch under way), else None (also when the object
    had changed: the read finds that out itself).

    Every read of a chunk through the chunk index asks, so that what was read is not read ahead again.
    """
    return _READ_AHEAD.take((_object(uri, profile, policy), (int(offset), int(length), token)))


def stats() -> dict[str, int]:
    """This process's read-ahead so far: fetches ``started`` and ``used`` by a read."""
    return {"started": _READ_AHEAD.started, "used": _READ_AHEAD.used}
