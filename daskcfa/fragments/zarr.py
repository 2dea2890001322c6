"""Fragments stored as Zarr: Zarr v2 or v3 stores and netCDF-C's NCZarr, read with zarr-python.

A fragment is a Zarr store when its URI says so, as netCDF-C spells it
(``file:///d/f0.zarr#mode=nczarr,file``, ``s3://b/f0.zarr#mode=zarr,s3``) or
by the ``.zarr`` suffix of its path (``f0.zarr``, ``s3://b/f0.zarr/``). The
store is reached through the storage layer (credentials by reference, the
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
import re
import struct
from typing import Any, Mapping

import numpy as np

from .. import storage
from ..errors import FragmentReadError, NotFoundError
from ..storage.policy import LocationPolicy
from ..storage.profiles import ProfileRef
from .hdf5 import normalize_key

__all__ = ["is_zarr", "store_uri", "ZarrFile", "ZarrVariable"]

#: netCDF-C's URL fragment naming a Zarr storage mode: ``#mode=nczarr,file``, ``#mode=zarr,s3``, ...
_MODE = re.compile(r"#mode=([^#]*)$")
#: attributes that describe the Zarr or NCZarr layout, not the variable
_LAYOUT_ATTRS = ("_ARRAY_DIMENSIONS", "_nczarr_array", "_nczarr_attr", "_nczarr_group", "_nczarr_superblock")


def _mode(uri: str) -> list[str]:
    match = _MODE.search(uri)
    return match.group(1).split(",") if match else []


def is_zarr(uri: str) -> bool:
    """Whether the fragment at ``uri`` is a Zarr store (its URI says so: a Zarr mode, or ``.zarr``)."""
    if any(m in ("zarr", "nczarr") for m in _mode(uri)):
        return True
    return store_uri(uri).rstrip("/").endswith(".zarr")


def store_uri(uri: str) -> str:
    """The store's own URI (netCDF-C's ``#mode=...`` removed)."""
    return _MODE.sub("", uri)


class ZarrFile:
    """An open Zarr store holding a fragment's variable (the store's root group)."""

    def __init__(self, uri: str, profile: ProfileRef = storage.NO_PROFILE, *,
                 policy: LocationPolicy | None = None) -> None:
        try:
            import zarr
        except ImportError:
            raise FragmentReadError("a Zarr fragment needs zarr-python (pip install 'daskcfa[zarr]')",
                                    file=uri) from None

        self.uri = uri
        location = store_uri(uri)
        try:
            if storage.is_local(location):
                path = storage.local_path(location)
                store: Any = zarr.storage.LocalStore(path, read_only=True)
            else:
                fs, path = storage.filesystem(location, profile, policy=policy)
                store = zarr.storage.FsspecStore(_async(fs), path=path, read_only=True)
            self._group = zarr.open_group(store, mode="r")
        except FileNotFoundError:
            raise NotFoundError("not found", file=uri) from None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            if _absent(exc):
                raise NotFoundError("not found", file=uri) from None
            raise FragmentReadError(f"not a readable Zarr store ({type(exc).__name__}: {exc})", file=uri) from None

    def variable(self, name: str) -> "ZarrVariable":
        """The array ``name`` (a path below the root for a variable in a group); KeyError if absent."""
        import zarr

        path = name.strip("/")
        try:
            array = self._group[path]
        except (KeyError, FileNotFoundError):
            raise KeyError(name) from None
        if not isinstance(array, zarr.Array):
            raise KeyError(name)
        return ZarrVariable(array, path.rsplit("/", 1)[-1])

    def close(self) -> None:
        """Nothing to release: the store holds no open file between reads."""


def _async(fs: Any) -> Any:
    """``fs`` as zarr-python's store wants it (asynchronous), its requests still made on fsspec's
    own event loop, with the rest of daskcfa's I/O (zarr runs a loop of its own: an s3fs or
    HTTP session bound to one loop cannot serve the other)."""
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper

    return AsyncFileSystemWrapper(fs, asynchronous=True)


