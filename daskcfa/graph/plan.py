"""Fragment planning for the writer: how to tile an array with fragment files.

Pure functions, no I/O. :func:`plan_fragments` either honours a fragment
shape given by the caller exactly, or derives one from a size limit with
S3netCDF4's balanced "time series versus map" rule, minus its known defects:
the limit here is in bytes (not elements), axes of size 1 are never split,
no fragment is ever empty, and a given fragment shape is used as is.

The size-driven rule keeps two read patterns cheap at once. A *time series*
at one point touches as many fragments as there are divisions of the time
axis; a *map* at one time touches as many as there are divisions of X times
divisions of Y. While the largest fragment is over the limit, the cheaper of
the two patterns gets one more division, so neither degrades much faster than
the other.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Mapping, Sequence

import numpy as np
from dask.utils import format_bytes, parse_bytes
from numpy.typing import DTypeLike

from ..choices import MAX_FRAGMENT_SIZE
from ..errors import ArgumentError
from ..model import FragmentGrid

__all__ = ["plan_fragments", "aligned_chunks", "merged_chunks", "subdivided_chunks", "describe", "classify_axes"]

_AXIS_CLASSES = ("T", "Z", "Y", "X", "N")


def plan_fragments(
    shape: Sequence[int],
    dtype: DTypeLike,
    dims: Sequence[str],
    *,
    fragment_shape: Sequence[int] | Mapping[str, int] | None = None,
    max_fragment_size: int | str = MAX_FRAGMENT_SIZE,
    axes: Mapping[str, str] | None = None,
) -> FragmentGrid:
    """Choose the fragment grid for writing an array of ``shape`` and ``dtype``.

    Parameters
    ----------
    shape, dtype, dims
        The array to write; ``dims`` names its dimensions (used for the dict
        form of ``fragment_shape`` and to classify axes).
    fragment_shape
        The fragment shape, honoured exactly: a size per dimension, or a
        mapping dimension name -> size in which a missing dimension means
        "the whole dimension". A size larger than its dimension is clipped to
        it; along each dimension the last fragment may be smaller. When given,
        ``max_fragment_size`` and ``axes`` are not used.
    max_fragment_size
        Upper bound on the bytes in one fragment (``dtype`` itemsize times
        elements): an int, or a string such as ``"50MB"`` (decimal) or
        ``"64MiB"`` (binary) as understood by :func:`dask.utils.parse_bytes`.
        It can only be exceeded when a single element is larger, in which
        case every fragment holds one element.
    axes
        Dimension name -> ``"T"``, ``"Z"``, ``"Y"``, ``"X"`` (or ``"N"``, none
        of these), e.g. from the ``axis`` attribute of coordinate variables;
        it overrides the guess from the name (see :func:`classify_axes`).
        Names that are not dimensions of this array are ignored, so one
        mapping can serve every variable of a dataset.

    Returns
    -------
    FragmentGrid
        Sizes per dimension summing to ``shape``. A dimension of length 0 has
        one fragment of size 0 (``(0,)``), so the grid still has one entry per
        dimension and describes the shape; a scalar gives ``FragmentGrid(())``.

    Notes
    -----
    The size-driven plan works on the fragment *length* ``L`` of each axis
    (all fragments but the last have length ``L``; the fragment count is
    ``ceil(n / L)``). "Adding a division" to an axis of size ``n`` moves ``L``
    to the next smaller length an even split ``ceil(n / d)`` can produce, so
    every step changes the grid and no fragment is ever empty (10 elements in
    6 divisions give five fragments of 2, not six with one empty). Axes:

    * the *time-series side* is the T axes; if there are none, the Z axes;
      if none either, the N axes. Its cost is the product of their counts.
    * the *map side* is the X and Y axes; if there are none, every axis not
      on the time-series side (the whole field at one time). Its cost is the
      product of their counts.
    * any remaining axes (Z or N beside a T axis, N beside a Z axis) are
      split only once neither side can be split any further, which keeps
      vertical profiles and ensemble members together as long as possible.

    While the largest fragment exceeds the limit, the side with the lower
    cost gets the division. **Tie rule:** equal costs split the time-series
    side, so the first split of any array is along time and whole maps are
    kept as long as possible (the familiar one-file-per-period layout).
    Within a side the axis with the fewest fragments is split; ties go to the
    axis with the longer fragments, then to the earlier dimension. If the
    chosen side cannot be split (every axis at length 1), the other side is,
    then the remaining axes. Planning stops when the largest fragment fits or
    every fragment is a single element.
    """
    shape = _validate_shape(shape)
    dims = tuple(dims)
    if len(dims) != len(shape):
        raise ArgumentError(f"got {len(dims)} dimension names {dims!r} for an array of shape {shape}")
    if len(set(dims)) != len(dims):
        raise ArgumentError(f"dimension names must be unique, got {dims!r}")
    if fragment_shape is not None:
        lengths = _validate_fragment_shape(fragment_shape, shape, dims)
    else:
        itemsize = np.dtype(dtype).itemsize
        if itemsize == 0:
            raise ArgumentError(
                f"dtype {np.dtype(dtype)!r} has no fixed item size, so a byte limit cannot be "
                "applied; pass fragment_shape instead"
            )
        limit = _parse_limit(max_fragment_size)
        lengths = _lengths_for_limit(shape, itemsize, limit, classify_axes(dims, axes))
    return FragmentGrid(tuple(_even_sizes(n, length) for n, length in zip(shape, lengths)))


def classify_axes(dims: Sequence[str], axes: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The class (``"T"``, ``"Z"``, ``"Y"``, ``"X"`` or ``"N"``) of every dimension.

    ``axes`` wins (case-insensitive); otherwise the lower-cased name decides,
    checked in this order: starts with ``t`` or contains ``time`` -> T;
    starts with ``z`` or contains ``lev`` (level, plev, lev, elevation),
    ``depth`` or ``height`` -> Z; starts with ``y``, ``lat`` or ``rlat`` -> Y;
    starts with ``x``, ``lon`` or ``rlon`` -> X; anything else -> N.
    """
    given = {}
    for dim, axis in (axes or {}).items():
        code = str(axis).upper()
        if code not in _AXIS_CLASSES:
            raise ArgumentError(f"axis for dimension {dim!r} must be one of T, Z, Y, X, N, got {axis!r}")
        given[dim] = code
    return tuple(given[d] if d in given else _axis_from_name(d) for d in dims)


