"""Growing an aggregation with ``to_cfa(mode="a")`` (issue 16 item 2), as ``to_zarr`` grows a store.

Real files on local disk and on the S3 test server, read back with
``from_cfa``, ``open_cfa`` and xarray's daskcfa backend, against numpy ground
truth built by concatenating what was written.
"""

from __future__ import annotations

import json
from pathlib import Path

import dask.array as da
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, make_truth
from daskcfa.formats.encode import WRITE_FORMATS

DIMS = ("time", "lat", "lon")
TIME = {"units": "days since 2000-01-01", "axis": "T", "standard_name": "time"}


def start(url, *, steps=7, fmt="CF-1.13", seed=1, **kw):
    """A first aggregation of ``steps`` times in fragments of 3 along time (a ragged last one)."""
    x = make_truth((steps, 4, 6), "f4", masked=0.1, seed=seed)
    kw = {"variable": "tas", "dims": DIMS, "attrs": {"units": "K"}, "coords": {"time": (np.arange(float(steps)), TIME)},
          "fragment_shape": (3, 2, 6), "format": fmt, **kw}
    return daskcfa.to_cfa(x, str(url), **kw), x


def append(url, x, t0, **kw):
    times = np.arange(t0, t0 + len(x), dtype=float)
    return daskcfa.to_cfa(x, url, mode="a", append_dim="time", coords={"time": times}, **kw)


def check(url, expected, storage_options=None):
    assert_matches(daskcfa.from_cfa(url, storage_options=storage_options).compute(), expected)
    with daskcfa.open_cfa(url, storage_options=storage_options) as ds:
        np.testing.assert_array_equal(ds["time"][...], np.arange(len(expected)))
        assert ds.dimensions["time"].size == len(expected)


@pytest.mark.parametrize("fmt", WRITE_FORMATS)
def test_append_once_and_several_times_in_each_dialect(tmp_path, fmt):
    url, x = start(tmp_path / "t.nc", fmt=fmt)
    parts, t = [x], len(x)
    for n in (1, 5, 3):
        new = make_truth((n, 4, 6), "f4", masked=0.2, seed=10 + n)
        append(url, new, t)
        parts.append(new)
        t += n
    expected = np.ma.concatenate(parts)
    check(url, expected)
    with daskcfa.open_cfa(url) as ds:  # the file keeps its dialect; new fragments have the existing length
        assert ds["tas"].aggregation.dialect == {"CFA-0.6.2": "CFA-0.6"}.get(fmt, fmt)
        assert ds["tas"].fragments.grid.sizes == ((3, 3, 1, 1, 3, 2, 3), (2, 2), (6,))
    xr = pytest.importorskip("xarray")
    with xr.open_dataset(url, engine="daskcfa") as back:
        assert_matches(np.ma.masked_invalid(back["tas"].values), expected)
        assert str(back["time"].values[-1]).startswith("2000-01-16")


def test_existing_fragments_are_kept_and_referenced_unchanged(tmp_path):
    url, x = start(tmp_path / "t.nc")
    before = {p.relative_to(tmp_path): p.stat().st_ino for p in tmp_path.glob("t/g-*/*.nc")}
    new = make_truth((4, 4, 6), "f4", seed=3)
    append(url, new, 7)
    after = {p.relative_to(tmp_path): p.stat().st_ino for p in tmp_path.glob("t/g-*/*.nc")}
    assert after.items() >= before.items() and len(after) == len(before) + 4
    with netCDF4.Dataset(url) as nc:
        uris = list(nc["tas_uris"][...].ravel())
    assert {str(p) for p in before} <= {str(Path("t.nc").parent / u) for u in uris}  # relative, unchanged
    manifest = json.loads((tmp_path / "t" / ".daskcfa" / "manifest.json").read_text())
    assert len(manifest["fragments"]["/tas"]) == len(after)
    check(url, np.ma.concatenate([x, new]))


def test_append_many_times_one_step_each(tmp_path):
    url, x = start(tmp_path / "t.nc", steps=3, fmt="CFA-0.5")
    parts = [x]
    for t in range(3, 23):
        step = make_truth((1, 4, 6), "f4", masked=0.3, seed=t)
        append(url, step, t)
        parts.append(step)
    check(url, np.ma.concatenate(parts))
    with daskcfa.open_cfa(url) as ds:
        assert ds["tas"].fragments.grid.sizes[0] == (3,) + (1,) * 20
    assert len(list((tmp_path / "t").glob("g-*"))) == 21  # one generation per append, nothing retired


def test_fragment_length_along_the_dimension_can_be_chosen(tmp_path):
    url, x = start(tmp_path / "t.nc")
    new = da.from_array(make_truth((7, 4, 6), "f4", seed=4), chunks=(2, 4, 6))
    append(url, new, 7, fragment_shape={"time": 4})
    with daskcfa.open_cfa(url) as ds:
        assert ds["tas"].fragments.grid.sizes[0] == (3, 3, 1, 4, 3)
    check(url, np.ma.concatenate([x, new.compute()]))


