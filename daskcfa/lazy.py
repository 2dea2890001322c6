"""Heavy libraries imported where they are first used, not where they are named.

Metadata-only work (``daskcfa info``, :func:`~daskcfa.describe`,
:func:`~daskcfa.open_cfa`, :func:`~daskcfa.verify` without ``deep``) needs no
dask array, and ``dask.array`` costs about a second to import: it also imports
xarray, pandas and scipy when they are installed. The modules that build
dask arrays name it through :data:`dask_array` (``from .lazy import
dask_array as da``), which imports it on the first attribute looked up
(``da.from_array``), so that until then it is not in ``sys.modules``.

The same holds for the libraries a first local read does not need (issue #31:
daskcfa's share of a fresh process's first result): h5py (only for files the
direct HDF5 parser leaves to it, and for writing), fsspec and yarl (remote
objects, Zarr stores). Modules that use them name them through the
:class:`LazyModule` objects below (``from ..lazy import h5py``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LazyModule", "dask_array", "fsspec", "fsspec_asyn", "h5py", "yarl"]


class LazyModule:
    """A module imported on its first attribute look-up (dunder names excepted: pickling and
    introspection probe those, and must not import it)."""

    __slots__ = ("_lazy_name",)  # (a name no module it stands for has)

    def __init__(self, name: str) -> None:
        self._lazy_name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._lazy_name), attr)

    def __repr__(self) -> str:
        return f"<module {self._lazy_name!r}, imported on first use>"


#: :mod:`dask.array`, imported on first use
dask_array = LazyModule("dask.array")
#: h5py, fsspec, :mod:`fsspec.asyn` (which ``import fsspec`` does not import) and yarl, imported on first use
h5py = LazyModule("h5py")
fsspec = LazyModule("fsspec")
fsspec_asyn = LazyModule("fsspec.asyn")
yarl = LazyModule("yarl")
