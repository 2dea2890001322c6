"""Zarr metadata checked and chunks decoded by daskcfa, before zarr-python sees them.

A Zarr store or reference set is untrusted input. zarr-python would decode
a chunk with whatever codec its metadata names (numcodecs' ``pickle``
included, when allowed) and inflate it as far as its stream goes: a 160-byte
chunk may inflate to gigabytes. So every store is read through
:class:`BoundedStore`, which

* checks each array's metadata (``.zarray``, ``zarr.json``, and the arrays
  of consolidated metadata) against daskcfa's allow-list -- numeric and
  fixed-size text types; the compressors of :data:`~.codecs.COMPRESSORS`;
  the element-wise filters of :data:`FILTERS` (v2) and ``transpose`` and
  ``bytes`` (v3) -- refusing anything else by name (object types, ``pickle``,
  ``vlen-*``, sharding, unknown codecs), and hands zarr-python the metadata
  without its compressor;
* reads each chunk's stored bytes no further than a compressed chunk of its
  size can take, and decodes it with daskcfa's bounded decoder to exactly its
  declared size (a stream inflating further is refused, never inflated);
  zarr-python then applies only the element-wise steps to bytes of that size.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable

import numpy as np
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
from fsspec.implementations.local import LocalFileSystem
from zarr.abc.store import ByteRequest, RangeByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from .. import storage
from ..errors import CFAError, FragmentReadError, NotFoundError, StorageError, redact
from .. import limits
from ..storage.policy import LocationPolicy
from ..storage import timed
from ..storage.profiles import ProfileRef
from .codecs import COMPRESSORS
from .reference_sets import METADATA_NAMES, ReferenceSet, Target

__all__ = ["BoundedStore", "ReferenceStore", "RegularFiles", "as_async", "FILTERS", "V3_TYPES"]

#: numcodecs filters (Zarr v2) undone by zarr-python after the bounded decoder: element-wise,
#: their output no larger than the array's chunk -> the parameter naming the type they store.
FILTERS: dict[str, str | None] = {"shuffle": None, "bitround": None, "delta": "astype", "fixedscaleoffset": "astype",
                                  "quantize": "astype", "astype": "encode_dtype"}
#: Zarr v3 data types read (numbers and booleans; strings and extensions are refused).
V3_TYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                      "float16", "float32", "float64"})
#: Bytes a compressed chunk may take beyond its decoded size (every allowed compressor's worst case is
#: well below: zlib ~0.03 %, zstd ~0.4 %, lz4 ~0.4 %, bzip2 ~1 %, blosc 16 bytes per block).
_SLACK_FRACTION, _SLACK_BYTES = 32, 4096


@dataclass(frozen=True)
class ChunkPlan:
    """How one array's chunks are decoded: ``size`` bytes each, from at most ``stored`` bytes."""

    array: str
    size: int
    compressor: str | None

    @property
    def stored(self) -> int:
        """The most bytes a chunk may store: its size raw, or its size and the worst expansion compressed."""
        return self.size if self.compressor is None else self.size + self.size // _SLACK_FRACTION + _SLACK_BYTES

    def decode(self, raw: bytes, key: str) -> bytes:
        """The chunk ``key``'s ``size`` bytes from its stored ``raw`` bytes (FragmentReadError otherwise)."""
        if len(raw) > self.stored:
            raise FragmentReadError(f"Zarr chunk {key!r} stores more than {self.stored:,} bytes, more than a chunk "
                                    f"of {self.size:,} bytes can take")
        if self.compressor is None:
            out: bytes | np.ndarray = raw
        else:
            try:
                out = COMPRESSORS[self.compressor](raw, self.size)
            except OSError as exc:
                raise FragmentReadError(f"Zarr chunk {key!r}: {exc}") from None
        if len(out) != self.size:
            raise FragmentReadError(f"Zarr chunk {key!r} holds {len(out):,} bytes, expected {self.size:,}")
        return bytes(out) if isinstance(out, np.ndarray) else out


def _refuse(array: str, why: str) -> FragmentReadError:
    return FragmentReadError(f"Zarr array {array or '/'!r} refused: {why}")


