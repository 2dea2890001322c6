"""Session 17's fast paths attacked (attack17b): masked chunks' cast sums (``MaskedChunk.sum``),
encodings worked out once per storage attributes, and the storage attributes' shapes. Each test
failed on main before the fix it comes with (docs/reliability.md, attack17b)."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

import daskcfa
from builders import build_cf113
from daskcfa.decode import Encoding
from daskcfa.graph.masked import MaskedChunk
from remote_helpers import write_cf113

pytestmark = pytest.mark.usefixtures("other_cwd")


def _outcome(call):
    """What ``call`` gives: its value's type, shape, bits and mask, or its error's type."""
    try:
        value = call()
    except Exception as error:  # (numpy's own errors: the outcome compared, not handled)
        return ("error", type(error))
    if value is np.ma.masked:
        return ("masked",)
    return (isinstance(value, np.ma.MaskedArray), np.shape(value), np.ma.getdata(value).dtype,
            np.ma.getdata(value).tobytes(), np.ma.getmaskarray(value).tobytes())


def _chunk_and_truth(shape=(4, 5000)):
    """A float32 chunk larger than numpy's buffer, a quarter masked (the cast sum's case), as a
    MaskedChunk and as a plain numpy.ma array."""
    rng = np.random.default_rng(17)
    data = (rng.standard_normal(shape) * 10 ** rng.uniform(-6, 6, shape)).astype("f4")
    mask = rng.random(shape) < 0.25
    return np.ma.MaskedArray(data, mask).view(MaskedChunk), np.ma.MaskedArray(data, mask)


@pytest.mark.parametrize("axis", [[0, 1], np.array([0, 1]), (0.0, 1.0), ("0", "1"), (True, False)],
                         ids=["list", "array", "floats", "strings", "bools"])
def test_cast_sum_refuses_the_axes_numpy_refuses(axis):
    """numpy takes an axis as an integer or a tuple of them; before, the cast sum took a list, an
    array of several, floats, strings and bools as every axis and summed where numpy.ma raises."""
    chunk, truth = _chunk_and_truth()
    for keepdims in ({}, {"keepdims": True}):
        assert _outcome(lambda: chunk.sum(axis=axis, dtype="f8", **keepdims)) == \
            _outcome(lambda: truth.sum(axis=axis, dtype="f8", **keepdims)) == ("error", TypeError)


def test_cast_sum_keepdims_as_numpy_takes_it():
    """A keepdims that is not a bool: numpy's "no value" marker (what numpy's wrappers pass when none
    was given) is no keepdims, a string is refused; before, the cast sum took any value as true and
    gave a (1, 1) array for a scalar, or a sum where numpy raises."""
    chunk, truth = _chunk_and_truth()
    no_value = inspect.signature(np.sum).parameters["keepdims"].default  # (numpy's marker, by its signature)
    for keepdims in (no_value, "yes"):
        assert _outcome(lambda: chunk.sum(dtype="f8", keepdims=keepdims)) == \
            _outcome(lambda: truth.sum(dtype="f8", keepdims=keepdims))
    assert np.shape(chunk.sum(dtype="f8", keepdims=no_value)) == ()


def test_zero_dimensional_masked_chunk_filled_and_summed():
    """A 0-d chunk's ``filled(0)`` (every sum and mean goes through it): before, a bare TypeError
    ("return arrays must be of ArrayType") from the bitwise fill when its point was masked."""
    chunk = np.ma.MaskedArray(np.array(-1.5, "f4"), True).view(MaskedChunk)
    truth = np.ma.MaskedArray(np.array(-1.5, "f4"), True)
    for method in ("filled", "sum", "mean"):
        args = (0,) if method == "filled" else ()
        assert _outcome(lambda: getattr(chunk, method)(*args)) == _outcome(lambda: getattr(truth, method)(*args))


def test_mean_of_a_masked_scalar_aggregation(tmp_path):
    """The user's path to the 0-d chunk: a scalar aggregated variable whose one value is missing;
    before, its ``mean()`` and ``sum()`` raised a bare TypeError."""
    built = build_cf113(tmp_path, np.ma.MaskedArray(np.array(1.5, "f4"), mask=True), (), ())
    x = daskcfa.from_cfa(str(built.path), built.variable)
    assert x.mean().compute() is np.ma.masked
    assert x.sum().compute() is np.ma.masked


# --- storage attributes of hostile shapes -------------------------------------------------------

RAW = np.array([1, 2, 3, 5, 7, 9], "i2")


@pytest.mark.parametrize("name, nested, flat", [
    ("valid_range", [[1, 5]], [1, 5]),
    ("missing_value", [[1, 2]], [1, 2]),
    ("missing_value", [[[7]]], [7]),
], ids=["valid_range", "missing_value", "missing_value-deep"])
def test_nested_storage_attribute_is_its_numbers(name, nested, flat):
    """Zarr's JSON attributes may nest the numbers netCDF stores flat: the same masking as the flat
    attribute (netCDF4-python's, on the numbers). Before: a bare ValueError (unpacking or broadcasting)."""
    assert _outcome(lambda: Encoding.from_attrs({name: nested}, RAW.dtype).decode(RAW)) == \
        _outcome(lambda: Encoding.from_attrs({name: flat}, RAW.dtype).decode(RAW))


@pytest.mark.parametrize("name", ["_FillValue", "valid_min", "valid_max"])
@pytest.mark.parametrize("empty", [[], [[]]], ids=["empty", "empty-nested"])
def test_empty_storage_attribute_holds_no_value(name, empty):
    """An empty attribute holds no value: as if absent, as daskcfa already read an empty
    ``missing_value`` or ``valid_range``. Before: a bare IndexError."""
    assert _outcome(lambda: Encoding.from_attrs({name: empty}, RAW.dtype).decode(RAW)) == \
        _outcome(lambda: Encoding.from_attrs({}, RAW.dtype).decode(RAW))


def test_zarr_fragment_with_a_nested_valid_range(tmp_path):
    """The same through a Zarr v2 fragment read by an aggregation: before, the fragment was refused
    (a FragmentReadError wrapping the unpacking's ValueError) though its numbers are plain."""
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "frag.zarr"
    group = zarr.open_group(zarr.storage.LocalStore(store), mode="w", zarr_format=2)
    array = group.create_array("x", shape=(6,), dtype="f4", compressors=None, fill_value=None,
                               attributes={"_ARRAY_DIMENSIONS": ["n"], "units": "K"})
    array[...] = [1, 2, 3, 5, 7, 9]
    attrs = store / "x" / ".zattrs"
    attrs.write_text(json.dumps({**json.loads(attrs.read_text()), "valid_range": [[1.0, 5.0]]}))
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[6]], [["frag.zarr"]])
    got = daskcfa.from_cfa(str(path), "x").compute()
    np.testing.assert_array_equal(np.ma.getmaskarray(got), [False, False, False, False, True, True])
    np.testing.assert_array_equal(got.compressed(), [1, 2, 3, 5])


@pytest.mark.parametrize("name", ["_FillValue", "valid_min"])
def test_aggregation_variable_with_an_empty_attribute(tmp_path, name):
    """An HDF5 attribute may hold no number at all: on the aggregation variable, before, ``from_cfa``
    raised a bare IndexError; now it is read as absent, as an empty ``missing_value`` already was."""
    h5py = pytest.importorskip("h5py")
    truth = np.ma.MaskedArray(np.arange(6.0, dtype="f4"))
    built = build_cf113(tmp_path, truth, ("n",), ((3, 3),))
    with h5py.File(built.path, "a") as f:
        if name in f[built.variable].attrs:
            del f[built.variable].attrs[name]
        f[built.variable].attrs.create(name, np.zeros((0,), "f4"))
    got = daskcfa.from_cfa(str(built.path), built.variable).compute()
    np.testing.assert_array_equal(np.ma.filled(got, -1), truth.data)
