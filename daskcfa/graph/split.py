"""The split graph: executing a re-fragmentation plan (:mod:`daskcfa.graph.split_plan`) with dask.

The writer's graph (:mod:`daskcfa.graph.write`) stays as it is: one
:func:`~daskcfa.fragments.write.write_fragment` task per target fragment
(markers, resume, atomic commit of the aggregation file last). What changes
is where a fragment's values come from. :class:`SplitSource` is the
:class:`~daskcfa.write.request.FragmentSource` handed to the writer instead of a
dask array; it gives every fragment task :class:`~daskcfa.fragments.write.Slabs`
that produce the fragment slab by slab, on the worker, when the fragment file
is already open:

* **direct** plans: :class:`RegionSlabs` read each slab straight from the
  source through the read path (slices pushed down to the source fragment
  files), then encode it as the target stores it.
* **staged** plans: one :func:`read_block` task per read block reads it once
  and writes its *pieces* (its intersections with the target slabs) to the
  intermediate store as ``.npy`` files, then a marker; the fragment tasks
  depend on the read tasks of their pieces and assemble each slab from them
  (:class:`PieceSlabs`). The store is removed after the commit.

No values pass through the client or between tasks: every task reads what
it needs from storage, so memory per task stays what the plan says.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import posixpath
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from .. import storage
from ..errors import ArgumentError, BudgetError, CFAError, CFAFormatError, FragmentError, NotFoundError
from ..fragments.write import Slabs, encode_values
from ..model import FragmentGrid
from .read import AggregatedArray
from .split_plan import VariablePlan
from ..write.request import FragmentSource

__all__ = ["SplitSource", "RegionSlabs", "PieceSlabs", "read_block", "remove_staging", "staging_root"]


def _cells(grid: FragmentGrid, start: tuple[int, ...], stop: tuple[int, ...]) -> Iterator[tuple[tuple[int, int], ...]]:
    """The cells of ``grid`` inside ``[start, stop)`` (aligned with its boundaries), as (start, stop) per dim."""
    ranges = [[(a, b) for a, b in zip(off, off[1:]) if lo <= a and b <= hi and b > a]
              for off, lo, hi in zip(grid.offsets, start, stop)]
    return itertools.product(*ranges)


def _local(cell: tuple[tuple[int, int], ...], origin: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(a - o, b - o) for (a, b), o in zip(cell, origin))


@dataclass(frozen=True)
class RegionSlabs(Slabs):
    """A target fragment's slabs read straight from the source (direct plans)."""

    array: AggregatedArray  #: the source variable, decoded and masked
    origin: tuple[int, ...]  #: the fragment's position in the array
    cells: tuple[tuple[tuple[int, int], ...], ...]  #: the slabs, in array coordinates
    attrs: dict[str, Any]  #: how the target stores values (for encode_values)
    dtype: np.dtype

    def __iter__(self) -> Iterator[tuple[tuple[slice, ...], np.ndarray]]:
        for cell in self.cells:
            values = self.array[tuple(slice(a, b) for a, b in cell)]
            yield _local(cell, self.origin), encode_values(values, self.attrs, self.dtype)


@dataclass(frozen=True)
class PieceSlabs(Slabs):
    """A target fragment's slabs assembled from intermediate pieces (staged plans)."""

    origin: tuple[int, ...]
    #: per slab: its cell in array coordinates and its pieces (URI, cell)
    slabs: tuple[tuple[tuple[tuple[int, int], ...], tuple[tuple[str, tuple[tuple[int, int], ...]], ...]], ...]
    dtype: np.dtype
    profile: storage.ProfileRef

    def __iter__(self) -> Iterator[tuple[tuple[slice, ...], np.ndarray]]:
        for cell, pieces in self.slabs:
            out = np.empty(tuple(b - a for a, b in cell), self.dtype)
            corner = tuple(a for a, _ in cell)
            for uri, piece in pieces:
                out[_local(piece, corner)] = _load(uri, self.profile, tuple(b - a for a, b in piece), self.dtype)
            yield _local(cell, self.origin), out

    def recorded(self) -> None:
        # Each piece feeds one fragment: once that is recorded (a re-run skips
        # it), its pieces go at once, usually before the page cache writes them
        # to disk. Whatever remains goes with the store after the commit.
        for _, pieces in self.slabs:
            for uri, _ in pieces:
                try:
                    storage.delete(uri, self.profile)
                except CFAError:
                    pass


