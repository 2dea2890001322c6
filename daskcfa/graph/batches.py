"""Work over every fragment of some aggregated variables, one dask task per batch of fragments.

The archive operations that look at fragments one by one (reference sets, the
chunk index, verification) run their per-fragment function in tasks on the
current scheduler: batched, so that a million fragments make at most
:data:`MAX_TASKS` tasks, and handed each variable's :class:`Target` (an opaque
storage profile, never credentials).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import dask

from ..fragments.canonical import Target
from ..model import AggregatedVariable, FragmentRef
from ..storage.access import Access
from .read import AggregatedArray

__all__ = ["MAX_TASKS", "in_batches"]

#: At most this many tasks per operation over fragments (fragments are batched beyond it).
MAX_TASKS = 10_000


def in_batches(chosen: Sequence[AggregatedVariable], url: str, access: Access,
               function: Callable[[Sequence[FragmentRef], Target], list[Any]], label: str) -> dict[str, list[Any]]:
    """``function(fragments, target)`` over every fragment of the ``chosen`` variables, one dask
    task per batch (at most ``MAX_TASKS`` in all) on the current scheduler: its results, per variable,
    in fragment order."""
    total = sum(len(av.fragments) for av in chosen)
    per_task = max(1, math.ceil(total / MAX_TASKS))
    tasks = []
    for av in chosen:
        target = AggregatedArray(av, access=access).target
        refs = list(av.fragments)
        for start in range(0, len(refs), per_task):
            batch = refs[start:start + per_task]
            key = f"{label}-{av.basename}-{dask.base.tokenize(url, av.name, batch, target)}"
            tasks.append((av.name, dask.delayed(function, pure=True)(batch, target, dask_key_name=key)))
    results = dask.compute(*(task for _, task in tasks))
    found: dict[str, list[Any]] = {av.name: [] for av in chosen}
    for (name, _), batch in zip(tasks, results):
        found[name] += batch
    return found
