"""The chunk type of masked reads: a numpy masked array that dask reduces cheaply.

dask reduces masked chunks with numpy.ma, which makes more passes over the data
than the result needs: it counts the elements (for ``mean``, ``var``, ``std``)
by summing an array of ones as large as the chunk, fills masked points by a
copy then a masked copy (every sum, ``max``, ``min``), ors an operand's mask
with a mask of False made for the other (``x - x.mean()``), and raises to a
power (``var``, ``std``) through an extra ``where`` copy and arrays flagging
non-finite results made even when all are finite (measured: a float32 ``std``
over masked chunks took 1.7x as long as over plain arrays, 2.4x with missing
values). Chunks read with masking are :class:`MaskedChunk`, a masked array in
every respect, that does these the same way in fewer passes. Every value (masked
points' too), mask, fill value and type is numpy.ma's, as netCDF4-python gives.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import numpy as np
from dask.array.dispatch import concatenate_lookup, numel_lookup

__all__ = ["MaskedChunk", "plain_masked"]


class MaskedChunk(np.ma.MaskedArray):
    """A masked array that dask counts, fills, subtracts and squares cheaply (see the module's docstring).

    Never handed to users: what dask returns from ``compute()`` is a lone chunk's
    :meth:`copy` or the chunks joined by :func:`_joined`, both numpy's own masked
    array, and a pickled chunk loads as one (without daskcfa)."""

    def copy(self, order: str = "C") -> np.ma.MaskedArray:
        """numpy's own masked array (dask's result of a one-chunk array is its chunk's copy)."""
        return super().copy(order).view(np.ma.MaskedArray)

    def __reduce__(self) -> Any:
        return self.view(np.ma.MaskedArray).__reduce__()

    def filled(self, fill_value: Any = None) -> np.ndarray:
        """numpy.ma's ``filled``, in one pass (``np.where``; bitwise for zero) for a C-contiguous array of numbers."""
        data, mask = self._data, self._mask
        if (mask is np.ma.nomask or data.dtype.kind not in "biuf" or mask.shape != data.shape
                or not (data.flags.c_contiguous and mask.flags.c_contiguous)
                or not (fill_value is None or isinstance(fill_value, (int, float, np.number)))):
            return super().filled(fill_value)
        try:  # (numpy.ma's conversion of the fill value; it raises its own error for one that fails)
            fill = self.fill_value if fill_value is None else np.asarray(fill_value, dtype=data.dtype)
        except (OverflowError, ValueError):
            return super().filled(fill_value)
        if np.asarray(fill).dtype != data.dtype or not data.dtype.isnative:
            # (numpy.ma's default, 999999 or 1e20, is wider than the chunk: numpy.ma casts it, where
            # ``np.where`` would widen the result; and keeps a non-native byte order)
            return super().filled(fill_value)
        if not mask.any():
            return data
        if data.dtype.kind in "iuf" and np.asarray(fill, data.dtype).tobytes() == bytes(data.dtype.itemsize):
            return _kept_bits(data, mask)  # zero (every sum)
        return np.where(mask, fill, data)

    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None, **kwargs: Any) -> Any:
        """numpy.ma's ``sum``; over every axis of a float32 chunk summed as float64 (``mean(dtype="f8")``),
        without numpy.ma's filled copy of the chunk (:func:`_cast_sum`)."""
        # (keepdims a bool only: numpy's own "no value" marker, or one numpy refuses, goes to numpy.ma)
        total = _cast_sum(self, dtype) if out is None and set(kwargs) <= {"keepdims"} and isinstance(
            kwargs.get("keepdims", False), (bool, np.bool_)) and _every_axis(axis, self.ndim) else None
        if total is None:
            return super().sum(axis=axis, dtype=dtype, out=out, **kwargs)
        none_kept = bool(self._mask.all())  # (numpy.ma: the sum of nothing kept is masked)
        if not kwargs.get("keepdims", False):
            return np.ma.masked if none_kept else total
        result = np.full((1,) * self.ndim, total, dtype=total.dtype).view(type(self))
        result.__setmask__(np.full(result.shape, none_kept))
        return result

    def __add__(self, other: Any) -> Any:
        return NotImplemented if self._delegate_binop(other) else _arithmetic(np.add, self, other)

    def __radd__(self, other: Any) -> Any:
        return _arithmetic(np.add, other, self)

    def __sub__(self, other: Any) -> Any:
        return NotImplemented if self._delegate_binop(other) else _arithmetic(np.subtract, self, other)

    def __rsub__(self, other: Any) -> Any:
        return _arithmetic(np.subtract, other, self)

    def __mul__(self, other: Any) -> Any:
        return NotImplemented if self._delegate_binop(other) else _arithmetic(np.multiply, self, other)

    def __rmul__(self, other: Any) -> Any:
        return _arithmetic(np.multiply, other, self)

    def __pow__(self, other: Any) -> Any:
        return NotImplemented if self._delegate_binop(other) else _power(self, other)


