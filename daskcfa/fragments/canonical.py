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
import math
import warnings
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..decode import Encoding, chars_to_strings, strings_to_chars
from ..errors import (CFAError, CFAFormatError, CFAWarning, FragmentError, FragmentReadError, FragmentShapeError,
                      MissingFragmentError, NotFoundError, UnitsError, redact)
from ..limits import max_string_length
from ..logs import logger
from ..model import FragmentRef
from .. import storage
from ..storage.lease import generation_of
from ..storage.policy import LocationPolicy
from ..units import checked_unit
from .chunk_index import IndexedFragmentChanged, VariableIndex
from . import worker
from .files import open_fragment, open_indexed
from .zarr import is_reference_set

if TYPE_CHECKING:
    from cf_units import Unit

log = logger(__name__)

__all__ = ["Target", "read_fragment", "allowed_uris", "units_conversion", "reference_set_chunks"]

#: What HDF5, netCDF-C, h5py, zarr-python and the decompressors raise on a damaged file (zarr-python: a
#: TypeError for a fill value or codec parameter of the wrong type).
_LIBRARY_ERRORS = (OSError, ValueError, OverflowError, RuntimeError, IndexError, KeyError, EOFError, MemoryError,
                   TypeError, zlib.error)


@dataclass(frozen=True)
class Target:
    """What the aggregation expects of every fragment of one variable."""

    variable: str
    source: str
    dims: tuple[str, ...]
    #: the canonical dtype: the aggregated dtype as stored (``_Unsigned`` integers
    #: as unsigned, vlen strings as ``object``)
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
    #: netCDF4's rules) to the assembled values, or when the caller wants stored
    #: values that it would not change: a fragment stored with the same dtype and
    #: masking and no packing is then passed on as stored, and its values are
    #: compared with the fill value once rather than twice
    masked_as: Encoding | None = None
    #: a char aggregation's ``_Encoding`` (``masked_as`` then set): it holds strings, whose
    #: characters are never missing one by one (a fragment's missing characters hold the
    #: aggregation's fill value, its padding); vlen string fragments are encoded with it
    text_encoding: str | None = None
    #: the variable's chunk index (read beside the aggregation file: :mod:`.chunk_index`), whose
    #: fragments are read by byte range without HDF5 metadata while they are the objects indexed
    chunk_index: VariableIndex | None = None

    @property
    def default_identifier(self) -> str:
        return self.variable.rsplit("/", 1)[-1]


def _selection_shape(key: tuple) -> tuple[int, ...]:
    return tuple(len(range(k.start, k.stop, k.step)) for k in key if isinstance(k, slice))


def read_fragment(ref: FragmentRef, key: tuple, target: Target) -> np.ndarray:
    """Values of fragment ``ref`` at ``key`` (normalised: non-negative ints and
    slices with explicit start/stop/positive step, one per aggregated dim): a masked
    array where anything is missing, else (a fragment file's values) a plain array.

    With ``target.missing == "fill"`` a fragment that is absent or unreadable
    (its file missing, not netCDF, corrupt, of the wrong shape or type) reads
    as missing data, with a :class:`CFAWarning` naming it. Storage failures
    (an unreachable server, refused credentials), units that cannot be
    converted and the safe-URI policy still raise: they are not facts about
    the fragment, and filling them in would hide an outage or a breach.
    """
    worker.prepare()
    try:
        return _read_fragment(ref, key, target)
    except FragmentError as exc:
        if target.missing != "fill" or isinstance(exc, UnitsError):
            raise
        message = f"reading fragment {ref.index} as missing data: {exc}"  # (a CFAError's file is redacted)
        log.warning("%s", message)
        warnings.warn(message, CFAWarning, stacklevel=2)
        return _missing(_selection_shape(key), target.dtype)


def _missing(shape: tuple[int, ...], dtype: np.dtype) -> np.ma.MaskedArray:
    """Wholly missing data: masked; strings hold the empty string beneath (netCDF's default string fill)."""
    if dtype.kind in "OS":
        return np.ma.MaskedArray(np.full(shape, "" if dtype.kind == "O" else b"", dtype), mask=True)
    return np.ma.masked_all(shape, dtype=dtype)


