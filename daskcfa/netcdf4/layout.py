"""Where an aggregated variable being written keeps its values: its fragments' layout (which grows
along an unlimited dimension) and the buffer of each fragment not yet written."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from dask.utils import parse_bytes

from ..choices import MAX_FRAGMENT_SIZE
from ..errors import ArgumentError
from ..graph.plan import plan_fragments
from ..model import FragmentGrid
from .definitions import GrowingDimension

__all__ = ["Buffer", "FragmentLayout"]


class Buffer:
    """One fragment's assigned values, before it is written: values, which are masked, which assigned.
    (An aggregated variable's buffers hold stored values, encoded as they are assigned, so that what
    an update merges them with, or reads back, never goes through a decode and encode again.)"""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.values = np.zeros(shape, dtype)
        self.masked = np.zeros(shape, bool)
        self.assigned = np.zeros(shape, bool)
        self.count = 0  #: elements assigned

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.masked.nbytes + self.assigned.nbytes

    @property
    def fullness(self) -> float:
        return self.count / self.assigned.size if self.assigned.size else 1.0

    def put(self, where: tuple, values: np.ndarray) -> None:
        self.values[where] = np.ma.getdata(values)
        self.masked[where] = np.ma.getmaskarray(values)
        self.count += int(self.assigned[where].size - np.count_nonzero(self.assigned[where]))
        self.assigned[where] = True

    def mark(self, assigned: np.ndarray | bool) -> None:
        """Say which elements are assigned (all of them: ``True``)."""
        self.assigned[...] = assigned
        self.count = int(np.count_nonzero(self.assigned))

    def complete(self) -> bool:
        return self.count == self.assigned.size

    def array(self, shape: tuple[int, ...], underneath: Any = None) -> np.ma.MaskedArray:
        """The values over ``shape`` (a fragment cut short at the end of an unlimited dimension):
        what was not assigned comes from ``underneath`` (the fragment as stored), else is missing."""
        cut = tuple(slice(0, n) for n in shape)
        values, masked, assigned = self.values[cut], self.masked[cut], self.assigned[cut]
        if underneath is None:
            return np.ma.MaskedArray(values, mask=masked | ~assigned)
        under = np.ma.asarray(underneath)
        return np.ma.MaskedArray(np.where(assigned, values, np.ma.getdata(under)),
                                 mask=np.where(assigned, masked, np.ma.getmaskarray(under)))


class FragmentLayout:
    """Where an aggregated variable's fragments lie: offsets per dimension, and along an unlimited
    dimension a fragment length that repeats past the known offsets as the dimension grows."""

    def __init__(self, offsets: list[list[int]], steps: list[int | None]) -> None:
        self.offsets = offsets  # known fragment boundaries per dimension (start 0, end the last boundary)
        self.steps = steps  # unlimited dimensions: the length of each further fragment

    @classmethod
    def plan(cls, path: str, dimensions: Sequence[GrowingDimension], dtype: np.dtype, fragment_shape: Any,
             max_fragment_size: int | str | None) -> "FragmentLayout":
        """The layout of a new variable: ``subarray_shape`` (``fragment_shape``) or fragments of at most
        ``max_subarray_size`` bytes (default 50 MB)."""
        dims = tuple(d.name for d in dimensions)
        unlimited = [d.unlimited for d in dimensions]
        size = max_fragment_size if max_fragment_size is not None else MAX_FRAGMENT_SIZE
        if fragment_shape is not None:
            wanted = [int(n) for n in np.asarray(fragment_shape).reshape(-1)]
            if len(wanted) != len(dims) or min(wanted, default=1) < 1:
                raise ArgumentError(f"{path}: subarray_shape {list(wanted)} must give a size >= 1 for each of "
                                    f"its {len(dims)} dimensions")
        elif any(unlimited):
            fixed = [1 if u else d.size for u, d in zip(unlimited, dimensions)]
            step = plan_fragments(fixed, dtype, dims, max_fragment_size=size)
            wanted = [max(row) if row else 1 for row in step.sizes]
            per_step = int(np.prod(wanted, dtype=np.int64)) * dtype.itemsize
            first = unlimited.index(True)
            wanted[first] = max(1, parse_bytes(size) // max(per_step, 1)) if isinstance(size, str) else \
                max(1, int(size) // max(per_step, 1))
        else:
            grid = plan_fragments(tuple(d.size for d in dimensions), dtype, dims, max_fragment_size=size)
            return cls([list(o) for o in grid.offsets], [None] * len(dims))
        offsets, steps = [], []
        for n, u, d in zip(wanted, unlimited, dimensions):
            if u:
                offsets.append([0])
                steps.append(n)
            else:
                offsets.append(list(range(0, d.size, n)) + [d.size] if d.size else [0, 0])
                steps.append(None)
        return cls(offsets, steps)

    def count(self, d: int, size: int) -> int:
        """Fragments along dimension ``d`` when it has ``size`` elements."""
        known = len(self.offsets[d]) - 1
        step = self.steps[d]
        end = self.offsets[d][-1]
        if step is None or size <= end:
            return max(known, 1) if size or known else 1
        return known + -(-(size - end) // step)

    def span(self, d: int, i: int) -> tuple[int, int]:
        """Start and end (its capacity: may lie past an unlimited dimension's size) of fragment ``i``."""
        known = len(self.offsets[d]) - 1
        if i < known:
            return self.offsets[d][i], self.offsets[d][i + 1]
        start = self.offsets[d][-1] + (i - known) * self.steps[d]
        return start, start + self.steps[d]

    def which(self, d: int, positions: np.ndarray) -> np.ndarray:
        """The fragment along dimension ``d`` of each position."""
        bounds = np.asarray(self.offsets[d])
        inside = np.searchsorted(bounds, positions, side="right") - 1
        if self.steps[d] is None:
            return np.minimum(inside, len(bounds) - 2)
        past = positions >= bounds[-1]
        return np.where(past, len(bounds) - 1 + (positions - bounds[-1]) // self.steps[d], inside)

    def grid(self, shape: tuple[int, ...]) -> FragmentGrid:
        """The fragment grid of the variable at ``shape``: the last fragment along an unlimited dimension cut short."""
        sizes = []
        for d, n in enumerate(shape):
            row = []
            for i in range(self.count(d, n)):
                a, b = self.span(d, i)
                row.append(max(0, min(b, n) - a))
            sizes.append(tuple(row))
        return FragmentGrid(tuple(sizes))
