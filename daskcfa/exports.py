"""The public names ``daskcfa`` re-exports, imported on first use (PEP 562).

``import daskcfa`` stays quick: ``daskcfa.open_cfa`` imports :mod:`daskcfa.api`
(and with it dask.array, netCDF4, h5py) the first time it is looked up, and
``daskcfa.FragmentBudget`` imports dask.distributed only then. The package's
``__getattr__`` and ``__dir__`` are :func:`load` and :func:`module_dir`.
Modules that extend another library (the ``ds.cfa`` xarray accessor) are
imported with the package only when that library is imported already.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["LAZY", "WITH_LIBRARY", "extend_loaded_libraries", "load", "module_dir"]

#: name -> the module (relative to the package) that defines it
LAZY = {
    "from_cfa": ".api", "open_cfa": ".api", "plan_fragments": ".api", "read_aggregation": ".api", "to_cfa": ".api",
    "Dataset": ".netcdf4", "Dimension": ".dataset", "Group": ".dataset", "Variable": ".dataset",
    "FragmentBudget": ".plugins", "StorageProfiles": ".plugins", "fragment_stats": ".plugins",
    "plan_refragment": ".archive.refragment", "refragment": ".archive.refragment", "split": ".archive.refragment",
    "aggregate": ".archive.aggregate", "rebuild": ".archive.aggregate",
    "describe": ".archive.info",
    "relocate": ".archive.relocate",
    "history": ".archive.versions", "rollback": ".archive.versions", "prune": ".archive.versions",
    "verify": ".archive.verify", "verify_fixity": ".archive.verify", "record_fixity": ".archive.verify",
    "to_references": ".archive.references",
    "to_icechunk": ".archive.icechunk_export",
    "index": ".index_writer",
    "sample": ".sample_data",
}

_PACKAGE = __name__.rpartition(".")[0]

#: modules imported with the package only when a library they extend is imported already (never for them)
WITH_LIBRARY = {"xarray": ".xarray_accessor"}  # ds.cfa


def load(name: str) -> Any:
    """The package attribute ``name``: a re-exported name, or a subpackage (``daskcfa.storage``), imported now."""
    module = LAZY.get(name)
    if module is None:
        if not name.startswith("__"):  # subpackages, as attributes, as when they were imported eagerly
            try:
                return importlib.import_module(f".{name}", _PACKAGE)
            except ModuleNotFoundError as exc:
                if exc.name != f"{_PACKAGE}.{name}":
                    raise
        raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, _PACKAGE), name)
    setattr(sys.modules[_PACKAGE], name, value)  # (later look-ups do not come here)
    return value


def module_dir() -> list[str]:
    """``dir(daskcfa)``: what is loaded, and the names loaded on first use."""
    return sorted(set(vars(sys.modules[_PACKAGE])) | set(LAZY))


def extend_loaded_libraries() -> None:
    """Import :data:`WITH_LIBRARY`'s modules for the libraries already imported (``ds.cfa`` when xarray is)."""
    for library, module in WITH_LIBRARY.items():
        if library in sys.modules:
            importlib.import_module(module, _PACKAGE)


extend_loaded_libraries()  # (with the package: exports is imported by daskcfa/__init__.py)