def _ints(value: Any, array: str, what: str, least: int) -> list[int]:
    if not isinstance(value, list) or any(not isinstance(n, int) or isinstance(n, bool) or n < least
                                          for n in value):
        raise _refuse(array, f"{what} must be a list of integers >= {least}, not {redact(str(value))[:80]}")
    if math.prod(value) > limits.max_elements():
        raise _refuse(array, f"{what} {value} holds more than {limits.max_elements():,} elements "
                             "(dask config 'daskcfa.limits.max-elements')")
    return value


def _v2_type(spec: Any, array: str, what: str) -> np.dtype:
    if not isinstance(spec, str):
        raise _refuse(array, f"{what} {redact(str(spec))[:80]} is not a plain type (daskcfa does not read structured types)")
    try:
        dtype = np.dtype(spec)
    except (TypeError, ValueError):
        raise _refuse(array, f"unknown {what} {spec!r}") from None
    if dtype.kind == "O":
        raise _refuse(array, f"{what} {spec!r} is an object type, which daskcfa never decodes")
    if dtype.kind not in "biufSU" or dtype.itemsize == 0:
        raise _refuse(array, f"{what} {spec!r} is not a type daskcfa reads")
    return dtype


def _shuffle(codec: dict[str, Any], stored: np.dtype, array: str) -> dict[str, Any]:
    """A shuffle filter as numcodecs undoes it. netCDF-C's NCZarr records ``elementsize: 0`` and
    shuffles by the stored type's size (numcodecs would unshuffle nothing: every value wrong)."""
    size = codec.get("elementsize", 4)  # (numcodecs' default)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _refuse(array, f"shuffle elementsize {redact(str(size))[:40]!r} is not an integer >= 0, "
                             "which daskcfa needs")
    return {**codec, "elementsize": size or stored.itemsize}


def _codec_id(codec: Any, array: str, key: str) -> str:
    name = codec.get(key) if isinstance(codec, dict) else codec if isinstance(codec, str) else None
    if not isinstance(name, str):
        raise _refuse(array, f"codec {redact(str(codec))[:80]} has no name")
    return name


def _v2_array(meta: Any, array: str) -> tuple[dict[str, Any], ChunkPlan]:
    if not isinstance(meta, dict) or meta.get("zarr_format") != 2:
        raise _refuse(array, "its .zarray is not a Zarr v2 array's metadata")
    shape = _ints(meta.get("shape"), array, "shape", 0)
    chunks = _ints(meta.get("chunks"), array, "chunks", 1)
    if len(chunks) != len(shape):
        raise _refuse(array, f"chunks {chunks} do not fit shape {shape}")
    stored = _v2_type(meta.get("dtype"), array, "dtype")
    filters = meta.get("filters") or []
    if not isinstance(filters, list):
        raise _refuse(array, "its filters are not a list")
    compressors = [_codec_id(c, array, "id") for c in (*filters[-1:], meta.get("compressor"))
                   if c is not None and _codec_id(c, array, "id") in COMPRESSORS]
    if len(compressors) > 1:  # (kerchunk lists HDF5's deflate as the last filter, the compressor then null)
        raise _refuse(array, "it is compressed twice (a compressor as its last filter and as its compressor)")
    elementwise = list(filters[:-1] if compressors and meta.get("compressor") is None else filters)
    for k, codec in enumerate(elementwise):
        name = _codec_id(codec, array, "id")
        if not isinstance(codec, dict):
            raise _refuse(array, f"filter {name!r} is not a codec object, as daskcfa reads filters")
        if name not in FILTERS:
            raise _refuse(array, f"filter {name!r} is not one daskcfa decodes (allowed before the compressor: "
                                 f"{', '.join(FILTERS)})")
        param = FILTERS[name]
        if param is not None and codec.get(param) is not None:
            stored = _v2_type(codec[param], array, f"{name} filter's {param}")
        if name == "shuffle":
            elementwise[k] = _shuffle(codec, stored, array)
    compressor = meta.get("compressor")
    name = None if compressor is None else _codec_id(compressor, array, "id")
    if name is not None and name not in COMPRESSORS:
        raise _refuse(array, f"compressor {name!r} is not one daskcfa decodes within a bound "
                             f"(allowed: {', '.join(COMPRESSORS)})")
    name = compressors[0] if compressors else None
    meta = {**meta, "compressor": None, "filters": elementwise or None}
    return meta, ChunkPlan(array, math.prod(chunks) * stored.itemsize, name)