def _read_fragment(ref: FragmentRef, key: tuple, target: Target) -> np.ndarray:
    where = {"file": target.source, "variable": target.variable, "fragment": ref.index}
    shape = _selection_shape(key)
    if ref.is_missing:
        return _missing(shape, target.dtype)
    if not ref.uris:
        try:
            return _filled(ref.value, shape, target)
        except CFAError as exc:
            raise exc.located(**where)
    candidates = allowed_uris(ref.uris, target.source, target.policy, where)
    fraction = _fraction(shape, ref.shape)
    for position, uri in enumerate(candidates):  # alternative locations of the same fragment, in order
        try:
            return _read_file(uri, ref.at_alternative(position), key, target, fraction)
        except NotFoundError:
            continue
        except CFAError as exc:
            raise exc.located(file=uri, variable=target.variable, fragment=ref.index)
        except _LIBRARY_ERRORS as exc:  # a damaged file can upset the libraries below in many ways
            raise FragmentReadError(f"cannot read the fragment ({redact(f'{type(exc).__name__}: {exc}')[:300]})",
                                    file=uri, variable=target.variable, fragment=ref.index) from None
    raise MissingFragmentError(_not_found(candidates, target), file=candidates[0], variable=target.variable,
                               fragment=ref.index)


def _not_found(candidates: Sequence[str], target: Target) -> str:
    """What is true of a fragment found at none of its URIs: where it was looked for, a directory
    that does not exist at all, and -- only when the dataset's manifest names a newer write that no
    longer lists it -- that the dataset was rewritten since it was opened. (Not worked out when
    missing fragments are to read as missing data: that costs a request per fragment.)"""
    message = f"fragment file not found at {redact(candidates[0])}"
    if len(candidates) > 1:
        message += f" nor at its alternatives {redact(', '.join(candidates[1:]))}"
    if target.missing == "fill":
        return message
    generation = generation_of(candidates[0])
    newer = None if generation is None else storage.replacing_generation(candidates[0], target.source, generation,
                                                                         target.profile)
    if newer is not None:
        return (f"{message}; the dataset {redact(target.source)} was overwritten or updated since it was opened (its "
                f"manifest names write generation {newer}, which no longer lists this fragment): reopen it to read the "
                "current data")
    gone = [d for d in dict.fromkeys(storage.missing_directory(u, target.profile) for u in candidates) if d]
    if gone:
        message += (f"; nothing is stored under {' or '.join(map(redact, gone))} either (moved, or relocated to a "
                    "prefix that does not exist)")
    return message


def allowed_uris(references: Sequence[str], source: str, policy: LocationPolicy | None,
                 where: Mapping[str, Any]) -> list[str]:
    """Fragment ``references`` resolved against the aggregation file at
    ``source``, each allowed by ``policy``; a refusal or an unusable URI raises,
    located at ``where`` (file, variable, fragment)."""
    try:
        uris = [storage.resolve(u, source) for u in references]
    except ValueError as exc:  # e.g. file://otherhost/...: no reader could open it
        raise CFAFormatError(f"unusable fragment URI: {exc}", **where) from None
    if policy is not None:
        for uri in uris:
            try:
                policy.check(uri)
            except CFAError as exc:
                raise exc.located(**where)
    return uris


def reference_set_chunks(ref: FragmentRef, target: Target) -> tuple[int, ...] | None:
    """The chunk shape of a fragment that is a reference set (its metadata read, no chunk), when its
    chunks can tile the fragment as they are: the array has the fragment's shape, in the
    aggregation's dimension order, nothing reversed. None otherwise, or when the set cannot be
    opened (its read says why)."""
    if not ref.uris or ref.axes is not None or any(ref.reversed or ()):
        return None
    try:
        uri = allowed_uris(ref.uris[:1], target.source, target.policy, {})[0]
        if not is_reference_set(uri):
            return None
        with open_fragment(uri, ref.variable_names(target.default_identifier), profile=target.profile,
                           policy=target.policy) as var:
            chunks, shape = var.layout[0], tuple(var.shape)
    except CFAError:
        return None
    if chunks is None or shape != ref.shape or len(chunks) != len(shape) or 0 in chunks:
        return None
    return tuple(int(c) for c in chunks)


