"""daskcfa: CFA-netCDF aggregated datasets as first-class dask arrays.

``import daskcfa`` is quick: the names below are imported on first use
(PEP 562 module ``__getattr__``, :mod:`daskcfa.exports`), so that the command line's ``--help`` and
programs that only need the exceptions do not pay for dask.array, netCDF4,
h5py or dask.distributed. distributed in particular is imported only where a
cluster is used (the worker plugins, a ``--scheduler`` address).
"""

from __future__ import annotations

from . import config  # (registers daskcfa's dask config defaults: dask.config.get("daskcfa"))
from . import logs  # (the NullHandler on the daskcfa logger, before any module logs)
from .errors import (
    AggregationError,
    ArgumentError,
    BudgetError,
    CFAError,
    CFAFormatError,
    CFAWarning,
    ClosedError,
    ConfigError,
    FragmentError,
    FragmentReadError,
    FragmentShapeError,
    IndexingError,
    MissingFragmentError,
    NotFoundError,
    ReferencesError,
    StorageError,
    TargetExistsError,
    UnitsError,
    UnsafeURIError,
    VariableNotFoundError,
    VersionNotFoundError,
    WriteConflictError,
)
# the public API's names (daskcfa.exports.LAZY) and subpackages, imported on first use
from .exports import load as __getattr__, module_dir as __dir__

__version__ = "0.1.0.dev0"  # the one source: pyproject.toml reads it

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
    "verify_fixity",
    "record_fixity",
    "relocate",
    "history",
    "rollback",
    "prune",
    "describe",
    "to_references",
    "to_icechunk",
    "index",
    "sample",
    "AggregationError",
    "ArgumentError",
    "ConfigError",
    "WriteConflictError",
    "VersionNotFoundError",
    "BudgetError",
    "CFAError",
    "CFAFormatError",
    "CFAWarning",
    "ClosedError",
    "FragmentError",
    "FragmentReadError",
    "FragmentShapeError",
    "IndexingError",
    "MissingFragmentError",
    "NotFoundError",
    "ReferencesError",
    "StorageError",
    "TargetExistsError",
    "UnitsError",
    "UnsafeURIError",
    "VariableNotFoundError",
]
