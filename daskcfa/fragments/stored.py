"""How an aggregated variable's values are stored, as its first stored fragment says: netCDF4-python's
``filters()`` and sizes of that fragment. One place for the default compression of ``refragment``
and for ``daskcfa.Dataset``'s ``Variable.filters()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import storage
from ..errors import CFAError
from ..model import AggregatedVariable
from ..storage.access import Access

__all__ = ["StoredFragment", "first_stored"]


@dataclass(frozen=True)
class StoredFragment:
    filters: dict[str, Any]  #: netCDF4-python's ``Variable.filters()`` of the fragment's variable
    nbytes: int  #: the fragment file's size
    held: int  #: the bytes its values take in memory (0 for strings)


def first_stored(aggregation: AggregatedVariable, access: Access) -> StoredFragment | None:
    """The first fragment stored in a file, or None when there is none or it cannot be opened
    (reading it reports why, located)."""
    ref = next((r for r in aggregation.fragments if r.uris), None)
    if ref is None:
        return None
    uri = storage.resolve(ref.uris[0], aggregation.source)
    access = access.with_logins(aggregation.logins)
    try:
        access.policy.check(uri)
        nbytes = storage.size(uri, access.profile, policy=access.policy)
        with storage.netcdf_file(uri, profile=access.profile) as ds:
            names = [n for n in ref.variable_names(aggregation.basename) if _has_variable(ds, n)]
            if not names:
                return None
            var = ds[names[0]]
            held = int(np.prod(var.shape, dtype=np.int64)) * var.dtype.itemsize if var.dtype != str else 0
            return StoredFragment(dict(var.filters() or {}), nbytes, held)
    except (CFAError, OSError):
        return None


def _has_variable(ds: Any, path: str) -> bool:
    try:
        ds[path]
    except (KeyError, IndexError):
        return False
    return True