def _fraction(selected: tuple[int, ...], whole: tuple[int, ...]) -> float:
    total = math.prod(whole)
    return 1.0 if total == 0 else math.prod(selected) / total


def _filled(value: Any, shape: tuple[int, ...], target: Target) -> np.ma.MaskedArray:
    """A fragment given by its unique value: the value goes through the rule a
    fragment file's values go through (:func:`_cast`), so it is never wrapped."""
    value = np.asarray(value)
    if value.ndim != 0:
        raise FragmentReadError(f"the unique value {value!r} is not a single value")
    value = _check_kind(value, target, "the fragment's unique value")
    one = _cast(np.ma.MaskedArray(value), target, "the fragment's unique value")
    return np.ma.MaskedArray(np.full(shape, np.ma.getdata(one)[()], target.dtype))


def _read_file(uri: str, ref: FragmentRef, key: tuple, target: Target, fraction: float) -> np.ndarray:
    names = ref.variable_names(target.default_identifier)
    entry = None if target.chunk_index is None else target.chunk_index.entry(uri, names)
    if entry is not None:  # no HDF5 metadata: the chunks' byte ranges, if the object is still the one indexed
        try:
            return _read_variable(open_indexed(uri, entry, profile=target.profile, policy=target.policy),
                                  uri, ref, key, target, names[-1])
        except IndexedFragmentChanged:
            target.chunk_index.changed(uri, target.variable, ref.index)
    expected = math.prod(ref.shape) * target.dtype.itemsize
    return _read_variable(open_fragment(uri, names, profile=target.profile, policy=target.policy, fraction=fraction,
                                        expected_nbytes=expected), uri, ref, key, target, names[-1])


def _read_variable(opened: Any, uri: str, ref: FragmentRef, key: tuple, target: Target,
                   name: str) -> np.ndarray:
    """The fragment variable ``opened`` (a context manager giving it) read at ``key``, in canonical form."""
    with opened as var:
        if target.dtype.kind == "O" and np.dtype(var.dtype).kind == "S":
            var = _CharStrings(var)  # a char array's last dimension is the string length
        elif target.dtype.kind == "S" and np.dtype(var.dtype).kind == "O" and len(var.shape) == len(ref.shape) - 1:
            var = _StringChars(var, ref.shape[-1], target.text_encoding)  # the string length is the last dimension
        elif target.dtype.kind == "S" and len(var.shape) == len(ref.shape) + 1:
            raise FragmentShapeError(f"fragment variable {name!r} holds strings (its last dimension is their "
                                     "length), but the char aggregation variable holds characters: its "
                                     "aggregated_dimensions must include the string length (or be a vlen string)")
        _check_kind(np.empty(0, var.dtype), target, f"fragment variable {name!r}")
        file_key, post = _file_selection(var, ref, key, target, uri)
        raw = var.read(file_key)
        # attributes are read lazily, so only while the file is open
        encoding = Encoding.from_attrs(var.attrs, var.dtype, no_fill=var.no_fill)
        units = {k: var.attrs[k] for k in ("units", "calendar") if k in var.attrs}
    raw = encoding.as_stored(raw) if _masked_later(encoding, units, ref, target) else encoding.decode(raw)
    data = post(raw)
    data = _convert_units(data, units, ref, target)
    data = _cast(data, target, f"fragment variable {name!r}")
    if target.text_encoding is not None and np.ma.getmask(data) is not np.ma.nomask:
        data = np.ma.MaskedArray(data.filled(target.masked_as.output_fill))
    return data