def _v3_array(meta: dict[str, Any], array: str) -> tuple[dict[str, Any], ChunkPlan]:
    shape = _ints(meta.get("shape"), array, "shape", 0)
    data_type = meta.get("data_type")
    if not isinstance(data_type, str) or data_type not in V3_TYPES:  # (also a configured type: an object)
        raise _refuse(array, f"data type {redact(str(data_type))[:80]!r} is not one daskcfa reads "
                             f"({', '.join(sorted(V3_TYPES))})")
    grid = meta.get("chunk_grid")
    if not isinstance(grid, dict) or grid.get("name") != "regular" or not isinstance(grid.get("configuration"), dict):
        raise _refuse(array, "its chunk grid is not a regular grid")
    chunks = _ints(grid["configuration"].get("chunk_shape"), array, "chunk_shape", 1)
    if len(chunks) != len(shape):
        raise _refuse(array, f"chunk_shape {chunks} does not fit shape {shape}")
    if meta.get("storage_transformers"):
        raise _refuse(array, "storage transformers are not read")
    codecs = meta.get("codecs")
    if not isinstance(codecs, list):
        raise _refuse(array, "its codecs are not a list")
    kept, compressors, seen_bytes = [], [], False
    for codec in codecs:
        name = _codec_id(codec, array, "name")
        short = name.removeprefix("numcodecs.")
        if name == "transpose" and not seen_bytes:
            kept.append(codec)
        elif name == "bytes" and not seen_bytes:
            kept.append(codec)
            seen_bytes = True
        elif short in COMPRESSORS and seen_bytes:
            compressors.append(short)
        else:
            raise _refuse(array, f"codec {name!r} is not one daskcfa decodes within a bound (allowed: transpose, "
                                 f"bytes, then one of {', '.join(COMPRESSORS)})")
    if not seen_bytes or len(compressors) > 1:
        raise _refuse(array, "its codecs are not 'bytes' followed by at most one compressor")
    itemsize = np.dtype(data_type).itemsize
    return {**meta, "codecs": kept}, ChunkPlan(array, math.prod(chunks) * itemsize,
                                               compressors[0] if compressors else None)


def _join(prefix: str, path: str) -> str:
    return "/".join(p for p in (prefix.strip("/"), path.strip("/")) if p)


