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


def test_decode_cf_false_hands_over_stored_values(tmp_path):
    built = build_cf113(tmp_path, make_truth((6, 4, 5), "f4", seed=3, masked=0.1), DIMS, SIZES,
                        dtype="i2", agg_scale_factor=0.01, agg_add_offset=250.0)
    raw = xr.open_dataset(str(built.path), engine="daskcfa", decode_cf=False)
    assert raw["tas"].dtype == np.dtype("i2")
    assert raw["tas"].attrs["scale_factor"] == pytest.approx(0.01) and raw["tas"].attrs["add_offset"] == 250.0
    decoded = xr.decode_cf(raw)
    assert_equal_masked(decoded["tas"].values, built.expected)
