"""What a write is asked to write: the aggregation's contents minus fragments, and each variable's source.

:mod:`daskcfa.inputs` (new aggregations, ``mode="r+"`` regions) and
:mod:`daskcfa.append` (``mode="a"``) make a :class:`WriteRequest` of what the
caller gave; :func:`daskcfa.graph.write.write_graph` writes it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model import AggregatedVariable, AggregationDataset, FragmentGrid

__all__ = ["FragmentSource", "WriteSource", "WriteRequest"]


class FragmentSource:
    """Data that produce each fragment's values themselves, instead of dask chunks.

    The split graph (:mod:`daskcfa.graph.split`) reads each target fragment's
    region straight from the source, slab by slab. It is a dask collection
    (its graph holds any tasks the fragment tasks depend on) whose
    :meth:`fragment_values` gives the ``values`` argument of one fragment task.
    """

    name: str  #: identifies the data (part of the fragments' resume tokens)

    def fragment_values(self, grid: FragmentGrid, index: tuple[int, ...]) -> Any:
        raise NotImplementedError


@dataclass
class WriteSource:
    """One variable to aggregate."""

    name: str  #: path, e.g. ``"/tas"``
    #: dask or numpy array of the values (decoded, or stored when ``encoded``), or a FragmentSource
    data: Any
    dims: tuple[str, ...]
    dtype: np.dtype  #: stored dtype
    attrs: dict[str, Any]
    encoded: bool = False  #: ``data`` already holds stored values (xarray encodes its own)
    #: r+: the variable as the existing aggregation file describes it
    existing: AggregatedVariable | None = None
    region: dict[str, slice] = field(default_factory=dict)
    #: this variable's ``createVariable`` compression keywords (None: the write's ``compression``)
    compression: dict[str, Any] | None = None
    #: the fragment grid of the aggregation the data come from: kept unless a fragment plan is asked for
    grid: FragmentGrid | None = None

    @property
    def group(self) -> str:
        return posixpath.dirname(self.name) or "/"

    @property
    def basename(self) -> str:
        return posixpath.basename(self.name)


@dataclass
class WriteRequest:
    """What to write: the aggregation file's contents minus fragments, and the sources."""

    model: AggregationDataset
    sources: list[WriteSource]
    #: r+: the existing aggregation file's (size, version) when it was read; the commit checks it is unchanged
    version: tuple[int, str] | None = None