def aligned_chunks(grid: FragmentGrid, chunks: tuple[tuple[int, ...], ...]) -> bool:
    """Whether dask ``chunks`` let every fragment be written from whole chunks.

    True when, along every dimension, each fragment boundary is also a chunk
    boundary (the chunk boundaries are a superset of the fragment ones). Then
    every chunk lies inside one fragment and a fragment is exactly the union
    of some chunks, so the writer needs no rechunking; chunks may be smaller
    than fragments. Raises ``ValueError`` if ``chunks`` describe a different
    shape, which is a caller bug rather than a misalignment.
    """
    chunks = tuple(tuple(int(c) for c in row) for row in chunks)
    chunk_shape = tuple(sum(row) for row in chunks)
    if chunk_shape != grid.shape:
        raise ArgumentError(f"chunks describe shape {chunk_shape}, the fragment grid shape {grid.shape}")
    for row, fragment_offsets in zip(chunks, grid.offsets):
        chunk_offsets = set(itertools.accumulate(row, initial=0))
        if not chunk_offsets.issuperset(fragment_offsets):
            return False
    return True


def describe(grid: FragmentGrid, dtype: DTypeLike) -> str:
    """One line for logs: how many fragments, the grid, fragment shape and bytes.

    A dimension whose fragments differ in size (a smaller last fragment) is
    shown as ``<=L``, and the bytes are then those of the largest fragment.
    """
    dtype = np.dtype(dtype)
    count = grid.nfragments
    noun = "fragment" if count == 1 else "fragments"
    if grid.ndim == 0:
        return f"1 fragment (scalar {dtype}, {format_bytes(dtype.itemsize)})"
    largest = [max(row) for row in grid.sizes]
    ragged = any(len(set(row)) > 1 for row in grid.sizes)
    frag = " x ".join(
        f"{big}" if len(set(row)) == 1 else f"<={big}" for big, row in zip(largest, grid.sizes)
    )
    nbytes = format_bytes(math.prod(largest) * dtype.itemsize)
    each = f"at most {nbytes}" if ragged else f"{nbytes} each"
    layout = " x ".join(str(n) for n in grid.grid_shape)
    return f"{count} {noun} in a {layout} grid, of {frag} {dtype} ({each})"


