"""``to_cfa(mode="r+", region=...)`` with regions off the fragment boundaries (issue 16 item 2).

The touched fragments are rewritten with the stored values outside the
region and the new ones inside; real files on disk and on the S3 test server,
checked against numpy ground truth.
"""

from __future__ import annotations

import dask.array as da
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, make_truth

DIMS = ("time", "lat", "lon")
SHAPE = (10, 4, 6)  # time fragments 0:4, 4:8, 8:10; lat fragments 0:2, 2:4


def start(url, *, fmt="CF-1.13", dtype="f4", attrs=None, **kw):
    x = make_truth(SHAPE, dtype, masked=0.15, seed=1)
    url = daskcfa.to_cfa(x, str(url), variable="tas", dims=DIMS, attrs=attrs or {}, fragment_shape=(4, 2, 6),
                         coords={"time": np.arange(10.0)}, format=fmt, **kw)
    return url, x


def fragment_files(directory):
    return {p.relative_to(directory): p.stat().st_ino for p in directory.glob("g-*/*.nc")}


@pytest.mark.parametrize("region, rewritten", [
    ({"time": slice(0, 2)}, 2),  # the start of the first fragments
    ({"time": slice(5, 7)}, 2),  # the middle of one
    ({"time": slice(6, 8)}, 2),  # the end of one
    ({"time": slice(2, 7)}, 4),  # across two
    ({"time": slice(3, 9), "lat": slice(1, 3)}, 6),  # across several along two dimensions
    ({"time": slice(-3, -1), "lon": slice(1, -1)}, 4),  # numpy's negative indices
    ({"time": slice(4, 8)}, 2),  # on the boundaries: only those fragments
])
def test_unaligned_regions_merge_with_what_is_stored(tmp_path, region, rewritten, one_version):
    url, x = start(tmp_path / "t.nc")
    where = tuple(region.get(d, slice(None)) for d in DIMS)
    new = make_truth(x[where].shape, "f4", masked=0.3, seed=2, lo=0, hi=10)
    before = fragment_files(tmp_path / "t")
    daskcfa.to_cfa(new, url, mode="r+", region=region)
    expected = x.copy()
    expected[where] = new
    assert_matches(daskcfa.from_cfa(url).compute(), expected)
    after = fragment_files(tmp_path / "t")
    assert len(after) == len(before) and len(set(after.values()) - set(before.values())) == rewritten


def stored(path, index):
    with netCDF4.Dataset(path) as nc:
        nc.set_auto_maskandscale(False)
        return nc["tas"][index]


def test_fill_values_outside_the_region_are_kept_bit_for_bit(tmp_path, one_version):
    url, x = start(tmp_path / "t.nc", dtype="i2", attrs={"_FillValue": np.int16(-999)})
    first = next((tmp_path / "t").glob("g-*/t.tas.0.0.0.nc"))
    before = stored(first, slice(0, 1))
    assert (before == -999).any()
    new = np.ma.masked_array(np.full((3, 4, 6), 7, "i2"), mask=False)
    new[1, 1, 1] = np.ma.masked
    daskcfa.to_cfa(new, url, mode="r+", region={"time": slice(1, 4)})
    first = next((tmp_path / "t").glob("g-*/t.tas.0.0.0.nc"))
    np.testing.assert_array_equal(stored(first, slice(0, 1)), before)
    assert stored(first, (2, 1, 1)) == -999 and stored(first, (1, 0, 0)) == 7
    expected = x.copy()
    expected[1:4] = new
    assert_matches(daskcfa.from_cfa(url).compute(), expected)


