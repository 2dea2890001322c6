"""Masked chunks (``daskcfa.graph.masked``): dask counts them cheaply, and every
reduction still equals numpy's masked-array ground truth."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from dask.array.dispatch import numel_lookup

import daskcfa
from daskcfa.graph.masked import MaskedChunk, masked_chunk

from builders import build_cf113, make_truth

DIMS = ("time", "lat", "lon")
SIZES = ((3, 3, 2), (4, 4), (5,))


def _truth(kind: str) -> np.ma.MaskedArray:
    truth = make_truth((8, 8, 5), "f4", seed=7)
    if kind == "some":  # missing points in the first fragments only: others have no mask at all
        truth[0, 1, 2] = np.ma.masked
        truth[1:3, 0:4, :] = np.ma.masked
    elif kind == "all":
        truth[...] = np.ma.masked
    return truth


@pytest.fixture(params=["none", "some", "all"])
def built(request, tmp_path):
    return build_cf113(tmp_path, _truth(request.param), DIMS, SIZES)


REDUCTIONS = {
    "mean": lambda a: a.mean(),
    "mean-f8": lambda a: a.mean(dtype="f8"),
    "mean-axis": lambda a: a.mean(axis=(1, 2)),
    "mean-keepdims": lambda a: a.mean(axis=0, keepdims=True),
    "sum": lambda a: a.sum(),
    "std": lambda a: a.std(),
    "var-axis": lambda a: a.var(axis=0),
    "max": lambda a: a.max(),
    "min-axis": lambda a: a.min(axis=2),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_equal_numpy_masked_ground_truth(built, name):
    reduce = REDUCTIONS[name]
    x = daskcfa.from_cfa(str(built.path), "tas")
    with dask.config.set(scheduler="sync"):
        actual = reduce(x).compute()
    expected = reduce(built.expected)
    if expected is np.ma.masked or (np.ndim(expected) == 0 and np.ma.getmask(expected)):
        assert actual is np.ma.masked or bool(np.ma.getmaskarray(actual).all()), actual
        return
    np.testing.assert_array_equal(np.ma.getmaskarray(actual), np.ma.getmaskarray(expected))
    np.testing.assert_allclose(np.ma.filled(actual, 0).astype("f8"), np.ma.filled(expected, 0).astype("f8"),
                               rtol=2e-6)


def test_computed_values_are_masked_arrays_with_the_truths_mask(built):
    x = daskcfa.from_cfa(str(built.path), "tas")
    with dask.config.set(scheduler="sync"):
        values = x.compute()
        block = x.blocks[0, 0, 0].compute()
    assert isinstance(values, np.ma.MaskedArray) and isinstance(block, np.ma.MaskedArray)
    np.testing.assert_array_equal(np.ma.getmaskarray(values), np.ma.getmaskarray(built.expected))
    np.testing.assert_array_equal(values.filled(0), built.expected.filled(0))
    assert "masked_array" in repr(values[:1, :1, :1])  # (the chunk type does not show)


@pytest.mark.parametrize("kwargs", [{}, {"axis": None, "keepdims": True}, {"axis": (0, 2)},
                                    {"axis": 1, "keepdims": True, "dtype": "f8"}, {"dtype": "i8"}])
@pytest.mark.parametrize("mask", ["nomask", "some", "all"])
def test_count_agrees_with_dasks_own_count_of_masked_arrays(kwargs, mask):
    data = np.arange(60, dtype="f4").reshape(3, 4, 5)
    if mask == "nomask":
        values = np.ma.MaskedArray(data)
    else:
        values = np.ma.MaskedArray(data, mask=(data % 7 == 0) if mask == "some" else True)
    ours = numel_lookup(masked_chunk(values), **kwargs)
    dasks = numel_lookup.dispatch(np.ma.MaskedArray)(values, **kwargs)
    np.testing.assert_array_equal(np.ma.filled(ours, -1), np.ma.filled(dasks, -1))
    assert np.shape(ours) == np.shape(dasks)
    # dask counts a masked array in its own type (float32 here: inexact past 2**24); we count as it
    # counts plain arrays, in float64, unless a dtype is given
    if ours is not np.ma.masked:  # (a wholly masked count is numpy's masked constant, as dask's is)
        assert np.asarray(ours).dtype == np.dtype(kwargs.get("dtype", "f8"))


def test_dataset_variables_read_numpys_own_masked_arrays(built):
    with daskcfa.open_cfa(str(built.path)) as ds:
        values = ds["tas"][0, :2, :2]
    assert type(values) is np.ma.MaskedArray
    np.testing.assert_array_equal(np.ma.getmaskarray(values), np.ma.getmaskarray(built.expected[0, :2, :2]))


def test_masked_chunk_shares_data_and_mask():
    values = np.ma.MaskedArray(np.arange(4.0), mask=[0, 1, 0, 0])
    chunk = masked_chunk(values)
    assert isinstance(chunk, MaskedChunk) and np.shares_memory(chunk.data, values.data)
    np.testing.assert_array_equal(chunk.mask, values.mask)
