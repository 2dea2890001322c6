"""netCDF-3 files (CDF-1, CDF-2, CDF-5) read directly: the header parsed here, the data read with pread.

The classic format is a header followed by each variable's values at the
offset the header gives (big-endian; record variables interleaved record by
record), so no library is needed to read it. Reading outside netCDF-C keeps
its lock free for other threads and costs less than netCDF-C's own open of a
small file (thousands of small netCDF-3 fragments are common in archives).
Character variables are left to netCDF4-python (its char-to-string rules):
:meth:`NetCDF3File.variable` raises ``DirectReadUnsupported`` for them.

A file shorter than its header says is refused: netCDF-C reads the missing
tail as zeros or garbage without complaint.

A file's first 64 KiB are read at once: the whole header of most files, and
the whole of a small one (whose descriptor is then closed at once).
"""

from __future__ import annotations

import math
import os
import struct
import threading
from types import MappingProxyType
from typing import Any, BinaryIO, Callable, Mapping, NamedTuple

import numpy as np

from ..errors import BudgetError, FragmentReadError, ReferencesError
from ..storage.blocks import Blocks
from .hdf5 import DirectReadUnsupported, normalize_key
from .layout import StoredLayout
from .manager import manager

__all__ = ["SIGNATURES", "NetCDF3File", "NetCDF3Variable", "check_netcdf3_length", "open_netcdf3"]

#: The first four bytes of CDF-1 (classic), CDF-2 (64-bit offset) and CDF-5 (64-bit data) files.
SIGNATURES = (b"CDF\x01", b"CDF\x02", b"CDF\x05")
#: What a file in memory may be held in.
_IN_MEMORY = (bytes, bytearray, memoryview, np.ndarray)
#: stored dtype of each netCDF-3 type code (7-11 exist in CDF-5 only)
_TYPES = {1: np.dtype("i1"), 2: np.dtype("S1"), 3: np.dtype(">i2"), 4: np.dtype(">i4"), 5: np.dtype(">f4"),
          6: np.dtype(">f8"), 7: np.dtype("u1"), 8: np.dtype(">u2"), 9: np.dtype(">u4"), 10: np.dtype(">i8"),
          11: np.dtype(">u8")}
_CHAR = 2
#: a longer header is refused as malformed (real ones are kilobytes)
_MAX_HEADER = 256 << 20
#: ... and one longer than this share of the memory budget is refused (it is held twice as it is read again)
_HEADER_SHARE = 4
#: a dense selection is read in one range when that reads at most this many times the bytes wanted
_DENSE = 2
#: bytes read first: the whole header of most files, and the whole of a small file
_FIRST_READ = 1 << 16


class _Var(NamedTuple):  # (a tuple: made for every variable of every header parsed, faster than a dataclass)
    name: str
    dimids: tuple[int, ...]
    attributes: int  #: where its attribute list starts in the header (decoded on demand)
    nc_type: int
    begin: int


class _Truncated(Exception):
    """The header runs past the bytes at hand."""


_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
#: an attribute's type code and value count (the count 64-bit in CDF-5)
_TYPE_AND_COUNT = struct.Struct(">II").unpack_from
_TYPE_AND_COUNT_WIDE = struct.Struct(">IQ").unpack_from
#: bytes a value of each type code takes: codes 7-11 exist in CDF-5 only
_ITEMSIZES_WIDE = {code: dtype.itemsize for code, dtype in _TYPES.items()}
_ITEMSIZES = {code: size for code, size in _ITEMSIZES_WIDE.items() if code <= 6}