class _CharStrings:
    """A ``char`` fragment variable read as whole strings: its trailing
    string-length dimension is joined (width from the file, never guessed)."""

    def __init__(self, var: Any) -> None:
        width = int(var.shape[-1]) if var.shape else 1
        if width > max_string_length():  # (a tiny file may declare it: reading fills every character)
            raise FragmentReadError(f"fragment variable {var.name!r} holds strings of {width:,} characters, more "
                                    f"than the limit of {max_string_length():,} (dask config "
                                    "'daskcfa.limits.max-string-length')")
        self._var = var
        self.name, self.attrs, self.no_fill = var.name, var.attrs, var.no_fill
        self.shape, self.dtype = tuple(var.shape)[:-1], np.dtype(object)

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(self._var.dims)[:-1]

    def read(self, key: tuple) -> np.ndarray:
        length = (slice(0, self._var.shape[-1], 1),) if self._var.shape else ()  # (a scalar char: one character)
        return chars_to_strings(self._var.read(key + length))


class _StringChars:
    """A vlen string fragment variable read as the characters of a ``char``
    aggregation whose last dimension is the string length (``width``)."""

    def __init__(self, var: Any, width: int, encoding: str | None) -> None:
        self._var, self._width, self._encoding = var, width, encoding
        self.name, self.attrs, self.no_fill = var.name, var.attrs, var.no_fill
        self.shape, self.dtype = tuple(var.shape) + (width,), np.dtype("S1")

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(self._var.dims) + ("string length",)

    def read(self, key: tuple) -> np.ndarray:
        try:
            chars = strings_to_chars(self._var.read(key[:-1]), self._width, self._encoding)
        except ValueError as exc:  # (too long: never truncated; or not encodable)
            raise FragmentShapeError(f"fragment variable {self.name!r} {exc} of the char aggregation") from None
        return chars[..., key[-1]]


def _check_kind(values: np.ndarray, target: Target, what: str) -> np.ndarray:
    """Refuse text for numbers and numbers for text (no rule converts them);
    returns the values, text as ``str`` objects for a vlen string aggregation."""
    text, wanted = values.dtype.kind in "OSU", target.dtype.kind in "OS"
    if text != wanted:
        raise FragmentReadError(f"{what} has type {values.dtype}, but the aggregated variable holds "
                                f"{'strings' if wanted else 'numbers'} ({target.dtype})")
    return values.astype(object) if target.dtype.kind == "O" else values


def _masked_later(encoding: Encoding, attrs: dict, ref: FragmentRef, target: Target) -> bool:
    """Whether the fragment's own decoding may be left to the aggregation's
    (identical masking, no packing on either side, no units to convert)."""
    if target.masked_as is None or encoding.is_packed or target.masked_as.is_packed:
        return False
    units = ref.units or attrs.get("units")
    if target.units is not None and units is not None and str(units) != str(target.units):
        return False
    return encoding == target.masked_as


def _file_selection(var: Any, ref: FragmentRef, key: tuple, target: Target, uri: str):
    """Translate an aggregated-order key into the fragment file's own key.

    Returns the file key and a function that turns what was read into the
    aggregated order (restoring dropped size-1 dims, transposing and flipping
    NCA partitions).
    """
    expected = ref.shape
    axes = ref.axes if ref.axes is not None else tuple(range(len(expected)))
    file_key: list = []
    steps: dict[int, int] = {}
    gathers: list[np.ndarray] = []
    virtual = ref.part is not None or min(axes, default=0) < 0
    if virtual:
        present, file_key, gathers = _virtual_selection(var, ref, key, axes)
        reversed_ = (False,) * len(expected)  # (composed into the indices gathered)
    else:
        present = _present_axes(var, expected, axes, target)
        if len(present) == len(expected):
            _warn_if_permuted(var, tuple(target.dims[a] for a in present),
                              {"file": uri, "variable": target.variable, "fragment": ref.index})
        reversed_ = ref.reversed or (False,) * len(expected)
    for axis in () if virtual else present:
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
        for position, indices in enumerate(gathers):
            data = data.take(indices, axis=position)
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


