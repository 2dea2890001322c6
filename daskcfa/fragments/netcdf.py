"""Fragments read through netCDF4-python: every netCDF format, under the lock."""

from __future__ import annotations

import math
import os
from typing import Any

import netCDF4
import numpy as np

from ..errors import CFAFormatError, FragmentReadError
from ..storage import netcdf_memory
from ..storage.nesting import check_nesting
from ..locks import NETCDF_LOCK
from .netcdf3 import check_netcdf3_length


class NetCDF4Variable:
    """One variable of an open fragment; :meth:`read` returns raw stored values."""

    def __init__(self, var: netCDF4.Variable) -> None:
        self._var = var
        self.name = var.name
        self.dims = tuple(var.dimensions)
        self.shape = tuple(var.shape)
        self.dtype = np.dtype(var.dtype) if var.dtype is not str else np.dtype(object)
        self.attrs: dict[str, Any] = {k: var.getncattr(k) for k in var.ncattrs()}
        chunking = var.chunking() if self.shape else None  # (netCDF-3: None; contiguous: a string)
        #: Bytes netCDF-C decodes at once for one chunk (0: not chunked; vlen strings count their pointers).
        self.chunk_nbytes = math.prod(chunking) * self.dtype.itemsize if isinstance(chunking, list) else 0
        #: stored without netCDF's fill (no default fill value for a byte variable)
        self.no_fill = self.dtype.kind in "iu" and self.dtype.itemsize == 1 and var.get_fill_value() is None

    def read(self, key: tuple) -> np.ndarray:
        """Stored values: no masking, scaling or ``_Unsigned`` view; ``char`` arrays
        as characters (even with ``_Encoding``), vlen strings as ``object``."""
        with NETCDF_LOCK:
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
        with NETCDF_LOCK:
            try:
                check_nesting(path if memory is None else memory, label=path)
            except CFAFormatError as exc:
                raise FragmentReadError(exc.reason) from None
            if memory is None:
                self._ds = netCDF4.Dataset(path, "r")
            else:
                self._ds = netCDF4.Dataset(path, "r", memory=memory)

    def variable(self, name: str) -> NetCDF4Variable:
        with NETCDF_LOCK:
            group: Any = self._ds
            parts = [p for p in name.split("/") if p]
            for part in parts[:-1]:
                group = group.groups[part]
            if not parts:
                raise KeyError(name)
            return NetCDF4Variable(group.variables[parts[-1]])

    def close(self) -> None:
        with NETCDF_LOCK:
            if self._ds.isopen():
                self._ds.close()

    def __enter__(self) -> "NetCDF4File":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