def _kept_bits(data: np.ndarray, mask: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``data`` where ``mask`` is False, +0 where True (numpy.ma's ``filled(0)``, bit for bit): the bits
    of the values kept, and-ed with all ones, else none -- no branch per point, where ``np.where`` slows
    down on scattered masks (3-8x measured). ``out``: an array of ``data``'s size to write into."""
    unsigned = np.dtype(f"u{data.dtype.itemsize}")
    # (an array given as ``out`` always: a 0-d one's subtraction would otherwise be a scalar)
    into = np.empty(data.shape, unsigned) if out is None else out.view(unsigned)
    kept = np.subtract(mask.view(np.uint8), np.uint8(1), dtype=unsigned, out=into)
    return np.bitwise_and(data.view(unsigned), kept, out=kept).view(data.dtype)


def _every_axis(axis: Any, ndim: int) -> bool:
    """Whether ``axis`` (None, an integer or a tuple of them) names every axis of an array of ``ndim``,
    each once (False for anything numpy refuses -- an axis out of range or named twice, a list, an array
    of several, a float, a string or a bool -- which numpy then refuses with its own error)."""
    if axis is None:
        return True
    named = axis if isinstance(axis, tuple) else (axis,)
    if any(isinstance(a, (bool, np.bool_)) for a in named):
        return False
    try:
        named = [operator.index(a) for a in named]
    except TypeError:
        return False
    return all(-ndim <= a < ndim for a in named) and sorted(a % ndim for a in named) == list(range(ndim))


#: Buffers of numpy's size that :func:`_by_buffer` casts, zeroes and sums at once (in a core's cache)
_BUFFERS_AT_ONCE = 16


def _cast_sum(chunk: MaskedChunk, dtype: Any) -> Any:
    """numpy.ma's sum over every axis of a float32 ``chunk`` as float64 (``mean(dtype="f8")``), to the
    bit, without the chunk-sized filled copy (a fresh array whose pages the kernel zeroes: 12 ms of a
    10 MB chunk's mean, measured), or None when it does not apply. (Other types keep numpy.ma's sum:
    ``std``'s float64 squares summed as float32 gained nothing measurable so.)

    numpy sums with a cast through buffers of ``np.getbufsize()`` values: each buffer cast, its pairwise
    sum added to the total in turn, from zero. :func:`_by_buffer` does the same, a few buffers at a time;
    it is used only where numpy is seen to sum so (:func:`_sums_by_buffer`) and the total is finite
    (otherwise numpy.ma sums, with its own warnings)."""
    data, mask = chunk._data, chunk._mask
    if (mask is np.ma.nomask or dtype is None or data.dtype != np.float32 or mask.shape != data.shape
            or not (data.flags.c_contiguous and mask.flags.c_contiguous)):
        return None
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    size = np.getbufsize()
    if dtype != np.float64 or data.size < size or not _sums_by_buffer(size):
        return None
    total = _by_buffer(data.reshape(-1), mask.reshape(-1), dtype, size)
    return total if np.isfinite(total) else None


def _by_buffer(flat: np.ndarray, mask: np.ndarray, dtype: np.dtype, size: int) -> Any:
    """The sum of ``flat``'s values not masked, as numpy sums it with a cast (:func:`_cast_sum`)."""
    step = size * _BUFFERS_AT_ONCE
    cast = np.empty(min(step, flat.size), dtype)
    lanes = np.empty(cast.size, flat.dtype)  # (zeroed before the cast, in the narrower type: a zero casts to a zero)
    total = dtype.type(0)
    with np.errstate(all="ignore"):  # (a total not finite is not used)
        for start in range(0, flat.size, step):
            stop = min(start + step, flat.size)
            block = cast[:stop - start]
            np.copyto(block, _kept_bits(flat[start:stop], mask[start:stop], out=lanes[:block.size]), casting="unsafe")
            whole = block.size - block.size % size
            for part in np.add.reduce(block[:whole].reshape(-1, size), axis=1):
                total = total + part
            if whole < block.size:
                total = total + np.add.reduce(block[whole:])
    return total


@functools.lru_cache(maxsize=4)
def _sums_by_buffer(size: int) -> bool:
    """Whether this numpy sums float32 values as float64 buffer by buffer as :func:`_by_buffer` does, seen
    on four sets of values of magnitudes from 1e-6 to 1e6 (checked once a process): in float64 a sum of
    float32 values rounds only across such magnitudes, and there buffers of another size (1024 to 16384
    values tried) or one pairwise sum of the whole change the total's last bits in at least one set."""
    shape = (3, 5, (3 * size + 189) // 15)
    mask = (np.arange(int(np.prod(shape))) % 5 == 0).reshape(shape)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        values = (rng.standard_normal(shape) * 10 ** rng.uniform(-6, 6, shape)).astype(np.float32)
        expected = np.ma.MaskedArray(values, mask=mask).filled(0).sum(dtype=np.float64)
        got = _by_buffer(values.reshape(-1), mask.reshape(-1), np.dtype(np.float64), size)
        if got.tobytes() != expected.tobytes():
            return False
    return True


#: numpy.ma's own operation for each ufunc :func:`_arithmetic` computes
_MASKED_OPS = {np.add: np.ma.add, np.subtract: np.ma.subtract, np.multiply: np.ma.multiply}


def _arithmetic(ufunc: np.ufunc, a: Any, b: Any) -> Any:
    """numpy.ma's ``ufunc(a, b)`` for add, subtract, multiply (masked where an operand is; masked
    points keep ``a``'s values), with an operand's mask broadcast rather than or-ed with a mask of
    False made for the other, when the other has none or masks nothing (a mean, for one)."""
    if (np.ndim(a) == 0 and np.ndim(b) == 0) or any(
            isinstance(v, np.ma.MaskedArray) and type(v) not in (MaskedChunk, np.ma.MaskedArray) for v in (a, b)):
        return _MASKED_OPS[ufunc](a, b)
    da, db = np.ma.getdata(a), np.ma.getdata(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        result = ufunc(da, db)
    given = [m for m in (np.ma.getmask(a), np.ma.getmask(b)) if m is not np.ma.nomask]
    masking = [m for m in given if m.any()]
    if len(masking) == 2:
        mask = np.logical_or(*masking)
    elif masking:
        mask = np.broadcast_to(masking[0], result.shape).copy()
    else:
        mask = np.zeros(result.shape, bool) if given else np.ma.nomask
    if masking:
        try:  # (as numpy.ma: values it cannot cast are left as computed)
            np.copyto(result, da, casting="unsafe", where=mask)
        except Exception:  # noqa: BLE001
            pass
    out = result.view(MaskedChunk)
    out._mask = mask
    out._update_from(a if isinstance(a, np.ma.MaskedArray) else b)
    return out


def _power(a: MaskedChunk, b: Any) -> Any:
    """numpy.ma's ``power(a, b)`` (results that are not finite masked and filled) without its
    ``where`` copy, and with no mask of non-finite results made when all are finite."""
    m = np.ma.mask_or(np.ma.getmask(a), np.ma.getmask(b))
    fa, fb = np.ma.getdata(a), np.ma.getdata(b)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        raised = _squared(fa, fb)
        if raised is None:
            raised = np.power(fa, fb)
    if np.ndim(raised) == 0 or np.result_type(fa, raised) != raised.dtype:
        return np.ma.power(a, b)
    if m is not np.ma.nomask:  # (numpy.ma keeps masked points' values: where(m, fa, ...))
        np.copyto(raised, fa, casting="unsafe", where=m)
    result = raised.view(type(a))
    result._update_from(a)
    # (a finite sum means every value is finite: one pass, no array of flags made; a sum that
    # overflows is no result, so it warns of nothing)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(raised, axis=None)
    invalid = None if np.isfinite(total) else ~np.isfinite(raised)
    if m is not np.ma.nomask:
        result._mask = np.broadcast_to(m, raised.shape).copy() if invalid is None else np.logical_or(m, invalid)
    if invalid is not None and invalid.any():
        if result._mask is np.ma.nomask:
            result._mask = invalid
        result._data[invalid] = result.fill_value
    return result


def _squared(fa: np.ndarray, fb: Any) -> np.ndarray | None:
    """``np.power(fa, fb)`` for an exponent of 2 and a float64 result (dask's deviations in ``var``
    and ``std``), as the product ``fa * fa`` in float64 (None otherwise): the correctly rounded
    square, which is what the ``pow`` loop returns too (bitwise, tested on millions of values), at
    several times its speed. Other types keep the ``pow`` loop, as numpy.ma computes them."""
    if np.ndim(fb) != 0 or np.asarray(fb).dtype.kind not in "iuf" or fb != 2:
        return None
    result = np.result_type(fa, fb)
    if result != np.float64 or fa.dtype.kind != "f":
        return None
    return np.multiply(fa, fa, dtype=result)


def plain_masked(values: Any) -> Any:
    """``values`` with a :class:`MaskedChunk` shown as numpy's own masked array (the same data and
    mask), for results handed to users as netCDF4-python hands them; anything else unchanged."""
    return values.view(np.ma.MaskedArray) if isinstance(values, MaskedChunk) else values


@concatenate_lookup.register(MaskedChunk)
def _joined(arrays: Any, axis: int = 0) -> np.ma.MaskedArray:
    """Chunks joined as dask joins masked arrays, as numpy's own masked array (a computed result;
    chunks joined inside a graph, by a rechunk, then reduce at numpy.ma's pace)."""
    if isinstance(arrays, (list, tuple)) and len(arrays) == 1 and _plain_lone(arrays[0]):
        return _lone_joined(arrays[0], axis)
    return plain_masked(concatenate_lookup.dispatch(np.ma.MaskedArray)(arrays, axis=axis))


def _plain_lone(chunk: Any) -> bool:
    """Whether ``chunk`` is a :class:`MaskedChunk` of numbers masking nothing, with a scalar fill value or
    none (:func:`_lone_joined` joins it; dask refuses to join an array of fill values)."""
    return (type(chunk) is MaskedChunk and chunk._mask is np.ma.nomask and chunk.dtype.kind in "biuf"
            and np.ndim(chunk._fill_value) == 0)


def _lone_joined(chunk: MaskedChunk, axis: int) -> np.ma.MaskedArray:
    """What dask's join of masked arrays gives for one chunk of numbers masking nothing (a copy of its
    values, no mask, the chunk's fill value, as numpy's masked array), without numpy.ma's generic join
    and the sort dask's join makes of the fill values: every chunk's partial sum of a mean is joined so."""
    joined = np.concatenate([chunk._data], axis=axis).view(np.ma.MaskedArray)
    joined.fill_value = chunk.fill_value  # (read as dask's join reads it: the chunk keeps the default it is given)
    return joined


@numel_lookup.register(MaskedChunk)
def _count(x: MaskedChunk, **kwargs: Any) -> Any:
    """How many elements of ``x`` are not masked (dask's ``numel`` for masked arrays: numpy.ma's
    sum of ones where not masked, here summed from the mask)."""
    # (counted in float64 unless told otherwise, as dask counts plain arrays: exact up to 2**53)
    kwargs.setdefault("dtype", np.float64)
    mask = np.ma.getmask(x)
    if mask is np.ma.nomask:
        return numel_lookup(np.ma.getdata(x), **kwargs)
    axis = kwargs.get("axis")
    if _every_axis(axis, mask.ndim):
        # (every axis: the masked points counted, not the others summed as numbers)
        count = np.asarray(mask.size - np.count_nonzero(mask), dtype=kwargs["dtype"])
        if not kwargs.get("keepdims", False):
            return count[()] if count else np.ma.masked
        shape = (1,) * mask.ndim
        return np.ma.MaskedArray(np.full(shape, count), mask=np.full(shape, not count))
    counts = np.logical_not(mask).sum(**kwargs)
    none_present = mask.all(axis=kwargs.get("axis"), keepdims=kwargs.get("keepdims", False))
    if np.ndim(counts):
        return np.ma.MaskedArray(counts, mask=none_present)
    return np.ma.masked if none_present else counts
