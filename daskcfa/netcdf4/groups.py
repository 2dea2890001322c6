"""The definition tree of an aggregation being written: netCDF4-python's ``createDimension``,
``createGroup`` and ``createVariable`` (with S3netCDF4's fragment options), on the dataset and on
each of its groups."""

from __future__ import annotations

import posixpath
from typing import Any, Sequence

import numpy as np

from .. import dataset
from ..errors import ArgumentError
from .definitions import GrowingDimension, NetCDFAttributes, check_elements, check_name, stored_dtype
from .layout import FragmentLayout
from .variables import VariableOwner, VariableState, WritableVariable

__all__ = ["Definitions", "WritableGroup"]


class Definitions(NetCDFAttributes):
    """netCDF4-python's defining calls, shared by the dataset and its groups."""

    path: str
    dimensions: dict[str, Any]
    variables: dict[str, Any]
    groups: dict[str, Any]
    _writer: VariableOwner

    def createDimension(self, dimname: str, size: int | None = None) -> GrowingDimension:
        self._writer.check_open()
        check_name(dimname, self.dimensions, "dimension", self.path)
        if size is not None and (not isinstance(size, (int, np.integer)) or size < 0):
            raise ArgumentError(f"dimension {dimname!r}: size must be an integer >= 0 or None (unlimited), "
                                f"got {size!r}")
        check_elements(f"dimension {dimname!r}", [size or 0], self._writer.url)
        dim = GrowingDimension(dimname, size)
        self.dimensions[dimname] = dim
        return dim

    def createGroup(self, groupname: str) -> "WritableGroup":
        self._writer.check_open()
        existing = self.groups.get(groupname)
        if existing is not None:  # (netCDF4-python returns the group that exists)
            return existing
        check_name(groupname, self.variables, "group", self.path)
        group = WritableGroup(groupname, posixpath.join(self.path, groupname), self, self._writer)
        self.groups[groupname] = group
        return group

    def createVariable(self, varname: str, datatype: Any, dimensions: str | Sequence[str] = (), *,
                       fill_value: Any = None, subarray_shape: Any = None, max_subarray_size: int | str | None = None,
                       aggregate: bool | None = None, zlib: bool = False, complevel: int = 4, shuffle: bool = True,
                       fletcher32: bool = False, contiguous: bool = False, chunksizes: Sequence[int] | None = None,
                       endian: str = "native", least_significant_digit: int | None = None,
                       compression: str | None = None, **compression_options: Any) -> "WritableVariable":
        """Define a variable, as netCDF4-python does, plus S3netCDF4's fragment options.

        A variable with dimensions that is not a coordinate variable (named as
        its one dimension) and holds numbers is *aggregated*: stored in
        fragments of ``subarray_shape`` (a size per dimension) or of at most
        ``max_subarray_size`` bytes (default 50 MB; along an unlimited
        dimension, fragments span the other dimensions whole when a step fits
        and grow along it). ``aggregate=False`` keeps a variable in the
        aggregation file; ``aggregate=True`` insists, and aggregates a string
        (``str``) variable too, in fragments of netCDF-4 vlen strings (kept in
        the aggregation file by default, as before).
        """
        self._writer.check_open()
        check_name(varname, self.variables, "variable", self.path)
        if isinstance(dimensions, str):
            dimensions = (dimensions,)
        dims = tuple(dimensions)
        found = [self._find_dimension(d) for d in dims]
        dtype = stored_dtype(datatype, varname)
        if endian not in ("native", "little", "big"):
            raise ArgumentError(f"endian must be 'native', 'little' or 'big', got {endian!r}")
        attrs: dict[str, Any] = {}
        if fill_value is not None and fill_value is not False:
            attrs["_FillValue"] = np.array(fill_value, dtype=dtype)[()] if dtype.kind in "biuf" else fill_value
        if least_significant_digit is not None:
            attrs["least_significant_digit"] = least_significant_digit
        coordinate = len(dims) == 1 and dims[0] == varname
        aggregable = bool(dims) and not coordinate and dtype.kind in "biufO"
        if aggregate and not aggregable:
            raise ArgumentError(f"{varname!r} cannot be aggregated: only variables with dimensions that hold numbers "
                                "or strings (str) and are not coordinate variables are")
        path = posixpath.join(self.path, varname)
        aggregated = aggregable and dtype.kind != "O" if aggregate is None else aggregate
        if aggregated:  # (refused now, not when its first fragment is written)
            self._writer.check_fragment_dtype(path, dtype)
        keywords = dict(compression_options)
        if zlib or compression:
            keywords.update(compression=compression or "zlib", complevel=complevel, shuffle=shuffle)
        if fletcher32:
            keywords["fletcher32"] = True
        if chunksizes is not None and not contiguous:
            keywords["chunksizes"] = tuple(int(c) for c in chunksizes)
        check_elements(f"variable {varname!r}", [len(d) for d in found], self._writer.url)
        layout = FragmentLayout.plan(path, found, dtype, subarray_shape, max_subarray_size) if aggregated else None
        var = WritableVariable(varname, path, dims, found, dtype, attrs, self._writer,
                               VariableState(aggregated, keywords, layout))
        self.variables[varname] = var
        return var

    def _find_dimension(self, name: str) -> GrowingDimension:
        node: Any = self
        while node is not None:
            if name in node.dimensions:
                return node.dimensions[name]
            node = node.parent
        raise ArgumentError(f"dimension {name!r} is not defined in group {self.path!r} or above")


class WritableGroup(Definitions, dataset.Group):
    """A group of a dataset being written."""

    def __init__(self, name: str, path: str, parent: Any, writer: VariableOwner) -> None:
        dataset.Group.__init__(self, name=name, path=path, parent=parent)
        object.__setattr__(self, "_writer", writer)