def checked_metadata(key: str, data: bytes, plans: dict[str, ChunkPlan | FragmentReadError]) -> bytes:
    """The metadata document ``key`` as zarr-python is given it (compressors removed), its arrays'
    plans recorded in ``plans``; FragmentReadError for what daskcfa does not read."""
    name = key.rsplit("/", 1)[-1]
    prefix = key[: -len(name)].strip("/")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeError, RecursionError) as exc:
        raise FragmentReadError(f"Zarr metadata {key!r} is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise FragmentReadError(f"Zarr metadata {key!r} is not a JSON object")
    if name == ".zarray":
        doc, plans[prefix] = _v2_array(doc, prefix)
    elif name == ".zmetadata":
        inner = doc.get("metadata")
        if not isinstance(inner, dict):
            raise FragmentReadError(f"Zarr metadata {key!r} holds no 'metadata' object")
        for member, meta in list(inner.items()):
            if isinstance(member, str) and member.rsplit("/", 1)[-1] == ".zarray":
                path = _join(prefix, member[: -len(".zarray")])
                inner[member] = _member(meta, path, plans, _v2_array)
    elif name == "zarr.json":
        doc = _v3_node(doc, prefix, plans)
    return json.dumps(doc).encode()


def _member(meta: Any, path: str, plans: dict[str, ChunkPlan | FragmentReadError], check: Any) -> Any:
    """An array of consolidated metadata, checked: refused, it stays as it is (zarr-python may list
    it beside the others) and its refusal is raised when it is opened or a chunk of it read."""
    try:
        meta, plans[path] = check(meta, path)
    except FragmentReadError as exc:
        plans[path] = exc
    return meta


def _v3_node(doc: dict[str, Any], path: str, plans: dict[str, ChunkPlan | FragmentReadError]) -> dict[str, Any]:
    if doc.get("node_type") == "array":
        doc, plans[path] = _v3_array(doc, path)
        return doc
    consolidated = doc.get("consolidated_metadata")
    if isinstance(consolidated, dict) and isinstance(consolidated.get("metadata"), dict):
        members = consolidated["metadata"]
        for member, meta in list(members.items()):
            if isinstance(meta, dict) and meta.get("node_type") == "array":
                members[member] = _member(meta, _join(path, str(member)), plans, _v3_array)
    return doc


class BoundedStore(WrapperStore[Store]):
    """A read-only Zarr store whose metadata daskcfa checked and whose chunks daskcfa decoded
    (see the module's docstring); ``where`` names the store in errors. ``confined``: the store's
    URL and the read's policy, which every key's URL must pass before it is read (a key is a
    path: ``..%2f`` in it climbs out of the store on an HTTP server that decodes it, and a
    link inside a local store may lead anywhere)."""

    def __init__(self, store: Store, where: str, confined: tuple[str, LocationPolicy | None] | None = None) -> None:
        super().__init__(store)
        self._where, self._confined = where, confined
        self._plans: dict[str, ChunkPlan | FragmentReadError] = {}  # array path -> plan, or why it is refused

    def _with_store(self, store: Store) -> "BoundedStore":
        return type(self)(store, self._where, self._confined)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
                  ) -> Buffer | None:
        try:
            if self._confined is not None and self._confined[1] is not None:
                location, policy = self._confined
                policy.check(f"{location.rstrip('/')}/{key}")
            if key.rsplit("/", 1)[-1] in METADATA_NAMES:
                bound = limits.max_json_bytes()
                found = await self._store.get(key, prototype, RangeByteRequest(0, bound + 1))
                if found is None:
                    return None
                data = found.to_bytes()
                if len(data) > bound:
                    raise FragmentReadError(f"Zarr metadata {key!r} is larger than daskcfa reads ({bound:,} bytes: "
                                            f"dask config 'daskcfa.limits.max-memory' / {limits.JSON_EXPANSION})")
                return prototype.buffer.from_bytes(checked_metadata(key, data, self._plans))
            plan = self._plan_of(key)
            if byte_range is not None:
                raise FragmentReadError(f"Zarr chunk {key!r} asked for in part (sharded arrays are not read)")
            found = await self._store.get(key, prototype, RangeByteRequest(0, plan.stored + 1))
            if found is None:
                return None
            return prototype.buffer.from_bytes(plan.decode(found.to_bytes(), key))
        except CFAError as exc:
            raise exc.located(file=self._where)

    def decoded_bytes(self, path: str) -> int:
        """Bytes the bounded decoder makes of one chunk of the array at ``path`` (0 if unknown):
        a filter's stored type (``astype``, ``delta``...) may be wider than the array's own."""
        plan = self._plans.get(path.strip("/"))
        return plan.size if isinstance(plan, ChunkPlan) else 0

    def check_array(self, path: str) -> None:
        """Raise the refusal of the array at ``path``, if daskcfa refused its metadata."""
        plan = self._plans.get(path.strip("/"))
        if isinstance(plan, FragmentReadError):
            raise FragmentReadError(plan.reason, file=self._where)

    def _plan_of(self, key: str) -> ChunkPlan:
        parts = key.split("/")
        for n in range(len(parts) - 1, -1, -1):
            plan = self._plans.get("/".join(parts[:n]))
            if isinstance(plan, FragmentReadError):
                raise FragmentReadError(plan.reason, file=self._where)
            if plan is not None:
                return plan
        raise FragmentReadError(f"Zarr key {key!r} belongs to no array whose metadata daskcfa checked")

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]


