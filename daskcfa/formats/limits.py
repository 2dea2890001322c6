"""Bounds that refuse absurd aggregation instructions before anything is allocated."""

from __future__ import annotations

from typing import Any, Sequence

import dask.config
import numpy as np

from ..errors import CFAFormatError

DEFAULT_MAX_FRAGMENTS = 100_000_000


def max_fragments() -> int:
    return int(dask.config.get("daskcfa.limits.max-fragments", DEFAULT_MAX_FRAGMENTS))


def check_fragment_count(counts: Sequence[int] | np.ndarray, **where: Any) -> None:
    """Refuse a fragment grid larger than ``daskcfa.limits.max-fragments``."""
    total = 1
    for n in counts:
        total *= int(n)
    if total > max_fragments():
        raise CFAFormatError(
            f"the instructions describe {total:,} fragments, more than the limit of {max_fragments():,} "
            "(raise dask config 'daskcfa.limits.max-fragments' if this is genuine)",
            **where,
        )
