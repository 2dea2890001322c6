"""A netCDF-4 variable's deflated chunks compressed on every core and written straight into its file.

netCDF-C compresses each chunk inside HDF5's filter pipeline, while the
process-wide netCDF lock (:data:`daskcfa.locks.NETCDF_LOCK`) is held: one
core compresses, whatever the number of dask threads, at zlib's speed
(about 60 MB/s a core at level 1). Re-fragmenting and writing are then
bound by compression. For the variables whose pipeline is deflate, with or
without shuffle -- what netCDF files use nearly always -- :class:`ChunkWriter`
does the pipeline itself (:func:`~.hdf5_filters.filter_chunk`: ISA-L at
level 1), in a pool of one thread a core outside every lock, and hands each
compressed chunk to HDF5 with h5py's ``write_direct_chunk`` after netCDF-C
has defined the file and closed it. The file is what netCDF-C would have
written: same dimensions, attributes and filters declared (the chunks' bytes
are other, equally valid zlib streams); any netCDF reader reads it.

Values arrive as slabs (:class:`~.write.Slabs`) in any order. A chunk wholly
inside a slab is compressed from it; a chunk a slab boundary cuts is
assembled in a buffer until its last element arrives (a slab boundary cuts
one layer of chunks: the buffers are a small fraction of a slab). Chunks
past the variable's edge are padded with the fill value, as HDF5 pads them.
"""

from __future__ import annotations

import itertools
import math
import os
import posixpath
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Iterator

import netCDF4
import numpy as np

from ..errors import FragmentError
from ..lazy import h5py
from .hdf5_filters import DEFLATE, ENCODED_FILTERS, filter_chunk

__all__ = ["ChunkWriter", "variable_path", "writes_chunks"]

_POOL: list[Executor] = []
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's threads are not there, nor may its lock be free."""
    global _POOL_LOCK
    _POOL.clear()
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _pool() -> Executor:
    """The process's compression threads: one a core, shared by every task (the cores, not the
    tasks, bound the work in flight)."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="daskcfa-deflate"))
        return _POOL[0]


def writes_chunks(var: netCDF4.Variable) -> bool:
    """Whether :class:`ChunkWriter` can write ``var`` (just defined by netCDF-C, caller holding the
    netCDF lock): numeric, chunked, deflated (and perhaps shuffled) and nothing else -- no
    quantization, no checksum, no unlimited dimension (whose length netCDF-C would not learn)."""
    if var.dtype is str or np.dtype(var.dtype).kind not in "biuf" or var.chunking() == "contiguous":
        return False
    filters = var.filters() or {}
    others = ("fletcher32", "szip", "zstd", "bzip2", "blosc")
    if not filters.get("zlib") or any(filters.get(name) for name in others):
        return False
    quantized = var.quantization() if hasattr(var, "quantization") else None
    return (quantized is None and "least_significant_digit" not in var.ncattrs()
            and not any(dim.isunlimited() for dim in var.get_dims()))


class ChunkWriter:
    """Write the values of one variable of a closed netCDF-4 file as compressed chunks.

    ``path`` is the local file, ``variable`` the variable's HDF5 path in it.
    Use as a context manager; :meth:`write` takes ``(where, values)``:
    slices locating ``values`` (already in the stored dtype) in the variable.
    """

    def __init__(self, path: str, variable: str) -> None:
        self._file = h5py.File(path, "r+")
        try:
            dataset = self._file[variable]
            plist = dataset.id.get_create_plist()
            filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
            self._pipeline = [(int(code), int(values[0]) if values else 0) for code, _, values, _ in filters]
            if not {code for code, _ in self._pipeline} <= ENCODED_FILTERS or DEFLATE not in dict(self._pipeline):
                raise FragmentError(f"{variable} has HDF5 filters {[c for c, _ in self._pipeline]}, not deflate "
                                    "and shuffle: its chunks cannot be written directly")
            self._id = dataset.id
            self.shape: tuple[int, ...] = tuple(dataset.shape)
            self.chunks: tuple[int, ...] = tuple(dataset.chunks)
            self.dtype = dataset.dtype
            self._fill = dataset.fillvalue
        except BaseException:
            self._file.close()
            raise
        #: chunks a slab boundary cut, by chunk index: (buffer, elements still to come)
        self._partial: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}

    def __enter__(self) -> "ChunkWriter":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        try:
            if kind is None:  # (chunks never completed hold the fill value where nothing was written)
                self._store((index, buffer) for index, (buffer, _) in sorted(self._partial.items()))
        finally:
            self._partial.clear()
            self._file.close()

    def write(self, where: tuple[slice, ...], values: np.ndarray) -> None:
        """Store ``values`` at ``where`` (``()``: the whole variable): the chunks they complete now."""
        values = np.asarray(values, dtype=self.dtype)
        where = tuple(where) + tuple(slice(0, n) for n in self.shape[len(where):])
        start = tuple(s.start or 0 for s in where)
        stop = tuple(a + n for a, n in zip(start, values.shape))
        whole = []
        for index in itertools.product(*(range(a // c, -(-b // c)) for a, b, c in zip(start, stop, self.chunks))):
            c0 = tuple(i * c for i, c in zip(index, self.chunks))
            c1 = tuple(min(a + c, n) for a, c, n in zip(c0, self.chunks, self.shape))
            lo = tuple(max(a, s) for a, s in zip(c0, start))
            hi = tuple(min(b, s) for b, s in zip(c1, stop))
            piece = values[tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, start))]
            if lo == c0 and hi == c1:
                whole.append((index, self._padded(piece)))
                continue
            buffer, missing = self._partial.get(index) or (np.full(self.chunks, self._fill, self.dtype),
                                                           math.prod(b - a for a, b in zip(c0, c1)))
            buffer[tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, c0))] = piece
            missing -= piece.size
            if missing:
                self._partial[index] = (buffer, missing)
            else:
                self._partial.pop(index, None)
                whole.append((index, buffer))
        self._store(iter(whole))

    def _padded(self, piece: np.ndarray) -> np.ndarray:
        """A whole chunk's values, C-contiguous, padded with the fill value past the variable's edge."""
        if piece.shape == self.chunks:
            return np.ascontiguousarray(piece)
        buffer = np.full(self.chunks, self._fill, self.dtype)
        buffer[tuple(slice(0, n) for n in piece.shape)] = piece
        return buffer

    def _store(self, chunks: Iterator[tuple[tuple[int, ...], np.ndarray]]) -> None:
        """Compress ``chunks`` in the pool and write each, in order, as it is ready."""
        pending = [(index, _pool().submit(filter_chunk, chunk, self._pipeline)) for index, chunk in chunks]
        for index, future in pending:
            offset = tuple(i * c for i, c in zip(index, self.chunks))
            self._id.write_direct_chunk(offset, future.result())


def variable_path(var: netCDF4.Variable) -> str:
    """The HDF5 path of a netCDF-4 variable in its file."""
    return posixpath.join(var.group().path, var.name)