class _Header:
    """One pass over a netCDF-3 header held in ``buf`` (big-endian; counts and sizes
    are 64-bit in CDF-5, offsets 64-bit from CDF-2 on). Written for speed: archives
    hold thousands of small files, and each read parses its file's header. Reading
    past ``buf`` raises ``struct.error`` or :class:`_Truncated`."""

    def __init__(self, buf: bytes, version: int) -> None:
        self.buf = buf
        self.version = version
        self.wide = version == 5
        self._count, self._csize = (_U64, 8) if self.wide else (_U32, 4)
        self._offset = _U32 if version == 1 else _U64
        self._type_and_count = _TYPE_AND_COUNT_WIDE if self.wide else _TYPE_AND_COUNT
        self._itemsizes = _ITEMSIZES_WIDE if self.wide else _ITEMSIZES

    def name(self, pos: int) -> tuple[str, int]:
        """The name at ``pos`` and the position after it."""
        n = self._count(self.buf, pos)[0]
        pos += self._csize
        raw = self.buf[pos:pos + n]
        if len(raw) != n:
            raise _Truncated
        return raw.decode("utf-8", "replace"), pos + n + (-n % 4)

    def attributes(self, pos: int, decode: bool = False) -> tuple[dict[str, Any], int]:
        """The attribute list at ``pos`` (values decoded only with ``decode``) and the position after it."""
        buf, count, csize, itemsizes, type_and_count = (self.buf, self._count, self._csize, self._itemsizes,
                                                        self._type_and_count)
        end = len(buf)
        n = count(buf, pos + 4)[0]  # (past the NC_ATTRIBUTE or ABSENT tag)
        pos += 4 + csize
        attrs: dict[str, Any] = {}
        for _ in range(n):
            length = count(buf, pos)[0]
            name_end = pos + csize + length
            pos = name_end + (-length % 4)
            code, values = type_and_count(buf, pos)
            itemsize = itemsizes.get(code)
            if itemsize is None:
                raise ValueError(f"unknown type {code}")
            pos += 4 + csize
            nbytes = values * itemsize
            if pos + nbytes > end:
                raise _Truncated
            if decode:
                name = buf[name_end - length:name_end].decode("utf-8", "replace")
                attrs[name] = _attribute(buf[pos:pos + nbytes], code, values)
            pos += nbytes + (-nbytes % 4)
        return attrs, pos

    def layout(self) -> "_Layout":
        """The whole header parsed."""
        buf, count, csize = self.buf, self._count, self._csize
        numrecs = count(buf, 4)[0]
        pos = 8 + csize  # (past the NC_DIMENSION or ABSENT tag)
        ndims = count(buf, pos)[0]
        pos += csize
        dims = []
        for _ in range(ndims):
            name, pos = self.name(pos)
            dims.append((name, count(buf, pos)[0]))
            pos += csize
        _, pos = self.attributes(pos)  # (global attributes: a fragment's are not read)
        variables = _VARIABLE_LISTS.find(self, pos, ndims)
        if variables is None:
            start = pos
            variables, pos = self._variables(pos, ndims)
            _VARIABLE_LISTS.remember(self, start, pos, ndims, variables)
        return _Layout(self, numrecs, dims, variables)

    def _variables(self, pos: int, ndims: int) -> tuple[dict[str, _Var], int]:
        """The variable list at ``pos`` (of a header with ``ndims`` dimensions) and the position after it."""
        buf, count, csize = self.buf, self._count, self._csize
        nvars = count(buf, pos + 4)[0]  # (past the NC_VARIABLE or ABSENT tag)
        pos += 4 + csize
        variables: dict[str, _Var] = {}
        for _ in range(nvars):
            name, pos = self.name(pos)
            rank = count(buf, pos)[0]
            pos += csize
            if pos + rank * csize > len(buf):
                raise _Truncated
            dimids = struct.unpack_from(f">{rank}{'Q' if self.wide else 'I'}", buf, pos)
            pos += rank * csize
            attributes = pos
            _, pos = self.attributes(pos)
            code = _U32(buf, pos)[0]
            if code not in self._itemsizes:
                raise ValueError(f"unknown type {code}")
            begin = self._offset(buf, pos + 4 + csize)[0]  # (past vsize: recomputed, it saturates)
            pos += 4 + csize + (4 if self._offset is _U32 else 8)
            if rank and max(dimids) >= ndims:
                raise ValueError("bad dimension id")
            variables[name] = _Var(name, dimids, attributes, code, begin)
        return variables, pos