def _virtual_selection(var: Any, ref: FragmentRef, key: tuple, axes: tuple[int, ...]
                       ) -> tuple[tuple[int, ...], list, list[np.ndarray]]:
    """The file key of an NCA partition that is a part of its file variable (``part``), or whose
    file variable has size-1 dimensions the aggregation does not span (axes -1).

    Each selected file dimension is read over the bounding range of the indices
    wanted, which are then gathered (in aggregated order, reversals composed
    in). Returns the aggregated axes present (file order), the file key, and
    the indices to gather along each kept dimension.
    """
    shape = tuple(var.shape)
    whole = tuple(1 if a < 0 else ref.shape[a] for a in axes)  # the file variable's shape, unless a part
    if len(axes) != len(shape) or (ref.part is None and shape != whole):
        raise FragmentShapeError(f"fragment variable {var.name!r} has shape {shape}, expected {whole} (size 1 "
                                 "along the dimensions the aggregation does not span)")
    part = ref.part or tuple(map(range, whole))
    present, file_key, gathers = [], [], []
    for axis, indices, size in zip(axes, part, shape):
        # (a range stays a range until the indices selected are taken: it may be long)
        ends = (indices[0], indices[-1]) if isinstance(indices, range) else indices
        if len(indices) and (min(ends) < 0 or max(ends) >= size):
            raise FragmentShapeError(f"the partition takes indices up to {max(ends)} of fragment variable "
                                     f"{var.name!r}, which has shape {shape}")
        if axis < 0:  # (the parser checked that a part takes one element here)
            file_key.append(int(indices[0]))
            continue
        present.append(axis)
        chosen = (indices[::-1] if ref.reversed and ref.reversed[axis] else indices)[key[axis]]
        if isinstance(key[axis], slice):
            chosen = np.asarray(chosen, dtype=np.int64)
            low = int(chosen.min()) if chosen.size else 0
            file_key.append(slice(low, int(chosen.max()) + 1 if chosen.size else 0))
            gathers.append(chosen - low)
        else:
            file_key.append(int(chosen))
    return tuple(present), file_key, gathers


def _present_axes(var: Any, expected: tuple[int, ...], axes: tuple[int, ...], target: Target) -> tuple[int, ...]:
    """Which aggregated axes the file variable has, in file order.

    Fragment dimension names are not significant: CF and CFA define the
    canonical form by position, so a fragment is matched by its shape alone,
    whatever its dimensions are called. One that lacks some size-1 dimensions
    has its dimensions matched left to right to the first aggregated ones of
    the same sizes (the others must be size 1): every such match re-inserts
    only size-1 dimensions around the same values, so none reads differently.
    """
    found = tuple(var.shape)
    if len(found) == len(expected):
        if tuple(expected[a] for a in axes) != found:
            raise FragmentShapeError(
                f"fragment variable {var.name!r} has shape {found}, expected "
                f"{tuple(expected[a] for a in axes)} (dimensions {tuple(target.dims[a] for a in axes)})"
            )
        return axes
    if len(found) < len(expected) and ref_is_plain(axes):
        for subset in itertools.combinations(range(len(expected)), len(found)):
            if _valid_subset(subset, expected, found):
                return subset
    raise FragmentShapeError(
        f"fragment variable {var.name!r} has shape {found} (dimensions {tuple(var.dims)}), "
        f"which does not fit the expected fragment shape {expected} (dimensions {target.dims})"
    )


def _warn_if_permuted(var: Any, order: tuple[str, ...], where: dict) -> None:
    """Warn when a fragment whose shape fits by position names the aggregated dimensions in
    another order (it is read by position, as CF asks, but it may have been written transposed).
    Only dimensions of equal size can swap unseen, so the names (a metadata read) are looked
    up only then."""
    sizes = [n for n in var.shape if n > 1]
    if len(set(sizes)) == len(sizes):
        return
    dims = tuple(var.dims)
    if dims != order and sorted(dims) == sorted(order):
        located = CFAError(f"fragment variable {var.name!r} has dimensions {dims}, the aggregated dimensions "
                           f"{order} in another order: read by position, as CF and CFA define it", **where)
        warnings.warn(str(located), CFAWarning, stacklevel=2)


def ref_is_plain(axes: tuple[int, ...]) -> bool:
    return axes == tuple(range(len(axes)))


def _valid_subset(subset: tuple[int, ...], expected: tuple[int, ...], found: tuple[int, ...]) -> bool:
    if list(subset) != sorted(set(subset)):
        return False
    if tuple(expected[a] for a in subset) != found:
        return False
    return all(expected[a] == 1 for a in range(len(expected)) if a not in subset)


