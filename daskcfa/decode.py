"""Masking and unpacking with netCDF4-python's rules, applied to raw values.

Used twice on every read: on each fragment with the fragment's own attributes
(before the values enter the aggregation), and on the assembled data with the
aggregation variable's attributes -- once only when a fragment's encoding is
the aggregation's and neither packs (the second pass would find nothing new).
Keeping this in one place is what makes ``from_cfa(...)`` return exactly what
netCDF4-python would.
"""

from __future__ import annotations

import codecs
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import netCDF4
import numpy as np

from .errors import CFAWarning

__all__ = ["Encoding", "PACKING_ATTRS", "STORAGE_ATTRS", "chars_to_strings", "default_fill_value", "join_chars",
           "joined_dtype", "same_value", "strings_to_chars", "text_encoding"]

#: Attributes that make values mean something else than what is stored (CF packing).
PACKING_ATTRS = ("scale_factor", "add_offset")
#: Attributes describing how values are stored rather than what they mean (in the stored type).
STORAGE_ATTRS = (*PACKING_ATTRS, "_FillValue", "missing_value", "valid_min", "valid_max", "valid_range", "_Unsigned")


def default_fill_value(dtype: np.dtype) -> Any:
    """netCDF's default fill value for a numeric dtype (``None`` for others)."""
    return _default_fill_value(np.dtype(dtype))


@functools.lru_cache(maxsize=64)
def _default_fill_value(dtype: np.dtype) -> Any:
    # (once per dtype: decoding asks for it once per fragment read)
    key = dtype.str[1:]
    if key not in netCDF4.default_fillvals:
        return None
    return np.array(netCDF4.default_fillvals[key]).astype(dtype)[()]


#: Scalars of one number type, which :func:`same_value` compares as they are
_NUMBER_SCALARS = (int, float, np.integer, np.floating, np.bool_)


def same_value(a: Any, b: Any, dtype: Any = None) -> bool:
    """Whether two attribute values (fill values, ``missing_value``, units...) are the same.

    The one rule for comparing attributes: element by element, NaN equal to
    NaN (xarray writes ``_FillValue = NaN``, and NaN never ``==`` NaN), numbers
    by value whatever their width, text as text (bytes as UTF-8). With
    ``dtype`` (a variable's stored type) numbers are first stored as it (floats
    rounded to its precision, others only when exact): ``1e20`` and
    ``float32(1e20)`` are the same fill value of a float32 variable.
    """
    if dtype is None and type(a) is type(b) and isinstance(a, _NUMBER_SCALARS):
        # (the same rule, without arrays: a fill value is compared once per fragment read)
        return bool(a == b) or bool(a != a and b != b)
    x, y = (_comparable(v, dtype) for v in (a, b))
    if x.shape != y.shape:
        return False
    if x.dtype.kind in "biufc" and y.dtype.kind in "biufc":
        both_inexact = x.dtype.kind in "fc" and y.dtype.kind in "fc"
        return bool(np.array_equal(x, y, equal_nan=both_inexact))
    if x.dtype.kind in "biufc" or y.dtype.kind in "biufc":
        return False  # a number is not its text
    try:
        return bool(np.array_equal(x.astype(object), y.astype(object)))
    except (TypeError, ValueError):
        return False


