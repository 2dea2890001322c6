"""netCDF4-python's read-side accessors on a dataset opened for reading (``daskcfa.Dataset(url)``,
``open_cfa``), so that scripts written for netCDF4-python or S3netCDF4 run unchanged: masking and
scaling switched off and on, ``datatype``, ``chunking()``, ``filters()``, ``file_format``,
``data_model``, ``filepath()``, ``isopen()``, and reads refused once the dataset is closed.

Mixins of :class:`daskcfa.dataset.Variable`, :class:`daskcfa.dataset.Group` and
:class:`daskcfa.dataset.OpenedDataset`, kept apart from
the writers (the ``netcdf4`` package, which builds on the reading classes, so cannot hold them).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from .errors import ClosedError
from .fragments.stored import first_stored

__all__ = ["ReadVariable", "ReadGroup", "ReadDataset"]


class ReadVariable:
    """A variable's netCDF4-python switches and storage facts (for an aggregated variable, its
    fragments': ``chunking()`` is the first fragment's shape, ``filters()`` the first stored
    fragment's)."""

    #: netCDF4-python's automatic masking and unpacking (``set_auto_mask``, ``set_auto_maskandscale``)
    auto_mask: bool = True
    auto_scale: bool = True
    #: the ordinary variable's ``chunking()`` and ``filters()``, as netCDF4-python read them
    stored: tuple[Any, Any] = ("contiguous", None)
    closed: bool = False

    def set_auto_mask(self, flag: bool) -> None:
        """Masked arrays of missing values (True, the default) or the values as they are."""
        self.auto_mask = bool(flag)
        self._data = None  # (the next read builds its array with the new switches)

    def set_auto_maskandscale(self, flag: bool) -> None:
        """Both masking and unpacking (``scale_factor``/``add_offset``) on or off."""
        self.auto_mask = self.auto_scale = bool(flag)
        self._data = None

    def set_auto_scale(self, flag: bool) -> None:
        """Unpacking (``scale_factor``/``add_offset``) on (True, the default) or off."""
        self.auto_scale = bool(flag)
        self._data = None

    @property
    def datatype(self) -> Any:
        """The stored type (netCDF4-python's ``datatype``; ``str`` for variable-length strings)."""
        dtype = np.dtype(self.dtype)
        return str if dtype.kind == "O" else dtype

    def chunking(self) -> Any:
        """``"contiguous"`` or the chunk shape as a list; for an aggregated variable, its first
        fragment's shape (its dask chunks are its fragments)."""
        if self.aggregation is None:
            return self.stored[0]
        grid = self.aggregation.fragments.grid
        return [int(sizes[0]) if len(sizes) else 0 for sizes in grid.sizes]

    def filters(self) -> Any:
        """netCDF4-python's ``filters()``: of the aggregation file's variable, or for an aggregated
        variable of its first stored fragment (None when no fragment file can be opened)."""
        if self.aggregation is None:
            return self.stored[1]
        found = first_stored(self.aggregation, self.read_access)
        return None if found is None else found.filters

    def check_open(self) -> None:
        if self.closed:
            raise ClosedError("the dataset was closed: reopen it to read", file=self._url or None,
                              variable=self.path)


class ReadGroup:
    """netCDF4-python's switches on a group or dataset: set on every variable in it and its
    sub-groups, as scripts migrating from netCDF4-python call them (``nc.set_auto_mask(False)``)."""

    walk: Callable[[], Iterator[Any]]  # (the group's own: daskcfa.dataset.Group.walk)

    def _switch(self, name: str, flag: bool) -> None:
        for group in self.walk():
            for var in group.variables.values():
                getattr(var, name)(flag)

    def set_auto_mask(self, flag: bool) -> None:
        """Masked arrays of missing values (True, the default) or the values as they are."""
        self._switch("set_auto_mask", flag)

    def set_auto_scale(self, flag: bool) -> None:
        """Unpacking (``scale_factor``/``add_offset``) on or off."""
        self._switch("set_auto_scale", flag)

    def set_auto_maskandscale(self, flag: bool) -> None:
        """Both masking and unpacking on or off."""
        self._switch("set_auto_maskandscale", flag)


class ReadDataset:
    """The dataset's netCDF4-python facts: its file's format and whether it is open."""

    file_format: str = ""
    data_model: str = ""
    _is_open: bool = True

    def filepath(self) -> str:
        return self.url

    def isopen(self) -> bool:
        return self._is_open

    def close(self) -> None:
        """Nothing is held open between reads; reading through the dataset's variables stops
        here, as with netCDF4-python (dask arrays taken from them keep working)."""
        self._is_open = False
        for group in self.walk():
            for var in group.variables.values():
                var.closed = True
