"""Heavy libraries imported where they are first used, not where they are named.

Metadata-only work (``daskcfa info``, :func:`~daskcfa.describe`,
:func:`~daskcfa.open_cfa`, :func:`~daskcfa.verify` without ``deep``) needs no
dask array, and ``dask.array`` costs about a second to import: it also imports
xarray, pandas and scipy when they are installed. The modules that build
dask arrays name it through :data:`dask_array` (``from .lazy import
dask_array as da``), which imports it on the first attribute looked up
(``da.from_array``), so that until then it is not in ``sys.modules``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LazyModule", "dask_array"]


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
