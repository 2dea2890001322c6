"""xarray's ``engine="daskcfa"``: every dialect, CF decoding by xarray, lazy slices."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import daskcfa
import daskcfa.xarray_backend
from builders import DIALECTS, Frag, build, build_cf113, make_truth
from read_helpers import bytes_read, chunked_archive, fragment_bytes

pytestmark = pytest.mark.usefixtures("other_cwd")

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (2, 3))


def assert_equal_masked(values: np.ndarray, expected: np.ma.MaskedArray) -> None:
    """xarray masks with NaN: compare against the masked ground truth."""
    np.testing.assert_array_equal(np.isnan(values), np.ma.getmaskarray(expected))
    np.testing.assert_allclose(np.nan_to_num(values), np.ma.filled(expected.astype("f8"), 0), rtol=1e-6)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_equals_ground_truth(tmp_path, dialect):
    built = build(dialect, tmp_path, make_truth((6, 4, 5), "f4", seed=2, masked=0.2), DIMS, SIZES)
    ds = xr.open_dataset(str(built.path), engine="daskcfa")
    name = built.variable.rsplit("/", 1)[-1]
    assert_equal_masked(ds[name].values, built.expected)
    chunked = daskcfa.xarray_backend.open_dataset(str(built.path), chunks={})
    assert chunked[name].chunks == SIZES  # one dask chunk per fragment


def test_packing_of_the_aggregation_is_decoded_by_xarray(tmp_path):
    built = build_cf113(tmp_path, make_truth((6, 4, 5), "f4", seed=3, masked=0.1), DIMS, SIZES,
                        dtype="i2", agg_scale_factor=0.01, agg_add_offset=250.0)
    ds = xr.open_dataset(str(built.path), engine="daskcfa")
    assert ds["tas"].encoding["dtype"] == np.dtype("i2")
    assert_equal_masked(ds["tas"].values, built.expected)


def test_missing_fragments_read_as_nan(tmp_path):
    built = build("CFA-0.6", tmp_path, make_truth((6, 4, 5), "f4", seed=4), DIMS, SIZES,
                  frags={(1, 0, 1): Frag(absent=True)})
    ds = xr.open_dataset(str(built.path), engine="daskcfa")
    assert_equal_masked(ds["tas"].values, built.expected)
    assert np.isnan(ds["tas"].values[2:5, :, 2:5]).all()


def test_missing_fill_reads_an_unreadable_fragment_as_nan(tmp_path):
    truth = make_truth((6, 4, 5), "f4", seed=5)
    built = build("CF-1.13", tmp_path, truth, DIMS, SIZES)
    broken = sorted(p for p in tmp_path.rglob("*.nc") if p != built.path)[0]
    broken.write_bytes(b"not a netCDF file")
    with pytest.raises(daskcfa.FragmentReadError):
        xr.open_dataset(str(built.path), engine="daskcfa")["tas"].values
    with pytest.warns(daskcfa.CFAWarning, match="missing data"):
        values = xr.open_dataset(str(built.path), engine="daskcfa", missing="fill")["tas"].values
    assert np.isnan(values).sum() == 2 * 4 * 2  # fragment (0, 0, 0): 2 times x 4 lats x 2 lons
    assert not np.isnan(values[2:]).any()


def test_lazy_point_series_reads_little(tmp_path):
    built = chunked_archive(tmp_path)
    ds = xr.open_dataset(str(built.path), engine="daskcfa")
    ds["tas"][0, 0, 0].values  # warm-up: imports read files too
    before = bytes_read()
    series = ds["tas"][:, 5, 7].values
    used = bytes_read() - before
    assert_equal_masked(series, built.expected[:, 5, 7])
    assert used < fragment_bytes(built) / 4


def test_drop_variables_and_unknown_group(tmp_path):
    built = build_cf113(tmp_path, make_truth((6, 4, 5), "f4", seed=5), DIMS, SIZES)
    ds = xr.open_dataset(str(built.path), engine="daskcfa", drop_variables=["lat"])
    assert "lat" not in ds.variables and "tas" in ds
    with pytest.raises(KeyError):
        xr.open_dataset(str(built.path), engine="daskcfa", group="/nope")


def test_cf_decoded_round_trip_is_identical(tmp_path):
    import pandas as pd

    rng = np.random.default_rng(0)
    data = rng.normal(280, 5, (12, 4, 5)).astype("f4")
    data[3, 1, 2] = np.nan
    ds = xr.Dataset(
        {"tas": (DIMS, data, {"units": "K", "standard_name": "air_temperature"})},
        coords={"time": pd.date_range("2000-01-01", periods=12, freq="D"),
                "lat": ("lat", np.linspace(-45, 45, 4), {"units": "degrees_north"}),
                "lon": ("lon", np.linspace(0, 288, 5), {"units": "degrees_east"})},
        # the writer declares CF-1.13 (readers such as cfdm need it): say so up front
        attrs={"title": "round trip", "Conventions": "CF-1.13"},
    )
    path = str(tmp_path / "tas.nca")
    daskcfa.to_cfa(ds, path, fragment_shape=(5, 4, 5))
    back = xr.open_dataset(path, engine="daskcfa", chunks={})
    assert back["tas"].chunks == ((5, 5, 2), (4,), (5,))
    xr.testing.assert_identical(ds, back.load())


# ---------------------------------------------------------------------------
# Groups: xr.open_datatree and open_dataset(group=...)
# ---------------------------------------------------------------------------
def grouped_archive(directory, dialect):
    """Aggregated variables in the root, in /grp and in /model/run1 (with its own dimensions),
    plus an ordinary variable and attributes in /grp."""
    import netCDF4

    tas = build(dialect, directory, make_truth((6, 4, 5), "f4", seed=11, masked=0.2), DIMS, SIZES)
    pr = build(dialect, directory, make_truth((6, 4, 5), "f8", seed=12), DIMS, ((6,), (1, 3), (5,)),
               name="pr", group="grp", append=True)
    uas = build(dialect, directory, make_truth((6, 4, 5), "f4", seed=13, masked=0.1), DIMS, ((3, 3), (2, 2), (5,)),
                name="uas", group="model/run1", dims_in_group=True, append=True)
    orog = np.arange(20, dtype="f4").reshape(4, 5)
    with netCDF4.Dataset(str(tas.path), "a") as ds:
        ds["grp"].setncattr("source", "group attribute")
        var = ds["grp"].createVariable("orog", "f4", ("lat", "lon"))
        var.units, var[:] = "m", orog
    return tas, pr, uas, orog


@pytest.mark.parametrize("dialect", ("CF-1.13", "cfdm-interim", "cfapyx-interim"))
def test_datatree_every_group_equals_ground_truth(tmp_path, dialect):
    tas, pr, uas, orog = grouped_archive(tmp_path, dialect)
    tree = xr.open_datatree(str(tas.path), engine="daskcfa", chunks={})
    assert [path for path, _ in tree.subtree_with_keys] == [".", "grp", "model", "model/run1"]
    for path, built in (("/tas", tas), ("/grp/pr", pr), ("/model/run1/uas", uas)):
        array = tree[path]
        assert array.chunks == built.chunks, path  # lazy, one dask chunk per fragment
        assert_equal_masked(array.values, built.expected)
    grp = tree["grp"]
    assert grp.attrs["source"] == "group attribute"
    assert set(grp.dataset.data_vars) == {"pr", "orog"}  # instruction variables stay hidden
    np.testing.assert_array_equal(grp["orog"].values, orog)
    assert grp["orog"].attrs["units"] == "m"
    np.testing.assert_array_equal(grp["pr"]["lat"].values, tree["lat"].values)  # coordinates inherited from the root


def test_datatree_of_a_group_and_open_dataset_of_a_group(tmp_path):
    tas, pr, uas, orog = grouped_archive(tmp_path, "CF-1.13")
    sub = daskcfa.xarray_backend.open_datatree(str(tas.path), group="/model")
    assert [path for path, _ in sub.subtree_with_keys] == [".", "run1"]
    assert_equal_masked(sub["run1/uas"].values, uas.expected)
    groups = xr.open_groups(str(tas.path), engine="daskcfa")
    assert list(groups) == ["/", "/grp", "/model", "/model/run1"]
    assert_equal_masked(groups["/grp"]["pr"].values, pr.expected)
    ds = xr.open_dataset(str(tas.path), engine="daskcfa", group="grp", chunks={})
    assert set(ds.data_vars) == {"pr", "orog"} and ds.attrs["source"] == "group attribute"
    assert ds["pr"].chunks == pr.chunks
    assert_equal_masked(ds["pr"].values, pr.expected)
    with pytest.raises(KeyError, match="not a group"):
        xr.open_datatree(str(tas.path), engine="daskcfa", group="/grp/pr")


def test_datatree_hides_cfa05_instruction_groups(tmp_path):
    built = build("CFA-0.5", tmp_path, make_truth((6, 4, 5), "f4", seed=14, masked=0.1), DIMS, SIZES)
    tree = xr.open_datatree(str(built.path), engine="daskcfa")
    assert [path for path, _ in tree.subtree_with_keys] == ["."]  # no cfa_tas group
    assert_equal_masked(tree["tas"].values, built.expected)


@pytest.mark.parametrize("option", ["decode_cf", "mask_and_scale"])
def test_decode_cf_false_hands_over_stored_values(tmp_path, option):
    built = build_cf113(tmp_path, make_truth((6, 4, 5), "f4", seed=3, masked=0.1), DIMS, SIZES,
                        dtype="i2", agg_scale_factor=0.01, agg_add_offset=250.0)
    raw = xr.open_dataset(str(built.path), engine="daskcfa", **{option: False})
    assert raw["tas"].dtype == np.dtype("i2")
    assert raw["tas"].attrs["scale_factor"] == pytest.approx(0.01) and raw["tas"].attrs["add_offset"] == 250.0
    decoded = xr.decode_cf(raw)
    assert_equal_masked(decoded["tas"].values, built.expected)


# ---------------------------------------------------------------------------
# CF decoding: what xarray makes of the same stored values in one netCDF file
# ---------------------------------------------------------------------------
#: (stored dtype, attributes, stored values at missing points); the last are stored
#: where a tenth of the points are missing (none: no point is). (Packed data: ``daskcfa.aggregate``
#: aggregates unpacked values; packed aggregations are tested with the builders' above and below.)
ENCODINGS = {
    "float": ("f4", {"_FillValue": np.float32(1e20)}, [np.float32(1e20)]),
    "float-none-missing": ("f4", {"_FillValue": np.float32(1e20)}, []),
    "float-no-fill-value": ("f4", {}, []),
    "double-missing-value": ("f8", {"_FillValue": -999.0, "missing_value": -998.0}, [-999.0, -998.0]),
    "float-nan-fill": ("f4", {"_FillValue": np.float32(np.nan)}, [np.float32(np.nan)]),
    "integer": ("i4", {"_FillValue": np.int32(-1)}, [np.int32(-1)]),
    # a missing_value float32 cannot hold (0.1 as float64): the masking is left to xarray after all,
    # which must still find both fill values where they were
    "float-inexact-missing-value": ("f4", {"_FillValue": np.float32(-999), "missing_value": 0.1}, [np.float32(-999)]),
}
DECODING = {"default": {}, "no-mask-and-scale": {"mask_and_scale": False}, "no-decode-cf": {"decode_cf": False}}
CF_ENCODING = ("_FillValue", "missing_value", "scale_factor", "add_offset", "dtype")


def cf_archive(directory, dtype, attrs, fills):
    """Stored values with ``attrs`` in one netCDF file and in 3 fragment files along time
    (the same bytes), aggregated: (the whole file, the aggregation file, numpy's decoded values)."""
    import netCDF4

    rng = np.random.default_rng(7)
    shape = (6, 4, 5)
    stored = rng.integers(100, 3000, shape).astype(dtype) if dtype[0] == "i" else rng.normal(280, 5, shape).astype(dtype)
    missing = rng.random(shape) < (0.1 if fills else 0.0)
    which = rng.integers(0, max(len(fills), 1), shape)
    for k, value in enumerate(fills):
        stored[missing & (which == k)] = value
    files = []
    for name, start, stop in [("whole", 0, 6), ("f0", 0, 2), ("f1", 2, 4), ("f2", 4, 6)]:
        path = directory / f"{name}.nc"
        with netCDF4.Dataset(path, "w") as nc:
            for dim, size in zip(DIMS, (stop - start, 4, 5)):
                nc.createDimension(dim, size)
            time = nc.createVariable("time", "f8", ("time",))
            time.units, time[:] = "days since 2000-01-01", np.arange(start, stop)
            var = nc.createVariable("v", dtype, DIMS, fill_value=attrs.get("_FillValue", False))
            var.set_auto_maskandscale(False)
            var.setncatts({k: v for k, v in attrs.items() if k != "_FillValue"} | {"units": "K"})
            var[:] = stored[start:stop]
        files.append(str(path))
    agg = daskcfa.aggregate(files[1:], str(directory / "v.nc"))
    decoded = stored * attrs.get("scale_factor", 1) + attrs.get("add_offset", 0)
    decoded = np.where(missing, np.nan, decoded)
    return files[0], agg, decoded


@pytest.mark.parametrize("decoding", DECODING)
@pytest.mark.parametrize("case", ENCODINGS)
def test_decoded_as_xarray_decodes_the_same_file(tmp_path, case, decoding):
    dtype, attrs, fills = ENCODINGS[case]
    whole, agg, decoded = cf_archive(tmp_path, dtype, attrs, fills)
    options = DECODING[decoding]
    want = xr.open_dataset(whole, engine="netcdf4", **options)["v"]
    expected = {k: want.encoding[k] for k in CF_ENCODING if k in want.encoding}
    if case == "float-no-fill-value":
        # daskcfa declares netCDF's default fill value, which missing fragments hold, for xarray to mask
        declared = daskcfa.decode.default_fill_value(np.dtype(dtype))
        (expected if not options else want.attrs)["_FillValue"] = declared
    for chunks in (None, {}):
        got = xr.open_dataset(agg, engine="daskcfa", chunks=chunks, **options)["v"]
        assert got.dtype == want.dtype
        xr.testing.assert_identical(got.variable.load(), want.variable.load())
        np.testing.assert_equal({k: got.encoding[k] for k in CF_ENCODING if k in got.encoding}, expected)
        if not options:  # numpy's own decoding too
            np.testing.assert_array_equal(got.values, decoded.astype(got.dtype))


@pytest.mark.parametrize("case", ["float", "double-missing-value"])
def test_float_masking_is_done_once_in_the_read(tmp_path, monkeypatch, case):
    """A float variable's fragments stored as the aggregation are passed on as stored and masked once, in the
    read: no fragment is masked on its own, and xarray masks nothing again (no masked array, no NaN copy)."""
    import xarray.coding.variables

    from daskcfa.decode import Encoding

    dtype, attrs, fills = ENCODINGS[case]
    _, agg, decoded = cf_archive(tmp_path, dtype, attrs, fills)
    calls = []
    decode, apply_mask = Encoding.decode, xarray.coding.variables._apply_mask
    monkeypatch.setattr(Encoding, "decode", lambda *a, **k: calls.append("fragment decoded") or decode(*a, **k))
    monkeypatch.setattr(xarray.coding.variables, "_apply_mask",
                        lambda *a, **k: calls.append("xarray masked") or apply_mask(*a, **k))
    chunks = []
    read = daskcfa.xarray_backend._LazyArray._read
    monkeypatch.setattr(daskcfa.xarray_backend._LazyArray, "_read", lambda self, key: chunks.append(read(self, key)) or chunks[-1])
    values = xr.open_dataset(agg, engine="daskcfa", chunks={})["v"].values
    np.testing.assert_array_equal(values, decoded)
    assert calls == []
    assert chunks and not any(np.ma.isMaskedArray(c) for c in chunks)


@pytest.mark.parametrize("decoding", DECODING)
def test_fragments_stored_otherwise_than_the_aggregation(tmp_path, decoding):
    """Fragments masked or packed otherwise than the aggregation (theirs decoded, then missing
    where they are) beside fragments stored as it is (passed on as stored)."""
    frags = {(0, 0, 0): Frag(missing="missing_value"), (0, 0, 1): Frag(missing="valid_range"),
             (1, 0, 0): Frag(dtype="i2", scale_factor=0.01, add_offset=250.0), (2, 0, 1): Frag(missing="nan"),
             (1, 0, 1): Frag(absent=True)}
    built = build("CFA-0.6", tmp_path, make_truth((6, 4, 5), "f4", seed=21, masked=0.2), DIMS, SIZES, frags=frags)
    got = xr.open_dataset(str(built.path), engine="daskcfa", chunks={}, **DECODING[decoding])["tas"]
    if decoding == "default":
        assert_equal_masked(got.values, built.expected)
        return
    fill = got.attrs.get("_FillValue", got.encoding.get("_FillValue"))
    stored = got.values
    np.testing.assert_array_equal(stored == np.float32(fill), np.ma.getmaskarray(built.expected))
    np.testing.assert_allclose(np.where(stored == np.float32(fill), 0, stored),
                               np.ma.filled(built.expected, 0), rtol=1e-6)


@pytest.mark.parametrize("case", ["double-missing-value", "float-inexact-missing-value", "float"])
def test_says_what_xarray_says_of_the_same_file(tmp_path, case):
    """The backend's masking warns as xarray's does on the same file, once: not a second time when
    it tries the masking and then leaves it to xarray, nor never when it keeps it."""
    import warnings

    whole, agg, _ = cf_archive(tmp_path, *ENCODINGS[case])

    def said(path, engine):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            xr.open_dataset(path, engine=engine)["v"].load()
        return sorted(str(w.message) for w in caught if issubclass(w.category, xr.SerializationWarning))

    assert said(agg, "daskcfa") == said(whole, "netcdf4")


def test_a_misspelt_keyword_is_named_with_the_valid_ones(tmp_path):
    """Not ``decode_cf() got an unexpected keyword argument`` (issue 28 item 5)."""
    url = daskcfa.to_cfa(np.zeros((4, 3), "f4"), str(tmp_path / "t.nc"), variable="tas", dims=("t", "y"))
    with pytest.raises(daskcfa.ArgumentError, match=r"'decode_tims' \(did you mean 'decode_times'\?\)") as info:
        xr.open_dataset(url, engine="daskcfa", decode_tims=False)
    assert isinstance(info.value, TypeError) and "decode_cf" not in str(info.value)
    assert "storage_options" in str(info.value)
    with pytest.raises(daskcfa.ArgumentError, match="'grup'"):
        xr.open_datatree(url, engine="daskcfa", grup="/")
    with xr.open_dataset(url, engine="daskcfa", decode_times=False, use_cftime=None) as ds:
        assert ds["tas"].shape == (4, 3)
