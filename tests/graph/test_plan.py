"""The writer's fragment planner: exact shapes, byte limits, balance, edge cases."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskcfa.graph.plan import aligned_chunks, classify_axes, describe, plan_fragments, subdivided_chunks
from daskcfa.model import FragmentGrid


def largest_bytes(grid: FragmentGrid, dtype) -> int:
    return math.prod(max(row) for row in grid.sizes) * np.dtype(dtype).itemsize


# --- fragment_shape given ---------------------------------------------------


def test_fragment_shape_honoured_with_ragged_last():
    grid = plan_fragments((10, 7, 4), "f8", ("time", "lat", "lon"), fragment_shape=(4, 7, 3))
    assert grid.sizes == ((4, 4, 2), (7,), (3, 1))


def test_fragment_shape_ignores_size_limit():
    grid = plan_fragments((100,), "f8", ("time",), fragment_shape=(50,), max_fragment_size=8)
    assert grid.sizes == ((50, 50),)


def test_fragment_shape_clipped_to_dimension():
    grid = plan_fragments((5, 3), "i4", ("a", "b"), fragment_shape=(100, 2))
    assert grid.sizes == ((5,), (2, 1))


def test_fragment_shape_dict_missing_dims_are_whole():
    grid = plan_fragments((10, 6, 8), "f4", ("time", "lat", "lon"), fragment_shape={"time": 3, "lon": 5})
    assert grid.sizes == ((3, 3, 3, 1), (6,), (5, 3))


def test_fragment_shape_numpy_ints_accepted():
    grid = plan_fragments(np.array([6]), "f4", ["x"], fragment_shape=np.array([4]))
    assert grid.sizes == ((4, 2),)


def test_fragment_shape_with_empty_dimension():
    grid = plan_fragments((0, 4), "f4", ("time", "x"), fragment_shape={"x": 2})
    assert grid.sizes == ((0,), (2, 2))
    assert grid.shape == (0, 4)


# --- size limit -------------------------------------------------------------


DTYPES = ["i1", "i2", "f4", "f8", "c16", "S3", "S40"]
NAMES = ["time", "t", "lev", "plev", "depth", "lat", "y", "lon", "x", "member", "nv", "station"]


@st.composite
def arrays_and_limits(draw):
    ndim = draw(st.integers(0, 4))
    dims = draw(st.lists(st.sampled_from(NAMES), min_size=ndim, max_size=ndim, unique=True))
    shape = tuple(draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, 300))) for _ in range(ndim))
    dtype = draw(st.sampled_from(DTYPES))
    limit = draw(st.one_of(st.integers(1, 64), st.integers(1, 10**7)))
    return shape, dtype, dims, limit


@settings(max_examples=200, deadline=None)
@given(arrays_and_limits())
def test_size_limit_respected(case):
    shape, dtype, dims, limit = case
    grid = plan_fragments(shape, dtype, dims, max_fragment_size=limit)
    assert grid.shape == shape  # sizes sum to the shape
    for n, row in zip(shape, grid.sizes):
        if n == 0:
            assert row == (0,)
        else:
            assert min(row) >= 1  # never an empty fragment
            assert row[:-1] == (row[0],) * (len(row) - 1)  # even split, last may be smaller
            assert row[-1] <= row[0]
        if n == 1:
            assert row == (1,)  # size-1 axes are never split
    if largest_bytes(grid, dtype) > limit:
        # only allowed when one element alone is too big: then one element per fragment
        assert np.dtype(dtype).itemsize > limit
        assert all(max(row) == 1 for row in grid.sizes if row != (0,))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), st.sampled_from(DTYPES), st.integers(1, 10**6))
def test_one_dimension_not_oversplit(n, dtype, limit):
    """In 1-D the plan is the fewest even-split fragments that fit."""
    itemsize = np.dtype(dtype).itemsize
    (row,) = plan_fragments((n,), dtype, ("time",), max_fragment_size=limit).sizes
    count = len(row)
    assert row[0] * itemsize <= limit or row[0] == 1
    if count > 1:
        assert math.ceil(n / (count - 1)) * itemsize > limit


def test_limit_strings_are_bytes():
    # 1000 float64 = 8000 bytes; "4kB" is 4000 bytes (decimal), "4KiB" 4096 (binary)
    assert plan_fragments((1000,), "f8", ("t",), max_fragment_size="4kB").sizes == ((500, 500),)
    assert plan_fragments((1000,), "f8", ("t",), max_fragment_size="4KiB").sizes == ((500, 500),)
    assert plan_fragments((1000,), "f8", ("t",), max_fragment_size="3KiB").sizes == ((334, 334, 332),)
    # the same element count in bytes, not elements: int8 fits whole
    assert plan_fragments((1000,), "i1", ("t",), max_fragment_size="4kB").sizes == ((1000,),)


def test_uneven_divisions_never_give_empty_fragments():
    # 10 elements, at most 2 per fragment: 6 "divisions" would leave one empty;
    # the plan derives the grid from the length: five fragments of 2.
    assert plan_fragments((10,), "f8", ("t",), max_fragment_size=16).sizes == ((2,) * 5,)
    assert plan_fragments((10,), "f8", ("t",), max_fragment_size=24).sizes == ((3, 3, 3, 1),)


def test_single_element_over_limit_gives_one_element_fragments():
    grid = plan_fragments((3, 4), "c16", ("time", "lat"), max_fragment_size=8)
    assert grid.sizes == ((1, 1, 1), (1, 1, 1, 1))


def test_size_one_axes_never_split():
    grid = plan_fragments((1, 40, 1, 1), "f8", ("time", "lev", "lat", "lon"), max_fragment_size=8)
    assert grid.sizes == ((1,), (1,) * 40, (1,), (1,))


def test_fits_already_gives_one_fragment():
    grid = plan_fragments((12, 10, 20), "f4", ("time", "lat", "lon"))
    assert grid.sizes == ((12,), (10,), (20,))


def test_scalar_and_empty():
    assert plan_fragments((), "f8", ()) == FragmentGrid(())
    assert plan_fragments((), "c16", (), max_fragment_size=1) == FragmentGrid(())
    assert plan_fragments((0, 1000), "f8", ("time", "lon"), max_fragment_size=8).sizes == ((0,), (1000,))


def test_one_dimensional():
    grid = plan_fragments((1000,), "f4", ("station",), max_fragment_size=1000)
    assert grid.sizes == ((250,) * 4,)


# --- balance ----------------------------------------------------------------


def test_daily_field_balances_time_against_map():
    # (3650, 180, 360) float32 = 946,080,000 B; "50MB" = 50,000,000 B.
    # (T, Y, X) = fragment lengths; costs: series = T count, map = Y count * X count.
    #   (3650,180,360) 946.1MB  series 1 = map 1 (tie) -> time:          T 1825
    #   (1825,180,360) 473.0MB  series 2 > map 1 -> map, fewest & longest: X 180
    #   (1825,180,180) 236.5MB  series 2 = map 2 (tie) -> time:           T 1217
    #   (1217,180,180) 157.7MB  series 3 > map 2 -> map, fewest (Y):      Y 90
    #   (1217, 90,180)  78.9MB  series 3 < map 4 -> time:                 T 913
    #   ( 913, 90,180)  59.2MB  series 4 = map 4 (tie) -> time:           T 730
    #   ( 730, 90,180)  47.3MB  fits.
    grid = plan_fragments((3650, 180, 360), "float32", ("time", "lat", "lon"), max_fragment_size="50MB")
    assert grid.sizes == ((730,) * 5, (90, 90), (180, 180))
    assert largest_bytes(grid, "f4") == 47_304_000


def test_first_split_is_time():
    # just over the limit: one split, along time (tie rule), maps stay whole
    grid = plan_fragments((10, 100, 100), "f8", ("time", "lat", "lon"), max_fragment_size=500_000)
    assert grid.sizes == ((5, 5), (100,), (100,))


def test_vertical_axis_split_last_beside_time():
    # (12, 19, 180, 360) float32 with 1MB: time and map balance, plev stays whole
    grid = plan_fragments((12, 19, 180, 360), "f4", ("time", "plev", "lat", "lon"), max_fragment_size="1MB")
    assert grid.grid_shape[1] == 1
    assert grid.grid_shape[0] > 1 and grid.grid_shape[2] * grid.grid_shape[3] > 1
    assert largest_bytes(grid, "f4") <= 1_000_000


def test_without_map_axes_the_rest_is_the_map():
    # (time, station): the field at one time is all stations, balanced against time
    grid = plan_fragments((100, 100), "f8", ("time", "station"), max_fragment_size=8 * 25 * 25)
    assert grid.grid_shape == (4, 4)


def test_map_only_splits_longer_axis_first():
    grid = plan_fragments((100, 200), "f8", ("lat", "lon"), max_fragment_size=8 * 100 * 100)
    assert grid.sizes == ((100,), (100, 100))


def test_axes_mapping_overrides_names():
    # "a" is declared the time axis, "b" and "c" the map: time splits first
    grid = plan_fragments((10, 100, 100), "f8", ("a", "b", "c"), axes={"a": "t", "b": "Y", "c": "X"},
                          max_fragment_size=500_000)
    assert grid.sizes == ((5, 5), (100,), (100,))
    # with "b" declared the time axis instead, "b" takes the first split
    grid = plan_fragments((10, 100, 100), "f8", ("a", "b", "c"), axes={"a": "X", "b": "T", "c": "Y"},
                          max_fragment_size=500_000)
    assert grid.sizes == ((10,), (50, 50), (100,))


# --- classification ---------------------------------------------------------


@pytest.mark.parametrize(
    "name, axis",
    [
        ("time", "T"), ("t", "T"), ("valid_time", "T"), ("Time", "T"),
        ("z", "Z"), ("lev", "Z"), ("plev", "Z"), ("level", "Z"), ("depth", "Z"), ("height", "Z"),
        ("y", "Y"), ("lat", "Y"), ("latitude", "Y"), ("rlat", "Y"),
        ("x", "X"), ("lon", "X"), ("longitude", "X"), ("rlon", "X"),
        ("member", "N"), ("nv", "N"), ("station", "N"), ("bnds", "N"),
    ],
)
def test_classify_by_name(name, axis):
    assert classify_axes((name,)) == (axis,)


def test_classify_axes_mapping_wins_and_extra_keys_ignored():
    assert classify_axes(("time", "foo"), {"time": "z", "foo": "X", "elsewhere": "T"}) == ("Z", "X")


# --- invalid input ----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(shape=(3, -1)), "negative"),
        (dict(shape=(3.0, 2)), "shape must be an integer"),
        (dict(dims=("a",)), "1 dimension names"),
        (dict(dims=("a", "a")), "unique"),
        (dict(fragment_shape=(1,)), "has 1 entries"),
        (dict(fragment_shape=(1, 0)), "along 'b' must be positive"),
        (dict(fragment_shape=(1, -2)), "must be positive"),
        (dict(fragment_shape=(1, 2.5)), "along 'b' must be an integer"),
        (dict(fragment_shape=(True, 2)), "must be an integer"),
        (dict(fragment_shape={"c": 2}), "unknown dimensions"),
        (dict(fragment_shape="12"), "sequence of ints or a mapping"),
        (dict(max_fragment_size="lots"), "cannot read max_fragment_size"),
        (dict(max_fragment_size=0), "at least 1 byte"),
        (dict(max_fragment_size=-5), "at least 1 byte"),
        (dict(max_fragment_size=1.5), "max_fragment_size must be an integer"),
        (dict(axes={"a": "W"}), "one of T, Z, Y, X, N"),
        (dict(dtype=str), "no fixed item size"),
    ],
)
def test_invalid_inputs(kwargs, match):
    args = dict(shape=(4, 5), dtype="f8", dims=("a", "b")) | kwargs
    shape, dtype, dims = args.pop("shape"), args.pop("dtype"), args.pop("dims")
    with pytest.raises(ValueError, match=match):
        plan_fragments(shape, dtype, dims, **args)


# --- aligned_chunks and describe ---------------------------------------------


def test_aligned_chunks():
    grid = FragmentGrid(((4, 4, 2), (6,)))
    assert aligned_chunks(grid, ((4, 4, 2), (6,)))
    assert aligned_chunks(grid, ((2, 2, 4, 1, 1), (3, 3)))  # finer chunks, boundaries kept
    assert not aligned_chunks(grid, ((5, 5), (6,)))  # a chunk straddles two fragments
    assert not aligned_chunks(grid, ((10,), (6,)))  # coarser than the fragments
    assert aligned_chunks(FragmentGrid(((0,),)), ((0,),))
    assert aligned_chunks(FragmentGrid(()), ())
    with pytest.raises(ValueError, match="shape"):
        aligned_chunks(grid, ((4, 4), (6,)))
    with pytest.raises(ValueError, match="shape"):
        aligned_chunks(grid, ((10,),))


def test_describe():
    grid = plan_fragments((3650, 180, 360), "f4", ("time", "lat", "lon"))
    assert describe(grid, "f4") == "20 fragments in a 5 x 2 x 2 grid, of 730 x 90 x 180 float32 (45.11 MiB each)"
    ragged = FragmentGrid(((4, 4, 2), (7,)))
    assert describe(ragged, "f8") == "3 fragments in a 3 x 1 grid, of <=4 x 7 float64 (at most 224 B)"
    assert describe(FragmentGrid(()), "f8") == "1 fragment (scalar float64, 8 B)"


def test_subdivided_chunks_follow_each_slab_s_chunk_grid():
    grid = FragmentGrid.from_sizes([(10, 7), (6,)])
    assert subdivided_chunks(grid, [[3, None], [2]], 100) == ((3, 3, 3, 1, 7), (2, 2, 2))


def test_subdivided_chunks_become_whole_multiples_when_too_many():
    grid = FragmentGrid.from_sizes([(100,), (8,)])
    rows = subdivided_chunks(grid, [[1], [1]], 100)
    assert math.prod(map(len, rows)) <= 100 and all(sum(r) == n for r, n in zip(rows, (100, 8)))
    assert all(c % 1 == 0 for c in rows[0]) and rows[0][0] in (1, 2, 4, 8, 16, 32, 64)
    assert set(rows[0][:-1]) == {rows[0][0]} and set(rows[1][:-1]) <= {rows[1][0]}
    assert subdivided_chunks(grid, [[1], [1]], 1) == ((100,), (8,))  # (whole fragments, at most)


def test_subdivided_chunks_are_counted_before_they_are_cut():
    """A trillion chunks of one element are never listed: whole multiples of them fit ``max_chunks``."""
    grid = FragmentGrid.from_sizes([(10**12,), (10**6, 10**6)])
    rows = subdivided_chunks(grid, [[1], [1, None]], 100_000)
    assert math.prod(map(len, rows)) <= 100_000 and [sum(r) for r in rows] == [10**12, 2 * 10**6]