def _axis_from_name(name: str) -> str:
    low = name.lower()
    if low.startswith("t") or "time" in low:
        return "T"
    if low.startswith("z") or any(word in low for word in ("lev", "depth", "height")):
        return "Z"
    if low.startswith(("y", "lat", "rlat")):
        return "Y"
    if low.startswith(("x", "lon", "rlon")):
        return "X"
    return "N"


def _as_int(value: object, what: str) -> int:
    """``value`` as a Python int; bools and non-integers are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentError(f"{what} must be an integer, got {value!r}") from None


def _validate_shape(shape: Sequence[int]) -> tuple[int, ...]:
    out = tuple(_as_int(n, "every entry of shape") for n in shape)
    if any(n < 0 for n in out):
        raise ArgumentError(f"shape must not have negative sizes, got {out}")
    return out


def _validate_fragment_shape(
    fragment_shape: Sequence[int] | Mapping[str, int], shape: tuple[int, ...], dims: tuple[str, ...]
) -> tuple[int, ...]:
    """Fragment lengths per dimension from the caller's fragment shape, clipped to the shape."""
    if isinstance(fragment_shape, Mapping):
        unknown = sorted(set(fragment_shape) - set(dims), key=str)
        if unknown:
            raise ArgumentError(f"fragment_shape names unknown dimensions {unknown}; dimensions are {dims!r}")
        requested = tuple(fragment_shape.get(d, max(n, 1)) for d, n in zip(dims, shape))
    else:
        if isinstance(fragment_shape, (str, bytes)):
            raise ArgumentError(f"fragment_shape must be a sequence of ints or a mapping, got {fragment_shape!r}")
        requested = tuple(fragment_shape)
        if len(requested) != len(shape):
            raise ArgumentError(
                f"fragment_shape {requested} has {len(requested)} entries, the array has {len(shape)} "
                f"dimensions {dims!r}"
            )
    lengths = []
    for dim, n, size in zip(dims, shape, requested):
        size = _as_int(size, f"fragment size along {dim!r}")
        if size < 1:
            raise ArgumentError(f"fragment size along {dim!r} must be positive, got {size}")
        lengths.append(min(size, n))
    return tuple(lengths)


def _parse_limit(max_fragment_size: int | str) -> int:
    if isinstance(max_fragment_size, str):
        try:
            limit = parse_bytes(max_fragment_size)
        except ValueError as exc:
            raise ArgumentError(f"cannot read max_fragment_size {max_fragment_size!r} as bytes: {exc}") from None
    else:
        limit = _as_int(max_fragment_size, "max_fragment_size")
    if limit < 1:
        raise ArgumentError(f"max_fragment_size must be at least 1 byte, got {max_fragment_size!r}")
    return limit


def _even_sizes(n: int, length: int) -> tuple[int, ...]:
    """Fragment sizes along a dimension of ``n``: all ``length`` but a smaller last one."""
    if n == 0:
        return (0,)
    full, rest = divmod(n, length)
    return (length,) * full + ((rest,) if rest else ())


