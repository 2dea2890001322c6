"""Hand-crafted attacks on the direct HDF5 metadata parser (:mod:`daskcfa.fragments.hdf5_meta`):
valid netCDF-4 files patched at known structure offsets, HDF5's checksums recomputed so that
the HDF5 library itself still reads them and only the meaning changes. On every file, a variable
opened through the parser must look exactly as it does through h5py (``parse=False``: the path main
had before the parser, checked equal to it): values, fill, dtype, attributes, dimension names,
errors (type and message). The breaks found (attack15b) were fixed after the merge
(docs/reliability.md)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Callable

import dask
import h5py
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import Frag, build_cf113
from daskcfa.fragments.hdf5 import HDF5File, ParsedVariable
from daskcfa.fragments.hdf5_meta import checksum
from remote_helpers import upload

from .conftest import DIMS, SIZES, VICTIM, forget_open_files, fragment_error_names, replace_file, truth

NAMES = ("v", "c", "x")


def _base(tmp_path: Path, **extra) -> bytes:
    """A small netCDF-4 file: ``v`` chunked (fill value, string and vlen attributes), ``c``
    contiguous, ``x`` a coordinate variable (a dimension scale)."""
    path = tmp_path / "base.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 5)
        nc.createDimension("t", None)
        nc.createVariable("x", "f8", ("x",))[:] = np.arange(5.0)
        v = nc.createVariable("v", "i2", ("t", "x"), chunksizes=(2, 3), fill_value=np.int16(-9), **extra)
        v.setncattr_string("note", ["a", "bc"])
        v.units = "m"
        v.aaaa = np.int32(1)
        v.bbbb = np.int32(2)
        v[:] = np.arange(20, dtype="i2").reshape(4, 5)
        nc.createVariable("c", "u1", ("x",), contiguous=True)[:] = np.arange(5, dtype="u1")
    return path.read_bytes()


# -- the file's structure --------------------------------------------------------------------


class Message(tuple):
    """``(type, header's address, body's offset, body's length)`` of one object header message."""

    kind = property(lambda self: self[0])
    owner = property(lambda self: self[1])
    body = property(lambda self: self[2])
    length = property(lambda self: self[3])


def _blocks(data: bytes) -> list[tuple[int, int, int, list[Message]]]:
    """``(header's address, block start, checksum offset, messages)`` of every version 2 object
    header block of ``data`` (continuation blocks followed)."""
    out = []

    def block(owner: int, start: int, first: int, end: int, tracked: bool) -> None:
        messages, at, size = [], first, 6 if tracked else 4
        while end - at >= size:
            kind, length = data[at], struct.unpack_from("<H", data, at + 1)[0]
            messages.append(Message((kind, owner, at + size, length)))
            at += size + length
        out.append((owner, start, end, messages))
        for m in messages:
            if m.kind == 0x10:
                cont, clen = struct.unpack_from("<2Q", data, m.body)
                block(owner, cont, cont + 4, cont + clen - 4, tracked)

    at = data.find(b"OHDR")
    while at >= 0:
        flags = data[at + 5]
        start = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        end = at + start + width + int.from_bytes(data[at + start:at + start + width], "little")
        if end + 4 <= len(data) and int.from_bytes(data[end:end + 4], "little") == checksum(data[at:], end - at):
            block(at, at, at + start + width, end, bool(flags & 4))
        at = data.find(b"OHDR", at + 1)
    return out


def _seal(data: bytearray, blocks: list[tuple[int, int, int, list[Message]]]) -> bytes:
    """``data`` with the superblock's and ``blocks``' checksums recomputed (HDF5 accepts the bytes)."""
    for _, start, end, _ in blocks:
        data[end:end + 4] = checksum(bytes(data[start:end]), end - start).to_bytes(4, "little")
    data[44:48] = checksum(bytes(data[:44]), 44).to_bytes(4, "little")
    return bytes(data)


def _messages(data: bytes, kind: int) -> list[Message]:
    return [m for _, _, _, messages in _blocks(data) for m in messages if m.kind == kind]


def _attribute_data(data: bytes, name: bytes) -> int:
    """Where the value of the (version 3) attribute message named ``name`` starts."""
    for m in _messages(data, 0x0C):
        version, _, name_size, type_size, space_size = struct.unpack_from("<BBHHH", data, m.body)
        if version == 3 and data[m.body + 9:m.body + 9 + name_size] == name + b"\0":
            return m.body + 9 + name_size + type_size + space_size
    raise LookupError(name)


# -- comparing both paths --------------------------------------------------------------------


def _outcome(call):
    try:
        return call()
    except Exception as exc:  # (both paths must fail alike: the exception's type and message)
        return ("error", type(exc).__name__, str(exc))


def _seen(data: bytes, name: str, parse: bool) -> tuple[dict, bool]:
    """What a reader sees of variable ``name`` of the file ``data``; whether the parser described it."""
    f = _outcome(lambda: HDF5File(np.frombuffer(data, np.uint8), label="attacked.nc", parse=parse))
    if isinstance(f, tuple):
        return {"file": f}, False
    with f:
        var = _outcome(lambda: f.variable(name))
        if isinstance(var, tuple):
            return {"variable": var}, False
        everything = (slice(None),) * len(var.shape)
        small = np.prod(var.shape, dtype=float) <= 1e5
        return {
            "what": (var.shape, var.dtype.str, var.chunks, var.no_fill, var.compressed),
            "dims": _outcome(lambda: tuple(var.dims)),
            "attrs": _outcome(lambda: [(k, repr(var.attrs[k])) for k in var.attrs]),
            "fill": _outcome(lambda: repr(var._fill)),
            "values": _outcome(lambda: var.read(everything).tobytes() if small else None),
        }, isinstance(var, ParsedVariable)


def _same(data: bytes, names=NAMES) -> list[str]:
    """Assert both paths see every variable of ``names`` alike; the names the parser described."""
    parsed = []
    for name in names:
        new, by_parser = _seen(data, name, True)
        old, _ = _seen(data, name, False)
        assert new == old, name
        if by_parser:
            parsed.append(name)
    return parsed


def test_untouched_file_is_parsed(tmp_path):
    assert _same(_base(tmp_path)) == list(NAMES)


# -- the superblock ----------------------------------------------------------------------------


def _end_of_allocation(data: bytes, eoa: int) -> bytes:
    patched = bytearray(data)
    struct.pack_into("<Q", patched, 28, eoa)
    return _seal(patched, [])


def test_end_of_allocation_one_byte_short(tmp_path):
    data = _base(tmp_path)
    _same(_end_of_allocation(data, len(data) - 1))  # (the last thing netCDF-C wrote: v's chunk B-tree)


def test_end_of_allocation_before_the_metadata(tmp_path):
    data = _base(tmp_path)
    _same(_end_of_allocation(data, min(m.body for m in _messages(data, 0x08))))


def test_trailing_garbage(tmp_path):
    data = _base(tmp_path)
    assert _same(data + b"\xff" * 4096) == list(NAMES)


def test_truncated_file(tmp_path):
    data = _base(tmp_path)
    for size in (len(data) - 1, len(data) // 2, 100):
        assert _same(data[:size]) == []


# -- global heap (variable-length strings and dimension lists) ----------------------------------


@pytest.mark.parametrize("element, length", [(1, 1), (0, 0), (1, 0)])
def test_vlen_string_shorter_than_its_heap_object(tmp_path, element, length):
    data = bytearray(_base(tmp_path))
    struct.pack_into("<I", data, _attribute_data(bytes(data), b"note") + 16 * element, length)
    _same(_seal(data, _blocks(bytes(data))), ["v"])


@pytest.mark.parametrize("element, length", [(1, 3), (0, 2)])
def test_vlen_string_longer_than_its_heap_object(tmp_path, element, length):
    data = bytearray(_base(tmp_path))
    struct.pack_into("<I", data, _attribute_data(bytes(data), b"note") + 16 * element, length)
    _same(_seal(data, _blocks(bytes(data))), ["v"])



def test_global_heap_object_index_repeated(tmp_path):
    data = bytearray(_base(tmp_path))
    heap = bytes(data).find(b"GCOL")
    first = heap + 16
    second = first + 16 + -(-struct.unpack_from("<Q", data, first + 8)[0] // 8) * 8
    data[second:second + 2] = data[first:first + 2]  # (the second object takes the first's index)
    assert _same(bytes(data), ["v"]) == []


# -- object headers ----------------------------------------------------------------------------


def test_two_attributes_of_one_name(tmp_path):
    data = bytearray(_base(tmp_path))
    at = bytes(data).find(b"bbbb\0")
    data[at:at + 4] = b"aaaa"
    assert _same(_seal(data, _blocks(bytes(data))), ["v"]) == []


def _into_nil(data: bytes, owner: int, kind: int, body: bytes) -> bytes:
    """``data`` with a message ``kind`` written into the free (NIL) space of the object header at
    ``owner`` (a header that tracks creation order: six-byte message headers)."""
    nil = next(m for m in _messages(data, 0) if m.owner == owner and m.length >= len(body))
    blocks = _blocks(data)
    patched = bytearray(data)
    start, free = nil.body - 6, 6 + nil.length
    message = bytes([kind]) + struct.pack("<H", len(body)) + b"\0\0\0" + body
    rest = free - len(message)
    assert rest == 0 or rest >= 6
    if rest:
        message += b"\0" + struct.pack("<H", rest - 6) + b"\0" * (rest - 3)
    patched[start:start + free] = message
    return _seal(patched, blocks)


def _owner(data: bytes, name: str) -> int:
    """The object header address of the root group's link ``name``."""
    raw = name.encode()
    for m in _messages(data, 0x06):
        body = data[m.body:m.body + m.length]
        if body[-8 - len(raw) - 1:-8] == bytes([len(raw)]) + raw:
            return struct.unpack_from("<Q", body, len(body) - 8)[0]
    raise LookupError(name)


@pytest.mark.parametrize("kind, body", [
    (0x05, bytes.fromhex("032b020000000100")),  # a second fill value (1, not -9)
    (0x05, bytes.fromhex("030b")),  # a second fill value message: the default
])
def test_second_fill_value_message(tmp_path, kind, body):
    data = _base(tmp_path)
    _same(_into_nil(data, _owner(data, "v"), kind, body), ["v"])


@pytest.mark.parametrize("body", [
    bytes.fromhex("02010001") + struct.pack("<Q", 3),  # a second dataspace: 3 elements, not 5
    bytes.fromhex("02000000"),  # a second dataspace: scalar
])
def test_second_dataspace_message(tmp_path, body):
    data = _base(tmp_path)
    _same(_into_nil(data, _owner(data, "c"), 0x01, body), ["c"])


def test_second_layout_message(tmp_path):
    data = _base(tmp_path)
    first = next(m for m in _messages(data, 0x08) if m.owner == _owner(data, "c"))
    address, size = struct.unpack_from("<2Q", data, first.body + 2)
    body = bytes([3, 1]) + struct.pack("<2Q", address + 1, size)  # the same data, shifted a byte
    _same(_into_nil(data, _owner(data, "c"), 0x08, body), ["c"])


@pytest.mark.parametrize("flags", ["032b02000000f7ff", "032a02000000f7ff", "030b", "031b", "0303", "0323"])
def test_fill_value_message_variants(tmp_path, flags):
    """A fill value message disagreeing with ``_FillValue``, left to the default, undefined, or
    written at another time: whatever HDF5 makes of it, the parser must agree."""
    data = _base(tmp_path)
    owner = _owner(data, "v")
    fill = next(m for m in _messages(data, 0x05) if m.owner == owner)
    body = bytes.fromhex(flags)
    if len(body) > fill.length:
        pytest.skip("no room")
    patched = bytearray(data)
    patched[fill.body - 5:fill.body - 3] = struct.pack("<H", len(body))
    patched[fill.body:fill.body + len(body)] = body
    # (what the message no longer holds becomes a NIL message, or padding at the block's end)
    rest = fill.length - len(body)
    if rest >= 6:
        patched[fill.body + len(body):fill.body + fill.length] = b"\0" + struct.pack("<H", rest - 6) + b"\0" * (rest - 3)
    elif rest:
        pytest.skip("no room for a NIL message")
    _same(_seal(patched, _blocks(data)), ["v"])


def test_object_header_flags(tmp_path):
    """Attribute creation order indexed or not (0x08): nothing changes, for HDF5 as for the parser."""
    data = _base(tmp_path)
    for owner in (_owner(data, "c"), _owner(data, "v")):
        patched = bytearray(data)
        patched[owner + 5] ^= 0x08
        assert _same(_seal(patched, _blocks(data))) == list(NAMES)


@pytest.mark.parametrize("flag", [0x10, 0x20, 0x30])
def test_object_header_flags_asking_for_more_fields(tmp_path, flag):
    """Flags saying that phase change values (0x10) or times (0x20) are stored, where they are not:
    the header's size is then read from other bytes; checksum recomputed over what HDF5 would read."""
    data = _base(tmp_path)
    owner = _owner(data, "c")
    patched = bytearray(data)
    patched[owner + 5] |= flag
    start = 6 + (16 if flag & 0x20 else 0) + (4 if flag & 0x10 else 0)
    width = 1 << (patched[owner + 5] & 3)
    end = owner + start + width + int.from_bytes(patched[owner + start:owner + start + width], "little")
    if end + 4 <= len(patched):
        patched[end:end + 4] = checksum(bytes(patched[owner:end]), end - owner).to_bytes(4, "little")
    _same(bytes(patched), ["c"])


@pytest.mark.parametrize("target", ["self", "another's block", "superblock", "data"])
def test_continuation_cycles_and_strays(tmp_path, target):
    data = _base(tmp_path)
    owner = _owner(data, "v")
    cont = next(m for m in _messages(data, 0x10) if m.owner == owner)
    other = next(m for m in _messages(data, 0x10) if m.owner == _owner(data, "c"))
    address, length = {
        "self": (owner, 64),
        "another's block": struct.unpack_from("<2Q", data, other.body),
        "superblock": (0, 48),
        "data": (struct.unpack_from("<2Q", data, next(m for m in _messages(data, 0x08)
                                                     if m.owner == _owner(data, "c")).body + 2)[0], 5),
    }[target]
    patched = bytearray(data)
    struct.pack_into("<2Q", patched, cont.body, address, length)
    _same(_seal(patched, _blocks(data)), ["v"])


def test_root_group_is_a_dataset(tmp_path):
    data = _base(tmp_path)
    for owner in (_owner(data, "c"), _owner(data, "v")):
        patched = bytearray(data)
        struct.pack_into("<Q", patched, 36, owner)
        assert _same(_seal(patched, []), ["v"]) == []


@pytest.mark.parametrize("offset, value", [(1, 0x02), (1, 0x04), (8, 1), (10, 7), (10, 4)])
def test_integer_type_padding_offset_precision(tmp_path, offset, value):
    """Padding bits, a bit offset, an odd precision: HDF5 converts, the parser leaves it to h5py."""
    data = _base(tmp_path)
    for kind in (1, 2):
        dtype = next(m for m in _messages(data, 0x03) if m.owner == _owner(data, "cv"[kind - 1]))
        patched = bytearray(data)
        patched[dtype.body + offset] = value
        assert _same(_seal(patched, _blocks(data))) == [n for n in NAMES if n != "cv"[kind - 1]]


# -- chunk B-tree -----------------------------------------------------------------------------


def _chunk_keys(data: bytes) -> tuple[int, int]:
    """``(address of v's chunk B-tree's first key, a key and its child's size)``."""
    layout = next(m for m in _messages(data, 0x08) if m.owner == _owner(data, "v"))
    tree = struct.unpack_from("<Q", data, layout.body + 3)[0]
    assert data[tree:tree + 6] == b"TREE\x01\x00"  # (one leaf: four chunks)
    return tree + 24, 8 + 8 * 3 + 8


@pytest.mark.parametrize("attack", ["duplicate offset", "out of order", "filter mask", "same chunk twice",
                                    "chunk size small", "chunk size huge"])
def test_chunk_btree_entries(tmp_path, attack):
    data = _base(tmp_path, zlib=True)
    first, step = _chunk_keys(data)
    patched = bytearray(data)
    if attack == "duplicate offset":
        patched[first + step + 8:first + step + 24] = data[first + 8:first + 24]
    elif attack == "out of order":
        patched[first + 8:first + 24], patched[first + step + 8:first + step + 24] = (
            data[first + step + 8:first + step + 24], data[first + 8:first + 24])
    elif attack == "filter mask":
        struct.pack_into("<I", patched, first + 4, 1)  # (deflate skipped: the compressed bytes read raw)
    elif attack == "same chunk twice":
        patched[first + step + 32:first + step + 40] = data[first + 32:first + 40]
    else:
        struct.pack_into("<I", patched, first, 3 if attack == "chunk size small" else 1 << 30)
    _same(bytes(patched), ["v"])


def _second_child_replaced(path: Path, child: Callable[[int, int], int]) -> bytes:
    """A file at ``path`` whose variable ``w`` has a two-level chunk B-tree, its root's second child
    address replaced by ``child(root's address, first child's address)``."""
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("n", 100)
        nc.createVariable("w", "i4", ("n",), chunksizes=(1,))[:] = np.arange(100)
    data = path.read_bytes()
    layout = next(m for m in _messages(data, 0x08) if data[m.body + 1] == 2)
    tree = struct.unpack_from("<Q", data, layout.body + 3)[0]
    assert data[tree:tree + 8] == b"TREE\x01\x01\x02\x00"  # (a root over two leaves)
    patched = bytearray(data)
    first = struct.unpack_from("<Q", data, tree + 24 + 24)[0]
    struct.pack_into("<Q", patched, tree + 24 + 32 + 24, child(tree, first))
    return bytes(patched)


def test_chunk_btree_sibling_pointer(tmp_path):
    """A two-level chunk B-tree whose second child is the first again."""
    assert _same(_second_child_replaced(tmp_path / "tree.nc", lambda root, first: first), ["w"]) == []


# -- links and dimension scales --------------------------------------------------------------


@pytest.mark.parametrize("link", ["g/aaa", "aaa", "g/x", "_nc4_non_coord_q"])
def test_dimension_scale_linked_twice(tmp_path, link):
    """A dimension scale also linked under another name, its reference count set back to one: the
    dimension name is whatever HDF5 names the object."""
    path = tmp_path / "base.nc"
    _base(tmp_path)
    with netCDF4.Dataset(path, "a") as nc:
        nc.createGroup("g")
    with h5py.File(path, "r+") as f:
        f[link] = f["x"]
    data = path.read_bytes()
    _same(data, ["v", "x"])
    patched = bytearray(data)
    for count in _messages(data, 0x16):
        struct.pack_into("<I", patched, count.body + 1, 1)
    _same(_seal(patched, _blocks(data)), ["v", "x"])


def test_variable_linked_twice(tmp_path):
    path = tmp_path / "base.nc"
    _base(tmp_path)
    with h5py.File(path, "r+") as f:
        f["w"] = f["v"]
    assert _same(path.read_bytes(), ["v", "w"]) == ["v", "w"]


@pytest.mark.parametrize("target", ["c", "root", "inside a header"])
def test_dimension_list_to_a_non_dimension(tmp_path, target):
    data = _base(tmp_path)
    at = _attribute_data(data, b"DIMENSION_LIST")
    length, heap, index = struct.unpack_from("<IQI", data, at + 16)
    objects = bytes(data).find(b"GCOL")
    patched = bytearray(data)
    address = {"c": _owner(data, "c"), "root": 48, "inside a header": _owner(data, "v") + 8}[target]
    found = objects + 16
    while struct.unpack_from("<H", data, found)[0] != index:
        found += 16 + -(-struct.unpack_from("<Q", data, found + 8)[0] // 8) * 8
    struct.pack_into("<Q", patched, found + 16, address)
    _same(bytes(patched), ["v"])


# -- shapes -------------------------------------------------------------------------------------


def test_rank_zero_and_empty_dimensions(tmp_path):
    path = tmp_path / "shapes.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("t", None)
        nc.createDimension("x", 3)
        nc.createVariable("scalar", "f8", ())[...] = 2.5
        nc.createVariable("empty", "i2", ("t", "x"), chunksizes=(1, 3))
        nc.createVariable("t", "f8", ("t",))
    assert _same(path.read_bytes(), ["scalar", "empty", "t"]) == ["scalar", "empty", "t"]


@pytest.mark.parametrize("size", [0, 4, 6, 1 << 40])
def test_contiguous_size_not_shape_times_itemsize(tmp_path, size):
    data = _base(tmp_path)
    layout = next(m for m in _messages(data, 0x08) if m.owner == _owner(data, "c"))
    patched = bytearray(data)
    struct.pack_into("<Q", patched, layout.body + 10, size)
    _same(_seal(patched, _blocks(data)), ["c"])


@pytest.mark.parametrize("dim", [0, 3, 6])
def test_contiguous_dataspace_resized(tmp_path, dim):
    """A dimension of size 0, or one that no longer matches the stored size."""
    data = _base(tmp_path)
    space = next(m for m in _messages(data, 0x01) if m.owner == _owner(data, "c"))
    patched = bytearray(data)
    struct.pack_into("<2Q", patched, space.body + 4, dim, dim)
    _same(_seal(patched, _blocks(data)), ["c"])


@pytest.mark.parametrize("offset, value", [(10, 63), (8, 1), (12, 51), (14, 10), (16, 0x3FE), (2, 0x3F), (1, 0x21)])
def test_float_type_fields(tmp_path, offset, value):
    """A float's precision, bit offset, exponent and mantissa fields, bias, sign position, normalization."""
    data = _base(tmp_path)
    dtype = next(m for m in _messages(data, 0x03) if m.owner == _owner(data, "x"))
    assert dtype.length == 20
    patched = bytearray(data)
    if offset == 16:
        struct.pack_into("<I", patched, dtype.body + offset, value)
    else:
        patched[dtype.body + offset] = value
    _same(_seal(patched, _blocks(data)), ["x", "v"])


def test_max_dims_smaller_than_dims(tmp_path):
    data = _base(tmp_path)
    space = next(m for m in _messages(data, 0x01) if m.owner == _owner(data, "c"))
    assert data[space.body + 2] & 1  # (max dims stored)
    patched = bytearray(data)
    struct.pack_into("<Q", patched, space.body + 4 + 8, 4)
    _same(_seal(patched, _blocks(data)), ["c"])


# -- through the public API: a local fragment, and a whole object from S3 ---------------------------


def _eoa_in_chunk_index(built) -> Path:
    """The victim fragment with its superblock's end of allocation inside its chunk B-tree node."""
    victim = built.fragment_files[VICTIM]
    data = victim.read_bytes()
    replace_file(victim, _end_of_allocation(data, data.rfind(b"TREE") + 8))
    return victim


@pytest.mark.parametrize("where", ["local", "s3"])
def test_end_of_allocation_through_the_api(tmp_path, where, request):
    built = build_cf113(tmp_path / "ds", truth(), DIMS, SIZES,
                        frags=lambda index: Frag(storage={"zlib": True, "chunksizes": (1, 2, 2)}))
    victim = _eoa_in_chunk_index(built)
    url, options = str(built.path), {}
    if where == "s3":  # (a whole object in memory: the parser reads it from the received bytes)
        server = request.getfixturevalue("s3_server")
        base = upload(request.getfixturevalue("s3fs_fs"), tmp_path / "ds", request.getfixturevalue("s3_bucket"), "ds")
        url, options = f"{base}/{built.path.name}", {"storage_options": server.storage_options}
    forget_open_files()
    with dask.config.set({"daskcfa.io.whole-fragment-fraction": 0.0, "daskcfa.io.small-object": 0}):
        with pytest.raises(daskcfa.CFAError) as info:
            daskcfa.from_cfa(url, "tas", **options).compute()
    fragment_error_names(info.value, victim.name)


@pytest.mark.skipif(not getattr(netCDF4, "__has_szip_support__", False), reason="netCDF-C without szip")
def test_unsupported_filter_named_as_before(tmp_path):
    path = tmp_path / "szip.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 64)
        nc.createVariable("s", "i4", ("x",), compression="szip", szip_coding="nn", szip_pixels_per_block=8,
                          chunksizes=(64,))[:] = np.arange(64)
    _same(path.read_bytes(), ["s"])


def test_attribute_creation_orders_swapped(tmp_path):
    """Attributes listed in creation order, the orders recorded swapped: as HDF5 lists them."""
    data = _base(tmp_path)
    found = {}
    for m in _messages(data, 0x0C):
        name = data[m.body + 9:m.body + 14]
        if name in (b"aaaa\0", b"bbbb\0"):
            found[name] = m.body - 2  # (the message header's creation order)
    patched = bytearray(data)
    patched[found[b"aaaa\0"]:found[b"aaaa\0"] + 2] = data[found[b"bbbb\0"]:found[b"bbbb\0"] + 2]
    patched[found[b"bbbb\0"]:found[b"bbbb\0"] + 2] = data[found[b"aaaa\0"]:found[b"aaaa\0"] + 2]
    assert _same(_seal(patched, _blocks(data)), ["v"]) == ["v"]


# -- bounds --------------------------------------------------------------------------------------


def _peak(call) -> int:
    """The most memory (bytes, as Python allocates it) ``call`` holds at once."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("columns", [1, 64, 80])
def test_largest_chunk_index_bounded(tmp_path, columns):
    """The most chunks the parser walks (64, ``hdf5_meta._MAX_CHUNKS``), and more than that (4,096
    in a three-level B-tree, 5,120: checked for a loop, then h5py's): memory bounded, same answer."""
    path = tmp_path / "chunks.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("a", 64)
        nc.createDimension("b", columns)
        nc.createVariable("w", "u1", ("a", "b"), chunksizes=(1, 1))[:] = np.arange(64 * columns).reshape(64, -1)
    data = path.read_bytes()
    assert _same(data, ["w"]) == (["w"] if columns == 1 else [])
    source = np.frombuffer(data, np.uint8)

    def describe() -> None:
        with HDF5File(source, label="chunks.nc") as f:
            f.variable("w").storage_layout()

    assert _peak(describe) < 16 << 20


def test_header_of_many_messages(tmp_path):
    """A scalar dataset with 300 attributes stored compactly (HDF5 allows it): past the parser's
    bound on messages, h5py reads it, as before."""
    path = tmp_path / "many.nc"
    with h5py.File(path, "w", libver="latest") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_attr_phase_change(1000, 900)
        space = h5py.h5s.create(h5py.h5s.SCALAR)
        h5py.h5d.create(f.id, b"s", h5py.h5t.IEEE_F64LE, space, dcpl=dcpl).write(
            h5py.h5s.ALL, h5py.h5s.ALL, np.array(1.5))
        for i in range(300):
            f["s"].attrs[f"a{i:03d}"] = np.int32(i)
    data = path.read_bytes()
    assert len(_messages(data, 0x0C)) == 300
    assert _same(data, ["s"]) == []


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_no_descriptor_left_by_declined_or_refused_files(tmp_path):
    """Local files the parser declines (h5py opens them) or that nobody can open: each descriptor
    the parser opened is closed, 50 times over."""
    declined = tmp_path / "declined.nc"
    with netCDF4.Dataset(declined, "w") as nc:  # (more than 8 attributes: stored densely, declined)
        nc.createDimension("x", 3)
        v = nc.createVariable("v", "f4", ("x",))
        for i in range(12):
            v.setncattr(f"a{i}", i)
    with HDF5File(declined) as f:
        assert not isinstance(f.variable("v"), ParsedVariable)
    truncated = tmp_path / "truncated.nc"
    truncated.write_bytes(_base(tmp_path)[:3000])
    before = _descriptors()
    for _ in range(50):
        with HDF5File(declined) as f:
            _outcome(lambda: f.variable("v"))
        _outcome(lambda: HDF5File(truncated))
    assert _descriptors() == before


def test_chunk_btree_node_pointing_to_itself_does_not_crash(tmp_path):
    path = tmp_path / "tree.nc"
    path.write_bytes(_second_child_replaced(path, lambda root, first: root))
    child = ("import sys\nfrom daskcfa.fragments.hdf5 import HDF5File\n"
             "try:\n    with HDF5File(sys.argv[1]) as f:\n        f.variable('w').read((slice(None),))\n"
             "except Exception as exc:\n    print(type(exc).__name__)\n")
    done = subprocess.run([sys.executable, "-c", child, str(path)], cwd=Path(__file__).parents[2],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.returncode


def test_chunk_btree_loop_through_the_api_is_a_fragment_error(tmp_path):
    """The same loop in a fragment of an aggregation: a daskcfa error naming file, variable and
    fragment, netCDF4-python not asked to read it (its HDF5 could recurse as h5py's does)."""
    import daskcfa

    good, bad = tmp_path / "a.nc", tmp_path / "b.nc"
    for i, path in enumerate((good, bad)):
        with netCDF4.Dataset(path, "w") as nc:
            nc.createDimension("n", 100)
            nc.createVariable("n", "i4", ("n",))[:] = np.arange(100) + 100 * i
            nc.createVariable("w", "i4", ("n",), chunksizes=(1,))[:] = np.arange(100)
    target = str(tmp_path / "agg.nc")
    daskcfa.aggregate([str(good), str(bad)], target, concat_dims=["n"])
    looped = _second_child_replaced(tmp_path / "loop.nc", lambda root, first: root)
    bad.write_bytes(looped)  # (the aggregation holds b.nc's coordinates: only w's chunks are read)
    code = ("import sys, daskcfa\n"
            "try:\n    daskcfa.from_cfa(sys.argv[1], 'w').compute()\n"
            "except daskcfa.CFAError as exc:\n    print(type(exc).__name__, '|', exc)\n")
    done = subprocess.run([sys.executable, "-c", code, target], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.returncode
    assert done.stdout.startswith("LoopedChunkIndex |"), done.stdout
    assert "b.nc'" in done.stdout and "variable '/w'" in done.stdout and "fragment (1,)" in done.stdout
