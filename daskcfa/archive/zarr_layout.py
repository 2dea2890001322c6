"""Where a Zarr fragment's chunks lie, for :func:`daskcfa.to_references`.

Each chunk of a Zarr array is an object of its own, so a reference to it is the
object's URL, offset 0 and its length; an absent chunk reads as the array's
fill value, as in the array the references present. The metadata (v2's
``.zarray``, which netCDF-C's NCZarr writes too, or v3's ``zarr.json``) is
read here as JSON, checked, and given as the codecs of a Zarr v2 array, the
form the exported reference set takes: only codecs every Zarr reader decodes,
lossless ones, so that the exported array reads what the fragment holds.
The store is listed once (the chunk objects and their sizes); metadata larger
than :data:`MAX_METADATA` is refused before it is read.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import storage
from ..errors import NotFoundError, ReferencesError
from ..fragments.layout import StoredLayout
from ..fragments.zarr import store_uri
from ..storage.policy import LocationPolicy

__all__ = ["ZarrLayout", "zarr_layout", "MAX_METADATA"]

#: The largest metadata object read (a store's consolidated metadata included).
MAX_METADATA = 16 << 20
#: Zarr v2 codecs (numcodecs ids) the export carries: lossless, decoded by every Zarr reader.
_V2_CODECS = frozenset({"zlib", "gzip", "bz2", "lzma", "zstd", "blosc", "lz4", "shuffle", "delta", "fletcher32"})
#: Zarr v3 bytes-to-bytes codecs, as the v2 codec that decodes them.
_V3_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


@dataclass(frozen=True)
class ZarrLayout:
    """A Zarr array's storage as references see it: its chunks (``layout``, byte offsets 0), each
    chunk's object (``objects``, in ``layout``'s row order) and its v2 codecs."""

    layout: StoredLayout
    objects: tuple[str, ...]
    filters: tuple[dict[str, Any], ...]
    compressor: dict[str, Any] | None


def zarr_layout(uri: str, names: Sequence[str], profile: storage.ProfileRef = storage.NO_PROFILE, *,
                policy: LocationPolicy | None = None) -> ZarrLayout:
    """The layout of the array at the first of ``names`` in the Zarr store at ``uri``.

    NotFoundError when the store or none of the arrays exists; ReferencesError (its reason
    saying why) when the array cannot be presented as a Zarr v2 array of references.
    """
    location = store_uri(uri).rstrip("/")
    try:
        sizes = storage.tree_sizes(location + "/", profile, policy=policy)
    except NotFoundError:  # (the store was opened: it exists, but lists no object)
        raise ReferencesError("the Zarr store cannot be listed (its chunk objects are found by listing it; an "
                              "HTTP server lists none)") from None
    for name in names:
        path = name.strip("/")
        for key, parse in ((f"{path}/.zarray", _v2), (f"{path}/zarr.json", _v3)):
            if key in sizes:
                return _chunks(location, path, _parsed(parse, _json(location, key, sizes, profile, policy), key),
                               sizes)
    raise NotFoundError(f"no array {' or '.join(map(repr, names))} in the Zarr store", file=uri)


@dataclass(frozen=True)
class _Meta:
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    fill_value: Any
    filters: tuple[dict[str, Any], ...]
    compressor: dict[str, Any] | None
    prefix: str  #: of every chunk key (v3's default encoding: ``c/``)
    separator: str  #: between a chunk key's indices


def _json(location: str, name: str, sizes: dict[str, int], profile: storage.ProfileRef,
          policy: LocationPolicy | None) -> dict[str, Any]:
    if sizes[name] > MAX_METADATA:
        raise ReferencesError(f"Zarr metadata {name!r} of {sizes[name]:,} bytes (at most {MAX_METADATA:,} are read)")
    try:
        value = json.loads(storage.read_bytes(f"{location}/{name}", profile, known_size=sizes[name], policy=policy,
                                              max_bytes=MAX_METADATA))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReferencesError(f"Zarr metadata {name!r} is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ReferencesError(f"Zarr metadata {name!r} is not a JSON object")
    return value


def _parsed(parse: Any, meta: dict[str, Any], name: str) -> "_Meta":
    """``parse(meta)``, whatever shape of JSON the metadata has: a ReferencesError when malformed."""
    try:
        return parse(meta)
    except ReferencesError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, OverflowError) as exc:
        raise ReferencesError(f"malformed Zarr metadata {name!r} ({type(exc).__name__}: {exc})") from None


def _shape(value: Any, what: str, ndim: int | None = None) -> tuple[int, ...]:
    if not isinstance(value, list) or any(type(n) is not int or n < 0 for n in value) \
            or (ndim is not None and len(value) != ndim):
        raise ReferencesError(f"Zarr metadata: {what} {value!r} is not a list of sizes")
    return tuple(value)


def _dtype(value: Any) -> np.dtype:
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        raise ReferencesError(f"Zarr data type {value!r} is not one daskcfa reads") from None
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.shape:
        raise ReferencesError(f"Zarr data type {value!r}: only numbers are exported")
    return dtype


def _v2(meta: dict[str, Any]) -> _Meta:
    shape = _shape(meta.get("shape"), "shape")
    chunks = _shape(meta.get("chunks"), "chunks", len(shape))
    if meta.get("order", "C") != "C":
        raise ReferencesError("Zarr array in Fortran order (a Zarr v2 array of references is in C order here)")
    dtype = _dtype(meta.get("dtype"))
    codecs = list(meta.get("filters") or []) + ([meta["compressor"]] if meta.get("compressor") else [])
    for codec in codecs:
        if not isinstance(codec, dict):
            raise ReferencesError(f"Zarr codec {codec!r} is not a codec's configuration (a JSON object)")
        if codec.get("id") not in _V2_CODECS:
            raise ReferencesError(f"Zarr codec {codec.get('id')!r} is not exported (only {', '.join(sorted(_V2_CODECS))})")
        if codec["id"] == "shuffle" and not (type(codec.get("elementsize", 4)) is int and codec.get("elementsize", 4) >= 1):
            # (netCDF-C's NCZarr writes elementsize 0 and shuffles by the type's size: Zarr readers then unshuffle nothing)
            raise ReferencesError(f"Zarr shuffle of elementsize {codec.get('elementsize')!r}, not a size of at least "
                                  "1: Zarr readers would not unshuffle what it shuffled")
    separator = meta.get("dimension_separator", ".")
    if separator not in (".", "/"):
        raise ReferencesError(f"Zarr dimension_separator {separator!r}")
    filters = tuple(meta.get("filters") or ())
    return _Meta(dtype, shape, chunks, _fill_value(meta.get("fill_value"), dtype), filters,
                 meta.get("compressor") or None, "", separator)


def _v3(meta: dict[str, Any]) -> _Meta:
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise ReferencesError("Zarr v3 metadata that is not an array's")
    shape = _shape(meta.get("shape"), "shape")
    grid = meta.get("chunk_grid") or {}
    if grid.get("name") != "regular":
        raise ReferencesError(f"Zarr chunk grid {grid.get('name')!r} (only regular grids are exported)")
    chunks = _shape((grid.get("configuration") or {}).get("chunk_shape"), "chunk_shape", len(shape))
    encoding = meta.get("chunk_key_encoding") or {"name": "default"}
    separator = (encoding.get("configuration") or {}).get("separator", "/" if encoding.get("name") == "default" else ".")
    if encoding.get("name") not in ("default", "v2") or separator not in (".", "/"):
        raise ReferencesError(f"Zarr chunk key encoding {encoding!r}")
    prefix = "c" + separator if encoding["name"] == "default" else ""
    codecs = list(meta.get("codecs") or [])
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs]
    if not names or names[0] != "bytes" or len(names) > 2:
        raise ReferencesError(f"Zarr codecs {names} (exported: 'bytes', then at most one of gzip, zstd, blosc)")
    endian = (codecs[0].get("configuration") or {}).get("endian", "little")
    dtype = _dtype(meta.get("data_type")).newbyteorder("<" if endian == "little" else ">")
    compressor = _v3_compressor(codecs[1]) if len(codecs) > 1 else None
    return _Meta(dtype, shape, chunks, _fill_value(meta.get("fill_value"), dtype), (), compressor, prefix, separator)


def _v3_compressor(codec: dict[str, Any]) -> dict[str, Any]:
    name, config = codec.get("name"), codec.get("configuration") or {}
    if name == "gzip":
        return {"id": "gzip", "level": int(config.get("level", 5))}
    if name == "zstd":
        return {"id": "zstd", "level": int(config.get("level", 0))}
    if name == "blosc" and config.get("shuffle", "noshuffle") in _V3_BLOSC_SHUFFLE:
        return {"id": "blosc", "cname": str(config.get("cname", "lz4")), "clevel": int(config.get("clevel", 5)),
                "shuffle": _V3_BLOSC_SHUFFLE[config.get("shuffle", "noshuffle")],
                "blocksize": int(config.get("blocksize", 0))}
    raise ReferencesError(f"Zarr codec {name!r} is not exported (only gzip, zstd and blosc after 'bytes')")


def _fill_value(value: Any, dtype: np.dtype) -> Any:
    """A fill value as the metadata spells it (a number; NaN and infinities by name; v3's raw bits in hex) in ``dtype``."""
    if value is None:
        return None
    named = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
    try:
        if isinstance(value, str) and value in named:
            return np.asarray(named[value]).astype(dtype)[()]
        if isinstance(value, str) and re.fullmatch(r"0x[0-9a-fA-F]+", value):
            raw = int(value, 16).to_bytes(dtype.itemsize, "big")
            return np.frombuffer(raw, dtype.newbyteorder(">"))[0].astype(dtype)
        if isinstance(value, (int, float)):
            return np.asarray(value).astype(dtype)[()]
    except (ValueError, TypeError, OverflowError):
        pass
    raise ReferencesError(f"Zarr fill_value {value!r} is not a {dtype}")


def _chunks(location: str, path: str, meta: _Meta, sizes: dict[str, int]) -> ZarrLayout:
    """The array's chunk objects found in the listing (absent ones read as the fill value), in
    chunk order; objects that are no chunk of the array are not (as Zarr ignores them)."""
    if any(c < 1 for c in meta.chunks):
        raise ReferencesError(f"Zarr chunks {meta.chunks}")
    counts = [math.ceil(n / c) for n, c in zip(meta.shape, meta.chunks)]
    found = {}
    below = f"{path}/{meta.prefix}"
    for name, size in sizes.items():
        index = _index(name[len(below):], meta.separator, counts) if name.startswith(below) else None
        if index is not None:
            found[index] = (name, size)
    ordered = sorted(found)
    n = len(ordered)
    layout = StoredLayout(
        dtype=meta.dtype, shape=meta.shape, chunks=meta.chunks, filters=(), fill_value=meta.fill_value,
        starts=np.array([[i * c for i, c in zip(index, meta.chunks)] for index in ordered], np.int64).reshape(
            n, len(meta.shape)),
        byte_offsets=np.zeros(n, np.int64), sizes=np.array([found[i][1] for i in ordered], np.int64),
        filter_masks=np.zeros(n, np.int64))
    return ZarrLayout(layout, tuple(f"{location}/{found[i][0]}" for i in ordered), meta.filters, meta.compressor)


def _index(key: str, separator: str, counts: list[int]) -> tuple[int, ...] | None:
    """A chunk key's indices, if it names a chunk of an array of ``counts`` chunks per dimension."""
    if not counts:
        return () if key in ("0", "c", "") else None
    parts = key.split(separator)
    if len(parts) != len(counts) or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    index = tuple(int(p) for p in parts)
    return index if all(i < n for i, n in zip(index, counts)) else None