def _fit(n: int, most: int) -> int:
    """The largest fragment length not above ``most`` that an even split of ``n`` gives.

    Even splits give the lengths ``ceil(n / d)``; the smallest ``d`` reaching
    ``most`` is ``ceil(n / most)``.
    """
    return -(-n // -(-n // most))


def _lengths_for_limit(shape: tuple[int, ...], itemsize: int, limit: int, classes: tuple[str, ...]) -> list[int]:
    """The balanced time-series-versus-map plan (see :func:`plan_fragments`)."""
    lengths = list(shape)  # one fragment per axis; 0 only for an empty dimension
    ndim = len(shape)
    series: list[int] = []
    for wanted in "TZN":
        series = [a for a in range(ndim) if classes[a] == wanted]
        if series:
            break
    maps = [a for a in range(ndim) if classes[a] in "XY"] or [a for a in range(ndim) if a not in series]
    rest = [a for a in range(ndim) if a not in series and a not in maps]

    def count(axis: int) -> int:
        return -(-shape[axis] // lengths[axis])

    while math.prod(lengths) * itemsize > limit:
        splittable = [a for a in range(ndim) if lengths[a] > 1]
        if not splittable:
            break  # one element per fragment: a single element exceeds the limit
        if len(splittable) == 1:
            # Every further step would split this axis, so jump to where it fits.
            (axis,) = splittable
            others = math.prod(lengths[a] for a in range(ndim) if a != axis) * itemsize
            lengths[axis] = _fit(shape[axis], max(limit // others, 1))
            break
        series_cost = math.prod(count(a) for a in series)
        map_cost = math.prod(count(a) for a in maps)
        order = (series, maps, rest) if series_cost <= map_cost else (maps, series, rest)
        for side in order:
            candidates = [a for a in side if lengths[a] > 1]
            if candidates:
                axis = min(candidates, key=lambda a: (count(a), -lengths[a], a))
                lengths[axis] = _fit(shape[axis], lengths[axis] - 1)
                break
    return lengths


def merged_chunks(grid: FragmentGrid, itemsize: int, limit: int) -> tuple[tuple[int, ...], ...]:
    """Chunks made of whole neighbouring fragments, each at most ``limit`` bytes
    (a single fragment larger than the limit stays one chunk)."""
    factors = [1] * grid.ndim

    def grouped(sizes: tuple[int, ...], k: int) -> tuple[int, ...]:
        return tuple(sum(sizes[i : i + k]) for i in range(0, len(sizes), k))

    def largest(fs: list[int]) -> int:
        return itemsize * int(np.prod([max(grouped(s, k)) if s else 0 for s, k in zip(grid.sizes, fs)]))

    grew = True
    while grew:
        grew = False
        for d, sizes in enumerate(grid.sizes):
            if factors[d] >= len(sizes):
                continue
            trial = factors.copy()
            trial[d] = min(len(sizes), factors[d] * 2)
            if largest(trial) <= limit:
                factors, grew = trial, True
    return tuple(grouped(s, k) for s, k in zip(grid.sizes, factors))


def subdivided_chunks(grid: FragmentGrid, lengths: Sequence[Sequence[int | None]], max_chunks: int
                      ) -> tuple[tuple[int, ...], ...]:
    """Fragment rows cut into pieces of the chunk length of the fragments they hold (``lengths[d][i]``
    for the fragments of slab ``i`` along dimension ``d``; None: kept whole): chunks aligned to the
    fragments' own chunk grids. Where that makes more than ``max_chunks`` chunks, pieces are whole
    multiples of the chunk length (doubled along the dimension cut finest, until they fit or every
    fragment is whole again)."""
    factors = [1] * grid.ndim

    def length(row_length: int | None, k: int) -> int | None:
        return None if row_length is None else row_length * k

    def counts() -> list[int]:  # (counted, not cut: a set's 1-element chunks of 10**12 would not fit in memory)
        return [sum(_count(size, length(n, k)) for size, n in zip(sizes, row))
                for sizes, row, k in zip(grid.sizes, lengths, factors)]

    pieces = counts()
    while math.prod(pieces) > max_chunks:
        finer = [d for d, n in enumerate(pieces) if n > len(grid.sizes[d])]
        if not finer:
            return grid.sizes
        factors[max(finer, key=lambda d: pieces[d])] *= 2
        pieces = counts()
    return tuple(tuple(piece for size, n in zip(sizes, row) for piece in _pieces(size, length(n, k)))
                 for sizes, row, k in zip(grid.sizes, lengths, factors))


def _count(size: int, length: int | None) -> int:
    """How many pieces :func:`_pieces` cuts ``size`` into."""
    return 1 if length is None or length >= size else -(-size // length)


def _pieces(size: int, length: int | None) -> tuple[int, ...]:
    """``size`` cut into pieces of ``length`` (the last one shorter), or whole."""
    if length is None or length >= size:
        return (size,)
    return (length,) * (size // length) + ((size % length,) if size % length else ())