def test_append_to_nothing_creates_the_aggregation(tmp_path):
    x = make_truth((2, 4, 6), "f4", seed=5)
    url = append(str(tmp_path / "new.nc"), x, 0, variable="tas", dims=DIMS)
    check(url, x)


def test_xarray_dataset_with_bounds_and_packing(tmp_path):
    xr = pytest.importorskip("xarray")

    def dataset(t0, n, seed):
        times = np.datetime64("2000-01-01") + np.arange(t0, t0 + n).astype("timedelta64[D]")
        values = make_truth((n, 4, 6), "f8", seed=seed, masked=0.2).filled(np.nan)
        bounds = np.stack([times, times + np.timedelta64(1, "D")], axis=-1)
        ds = xr.Dataset({"tas": (DIMS, values), "time_bnds": (("time", "nv"), bounds)},
                        coords={"time": times, "lat": np.arange(4.0), "lon": np.arange(6.0)})
        ds["time"].attrs["bounds"] = "time_bnds"
        return ds

    first = dataset(0, 5, 1)
    first["tas"].encoding = {"dtype": "i2", "scale_factor": 0.01, "add_offset": 250.0, "_FillValue": -32767}
    first["time"].encoding = {"units": "hours since 1990-01-01", "dtype": "i4"}
    url = daskcfa.to_cfa(first, str(tmp_path / "x.nc"), fragment_shape={"time": 2})
    second = dataset(5, 4, 2)
    daskcfa.to_cfa(second, url, mode="a", append_dim="time")
    with xr.open_dataset(url, engine="daskcfa") as back:
        expected = xr.concat([first, second], dim="time")
        np.testing.assert_allclose(back["tas"].values, expected["tas"].values, atol=0.006)
        np.testing.assert_array_equal(back["time"].values, expected["time"].values)
        np.testing.assert_array_equal(back["time_bnds"].values, expected["time_bnds"].values)
    with netCDF4.Dataset(url) as nc:  # stored in the file's own encoding
        assert nc["time"].units == "hours since 1990-01-01" and nc["time"].dtype == np.int32
    with pytest.raises(daskcfa.ArgumentError, match="missing: /time_bnds"):
        daskcfa.to_cfa(dataset(9, 1, 3).drop_vars("time_bnds"), url, mode="a", append_dim="time")


def test_daskcfa_dataset_appended(tmp_path):
    url, x = start(tmp_path / "t.nc")
    other, y = start(tmp_path / "more.nc", steps=4, seed=8, coords={"time": (np.arange(7.0, 11.0), TIME)})
    with daskcfa.open_cfa(other) as ds:
        daskcfa.to_cfa(ds, url, mode="a", append_dim="time")
    check(url, np.ma.concatenate([x, y]))


@pytest.mark.parametrize("kwargs, message", [
    ({"data": np.ones((2, 4, 6), "i4")}, None),  # integers into a float variable: fine
    ({"data": np.array([["a"] * 6] * 4 * 2).reshape(2, 4, 6)}, "cannot take"),
    ({"dims": ("time", "lon", "lat")}, "dimensions"),
    ({"data": np.ones((2, 3, 6), "f4")}, "only 'time' may differ"),
    ({"attrs": {"units": "degC"}}, "units 'degC' differs"),
    ({"append_dim": "level"}, "not a dimension"),
    ({"coords": {}}, "missing: /time"),
    ({"variable": "pr"}, "not an aggregated variable along"),
    ({"coords": {"time": np.arange(3.0)}}, "differ in length"),
    ({"region": {"time": slice(0, 2)}}, "region="),
    ({"mode": "r+"}, "needs mode='a'"),
])
def test_bad_appends_are_refused_and_change_nothing(tmp_path, kwargs, message):
    url, x = start(tmp_path / "t.nc")
    kw = {"data": np.ones((2, 4, 6), "f4"), "mode": "a", "append_dim": "time", "coords": {"time": np.arange(7.0, 9.0)},
          **kwargs}
    before = Path(url).read_bytes()
    if message is None:
        daskcfa.to_cfa(kw.pop("data"), url, **kw)
        return
    with pytest.raises(daskcfa.ArgumentError, match=message) as info:
        daskcfa.to_cfa(kw.pop("data"), url, **kw)
    if not {"region", "mode"} & set(kwargs):  # errors about the data name the file or the variable
        assert "/tas" in str(info.value) or "t.nc" in str(info.value)
    assert Path(url).read_bytes() == before


def test_every_aggregated_variable_along_the_dimension_is_needed(tmp_path):
    x = make_truth((4, 4, 6), "f4", seed=1)
    ds = daskcfa.open_cfa(start(tmp_path / "a.nc", steps=4)[0])
    url = daskcfa.to_cfa(ds, str(tmp_path / "two.nc"))
    daskcfa.to_cfa(x, url, mode="a", variable="pr", dims=DIMS)  # a second variable along time
    with pytest.raises(daskcfa.ArgumentError, match="choose the variable"):
        append(url, x, 4)
    with pytest.raises(daskcfa.ArgumentError, match="missing: /pr"):
        append(url, x, 4, variable="tas")
    with pytest.raises(daskcfa.ArgumentError, match="already in the aggregation file"):
        daskcfa.to_cfa(x, url, mode="a", variable="pr", dims=DIMS)
    with daskcfa.open_cfa(url) as both:
        assert_matches(both["pr"][...], x)
        assert sorted(both.aggregated_variables) == ["/pr", "/tas"]


