"""Planning a re-fragmentation under a memory budget: pure functions, no I/O.

The split graph (:mod:`daskcfa.graph.split`) copies an array from one fragment
layout (the *source*) to another (the *target*) with tasks that each stay
under ``max_mem``. This module decides how, from layouts alone, the way
rechunker's ``algorithm.py`` does for zarr:

* **direct**: one task per target fragment reads exactly its region from the
  source (the read path pushes slices down to the fragment files) and writes
  the fragment. A fragment too large for the budget is written in *slabs*:
  the fragment file is opened once and filled slab by slab.
* **staged**: when direct reads would be amplified badly -- a target region
  cuts compressed storage chunks of the source, so that each chunk would be
  decoded by many tasks -- or would open every source file from every task,
  reads are consolidated. Read tasks each read one *read block* (whole
  source storage chunks, whole fragments when they fit, neighbours merged)
  once and write its intersections with the target slabs (*pieces*) to an
  intermediate store; write tasks then assemble each slab from its pieces.

Every layout here is a product grid (a :class:`~daskcfa.model.FragmentGrid`:
boundaries per dimension), so slabs, read blocks and pieces are grids that
refine the target and source grids, and the coverage of the array is exact
by construction.

*Read amplification* is bytes decoded from the source divided by bytes
needed (the array's size). The direct reader decodes whole HDF5 chunks, so a
region that cuts a chunk costs the whole chunk; contiguous storage is read
exactly. Memory per task is estimated from what the read path holds at once
(see :data:`COPIES`); the estimate is a model, checked against measured
worker RSS by the tests and the benchmark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

from dask.utils import format_bytes, parse_bytes

from ..errors import ArgumentError, BudgetError
from ..model import FragmentGrid
from .plan import merged_chunks

__all__ = [
    "SourceLayout",
    "StagePlan",
    "VariablePlan",
    "plan_split",
    "refine",
    "COPIES",
    "FIXED_OVERHEAD",
    "STRATEGIES",
]

#: Values of one slab are held about this many times at once while they travel
#: from the source to the target file: the assembled region, one fragment's
#: piece of it in canonical form, the decoded (masked) values and the encoded
#: values handed to netCDF-C. Counted in bytes of the decoded dtype, plus one
#: mask byte per element.
COPIES = 4
#: What a task holds beyond its data: netCDF-C/HDF5 buffers, the open files'
#: metadata, Python objects.
FIXED_OVERHEAD = 16 << 20
#: The direct HDF5 reader fetches compressed chunks in batches of at most
#: this many bytes (``daskcfa.fragments.hdf5._BATCH_BYTES``).
READ_BATCH = 64 << 20
#: Cost model, in "bytes copied": decoding one byte of a compressed source
#: costs about this much more than copying it (zlib inflates at a few hundred
#: MB/s, page-cache copies run at several GB/s).
DECODE_COST = 8
#: Opening a fragment file (h5py metadata, the file manager) costs about as
#: much as copying this many bytes (measured: ~1.2 ms an open on the
#: benchmark machine, where the read path moves ~1-2 GB/s).
OPEN_COST = 2 << 20
#: One intermediate piece costs a file create/open on each side.
PIECE_COST = 64 << 10
#: Strategies: ``auto`` picks the cheaper of the two by the cost model.
STRATEGIES = ("auto", "direct", "staged")


@dataclass(frozen=True)
class SourceLayout:
    """How the source array is stored: its fragments and their storage chunks.

    ``storage_chunks`` is the HDF5 chunk shape inside every fragment, in the
    aggregated dimension order (chunks start at each fragment's origin);
    ``None`` for contiguous storage, which is read exactly. ``compressed``:
    the chunks pass through filters that must decode whole chunks.
    """

    grid: FragmentGrid
    storage_chunks: tuple[int, ...] | None = None
    compressed: bool = False

    def chunk_lengths(self) -> tuple[int, ...] | None:
        """Storage chunk lengths, clipped to the largest fragment (a chunk never spans fragments)."""
        if self.storage_chunks is None:
            return None
        return tuple(max(1, min(int(c), max(row) if row else 1)) for c, row in zip(self.storage_chunks,
                                                                                   self.grid.sizes))


@dataclass(frozen=True)
class StagePlan:
    """One stage of the plan: what its tasks do, how many, and the largest task's memory."""

    kind: Literal["direct", "read", "write"]
    tasks: int
    peak_memory: int
    #: product grid of the units each task handles (target slabs, read blocks)
    units: FragmentGrid

    def __str__(self) -> str:
        what = {"direct": "read the region from the source and write the target fragment",
                "read": "read source blocks once, write pieces to the intermediate store",
                "write": "assemble target fragments from intermediate pieces"}[self.kind]
        return f"{self.kind}: {self.tasks} tasks ({what}), peak {format_bytes(self.peak_memory)} per task"


@dataclass(frozen=True)
class VariablePlan:
    """The plan for one variable (see :func:`plan_split`)."""

    variable: str
    shape: tuple[int, ...]
    itemsize: int  #: bytes per element while in flight (the decoded dtype)
    source: SourceLayout
    target: FragmentGrid
    strategy: Literal["direct", "staged"]
    slabs: FragmentGrid  #: refinement of ``target``: what one write step holds
    stages: tuple[StagePlan, ...]
    read_bytes: int  #: bytes decoded from the source
    needed_bytes: int  #: bytes of the array
    #: staged only: read blocks (a refinement of the source grid) and pieces
    read_blocks: FragmentGrid | None = None
    pieces: FragmentGrid | None = None
    opens: int = 0  #: source fragment files opened, summed over tasks
    alternatives: dict[str, float] = field(default_factory=dict)  #: cost model per strategy

    @property
    def amplification(self) -> float:
        return 1.0 if self.needed_bytes == 0 else self.read_bytes / self.needed_bytes

    @property
    def peak_memory(self) -> int:
        return max((s.peak_memory for s in self.stages), default=0)

    @property
    def tasks(self) -> int:
        return sum(s.tasks for s in self.stages)

    def __str__(self) -> str:
        frag = " x ".join(str(max(r)) if r else "0" for r in self.target.sizes)
        slab = " x ".join(str(max(r)) if r else "0" for r in self.slabs.sizes)
        lines = [
            f"{self.variable}: shape {self.shape}, {format_bytes(self.needed_bytes)}; "
            f"{self.source.grid.nfragments} source fragments -> {self.target.nfragments} target fragments "
            f"of {frag} (slabs of {slab})",
            f"  strategy {self.strategy}: {self.tasks} tasks, peak task memory {format_bytes(self.peak_memory)}, "
            f"read amplification {self.amplification:.2f}x ({format_bytes(self.read_bytes)} decoded), "
            f"{self.opens} source file opens",
        ]
        lines += [f"    {stage}" for stage in self.stages]
        return "\n".join(lines)


# --------------------------------------------------------------------------
# Grid arithmetic
# --------------------------------------------------------------------------


def refine(*grids: FragmentGrid) -> FragmentGrid:
    """The coarsest grid whose boundaries include every boundary of ``grids`` (same shape)."""
    shapes = {g.shape for g in grids}
    if len(shapes) != 1:
        raise ArgumentError(f"grids of different shapes cannot be refined together: {sorted(shapes)}")
    sizes = []
    for d in range(grids[0].ndim):
        cuts = sorted(set().union(*(g.offsets[d] for g in grids)))
        sizes.append(tuple(b - a for a, b in zip(cuts, cuts[1:])) or (0,))
    return FragmentGrid(tuple(sizes))


def _split(grid: FragmentGrid, lengths: Sequence[int]) -> FragmentGrid:
    """Every cell of ``grid`` cut into pieces of ``lengths`` (the last piece of a cell may be shorter)."""
    sizes = []
    for row, length in zip(grid.sizes, lengths):
        out: list[int] = []
        for n in row:
            if n == 0:
                out.append(0)
                continue
            full, rest = divmod(n, length)
            out += [length] * full + ([rest] if rest else [])
        sizes.append(tuple(out))
    return FragmentGrid(tuple(sizes))


def _covered(source: SourceLayout, d: int, start: int, stop: int) -> int:
    """Elements decoded along dimension ``d`` to read ``[start, stop)``: whole storage chunks."""
    if stop <= start:
        return 0
    chunks = source.chunk_lengths()
    if chunks is None:
        return stop - start
    c = chunks[d]
    offsets = source.grid.offsets[d]
    total = 0
    for f in source.grid.fragments_between(d, start, stop):
        f0, f1 = offsets[f], offsets[f + 1]
        a, b = max(start, f0) - f0, min(stop, f1) - f0
        first, last = (a // c) * c, min(-(-b // c) * c, f1 - f0)
        total += last - first
    return total


def _cells_read(source: SourceLayout, grid: FragmentGrid) -> int:
    """Elements decoded when every cell of ``grid`` is read on its own (separable per dimension)."""
    return math.prod(sum(_covered(source, d, a, b) for a, b in zip(off, off[1:])) for d, off in enumerate(grid.offsets))


def _opens(source: SourceLayout, grid: FragmentGrid) -> int:
    """Source fragments opened when every cell of ``grid`` is read by its own task."""
    return math.prod(sum(len(source.grid.fragments_between(d, a, b)) for a, b in zip(off, off[1:]))
                     for d, off in enumerate(grid.offsets))


def _largest(grid: FragmentGrid) -> tuple[int, ...]:
    return tuple(max(row) if row else 0 for row in grid.sizes)


def _chunk_bytes(source: SourceLayout, itemsize: int) -> int:
    chunks = source.chunk_lengths()
    return 0 if chunks is None else math.prod(chunks) * itemsize


# --------------------------------------------------------------------------
# Memory model
# --------------------------------------------------------------------------


def _element_cost(itemsize: int) -> int:
    """Bytes held per element of a slab in flight (see :data:`COPIES`)."""
    return COPIES * itemsize + 2


def _max_cell_read(source: SourceLayout, grid: FragmentGrid) -> int:
    """An upper bound on the elements one cell of ``grid`` decodes (the largest per dimension)."""
    return math.prod(max((_covered(source, d, a, b) for a, b in zip(off, off[1:])), default=0)
                     for d, off in enumerate(grid.offsets))


def _task_memory(source: SourceLayout | None, itemsize: int, cells: FragmentGrid) -> int:
    """Estimated peak memory of a task holding one cell of ``cells`` (the largest) in flight.

    With a ``source`` the direct HDF5 reader also holds one decoded storage
    chunk and a batch of compressed chunks (at most :data:`READ_BATCH`).
    """
    memory = FIXED_OVERHEAD + math.prod(_largest(cells)) * _element_cost(itemsize)
    chunk = 0 if source is None else _chunk_bytes(source, itemsize)
    if chunk:
        memory += chunk + min(READ_BATCH, _max_cell_read(source, cells) * itemsize)
    return memory


def _slab_lengths(fragment: tuple[int, ...], budget_elements: int, align: tuple[int, ...] | None) -> tuple[int, ...]:
    """The largest slab of ``fragment`` (cut along its leading dimensions) within ``budget_elements``.

    A slab keeps whole trailing dimensions, so it is one contiguous run of the
    fragment (cheap to write). Along the dimension that is cut, the length is
    rounded down to a multiple of ``align`` (the source's storage chunks)
    when that still leaves at least one chunk, so slabs do not cut chunks.
    """
    lengths = list(fragment)
    for d in range(len(fragment)):
        rest = math.prod(fragment[d + 1:])
        if math.prod(lengths[d:]) <= budget_elements:
            break
        if rest <= budget_elements:
            n = max(1, budget_elements // max(rest, 1))
            if align is not None and n >= align[d]:
                n -= n % align[d]
            lengths[d] = min(n, fragment[d])
            break
        lengths[d] = 1
    return tuple(max(1, n) for n in lengths)


def _fitted(variable: str, grid: FragmentGrid, source: SourceLayout | None, reading: SourceLayout | None,
            itemsize: int, max_mem: int) -> FragmentGrid:
    """``grid`` cut into the largest slabs whose task memory (with ``reading``'s buffers) fits ``max_mem``.

    The memory model is not linear in the slab size (decode buffers depend on
    which chunks a slab cuts), so the element budget shrinks until the
    estimate fits; :class:`~daskcfa.errors.BudgetError` when nothing does.
    """
    align = source.chunk_lengths() if source is not None else None
    elements = (max_mem - FIXED_OVERHEAD) // _element_cost(itemsize)
    while elements >= 1:
        cells = _split(grid, _slab_lengths(_largest(grid), int(elements), align))
        memory = _task_memory(reading, itemsize, cells)
        if memory <= max_mem:
            return cells
        smaller = int(elements * max_mem / memory * 0.95)
        elements = smaller if smaller < elements else elements - 1
    single = _task_memory(reading, itemsize, _split(grid, (1,) * grid.ndim))
    chunk = ""
    if reading is not None and reading.storage_chunks is not None:
        shape = " x ".join(map(str, reading.chunk_lengths() or ()))
        chunk = (f"; the source is stored in chunks of {shape} ({format_bytes(_chunk_bytes(reading, itemsize))} "
                 "decoded), and a chunk is decoded whole")
    raise BudgetError(f"max_mem={format_bytes(max_mem)} is too small to copy this variable: a task needs at least "
                      f"{format_bytes(single)}{chunk}", variable=variable)


# --------------------------------------------------------------------------
# The planner
# --------------------------------------------------------------------------


def plan_split(variable: str, source: SourceLayout, target: FragmentGrid, itemsize: int, max_mem: int | str, *,
               strategy: str = "auto") -> VariablePlan:
    """Plan copying ``variable`` from the ``source`` layout to the ``target`` fragment grid.

    ``itemsize`` is the size of one element while in flight (the decoded
    dtype); ``max_mem`` the most memory one task may use (bytes, or a string
    such as ``"256MiB"``). ``strategy`` forces ``"direct"`` or ``"staged"``;
    ``"auto"`` picks the cheaper by the cost model (decoded bytes weighted by
    :data:`DECODE_COST` when compressed, file opens, and for the staged plan
    writing and reading every byte once more). Raises
    :class:`~daskcfa.errors.BudgetError` when no task can fit ``max_mem``.
    """
    if strategy not in STRATEGIES:
        raise ArgumentError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    max_mem = parse_bytes(max_mem) if isinstance(max_mem, str) else int(max_mem)
    if source.grid.shape != target.shape:
        raise ArgumentError(f"{variable}: source shape {source.grid.shape} differs from target shape {target.shape}")
    if source.storage_chunks is not None and len(source.storage_chunks) != source.grid.ndim:
        raise ArgumentError(f"{variable}: storage chunks {source.storage_chunks} do not match {source.grid.ndim} dims")
    needed = math.prod(target.shape) * itemsize
    direct = _direct(variable, source, target, itemsize, max_mem)
    staged = _staged(variable, source, target, itemsize, max_mem)
    costs = {"direct": _cost(direct, source), "staged": _cost(staged, source)}
    if strategy == "auto":
        strategy = "direct" if costs["direct"] <= costs["staged"] else "staged"
    chosen = direct if strategy == "direct" else staged
    return VariablePlan(variable=variable, shape=target.shape, itemsize=itemsize, source=source, target=target,
                        strategy=chosen.strategy, slabs=chosen.slabs, stages=chosen.stages,
                        read_bytes=chosen.read_bytes, needed_bytes=needed, read_blocks=chosen.read_blocks,
                        pieces=chosen.pieces, opens=chosen.opens, alternatives=costs)


@dataclass(frozen=True)
class _Candidate:
    """One way to copy a variable, as the cost model compares them."""

    strategy: Literal["direct", "staged"]
    slabs: FragmentGrid
    stages: tuple[StagePlan, ...]
    read_bytes: int
    opens: int
    itemsize: int
    read_blocks: FragmentGrid | None = None
    pieces: FragmentGrid | None = None


def _cost(plan: _Candidate, source: SourceLayout) -> float:
    weight = DECODE_COST if source.compressed else 1
    cost = plan.read_bytes * weight + plan.opens * OPEN_COST
    if plan.pieces is not None:  # staged: every byte written and read once more
        cost += 2 * math.prod(plan.pieces.shape) * plan.itemsize + 2 * plan.pieces.nfragments * PIECE_COST
    return float(cost)


def _direct(variable: str, source: SourceLayout, target: FragmentGrid, itemsize: int, max_mem: int) -> _Candidate:
    slabs = _fitted(variable, target, source, source, itemsize, max_mem)
    stage = StagePlan("direct", target.nfragments, _task_memory(source, itemsize, slabs), slabs)
    return _Candidate("direct", slabs, (stage,), _cells_read(source, slabs) * itemsize, _opens(source, slabs), itemsize)


def _staged(variable: str, source: SourceLayout, target: FragmentGrid, itemsize: int, max_mem: int) -> _Candidate:
    # Read side: whole storage chunks, whole fragments when they fit, neighbours merged up to the budget.
    blocks = _fitted(variable, source.grid, source, source, itemsize, max_mem)
    if blocks.grid_shape == source.grid.grid_shape:  # whole fragments fit: merge neighbours (fewer tasks, pieces)
        room = (max_mem - (_task_memory(source, itemsize, blocks) - math.prod(_largest(blocks)) * _element_cost(
            itemsize))) // _element_cost(itemsize)
        merged = FragmentGrid.from_sizes(merged_chunks(blocks, 1, max(1, room)))
        if _task_memory(source, itemsize, merged) <= max_mem:
            blocks = merged
    # Write side: slabs of the target fragments; they read pieces exactly, with no decode buffers.
    slabs = _fitted(variable, target, None, None, itemsize, max_mem)
    pieces = refine(blocks, slabs)
    read_stage = StagePlan("read", blocks.nfragments, _task_memory(source, itemsize, blocks), blocks)
    write_stage = StagePlan("write", target.nfragments, _task_memory(None, itemsize, slabs), slabs)
    return _Candidate("staged", slabs, (read_stage, write_stage), _cells_read(source, blocks) * itemsize,
                      _opens(source, blocks), itemsize, read_blocks=blocks, pieces=pieces)