def _comparable(value: Any, dtype: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind == "S":
        return np.char.decode(arr, "utf-8", "replace").astype(object)
    if arr.dtype.kind == "U":
        return arr.astype(object)
    if dtype is None or arr.dtype.kind not in "biuf" or np.dtype(dtype).kind not in "biuf":
        return arr
    if arr.dtype.kind == "f" and np.dtype(dtype).kind == "f":  # rounded to the stored precision
        with np.errstate(all="ignore"):
            return arr.astype(dtype)
    cast = _safe_cast(arr, np.dtype(dtype))  # (a fraction never becomes an integer fill value)
    return arr if cast is None else cast


def chars_to_strings(chars: np.ndarray) -> np.ndarray:
    """A ``char`` array's trailing string-length axis joined into whole ``str``
    (an object array, never a fixed width): netCDF4-python's ``chartostring``
    with UTF-8, trailing NULs dropped."""
    chars = np.asarray(chars)
    if chars.ndim == 0:
        chars = chars.reshape(1)
    if not chars.size:
        return np.full(chars.shape[:-1], "", dtype=object)
    return np.asarray(netCDF4.chartostring(chars, encoding="utf-8")).astype(object)


#: ``_Encoding`` values with which netCDF4-python joins characters into bytes, not text
_BYTES = ("none", "None", "bytes")


def text_encoding(attrs: Mapping[str, Any], dtype: np.dtype, ndim: int) -> str | None:
    """The ``_Encoding`` with which netCDF4-python returns a ``char`` variable's
    values as strings (its last dimension joined), or None when it returns characters.

    Raises ValueError for an ``_Encoding`` that names no codec (netCDF4-python
    would fail on every read)."""
    if np.dtype(dtype) != np.dtype("S1") or ndim == 0 or "_Encoding" not in attrs:
        return None
    name = attrs["_Encoding"]
    if not isinstance(name, str):
        raise ValueError(f"_Encoding {name!r} is not text")
    if name not in _BYTES:
        try:
            codecs.lookup(name)
        except LookupError:
            raise ValueError(f"_Encoding {name!r} names no known text encoding") from None
    return name


def join_chars(chars: np.ndarray, encoding: str) -> np.ndarray:
    """Characters with their last axis joined as netCDF4-python joins them for a
    variable with ``_Encoding``: fixed width = the string length (``U``, or ``S``
    for ``none``/``bytes``), trailing NULs dropped. Raises UnicodeDecodeError on
    bytes the encoding cannot decode."""
    chars = np.asarray(chars)
    kind = "S" if encoding in _BYTES else "U"
    if chars.shape[-1] == 0 or chars.size == 0:  # (netCDF4.chartostring fails on a zero string length)
        return np.full(chars.shape[:-1], "", f"{kind}{max(chars.shape[-1], 1)}")
    return np.asarray(netCDF4.chartostring(chars, encoding=encoding))


def joined_dtype(encoding: str, width: int) -> np.dtype:
    """The dtype :func:`join_chars` returns for strings of ``width`` characters."""
    return join_chars(np.zeros((0, width), "S1"), encoding).dtype


def strings_to_chars(strings: np.ndarray, width: int, encoding: str | None) -> np.ndarray:
    """Strings as the characters of a ``char`` variable of string length ``width``
    (a new last axis; NUL padded): the reverse of :func:`join_chars`, text encoded
    with ``encoding`` (UTF-8 when None or a bytes one). Raises ValueError for a
    string longer than ``width`` bytes: it is never truncated."""
    codec = "utf-8" if encoding in (None, *_BYTES) else encoding
    strings = np.asarray(strings, dtype=object)
    encoded = [b"" if s is None else s if isinstance(s, bytes) else str(s).encode(codec) for s in strings.reshape(-1)]
    longest = max(map(len, encoded), default=0)
    if longest > width:
        raise ValueError(f"holds a string of {longest} bytes, longer than the string length {width}")
    fixed = np.array(encoded, dtype=f"S{max(width, 1)}").reshape(strings.shape)
    return fixed.reshape(-1).view("S1").reshape(strings.shape + (max(width, 1),))[..., :width]


def _scalar(value: Any) -> Any:
    """A single-element attribute as a numpy scalar of its own dtype."""
    arr = np.asarray(value)
    if arr.size != 1 or arr.dtype.kind not in "biuf":
        return None
    return arr.reshape(-1)[0]


def _packing(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``scale_factor`` and ``add_offset``, each one number, or neither: netCDF4-python unpacks nothing
    when either is not one number (an array of two, a string), with a warning, and so does daskcfa
    (which applied the other one alone: values netCDF4-python never gives)."""
    found = {name: _scalar(attrs[name]) for name in PACKING_ATTRS if attrs.get(name) is not None}
    bad = [name for name, value in found.items() if value is None]
    if bad:
        warnings.warn(f"{' and '.join(bad)} not one number ({', '.join(repr(attrs[n])[:100] for n in bad)}): the "
                      "values are not unpacked, as netCDF4-python does not unpack them", CFAWarning, stacklevel=3)
        return {}
    return found


def _safe_cast(value: Any, dtype: np.dtype) -> np.ndarray | None:
    """``value`` as ``dtype`` if that loses nothing (netCDF4's ``_check_safecast``)."""
    arr = np.asarray(value)
    if dtype.kind == "S" and arr.dtype.kind in "SU":  # a char variable's fill value: one character
        arr = np.char.encode(arr, "utf-8") if arr.dtype.kind == "U" else arr
        return arr.astype(dtype) if arr.size and np.char.str_len(arr).max() <= dtype.itemsize else None
    if arr.dtype.kind not in "biuf":
        return None
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cast = arr.astype(dtype)
        same = np.array_equal(cast, arr) or (
            arr.dtype.kind == "f" and np.array_equal(np.isnan(cast), np.isnan(arr)) and np.isnan(arr).any()
        )
    return cast if same else None


#: Arrays of at least this many numbers are first tested for holding no missing value at all, from
#: their extremes (:func:`_outside`), before a boolean array of the missing ones is made.
_SCAN_MIN = 4096


#: Bytes at the start of an array that :func:`_outside` reduces first: a block holding a missing
#: value (data masked as users have it holds one in its first few kilobytes) ends the test
#: before the rest is read; the rest is reduced whole (blocks cost more in calls than they save
#: in memory traffic here, measured).
_SCAN_HEAD = 64 << 10


def _outside(raw: np.ndarray, equal: tuple, low: Any, high: Any) -> bool:
    """Whether no element of ``raw`` equals one of ``equal``, nor lies below ``low`` or above
    ``high``, as told by its extremes alone: reductions that allocate nothing, where comparing
    makes a boolean array as large as ``raw`` (and a pass to find it all False). False when
    they cannot tell: a value within the extremes, or NaN among the values (it is the extreme
    then, and compares with nothing), so a mask is then made by comparing as usual.

    The extreme most likely to settle it (the largest when a fill value is not negative) is
    found first, with those a valid range needs; a head of the array that holds a missing
    value settles it before the rest is read (:data:`_SCAN_HEAD`)."""
    upper = high is not None or any(np.isnan(v) or v >= 0 for v in equal)
    first = {"max" if upper else "min"} | ({"min"} if low is not None else set()) | (
        {"max"} if high is not None else set())
    flat = raw.reshape(-1) if raw.flags.c_contiguous else None  # (not contiguous: no head, no copy)
    head = 0 if flat is None else _SCAN_HEAD // raw.itemsize
    found: dict[str, Any] = {}
    for wanted in (first, {"min", "max"} - first):
        if not wanted:
            break
        blocks = (raw,) if flat is None else (flat[:head], flat[head:]) if found == {} else (flat,)
        for block in blocks:
            if block.size and not _extremes(block, wanted, equal, low, high, found):
                return False  # (one is missing for sure, or a NaN among the values)
        if all(_beyond(v, found.get("min"), found.get("max")) for v in equal):
            return True
    return False


def _extremes(block: np.ndarray, wanted: set, equal: tuple, low: Any, high: Any, found: dict[str, Any]) -> bool:
    """The ``wanted`` extremes (``"min"``, ``"max"``) of ``block`` merged into ``found``; False (and
    ``found`` unfinished) when the block holds a NaN, one of ``equal``, or a value below ``low`` or
    above ``high``."""
    for extreme in ("max", "min"):
        if extreme not in wanted:
            continue
        value = np.maximum.reduce(block, axis=None) if extreme == "max" else np.minimum.reduce(block, axis=None)
        if np.isnan(value) or any(v == value for v in equal) or (
                extreme == "min" and low is not None and value < low) or (
                extreme == "max" and high is not None and value > high):
            return False
        kept = found.get(extreme)
        found[extreme] = value if kept is None else (max(kept, value) if extreme == "max" else min(kept, value))
    return True


#: Values :func:`_tested` compares at once: the booleans of every test of a block stay in a core's
#: cache until or-ed (several tests over a whole array took twice as long, measured).
_TEST_BLOCK = 1 << 17


def _tested(raw: np.ndarray, tests: list[tuple[Any, Any]]) -> np.ndarray:
    """Where any of ``tests`` (``(ufunc, value)``; ``(np.isnan, None)``) holds for a C-contiguous
    array of numbers, block by block: the same booleans as or-ing whole comparisons."""
    mask = np.empty(raw.shape, bool)
    flat, out = raw.reshape(-1), mask.reshape(-1)
    scratch = np.empty(min(_TEST_BLOCK, flat.size), bool)
    for start in range(0, flat.size, _TEST_BLOCK):
        block, into = flat[start:start + _TEST_BLOCK], out[start:start + _TEST_BLOCK]
        part = scratch[:block.size]
        for k, (test, value) in enumerate(tests):
            target = into if k == 0 else part
            if value is None:
                test(block, out=target)
            else:
                test(block, value, out=target)
            if k:
                np.logical_or(into, part, out=into)
    return mask


def _beyond(value: Any, smallest: Any, largest: Any) -> bool:
    """Whether ``value`` lies outside the known extremes (a NaN value: none is NaN, the extremes being numbers)."""
    if np.isnan(value):
        return True
    return (largest is not None and value > largest) or (smallest is not None and value < smallest)


def _fill_as(fill_value: Any, dtype: np.dtype) -> Any:
    """``fill_value`` in ``dtype`` (wrapped as numpy casts it), the fill value of a decoded chunk;
    made once per value and type (catching the cast's warnings costs more than decoding a point),
    as a numpy scalar, which no masked array can change."""
    value = np.asarray(fill_value)
    return _cast_fill(value.tobytes(), value.dtype, dtype)  # (by its bits: -0.0 == 0.0 as a key)


@functools.lru_cache(maxsize=256)
def _cast_fill(bits: bytes, given: np.dtype, dtype: np.dtype) -> Any:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.frombuffer(bits, given)[0].astype(dtype)[()]


@dataclass(frozen=True, eq=False)
class Encoding:
    """How stored values become data: missing values and packing.

    Two encodings are equal when every field is the same value (:func:`same_value`:
    a NaN fill value equals a NaN fill value)."""

    dtype: np.dtype
    fill_value: Any = None
    explicit_fill: bool = False
    missing_values: tuple = ()
    valid_min: Any = None
    valid_max: Any = None
    scale_factor: Any = None
    add_offset: Any = None
    unsigned: bool = False

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], dtype: np.dtype, *, no_fill: bool = False) -> "Encoding":
        """``no_fill``: the variable is stored without netCDF's fill (netCDF-4 "NOFILL"), which
        netCDF4-python takes to mean that a byte variable has no default fill value.
        Worked out once per stored type and storage attributes (every fragment read asks, and
        the fragments of an archive mostly share them): encodings are immutable."""
        dtype = np.dtype(dtype)
        key = _encoding_key(attrs, dtype, no_fill)
        if key is None:
            return cls._from_attrs(attrs, dtype, no_fill)
        known = _ENCODINGS.get(key)
        if known is None or type(known) is not cls:
            if len(_ENCODINGS) >= _ENCODINGS_KEPT:
                _ENCODINGS.clear()
            known = _ENCODINGS[key] = cls._from_attrs(attrs, dtype, no_fill)
        return known

    @classmethod
    def _from_attrs(cls, attrs: Mapping[str, Any], dtype: np.dtype, no_fill: bool) -> "Encoding":
        unsigned = dtype.kind == "i" and str(attrs.get("_Unsigned", "false")).lower() == "true"
        view = np.dtype(f"u{dtype.itemsize}") if unsigned else dtype

        def as_stored(value: Any) -> Any:
            # flat, as netCDF holds every attribute (Zarr's JSON may nest the numbers); an empty one holds
            # no value, as if absent (netCDF4-python fails on it with a bare broadcasting error)
            cast = _safe_cast(value, dtype)
            if cast is None or cast.size == 0:
                return None
            return cast.reshape(-1).view(view) if unsigned else cast.reshape(-1)

        fill = as_stored(attrs["_FillValue"]) if "_FillValue" in attrs else None
        explicit = fill is not None
        if fill is None and not (no_fill and dtype.kind in "iu" and dtype.itemsize == 1):
            # netCDF's default fill of the stored type (its bytes, for an _Unsigned one)
            fill = default_fill_value(view) if not unsigned else np.asarray(default_fill_value(dtype)).view(view)
        missing = ()
        if "missing_value" in attrs:
            cast = as_stored(attrs["missing_value"])
            missing = tuple(cast) if cast is not None else ()
        vmin = vmax = None
        if "valid_range" in attrs and np.size(attrs["valid_range"]) == 2 and as_stored(attrs["valid_range"]) is not None:
            vmin, vmax = as_stored(attrs["valid_range"])
        else:
            if "valid_min" in attrs and as_stored(attrs["valid_min"]) is not None:
                vmin = as_stored(attrs["valid_min"])[0]
            if "valid_max" in attrs and as_stored(attrs["valid_max"]) is not None:
                vmax = as_stored(attrs["valid_max"])[0]
        return cls(
            dtype=dtype,
            fill_value=None if fill is None else np.asarray(fill).reshape(-1)[0],
            explicit_fill=explicit,
            missing_values=missing,
            valid_min=vmin,
            valid_max=vmax,
            **_packing(attrs),
            unsigned=unsigned,
        )

    def __eq__(self, other: object) -> bool:
        if other is self:  # (a fragment's encoding and the aggregation's, when their attributes match)
            return True
        if not isinstance(other, Encoding):
            return NotImplemented
        return self.dtype == other.dtype and all(
            _same_field(getattr(self, f), getattr(other, f)) for f in _ENCODING_VALUES)

    def __hash__(self) -> int:  # (NaN-free fields only: equal encodings hash alike)
        return hash((self.dtype, self.explicit_fill, self.unsigned))

    @property
    def is_packed(self) -> bool:
        return self.scale_factor is not None or self.add_offset is not None

    @property
    def decoded_dtype(self) -> np.dtype:
        """The dtype :meth:`decode` returns (numpy promotion of the packing attributes)."""
        return self.unpack(np.zeros(0, self.stored_dtype)).dtype

    @property
    def stored_dtype(self) -> np.dtype:
        return np.dtype(f"u{self.dtype.itemsize}") if self.unsigned else self.dtype

    def missing_mask(self, raw: np.ndarray) -> np.ndarray | None:
        """Where ``raw`` (already in :attr:`stored_dtype`) holds missing values, or None
        (characters equal to the fill value are missing, as netCDF4-python masks them;
        vlen strings never are). None too when a large array of numbers provably holds no
        missing value (:func:`_outside`): no boolean array is made then."""
        if raw.dtype.kind not in "biufS":
            return None
        equal = self._compared()
        if not equal and self.valid_min is None and self.valid_max is None:
            return None
        if raw.size >= _SCAN_MIN and raw.dtype.kind in "iuf" and _outside(raw, equal, self.valid_min, self.valid_max):
            return None
        is_float = raw.dtype.kind == "f"
        tests = [(np.isnan, None) if is_float and np.isnan(value) else (np.equal, value) for value in equal]
        if self.valid_min is not None:
            tests.append((np.less, self.valid_min))
        if self.valid_max is not None:
            tests.append((np.greater, self.valid_max))
        if len(tests) > 1 and raw.dtype.kind in "iuf" and raw.flags.c_contiguous:
            return _tested(raw, tests)
        mask = None
        for test, value in tests:
            found = np.isnan(raw) if value is None else (raw == value if test is np.equal else test(raw, value))
            mask = found if mask is None else (mask | found)
        return mask

    def _compared(self) -> tuple:
        """The values a stored value equal to is missing: ``missing_value``, then the fill value
        (netCDF4-python compares ``_Unsigned`` values with the signed default fill: never equal);
        less those outside the valid range, whose test masks them already (a comparison and a pass
        fewer: the usual ``missing_value`` -999 and default fill beside a ``valid_range``)."""
        equal = self.missing_values
        if self.fill_value is not None and (self.explicit_fill or not self.unsigned):
            equal = (*equal, self.fill_value)
        low, high = self.valid_min, self.valid_max
        if low is None and high is None:
            return equal
        return tuple(v for v in equal if not ((low is not None and v < low) or (high is not None and v > high)))

    def unpack(self, data: np.ndarray) -> np.ndarray:
        scale, offset = self.scale_factor, self.add_offset
        if scale is not None and offset is not None:
            if offset != 0 or scale != 1:
                return data * scale + offset
            return data.astype(np.asarray(scale).dtype)
        if scale is not None and scale != 1:
            return data * scale
        if offset is not None and offset != 0:
            return data + offset
        return data

    def decode(self, raw: np.ndarray, *, mask: bool = True, extra_mask: np.ndarray | None = None,
               masked_type: type[np.ma.MaskedArray] = np.ma.MaskedArray) -> np.ndarray:
        """Stored values to data, like netCDF4-python's automatic mask and scale.

        ``extra_mask`` marks points already known to be missing (for example a
        missing fragment); with ``mask=False`` they hold the fill value. Masked
        numbers come as ``masked_type`` (a subclass of numpy's masked array).
        """
        raw = self.as_stored(np.asarray(raw))
        if not mask:
            if extra_mask is not None and np.any(extra_mask):
                raw = np.where(extra_mask, self.output_fill, raw)
            return self.unpack(raw)
        missing = self.missing_mask(raw)
        if extra_mask is not None:
            missing = extra_mask if missing is None else (missing | extra_mask)
        if missing is not None and not missing.any():
            missing = None
        out = self.unpack(raw)
        if out.dtype.kind in "OS":  # strings: never masked by value (as netCDF4-python); the empty string beneath
            if missing is not None:
                out = np.where(missing, self.output_fill, out)
            result = np.ma.MaskedArray(out, mask=np.ma.nomask if missing is None else missing, copy=False)
            result.set_fill_value(self.output_fill)
            return result
        result = masked_type(out, mask=np.ma.nomask if missing is None else missing, copy=False)
        if self.fill_value is not None and out.dtype.kind in "biuf":
            result.set_fill_value(_fill_as(self.fill_value, out.dtype))
        return result

    def as_stored(self, raw: np.ndarray) -> np.ndarray:
        """Raw values as :attr:`stored_dtype` (``_Unsigned`` integers viewed as unsigned)."""
        return raw.view(self.stored_dtype) if self.unsigned and raw.dtype != self.stored_dtype else raw

    @property
    def output_fill(self) -> Any:
        """What a missing point holds when values are not masked: the fill value,
        else 0 (numbers) or the empty string (netCDF's default fill of strings)."""
        if self.fill_value is not None:
            return self.fill_value
        if self.dtype.kind == "O":
            return ""
        return np.zeros((), self.stored_dtype)[()]


#: Encodings worked out (:meth:`Encoding.from_attrs`), by :func:`_encoding_key`; at most this many kept.
_ENCODINGS: dict[tuple, Encoding] = {}
_ENCODINGS_KEPT = 256
#: Longest storage attribute (in bytes) an encoding is kept for: a file's own can be of any length.
_KEY_MOST = 256


def _encoding_key(attrs: Mapping[str, Any], dtype: np.dtype, no_fill: bool) -> tuple | None:
    """What :meth:`Encoding.from_attrs` depends on, exactly: each storage attribute by its type, and
    numbers by their dtype, shape and bits (``-0.0`` is not ``0.0``, ``int8(1)`` not ``1.0``); None
    (worked out afresh) for an attribute that is not text or numbers, or longer than :data:`_KEY_MOST`."""
    parts: list = [dtype, no_fill]
    for name in STORAGE_ATTRS:
        if name not in attrs:
            continue
        value = attrs[name]
        if isinstance(value, str):
            if len(value) > _KEY_MOST:
                return None
            parts.append((name, str, value))
            continue
        if name == "_Unsigned":  # (read as text: ``str(value)``)
            return None
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf" or arr.nbytes > _KEY_MOST:
            return None
        parts.append((name, type(value), arr.dtype.str, arr.shape, arr.tobytes()))
    return tuple(parts)


#: The fields of :class:`Encoding` that hold values (compared with :func:`same_value`).
_ENCODING_VALUES = ("fill_value", "explicit_fill", "missing_values", "valid_min", "valid_max", "scale_factor",
                    "add_offset", "unsigned")


def _same_field(a: Any, b: Any) -> bool:
    if a is b:  # (None, a flag, no missing values: most fields of two fragments' encodings, at no cost)
        return True
    if a is None or b is None:
        return False
    return same_value(a, b)
