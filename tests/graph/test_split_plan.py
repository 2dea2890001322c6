"""The re-fragmentation planner (daskcfa.graph.split_plan): properties checked by brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskcfa.errors import BudgetError
from daskcfa.graph import split_plan
from daskcfa.graph.split_plan import FIXED_OVERHEAD, READ_BATCH, SourceLayout, plan_split, refine
from daskcfa.model import FragmentGrid


@st.composite
def partitions(draw, n: int) -> tuple[int, ...]:
    """A random split of ``n`` into positive parts."""
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(n - 1, 5)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


@st.composite
def problems(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 16)) for _ in range(ndim))
    source = FragmentGrid(tuple(draw(partitions(n)) for n in shape))
    chunks = draw(st.none() | st.tuples(*(st.integers(1, max(row)) for row in source.sizes)))
    layout = SourceLayout(source, chunks, compressed=chunks is not None and draw(st.booleans()))
    target = FragmentGrid(tuple(draw(partitions(n)) for n in shape))
    itemsize = draw(st.sampled_from([1, 2, 4, 8]))
    max_mem = FIXED_OVERHEAD + draw(st.integers(0, 6000))
    strategy = draw(st.sampled_from(["auto", "direct", "staged"]))
    return layout, target, itemsize, max_mem, strategy


def cells(grid: FragmentGrid):
    for index in grid.indices():
        yield grid.fragment_slices(index)


def decoded_elements(layout: SourceLayout, region: tuple[slice, ...]) -> int:
    """Elements decoded to read ``region``: every storage chunk of every source fragment it touches, whole."""
    total = 0
    for index in layout.grid.indices():
        frag = layout.grid.fragment_slices(index)
        chunks = layout.storage_chunks or tuple(f.stop - f.start for f in frag)
        if layout.storage_chunks is None:  # contiguous storage is read exactly
            total += math.prod(max(0, min(r.stop, f.stop) - max(r.start, f.start)) for r, f in zip(region, frag))
            continue
        ranges = [range(f.start, f.stop, c) for f, c in zip(frag, chunks)]
        for corner in itertools.product(*ranges):
            box = [(a, min(a + c, f.stop)) for a, c, f in zip(corner, chunks, frag)]
            if all(a < r.stop and r.start < b for (a, b), r in zip(box, region)):
                total += math.prod(b - a for a, b in box)
    return total


def coverage(shape: tuple[int, ...], grid: FragmentGrid) -> np.ndarray:
    count = np.zeros(shape, dtype=int)
    for region in cells(grid):
        count[region] += 1
    return count


def refines(fine: FragmentGrid, coarse: FragmentGrid) -> bool:
    return all(set(c) <= set(f) for f, c in zip(fine.offsets, coarse.offsets))


def aligned(blocks: FragmentGrid, fragments: FragmentGrid) -> bool:
    """Every block lies inside one fragment, or is a union of whole fragments (neighbours merged)."""
    for d, off in enumerate(blocks.offsets):
        for a, b in zip(off, off[1:]):
            if len(fragments.fragments_between(d, a, b)) > 1 and not {a, b} <= set(fragments.offsets[d]):
                return False
    return True


def model_memory(layout: SourceLayout | None, itemsize: int, region: tuple[slice, ...]) -> int:
    """The planner's memory model for one task, recomputed from its definition."""
    elements = math.prod(s.stop - s.start for s in region)
    memory = FIXED_OVERHEAD + elements * (split_plan.COPIES * itemsize + 2)
    if layout is not None and layout.storage_chunks is not None:
        chunk = math.prod(layout.chunk_lengths()) * itemsize
        memory += chunk + min(READ_BATCH, decoded_elements(layout, region) * itemsize)
    return memory