class _VariableLists:
    """The variable lists of the last few headers parsed, by their bytes. The fragments of an
    archive mostly hold the same variables at the same places, and their headers differ before
    (global attributes, dimension sizes) if at all: a list whose bytes, position, format version
    and dimension count are those of one parsed before parses to the same variables, so it is
    compared byte for byte instead of parsed again (the checks made on it held for those bytes)."""

    #: lists remembered, and the longest remembered (in bytes)
    ENTRIES = 8
    LONGEST = 16 << 10

    def __init__(self) -> None:
        self._entries: tuple[tuple[int, int, int, bytes, Mapping[str, _Var]], ...] = ()
        self._lock = threading.Lock()
        self._attributes: dict[int, tuple[_Var, dict[str, Any]]] = {}  # (by the variable's identity)

    def find(self, header: _Header, pos: int, ndims: int) -> Mapping[str, _Var] | None:
        """The variables of the list at ``pos`` of ``header``, if its bytes were parsed before."""
        buf = header.buf
        for version, start, dimensions, raw, variables in self._entries:
            if start == pos and version == header.version and dimensions == ndims and buf.startswith(raw, pos):
                return variables
        return None

    def remember(self, header: _Header, start: int, end: int, ndims: int, variables: dict[str, _Var]) -> None:
        """Keep the list parsed from ``start`` to ``end`` of ``header``."""
        if end - start > self.LONGEST:
            return
        entry = (header.version, start, ndims, bytes(header.buf[start:end]), MappingProxyType(variables))
        with self._lock:
            self._entries = (entry,) + self._entries[:self.ENTRIES - 1]

    def attributes(self, header: _Header, var: _Var) -> dict[str, Any]:
        """The attributes of ``var`` of ``header``, decoded once per variable of a list remembered (one
        found again is the same object, its attributes the same bytes, at most :attr:`LONGEST`); each
        caller gets its own dict and arrays."""
        known = self._attributes.get(id(var))
        if known is None or known[0] is not var:
            known = (var, header.attributes(var.attributes, decode=True)[0])
            if not any(variables.get(var.name) is var for *_, variables in self._entries):
                return known[1]  # (a list too long to remember, or forgotten: its variables are not met again)
            if len(self._attributes) >= self.ENTRIES * 4:
                self._attributes.clear()
            self._attributes[id(var)] = known
        return {name: value.copy() if isinstance(value, np.ndarray) else value for name, value in known[1].items()}


_VARIABLE_LISTS = _VariableLists()


def _attribute(raw: bytes, code: int, n: int) -> Any:
    """An attribute value as netCDF4-python returns it (text without NULs; one number as a numpy scalar)."""
    if code == _CHAR:
        return raw.decode("utf-8", "replace").replace("\x00", "")
    stored = _TYPES[code]
    values = np.frombuffer(raw, stored, n).astype(stored.newbyteorder("="))
    return values[0] if n == 1 else values


class _Layout:
    """A parsed netCDF-3 header: dimensions, global attributes, variables and record size."""

    def __init__(self, header: _Header, numrecs: int, dims: list[tuple[str, int]],
                 variables: Mapping[str, _Var]) -> None:
        self.header = header
        self.streaming = numrecs == (1 << (64 if header.wide else 32)) - 1
        self.numrecs = 0 if self.streaming else numrecs
        self.dims = dims
        self.vars = variables
        # (worked out once a header: the checks and every variable opened use them)
        sizes = [self.numrecs if length == 0 else length for _, length in dims]
        self._shapes = {name: tuple(sizes[d] for d in var.dimids) for name, var in variables.items()}
        self._records = {name for name, var in variables.items() if var.dimids and dims[var.dimids[0]][1] == 0}
        records = [v for v in variables.values() if self.is_record(v)]
        # one record variable: its records are not padded; else each holds every record variable's padded slice
        self.recsize = self.slab(records[0]) if len(records) == 1 else sum(_padded(self.slab(v)) for v in records)

    def is_record(self, var: _Var) -> bool:
        return var.name in self._records

    def shape(self, var: _Var) -> tuple[int, ...]:
        return self._shapes[var.name]

    def slab(self, var: _Var) -> int:
        """Bytes of one record of a record variable, or of the whole of any other variable."""
        return _TYPES[var.nc_type].itemsize * math.prod(self.shape(var)[self.is_record(var):])

    def extent(self) -> int | None:
        """The least file length the header describes (None when the record count is not recorded)."""
        end = 0
        for var in self.vars.values():
            if not self.is_record(var):
                end = max(end, var.begin + self.slab(var))
            elif self.streaming:
                return None
            elif self.numrecs:
                end = max(end, var.begin + (self.numrecs - 1) * self.recsize + self.slab(var))
        return end


