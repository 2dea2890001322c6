"""``daskcfa.rebuild``: recover a lost aggregation file from the fragments ``to_cfa`` wrote.

Each test writes a real aggregation with ``daskcfa.to_cfa``, deletes the
aggregation file, rebuilds it from the fragments alone and reads it back
against the numpy ground truth.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import daskcfa
from builders import assert_editable_by_netcdf_c, assert_matches, generation_dir, make_truth
from daskcfa.errors import AggregationError

pytestmark = pytest.mark.usefixtures("other_cwd")

xr = pytest.importorskip("xarray")

TIME = np.arange(7.0)
LAT = np.linspace(-45.0, 45.0, 4)
LON = np.arange(0.0, 360.0, 60.0)


def dataset(seed: int = 0):
    """Three data variables with different dimensions, dtypes and masks; CF coordinates."""
    rng = np.random.default_rng(seed)
    tas = rng.uniform(200, 320, size=(7, 4, 6)).astype("f4")
    pr = rng.random((7, 4, 6))
    orog = rng.random((4, 6)).astype("f4")
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), tas, {"units": "K"}),
         "pr": (("time", "lat", "lon"), pr, {"units": "kg m-2 s-1"}),
         "orog": (("lat", "lon"), orog, {"units": "m"})},
        coords={"time": ("time", TIME, {"units": "days since 2000-01-01", "calendar": "standard"}),
                "lat": ("lat", LAT, {"units": "degrees_north"}),
                "lon": ("lon", LON, {"units": "degrees_east"})},
        attrs={"title": "rebuild test", "institution": "here"},
    )
    for name in ("time",):
        ds[name].encoding = {"units": "days since 2000-01-01", "calendar": "standard"}
    return ds


def assert_same_dataset(url: str, ds, storage_options=None) -> None:
    with daskcfa.open_cfa(url, storage_options=storage_options) as got:
        for name in ("tas", "pr", "orog"):
            assert got[name].is_aggregated, name
            assert_matches(got[name][...], ds[name].values)
            assert got[name].attrs["units"] == ds[name].attrs["units"]
        for name, values in (("lat", LAT), ("lon", LON)):
            np.testing.assert_array_equal(np.asarray(got[name][...]), values)
        np.testing.assert_array_equal(np.asarray(got["time"][...]), TIME)
        assert got.attrs["title"] == "rebuild test"


def test_rebuild_multi_variable_dataset(tmp_path):
    ds = dataset()
    url = str(tmp_path / "ds.nca")
    daskcfa.to_cfa(ds, url, fragment_shape={"time": 3, "lat": 2})
    before = {name: daskcfa.read_aggregation(url, name).fragments.grid.sizes for name in ("tas", "pr", "orog")}
    os.remove(url)

    rebuilt = daskcfa.rebuild(str(tmp_path / "ds"), url)
    assert rebuilt == url
    assert_same_dataset(url, ds)
    for name, sizes in before.items():
        assert daskcfa.read_aggregation(url, name).fragments.grid.sizes == sizes
    # the same relative references as the writer's
    gen = generation_dir(tmp_path / "ds").name
    assert daskcfa.read_aggregation(url, "tas").fragments[(0, 0, 0)].uris == (f"ds/{gen}/ds.tas.0.0.0.nc",)


def test_rebuild_from_a_glob_or_a_list_elsewhere(tmp_path):
    ds = dataset(1)
    url = str(tmp_path / "a" / "ds.nca")
    daskcfa.to_cfa(ds, url, fragment_shape={"time": 2})
    os.remove(url)
    other = str(tmp_path / "elsewhere" / "copy.nc")
    gen = generation_dir(tmp_path / "a" / "ds").name
    daskcfa.rebuild(str(tmp_path / "a" / "ds" / "g-*" / "*.nc"), other)
    assert_same_dataset(other, ds)
    assert daskcfa.read_aggregation(other, "tas").fragments[(0, 0, 0)].uris == (f"../a/ds/{gen}/ds.tas.0.0.0.nc",)
    listed = sorted(str(p) for p in (tmp_path / "a" / "ds" / gen).glob("*.nc"))
    with pytest.raises(FileExistsError):
        daskcfa.rebuild(listed, other)
    daskcfa.rebuild(listed, other, mode="w", format="CFA-0.6.2")
    assert_same_dataset(other, ds)


def test_rebuild_without_coordinates_uses_the_fragment_names(tmp_path):
    """An array written without coordinates: only the fragment names say where each belongs."""
    truth = make_truth((9, 5, 4), "i2", masked=0.2, seed=3)
    url = str(tmp_path / "x.nc")
    daskcfa.to_cfa(truth, url, variable="v", dims=("t", "y", "x"), fragment_shape=(4, 2, 4))
    os.remove(url)
    daskcfa.rebuild(str(tmp_path / "x"), url)
    x = daskcfa.from_cfa(url, "v")
    assert x.chunks == ((4, 4, 1), (2, 2, 1), (4,))
    assert_matches(x.compute(), truth)


def test_rebuild_packed_variable(tmp_path):
    ds = dataset(2)
    ds["tas"].encoding = {"dtype": "i2", "scale_factor": 0.01, "add_offset": 260.0, "_FillValue": -32767}
    url = str(tmp_path / "p.nc")
    daskcfa.to_cfa(ds, url, fragment_shape={"time": 4})
    expected = daskcfa.from_cfa(url, "tas").compute()
    os.remove(url)
    daskcfa.rebuild(str(tmp_path / "p"), url)
    assert_matches(daskcfa.from_cfa(url, "tas").compute(), expected)


def test_fragments_of_two_aggregations_are_refused(tmp_path):
    for stem in ("one", "two"):
        daskcfa.to_cfa(make_truth((4, 3), "f4", seed=1), str(tmp_path / f"{stem}.nc"), variable="v",
                       dims=("t", "x"), fragment_shape=(2, 3))
        os.remove(tmp_path / f"{stem}.nc")
    with pytest.raises(AggregationError, match="one.*two|two.*one"):
        daskcfa.rebuild([str(tmp_path / "one"), str(tmp_path / "two")], str(tmp_path / "both.nc"))


def test_missing_fragment_is_reported(tmp_path):
    url = str(tmp_path / "m.nc")
    daskcfa.to_cfa(make_truth((6, 3), "f4", seed=2), url, variable="v", dims=("t", "x"), fragment_shape=(2, 3))
    os.remove(url)
    os.remove(generation_dir(tmp_path / "m") / "m.v.1.0.nc")
    with pytest.raises(AggregationError, match="missing along 't'"):
        daskcfa.rebuild(str(tmp_path / "m"), url)
    assert not os.path.exists(url)


def test_rebuild_on_s3(s3_server, s3_bucket, s3fs_fs):
    ds = dataset(4)
    options = s3_server.storage_options
    url = f"s3://{s3_bucket}/archive/ds.nca"
    daskcfa.to_cfa(ds, url, fragment_shape={"time": 3}, storage_options=options)
    s3fs_fs.rm(f"{s3_bucket}/archive/ds.nca")
    assert daskcfa.rebuild(f"s3://{s3_bucket}/archive/ds/", url, storage_options=options) == url
    assert_same_dataset(url, ds, storage_options=options)


def test_rebuild_variable_in_a_group(tmp_path):
    """``{var}`` joins groups with dots (``g.grp.v.0.0.nc``): the variable goes back into its group."""
    truth = make_truth((6, 4), "f4", seed=5)
    url = str(tmp_path / "g.nc")
    daskcfa.to_cfa(truth, url, variable="/grp/v", dims=("t", "y"), fragment_shape=(2, 4))
    os.remove(url)
    daskcfa.rebuild(str(tmp_path / "g"), url)
    assert_matches(daskcfa.from_cfa(url, "/grp/v").compute(), truth)


@pytest.mark.parametrize("fmt", ["CFA-0.5", "CFA-0.4"])
def test_rebuild_from_fragments_in_groups_is_refused_clearly(tmp_path, fmt):
    """CFA-0.5/0.4 fragments of a variable in a group hold it in that group (S3netCDF4's layout):
    not rebuilt, and the error says why rather than "no candidates"."""
    url = str(tmp_path / "g.nca")
    daskcfa.to_cfa(make_truth((6, 4), "f4", seed=5), url, variable="/grp/v", dims=("t", "y"), fragment_shape=(2, 4),
                   format=fmt)
    os.remove(url)
    with pytest.raises(AggregationError, match=r"holds its data in groups \(grp\)"):
        daskcfa.rebuild(str(tmp_path / "g"), url, format=fmt)

def test_rebuilt_file_is_editable_by_netcdf_c(tmp_path):
    # issue 13 item 12
    ds = dataset()
    url = str(tmp_path / "ds.nca")
    daskcfa.to_cfa(ds, url, fragment_shape={"time": 3, "lat": 2})
    os.remove(url)
    daskcfa.rebuild(str(tmp_path / "ds"), url, format="CFA-0.5")
    assert_editable_by_netcdf_c(url)
    assert_same_dataset(url, ds)
