"""Read part of one fragment and bring it into canonical form.

Canonical form is what the aggregation promises for every fragment: the
aggregated dimension order, missing size-1 dimensions restored, the
fragment's own missing values and packing applied, units converted to the
aggregation's units and values cast to the aggregated dtype. The result is a
masked array of the aggregated (stored) dtype; the aggregation variable's own
masking and packing are applied later, once, by the caller.
"""

from __future__ import annotations

import itertools
import warnings
import zlib
from dataclasses import dataclass
from typing import Any

import cf_units
import numpy as np

from ..decode import Encoding
from ..errors import (CFAError, CFAFormatError, CFAWarning, FragmentError, FragmentReadError, FragmentShapeError,
                      MissingFragmentError, NotFoundError, UnitsError, redact)
from ..model import FragmentRef
from .. import storage
from ..storage.lease import generation_of
from ..storage.policy import LocationPolicy
from .files import open_fragment

__all__ = ["Target", "read_fragment"]

#: What HDF5, netCDF-C, h5py and the decompressors raise on a damaged file.
_LIBRARY_ERRORS = (OSError, ValueError, OverflowError, RuntimeError, IndexError, KeyError, EOFError, MemoryError,
                   zlib.error)


@dataclass(frozen=True)
class Target:
    """What the aggregation expects of every fragment of one variable."""

    variable: str
    source: str
    dims: tuple[str, ...]
    dtype: np.dtype
    units: str | None = None
    calendar: str | None = None
    #: opaque reference to the storage options (never the credentials themselves)
    profile: storage.ProfileRef = storage.NO_PROFILE
    #: which locations the aggregation file may make us open
    policy: LocationPolicy | None = None
    #: "raise" a fragment's error, or "fill": read an absent or unreadable fragment as missing data
    missing: str = "raise"
    #: the aggregation variable's masking, when the caller applies it (with
    #: netCDF4's rules) to the assembled values: a fragment stored with the
    #: same dtype and masking and no packing is then passed on as stored, and
    #: its values are compared with the fill value once rather than twice
    masked_as: Encoding | None = None

    @property
    def default_identifier(self) -> str:
        return self.variable.rsplit("/", 1)[-1]


def _selection_shape(key: tuple) -> tuple[int, ...]:
    return tuple(len(range(k.start, k.stop, k.step)) for k in key if isinstance(k, slice))


def read_fragment(ref: FragmentRef, key: tuple, target: Target) -> np.ma.MaskedArray:
    """Values of fragment ``ref`` at ``key`` (normalised: non-negative ints and
    slices with explicit start/stop/positive step, one per aggregated dim).

    With ``target.missing == "fill"`` a fragment that is absent or unreadable
    (its file missing, not netCDF, corrupt, of the wrong shape or type) reads
    as missing data, with a :class:`CFAWarning` naming it. Storage failures
    (an unreachable server, refused credentials), units that cannot be
    converted and the safe-URI policy still raise: they are not facts about
    the fragment, and filling them in would hide an outage or a breach.
    """
    try:
        return _read_fragment(ref, key, target)
    except FragmentError as exc:
        if target.missing != "fill" or isinstance(exc, UnitsError):
            raise
        warnings.warn(f"reading fragment {ref.index} as missing data: {exc}", CFAWarning, stacklevel=2)
        return np.ma.masked_all(_selection_shape(key), dtype=target.dtype)


def _read_fragment(ref: FragmentRef, key: tuple, target: Target) -> np.ma.MaskedArray:
    where = {"file": target.source, "variable": target.variable, "fragment": ref.index}
    shape = _selection_shape(key)
    if ref.is_missing:
        return np.ma.masked_all(shape, dtype=target.dtype)
    if not ref.uris:
        return _filled(ref.value, shape, target, where)
    try:
        candidates = [storage.resolve(u, target.source) for u in ref.uris]
    except ValueError as exc:  # e.g. file://otherhost/...: no reader could open it
        raise CFAFormatError(f"unusable fragment URI: {exc}", **where) from None
    if target.policy is not None:
        for uri in candidates:
            try:
                target.policy.check(uri)
            except CFAError as exc:
                raise exc.located(**where)
    fraction = _fraction(shape, ref.shape)
    for uri in candidates:  # alternative locations of the same fragment, in order
        try:
            return _read_file(uri, ref, key, target, fraction)
        except NotFoundError:
            continue
        except CFAError as exc:
            raise exc.located(file=uri, variable=target.variable, fragment=ref.index)
        except _LIBRARY_ERRORS as exc:  # a damaged file can upset the libraries below in many ways
            raise FragmentReadError(f"cannot read the fragment ({redact(f'{type(exc).__name__}: {exc}')[:300]})",
                                    file=uri, variable=target.variable, fragment=ref.index) from None
    tried = "" if len(candidates) == 1 else f" (alternatives tried: {redact(', '.join(candidates))})"
    generation = generation_of(candidates[0])
    replaced = "" if generation is None else (
        f"; its write generation {generation} is gone: the dataset {redact(target.source)} was most likely "
        "overwritten or updated since it was opened (reopen it to read the current data)")
    raise MissingFragmentError(f"fragment file not found{tried}{replaced}", file=candidates[0],
                               variable=target.variable, fragment=ref.index)