def _padded(n: int) -> int:
    return n + (-n % 4)


def _parse(read: Callable[[int, int], Any], length: int, first: Any = b"") -> _Layout:
    """The layout of the file that ``read`` reads (``length`` bytes long, beginning with ``first``).
    A header longer than ``first`` is read again, twice as much each time (a count
    in a hostile header may claim more than the file holds: the file's length bounds it,
    and the memory budget: a 14-byte header in a 600 MiB file made it read 256 MiB twice)."""
    buf = bytes(first) if len(first) >= 4 else bytes(read(0, min(length, _FIRST_READ)))
    if buf[:4] not in SIGNATURES:
        raise FragmentReadError("not a netCDF-3 file")
    limit = min(length, _MAX_HEADER)
    while True:
        try:
            layout = _Header(buf, buf[3]).layout()
            break
        except (_Truncated, struct.error):
            budget = manager().budget.memory // _HEADER_SHARE  # (looked up only for a header this long)
            if len(buf) >= min(limit, budget):
                if budget < limit:
                    raise BudgetError(f"a netCDF-3 header longer than {budget:,} bytes, a quarter of the memory "
                                      "budget (daskcfa.budget.memory)") from None
                raise FragmentReadError(f"malformed or truncated netCDF-3 header ({length} bytes)") from None
            buf = bytes(read(0, min(limit, budget, max(2 * len(buf), _FIRST_READ))))
        except (ValueError, UnicodeError):
            raise FragmentReadError(f"malformed or truncated netCDF-3 header ({length} bytes)") from None
    needed = layout.extent()
    if needed is not None and length < needed:
        raise FragmentReadError(f"truncated netCDF-3 file: {length} bytes, its header describes {needed}")
    return layout


def check_netcdf3_length(source: bytes | np.ndarray | BinaryIO, length: int) -> None:
    """Raise :class:`FragmentReadError` if a netCDF-3 file is shorter than its header says."""
    if isinstance(source, _IN_MEMORY):
        view = memoryview(source).cast("B")
        read: Callable[[int, int], Any] = lambda offset, n: view[offset:offset + n]
    else:
        def read(offset: int, n: int) -> bytes:
            source.seek(offset)
            return source.read(n)
    if bytes(read(0, 4)) in SIGNATURES:
        _parse(read, length)


