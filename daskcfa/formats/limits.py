"""Bounds that refuse absurd aggregation instructions before anything is allocated.

A corrupt or hostile aggregation file is small but may *claim* anything: a
map of 10^12 fragments, a dimension of 10^15 elements, an instruction
variable of a terabyte that was declared but never written. Each claim is
checked against dask config limits before any array is allocated or read.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import dask.config
import numpy as np

from ..errors import CFAFormatError

DEFAULT_MAX_FRAGMENTS = 100_000_000
#: 10^14 elements: 400 TB of 4-byte values in one variable, beyond any archive's single variable.
DEFAULT_MAX_ELEMENTS = 10**14
#: Characters of one string in a ``char`` fragment (its string-length dimension): 1 MiB.
DEFAULT_MAX_STRING_LENGTH = 1 << 20


def max_fragments() -> int:
    return int(dask.config.get("daskcfa.limits.max-fragments", DEFAULT_MAX_FRAGMENTS))


def max_elements() -> int:
    return int(dask.config.get("daskcfa.limits.max-elements", DEFAULT_MAX_ELEMENTS))


def max_string_length() -> int:
    return int(dask.config.get("daskcfa.limits.max-string-length", DEFAULT_MAX_STRING_LENGTH))


def check_fragment_count(counts: Sequence[int] | np.ndarray, **where: Any) -> None:
    """Refuse a fragment grid larger than ``daskcfa.limits.max-fragments``.

    A dimension without fragments (zero-length) counts as one: it must not
    let the other dimensions list any number of fragments.
    """
    total = 1
    for n in counts:
        total *= max(int(n), 1)
    if total > max_fragments():
        raise CFAFormatError(
            f"the instructions describe {total:,} fragments, more than the limit of {max_fragments():,} "
            "(raise dask config 'daskcfa.limits.max-fragments' if this is genuine)",
            **where,
        )


def check_array_size(dims: Sequence[str], shape: Sequence[int], **where: Any) -> None:
    """Refuse an aggregated array of more than ``daskcfa.limits.max-elements`` elements."""
    total = math.prod(int(n) for n in shape)
    if total > max_elements():
        described = ", ".join(f"{d}={int(n):,}" for d, n in zip(dims, shape))
        raise CFAFormatError(
            f"the aggregated dimensions ({described}) describe {total:,} elements, more than the limit of "
            f"{max_elements():,} (raise dask config 'daskcfa.limits.max-elements' if this is genuine)",
            **where,
        )


def check_instruction_size(name: str, shape: Sequence[int], **where: Any) -> None:
    """Refuse to read an instruction variable holding more values than any valid one could.

    No instruction variable needs more than one value per fragment along each
    of at most a few axes, so more than ``max-fragments`` x (its rank) values
    means a corrupt or hostile file (declared terabytes, never written).
    """
    total = math.prod(int(n) for n in shape)
    limit = max_fragments() * max(1, len(shape))
    if total > limit:
        raise CFAFormatError(
            f"instruction variable {name!r} of shape {tuple(int(n) for n in shape)} holds {total:,} values, more "
            f"than any aggregation within the limit of {max_fragments():,} fragments needs "
            "(dask config 'daskcfa.limits.max-fragments')",
            **where,
        )