def test_a_failed_append_leaves_the_previous_state(tmp_path):
    url, x = start(tmp_path / "t.nc")
    new = make_truth((6, 4, 6), "f4", seed=9)

    def block(b, block_info=None):
        if block_info[0]["array-location"][0][0] >= 3:
            raise RuntimeError("sensor offline")
        return b

    failing = da.from_array(new, chunks=(3, 4, 6)).map_blocks(block, dtype=new.dtype)
    with pytest.raises(RuntimeError, match="sensor offline"):
        append(url, failing, 7)
    check(url, x)
    assert not list(tmp_path.glob(".t.nc.lease"))  # released
    append(url, new, 7)
    check(url, np.ma.concatenate([x, new]))


def test_append_on_s3(tmp_path, s3_server, s3_bucket):
    options = s3_server.storage_options
    url, x = start(f"s3://{s3_bucket}/run/t.nc", fmt="CFA-0.6.2", storage_options=options)
    parts, t = [x], 7
    for n in (2, 4):
        new = make_truth((n, 4, 6), "f4", masked=0.2, seed=n)
        append(url, new, t, storage_options=options)
        parts.append(new)
        t += n
    check(url, np.ma.concatenate(parts), storage_options=options)


def test_append_steps_with_a_datetime_time_coordinate(tmp_path):
    """The to_zarr(append_dim=...) workflow with a datetime64 time coordinate, as xarray users write it:
    xarray writes ``days since 2000-01-01 00:00:00`` and, given those units, encodes the next piece as
    ``days since 2000-01-01`` (before: refused, the units compared as text). Units that differ in meaning
    are still refused."""
    import pandas as pd
    import xarray as xr

    url = str(tmp_path / "a.nc")
    times = pd.date_range("2000-01-01", periods=29, freq="MS")
    rng = np.random.default_rng(28)

    def piece(a, b):
        return xr.Dataset({"tas": (("time", "lat"), rng.random((b - a, 3)).astype("f4")),
                           "pr": (("time", "lat"), rng.random((b - a, 3)))},
                          coords={"time": times[a:b], "lat": [10.0, 20.0, 30.0]})

    pieces = [piece(0, 12), piece(12, 24), piece(24, 29)]
    daskcfa.to_cfa(pieces[0], url)
    for p in pieces[1:]:
        daskcfa.to_cfa(p, url, mode="a", append_dim="time")
    with xr.open_dataset(url, engine="daskcfa") as back:
        xr.testing.assert_identical(back.load().drop_attrs(), xr.concat(pieces, "time").drop_attrs())
    odd = xr.Dataset({k: (("time", "lat"), np.zeros((1, 3), v.dtype)) for k, v in pieces[0].data_vars.items()},
                     coords={"time": np.array([1], "i8"), "lat": [10.0, 20.0, 30.0]})
    odd["time"].attrs["units"] = "hours since 2000-01-01"
    with pytest.raises(daskcfa.ArgumentError, match="/time: the data's units 'hours since 2000-01-01' differs"):
        daskcfa.to_cfa(odd, url, mode="a", append_dim="time")


@pytest.mark.parametrize("dtype", ["f4", "f8"])
@pytest.mark.parametrize("with_coords", [False, True])
@pytest.mark.parametrize("no_fill_on_piece", [False, True])
def test_append_to_an_xarray_written_archive_with_nan_fill_values(tmp_path, dtype, with_coords, no_fill_on_piece):
    """xarray writes ``_FillValue = NaN`` for floats: appending the next step (to_zarr's
    workflow) must not refuse it because NaN != NaN (issue 28 item 1)."""
    import xarray as xr

    url = str(tmp_path / "a.nc")
    first = np.arange(12, dtype=dtype).reshape(4, 3)
    first[1, 1] = np.nan
    coords = (lambda t: {"t": np.arange(t, t + 4 if t == 0 else t + 2, dtype=float)}) if with_coords else (lambda t: {})
    daskcfa.to_cfa(xr.Dataset({"a": (("t", "y"), first)}, coords=coords(0)), url)
    nxt = xr.Dataset({"a": (("t", "y"), np.full((2, 3), 7, dtype))}, coords=coords(4))
    if no_fill_on_piece:
        nxt["a"].encoding["_FillValue"] = None
    daskcfa.to_cfa(nxt, url, mode="a", append_dim="t")
    with xr.open_dataset(url, engine="daskcfa") as back:
        expected = np.concatenate([first, np.full((2, 3), 7, dtype)])
        np.testing.assert_array_equal(back["a"].values, expected)
        assert back["a"].dtype == np.dtype(dtype)
        if with_coords:
            np.testing.assert_array_equal(back["t"].values, np.arange(6.0))