def units_conversion(attrs: Mapping[str, Any], ref: FragmentRef, target: Target) -> tuple[Unit, Unit] | None:
    """The units a fragment's values are converted from and to (None: they are not converted);
    units that cannot be converted raise :class:`UnitsError`."""
    units = ref.units or attrs.get("units")
    if target.units is None or units is None:
        return None
    calendar = attrs.get("calendar", target.calendar)
    if str(units) == str(target.units) and (target.calendar is None or str(calendar) == target.calendar):
        return None
    try:
        source = checked_unit(str(units), calendar)
        dest = checked_unit(str(target.units), target.calendar or calendar)
    except (TypeError, ValueError) as exc:  # (TypeError: a calendar that is not a string)
        raise UnitsError(f"cannot interpret units: {exc}") from None
    if source == dest:
        return None
    if not source.is_convertible(dest):
        raise UnitsError(f"fragment units {source!r} cannot be converted to {dest!r}")
    return source, dest


def _convert_units(data: np.ndarray, attrs: dict, ref: FragmentRef, target: Target) -> np.ndarray:
    conversion = units_conversion(attrs, ref, target)
    if conversion is None:
        return data
    source, dest = conversion
    units = ref.units or attrs.get("units")
    mask = np.ma.getmask(data)
    values = np.ma.getdata(data)
    if values.dtype.kind != "f":
        values = values.astype(np.float64)
    try:
        converted = source.convert(values, dest)
    except ValueError as exc:
        raise UnitsError(f"cannot convert {str(units)!r} to {str(target.units)!r}: {exc}") from None
    return np.ma.MaskedArray(converted, mask=mask)


def _cast(data: np.ndarray, target: Target, what: str) -> np.ndarray:
    """Values as the canonical dtype; what that dtype cannot hold is refused, never wrapped. A masked
    array where anything is masked, else a plain one (one masked array fewer a fragment read: the
    caller takes values and mask apart, with ``np.ma.getdata`` and ``np.ma.getmask``)."""
    mask = np.ma.getmask(data)
    values = np.ma.getdata(data)
    if values.dtype != target.dtype:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if mask is not np.ma.nomask:
                values = np.where(mask, np.zeros((), values.dtype), values)
            if target.dtype.kind in "iub" and values.dtype.kind == "f":
                values = np.rint(values)
            if target.dtype.kind == "S" and values.dtype.kind in "OU":
                values = np.char.encode(values.astype(str), "utf-8")
            _check_fits(values, target.dtype, what)
            values = values.astype(target.dtype)
    return values if mask is np.ma.nomask else np.ma.MaskedArray(values, mask=mask, copy=False)


def _check_fits(values: np.ndarray, dtype: np.dtype, what: str) -> None:
    """Refuse values an integer aggregated dtype cannot hold (the cast would wrap
    them into garbage), finite values a narrower float type cannot hold (the cast
    would make them infinite) and text longer than a ``char`` aggregation's width."""
    if values.size == 0 or np.can_cast(values.dtype, dtype):
        return
    if dtype.kind == "S":
        longest = int(np.char.str_len(values).max())
        if longest > dtype.itemsize:
            raise FragmentReadError(f"{what} holds text of {longest} bytes, longer than the aggregated type {dtype}")
        return
    if dtype.kind == "f" and values.dtype.kind == "f":
        beyond = values[np.isfinite(values) & (np.abs(values) > np.finfo(dtype).max)]
        if np.isinf(beyond.astype(dtype)).any():  # (those within half a step of the largest round to it)
            raise FragmentReadError(f"{what} holds values up to {np.abs(beyond).max():.6g}, beyond the largest the "
                                    f"aggregated type {dtype} holds ({np.finfo(dtype).max:.6g})")
        return
    if dtype.kind not in "iu":
        return
    low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise FragmentReadError(f"{what} holds NaN or infinite values that are not marked "
                                f"missing, which the aggregated type {dtype} cannot hold")
    if values.min() < low or values.max() > high:
        raise FragmentReadError(f"{what} holds values from {values.min()} to {values.max()}, "
                                f"outside the range of the aggregated type {dtype}")