@settings(max_examples=60, deadline=None)
@given(problems())
def test_plan_properties(problem):
    layout, target, itemsize, max_mem, strategy = problem
    shape = target.shape
    try:
        plan = plan_split("/v", layout, target, itemsize, max_mem, strategy=strategy)
    except BudgetError as exc:
        # Refused only when not even one element per task fits.
        ones = FragmentGrid(tuple((1,) * n for n in shape))
        assert max(model_memory(layout, itemsize, r) for r in cells(ones)) > max_mem
        assert "/v" in str(exc) and "max_mem" in str(exc)
        return
    assert plan.strategy in ("direct", "staged") and (strategy == "auto" or plan.strategy == strategy)
    # Every task under max_mem (by the model, recomputed cell by cell).
    assert plan.peak_memory <= max_mem
    reading = plan.read_blocks if plan.strategy == "staged" else plan.slabs
    assert all(model_memory(layout, itemsize, r) <= max_mem for r in cells(reading))
    assert all(model_memory(None, itemsize, r) <= max_mem for r in cells(plan.slabs))
    # The stages cover the array exactly, on grids that refine the fragments.
    assert plan.slabs.shape == shape and refines(plan.slabs, target)
    assert (coverage(shape, plan.slabs) == 1).all()
    if plan.strategy == "staged":
        assert aligned(plan.read_blocks, layout.grid) and (coverage(shape, plan.read_blocks) == 1).all()
        assert plan.pieces == refine(plan.read_blocks, plan.slabs)
        assert [s.kind for s in plan.stages] == ["read", "write"]
        assert plan.stages[0].tasks == plan.read_blocks.nfragments and plan.stages[1].tasks == target.nfragments
    else:
        assert [s.kind for s in plan.stages] == ["direct"] and plan.stages[0].tasks == target.nfragments
    # Amplification: bytes decoded by brute force over every storage chunk touched.
    decoded = sum(decoded_elements(layout, r) for r in cells(reading)) * itemsize
    assert plan.read_bytes == decoded
    assert plan.needed_bytes == math.prod(shape) * itemsize
    assert plan.amplification == pytest.approx(decoded / plan.needed_bytes)
    assert plan.amplification >= 1.0 - 1e-12


def test_time_slices_to_tiles_consolidates_compressed_reads():
    """Tiles cut every one-time-step zlib chunk 16 times: direct reads decode 16x, the staged plan 1x."""
    layout = SourceLayout(FragmentGrid(((10,) * 100, (512,), (512,))), (1, 512, 512), compressed=True)
    tiles = FragmentGrid(((1000,), (128,) * 4, (128,) * 4))
    direct = plan_split("/tas", layout, tiles, 4, "256MiB", strategy="direct")
    assert direct.amplification == pytest.approx(16.0)
    plan = plan_split("/tas", layout, tiles, 4, "256MiB")
    assert plan.strategy == "staged" and plan.amplification == pytest.approx(1.0)
    assert plan.peak_memory <= 256 << 20
    assert "read amplification 1.00x" in str(plan) and "staged" in str(plan)
    # Uncompressed, contiguous, few files: direct reads are exact, no intermediate store is worth it.
    contiguous = SourceLayout(FragmentGrid(((100,) * 10, (512,), (512,))))
    direct = plan_split("/tas", contiguous, tiles, 4, "256MiB")
    assert direct.strategy == "direct" and direct.amplification == 1.0


def test_fragments_larger_than_memory_are_written_in_slabs():
    layout = SourceLayout(FragmentGrid(((100,) * 10, (512,), (512,))))
    whole = FragmentGrid(((1000,), (512,), (512,)))  # one 1 GiB fragment
    plan = plan_split("/tas", layout, whole, 4, "128MiB")
    assert plan.target.nfragments == 1 and plan.slabs.nfragments > 1
    assert plan.peak_memory <= 128 << 20
    assert plan.slabs.sizes[1:] == ((512,), (512,))  # slabs keep whole trailing dimensions (contiguous runs)


def test_impossible_budget_is_refused_naming_the_chunks():
    layout = SourceLayout(FragmentGrid(((10,) * 10, (512,), (512,))), (10, 512, 512), compressed=True)
    with pytest.raises(BudgetError, match=r"max_mem=20.00 MiB.*chunks of 10 x 512 x 512.*decoded whole"):
        plan_split("/tas", layout, FragmentGrid(((100,), (256,) * 2, (256,) * 2)), 4, "20MiB")


def test_bad_arguments():
    grid = FragmentGrid(((4,), (4,)))
    with pytest.raises(ValueError, match="strategy"):
        plan_split("/v", SourceLayout(grid), grid, 4, "1GiB", strategy="fast")
    with pytest.raises(ValueError, match="shape"):
        plan_split("/v", SourceLayout(grid), FragmentGrid(((5,), (4,))), 4, "1GiB")
    with pytest.raises(ValueError, match="different shapes"):
        refine(grid, FragmentGrid(((3,), (4,))))
