"""daskcfa: CFA-netCDF aggregated datasets as first-class dask arrays."""

from .api import from_cfa, open_cfa, plan_fragments, read_aggregation, to_cfa
from .dataset import Dataset, Dimension, Group, Variable
from .plugins import FragmentBudget, StorageProfiles, fragment_stats
from .archive.refragment import plan_refragment, refragment
from .archive.aggregate import aggregate, rebuild
from .archive.info import describe
from .archive.relocate import relocate
from .archive.verify import verify
from .errors import (
    AggregationError,
    BudgetError,
    CFAError,
    CFAFormatError,
    CFAWarning,
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

__version__ = "0.1.0.dev0"

__all__ = [
    "from_cfa",
    "open_cfa",
    "read_aggregation",
    "to_cfa",
    "plan_fragments",
    "refragment",
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