def _fraction(selected: tuple[int, ...], whole: tuple[int, ...]) -> float:
    total = int(np.prod(whole, dtype=np.int64))
    return 1.0 if total == 0 else int(np.prod(selected, dtype=np.int64)) / total


def _filled(value: Any, shape: tuple[int, ...], target: Target, where: dict) -> np.ma.MaskedArray:
    try:
        data = np.full(shape, value, dtype=target.dtype) if np.ndim(value) == 0 else None
    except (TypeError, ValueError, OverflowError):
        data = None
    if data is None:
        raise CFAError(f"unique value {value!r} cannot be stored as {target.dtype}", **where)
    return np.ma.MaskedArray(data)


def _read_file(uri: str, ref: FragmentRef, key: tuple, target: Target, fraction: float) -> np.ma.MaskedArray:
    name = ref.identifier or target.default_identifier
    expected = int(np.prod(ref.shape, dtype=np.int64)) * target.dtype.itemsize
    with open_fragment(uri, name, profile=target.profile, fraction=fraction, expected_nbytes=expected) as var:
        if np.dtype(var.dtype).kind not in "biuf":
            raise FragmentReadError(f"fragment variable {name!r} has non-numeric type {var.dtype}")
        file_key, post = _file_selection(var, ref, key, target)
        raw = var.read(file_key)
        # attributes are read lazily, so only while the file is open
        encoding = Encoding.from_attrs(var.attrs, var.dtype)
        units = {k: var.attrs[k] for k in ("units", "calendar") if k in var.attrs}
    if not _masked_later(encoding, units, ref, target):
        raw = encoding.decode(raw)
    data = post(raw)
    data = _convert_units(data, units, ref, target)
    return _cast(data, target, name)


def _masked_later(encoding: Encoding, attrs: dict, ref: FragmentRef, target: Target) -> bool:
    """Whether the fragment's own decoding may be left to the aggregation's
    (identical masking, no packing on either side, no units to convert)."""
    if target.masked_as is None or encoding.is_packed or target.masked_as.is_packed:
        return False
    units = ref.units or attrs.get("units")
    if target.units is not None and units is not None and str(units) != str(target.units):
        return False
    return encoding == target.masked_as


def _file_selection(var: Any, ref: FragmentRef, key: tuple, target: Target):
    """Translate an aggregated-order key into the fragment file's own key.

    Returns the file key and a function that turns what was read into the
    aggregated order (restoring dropped size-1 dims, transposing and flipping
    NCA partitions).
    """
    expected = ref.shape
    axes = ref.axes if ref.axes is not None else tuple(range(len(expected)))
    present = _present_axes(var, expected, axes, target)
    reversed_ = ref.reversed or (False,) * len(expected)
    file_key: list = []
    steps: dict[int, int] = {}
    for axis in present:
        k = key[axis]
        n = expected[axis]
        if reversed_[axis]:
            if isinstance(k, slice):
                count = len(range(k.start, k.stop, k.step))
                last = k.start + (count - 1) * k.step if count else k.start
                file_key.append(slice(n - 1 - last, n - k.start) if count else slice(0, 0))
                steps[axis] = k.step
            else:
                file_key.append(n - 1 - k)
        else:
            file_key.append(k)

    def post(data: np.ndarray) -> np.ndarray:
        # ``data`` has the kept dims of ``present`` (ints dropped) in file order.
        kept = [axis for axis in present if isinstance(key[axis], slice)]
        order = sorted(range(len(kept)), key=lambda i: kept[i])
        if order != list(range(len(kept))):
            data = np.ma.transpose(data, order) if np.ma.isMaskedArray(data) else np.transpose(data, order)
            kept = [kept[i] for i in order]
        for i, axis in enumerate(kept):
            if reversed_[axis]:
                index = [slice(None)] * data.ndim
                index[i] = slice(None, None, -steps[axis])
                data = data[tuple(index)]
        # Restore dimensions absent from the file (all of size 1, sliced by a slice).
        for axis, k in enumerate(key):
            if axis not in present and isinstance(k, slice):
                position = sum(1 for a in range(axis) if isinstance(key[a], slice))
                data = np.ma.expand_dims(data, position) if np.ma.isMaskedArray(data) else np.expand_dims(data, position)
                if len(range(k.start, k.stop, k.step)) == 0:
                    data = data[(slice(None),) * position + (slice(0, 0),)]
        return data

    return tuple(file_key), post


