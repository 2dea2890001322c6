"""Small selections across many local fragments (or small remote objects), read a batch of fragments per task.

A point series ``x[:, j, i]`` over 1,000 fragments is one dask task per
fragment when the chunks are the fragments, and each task's own work (find
the HDF5 chunk holding the point, inflate part of it) is smaller than what
dask spends per task plus what each read call costs around it. The array
``daskcfa.from_cfa`` returns is a :class:`FragmentArray`: a dask array like
any other, whose chunks are the fragments; only its ``__getitem__`` differs.
A selection that takes little of each of many local fragments is made on a
second dask array over the same variable whose chunks hold several whole
fragments along one axis, so that one task reads its part of each of them in
turn (the values are the same; the result's chunks are those batches).

Small remote objects (each fetched whole) are batched too where the process
running a batch reads ahead (``daskcfa.io.readahead``; not on a
``distributed`` cluster, whose workers read nothing ahead by default): the
task fetches the batch's next objects while it decodes one
(:mod:`..fragments.readahead`), so requests still overlap; the S3 point
series over 1,000 objects took 15-25% less CPU in 125 tasks than in 1,000
(dask's own cost of a task; docs/performance.md). Other remote fragments keep one
task per fragment: their tasks overlap requests.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable

import numpy as np
import dask.config
from dask.array.slicing import normalize_index
from dask.system import CPU_COUNT

from ..fragments import readahead
from ..lazy import dask_array as da

__all__ = ["FragmentArray", "batched_chunks"]

#: A selection is batched when it takes at most this many bytes of any fragment it touches, and at most
#: this share of one (a selection of whole fragments keeps the fragments as its chunks) ...
SMALL_PART = 64 * 1024
SMALL_SHARE = 1 / 8
#: ... and the batches give each of dask's threads (``num_workers``; a ``distributed`` default client's
#: threads in all) at least this many tasks ...
TASKS_PER_THREAD = 16
#: ... of at most this many fragments each ...
MOST_PER_TASK = 8
#: ... or this many on a ``distributed`` cluster, where a task costs the scheduler and the workers' event
#: loops milliseconds of CPU, not the threaded scheduler's tenth of one (a point series over 1,000 fragments
#: on 2 workers: 17-23% less CPU in all with batches of 16-32 than of 8; docs/performance.md)
MOST_PER_TASK_DISTRIBUTED = 32


class FragmentArray(da.Array):
    """The dask array of an aggregated variable, one chunk per fragment (see the module's docstring)."""

    __slots__ = ("_rechunked", "_local", "_ahead")

    @classmethod
    def over(cls, plain: Any, meta: np.ndarray, rechunked: Callable[[tuple], Any], local: bool, *,
             ahead: bool = False) -> "FragmentArray":
        """``plain`` (from :func:`dask.array.from_array`, with ``meta``) as a :class:`FragmentArray`;
        ``rechunked(chunks)`` gives the same variable with other chunks; ``local``: its fragments are
        local files; ``ahead``: small remote objects, each fetched whole, which read-ahead fetches."""
        x = cls(plain.dask, plain.name, plain.chunks, meta=meta)
        x._rechunked = rechunked
        x._local = local
        x._ahead = ahead
        return x

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._local = self._ahead = False  # (its graph is no longer the variable's alone: never read around it)

    def __getitem__(self, index: Any) -> Any:
        chunks = None
        if self._local or self._ahead:
            chunks = batched_chunks(self.chunks, self.shape, index, self.dtype.itemsize, fetched=self._ahead)
        if chunks is None:
            return super().__getitem__(index)
        return self._rechunked(chunks)[index]


def batched_chunks(chunks: tuple[tuple[int, ...], ...], shape: tuple[int, ...], index: Any,
                   itemsize: int, *, fetched: bool = False) -> tuple[tuple[int, ...], ...] | None:
    """Chunks of whole fragments (``chunks``, one per fragment) batched along one axis for the
    selection ``index``, or None where one task per fragment is as good: a selection other than
    integers and increasing slices, one that takes more than :data:`SMALL_PART` bytes or
    :data:`SMALL_SHARE` of a fragment, or too few fragments to batch; and for remote objects
    (``fetched``) a scheduler whose tasks read nothing ahead (a ``distributed`` cluster, or
    ``daskcfa.io.readahead`` 0: a batch's objects would be fetched one after another)."""
    if not shape:
        return None
    cluster = _distributed_threads()
    if fetched and (cluster is not None or not readahead.depth()):
        return None
    try:
        key = normalize_index(index, shape)
    except (IndexError, TypeError, ValueError, NotImplementedError):
        return None  # (dask's own indexing reports it)
    if len(key) != len(shape):
        return None
    part = itemsize
    touched = []
    for k, row, n in zip(key, chunks, shape):
        if isinstance(k, (int, np.integer)):
            count = 1
        elif isinstance(k, slice) and (k.step or 1) == 1:
            start, stop, _ = k.indices(n)
            if stop <= start:
                return None
            bounds = np.cumsum((0,) + tuple(row))
            first = int(np.searchsorted(bounds, start, side="right")) - 1
            last = int(np.searchsorted(bounds, stop - 1, side="right")) - 1
            count = last - first + 1
            part *= min(stop - start, max(row))
        else:
            return None
        touched.append(count)
    axis = int(np.argmax(touched))
    threads = cluster or dask.config.get("num_workers", None) or CPU_COUNT
    most = MOST_PER_TASK if cluster is None else MOST_PER_TASK_DISTRIBUTED
    per_task = min(most, touched[axis] // (TASKS_PER_THREAD * threads))
    whole = itemsize * math.prod(max(row) for row in chunks)
    if part > min(SMALL_PART, SMALL_SHARE * whole) or per_task < 2:
        return None
    row = chunks[axis]
    grouped = tuple(sum(row[i:i + per_task]) for i in range(0, len(row), per_task))
    return chunks[:axis] + (grouped,) + chunks[axis + 1:]


def _distributed_threads() -> int | None:
    """The threads of the ``distributed`` client that dask's default scheduler is (None: another scheduler).
    distributed is never imported here: without it, there is no such client."""
    distributed = sys.modules.get("distributed")
    if distributed is None or dask.config.get("scheduler", None) not in ("dask.distributed", "distributed"):
        return None
    try:
        client = distributed.default_client()
    except ValueError:  # (none)
        return None
    try:  # (an asynchronous client answers from what it last heard, without a request)
        threads = client.scheduler_info(n_workers=0).get("total_threads")
    except (OSError, RuntimeError):  # (its scheduler gone: the threaded rule is as good a guess)
        return None
    return int(threads) if threads else None
