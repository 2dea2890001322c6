"""daskcfa: CFA-netCDF aggregated datasets as first-class dask arrays.

``import daskcfa`` is quick: the names below are imported on first use
(PEP 562 module ``__getattr__``), so that the command line's ``--help`` and
programs that only need the exceptions do not pay for dask.array, netCDF4,
h5py or dask.distributed. distributed in particular is imported only where a
cluster is used (the worker plugins, a ``--scheduler`` address).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__
from .errors import (
    AggregationError,
    ArgumentError,
    BudgetError,
    CFAError,
    CFAFormatError,
    CFAWarning,
    ConfigError,
    FragmentError,
    FragmentReadError,
    FragmentShapeError,
    MissingFragmentError,
    NotFoundError,
    StorageError,
    UnitsError,
    UnsafeURIError,
    VariableNotFoundError,
    WriteConflictError,
)
from . import config  # (registers daskcfa's defaults with dask on import)

# name -> the module (relative to this package) that defines it
_LAZY = {
    "from_cfa": ".api", "open_cfa": ".api", "plan_fragments": ".api", "read_aggregation": ".api", "to_cfa": ".api",
    "Dataset": ".dataset", "Dimension": ".dataset", "Group": ".dataset", "Variable": ".dataset",
    "FragmentBudget": ".plugins", "StorageProfiles": ".plugins", "fragment_stats": ".plugins",
    "plan_refragment": ".archive.refragment", "refragment": ".archive.refragment", "split": ".archive.refragment",
    "aggregate": ".archive.aggregate", "rebuild": ".archive.aggregate",
    "describe": ".archive.info",
    "relocate": ".archive.relocate",
    "verify": ".archive.verify",
}

if TYPE_CHECKING:  # (for type checkers and IDEs: the names as if imported eagerly)
    from .api import from_cfa, open_cfa, plan_fragments, read_aggregation, to_cfa
    from .archive.aggregate import aggregate, rebuild
    from .archive.info import describe
    from .archive.refragment import plan_refragment, refragment, split
    from .archive.relocate import relocate
    from .archive.verify import verify
    from .dataset import Dataset, Dimension, Group, Variable
    from .plugins import FragmentBudget, StorageProfiles, fragment_stats


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        if not name.startswith("__"):  # subpackages (daskcfa.storage...), as when they were imported eagerly
            try:
                return importlib.import_module(f".{name}", __name__)
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
        raise AttributeError(f"module 'daskcfa' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # (later look-ups do not come here)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    "from_cfa",
    "open_cfa",
    "read_aggregation",
    "to_cfa",
    "plan_fragments",
    "refragment",
    "split",
    "plan_refragment",
    "Dataset",
    "Dimension",
    "Group",
    "Variable",
    "FragmentBudget",
    "StorageProfiles",
    "fragment_stats",
    "aggregate",
    "rebuild",
    "verify",
    "relocate",
    "describe",
    "AggregationError",
    "ArgumentError",
    "ConfigError",
    "WriteConflictError",
    "BudgetError",
    "CFAError",
    "CFAFormatError",
    "CFAWarning",
    "FragmentError",
    "FragmentReadError",
    "FragmentShapeError",
    "MissingFragmentError",
    "NotFoundError",
    "StorageError",
    "UnitsError",
    "UnsafeURIError",
    "VariableNotFoundError",
]