def _save(uri: str, values: np.ndarray, profile: storage.ProfileRef) -> None:
    storage.put_stream(uri, lambda f: np.save(f, values, allow_pickle=False), profile)


#: Bytes a staged piece's ``.npy`` header may take beyond its values (``np.save`` writes 128 or so)
_NPY_HEADER = 65536


def _load(uri: str, profile: storage.ProfileRef, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A staged piece of ``shape``, read no further than such a piece needs (a remote store's object is
    read whole: without a bound, ``daskcfa.limits.max-memory`` would cap pieces a larger ``max_mem`` plans)."""
    need = math.prod(shape) * max(np.dtype(dtype).itemsize, 8) + _NPY_HEADER
    try:
        values = np.load(io.BytesIO(storage.read_bytes(uri, profile, max_bytes=need)), allow_pickle=False)
    except (ValueError, EOFError) as e:  # (numpy's word for a header, a length or an object array it refuses)
        raise CFAFormatError(f"a staged piece is not the .npy stored: {e}", file=uri) from None
    if values.shape != shape or values.dtype != np.dtype(dtype):  # (another dtype: cast in silence)
        raise CFAFormatError(f"a staged piece holds {values.shape} values of {values.dtype} where {shape} "
                             f"of {np.dtype(dtype)} were stored", file=uri)
    return values


def read_block(array: AggregatedArray, cell: tuple[tuple[int, int], ...],
               pieces: tuple[tuple[str, tuple[tuple[int, int], ...]], ...], attrs: dict[str, Any], dtype: np.dtype,
               marker: str, token: str, profile: storage.ProfileRef) -> str:
    """Read one block of the source once and store its pieces, encoded; skipped if its marker says done.

    The marker is written after every piece, so a piece is trusted only when
    the whole block was stored (an interrupted block is read again).
    """
    where = {"file": marker, "variable": array.variable.name, "fragment": tuple(a for a, _ in cell)}
    try:
        try:
            if storage.read_json(marker, profile).get("token") == token:
                return token
        except (NotFoundError, ValueError, BudgetError, AttributeError):
            pass
        values = encode_values(array[tuple(slice(a, b) for a, b in cell)], attrs, dtype)
        corner = tuple(a for a, _ in cell)
        for uri, piece in pieces:
            _save(uri, np.ascontiguousarray(values[_local(piece, corner)]), profile)
        storage.put_bytes(marker, json.dumps({"token": token}).encode(), profile)
        return token
    except CFAError as exc:
        raise exc.located(**where)
    except Exception as exc:
        raise FragmentError(f"cannot stage a block of the source ({type(exc).__name__}: {exc})", **where) from exc


def _make_piece_slabs(_done: list[str], origin: tuple[int, ...], slabs: tuple, dtype: np.dtype,
                      profile: storage.ProfileRef) -> PieceSlabs:
    """The fragment's slabs, once the read tasks of its pieces (``_done``) have finished."""
    return PieceSlabs(origin, slabs, dtype, profile)


def remove_staging(result: str, staging: list[str], profile: storage.ProfileRef) -> str:
    """Delete the intermediate stores after the aggregation file was committed; returns ``result``."""
    for location in staging:
        try:
            storage.remove_tree(location, profile)
        except Exception:  # leftovers cost space, never correctness: the dataset is complete
            pass
    return result


class SplitSource(FragmentSource):
    """One variable's values for the writer, produced by the split plan (see the module docstring)."""

    def __init__(self, plan: VariablePlan, array: AggregatedArray, attrs: dict[str, Any], dtype: np.dtype,
                 staging_root: str, profile: storage.ProfileRef) -> None:
        self.plan = plan
        self.shape = plan.shape
        self.attrs = attrs
        self.dtype = np.dtype(dtype)
        self.profile = profile
        base = posixpath.basename(plan.variable)
        token = tokenize(array, plan.target.sizes, plan.slabs.sizes, plan.strategy,
                         None if plan.read_blocks is None else plan.read_blocks.sizes, attrs, str(self.dtype))
        #: this variable's intermediate store (named by the values, so a re-run finds its pieces)
        self.staging = posixpath.join(staging_root, f"{'.'.join(p for p in plan.variable.split('/') if p)}-{token}")
        #: identifies the values (not the staging location, which may differ between runs)
        self.name = f"cfa-split-{base}-{token}"
        self._source_key = f"cfa-split-source-{base}-{token}"
        self._read_name = f"cfa-split-read-{base}-{token}"
        self._slabs_name = f"cfa-split-slabs-{base}-{token}"
        self._layer: dict[Any, Any] = {self._source_key: array}
        self._block_keys: dict[tuple[int, ...], Any] = {}
        if plan.strategy == "staged":
            self._add_read_stage(base, token)

    # -- dask collection protocol (what HighLevelGraph.from_collections needs) --

    def __dask_graph__(self) -> HighLevelGraph:
        return HighLevelGraph.from_collections(self.name, self._layer)

    def __dask_layers__(self) -> tuple[str, ...]:
        return (self.name,)

    def __dask_tokenize__(self) -> str:
        return self.name

    # -- the writer's hook --

    def fragment_values(self, grid: FragmentGrid, index: tuple[int, ...]) -> Any:
        if grid.sizes != self.plan.target.sizes:
            raise ArgumentError(f"{self.plan.variable}: the writer planned fragments {grid.sizes}, the split plan "
                             f"{self.plan.target.sizes}")
        frag = grid.fragment_slices(index)
        origin = tuple(s.start for s in frag)
        stop = tuple(s.stop for s in frag)
        cells = tuple(_cells(self.plan.slabs, origin, stop))
        key = (self._slabs_name, *index)
        if self.plan.strategy == "direct":
            # (partials keep the arguments opaque to dask: only the source array is a dependency)
            self._layer[key] = (partial(RegionSlabs, origin=origin, cells=cells, attrs=self.attrs, dtype=self.dtype),
                                self._source_key)
            return key
        assert self.plan.pieces is not None and self.plan.read_blocks is not None
        slabs, reads = [], set()
        for cell in cells:
            pieces = []
            for piece in _cells(self.plan.pieces, tuple(a for a, _ in cell), tuple(b for _, b in cell)):
                pieces.append((self._piece_uri(piece), piece))
                reads.add(self._block_keys[self._block_of(piece)])
            slabs.append((cell, tuple(pieces)))
        self._layer[key] = (partial(_make_piece_slabs, origin=origin, slabs=tuple(slabs), dtype=self.dtype,
                                    profile=self.profile), sorted(reads))
        return key

    # -- staged plans --

    def _block_of(self, piece: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
        blocks = self.plan.read_blocks
        assert blocks is not None
        return tuple(blocks.fragment_at(d, a) for d, (a, _) in enumerate(piece))

    def _piece_uri(self, piece: tuple[tuple[int, int], ...]) -> str:
        assert self.plan.pieces is not None
        index = ".".join(str(self.plan.pieces.fragment_at(d, a)) for d, (a, _) in enumerate(piece)) or "0"
        return posixpath.join(self.staging, f"piece.{index}.npy")

    def _add_read_stage(self, base: str, token: str) -> None:
        blocks, pieces = self.plan.read_blocks, self.plan.pieces
        assert blocks is not None and pieces is not None
        for index in blocks.indices():
            frag = blocks.fragment_slices(index)
            start, stop = tuple(s.start for s in frag), tuple(s.stop for s in frag)
            cell = tuple((s.start, s.stop) for s in frag)
            block_pieces = tuple((self._piece_uri(p), p) for p in _cells(pieces, start, stop))
            marker = posixpath.join(self.staging, "done", ".".join(map(str, index)) or "0")
            key = (self._read_name, *index)
            self._layer[key] = (partial(read_block, cell=cell, pieces=block_pieces, attrs=self.attrs, dtype=self.dtype,
                                        marker=marker, token=tokenize(token, index), profile=self.profile),
                                self._source_key)
            self._block_keys[index] = key


def staging_root(target: str, configured: str | None) -> str:
    """Where intermediate stores go: ``configured`` (a directory or URL prefix; node-local scratch
    only suits single-node clusters), else beside the target's markers, which every worker reaches."""
    if configured:
        return storage.normalise(configured)
    stem = posixpath.splitext(posixpath.basename(target.rstrip("/")))[0]
    return storage.resolve(posixpath.join(stem, ".daskcfa", "staging"), target)