def _present_axes(var: Any, expected: tuple[int, ...], axes: tuple[int, ...], target: Target) -> tuple[int, ...]:
    """Which aggregated axes the file variable has, in file order."""
    found = tuple(var.shape)
    if len(found) == len(expected):
        if tuple(expected[a] for a in axes) != found:
            raise FragmentShapeError(
                f"fragment variable {var.name!r} has shape {found}, expected "
                f"{tuple(expected[a] for a in axes)} (dimensions {tuple(target.dims[a] for a in axes)})"
            )
        order = tuple(target.dims[a] for a in axes)
        sizes = [n for n in found if n > 1]
        # (only dimensions of equal size can swap without changing the shape:
        # the names are looked up only then, as that costs a metadata read)
        dims = tuple(var.dims) if len(set(sizes)) < len(sizes) else order
        if dims != order and sorted(dims) == sorted(order):
            # Fragment dimensions may be named differently, but the aggregation's own
            # names in another order mean a transposed fragment: reading it would scramble it.
            raise FragmentShapeError(f"fragment variable {var.name!r} has dimensions {dims}, the aggregated "
                                     f"dimensions in another order (expected {order})")
        return axes
    if len(found) < len(expected) and ref_is_plain(axes):
        dims = tuple(var.dims)
        if dims and all(d in target.dims for d in dims):
            by_name = tuple(target.dims.index(d) for d in dims)
            if _valid_subset(by_name, expected, found):
                return by_name
        for subset in itertools.combinations(range(len(expected)), len(found)):
            if _valid_subset(subset, expected, found):
                return subset
    raise FragmentShapeError(
        f"fragment variable {var.name!r} has shape {found} (dimensions {tuple(var.dims)}), "
        f"which does not fit the expected fragment shape {expected} (dimensions {target.dims})"
    )


def ref_is_plain(axes: tuple[int, ...]) -> bool:
    return axes == tuple(range(len(axes)))


def _valid_subset(subset: tuple[int, ...], expected: tuple[int, ...], found: tuple[int, ...]) -> bool:
    if list(subset) != sorted(set(subset)):
        return False
    if tuple(expected[a] for a in subset) != found:
        return False
    return all(expected[a] == 1 for a in range(len(expected)) if a not in subset)


def _convert_units(data: np.ndarray, attrs: dict, ref: FragmentRef, target: Target) -> np.ndarray:
    units = ref.units or attrs.get("units")
    if target.units is None or units is None or str(units) == str(target.units):
        return data
    calendar = attrs.get("calendar", target.calendar)
    try:
        source = cf_units.Unit(str(units), calendar=calendar)
        dest = cf_units.Unit(str(target.units), calendar=target.calendar or calendar)
    except ValueError as exc:
        raise UnitsError(f"cannot interpret units: {exc}") from None
    if source == dest:
        return data
    if not source.is_convertible(dest):
        raise UnitsError(f"fragment units {str(units)!r} cannot be converted to {str(target.units)!r}")
    mask = np.ma.getmask(data)
    values = np.ma.getdata(data)
    if values.dtype.kind != "f":
        values = values.astype(np.float64)
    try:
        converted = source.convert(values, dest)
    except ValueError as exc:
        raise UnitsError(f"cannot convert {str(units)!r} to {str(target.units)!r}: {exc}") from None
    return np.ma.MaskedArray(converted, mask=mask)


def _cast(data: np.ndarray, target: Target, name: str) -> np.ma.MaskedArray:
    mask = np.ma.getmask(data)
    values = np.ma.getdata(data)
    if values.dtype != target.dtype:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if mask is not np.ma.nomask:
                values = np.where(mask, 0, values)
            if target.dtype.kind in "iub" and values.dtype.kind == "f":
                values = np.rint(values)
            _check_fits(values, target.dtype, name)
            values = values.astype(target.dtype)
    return np.ma.MaskedArray(values, mask=mask, copy=False)


def _check_fits(values: np.ndarray, dtype: np.dtype, name: str) -> None:
    """Refuse values an integer aggregated dtype cannot hold: the cast would wrap them into garbage."""
    if dtype.kind not in "iu" or values.size == 0 or np.can_cast(values.dtype, dtype):
        return
    low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise FragmentReadError(f"fragment variable {name!r} holds NaN or infinite values that are not marked "
                                f"missing, which the aggregated type {dtype} cannot hold")
    if values.min() < low or values.max() > high:
        raise FragmentReadError(f"fragment variable {name!r} holds values from {values.min()} to {values.max()}, "
                                f"outside the range of the aggregated type {dtype}")
