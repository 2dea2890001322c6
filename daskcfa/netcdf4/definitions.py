"""The rules a definition obeys as it is made, netCDF4-python's: names, sizes, dtypes, and attributes
set as Python attributes. Shared by the aggregation writer's groups and variables."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from ..errors import ArgumentError
from ..limits import max_elements

__all__ = ["Writer", "GrowingDimension", "NetCDFAttributes", "check_elements", "check_name", "stored_dtype"]


class Writer(Protocol):
    """What a definition needs of the writer it belongs to (an :class:`~.aggregation.AggregationWriter`)."""

    url: str

    def check_open(self) -> None:
        """Refuse a change to a dataset closed, or whose write failed."""


def check_elements(what: str, shape: Sequence[int], url: str) -> None:
    """Refuse a size beyond ``daskcfa.limits.max-elements`` when it is defined, not later as a bare
    OverflowError or MemoryError while its fragments are planned."""
    elements = math.prod(int(n) for n in shape)
    if elements > max_elements():
        raise ArgumentError(f"{what}: {elements:,} elements is more than {max_elements():,} (raise dask config "
                            "'daskcfa.limits.max-elements' if this is genuine)", file=url)


class GrowingDimension:
    """A dimension of a dataset being written (an unlimited one grows as data are assigned)."""

    def __init__(self, name: str, size: int | None) -> None:
        self.name = name
        self.unlimited = size is None
        self.size = 0 if size is None else int(size)

    def __len__(self) -> int:
        return self.size

    def isunlimited(self) -> bool:
        return self.unlimited

    def __repr__(self) -> str:
        kind = "unlimited, " if self.unlimited else ""
        return f"<daskcfa.netcdf4.GrowingDimension {self.name!r} ({kind}size {self.size})>"


#: (a pattern, compiled by ``re`` at the first name checked: compiling it costs 3 ms, which a reader never needs)
_NETCDF_NAME = r"[\w\x80-\U0010ffff][^/\x00-\x1f\x7f]*(?<!\s)"
#: names netCDF4-python reserves (setting one raises AttributeError); every other name is a netCDF attribute
_RESERVED = frozenset({"name", "path", "dimensions", "variables", "groups", "parent", "dtype", "ndim"})


class NetCDFAttributes:
    """netCDF4-python's attribute rules: ``obj.units = "K"`` sets a netCDF attribute, as ``setncattr`` does."""

    attrs: dict[str, Any]
    _writer: Writer

    def __setattr__(self, name: str, value: Any) -> None:
        if "_writer" not in self.__dict__:  # (being built: the object's own fields)
            object.__setattr__(self, name, value)
        elif name in _RESERVED:
            raise AttributeError(f"{name!r} cannot be set (netCDF4-python reserves it); setncattr({name!r}, ...) "
                                 "sets a netCDF attribute of that name")
        else:  # (url, _writer, ...: as netCDF4-python, a netCDF attribute; never this object's own fields)
            self.setncattr(name, value)

    def __delattr__(self, name: str) -> None:
        self.delncattr(name)

    def setncattr(self, name: str, value: Any) -> None:
        self._writer.check_open()
        self.attrs[name] = self._attribute(name, value)

    def _attribute(self, name: str, value: Any) -> Any:
        """The value stored for attribute ``name`` (or a refusal)."""
        return value

    def setncatts(self, attdict: Mapping[str, Any]) -> None:
        for name, value in attdict.items():
            self.setncattr(name, value)

    def delncattr(self, name: str) -> None:
        self._writer.check_open()
        self.attrs.pop(name)


def check_name(name: str, taken: Mapping[str, Any], what: str, group: str) -> None:
    """netCDF's name rules (netCDF-C refuses the others only when the file is written, at close())."""
    if not isinstance(name, str) or not re.fullmatch(_NETCDF_NAME, name):
        raise ArgumentError(f"{what} name {name!r} is not a netCDF name (a letter, digit, '_' or non-ASCII "
                            "character first; no '/' nor control characters; no trailing space)")
    if name in taken:
        raise ArgumentError(f"{what} {name!r} already exists in group {group!r}")


def stored_dtype(datatype: Any, name: str) -> np.dtype:
    """The dtype ``createVariable(name, datatype)`` stores (netCDF's types; ``str``: variable-length strings)."""
    if datatype is str:
        return np.dtype(object)
    try:
        dtype = np.dtype(datatype)
    except TypeError:
        raise ArgumentError(f"{name!r}: datatype {datatype!r} is not a numpy or netCDF type") from None
    if dtype.kind == "U":
        return np.dtype(object)
    if dtype.kind not in "iufSO" or (dtype.kind == "S" and dtype.itemsize != 1) or dtype.itemsize > 8:
        raise ArgumentError(f"{name!r}: netCDF cannot store dtype {dtype}")
    return dtype.newbyteorder("=")
