"""Masked chunks (``daskcfa.graph.masked``): dask counts them cheaply, and every
reduction still equals numpy's masked-array ground truth."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from dask.array.dispatch import numel_lookup

import daskcfa
from daskcfa.graph.masked import MaskedChunk

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
    ours = numel_lookup(values.view(MaskedChunk), **kwargs)
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
    chunk = values.view(MaskedChunk)
    assert isinstance(chunk, MaskedChunk) and np.shares_memory(chunk.data, values.data)
    np.testing.assert_array_equal(chunk.mask, values.mask)


# -- numpy.ma's semantics on real files, for every dtype, with and without missing and special values --

SHAPE = (8, 6, 5)
TIME_SIZES = ((3, 3, 2), (6,), (5,))


def _files_truth(dtype: str, missing: bool, special: bool) -> np.ma.MaskedArray:
    truth = make_truth(SHAPE, dtype, seed=3, lo=-5, hi=50)
    truth[3, 0, :] = 0
    if special:  # (not finite, and not masked: numpy.ma masks what powers and logs of them give)
        truth[0, 0, 0], truth[2, 1, 1], truth[5, 2, 3] = np.nan, np.inf, -np.inf
    if missing:
        truth[4, 1:3, :] = np.ma.masked
        truth[0, 5, 4] = np.ma.masked
    return truth


CASES = [(d, m, s) for d in ("f4", "f8", "i4") for m in (False, True) for s in ((False, True) if d != "i4" else (False,))]


@pytest.fixture(params=CASES, ids=lambda c: f"{c[0]}-{'missing' if c[1] else 'full'}{'-special' if c[2] else ''}")
def on_files(request, tmp_path):
    """(the aggregation, netCDF4-python's reading of its fragment files joined along time)"""
    import netCDF4

    built = build_cf113(tmp_path, _files_truth(*request.param), DIMS, TIME_SIZES)
    parts = []
    for key in sorted(built.fragment_files):
        with netCDF4.Dataset(built.fragment_files[key]) as nc:
            parts.append(nc.variables["tas"][:])
    joined = np.ma.concatenate(parts, axis=0)
    with netCDF4.Dataset(built.path) as nc:  # (the aggregation variable's fill value, as netCDF4-python's)
        tas = nc.variables["tas"]
        joined.set_fill_value(tas.getncattr("_FillValue") if "_FillValue" in tas.ncattrs()
                              else netCDF4.default_fillvals[joined.dtype.str[1:]])
    return built, joined


OPS = {
    "mean": lambda a: a.mean(),
    "mean-f8": lambda a: a.mean(dtype="f8"),
    "mean-axis0": lambda a: a.mean(axis=0),
    "sum": lambda a: a.sum(),
    "sum-axis12": lambda a: a.sum(axis=(1, 2)),
    "var": lambda a: a.var(),
    "var-axis0": lambda a: a.var(axis=0),
    "std": lambda a: a.std(),
    "std-ddof1": lambda a: a.std(ddof=1),
    "max": lambda a: a.max(),
    "min-axis0": lambda a: a.min(axis=0),
    "argmax": lambda a: a.argmax(),
    "anomaly": lambda a: a - a.mean(),
    "square": lambda a: a**2,
    "log": lambda a: np.log(a),
    "divide-by-0": lambda a: a / 0,
    "add-mul": lambda a: 2 * a + a * 3,
    "rsub": lambda a: 1 - a,
}
ELEMENTWISE = {"square": lambda a: a**2, "log": lambda a: np.log(a), "divide-by-0": lambda a: a / 0,
               "add-mul": lambda a: 2 * a + a * 3, "rsub": lambda a: 1 - a}


def _assert_identical(actual, expected):
    assert type(actual) is type(expected), (type(actual), type(expected))  # numpy's own, never a MaskedChunk
    assert (actual is np.ma.masked) == (expected is np.ma.masked)
    assert np.asarray(actual).dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(np.ma.getmaskarray(actual), np.ma.getmaskarray(expected))
    np.testing.assert_array_equal(np.ma.getdata(actual), np.ma.getdata(expected))  # (masked points' values too)
    if isinstance(expected, np.ma.MaskedArray):
        assert actual.fill_value == expected.fill_value or (np.isnan(actual.fill_value) and np.isnan(expected.fill_value))


@pytest.mark.parametrize("name", OPS)
def test_dask_over_masked_chunks_is_dask_over_numpys_masked_arrays(on_files, name):
    """Every result is the one dask computes over netCDF4-python's masked arrays with numpy.ma:
    the same values (masked points' too), mask, dtype, fill value and type."""
    built, truth = on_files
    x = daskcfa.from_cfa(str(built.path), "tas")
    reference = dask.array.from_array(truth, chunks=x.chunks, asarray=False)
    with dask.config.set(scheduler="sync"), np.errstate(all="ignore"):
        actual, expected = OPS[name](x).compute(), OPS[name](reference).compute()
    _assert_identical(actual, expected)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_results_are_numpy_mas(on_files, name):
    """Operations on each point (domains masked: the log of a negative, a division by zero, powers
    that are not finite) equal numpy.ma's on the whole of netCDF4-python's masked array."""
    built, truth = on_files
    with dask.config.set(scheduler="sync"), np.errstate(all="ignore"):
        actual = ELEMENTWISE[name](daskcfa.from_cfa(str(built.path), "tas")).compute()
        expected = ELEMENTWISE[name](truth)
    _assert_identical(actual, expected)


def _chunk(missing: bool) -> MaskedChunk:
    data = np.random.default_rng(0).standard_normal((4, 64, 64)).astype("f4")
    mask = np.zeros(data.shape, bool)
    mask[1, :10] = True
    return np.ma.MaskedArray(data, mask=mask if missing else np.ma.nomask).view(MaskedChunk)


def test_dasks_moments_of_an_unmasked_chunk_make_no_more_arrays_than_of_its_data():
    """dask's ``var``/``std`` chunk step over a chunk with nothing masked allocates what it does
    over the plain data (numpy.ma's power made a copy through ``where`` and arrays of flags)."""
    import tracemalloc

    from dask.array.reductions import moment_chunk

    chunk = _chunk(missing=False)

    def peak(values) -> int:
        tracemalloc.start()
        moment_chunk(values, axis=(0, 1, 2), keepdims=True)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    peak(chunk), peak(chunk.data)  # (once first: what a first call imports or caches is not the chunk's cost)
    # (and the mask of False numpy.ma gives a difference from a mean that has a mask: a byte each)
    assert peak(chunk) <= peak(chunk.data) + chunk.size + 4096, (peak(chunk), peak(chunk.data))


@pytest.mark.parametrize("missing", [False, True])
def test_dasks_moments_of_a_masked_chunk_skip_numpy_mas_extra_passes(monkeypatch, missing):
    """dask's ``var``/``std`` chunk step neither counts by summing ones nor subtracts and squares
    through numpy.ma's own operations (which or masks with made ones, copy through ``where`` and
    flag every result that is not finite); its result is theirs."""
    from dask.array.reductions import moment_chunk

    chunk = _chunk(missing)
    expected = moment_chunk(chunk.view(np.ma.MaskedArray), axis=(0, 1, 2), keepdims=True)

    def refused(*args, **kwargs):
        raise AssertionError("computed by numpy.ma")

    for name in ("power", "subtract"):
        monkeypatch.setattr(np.ma.core, name, refused)
    monkeypatch.setattr(np, "ones", refused)
    actual = moment_chunk(chunk, axis=(0, 1, 2), keepdims=True)
    for key in ("total", "n", "M"):
        np.testing.assert_array_equal(np.ma.getdata(actual[key]), np.ma.getdata(expected[key]))
        np.testing.assert_array_equal(np.ma.getmaskarray(actual[key]), np.ma.getmaskarray(expected[key]))


def test_squares_whose_sum_overflows_warn_of_nothing_numpy_ma_does_not():
    """The finiteness check sums the squares: a sum that overflows (every square finite) must
    neither warn nor mask, as numpy.ma's power does not."""
    import warnings

    values = np.ma.MaskedArray(np.full(64, 1e154)).view(MaskedChunk)  # squares 1e308 < float64's max; their sum is not
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        squared = values**2
    expected = np.ma.power(values.view(np.ma.MaskedArray), 2)
    np.testing.assert_array_equal(np.ma.getdata(squared), np.ma.getdata(expected))
    np.testing.assert_array_equal(np.ma.getmaskarray(squared), np.ma.getmaskarray(expected))


def test_users_get_numpys_masked_array_and_chunks_stay_masked_chunks(tmp_path):
    """compute(), one chunk or many, a slice, a reduction, pickling: numpy.ma.MaskedArray, and the
    dask meta says so; only the chunks inside the graph are MaskedChunks (issue 28 item 5)."""
    import pickle
    import subprocess
    import sys

    truth = _truth("some")
    url = daskcfa.to_cfa(truth, str(tmp_path / "t.nc"), variable="tas", dims=DIMS, fragment_shape=(3, 4, 5))
    x = daskcfa.from_cfa(url)
    assert type(x._meta) is np.ma.MaskedArray and "chunktype=numpy.MaskedArray" in repr(x)
    assert type(x.blocks[0, 0, 0].compute()) is np.ma.MaskedArray  # a lone chunk
    assert x.map_blocks(lambda b: np.full((1, 1, 1), type(b) is MaskedChunk), chunks=(1,) * 3).compute().all()
    for result in (x.compute(), x[:2].compute(), x.rechunk((8, 8, 5)).compute(), x.sum(axis=0).compute(),
                   (x - x.mean(axis=0)).compute()):
        assert type(result) is np.ma.MaskedArray
    result = x.compute()
    np.testing.assert_array_equal(result.mask, np.ma.getmaskarray(truth))
    pickled = tmp_path / "r.pkl"
    pickled.write_bytes(pickle.dumps(result))
    script = ("import pickle, sys; r = pickle.load(open(sys.argv[1], 'rb')); "
              "print(type(r).__module__, type(r).__name__, 'daskcfa' in sys.modules, int(r.mask.sum()))")
    out = subprocess.run([sys.executable, "-c", script, str(pickled)], capture_output=True, text=True, cwd=tmp_path,
                         check=True).stdout.split()
    assert out == ["numpy.ma", "MaskedArray", "False", str(int(np.ma.getmaskarray(truth).sum()))]


def test_counting_a_masked_chunk_over_every_axis_makes_no_array_as_large_as_it():
    """dask's ``numel`` of a masked chunk over all its axes (every ``mean``, ``var``, ``std``) counts
    the masked points: no array of the points not masked, summed as float64, is made."""
    import tracemalloc

    chunk = _chunk(missing=True)
    expected = numel_lookup(chunk.view(np.ma.MaskedArray), axis=(0, 1, 2), keepdims=True, dtype="f8")
    for kwargs in ({"axis": (0, 1, 2), "keepdims": True}, {"axis": None}, {"axis": (-1, 0, 1)}):
        numel_lookup(chunk, **kwargs)
        tracemalloc.start()
        counted = numel_lookup(chunk, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < chunk.size // 4, (kwargs, peak)
        assert float(np.ma.getdata(counted).reshape(-1)[0]) == float(np.ma.getdata(expected).reshape(-1)[0])
    everything = np.ma.MaskedArray(chunk.data, mask=np.ones(chunk.shape, bool)).view(MaskedChunk)
    assert numel_lookup(everything, axis=None) is np.ma.masked
    assert np.ma.getmaskarray(numel_lookup(everything, axis=(0, 1, 2), keepdims=True)).all()


@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_dasks_deviations_are_squared_as_products_with_numpy_mas_values(monkeypatch, missing, dtype):
    """dask's ``var``/``std`` square deviations in float64 (``d**2``): the product, not numpy's generic
    ``pow`` loop (several times slower), with the same values, mask and type as numpy.ma's."""
    from dask.array.reductions import moment_chunk

    chunk = _chunk(missing).astype(dtype).view(MaskedChunk)
    expected = moment_chunk(chunk.view(np.ma.MaskedArray), axis=(0, 1, 2), keepdims=True)
    deviations = chunk - np.ma.getdata(expected["total"]) / np.ma.getdata(expected["n"])
    squared_by_numpy_ma = np.ma.power(deviations.view(np.ma.MaskedArray), 2)

    def refused(*args, **kwargs):
        raise AssertionError("the pow loop")

    monkeypatch.setattr(np, "power", refused)
    squared = deviations**2
    assert type(squared) is MaskedChunk and squared.dtype == squared_by_numpy_ma.dtype == np.float64
    np.testing.assert_array_equal(np.ma.getdata(squared), np.ma.getdata(squared_by_numpy_ma))
    np.testing.assert_array_equal(np.ma.getmaskarray(squared), np.ma.getmaskarray(squared_by_numpy_ma))
    actual = moment_chunk(chunk, axis=(0, 1, 2), keepdims=True)
    for key in ("total", "n", "M"):
        np.testing.assert_array_equal(np.ma.getdata(actual[key]), np.ma.getdata(expected[key]))


@pytest.mark.parametrize("dtype", ["f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"])
def test_filled_with_zero_is_numpy_mas_bits_without_a_branch_per_point(monkeypatch, dtype):
    """Every sum of a masked chunk fills it with zero: the bits of numpy.ma's ``filled(0)`` (NaN,
    infinities and -0.0 kept where not masked, +0 where masked), without ``np.where``, whose branch
    per point slows it down several times on scattered masks."""
    rng = np.random.default_rng(5)
    data = (rng.standard_normal((3, 40, 50)) * 100).astype(dtype)
    if data.dtype.kind == "f":
        data[0, 0, :5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    truth = np.ma.MaskedArray(data, mask=rng.random(data.shape) < 0.3)
    expected = {fill: truth.filled(fill) for fill in (0, 0.0, np.zeros((), dtype)[()])}

    def refused(*args, **kwargs):
        raise AssertionError("np.where")

    monkeypatch.setattr(np, "where", refused)
    for fill, want in expected.items():
        got = truth.view(MaskedChunk).filled(fill)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), fill


@pytest.mark.parametrize("dtype", ["i1", "i2", "u2", "f4"])
def test_filled_with_the_default_fill_value_keeps_numpy_mas_type_and_values(tmp_path, dtype):
    """A masked chunk whose fill value is numpy.ma's default (it took that of a numpy masked
    operand: ``da.ma.masked_greater(y, 12) + x``), filled without a value (``da.ma.filled``): numpy.ma
    casts the default (999999, 1e20) to the chunk's type; ``np.where`` made int64/float64 of it
    (999999 where numpy.ma gives 16959 for int16), against the dask meta's type."""
    import netCDF4

    truth = np.ma.masked_equal(np.arange(40).reshape(8, 5) % 7, 5).astype(dtype)
    url = daskcfa.to_cfa(truth, str(tmp_path / "t.nca"), variable="v", dims=("t", "x"), fragment_shape=(4, 5))
    with netCDF4.Dataset(sorted(tmp_path.glob("t/*/*.nc"))[0]) as nc:  # (netCDF4-python's read of rows 0-3)
        first = nc["v"][...]
    other = np.arange(40, dtype=dtype).reshape(8, 5)
    x = daskcfa.from_cfa(url)
    with dask.config.set(scheduler="sync"):
        got = dask.array.ma.filled(dask.array.ma.masked_greater(dask.array.from_array(other, chunks=x.chunks), 12)
                                   + x).compute()
    expected = np.ma.filled(np.ma.masked_greater(other[:4], 12) + first)
    assert got.dtype == expected.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got[:4], expected)


def _lone_chunks(dtype: str) -> list[MaskedChunk]:
    """Chunks of numbers masking nothing, as reads and partial sums give them: default and set fill
    values, C- and F-ordered, a view with strides; each made afresh (reading ``fill_value`` sets it)."""
    values = np.arange(24).reshape(2, 3, 4).astype(dtype)
    set_fill = np.ma.MaskedArray(values.copy(), fill_value=True if dtype == "?" else 7).view(MaskedChunk)
    return [np.ma.MaskedArray(values.copy()).view(MaskedChunk), set_fill,
            np.ma.MaskedArray(np.asfortranarray(values)).view(MaskedChunk),
            np.ma.MaskedArray(values.copy()).view(MaskedChunk)[:, ::2, 1:]]


@pytest.mark.parametrize("dtype", ["?", "i1", "u2", "i4", "i8", "f4", "f8"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_a_lone_chunk_masking_nothing_is_joined_as_dask_joins_numpys_masked_arrays(dtype, axis):
    """Each partial sum of a mean is one chunk joined alone (``_concatenate2``): joined without numpy.ma's
    generic join, it is still exactly dask's join of masked arrays, as numpy's own masked array: a copy of
    the values, no mask, the chunk's fill value (numpy.ma's default where it has none), every attribute."""
    from dask.array.dispatch import concatenate_lookup

    dask_join = concatenate_lookup.dispatch(np.ma.MaskedArray)
    for case, (chunk, twin) in enumerate(zip(_lone_chunks(dtype), _lone_chunks(dtype))):
        got = concatenate_lookup.dispatch(MaskedChunk)([chunk], axis=axis)
        want = dask_join([twin], axis=axis).view(np.ma.MaskedArray)
        assert type(got) is np.ma.MaskedArray and got.mask is np.ma.nomask, case
        assert got.dtype == want.dtype and got.shape == want.shape and got.strides == want.strides, case
        assert got.tobytes() == want.tobytes() and not np.shares_memory(got.data, chunk.data), case
        assert got.fill_value == want.fill_value and got._fill_value.dtype == want._fill_value.dtype, case
        assert got.__dict__.keys() == want.__dict__.keys(), case
        for name in got.__dict__:
            if name not in ("_fill_value", "_mask"):
                assert got.__dict__[name] == want.__dict__[name], (case, name)
        assert chunk.fill_value == twin.fill_value, case  # (the join read it: it is set on the chunk, as by dask)


def test_a_lone_chunk_masking_nothing_is_joined_without_numpy_mas_join(monkeypatch):
    """Only a lone chunk of numbers masking nothing skips numpy.ma's join; a masked one, several, or
    characters still take it (and give what they gave)."""
    from dask.array.dispatch import concatenate_lookup

    join = concatenate_lookup.dispatch(MaskedChunk)
    generic = np.ma.concatenate
    calls = []
    monkeypatch.setattr(np.ma, "concatenate", lambda *a, **k: calls.append(1) or generic(*a, **k))
    values = np.ma.MaskedArray(np.arange(6.0).reshape(2, 3)).view(MaskedChunk)
    join([values], axis=1)
    assert calls == []
    masked = np.ma.MaskedArray(np.arange(6.0).reshape(2, 3), mask=[[0, 1, 0], [0, 0, 0]]).view(MaskedChunk)
    joined = join([masked], axis=0)
    assert type(joined) is np.ma.MaskedArray and joined.mask.tolist() == masked.mask.tolist() and len(calls) == 1
    join([values, values], axis=0)
    join([np.ma.MaskedArray(np.array([b"a", b"b"])).view(MaskedChunk)], axis=0)
    assert len(calls) == 3
    several = np.ma.MaskedArray(np.arange(3.0)).view(MaskedChunk)
    several._fill_value = np.array([1.0, 2.0, 3.0])  # (an array of fill values: dask refuses to join it)
    with pytest.raises(ValueError, match="non-scalar"):
        join([several], axis=0)


# -- sums that cast (``mean(dtype="f8")`` of float32, the float64 squares of ``var``/``std`` as float32) --

def _cast_sum_cases() -> list:
    rng = np.random.default_rng(11)
    # (36,600 values: four of numpy's buffers and a part; magnitudes so varied every regrouping of the sum shows)
    data = rng.standard_normal((4, 150, 61)) * 10 ** rng.uniform(-3, 5, (4, 150, 61))
    data[0, 0, :4] = [-0.0, 3e4, -1e-30, 7.0]
    blob = np.zeros(data.shape, bool)
    blob[:, 40:110, 10:50] = True  # (a land mask)
    return [(data, blob), (data, rng.random(data.shape) < 0.3), (data, np.zeros(data.shape, bool)),
            (data, np.ones(data.shape, bool)), (data[:1, :100, :61], blob[:1, :100, :61])]  # (under one buffer)


@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("stored,summed", [("f4", "f8"), ("f8", "f4")])
@pytest.mark.parametrize("kwargs", [{}, {"axis": (0, 1, 2), "keepdims": True}, {"axis": None, "keepdims": False},
                                    {"axis": (-1, 0, 1)}])
def test_sums_that_cast_are_numpy_mas_bits(case, stored, summed, kwargs):
    """A masked chunk summed over every axis in a wider float type is summed without numpy.ma's
    filled copy (buffer by buffer, as numpy sums with a cast): the same bits, mask and type as
    numpy.ma's sum, whatever the mask (a land, scattered, none, all) and size (a narrower type: numpy.ma's
    own sum)."""
    data, mask = _cast_sum_cases()[case]
    truth = np.ma.MaskedArray(data.astype(stored), mask=mask)
    expected = np.ma.MaskedArray.sum(truth, dtype=summed, **kwargs)
    got = np.sum(truth.view(MaskedChunk), dtype=summed, **kwargs)
    if expected is np.ma.masked:
        assert got is np.ma.masked
        return
    assert type(np.ma.getdata(got)) is type(np.ma.getdata(expected)) and np.shape(got) == np.shape(expected)
    assert np.ma.getdata(got).dtype == np.ma.getdata(expected).dtype == np.dtype(summed)
    assert np.ma.getdata(got).tobytes() == np.ma.getdata(expected).tobytes(), (got, expected)
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))


@pytest.mark.parametrize("axis", [(0, 1, 5), (0, 0, 1, 2), (0, 1, 2, -3), 3])
def test_sums_over_axes_out_of_range_or_named_twice_fail_as_numpy_mas(axis):
    """Axes that only look like every axis (one out of range, one named twice) are numpy.ma's error."""
    data, mask = _cast_sum_cases()[0]
    truth = np.ma.MaskedArray(data.astype("f4"), mask=mask)
    with pytest.raises(Exception) as expected:
        np.ma.MaskedArray.sum(truth, axis=axis, dtype="f8")
    with pytest.raises(type(expected.value)):
        np.sum(truth.view(MaskedChunk), axis=axis, dtype="f8")


def test_a_sum_that_casts_makes_no_filled_copy_of_the_chunk():
    """``mean(dtype="f8")``'s sum of float32 values makes no array as large as the chunk: numpy.ma's
    makes the filled copy, a fresh array each chunk."""
    import tracemalloc

    rng = np.random.default_rng(4)
    data, mask = rng.standard_normal((10, 300, 300)), rng.random((10, 300, 300)) < 0.3
    for stored, summed in (("f4", "f8"),):
        chunk = np.ma.MaskedArray(data.astype(stored), mask=mask).view(MaskedChunk)
        np.sum(chunk, dtype=summed)  # (once first: what a first call caches is not the chunk's cost)
        tracemalloc.start()
        np.sum(chunk, dtype=summed, axis=(0, 1, 2), keepdims=True)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < chunk.nbytes / 2, (stored, peak, chunk.nbytes)


def test_sums_that_cast_values_not_finite_are_numpy_mas():
    """A total that is not finite (NaN or infinities kept) is numpy.ma's own, warnings included."""
    import warnings

    for special in ([np.nan], [np.inf], [np.inf, -np.inf]):
        values = np.full((2, 100, 100), 3e38, "f4")
        values[1, 5, 5:5 + len(special)] = special
        truth = np.ma.MaskedArray(values, mask=np.arange(values.size).reshape(values.shape) % 3 == 0)
        with warnings.catch_warnings(record=True) as expected_warnings:
            warnings.simplefilter("always")
            expected = np.ma.MaskedArray.sum(truth, dtype="f8")
        with warnings.catch_warnings(record=True) as got_warnings:
            warnings.simplefilter("always")
            got = np.sum(truth.view(MaskedChunk), dtype="f8")
        assert got.tobytes() == expected.tobytes(), special
        assert [str(w.message) for w in got_warnings] == [str(w.message) for w in expected_warnings]


@pytest.mark.parametrize("missing", ["land", "scattered", "none", "all-in-one", "all"])
def test_moments_and_means_of_masked_files_are_numpy_mas_bits(tmp_path, missing):
    """``std``, ``var`` (``ddof``), ``mean(dtype="f8")`` and ``max`` over real files are, to the bit, what
    dask computes over numpy's own masked chunks of the same data: partly masked fragments, a wholly
    masked one, all of them; NaN kept in a fragment."""
    import dask.array as da

    truth = make_truth((6, 64, 70), "f4", seed=13, lo=-40, hi=40)
    truth *= (10 ** np.random.default_rng(3).uniform(-3, 4, truth.shape)).astype("f4")  # (sums' order shows)
    truth[5, 3, 3] = np.nan  # (one fragment's total not finite: summed as numpy.ma sums it)
    if missing == "land":
        truth[:, 10:40, 20:60] = np.ma.masked
    elif missing == "scattered":
        truth[np.random.default_rng(2).random(truth.shape) < 0.3] = np.ma.masked
    elif missing == "all-in-one":
        truth[3:6] = np.ma.masked
        truth[:3, :5] = np.ma.masked
    elif missing == "all":
        truth[...] = np.ma.masked
    built = build_cf113(tmp_path, truth, DIMS, ((3, 3), (64,), (70,)))
    x = daskcfa.from_cfa(str(built.path), "tas")
    plain = da.from_array(built.expected, chunks=x.chunks, asarray=False)
    ops = {"std": lambda a: a.std(), "var-ddof": lambda a: a.var(ddof=1), "std-no-nan": lambda a: a[:3].std(),
           "mean-f8": lambda a: a[:3].mean(dtype="f8"), "max": lambda a: a[:3].max(),
           "sum-f8": lambda a: a.sum(dtype="f8")}
    with dask.config.set(scheduler="sync"):
        for name, op in ops.items():
            got, expected = op(x).compute(), op(plain).compute()
            assert (got is np.ma.masked) == (expected is np.ma.masked), name
            if expected is not np.ma.masked:
                assert np.asarray(got).dtype == np.asarray(expected).dtype, name
                assert np.asarray(got).tobytes() == np.asarray(expected).tobytes(), (name, got, expected)
