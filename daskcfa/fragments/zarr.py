"""Fragments stored as Zarr: Zarr v2 or v3 stores, netCDF-C's NCZarr, and fsspec reference sets;
and fragments written as Zarr v2 stores (:class:`StoreWriter`).

A fragment is a Zarr store when its URI says so, as netCDF-C spells it
(``file:///d/f0.zarr#mode=nczarr,file``, ``s3://b/f0.zarr#mode=zarr,s3``) or
by the ``.zarr`` suffix of its path (``f0.zarr``, ``s3://b/f0.zarr/``). A
fragment named ``*.json`` (or ``*.parq``/``*.parquet``) is an fsspec
reference set (kerchunk's format, versions 0 and 1), which presents a Zarr
store whose chunks are byte ranges of other files: daskcfa parses it itself
(:mod:`.reference_sets`: each target resolved against the reference set's
location and checked by the safe-URI policy; a reference set is untrusted
input, as an aggregation file is). Every store's metadata is checked against
daskcfa's codec allow-list and its chunks decoded within their declared size
by daskcfa (:mod:`.zarr_chunks`) before zarr-python assembles them.
The store is reached through the storage layer (credentials by reference, the
safe-URI policy's checked HTTP client) and its variable is read as a netCDF
variable is, under the same canonical-form rules:

* dimension names: ``dimension_names`` (Zarr v3), ``_ARRAY_DIMENSIONS``
  (Zarr v2, as xarray and NCZarr write it);
* missing values: the CF attributes (``_FillValue``, ``missing_value``,
  valid range), as xarray reads Zarr: the v2 ``fill_value`` stands for an
  absent ``_FillValue``, and xarray's v3 base64 encoding of a float
  ``_FillValue`` is decoded. netCDF's default fill values do not apply
  (Zarr has none); NCZarr writes its fill value as ``_FillValue``;
* packing and units: the attributes, as for any fragment.
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any, Mapping, Sequence

import numpy as np

from .. import storage
from ..decode import STORAGE_ATTRS
from ..errors import ArgumentError, CFAError, FragmentReadError, NotFoundError
from ..storage.policy import LocationPolicy
from ..storage.profiles import ProfileRef
from .hdf5 import normalize_key
from .reference_sets import open_reference_set

__all__ = ["is_zarr", "is_reference_set", "store_uri", "stored_size", "netcdf_attributes", "ZarrFile", "ZarrVariable",
           "ZARR_COMPRESSION_KEYS", "CONSOLIDATED", "check_zarr_compression", "StoreWriter", "store_state"]

#: attributes that describe the Zarr or NCZarr layout, not the variable
_LAYOUT_ATTRS = ("_ARRAY_DIMENSIONS", "_NCProperties", "_nczarr_array", "_nczarr_attr", "_nczarr_group", "_nczarr_superblock")


def _mode(uri: str) -> list[str]:
    return storage.split_mode(uri)[1][len("#mode="):].split(",")


def is_zarr(uri: str) -> bool:
    """Whether the fragment at ``uri`` is read as Zarr (its URI says so: a Zarr mode, ``.zarr``,
    or a reference set's ``.json``/``.parq``)."""
    if any(m in ("zarr", "nczarr") for m in _mode(uri)):
        return True
    return store_uri(uri).rstrip("/").endswith(".zarr") or is_reference_set(uri)


def is_reference_set(uri: str) -> bool:
    """Whether ``uri`` names an fsspec reference set (JSON, or a Parquet directory)."""
    return store_uri(uri).rstrip("/").endswith((".json", ".parq", ".parquet"))


def stored_size(uri: str, profile: ProfileRef = storage.NO_PROFILE, *, policy: LocationPolicy | None = None) -> int:
    """The bytes a store holds on storage: every object under it (a JSON reference set: its own
    file, not the files it points into)."""
    location = store_uri(uri)
    if location.rstrip("/").endswith(".json"):
        return storage.size(location, profile, policy=policy)
    return storage.tree_size(location, profile, policy=policy)


def store_uri(uri: str) -> str:
    """The store's own URI (netCDF-C's ``#mode=...`` removed)."""
    return storage.split_mode(uri)[0]


class ZarrFile:
    """An open Zarr store holding a fragment's variable (the store's root group)."""

    def __init__(self, uri: str, profile: ProfileRef = storage.NO_PROFILE, *,
                 policy: LocationPolicy | None = None) -> None:
        try:
            import zarr

            from .zarr_chunks import BoundedStore, ReferenceStore, RegularFiles, as_async  # (zarr-python's store classes: optional)
        except ImportError:
            raise FragmentReadError("a Zarr fragment needs zarr-python (pip install 'daskcfa[zarr]')",
                                    file=uri) from None

        self.uri = uri
        location = store_uri(uri)
        try:
            if is_reference_set(location):
                store: Any = ReferenceStore(open_reference_set(location, profile, policy=policy), profile)
            elif storage.is_local(location):
                store = zarr.storage.FsspecStore(as_async(RegularFiles()), path=storage.local_path(location),
                                                 read_only=True)
            else:
                fs, path = storage.filesystem(location, profile, policy=policy)
                store = zarr.storage.FsspecStore(as_async(fs), path=path, read_only=True)
            # (daskcfa checks the metadata and decodes the chunks, and the policy every key's URL:
            # see zarr_chunks; a reference set's keys name no file, its targets are checked)
            confined = None if is_reference_set(location) else (location, policy)
            self._store = BoundedStore(store, uri, confined)
            self._group = zarr.open_group(self._store, mode="r")
        except CFAError:
            raise
        except FileNotFoundError:
            raise NotFoundError("not found", file=uri) from None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            if _absent(exc):
                raise NotFoundError("not found", file=uri) from None
            raise FragmentReadError(f"not a readable Zarr store ({type(exc).__name__}: {exc})", file=uri) from None

    def variable(self, name: str, *, text: bool = False) -> "ZarrVariable":
        """The array ``name`` (a path below the root for a variable in a group); KeyError if absent.
        ``text``: string arrays too (their metadata and values, for scanning a store)."""
        import zarr

        path = name.strip("/")
        try:
            array = self._group[path]
        except (KeyError, FileNotFoundError):
            raise KeyError(name) from None
        if not isinstance(array, zarr.Array):
            raise KeyError(name)
        self._store.check_array(path)  # (an array of consolidated metadata daskcfa refused)
        return ZarrVariable(array, path.rsplit("/", 1)[-1], text=text, decoded=self._store.decoded_bytes(path))

    @property
    def attrs(self) -> dict[str, Any]:
        """The root group's attributes, as netCDF global attributes (layout metadata removed)."""
        attrs = dict(self._group.attrs)
        types = _nczarr_types(attrs)
        return netcdf_attributes(_cf_attributes(_without_layout(attrs), None, None, types))

    def names(self) -> list[str]:
        """The root group's arrays, in the store's order."""
        return list(self._group.array_keys())

    def groups(self) -> tuple[str, ...]:
        """The root group's subgroups."""
        return tuple(self._group.group_keys())

    def close(self) -> None:
        """Nothing to release: the store holds no open file between reads."""


def _absent(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "not found" in text or "no such file" in text or "nosuchkey" in text or "404" in text


class ZarrVariable:
    """One Zarr array read as a netCDF variable: raw stored values (native byte order),
    its dimension names and CF attributes (see the module's docstring)."""

    #: Zarr fill values are given as attributes here: netCDF's default fills do not apply
    no_fill = True

    def __init__(self, array: Any, name: str, *, text: bool = False, decoded: int = 0) -> None:
        self._array = array
        self.name = name
        self.shape = tuple(int(n) for n in array.shape)
        stored = np.dtype(array.dtype)
        if text and stored.kind in "USOT":
            stored = np.dtype(object)  # (as netCDF4-python gives strings)
        elif stored.kind not in "biuf":
            raise FragmentReadError(f"Zarr array {name!r} has type {stored}, which daskcfa does not read")
        self.dtype = stored.newbyteorder("=") if stored.kind != "O" else stored
        #: the chunk shape (the array's own chunk grid: what dask chunks of it align to)
        self.chunks = tuple(int(c) for c in (getattr(array, "chunks", None) or self.shape))
        #: bytes of one decoded chunk (Zarr decodes whole chunks; ``decoded``: what daskcfa's bounded
        #: decoder makes of it, in the stored type of its filters, which may be wider)
        self.chunk_nbytes = max(int(math.prod(self.chunks)) * self.dtype.itemsize, decoded)
        attrs = dict(array.attrs)
        self.dims = _dimension_names(array, attrs, len(self.shape), name)
        types = _nczarr_types(attrs)  # (NCZarr: each attribute's netCDF type)
        self.attrs = _cf_attributes(_without_layout(attrs), array, self.dtype if self.dtype.kind != "O" else None,
                                    types)

    def read(self, key: tuple) -> np.ndarray:
        """The raw stored values at ``key`` (one int or step>0 slice per dimension)."""
        normalize_key(key, self.shape)  # (the same checks as the other readers)
        values = np.asarray(self._array[key] if key else self._array[...])
        return values.astype(self.dtype, copy=False)

    def values(self) -> np.ndarray:
        """Every raw stored value (strings as an object array of ``str``)."""
        return self.read(tuple(slice(0, n, 1) for n in self.shape))


def _nczarr(attrs: Mapping[str, Any], key: str) -> dict[str, Any]:
    """NCZarr's layout attribute ``key`` (an object, or absent)."""
    value = attrs.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FragmentReadError(f"NCZarr attribute {key} is not an object ({type(value).__name__})")
    return value


def _nczarr_types(attrs: Mapping[str, Any]) -> dict[str, str]:
    """NCZarr's netCDF type of each attribute (``_nczarr_attr``'s ``types``)."""
    types = _nczarr(attrs, "_nczarr_attr").get("types") or {}
    if not isinstance(types, dict) or not all(isinstance(t, str) for t in types.values()):
        raise FragmentReadError("NCZarr attribute _nczarr_attr's types are not an object of type names")
    return types


def _without_layout(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if k not in _LAYOUT_ATTRS}


def netcdf_attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """CF attributes (:func:`_cf_attributes`) as netCDF can hold them: booleans as bytes (netCDF
    has none), lists of strings as lists of ``str``; what netCDF has no form for (JSON objects,
    null, mixed lists) left out."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if value is None or isinstance(value, dict):
            continue
        if isinstance(value, (np.ndarray, np.generic)):
            if value.dtype.kind == "b":
                value = np.asarray(value, dtype=np.int8)
            elif value.dtype.kind == "U":
                value = [str(v) for v in np.ravel(value)] if np.ndim(value) else str(value)
            elif value.dtype.kind not in "iuf":
                continue
        out[key] = value
    return out


def _dimension_names(array: Any, attrs: Mapping[str, Any], ndim: int, name: str) -> tuple[str, ...]:
    layout = _nczarr(attrs, "_nczarr_array")
    names = getattr(array.metadata, "dimension_names", None) or attrs.get("_ARRAY_DIMENSIONS")
    if names is None:
        references = layout.get("dimension_references")
        if references is not None and (not isinstance(references, list)
                                       or not all(isinstance(r, str) for r in references)):
            raise FragmentReadError(f"Zarr array {name!r}: NCZarr's dimension_references are not a list of names")
        names = [r.rsplit("/", 1)[-1] for r in references] if references else None
    if names is None:  # (dimension names are not significant: fragments are matched by position)
        return tuple(f"dim{k}" for k in range(ndim))
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) or n is None for n in names):
        raise FragmentReadError(f"Zarr array {name!r}: its dimension names are not a list of names")
    names = tuple(f"dim{k}" if n is None else n for k, n in enumerate(names))  # (v3: a name may be null)
    if len(names) != ndim:
        raise FragmentReadError(f"Zarr array {name!r} names {len(names)} dimensions for its {ndim}")
    return names


def _cf_attributes(attrs: dict[str, Any], array: Any, dtype: np.dtype | None, types: Mapping[str, str]
                   ) -> dict[str, Any]:
    """The CF attributes of a Zarr array (or group: ``array`` None), as xarray reads them, in
    netCDF's types: JSON has one number type, and a float32 fill value compared in float64
    would not match."""
    if dtype is not None and dtype.kind in "biuf":
        attrs.update({key: _ieee(attrs[key]) for key in _NUMERIC if key in attrs})
    fill = attrs.get("_FillValue")
    if isinstance(fill, str) and dtype is not None and dtype.kind == "f":  # xarray's encoding of a float fill in Zarr v3
        try:
            attrs["_FillValue"] = struct.unpack("<d", base64.standard_b64decode(fill))[0]
        except (ValueError, struct.error):
            raise FragmentReadError(f"unreadable _FillValue {fill!r}") from None
    elif fill is None and array is not None and getattr(array.metadata, "zarr_format", 3) == 2 \
            and array.fill_value is not None:
        attrs["_FillValue"] = array.fill_value  # (v2: the array's fill value, as xarray reads it)
    for key, value in attrs.items():
        if array is not None and key in _NUMERIC and not _numbers(value) and not (key == "_FillValue" and value is None):
            raise FragmentReadError(f"attribute {key} = {repr(value)[:200]} is not a number or a list of numbers "
                                    "(a null, or a string among numbers: netCDF holds neither)")
        if isinstance(value, (str, dict)) or value is None:
            continue
        typed = _NUMBER_TYPES.get(types.get(key, ""), dtype if key in _IN_DATA_TYPE else None)
        try:
            attrs[key] = np.asarray(value, typed)
        except (TypeError, ValueError, OverflowError):
            raise FragmentReadError(f"attribute {key} = {value!r} does not fit the array's type {dtype}") from None
        if attrs[key].ndim == 0:
            attrs[key] = attrs[key][()]
    return attrs


#: Zarr's spellings of the IEEE values JSON has no number for (NCZarr writes attributes so: ``["NaN", "Infinity"]``)
_IEEE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _ieee(value: Any) -> Any:
    """``value`` (a storage attribute of a numeric variable) with Zarr's spellings of NaN and the
    infinities, alone or in a flat list, as those numbers (any other string stays one)."""
    if isinstance(value, str):
        return _IEEE.get(value, value)
    if isinstance(value, list) and not any(isinstance(item, list) for item in value):
        return [_IEEE.get(item, item) if isinstance(item, str) else item for item in value]
    return value


def _numbers(value: Any) -> bool:
    """Whether a storage attribute's JSON value may stand for netCDF numbers: no null and no string
    among them (numpy took ``[null, 5]`` for NaN and 5, ``[1, "2"]`` for 1 and 2). A string alone
    is left as it was: a char variable's fill value, or xarray's base64 float ``_FillValue``."""
    if value is None:
        return False
    if not isinstance(value, list):
        return True
    pending = list(value)
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif item is None or isinstance(item, str):
            return False
    return True


#: the storage attributes (:data:`~daskcfa.decode.STORAGE_ATTRS`) netCDF holds as numbers (``_Unsigned``: a string)
_NUMERIC = tuple(name for name in STORAGE_ATTRS if name != "_Unsigned")
#: attributes held in the variable's own type (netCDF's rule for _FillValue; the others are compared with values)
_IN_DATA_TYPE = ("_FillValue", "missing_value", "valid_min", "valid_max", "valid_range")
#: NCZarr's attribute types that are numbers
_NUMBER_TYPES = {t: np.dtype(t) for t in ("|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8",
                                          ">i2", ">u2", ">i4", ">u4", ">i8", ">u8", ">f4", ">f8")}


# --------------------------------------------------------------------------
# Writing: a fragment as a self-describing Zarr v2 store
# --------------------------------------------------------------------------

#: ``compression`` settings a Zarr fragment takes (netCDF4-python's names, mapped to numcodecs).
ZARR_COMPRESSION_KEYS = frozenset({"compression", "zlib", "complevel", "shuffle", "chunksizes"})
#: The store's consolidated metadata, written last: a store without it is unfinished.
CONSOLIDATED = ".zmetadata"


def check_zarr_compression(compression: Mapping[str, Any]) -> dict[str, Any]:
    """``compression`` (``createVariable`` keywords) if a Zarr fragment can take it; ArgumentError otherwise.

    Zlib (``compression="zlib"`` or ``zlib=True``) with ``complevel`` (default
    4) and ``shuffle`` (default on), as netCDF-4 compresses: numcodecs' Zlib and
    Shuffle, which xarray and netCDF-C's NCZarr both read; ``chunksizes`` gives
    the Zarr chunks.
    """
    unknown = sorted(set(compression) - ZARR_COMPRESSION_KEYS)
    if unknown:
        raise ArgumentError(f"Zarr fragments take the compression settings {', '.join(sorted(ZARR_COMPRESSION_KEYS))}, "
                            f"not {unknown}")
    if compression.get("compression") not in (None, "zlib"):
        raise ArgumentError(f"Zarr fragments are compressed with zlib only (the codec xarray and netCDF-C's NCZarr "
                            f"both read), not {compression['compression']!r}")
    level = compression.get("complevel", 4)
    if not isinstance(level, (int, np.integer)) or isinstance(level, bool) or not 0 <= level <= 9:
        raise ArgumentError(f"complevel must be an integer from 0 to 9, not {level!r}")
    return dict(compression)


def _array_options(compression: Mapping[str, Any], dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, Any]:
    """zarr-python's ``create_array`` codecs and chunks for ``compression`` (already checked)."""
    import numcodecs

    options: dict[str, Any] = {"compressors": None, "filters": None, "chunks": "auto"}
    if compression.get("compression") == "zlib" or compression.get("zlib"):
        options["compressors"] = [numcodecs.Zlib(level=int(compression.get("complevel", 4)))]
        if compression.get("shuffle", True) and dtype.itemsize > 1:
            options["filters"] = [numcodecs.Shuffle(elementsize=dtype.itemsize)]
    chunks = compression.get("chunksizes")
    if chunks is not None:
        if len(chunks) != len(shape) or any(int(c) < 1 for c in chunks):
            raise ArgumentError(f"chunksizes {tuple(chunks)} do not fit an array of {len(shape)} dimensions")
        # (as given: a fragment shorter than its variable's chunks stores partial edge chunks, so that all
        # fragments share one chunk grid; graph/write.py clips them to a full-size fragment)
        options["chunks"] = tuple(int(c) for c in chunks)
    return options


def _json_value(value: Any) -> Any:
    """An attribute value as JSON holds it (numbers and strings; arrays as lists)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
        return [_json_value(v) for v in value] if isinstance(value, list) else _json_value(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


class StoreWriter:
    """A Zarr v2 store being written on local disk, laid out as xarray and netCDF-C read it:
    ``_ARRAY_DIMENSIONS`` names each array's dimensions, ``_FillValue`` is the array's
    ``fill_value`` (none when the variable has none) and an attribute too (netCDF-C masks
    by the attribute, in the array's type; xarray by either), attributes are JSON, and the
    consolidated metadata (:data:`CONSOLIDATED`) is written by :meth:`finish`, last."""

    def __init__(self, path: str, attrs: Mapping[str, Any]) -> None:
        import zarr

        self.path = path
        self._group = zarr.open_group(zarr.storage.LocalStore(path), mode="w", zarr_format=2,
                                      attributes={k: _json_value(v) for k, v in attrs.items()})

    def array(self, name: str, dims: Sequence[str], shape: tuple[int, ...], dtype: np.dtype,
              attrs: Mapping[str, Any], compression: Mapping[str, Any]) -> Any:
        """A new array (written by assigning to it)."""
        fill = attrs.get("_FillValue")
        if fill is not None:
            fill = np.asarray(fill).astype(dtype).item()
        return self._group.create_array(
            name, shape=shape, dtype=dtype, fill_value=fill, **_array_options(compression, dtype, shape),
            attributes={"_ARRAY_DIMENSIONS": list(dims), **{k: _json_value(v) for k, v in attrs.items()}})

    def finish(self) -> None:
        import zarr

        zarr.consolidate_metadata(self._group.store)


def store_state(uri: str, profile: ProfileRef = storage.NO_PROFILE) -> tuple[int, str]:
    """A finished store's size (every object) and version (its consolidated metadata's, written
    last: NotFoundError while the store is unfinished)."""
    location = store_uri(uri).rstrip("/")
    _, version = storage.stat(f"{location}/{CONSOLIDATED}", profile)
    return storage.tree_size(location, profile), version
