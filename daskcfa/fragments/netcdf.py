"""Fragments read through netCDF4-python: every netCDF format, under the lock."""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

import netCDF4
import numpy as np

from ..errors import FragmentReadError
from ..storage import netcdf_memory
from ..locks import HDF5_LOCK

#: What a file in memory may be held in.
_IN_MEMORY = (bytes, bytearray, memoryview, np.ndarray)


class NetCDF4Variable:
    """One variable of an open fragment; :meth:`read` returns raw stored values."""

    def __init__(self, var: netCDF4.Variable) -> None:
        self._var = var
        self.name = var.name
        self.dims = tuple(var.dimensions)
        self.shape = tuple(var.shape)
        self.dtype = np.dtype(var.dtype) if var.dtype is not str else np.dtype(object)
        self.attrs: dict[str, Any] = {k: var.getncattr(k) for k in var.ncattrs()}
        #: stored without netCDF's fill (no default fill value for a byte variable)
        self.no_fill = self.dtype.kind in "iu" and self.dtype.itemsize == 1 and var.get_fill_value() is None

    def read(self, key: tuple) -> np.ndarray:
        """Stored values: no masking, scaling or ``_Unsigned`` view; ``char`` arrays
        as characters (even with ``_Encoding``), vlen strings as ``object``."""
        with HDF5_LOCK:
            self._var.set_auto_maskandscale(False)
            self._var.set_always_mask(False)
            self._var.set_auto_chartostring(False)
            if self.shape == ():
                return np.asarray(self._var.getValue(), dtype=self.dtype)
            data = self._var[key]
        return np.asarray(data, dtype=self.dtype)


class NetCDF4File:
    """An open fragment file (any format netCDF-C reads).

    A netCDF-3 file cut short is refused here: netCDF-C reads the missing
    bytes as zeros or garbage without complaint.
    """

    def __init__(self, path: str, *, memory: bytes | None = None) -> None:
        if memory is not None:  # a whole object's bytes, as stored
            check_netcdf3_length(memory, len(memory))
            memory = netcdf_memory(memory)
        elif os.path.isfile(path):
            with open(path, "rb") as f:
                check_netcdf3_length(f, os.fstat(f.fileno()).st_size)
        with HDF5_LOCK:
            if memory is None:
                self._ds = netCDF4.Dataset(path, "r")
            else:
                self._ds = netCDF4.Dataset(path, "r", memory=memory)

    def variable(self, name: str) -> NetCDF4Variable:
        with HDF5_LOCK:
            group: Any = self._ds
            parts = [p for p in name.split("/") if p]
            for part in parts[:-1]:
                group = group.groups[part]
            if not parts:
                raise KeyError(name)
            return NetCDF4Variable(group.variables[parts[-1]])

    def close(self) -> None:
        with HDF5_LOCK:
            if self._ds.isopen():
                self._ds.close()

    def __enter__(self) -> "NetCDF4File":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- netCDF-3 length check ----------------------------------------------------

#: bytes per value of each netCDF-3 (CDF-1/2/5) type code
_NC3_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 8}
_STREAMING = 0xFFFFFFFF


class _Header:
    """Big-endian reads through a netCDF-3 header, fetching more bytes as needed."""

    def __init__(self, source: bytes | BinaryIO, version: int) -> None:
        self._source = source
        self._buffer = b""
        self._pos = 4
        self.wide = version == 5  # CDF-5: 64-bit counts and sizes
        self.offset_size = 4 if version == 1 else 8

    def _take(self, n: int) -> bytes:
        end = self._pos + n
        if end > len(self._buffer):
            want = max(end, 2 * len(self._buffer), 1 << 16)
            if isinstance(self._source, _IN_MEMORY):
                self._buffer = bytes(self._source[:want])
            else:
                self._source.seek(0)
                self._buffer = self._source.read(want)
            if end > len(self._buffer):
                raise EOFError
        data = self._buffer[self._pos:end]
        self._pos = end
        return data

    def uint(self, size: int = 4) -> int:
        return int.from_bytes(self._take(size), "big")

    def count(self) -> int:
        return self.uint(8 if self.wide else 4)

    def skip(self, n: int) -> None:
        self._take(n + (-n % 4))

    def name(self) -> None:
        self.skip(self.count())

    def attributes(self) -> None:
        self.uint()  # NC_ATTRIBUTE or ABSENT
        for _ in range(self.count()):
            self.name()
            size = _NC3_TYPE_SIZES.get(self.uint())
            if size is None:
                raise ValueError("unknown attribute type")
            self.skip(size * self.count())


def check_netcdf3_length(source: bytes | np.ndarray | BinaryIO, length: int) -> None:
    """Raise :class:`FragmentReadError` if a netCDF-3 file is shorter than its header says."""
    head = bytes(source[:4]) if isinstance(source, _IN_MEMORY) else source.read(4)
    if head[:3] != b"CDF" or head[3:] not in (b"\x01", b"\x02", b"\x05"):
        return
    try:
        needed = _netcdf3_extent(_Header(source, head[3]))
    except (EOFError, ValueError, struct.error):
        raise FragmentReadError(f"malformed or truncated netCDF-3 header ({length} bytes)") from None
    if needed is not None and length < needed:
        raise FragmentReadError(f"truncated netCDF-3 file: {length} bytes, its header describes {needed}")


def _netcdf3_extent(h: _Header) -> int | None:
    """The least file length the header describes (None when the record count is not recorded)."""
    numrecs = h.count()
    h.uint()  # NC_DIMENSION or ABSENT
    lengths = []
    for _ in range(h.count()):
        h.name()
        lengths.append(h.count())
    h.attributes()
    h.uint()  # NC_VARIABLE or ABSENT
    fixed_end = 0
    records: list[tuple[int, int, int]] = []  # (begin, vsize, bytes per record)
    for _ in range(h.count()):
        h.name()
        dimids = [h.count() for _ in range(h.count())]
        h.attributes()
        size = _NC3_TYPE_SIZES.get(h.uint())
        if size is None or any(d >= len(lengths) for d in dimids):
            raise ValueError("bad variable")
        vsize = h.count()
        begin = h.uint(h.offset_size)
        is_record = bool(dimids) and lengths[dimids[0]] == 0
        nbytes = size * int(np.prod([lengths[d] for d in dimids[is_record:]], dtype=np.int64))
        if is_record:
            records.append((begin, vsize, nbytes))
        else:
            fixed_end = max(fixed_end, begin + nbytes)
    if not records or numrecs == 0:
        return fixed_end
    if numrecs == _STREAMING:
        return None
    # one record variable: records are not padded; else each holds every record variable's padded slice
    recsize = records[0][2] if len(records) == 1 else sum(vsize for _, vsize, _ in records)
    return max(fixed_end, *(begin + (numrecs - 1) * recsize + nbytes for begin, _, nbytes in records))
