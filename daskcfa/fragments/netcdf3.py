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
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

import numpy as np

from ..errors import FragmentReadError
from ..storage.blocks import Blocks
from .hdf5 import DirectReadUnsupported, normalize_key

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
#: a dense selection is read in one range when that reads at most this many times the bytes wanted
_DENSE = 2


@dataclass(frozen=True)
class _Var:
    name: str
    dimids: tuple[int, ...]
    attributes: tuple[int, int]  #: where its attribute list lies in the header (decoded on demand)
    nc_type: int
    begin: int


class _Header:
    """Big-endian reads through a netCDF-3 header, fetching more bytes as needed."""

    def __init__(self, read: Callable[[int, int], Any], version: int, length: int) -> None:
        self._read = read  # (offset, n) -> up to n bytes
        self._length = min(length, _MAX_HEADER)  # (what a hostile count may make us read)
        self._buffer = b""
        self.pos = 4
        self.wide = version == 5  # CDF-5: 64-bit counts and sizes
        self._uint = struct.Struct(">I")
        self._count = struct.Struct(">Q" if self.wide else ">I")
        self._offset = struct.Struct(">I" if version == 1 else ">Q")

    def _need(self, n: int) -> int:
        """The position of the next ``n`` bytes, which are now in the buffer."""
        pos, end = self.pos, self.pos + n
        if end > len(self._buffer):
            if end > self._length:
                raise EOFError
            self._buffer = bytes(self._read(0, min(max(end, 2 * len(self._buffer), 1 << 16), self._length)))
            if end > len(self._buffer):
                raise EOFError
        self.pos = end
        return pos

    def _unpack(self, form: struct.Struct) -> int:
        pos = self._need(form.size)
        return form.unpack_from(self._buffer, pos)[0]

    def uint(self) -> int:
        return self._unpack(self._uint)

    def count(self) -> int:
        return self._unpack(self._count)

    def offset(self) -> int:
        return self._unpack(self._offset)

    def raw(self, n: int) -> bytes:
        """``n`` bytes, then the padding to a multiple of 4."""
        pos = self._need(n + (-n % 4))
        return self._buffer[pos:pos + n]

    def name(self) -> str:
        return self.raw(self.count()).decode("utf-8", "replace")

    def nc_type(self) -> int:
        code = self.uint()
        if code not in _TYPES or (code > 6 and not self.wide):
            raise ValueError(f"unknown type {code}")
        return code

    def skip_attributes(self) -> tuple[int, int]:
        """Pass over an attribute list; where it lies."""
        start = self.pos
        self.uint()  # NC_ATTRIBUTE or ABSENT
        for _ in range(self.count()):
            self.raw(self.count())
            code = self.nc_type()
            self.raw(self.count() * _TYPES[code].itemsize)
        return start, self.pos

    def attributes(self, where: tuple[int, int]) -> dict[str, Any]:
        """The attribute list at ``where`` (see :meth:`skip_attributes`), decoded."""
        self.pos = where[0]
        self.uint()
        attrs = {}
        for _ in range(self.count()):
            name = self.name()
            code = self.nc_type()
            n = self.count()
            attrs[name] = _attribute(self.raw(n * _TYPES[code].itemsize), code, n)
        return attrs


def _attribute(raw: bytes, code: int, n: int) -> Any:
    """An attribute value as netCDF4-python returns it (text without NULs; one number as a numpy scalar)."""
    if code == _CHAR:
        return raw.decode("utf-8", "replace").replace("\x00", "")
    stored = _TYPES[code]
    values = np.frombuffer(raw, stored, n).astype(stored.newbyteorder("="))
    return values[0] if n == 1 else values


class _Layout:
    """A parsed netCDF-3 header: dimensions, global attributes, variables and record size."""

    def __init__(self, h: _Header) -> None:
        self.header = h
        numrecs = h.count()
        self.streaming = numrecs == (1 << (64 if h.wide else 32)) - 1
        self.numrecs = 0 if self.streaming else numrecs
        h.uint()  # NC_DIMENSION or ABSENT
        self.dims: list[tuple[str, int]] = [(h.name(), h.count()) for _ in range(h.count())]
        h.skip_attributes()  # (global attributes: a fragment's are not read)
        h.uint()  # NC_VARIABLE or ABSENT
        self.vars: dict[str, _Var] = {}
        for _ in range(h.count()):
            name = h.name()
            dimids = tuple(h.count() for _ in range(h.count()))
            attributes = h.skip_attributes()
            code = h.nc_type()
            h.count()  # vsize: recomputed below (it saturates for large variables)
            begin = h.offset()
            if any(d >= len(self.dims) for d in dimids):
                raise ValueError("bad dimension id")
            self.vars[name] = _Var(name, dimids, attributes, code, begin)
        records = [v for v in self.vars.values() if self.is_record(v)]
        # one record variable: its records are not padded; else each holds every record variable's padded slice
        self.recsize = self.slab(records[0]) if len(records) == 1 else sum(_padded(self.slab(v)) for v in records)

    def is_record(self, var: _Var) -> bool:
        return bool(var.dimids) and self.dims[var.dimids[0]][1] == 0

    def shape(self, var: _Var) -> tuple[int, ...]:
        return tuple(self.numrecs if length == 0 else length for _, length in (self.dims[d] for d in var.dimids))

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


def _parse(read: Callable[[int, int], Any], length: int) -> _Layout:
    head = bytes(read(0, 4))
    if head not in SIGNATURES:
        raise FragmentReadError("not a netCDF-3 file")
    try:
        layout = _Layout(_Header(read, head[3], length))
    except (EOFError, ValueError, UnicodeError, struct.error):
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
        self._fd = fd
        if fd is not None:
            self._layout = _parse(self._read_some, os.fstat(fd).st_size)
        else:
            self._data = data if isinstance(data, Blocks) else memoryview(data).cast("B")
            self._layout = _parse(self._read_some, len(self._data))

    def _read_some(self, offset: int, n: int) -> Any:
        """Up to ``n`` bytes from ``offset`` (fewer at the end of the file)."""
        if self._fd is not None:
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
        try:
            head = os.pread(fd, 4, 0)
        except OSError:
            head = b""
        if head not in SIGNATURES:
            os.close(fd)
            return None
        return NetCDF3File(fd=fd)
    except BaseException:
        os.close(fd)
        raise


class NetCDF3Variable:
    """One variable of a :class:`NetCDF3File`; :meth:`read` returns raw stored values, native byte order."""

    def __init__(self, file: NetCDF3File, var: _Var) -> None:
        layout = file._layout
        self._file = file
        self._stored = _TYPES[var.nc_type]
        self._begin = var.begin
        self.name = var.name
        self.dims = tuple(layout.dims[d][0] for d in var.dimids)
        self.shape = layout.shape(var)
        self.dtype = self._stored.newbyteorder("=")
        self.attrs = layout.header.attributes(var.attributes)
        #: netCDF-3 stores no chunks: nothing is decoded beyond the selection read
        self.chunk_nbytes = 0
        #: netCDF-3 records no per-variable NOFILL: netCDF4-python applies the default fill
        self.no_fill = False
        itemsize = self._stored.itemsize
        #: bytes from one index to the next along each dimension (records for the first of a record variable)
        self._strides = tuple(itemsize * math.prod(self.shape[k + 1:]) for k in range(len(self.shape)))
        if layout.is_record(var):
            self._strides = (layout.recsize,) + self._strides[1:]

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