class NetCDF3File:
    """An open netCDF-3 file: a local file's descriptor ``fd`` (closed with the file; see
    :func:`open_netcdf3`) or a whole file in memory (``data``: a buffer or Blocks)."""

    def __init__(self, *, fd: int | None = None, data: Any = None) -> None:
        self._fd = fd  # (owned from here: closed by this object, also when opening fails)
        try:
            if fd is not None:  # its first bytes read now (a small file: all of it, and closed)
                length = os.fstat(fd).st_size
                self._data: Any = memoryview(os.pread(fd, min(length, _FIRST_READ), 0))
                if len(self._data) == length:
                    self.close()
                first = self._data
            else:
                self._data = data if isinstance(data, Blocks) else memoryview(data).cast("B")
                length = len(self._data)
                first = (self._data.read(0, min(length, _FIRST_READ)) if isinstance(data, Blocks)
                         else self._data[:_FIRST_READ])
            self._layout = _parse(self._read_some, length, first)
        except BaseException:
            self.close()
            raise

    def _read_some(self, offset: int, n: int) -> Any:
        """Up to ``n`` bytes from ``offset`` (fewer at the end of the file)."""
        if self._fd is not None and offset + n > len(self._data):  # (beyond the first bytes)
            return os.pread(self._fd, n, offset)
        if isinstance(self._data, Blocks):
            return self._data.read(offset, n)
        return self._data[offset:offset + n]

    def _read(self, offset: int, n: int) -> Any:
        data = self._read_some(offset, n)
        if len(data) != n:
            raise FragmentReadError(f"truncated netCDF-3 file: {n} bytes at offset {offset} cannot be read")
        return data

    def variable(self, name: str) -> "NetCDF3Variable":
        """The variable ``name`` (KeyError if absent: netCDF-3 has no groups)."""
        parts = [p for p in name.split("/") if p]
        var = self._layout.vars.get(parts[0]) if len(parts) == 1 else None
        if var is None:
            raise KeyError(name)
        if var.nc_type == _CHAR:
            raise DirectReadUnsupported(f"character variable {name!r}")
        if self._layout.streaming and self._layout.is_record(var):
            raise DirectReadUnsupported(f"record variable {name!r} of a file in streaming mode")
        return NetCDF3Variable(self, var)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_netcdf3(path: str) -> NetCDF3File | None:
    """The local file at ``path`` opened as netCDF-3, or None when it does not start
    with a netCDF-3 signature, or cannot be read (the other engines report why).
    Decided from its first bytes: one open, nothing tried."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (never waits for a writer on a FIFO)
    except OSError:
        return None
    try:
        head = os.pread(fd, 4, 0)
    except OSError:
        head = b""
    if head not in SIGNATURES:
        os.close(fd)
        return None
    return NetCDF3File(fd=fd)  # (which closes ``fd`` whatever happens)


class NetCDF3Variable:
    """One variable of a :class:`NetCDF3File`; :meth:`read` returns raw stored values, native byte order."""

    #: netCDF-3 stores no chunks: nothing is decoded beyond the selection read
    chunk_nbytes = 0
    #: netCDF-3 records no per-variable NOFILL: netCDF4-python applies the default fill
    no_fill = False

    def __init__(self, file: NetCDF3File, var: _Var) -> None:
        layout = file._layout
        self._file = file
        self._stored = _TYPES[var.nc_type]
        self._begin = var.begin
        self.name = var.name
        self.dims = tuple(layout.dims[d][0] for d in var.dimids)
        self.shape = layout.shape(var)
        self.dtype = self._stored.newbyteorder("=")
        self.attrs = _VARIABLE_LISTS.attributes(layout.header, var)
        itemsize = self._stored.itemsize
        #: bytes from one index to the next along each dimension (records for the first of a record variable)
        self._strides = tuple(itemsize * math.prod(self.shape[k + 1:]) for k in range(len(self.shape)))
        if layout.is_record(var):
            self._strides = (layout.recsize,) + self._strides[1:]

    def storage_layout(self) -> StoredLayout:
        """The variable as one contiguous chunk (netCDF-3 has no other layout), unless it is a
        record variable whose records are interleaved with other record variables'."""
        dense = self._stored.itemsize * math.prod(self.shape[1:])
        if self.shape and self.shape[0] > 1 and self._strides[0] != dense:
            raise ReferencesError("a record variable of a netCDF-3 file whose records interleave with other "
                                  "record variables': its values are not contiguous")
        fill = self.attrs.get("_FillValue")
        return StoredLayout.contiguous(self._stored, self.shape, self._begin, fill)

    def read(self, key: tuple) -> np.ndarray:
        """The raw stored values at ``key`` (one int or step>0 slice per dimension), like netCDF4
        with ``set_auto_maskandscale(False)``."""
        starts, steps, counts, out_shape = normalize_key(key, self.shape)
        if 0 in counts:
            return np.empty(out_shape, self.dtype)
        if not self.shape:
            return np.frombuffer(self._file._read(self._begin, self._stored.itemsize), self._stored)[0].astype(
                self.dtype)
        # the bytes spanned by the selection within one index of the first dimension
        first = sum(s * st for s, st in zip(starts[1:], self._strides[1:]))
        span = self._stored.itemsize + sum((c - 1) * s * st for c, s, st in zip(counts[1:], steps[1:], self._strides[1:]))
        inner = tuple(s * st for s, st in zip(steps[1:], self._strides[1:]))
        step0 = steps[0] * self._strides[0]
        offset = self._begin + starts[0] * self._strides[0] + first
        whole = (counts[0] - 1) * step0 + span
        if whole <= _DENSE * counts[0] * span:
            buffer = self._file._read(offset, whole)
            data = np.ndarray((counts[0], *counts[1:]), self._stored, buffer, 0, (step0, *inner))
        else:  # sparse along the first dimension: one range per index
            data = np.empty(counts, self._stored)
            for i in range(counts[0]):
                buffer = self._file._read(offset + i * step0, span)
                data[i] = np.ndarray(tuple(counts[1:]), self._stored, buffer, 0, inner)
        return data.astype(self.dtype).reshape(out_shape)