def _absent(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "not found" in text or "no such file" in text or "nosuchkey" in text or "404" in text


class ZarrVariable:
    """One Zarr array read as a netCDF variable: raw stored values (native byte order),
    its dimension names and CF attributes (see the module's docstring)."""

    #: Zarr fill values are given as attributes here: netCDF's default fills do not apply
    no_fill = True

    def __init__(self, array: Any, name: str) -> None:
        self._array = array
        self.name = name
        self.shape = tuple(int(n) for n in array.shape)
        stored = np.dtype(array.dtype)
        if stored.kind not in "biuf":
            raise FragmentReadError(f"Zarr array {name!r} has type {stored}, which daskcfa does not read")
        self.dtype = stored.newbyteorder("=")
        chunks = getattr(array, "chunks", None) or self.shape
        #: bytes of one decoded chunk (Zarr decodes whole chunks)
        self.chunk_nbytes = int(math.prod(chunks)) * self.dtype.itemsize
        attrs = dict(array.attrs)
        self.dims = _dimension_names(array, attrs, len(self.shape), name)
        types = (attrs.get("_nczarr_attr") or {}).get("types") or {}  # (NCZarr: each attribute's netCDF type)
        for key in _LAYOUT_ATTRS:
            attrs.pop(key, None)
        self.attrs = _cf_attributes(attrs, array, self.dtype, types)

    def read(self, key: tuple) -> np.ndarray:
        """The raw stored values at ``key`` (one int or step>0 slice per dimension)."""
        normalize_key(key, self.shape)  # (the same checks as the other readers)
        values = np.asarray(self._array[key] if key else self._array[...])
        return values.astype(self.dtype, copy=False)


def _dimension_names(array: Any, attrs: Mapping[str, Any], ndim: int, name: str) -> tuple[str, ...]:
    names = getattr(array.metadata, "dimension_names", None) or attrs.get("_ARRAY_DIMENSIONS")
    if names is None:
        references = (attrs.get("_nczarr_array") or {}).get("dimension_references")
        names = [r.rsplit("/", 1)[-1] for r in references] if references else None
    if names is None:  # (dimension names are not significant: fragments are matched by position)
        return tuple(f"dim{k}" for k in range(ndim))
    names = tuple(str(n) for n in names)
    if len(names) != ndim:
        raise FragmentReadError(f"Zarr array {name!r} names {len(names)} dimensions for its {ndim}")
    return names


def _cf_attributes(attrs: dict[str, Any], array: Any, dtype: np.dtype, types: Mapping[str, str]) -> dict[str, Any]:
    """The CF attributes of a Zarr array, as xarray reads them, in netCDF's types: JSON has
    one number type, and a float32 fill value compared in float64 would not match."""
    fill = attrs.get("_FillValue")
    if isinstance(fill, str) and dtype.kind == "f":  # xarray's encoding of a float fill in Zarr v3
        try:
            attrs["_FillValue"] = struct.unpack("<d", base64.standard_b64decode(fill))[0]
        except (ValueError, struct.error):
            raise FragmentReadError(f"unreadable _FillValue {fill!r}") from None
    elif fill is None and getattr(array.metadata, "zarr_format", 3) == 2 and array.fill_value is not None:
        attrs["_FillValue"] = array.fill_value  # (v2: the array's fill value, as xarray reads it)
    for key, value in attrs.items():
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


#: attributes held in the variable's own type (netCDF's rule for _FillValue; the others are compared with values)
_IN_DATA_TYPE = ("_FillValue", "missing_value", "valid_min", "valid_max", "valid_range")
#: NCZarr's attribute types that are numbers
_NUMBER_TYPES = {t: np.dtype(t) for t in ("|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8",
                                          ">i2", ">u2", ">i4", ">u4", ">i8", ">u8", ">f4", ">f8")}
