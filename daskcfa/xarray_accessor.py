"""``ds.cfa``: daskcfa beside ``ds.to_zarr(...)`` on an :class:`xarray.Dataset`.

``ds.cfa.to_cfa(url, ...)`` writes the dataset as an aggregation
(:func:`daskcfa.to_cfa`); for a dataset opened from an aggregation
(``engine="daskcfa"``, or any file whose ``encoding["source"]`` is one),
``ds.cfa.fragments`` is its fragment table and ``ds.cfa.info()`` its summary
(:func:`daskcfa.describe`).

Importing this module registers the accessor. It is imported by the xarray
backend module (which xarray imports with its backends, on the first
``open_dataset`` of any engine), by ``import daskcfa`` when xarray is already
imported, or explicitly (``import daskcfa.xarray_accessor``): ``import
daskcfa`` never imports xarray for it (0.5 s that metadata-only work does
not pay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import xarray as xr

from .errors import ArgumentError, redact

if TYPE_CHECKING:
    import pandas as pd
    from dask.delayed import Delayed

    from .archive.info import DatasetSummary

__all__ = ["CFAAccessor"]

#: the fragment table's columns
FRAGMENT_COLUMNS = ("variable", "fragment", "start", "shape", "uri", "identifier", "value")


@xr.register_dataset_accessor("cfa")
class CFAAccessor:
    """daskcfa's methods on an :class:`xarray.Dataset` (``ds.cfa``)."""

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def to_cfa(self, url: str, **kwargs: Any) -> str | Delayed:
        """Write the dataset as an aggregation at ``url``: :func:`daskcfa.to_cfa` (same arguments)."""
        from .api import to_cfa

        return to_cfa(self._ds, url, **kwargs)

    @property
    def source(self) -> str:
        """The aggregation file the dataset was opened from (``encoding["source"]``)."""
        source = self._ds.encoding.get("source")
        if not source:
            raise ArgumentError("this dataset was not opened from a file (no encoding['source']): "
                                "open an aggregation with xr.open_dataset(url, engine='daskcfa')")
        return str(source)

    @property
    def fragments(self) -> pd.DataFrame:
        """The fragment table of :attr:`source`: one row per fragment of each aggregated variable
        (its group path), with its grid index, start and shape in the aggregated array, first
        location as the file stores it (credentials redacted), variable name in the fragment and
        unique value.

        Read from the aggregation file alone (no fragment is opened), with the default storage
        options: an archive needing others is read with ``daskcfa.open_cfa(url, storage_options=...)``.
        """
        import pandas as pd

        from .api import open_cfa

        rows = []
        with open_cfa(self.source) as ds:
            for group in ds.walk():
                for var in group.variables.values():
                    if var.aggregation is None:
                        continue
                    grid = var.aggregation.fragments.grid
                    for ref in var.aggregation.fragments:
                        start = tuple(s.start for s in grid.fragment_slices(ref.index))
                        uri = redact(ref.uris[0]) if ref.uris else None
                        rows.append((var.path, ref.index, start, ref.shape, uri, ref.identifier, ref.value))
        return pd.DataFrame(rows, columns=list(FRAGMENT_COLUMNS))

    def info(self, **kwargs: Any) -> DatasetSummary:
        """:func:`daskcfa.describe` of :attr:`source` (``storage_options=``, ``storage_size=``, ...);
        ``str()`` of it is what ``daskcfa info`` prints."""
        from .archive.info import describe

        return describe(self.source, **kwargs)
