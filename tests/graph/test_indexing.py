"""Index splitting over fragment grids agrees with numpy indexing."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskcfa.graph.indexing import array_axis_move, output_shape, split_key
from daskcfa.graph.read import _placement, _take
from daskcfa.model import FragmentGrid


def assemble(truth: np.ndarray, grid: FragmentGrid, key) -> np.ndarray:
    """Rebuild ``truth[key]`` from per-fragment reads, the way the reader does."""
    dims = split_key(grid, key)
    out = np.empty(output_shape(dims), truth.dtype)
    for pieces in itertools.product(*(d.pieces for d in dims)):
        frag = tuple(p.fragment for p in pieces)
        block = truth[grid.fragment_slices(frag)][tuple(p.local for p in pieces)]
        out[_placement(pieces)] = _take(block, pieces)
    flips = tuple(slice(None, None, -1) if d.reverse else slice(None) for d in dims if d.length is not None)
    move = array_axis_move(key, grid.ndim)
    return out[flips] if move is None else np.moveaxis(out[flips], *move)


@st.composite
def grids_and_keys(draw):
    ndim = draw(st.integers(1, 3))
    sizes = [draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)) for _ in range(ndim)]
    grid = FragmentGrid.from_sizes(sizes)
    key = []
    for n in grid.shape:
        kind = draw(st.sampled_from(["slice", "int", "array"]))
        if kind == "int":
            key.append(draw(st.integers(-n, n - 1)))
        elif kind == "array":
            key.append(np.array(draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=4))))
        else:
            bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
            step = draw(st.one_of(st.none(), st.integers(-4, 4).filter(lambda s: s != 0)))
            key.append(slice(draw(bound), draw(bound), step))
    # numpy applies several array indices jointly; keep at most one so both agree.
    arrays = [i for i, k in enumerate(key) if isinstance(k, np.ndarray)]
    for i in arrays[1:]:
        key[i] = slice(None)
    return grid, tuple(key)


@settings(max_examples=300, deadline=None)
@given(grids_and_keys())
def test_split_matches_numpy(case):
    grid, key = case
    truth = np.arange(int(np.prod(grid.shape))).reshape(grid.shape)
    np.testing.assert_array_equal(assemble(truth, grid, key), truth[key])


def test_lookup_is_bisection():
    grid = FragmentGrid.from_sizes([[3, 9, 1, 7]])
    assert [grid.fragment_at(0, i) for i in (0, 2, 3, 11, 12, 13, 19)] == [0, 0, 1, 1, 2, 3, 3]
    assert grid.fragments_between(0, 2, 13) == range(0, 3)
    assert grid.shape == (20,) and grid.grid_shape == (4,)


@pytest.mark.parametrize("key", [(6,), (0, 0, 0, 0), (-7,), (np.array([0, 9]),), (np.ones((2, 2), int),), ([0], [1])])
def test_bad_keys_raise_index_error(key):
    grid = FragmentGrid.from_sizes([[3, 3]])
    with pytest.raises(IndexError):
        split_key(grid, key)


def test_ellipsis_and_boolean():
    grid = FragmentGrid.from_sizes([[2, 2], [3]])
    truth = np.arange(12).reshape(4, 3)
    np.testing.assert_array_equal(assemble(truth, grid, (Ellipsis, 1)), truth[..., 1])
    mask = np.array([True, False, True, True])
    np.testing.assert_array_equal(assemble(truth, grid, (mask,)), truth[mask])


# numpy's indices that are selections of a result, not reads of fragments: refused, saying where to make them
NUMPY_ONLY = {
    "newaxis": (np.newaxis, slice(None)),
    "2-D integer array": np.array([[0, 4], [1, 3]]),
    "2-D boolean array": np.arange(20).reshape(5, 4) % 3 == 0,
    "two arrays": ([0, 2, 4], [1, 3, 0]),
    "boolean scalar": True,
}


@pytest.mark.parametrize("key", NUMPY_ONLY.values(), ids=NUMPY_ONLY.keys())
def test_numpy_indices_fragments_refuse_say_so_and_dask_takes_them(tmp_path, key):
    """What graph/indexing.py's docstring says it refuses: numpy takes each, the fragment split raises an
    IndexingError saying where to select it (not a bare error, nor ``True`` read as row 1), and where dask
    takes it (not a 2-D integer array; ``True``, which dask 2026.8 reads as row 1), the dask array from_cfa gives
    it numpy's result."""
    import warnings

    import daskcfa
    from daskcfa.netcdf4 import Dataset

    truth = np.arange(20, dtype="f8").reshape(5, 4)
    grid = FragmentGrid.from_sizes([[2, 3], [1, 3]])
    expected = truth[key]  # numpy takes it
    with pytest.raises(daskcfa.IndexingError, match=r"select them from what was read"):
        split_key(grid, key)
    if key is True or np.ndim(key) == 2 and np.asarray(key).dtype.kind == "i":
        return
    url = str(tmp_path / "a.nc")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Dataset(url, "w", format="CF-1.13") as ds:
            ds.createDimension("y", 5)
            ds.createDimension("x", 4)
            ds.createVariable("v", "f8", ("y", "x"), subarray_shape=[2, 3])[:] = truth
    got = daskcfa.from_cfa(url, "v")
    if isinstance(key, tuple) and all(isinstance(k, list) for k in key):
        got = got.vindex[key]  # (dask's point-wise selection: numpy's rule for two arrays)
    else:
        got = got[key]
    np.testing.assert_array_equal(np.asarray(got.compute()), expected)