class ReferenceStore(Store):
    """A reference set (:class:`~.reference_sets.ReferenceSet`) as a read-only Zarr store: inline
    bytes, or the target's bytes read through the storage layer (the read's policy and profile)."""

    supports_writes = False
    supports_deletes = False
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, refs: ReferenceSet, profile: ProfileRef) -> None:
        super().__init__(read_only=True)
        self._refs, self._profile, self._policy = refs, profile, refs.policy

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReferenceStore) and other._refs is self._refs

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
                  ) -> Buffer | None:
        data = await asyncio.to_thread(self._read, key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    def _read(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        entry = self._refs.metadata().get(key)
        if entry is None:
            entry = self._refs.entry(key)
        if entry is None:
            return None
        limit = byte_range.end if isinstance(byte_range, RangeByteRequest) and byte_range.start == 0 else None
        if byte_range is not None and limit is None:
            raise FragmentReadError(f"reference {key!r} asked for in part", file=self._refs.uri)
        if isinstance(entry, bytes):
            return entry if limit is None else entry[:limit]
        return self._target(key, entry, limit)

    def _target(self, key: str, target: Target, limit: int | None) -> bytes:
        if storage.is_local(target.url):
            try:  # (regular files only: a FIFO would block the read)
                storage.local_stat(target.url)
            except CFAError as exc:  # (never None: zarr would read it as a chunk not written)
                raise FragmentReadError(f"reference {key!r}: {exc.reason}", file=self._refs.uri) from None
        length = target.length
        if length is None:
            length = storage.size(target.url, self._profile, policy=self._policy) - target.offset
        if limit is not None:
            length = min(length, limit)
        if length <= 0:
            return b""
        return storage.read_ranges(target.url, [(target.offset, length)], self._profile, policy=self._policy)[0]

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def exists(self, key: str) -> bool:
        return key in self._refs.metadata() or await asyncio.to_thread(self._refs.entry, key) is not None

    async def set(self, key: str, value: Buffer) -> None:
        raise FragmentReadError("a reference set is read only", file=self._refs.uri)

    async def delete(self, key: str) -> None:
        raise FragmentReadError("a reference set is read only", file=self._refs.uri)

    async def list(self) -> AsyncIterator[str]:
        for key in self._refs.keys():
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in self._refs.keys():
            if key.startswith(prefix):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        seen: set[str] = set()
        for key in self._refs.keys():
            if key.startswith(prefix):
                child = key[len(prefix):].split("/", 1)[0]
                if child not in seen:
                    seen.add(child)
                    yield child


class RegularFiles(LocalFileSystem):
    """A local store's files, opened only when they are regular files (a FIFO would block the
    read, a device such as ``/dev/zero`` never ends), as every local fragment file is."""

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            try:
                storage.local_stat(self._strip_protocol(path))
            except NotFoundError:
                raise  # (a chunk never written: the array's fill value, as Zarr defines)
            except StorageError as exc:  # (a fact about the fragment, as for a fragment file)
                raise FragmentReadError(exc.reason, file=exc.file) from None
        return super()._open(path, mode, **kwargs)


class _Timed(AsyncFileSystemWrapper):
    """An S3 or HTTP(S) filesystem whose reads of an object for zarr-python's store -- its bytes
    (the ranges :class:`BoundedStore` asks for; HTTP's read no further than the range), a HEAD -- are
    each made within the body deadline of every other remote read (:mod:`..storage.timed`): fsspec's
    own calls set none."""

    def _wrap_all_sync_methods(self) -> None:
        super()._wrap_all_sync_methods()
        fs = self.sync_fs

        def within(path: str, length: int, receive: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
            return asyncio.to_thread(timed.bounded, fs, fs.unstrip_protocol(path), length, receive)

        async def cat_file(path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
            length = 0 if end is None else max(0, end - (start or 0))  # (0: a grace, no body to wait for)
            if timed.is_http(fs) and start is not None and end is not None and start >= 0 and not kwargs:
                async def ranged() -> bytes:  # (fsspec's HTTP ``_cat_file`` reads a body whole, whatever its range)
                    return (await timed.http_ranges(fs, path, [(start, length)]))[0]
                return await within(path, length, ranged)
            return await within(path, length, lambda: fs._cat_file(path, start=start, end=end, **kwargs))

        async def info(path: str, **kwargs: Any) -> dict[str, Any]:
            return await within(path, 0, lambda: fs._info(path, **kwargs))

        async def exists(path: str, **kwargs: Any) -> bool:
            return await within(path, 0, lambda: fs._exists(path, **kwargs))

        self._cat_file, self._info, self._exists = cat_file, info, exists


def as_async(fs: Any) -> Any:
    """``fs`` as zarr-python's store wants it (asynchronous), its requests still made on fsspec's
    own event loop, with the rest of daskcfa's I/O (zarr runs a loop of its own: an s3fs or
    HTTP session bound to one loop cannot serve the other); S3's and HTTP's reads within their
    deadlines (:class:`_Timed`)."""
    return (_Timed if timed.on_loop(fs) else AsyncFileSystemWrapper)(fs, asynchronous=True)
