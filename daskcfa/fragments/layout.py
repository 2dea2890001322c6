"""Where a fragment variable's bytes lie in its file: what a reference set records.

The direct readers (:mod:`.hdf5`, :mod:`.netcdf3`) already find every chunk
to read it; :class:`StoredLayout` is that knowledge handed out whole, so that
:mod:`daskcfa.archive.references` can point a Zarr array at the bytes
without reading them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["StoredLayout"]


@dataclass(frozen=True)
class StoredLayout:
    """A variable's storage, as stored: type (with its byte order), chunk shape, filters and chunks.

    A contiguous variable is one chunk of its whole shape. Chunks are columns:
    ``starts`` (one row per chunk: its first element along each dimension),
    ``byte_offsets``, ``sizes`` (stored bytes) and ``filter_masks`` (HDF5's:
    bit ``i`` set when filter ``i`` was skipped for that chunk). A chunk never
    written is absent: it reads as ``fill_value``.
    """

    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    #: ``(HDF5 filter id, its parameters)`` in the order applied on write
    filters: tuple[tuple[int, tuple[int, ...]], ...]
    fill_value: Any
    starts: np.ndarray
    byte_offsets: np.ndarray
    sizes: np.ndarray
    filter_masks: np.ndarray

    @classmethod
    def contiguous(cls, dtype: np.dtype, shape: tuple[int, ...], offset: int | None, fill_value: Any) -> "StoredLayout":
        """One chunk of the whole ``shape`` at ``offset`` (None: never written)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        n = 0 if offset is None or nbytes == 0 else 1
        return cls(dtype=dtype, shape=tuple(shape), chunks=tuple(shape), filters=(), fill_value=fill_value,
                   starts=np.zeros((n, len(shape)), np.int64), byte_offsets=np.full(n, offset or 0, np.int64),
                   sizes=np.full(n, nbytes, np.int64), filter_masks=np.zeros(n, np.int64))
