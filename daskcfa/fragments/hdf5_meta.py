"""A bounded parser of the HDF5 metadata netCDF-C writes, so that opening a netCDF-4
fragment does not go through the HDF5 library (whose open, close and per-object calls
cost about a millisecond a fragment, under one process-wide lock).

It understands only the common case, exactly: superblock version 2 or 3, version 2
object headers (checksums verified), groups whose links are stored compactly, plain
integer and float datasets (contiguous, or chunked with a version 1 B-tree chunk index),
their fill value, filters and compact attributes (numbers, fixed and variable-length
strings, dimension lists). Everything else, and everything inconsistent, raises
:class:`NotMine`: the caller then opens the file with h5py as before, so a file this
parser does not fully understand behaves (errors included) exactly as it did.

Every read is checked against the file's size and counted against
:data:`_MAX_METADATA` bytes; counts, continuation chains and B-tree depth are bounded
and every node is visited once. Nothing here trusts the bytes it reads.
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import netCDF4
import numpy as np

from ..errors import FragmentReadError

__all__ = ["AttributeMeta", "ChunkEntry", "DatasetMeta", "FLOAT_SIZES", "HDF5Meta", "INTEGER_SIZES", "LoopedChunkIndex",
           "NotMine", "PARSE_ERRORS", "checksum"]

#: The byte sizes of the integer and float types a direct read supports (either byte order).
INTEGER_SIZES = (1, 2, 4, 8)
FLOAT_SIZES = (4, 8)

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_UNDEFINED = 0xFFFFFFFFFFFFFFFF
#: Metadata bytes one file may make the parser read before it gives up (not a failure: h5py reads it).
_MAX_METADATA = 4 << 20
#: Object header blocks (the first and its continuations) one object may have.
_MAX_BLOCKS = 16
#: Messages one object header may hold.
_MAX_MESSAGES = 256
#: Chunks a chunk index may hold for this parser to walk it (more: h5py locates them, on demand; the
#: walk in Python cost more than h5py's open above about a hundred: docs/performance.md, attack15b).
_MAX_CHUNKS = 64
#: Inner nodes of a larger chunk index checked for a loop before h5py is left to walk it.
_MAX_INNER_NODES = 64
#: Depth of a B-tree, and entries in one node (netCDF-C's files use HDF5's default of 64).
_MAX_DEPTH = 8
_MAX_ENTRIES = 64
#: Group levels in a variable's path, and dataspace rank (HDF5's own limit is 32).
_MAX_LEVELS = 8
_MAX_RANK = 32
#: Bytes read at once at the start of a file, where netCDF-C writes most of its metadata.
_HEAD_BYTES = 16 << 10


class NotMine(Exception):
    """The bytes are not the simple, consistent case this parser understands: h5py reads the file."""


class LoopedChunkIndex(FragmentReadError):
    """A chunk B-tree node that is its own ancestor, or an inner node under two parents: HDF5 would
    recurse until the process dies, or walk the shared node once a path (a few KB of nodes shared
    level after level: 64 to the power of the levels), so the file is refused here, a verdict no other
    reader is asked to confirm."""


#: What parsing may raise: :class:`NotMine`, and (a check missed) what slicing and unpacking
#: hostile bytes raise, which means the same.
PARSE_ERRORS = (NotMine, struct.error, IndexError, ValueError, OverflowError)


def checksum(data: bytes, length: int) -> int:
    """HDF5's checksum of version 2 metadata (Jenkins' lookup3) of ``data[:length]``, computed by the
    HDF5 library netCDF4-python loaded, which every read has loaded already (h5py's, the same function,
    would cost a first read h5py's import); :class:`NotMine` when it does not export it: then h5py reads
    the file (a checksum computed in Python costs more than opening the file with h5py)."""
    if _CHECKSUM is None:
        raise NotMine("HDF5's checksum function is not available")
    return _CHECKSUM(data, length, 0)


def _checksum_function() -> Any:
    try:
        function = ctypes.CDLL(netCDF4._netCDF4.__file__).H5_checksum_metadata
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_uint32
    function.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32]
    return function


_CHECKSUM = _checksum_function()


class ChunkEntry(NamedTuple):
    """One stored chunk, as h5py's ``StoreInfo`` describes it (the same fields, in the same order)."""

    chunk_offset: tuple[int, ...]
    filter_mask: int
    byte_offset: int
    size: int


@dataclass
class AttributeMeta:
    """One attribute: ``kind`` is ``"number"`` (``value``: an array of the stored type),
    ``"string"`` (fixed length: ``value`` the stored bytes), ``"vstrings"`` (``value``: a list of
    bytes per element), ``"references"`` (``value``: a list of object addresses per element) or
    ``"null-string"`` / ``"null-number"`` (an empty dataspace; ``value``: the type, for numbers), or
    ``"other"``: a type netCDF4-python reads but the direct reader does not (compound, enum, ...)."""

    kind: str
    value: Any
    shape: tuple[int, ...] | None
    #: fixed strings: the size, padding and character set
    string_type: tuple[int, int, int] | None = None


@dataclass
class DatasetMeta:
    """What opening a dataset needs, parsed from its object header."""

    link: str  #: the name it was found under
    address: int  #: its object header's address
    dtype: np.dtype  #: stored type, byte order included
    shape: tuple[int, ...]
    chunks: tuple[int, ...] | None
    offset: int | None  #: contiguous: where the data starts (None: never written)
    filters: list[tuple[int, tuple[int, ...], str]]  #: ``(code, values, name)`` in the order applied on write
    fill: Any  #: the fill value, of ``dtype``
    fill_never: bool  #: netCDF's NOFILL: HDF5 never writes fill values
    attributes: dict[str, AttributeMeta] = field(default_factory=dict)  #: in HDF5's iteration order
    chunk_index: list[ChunkEntry] | None = None  #: every chunk written, in the B-tree's order


ReadAt = Callable[[int, int], Any]


class HDF5Meta:
    """The metadata of one HDF5 file read with ``read_at(offset, length)`` (bytes-like), ``size``
    bytes long. Raises :class:`NotMine` at once when the superblock or the root group is not the
    simple case."""

    def __init__(self, read_at: ReadAt, size: int) -> None:
        self._read_at = read_at
        self.size = size
        self._read = 0
        self._limit = size  # (then the superblock's end of allocation: HDF5 reads no metadata past it)
        head = min(size, _HEAD_BYTES)
        self._head = bytes(self._fetch(0, head)) if head >= 48 else b""
        if len(self._head) < 48 or self._head[:8] != _SIGNATURE:
            raise NotMine("no superblock at the start of the file")
        sb = self._head[:48]
        version, offsets, lengths, flags = sb[8], sb[9], sb[10], sb[11]
        if version not in (2, 3) or offsets != 8 or lengths != 8 or flags != 0:
            raise NotMine(f"superblock version {version} (sizes {offsets}/{lengths}, flags {flags})")
        base, extension, eof, root = struct.unpack_from("<4Q", sb, 12)
        if struct.unpack_from("<I", sb, 44)[0] != checksum(sb, 44):
            raise NotMine("superblock checksum")
        if base != 0 or extension != _UNDEFINED or eof > size:
            raise NotMine("superblock extension, base address or a truncated file")
        self._root = root
        self._limit = eof
        self._groups: dict[int, dict[bytes, int]] = {}
        self._heaps: dict[int, dict[int, bytes]] = {}
        self._links(root)

    # -- bytes ---------------------------------------------------------------

    def _fetch(self, offset: int, length: int) -> Any:
        if offset < 0 or length < 0 or offset + length > self._limit:
            raise NotMine(f"{length} bytes at {offset} lie outside the file's allocated space")
        self._read += length
        if self._read > _MAX_METADATA:
            raise NotMine("too much metadata")
        data = self._read_at(offset, length)
        if memoryview(data).nbytes != length:
            raise NotMine("short read")
        return data

    def bytes_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (checked against the file's size and end of allocation)."""
        if 0 <= offset and offset + length <= min(len(self._head), self._limit) and length >= 0:
            return self._head[offset:offset + length]
        return bytes(self._fetch(offset, length))

    # -- object headers --------------------------------------------------------

    def _messages(self, address: int) -> tuple[list[tuple[int, int, bytes]], int]:
        """The messages ``(type, creation order, body)`` of the version 2 object header at
        ``address``, continuation blocks followed, and the header's flags."""
        prefix = self.bytes_at(address, 6)
        if prefix[:4] != b"OHDR" or prefix[4] != 2:
            raise NotMine("not a version 2 object header")
        flags = prefix[5]
        if flags & 0xC0:
            raise NotMine("object header flags")
        start = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        size = int.from_bytes(self.bytes_at(address + start, width), "little")
        first = start + width
        blocks = [(self.bytes_at(address, first + size + 4), first)]
        tracked = bool(flags & 0x04)
        messages: list[tuple[int, int, bytes]] = []
        seen = {address}
        while blocks:
            data, at = blocks.pop(0)
            found, continuations = _block_messages(data, at, tracked)
            messages += found
            if len(messages) > _MAX_MESSAGES:
                raise NotMine("too many messages")
            for cont, clen in continuations:
                if cont in seen or len(seen) >= _MAX_BLOCKS:
                    raise NotMine("continuation")
                seen.add(cont)
                chunk = self.bytes_at(cont, clen)
                if chunk[:4] != b"OCHK":
                    raise NotMine("continuation block signature")
                blocks.append((chunk, 4))
        return messages, flags

    def _links(self, address: int) -> dict[bytes, int]:
        """The hard links of the group at ``address``: name -> object header address."""
        links = self._groups.get(address)
        if links is not None:
            return links
        messages, _ = self._messages(address)
        links, info = {}, False
        for kind, _, body in messages:
            if kind == 0x02:
                info = True
                _compact(body, 8, "link")
            elif kind == 0x06:
                name, target = _link(body)
                if name in links:
                    raise NotMine("two links of one name")
                links[name] = target
            elif kind not in (0x0A, 0x0C, 0x12, 0x15, 0x16):  # group info, attributes (not read), times, ...
                raise NotMine(f"message {kind:#x} in a group")
        if not info:
            raise NotMine("a group without link info (old style)")
        if len(self._groups) >= 4 * _MAX_LEVELS:
            raise NotMine("too many groups")
        self._groups[address] = links
        return links

    def group_links(self, path: str) -> dict[bytes, int]:
        """The links of the group at ``path`` (``"/"``, ``"/g/"``)."""
        address = self._root
        parts = [p for p in path.split("/") if p]
        if len(parts) > _MAX_LEVELS or "." in parts:
            raise NotMine("too deep, or a path HDF5 reads otherwise")
        for part in parts:
            target = self._links(address).get(part.encode())
            if target is None:
                raise NotMine("no such group")
            address = target
        return self._links(address)

    def dataset(self, path: str) -> DatasetMeta | None:
        """The dataset at ``path`` (``"/g/v"``), None when no link of that name is in its group."""
        head, _, base = path.rpartition("/")
        if base in ("", "."):
            raise NotMine("a path HDF5 reads otherwise")
        links = self.group_links(head + "/")
        address = links.get(base.encode())
        if address is None:
            return None
        return self._dataset(base, address)

    def _dataset(self, link: str, address: int) -> DatasetMeta:
        messages, flags = self._messages(address)
        found: dict[int, bytes] = {}
        attributes: list[tuple[int, bytes, AttributeMeta]] = []
        for kind, order, body in messages:
            if kind == 0x0C:
                name, attr = self._attribute(body)
                attributes.append((order, name, attr))
            elif kind in (0x01, 0x03, 0x05, 0x08, 0x0B):
                if kind in found:
                    raise NotMine(f"two messages {kind:#x}")
                found[kind] = body
            elif kind == 0x15:
                _compact(body, 2, "attribute")
            elif kind not in (0x12, 0x16):  # times; a reference count (several links: told by the caller)
                raise NotMine(f"message {kind:#x} in a dataset")
        if any(k not in found for k in (0x01, 0x03, 0x05, 0x08)):
            raise NotMine("not a dataset")
        dtype = _plain_type(found[0x03])
        if dtype is None:
            raise NotMine("not a plain numeric type")
        shape, maxshape = _dataspace(found[0x01])
        if shape is None:
            raise NotMine("a null dataspace")
        fill, fill_never = _fill_value(found[0x05], dtype)
        chunks, offset, btree = _layout(found[0x08], dtype, shape, maxshape, self._limit)
        filters = _filters(found[0x0B]) if 0x0B in found else []
        if filters and chunks is None:
            raise NotMine("filters on contiguous data")
        try:  # (h5py's path shows a name that is not UTF-8 altered, then cannot find it)
            names = [name.decode() for _, name, _ in attributes]
        except UnicodeDecodeError:
            raise NotMine("an attribute name that is not UTF-8") from None
        if len(set(names)) != len(names):
            raise NotMine("two attributes of one name")
        if flags & 0x04:
            orders = [order for order, _, _ in attributes]
            if len(set(orders)) != len(orders):
                raise NotMine("two attributes of one creation order")
            attributes.sort(key=lambda item: item[0])
        else:
            attributes.sort(key=lambda item: item[1])  # (HDF5 compares names as C strings)
        meta = DatasetMeta(link, address, dtype, shape, chunks, offset, filters, fill, fill_never,
                           {name.decode(): attr for _, name, attr in attributes})
        if chunks is not None:
            meta.chunk_index = self._chunk_index(btree, shape, chunks, dtype.itemsize)
        return meta

    def reference_count(self, address: int) -> int:
        """How many hard links the dataset at ``address`` has (anything but a dataset, as HDF5 tells
        an object's kind from the messages it holds: not mine)."""
        messages, _ = self._messages(address)
        kinds = {kind for kind, _, _ in messages}
        if not {0x01, 0x03} <= kinds or kinds & {0x02, 0x11}:
            raise NotMine("not a dataset")
        counts = [body for kind, _, body in messages if kind == 0x16]
        if not counts:
            return 1
        if len(counts) > 1 or len(counts[0]) != 5 or counts[0][0] != 0:
            raise NotMine("reference count message")
        return struct.unpack_from("<I", counts[0], 1)[0]

    # -- attributes ------------------------------------------------------------

    def _attribute(self, body: bytes) -> tuple[bytes, AttributeMeta]:
        if len(body) < 8:
            raise NotMine("attribute message too short")
        version, flags = body[0], body[1]
        name_size, type_size, space_size = struct.unpack_from("<3H", body, 2)
        if version == 1:
            if flags:
                raise NotMine("attribute flags")
            at, pad = 8, 8
        elif version in (2, 3):
            if flags:
                raise NotMine("shared attribute type or dataspace")
            at, pad = (8, 1) if version == 2 else (9, 1)
            if version == 3 and body[8] not in (0, 1):
                raise NotMine("attribute name encoding")
        else:
            raise NotMine(f"attribute message version {version}")

        def take(n: int) -> bytes:
            nonlocal at
            if n < 0 or at + n > len(body):
                raise NotMine("attribute message too short")
            part = body[at:at + n]
            at += -(-n // pad) * pad
            return part

        raw_name = take(name_size)
        if not raw_name or raw_name[-1] != 0 or 0 in raw_name[:-1]:
            raise NotMine("attribute name")
        name = raw_name[:-1]
        type_body = take(type_size)
        shape, _ = _dataspace(take(space_size))
        data = body[at:]
        return name, self._attribute_value(type_body, shape, data)

    def _attribute_value(self, type_body: bytes, shape: tuple[int, ...] | None, data: bytes) -> AttributeMeta:
        if len(type_body) < 8:
            raise NotMine("datatype message too short")
        cls = type_body[0] & 0x0F
        bits = int.from_bytes(type_body[1:4], "little")
        size = struct.unpack_from("<I", type_body, 4)[0]
        count = 0 if shape is None else math.prod(shape)
        if cls in (2, 4, 5, 6, 7, 8, 10) and type_body[0] >> 4 in (1, 2, 3, 4):  # (h5py's path refuses them too)
            return AttributeMeta("other", None, shape)
        if cls == 3:  # a fixed-length string (NC_CHAR)
            if bits & ~0xFF or (bits & 0x0F) > 2 or (bits >> 4) > 1 or size == 0 or len(type_body) != 8:
                raise NotMine("string type")
            if shape is None:
                return AttributeMeta("null-string", None, None)
            if len(data) < count * size:
                raise NotMine("attribute data too short")
            return AttributeMeta("string", data[:count * size], shape, (size, bits & 0x0F, bits >> 4))
        if cls == 9:  # variable length
            if type_body[0] >> 4 != 1 or size != 16 or len(type_body) < 16:
                raise NotMine("variable-length type")
            base = type_body[8:]
            if bits & 0x0F == 1:  # a string
                if bits & ~0xFFF or (bits >> 4) & 0x0F > 2 or (bits >> 8) > 1 or not _is_char(base):
                    raise NotMine("variable-length string type")
                if shape is None:
                    return AttributeMeta("null-string", None, None)
                if len(data) < 16 * count:
                    raise NotMine("attribute data too short")
                return AttributeMeta("vstrings", [self._vlen(data, 16 * i, 1) for i in range(count)], shape)
            if bits & 0x0F or bits >> 4:
                raise NotMine("variable-length type")
            if not _is_object_reference(base):
                return AttributeMeta("other", None, shape)
            if shape is None or len(data) < 16 * count:
                raise NotMine("attribute data too short")
            lists = [self._vlen(data, 16 * i, 8) for i in range(count)]
            return AttributeMeta("references", [list(struct.unpack(f"<{len(v) // 8}Q", v)) for v in lists], shape)
        dtype = _plain_type(type_body)
        if dtype is None:
            raise NotMine("attribute type")
        if shape is None:
            return AttributeMeta("null-number", dtype, None)
        if len(data) < count * dtype.itemsize:
            raise NotMine("attribute data too short")
        return AttributeMeta("number", np.frombuffer(data, dtype, count).reshape(shape), shape)

    def _vlen(self, data: bytes, at: int, itemsize: int) -> bytes:
        """One variable-length element (``itemsize`` bytes a value) of attribute ``data``, from the global heap."""
        length, collection, index = struct.unpack_from("<IQI", data, at)
        if length == 0 and collection in (0, _UNDEFINED) and index == 0:  # (an empty sequence: no object)
            return b""
        found = self._heap(collection).get(index)
        if found is None or length * itemsize != len(found):  # (HDF5 refuses an object of another size)
            raise NotMine("no such global heap object, or one of another size")
        return found

    def _heap(self, address: int) -> dict[int, bytes]:
        """The objects of the global heap collection at ``address``, by index: all of them checked,
        as HDF5 checks them when it loads the collection."""
        heap = self._heaps.get(address)
        if heap is None:
            head = self.bytes_at(address, 16)
            if head[:4] != b"GCOL" or head[4] != 1:
                raise NotMine("global heap collection")
            size = struct.unpack_from("<Q", head, 8)[0]
            if size < 16 or len(self._heaps) >= 64:
                raise NotMine("global heap collection size")
            data = self.bytes_at(address, size)
            heap, at = {}, 16
            while at + 16 <= size:
                number, _refs, _reserved, length = struct.unpack_from("<HHIQ", data, at)
                # (an object's size counts its data; free space's (index 0), its header too)
                need = 16 + -(-length // 8) * 8 if number else max(16, -(-length // 8) * 8)
                if need > size - at or (number and number in heap):
                    raise NotMine("global heap object")
                if number:
                    heap[number] = data[at + 16:at + 16 + length]
                at += need
            self._heaps[address] = heap
        return heap

    # -- chunk index -----------------------------------------------------------

    def _chunk_index(self, btree: int | None, shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int
                     ) -> list[ChunkEntry]:
        """Every chunk of a version 1 B-tree chunk index, checked: in strictly increasing order, each at
        a chunk boundary within the dataspace, each node's keys bounding its children."""
        if btree is None:
            return []
        nchunks = math.prod(-(-n // c) for n, c in zip(shape, chunks))
        ndim = len(shape)
        key_size = 8 + 8 * (ndim + 1)
        self._check_no_loop(btree, key_size)  # (whatever its size: h5py, handed a declined index, would follow it)
        if nchunks > _MAX_CHUNKS:
            raise NotMine("too many chunks to walk")
        entries: list[ChunkEntry] = []
        visited: set[int] = set()
        fmt = f"<II{ndim + 1}Q"
        every = (*chunks, itemsize)

        def walk(address: int, level: int | None, depth: int, low: tuple, high: tuple | None) -> None:
            if address in visited or depth > _MAX_DEPTH or len(visited) > nchunks + 1:
                raise NotMine("chunk index shape")
            visited.add(address)
            if address + 24 + _MAX_ENTRIES * (key_size + 8) + key_size > self._limit:
                raise NotMine("a chunk B-tree node past the end of allocation")  # (HDF5 reads it whole)
            head = self.bytes_at(address, 24)
            if head[:4] != b"TREE" or head[4] != 1:
                raise NotMine("not a chunk B-tree node")
            node_level, used = head[5], struct.unpack_from("<H", head, 6)[0]
            if (level is not None and node_level != level) or not 0 < used <= _MAX_ENTRIES:
                raise NotMine("chunk B-tree node")
            body = self.bytes_at(address + 24, used * (key_size + 8) + key_size)
            keys, children = [], []
            for i in range(used + 1):
                at = i * (key_size + 8)
                values = struct.unpack_from(fmt, body, at)
                # (the last key bounds the last chunk: its element offset varies; HDF5 checks that
                # every offset is a multiple of the chunk's size along its dimension)
                if (values[-1] != 0 and i < used) or any(o % c for o, c in zip(values[2:], every)):
                    raise NotMine("chunk key")
                keys.append(values)
                if i < used:
                    children.append(struct.unpack_from("<Q", body, at + key_size)[0])
            for i in range(used):
                coords = keys[i][2:2 + ndim]
                bound = keys[i + 1][2:2 + ndim]
                if not (coords >= low and (high is None or coords < high) and coords < bound):
                    raise NotMine("chunk keys out of order")
                if node_level == 0:
                    size, mask = keys[i][0], keys[i][1]
                    if (size == 0 or any(o % c or o >= n for o, c, n in zip(coords, chunks, shape))
                            or (entries and coords <= entries[-1].chunk_offset)):
                        raise NotMine("chunk entry")
                    entries.append(ChunkEntry(coords, mask, children[i], size))
                    if len(entries) > nchunks:
                        raise NotMine("too many chunk entries")
                else:
                    first = len(entries)
                    walk(children[i], node_level - 1, depth + 1, coords, bound)
                    if len(entries) == first or entries[first].chunk_offset != coords:
                        raise NotMine("chunk B-tree key does not match its child")

        walk(btree, None, 0, (0,) * ndim, None)
        return entries

    def _check_no_loop(self, btree: int, key_size: int) -> None:
        """Raise :class:`LoopedChunkIndex` when an inner node of the chunk B-tree at ``btree`` (its first
        :data:`_MAX_INNER_NODES`, :data:`_MAX_DEPTH` levels) has an ancestor for a child, or is a child
        of two inner nodes; anything else odd is h5py's to judge."""
        checked: set[int] = set()

        def inner(address: int, ancestors: tuple[int, ...]) -> None:
            if address in checked:
                raise LoopedChunkIndex(f"the chunk index's inner node at byte {address} has two parents")
            checked.add(address)
            if len(checked) > _MAX_INNER_NODES or len(ancestors) > _MAX_DEPTH:
                raise NotMine("a chunk index too large to check")
            head = self.bytes_at(address, 24)
            level, used = head[5], struct.unpack_from("<H", head, 6)[0]
            if head[:4] != b"TREE" or level == 0 or not 0 < used <= _MAX_ENTRIES:
                return
            body = self.bytes_at(address + 24, used * (key_size + 8))
            for i in range(used):
                child = struct.unpack_from("<Q", body, i * (key_size + 8) + key_size)[0]
                if child == address or child in ancestors:
                    raise LoopedChunkIndex(f"the chunk index's node at byte {child} is its own ancestor")
                if level > 1:
                    inner(child, (*ancestors, address))

        inner(btree, ())


# -- messages -------------------------------------------------------------------


#: Object header blocks up to this size are parsed once per process for each distinct content
#: (:func:`_block_messages`): the fragments of one aggregation repeat the same variable and
#: dimension headers byte for byte, file after file.
_MEMO_BLOCK_BYTES = 4 << 10


def _block_messages(data: bytes, at: int, tracked: bool) -> tuple[tuple[tuple[int, int, bytes], ...],
                                                                   tuple[tuple[int, int], ...]]:
    """The messages of one object header block (``data``, its messages from ``at``; checksum verified),
    and the ``(address, length)`` of the continuation blocks it names, in order. A function of the
    bytes alone: a block seen before with the same bytes is not parsed again."""
    if len(data) <= _MEMO_BLOCK_BYTES:
        return _remembered_block(data, at, tracked)
    return _parsed_block(data, at, tracked)


def _parsed_block(data: bytes, at: int, tracked: bool) -> tuple[tuple[tuple[int, int, bytes], ...],
                                                                tuple[tuple[int, int], ...]]:
    end = len(data) - 4
    if struct.unpack_from("<I", data, end)[0] != checksum(data, end):
        raise NotMine("object header checksum")
    header = 6 if tracked else 4
    messages: list[tuple[int, int, bytes]] = []
    continuations: list[tuple[int, int]] = []
    while end - at >= header:
        kind, length, mflags = data[at], struct.unpack_from("<H", data, at + 1)[0], data[at + 3]
        order = struct.unpack_from("<H", data, at + 4)[0] if tracked else 0
        at += header
        if at + length > end:
            raise NotMine("message runs past its block")
        body = data[at:at + length]
        at += length
        if mflags & ~0x05 & 0xFF and kind != 0:  # shared, unknown-flagged, ...
            raise NotMine(f"message flags {mflags:#x}")
        if kind == 0x10:
            cont, clen = struct.unpack_from("<2Q", body) if length >= 16 else (0, 0)
            if length != 16 or clen < 8 or len(continuations) >= _MAX_BLOCKS:
                raise NotMine("continuation")
            continuations.append((cont, clen))
        elif kind != 0:
            messages.append((kind, order, body))
            if len(messages) > _MAX_MESSAGES:
                raise NotMine("too many messages")
    return tuple(messages), tuple(continuations)


_remembered_block = functools.lru_cache(maxsize=256)(_parsed_block)


def _compact(body: bytes, counter: int, what: str) -> None:
    """Check a link info (``counter``: 8, the bytes of its creation counter) or attribute info (2)
    message: not mine unless what it describes is stored compactly, in the object header."""
    if len(body) < 2 or body[0] != 0 or body[1] & ~3:
        raise NotMine(f"{what} info")
    at = 2 + (counter if body[1] & 1 else 0)
    if len(body) != at + 16 + (8 if body[1] & 2 else 0):
        raise NotMine(f"{what} info size")
    heap, = struct.unpack_from("<Q", body, at)
    if heap != _UNDEFINED:
        raise NotMine(f"{what}s stored densely")


def _link(body: bytes) -> tuple[bytes, int]:
    """A hard link's name and target (any other link: not mine)."""
    if len(body) < 2 or body[0] != 1 or body[1] & 0xE0:
        raise NotMine("link message")
    flags, at = body[1], 2
    if flags & 0x08:
        if len(body) < 3 or body[at] != 0:
            raise NotMine("not a hard link")
        at += 1
    if flags & 0x04:
        at += 8
    if flags & 0x10:
        if at >= len(body) or body[at] > 1:
            raise NotMine("link name character set")
        at += 1
    width = 1 << (flags & 3)
    length = int.from_bytes(body[at:at + width], "little")
    at += width
    if length == 0 or at + length + 8 != len(body):
        raise NotMine("link message size")
    name = body[at:at + length]
    if 0 in name or b"/" in name:
        raise NotMine("link name")
    return bytes(name), struct.unpack_from("<Q", body, at + length)[0]


def _dataspace(body: bytes) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """The dims and maximum dims (None: a null dataspace)."""
    if len(body) < 4:
        raise NotMine("dataspace message too short")
    version, rank, flags = body[0], body[1], body[2]
    if flags & ~1 or rank > _MAX_RANK:
        raise NotMine("dataspace flags")
    if version == 1:
        at, null = 8, False
    elif version == 2:
        if body[3] not in (0, 1, 2) or (body[3] == 0) != (rank == 0) or (body[3] == 2 and rank):
            raise NotMine("dataspace type")
        at, null = 4, body[3] == 2
    else:
        raise NotMine(f"dataspace version {version}")
    n = rank * (2 if flags & 1 else 1)
    if len(body) < at + 8 * n:
        raise NotMine("dataspace message too short")
    values = struct.unpack_from(f"<{n}Q", body, at)
    if null:
        return None, None
    dims, maxdims = values[:rank], values[rank:] if flags & 1 else values[:rank]
    if any(d > m for d, m in zip(dims, maxdims)) or any(d >= 1 << 62 for d in dims):
        raise NotMine("dataspace dims")
    return tuple(dims), tuple(maxdims)


def _plain_type(body: bytes) -> np.dtype | None:
    """The numpy type of a datatype message holding exactly one of the common integer and IEEE float
    types (None: another type)."""
    if len(body) < 12:
        return None
    cls, version = body[0] & 0x0F, body[0] >> 4
    bits = int.from_bytes(body[1:4], "little")
    size = struct.unpack_from("<I", body, 4)[0]
    if version not in (1, 2, 3):
        return None
    order = ">" if bits & 1 else "<"
    if cls == 0:
        offset, precision = struct.unpack_from("<HH", body, 8)
        if bits & ~0x09 or size not in INTEGER_SIZES or offset or precision != 8 * size or len(body) != 12:
            return None
        return np.dtype(f"{order}{'i' if bits & 8 else 'u'}{size}")
    if cls == 1:
        if len(body) != 20:
            return None
        # IEEE binary32 and binary64: bit offset, precision, exponent place and size, mantissa place and size,
        # exponent bias, sign place
        expected = {4: (0, 32, 23, 8, 0, 23, 127, 31), 8: (0, 64, 52, 11, 0, 52, 1023, 63)}.get(size)
        if size not in FLOAT_SIZES:
            return None
        props = struct.unpack_from("<HHBBBBI", body, 8) + ((bits >> 8) & 0xFF,)
        if expected is None or props != expected or bits & ~0xFF31 & 0xFFFFFF or (bits >> 4) & 3 != 2:
            return None
        return np.dtype(f"{order}f{size}")
    return None


def _is_char(body: bytes) -> bool:
    """Whether a variable-length string's base type is HDF5's one-byte character (as HDF5 writes it)."""
    return len(body) == 12 and body[0] & 0x0F == 0 and struct.unpack_from("<I", body, 4)[0] == 1 and (
        struct.unpack_from("<HH", body, 8) == (0, 8))


def _is_object_reference(body: bytes) -> bool:
    """Whether a datatype message is HDF5's object reference (``H5T_STD_REF_OBJ``)."""
    return len(body) == 8 and body[0] == 0x17 and body[1:4] == b"\0\0\0" and struct.unpack_from("<I", body, 4)[0] == 8


def _fill_value(body: bytes, dtype: np.dtype) -> tuple[Any, bool]:
    """The fill value (version 3 messages only) and whether HDF5 never writes it."""
    if len(body) < 2 or body[0] != 3 or body[1] & ~0x2F or body[1] & 0x10:
        raise NotMine("fill value message")
    flags = body[1]
    never = (flags >> 2) & 3 == 1
    if (flags >> 2) & 3 == 3:
        raise NotMine("fill time")
    if not flags & 0x20:
        if len(body) != 2:
            raise NotMine("fill value message size")
        return np.zeros((), dtype)[()], never
    if len(body) != 6 + dtype.itemsize or struct.unpack_from("<I", body, 2)[0] != dtype.itemsize:
        raise NotMine("fill value size")
    return np.frombuffer(body, dtype, 1, 6)[0], never


def _layout(body: bytes, dtype: np.dtype, shape: tuple[int, ...], maxshape: tuple[int, ...] | None, eoa: int
            ) -> tuple[tuple[int, ...] | None, int | None, int | None]:
    """``(chunk shape, contiguous data's offset, chunk B-tree's address)`` of a version 3 layout message
    (``eoa``: the end of the file's allocated space, which HDF5 checks contiguous data against)."""
    if len(body) < 2 or body[0] != 3:
        raise NotMine("layout message version")
    if body[1] == 1:
        if len(body) != 18:
            raise NotMine("layout message size")
        address, size = struct.unpack_from("<2Q", body, 2)
        if size != math.prod(shape) * dtype.itemsize or maxshape != shape or (
                address != _UNDEFINED and address + size > eoa):
            raise NotMine("contiguous storage size")
        return None, None if address == _UNDEFINED else address, None
    if body[1] == 2:
        rank = body[2] if len(body) > 2 else 0
        if rank != len(shape) + 1 or len(body) != 11 + 4 * rank or not shape:
            raise NotMine("chunked layout message")
        address, = struct.unpack_from("<Q", body, 3)
        dims = struct.unpack_from(f"<{rank}I", body, 11)
        chunks, element = dims[:-1], dims[-1]
        if element != dtype.itemsize or 0 in chunks or math.prod(dims) >= 1 << 32:
            raise NotMine("chunk dims")
        if maxshape is not None and any(c > m for c, m in zip(chunks, maxshape) if m != _UNDEFINED):
            raise NotMine("chunk larger than its dimension")
        return tuple(chunks), None, None if address == _UNDEFINED else address
    raise NotMine(f"layout class {body[1]}")


#: The names HDF5 gives its own filters, which a version 2 filter pipeline message does not store.
_HDF5_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset"}


def _filters(body: bytes) -> list[tuple[int, tuple[int, ...], str]]:
    """``(code, values, name)`` per filter of a filter pipeline message (named as HDF5 names it)."""
    if len(body) < 2 or body[0] not in (1, 2) or not 0 < body[1] <= 32:
        raise NotMine("filter pipeline message")
    version, count = body[0], body[1]
    at = 8 if version == 1 else 2
    filters = []
    for _ in range(count):
        if at + 6 > len(body):
            raise NotMine("filter pipeline too short")
        code, = struct.unpack_from("<H", body, at)
        at += 2
        named = version == 1 or code >= 256
        if not named and code not in _HDF5_FILTERS:
            raise NotMine(f"filter {code}, reserved to HDF5")
        name_length = 0
        if named:
            name_length, = struct.unpack_from("<H", body, at)
            at += 2
        if at + 4 > len(body):
            raise NotMine("filter pipeline too short")
        _flags, nvalues = struct.unpack_from("<HH", body, at)
        at += 4
        if version == 1:
            name_length = -(-name_length // 8) * 8
        raw_name = body[at:at + name_length]
        at += name_length
        if at + 4 * nvalues > len(body):
            raise NotMine("filter pipeline too short")
        values = struct.unpack_from(f"<{nvalues}I", body, at)
        at += 4 * nvalues
        if version == 1 and nvalues % 2:
            at += 4
        name = raw_name.split(b"\0")[0].decode("latin-1") if named else _HDF5_FILTERS[code]
        filters.append((code, tuple(values), name))
    if at != len(body) and not (version == 1 and at <= len(body)):
        raise NotMine("filter pipeline size")
    return filters
