"""Numpy basic/advanced indexing split across a fragment grid.

An index into the aggregated array becomes, per dimension, a list of
*pieces*: which fragment, what to read from it, and where the values go in
the output. The cartesian product of the pieces is the list of fragment
reads. Lookups are O(log n) per dimension (bisection on fragment offsets).

What numpy takes and this takes, with numpy's result: integers (negative
from the end), slices with any step, ``Ellipsis``, and one 1-D integer or
boolean array (numpy's rule for where its dimension goes included). What
numpy takes and this refuses, with an :class:`~daskcfa.IndexingError`:
``np.newaxis`` (``None``), integer or boolean arrays of other than one
dimension, a boolean scalar (``True``: numpy adds a dimension), and more
than one array in an index.
Those are selections of a result, not reads of fragments: dask makes
most of them on the array :func:`daskcfa.from_cfa` gives (``None``, a 2-D
boolean mask, ``.vindex`` for arrays point-wise), which hands this module
only slices; numpy makes the others on computed values.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple, Sequence

import numpy as np

from ..errors import IndexingError
from ..model import FragmentGrid


class Piece(NamedTuple):  # (a tuple: made for every dimension of every read, faster than a dataclass)
    """The part of one dimension's index that falls in one fragment."""

    fragment: int
    #: what to read in the fragment: an int, or a slice with positive step
    local: int | slice
    #: where it goes in the output (a slice), None for an int index
    out: slice | None
    #: for array indices: positions to take from what ``local`` read
    take: np.ndarray | None = None


class DimIndex(NamedTuple):
    pieces: tuple[Piece, ...]
    length: int | None  #: output length (None: the dimension is dropped)
    reverse: bool = False  #: the output must be reversed (negative step)


#: what every refusal says (see the module's docstring)
REFUSED = ("np.newaxis, boolean scalars, arrays of other than one dimension and more than one array per index "
           "are not read from fragments: select them from what was read, e.g. index the dask array "
           "(daskcfa.from_cfa(...)[index], .vindex[...] for point-wise arrays) or its computed values")


def expand_key(key: Any, ndim: int) -> tuple:
    """Expand Ellipsis and pad with full slices; reject what numpy would reject."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(k is None for k in key):
        raise IndexingError(f"np.newaxis in {key!r}: {REFUSED}")
    n_ellipsis = sum(1 for k in key if k is Ellipsis)
    if n_ellipsis > 1:
        raise IndexingError("an index can only have a single ellipsis ('...')")
    if n_ellipsis:
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (ndim - len(key) + 1) + key[i + 1 :]
    if len(key) > ndim:
        raise IndexingError(f"too many indices for array: array is {ndim}-dimensional, but {len(key)} were indexed")
    return key + (slice(None),) * (ndim - len(key))


def split_dimension(grid: FragmentGrid, dim: int, index: Any) -> DimIndex:
    """Split one dimension's index over the fragments along ``dim``."""
    size = grid.shape[dim]
    offsets = grid.offsets[dim]
    if isinstance(index, slice):
        start, stop, step = index.indices(size)
        count = len(range(start, stop, step))
        reverse = step < 0
        if reverse:  # read forwards, reverse afterwards
            start, step = start + step * (count - 1) if count else 0, -step
            stop = start + step * (count - 1) + 1 if count else 0
        pieces = []
        for frag in grid.fragments_between(dim, start, stop):
            lo, hi = offsets[frag], offsets[frag + 1]
            first = start if lo <= start else start + -(-(lo - start) // step) * step
            end = min(stop, hi)
            if first >= end:
                continue
            n = len(range(first, end, step))
            out_start = (first - start) // step
            pieces.append(Piece(frag, slice(first - lo, end - lo, step), slice(out_start, out_start + n)))
        return DimIndex(tuple(pieces), count, reverse)
    if _is_array(index):
        arr = np.asarray(index)
        if arr.ndim != 1:
            raise IndexingError(f"an index array of shape {arr.shape}: {REFUSED}")
        if arr.dtype == bool:
            if arr.shape != (size,):
                raise IndexingError(f"boolean index of shape {arr.shape} does not match dimension of size {size}")
            arr = np.flatnonzero(arr)
        if arr.size and arr.dtype.kind not in "iu":
            raise IndexingError(f"index arrays must hold integers or booleans, not {arr.dtype} (as numpy's)")
        arr = arr.astype(np.int64)
        if arr.size and (arr.max() >= size or arr.min() < -size):
            raise IndexingError(f"index out of bounds for dimension of size {size}")
        arr = np.where(arr < 0, arr + size, arr)
        frags = np.searchsorted(np.asarray(offsets), arr, side="right") - 1
        pieces = []
        for frag in np.unique(frags):
            positions = np.flatnonzero(frags == frag)
            local = arr[positions] - offsets[frag]
            lo = int(local.min())
            pieces.append(Piece(int(frag), slice(lo, int(local.max()) + 1, 1), positions, local - lo))
        return DimIndex(tuple(pieces), int(arr.size))
    if isinstance(index, (bool, np.bool_)):  # (numpy's boolean scalar adds a dimension; operator.index takes 1)
        raise IndexingError(f"the boolean index {index!r}: {REFUSED}")
    try:
        i = operator.index(index)
    except TypeError:
        raise IndexingError(f"unsupported index {index!r}") from None
    if not -size <= i < size:
        raise IndexingError(f"index {i} is out of bounds for dimension {dim} with size {size}")
    i %= size if size else 1
    frag = grid.fragment_at(dim, i)
    return DimIndex((Piece(frag, i - offsets[frag], None),), None)


def _is_array(index: Any) -> bool:
    return isinstance(index, (np.ndarray, list)) or (hasattr(index, "__array__") and np.ndim(index) > 0)


def split_key(grid: FragmentGrid, key: Any) -> list[DimIndex]:
    key = expand_key(key, grid.ndim)
    if sum(1 for k in key if _is_array(k)) > 1:
        raise IndexingError(f"{sum(1 for k in key if _is_array(k))} index arrays: {REFUSED}")
    return [split_dimension(grid, d, k) for d, k in enumerate(key)]


def array_axis_move(key: Any, ndim: int) -> tuple[int, int] | None:
    """numpy moves the array dimension to the front when an array index and
    integer indices are separated by a slice; returns ``(source, 0)`` then."""
    key = expand_key(key, ndim)
    advanced = [i for i, k in enumerate(key) if _is_array(k) or not isinstance(k, slice)]
    if not any(_is_array(k) for k in key) or advanced == list(range(advanced[0], advanced[-1] + 1)):
        return None
    array_at = next(i for i, k in enumerate(key) if _is_array(k))
    source = sum(1 for k in key[:array_at] if isinstance(k, slice))
    return (source, 0) if source else None


def output_shape(dims: Sequence[DimIndex]) -> tuple[int, ...]:
    return tuple(d.length for d in dims if d.length is not None)
