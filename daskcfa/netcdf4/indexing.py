"""netCDF4-python's index rules for assignments: orthogonal selections (an integer or boolean sequence
selects along its own dimension), positions past an unlimited dimension's end growing it, and the
values conformed to the selection (broadcast, netCDF4-python's leniency about size-1 dimensions).

Kept apart from :mod:`daskcfa.graph.indexing`, which splits numpy's (not netCDF4-python's) rules
across a fragment grid for reads.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..dataset import integer_index
from ..errors import ArgumentError
from ..lazy import dask_array as da

__all__ = ["as_numpy", "conform", "orthogonal_index", "selection", "storable", "take"]


def _run(at: np.ndarray) -> slice | np.ndarray:
    """Positions as a slice when they are consecutive (numpy's basic indexing: no copy of an index)."""
    if len(at) and at[-1] - at[0] == len(at) - 1 and (len(at) == 1 or (np.diff(at) == 1).all()):
        return slice(int(at[0]), int(at[-1]) + 1)
    return at


def orthogonal_index(positions: tuple[np.ndarray, ...]) -> tuple:
    """An index selecting ``positions`` along each dimension orthogonally (netCDF4-python's rule)."""
    runs = tuple(_run(at) for at in positions)
    return runs if sum(not isinstance(r, slice) for r in runs) <= 1 else np.ix_(*positions)


def take(values: Any, positions: tuple[np.ndarray, ...]) -> Any:
    """``values`` at ``positions`` along each dimension (orthogonally), numpy or dask: runs of consecutive
    positions as slices, taken one dimension at a time (dask takes one index array per step)."""
    for d, at in enumerate(positions):
        where = _run(at)
        if not (isinstance(where, slice) and where == slice(0, values.shape[d])):
            values = values[(slice(None),) * d + (where,)]
    return values


def storable(values: Any, dtype: np.dtype, path: str) -> Any:
    """Values for an (unpacked) integer variable: NaN is missing, and what ``dtype`` cannot hold is refused
    (numpy's cast would wrap it, as netCDF4-python lets it: 300 into int8 is 44). Dask values are checked
    as they are computed, one fragment at a time."""
    if dtype.kind not in "iu" or isinstance(values, da.Array):
        return values
    values = np.ma.asarray(values) if np.ma.isMaskedArray(values) else np.asarray(values)
    if values.size == 0 or values.dtype.kind not in "iuf" or np.can_cast(values.dtype, dtype):
        return values
    data, mask = np.ma.getdata(values), np.ma.getmaskarray(values)
    if data.dtype.kind == "f":
        nan = np.isnan(data)
        if nan.any():
            mask, data = mask | nan, np.where(nan, 0, data)
            values = np.ma.MaskedArray(data, mask=mask)
        data = np.trunc(data)  # (netCDF4-python's cast truncates: 2.7 is 2)
    held = data[~mask]
    info = np.iinfo(dtype)
    if held.size and (held.min() < info.min or held.max() > info.max):
        raise ArgumentError(f"values from {held.min()} to {held.max()} are outside the range of {dtype}, which "
                            "would wrap them (mask them, or choose a wider type)", variable=path)
    return values


def as_numpy(values: Any) -> np.ndarray:
    if isinstance(values, da.Array):
        values = values.compute()
    return np.ma.asarray(values) if np.ma.isMaskedArray(values) else np.asarray(values)


def conform(values: Any, target: tuple[int, ...], full: tuple[int, ...], path: str) -> Any:
    """``values`` shaped as the selection (with its integer-indexed dimensions kept, size 1), netCDF4-python's
    leniency included: values with the selection's size but extra or missing size-1 dimensions."""
    if not isinstance(values, da.Array):
        values = np.ma.asarray(values) if np.ma.isMaskedArray(values) else np.asarray(values)
    shape = values.shape
    try:
        if shape != target and int(np.prod(shape)) == int(np.prod(target)) and \
                [n for n in shape if n != 1] == [n for n in target if n != 1]:
            values = values.reshape(target)
        elif shape != target:
            values = (da.broadcast_to if isinstance(values, da.Array) else _broadcast)(values, target)
    except ValueError:
        raise ArgumentError(f"{path}: cannot assign values of shape {shape} to a selection of shape {target}") from None
    return values.reshape(full)


def _broadcast(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if np.ma.isMaskedArray(values):
        return np.ma.MaskedArray(np.broadcast_to(values.data, shape), mask=np.broadcast_to(np.ma.getmaskarray(values),
                                                                                            shape))
    return np.broadcast_to(values, shape)


def selection(key: Any, shape: tuple[int, ...], unlimited: Sequence[bool], value_shape: tuple[int, ...] | None
               ) -> tuple[list[np.ndarray], list[int], set[int]]:
    """netCDF4-python's index rules: the positions selected along each dimension, each dimension's
    size after the assignment (unlimited ones grow), and the dimensions indexed by an integer."""
    key = key if isinstance(key, tuple) else (key,)
    if not shape and len(key) == 1:
        key = ()  # (a scalar variable takes any one index, as in netCDF4-python: v[:] = 5)
    if sum(k is Ellipsis for k in key) > 1:
        raise ArgumentError("an index can only have a single ellipsis ('...')")
    if Ellipsis in [k for k in key if not isinstance(k, np.ndarray)]:
        at = next(i for i, k in enumerate(key) if k is Ellipsis and not isinstance(k, np.ndarray))
        key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1:]
    if len(key) > len(shape):
        raise ArgumentError(f"too many indices ({len(key)}) for {len(shape)} dimensions")
    key = key + (slice(None),) * (len(shape) - len(key))
    selection, grown, drop = [], [], set()
    vdims = list(value_shape) if value_shape is not None else []
    kept = [i for i, k in enumerate(key) if not integer_index(k)]
    for d, (k, n, grows) in enumerate(zip(key, shape, unlimited)):
        if integer_index(k):
            i = int(k)
            if i < 0:
                i += n
            if i < 0 or (i >= n and not grows):
                raise ArgumentError(f"index {int(k)} is out of bounds for a dimension of size {n}")
            positions = np.array([i])
            drop.add(d)
        elif isinstance(k, slice):
            stop = k.stop
            if grows and stop is None and (k.step or 1) > 0 and value_shape is not None and len(vdims) == len(kept):
                start = 0 if k.start is None else (k.start + n if k.start < 0 else k.start)
                stop = max(n, start + vdims[kept.index(d)] * (k.step or 1) - ((k.step or 1) - 1))
            limit = max(n, stop) if grows and stop is not None and stop >= 0 else n
            positions = np.arange(*slice(k.start, stop, k.step).indices(limit))
        else:
            array = np.asarray(k)
            if array.dtype == bool:
                if array.ndim != 1 or (len(array) != n and not grows):
                    raise ArgumentError(f"a boolean index must be 1-D and as long as its dimension ({n})")
                positions = np.flatnonzero(array)
            elif array.dtype.kind in "iu" and array.ndim <= 1:
                positions = np.where(array < 0, array + n, array).astype(np.int64).reshape(-1)
                if (positions < 0).any() or (not grows and (positions >= n).any()):
                    raise ArgumentError(f"an index in {k!r} is out of bounds for a dimension of size {n}")
            else:
                raise ArgumentError(f"unsupported index {k!r}: integers, slices, 1-D integer or boolean sequences, "
                                    "and '...' (as netCDF4-python)")
        selection.append(positions)
        grown.append(max(n, int(positions.max()) + 1) if len(positions) else n)
    return selection, grown, drop