def test_packed_fragments_keep_their_values_and_masks(tmp_path):
    xr = pytest.importorskip("xarray")
    x = np.ma.masked_array(np.arange(240).reshape(SHAPE) * 0.5 + 100.0, mask=np.arange(240).reshape(SHAPE) % 7 == 0)
    ds = xr.Dataset({"tas": (DIMS, x.filled(np.nan))})
    ds["tas"].encoding = {"dtype": "i2", "scale_factor": 0.5, "add_offset": 100.0, "_FillValue": -999}
    url = daskcfa.to_cfa(ds, str(tmp_path / "p.nc"), fragment_shape={"time": 4, "lat": 2})
    new = np.ma.masked_array(np.full((3, 4, 6), 1.5), mask=False)
    new[1, 1, 1] = np.ma.masked
    daskcfa.to_cfa(new, url, mode="r+", region={"time": slice(1, 4)})
    expected = x.copy()
    expected[1:4] = new
    assert_matches(daskcfa.from_cfa(url).compute(), expected, rtol=0)
    with xr.open_dataset(url, engine="daskcfa") as back:
        np.testing.assert_array_equal(back["tas"].values, expected.filled(np.nan))


@pytest.mark.parametrize("fmt", ["CFA-0.6.2", "CFA-0.5", "CFA-0.4"])
def test_missing_fragments_stay_missing_around_the_region(tmp_path, fmt):
    x = make_truth(SHAPE, "f4", seed=3)
    url = daskcfa.to_cfa(x[4:8], str(tmp_path / "s.nc"), variable="tas", dims=DIMS, fragment_shape=(4, 2, 6),
                         coords={"time": np.arange(10.0)}, region={"time": slice(4, 8)}, format=fmt)
    new = make_truth((3, 4, 6), "f4", seed=4)
    daskcfa.to_cfa(new, url, mode="r+", region={"time": slice(2, 5)})
    got = daskcfa.from_cfa(url).compute()
    assert got[:2].mask.all() and got[8:].mask.all()
    assert_matches(got[2:5], new)
    assert_matches(got[5:8], x[5:8])


@pytest.mark.parametrize("region, message", [
    ({"time": slice(2, 70)}, "beyond the dimension"),
    ({"time": slice(-11, 3)}, "beyond the dimension"),
    ({"time": slice(5, 5)}, "is empty"),
    ({"time": slice(0, 8, 2)}, "step 1"),
    ({"time": slice(0.5, 3)}, "integers"),
    ({"time": slice(1, 4)}, "shape"),
])
def test_bad_regions_are_refused(tmp_path, region, message):
    url, x = start(tmp_path / "t.nc")
    with pytest.raises(daskcfa.ArgumentError, match=message):
        daskcfa.to_cfa(np.ones((2, 4, 6), "f4"), url, mode="r+", region=region)
    assert_matches(daskcfa.from_cfa(url).compute(), x)


def test_a_failed_update_leaves_the_previous_state(tmp_path):
    url, x = start(tmp_path / "t.nc")

    def block(b, block_info=None):
        if block_info[0]["array-location"][0][0] >= 2:
            raise RuntimeError("sensor offline")
        return b

    new = make_truth((5, 4, 6), "f4", seed=5)
    failing = da.from_array(new, chunks=(2, 4, 6)).map_blocks(block, dtype=new.dtype)
    with pytest.raises(RuntimeError, match="sensor offline"):
        daskcfa.to_cfa(failing, url, mode="r+", region={"time": slice(2, 7)})
    assert_matches(daskcfa.from_cfa(url).compute(), x)
    daskcfa.to_cfa(new, url, mode="r+", region={"time": slice(2, 7)})
    expected = x.copy()
    expected[2:7] = new
    assert_matches(daskcfa.from_cfa(url).compute(), expected)


def test_unaligned_update_on_s3(s3_server, s3_bucket):
    options = s3_server.storage_options
    url, x = start(f"s3://{s3_bucket}/u/t.nc", fmt="CFA-0.5", storage_options=options)
    new = make_truth((3, 3, 6), "f4", masked=0.3, seed=6)
    daskcfa.to_cfa(da.from_array(new, chunks=(1, 3, 6)), url, mode="r+", region={"time": slice(3, 6),
                                                                                   "lat": slice(1, 4)},
                   storage_options=options)
    expected = x.copy()
    expected[3:6, 1:4] = new
    assert_matches(daskcfa.from_cfa(url, storage_options=options).compute(), expected)
