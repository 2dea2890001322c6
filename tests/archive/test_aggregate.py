"""``daskcfa.aggregate`` and ``scan``: aggregation files over existing netCDF files.

Real files written with netCDF4-python from numpy ground truth; the
aggregation is read back with ``from_cfa``/``open_cfa`` (and cfdm), and bad
inputs must be refused with an error naming the files.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path

import cftime
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_editable_by_netcdf_c, assert_matches
from daskcfa.archive.aggregate import scan
from daskcfa.errors import AggregationError

pytestmark = pytest.mark.usefixtures("other_cwd")

LAT = np.array([-45.0, 0.0, 45.0])
LON = np.array([0.0, 90.0, 180.0, 270.0])
#: time units by file number: reference dates and units differ between files
UNITS = ("days since 1850-01-01", "days since 1900-01-01", "hours since 1870-01-01")
COMMON = UNITS[0]  # the earliest file's


def write_file(path: Path, data, *, time=None, time_units=COMMON, calendar="standard", lat=LAT, lon=LON,
               name="tas", units="K", dtype="f4", fill=None, packing=None, extra=None, attrs=None, bounds=True):
    """One CF file: (time,) lat, lon coordinates (with bounds), one data variable, optional extras."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.setncatts({"title": "test", "history": f"written as {path.name}", **(attrs or {})})
        dims = ("lat", "lon")
        if time is not None:
            ds.createDimension("time", None)
            dims = ("time",) + dims
            t = ds.createVariable("time", "f8", ("time",))
            t.setncatts({"units": time_units, "calendar": calendar, "standard_name": "time", "axis": "T"})
            t[:] = time
            if bounds:
                ds.createDimension("nv", 2)
                t.bounds = "time_bnds"
                b = ds.createVariable("time_bnds", "f8", ("time", "nv"))
                b[:] = np.stack([np.asarray(time) - 0.5, np.asarray(time) + 0.5], axis=-1)
        ds.createDimension("lat", len(lat))
        ds.createDimension("lon", len(lon))
        y = ds.createVariable("lat", "f8", ("lat",))
        y[:], y.units, y.standard_name = lat, "degrees_north", "latitude"
        x = ds.createVariable("lon", "f8", ("lon",))
        x[:], x.units, x.standard_name = lon, "degrees_east", "longitude"
        if packing is not None:
            v = ds.createVariable(name, "i2", dims, fill_value=np.int16(fill if fill is not None else -32767))
            v.scale_factor, v.add_offset = packing
        else:
            v = ds.createVariable(name, dtype, dims, fill_value=fill)
        v.units, v.standard_name = units, "air_temperature"
        v[...] = data
        for var_name, (var_dims, values) in (extra or {}).items():
            ds.createVariable(var_name, np.asarray(values).dtype, var_dims)[...] = values
    return path


def dates_of(k: int, steps: int = 5) -> list:
    """File k holds ``steps`` mid-year dates starting in 1850 + 5k (five-year files)."""
    return [cftime.DatetimeGregorian(1850 + steps * k + j, 7, 1, 12) for j in range(steps)]


def cmip_like(directory: Path, n: int, *, seed: int = 0, steps: int = 5):
    """``n`` five-year files with time units cycling through UNITS; truth and common-unit times."""
    rng = np.random.default_rng(seed)
    truth = rng.uniform(200, 320, size=(n * steps, len(LAT), len(LON))).astype("f4")
    paths = []
    for k in range(n):
        units = UNITS[k % len(UNITS)]
        time = cftime.date2num(dates_of(k, steps), units, "standard")
        paths.append(write_file(directory / f"tas_{k:03d}.nc", truth[k * steps:(k + 1) * steps], time=time,
                                time_units=units))
    times = np.concatenate([cftime.date2num(dates_of(k, steps), COMMON, "standard") for k in range(n)])
    return truth, times, paths


# ---------------------------------------------------------------------------
# Concatenation along time
# ---------------------------------------------------------------------------


def test_120_files_with_different_time_units(tmp_path):
    truth, times, paths = cmip_like(tmp_path / "cmip", 120)
    shuffled = [str(p) for p in paths]
    random.Random(1).shuffle(shuffled)  # the order comes from the time values, not the listing
    url = daskcfa.aggregate(shuffled, str(tmp_path / "tas.nc"))

    assert_matches(daskcfa.from_cfa(url).compute(), truth)
    with daskcfa.open_cfa(url) as ds:
        tas = ds["tas"]
        assert tas.fragments.shape == (120, 1, 1)
        assert tas.attrs["units"] == "K"
        assert ds["time"].attrs["units"] == COMMON and ds["time"].attrs["calendar"] == "standard"
        np.testing.assert_allclose(np.asarray(ds["time"][...]), times, rtol=0, atol=1e-9)
        np.testing.assert_allclose(np.asarray(ds["time_bnds"][...]), _bounds_truth(times), atol=1e-9)
        np.testing.assert_array_equal(np.asarray(ds["lat"][...]), LAT)
        assert not ds["time"].is_aggregated and not ds["lat"].is_aggregated
        assert ds.attrs.get("title") == "test" and "history" not in ds.attrs  # differs per file: dropped
    # fragment URIs are relative to the aggregation file
    uris = daskcfa.read_aggregation(url).fragments.uris.ravel()
    assert list(uris) == [f"cmip/tas_{k:03d}.nc" for k in range(120)]


def _bounds_truth(times: np.ndarray) -> np.ndarray:
    """time_bnds written as time -/+ 0.5 in each file's own units, expressed in the common units."""
    out = []
    for k in range(len(times) // 5):
        units = UNITS[k % len(UNITS)]
        own = cftime.date2num(dates_of(k), units, "standard")
        for edge in (-0.5, 0.5):
            dates = cftime.num2date(own + edge, units, "standard")
            out.append(cftime.date2num(dates, COMMON, "standard"))
    pairs = np.asarray(out).reshape(len(times) // 5, 2, 5)
    return np.concatenate([p.T for p in pairs])


def test_earliest_file_sets_the_units_even_when_listed_last(tmp_path, caplog):
    truth, _, paths = cmip_like(tmp_path, 4)
    os.rename(paths[0], tmp_path / "zz_first_in_time.nc")  # listed last by name, earliest by time
    caplog.set_level(logging.INFO, logger="daskcfa")
    url = daskcfa.aggregate(str(tmp_path / "*.nc"), str(tmp_path / "out" / "agg.nc"))
    assert [r.getMessage() for r in caplog.records if r.name == "daskcfa.storage.publish"] == [
        f"committed aggregation file {url} (4 fragments referenced; {os.path.getsize(url)} bytes, mode 'w-')"]
    with daskcfa.open_cfa(url) as ds:
        assert ds["time"].attrs["units"] == COMMON
        assert_matches(ds["tas"][...], truth)
    assert daskcfa.read_aggregation(url).fragments[(0, 0, 0)].uris == ("../zz_first_in_time.nc",)


def test_hours_file_first_in_time_gives_hours(tmp_path):
    """Common units are those of the earliest file, whatever they are."""
    rng = np.random.default_rng(3)
    data = rng.random((4, 3, 4)).astype("f4")
    write_file(tmp_path / "b.nc", data[2:], time=[3.0, 4.0], time_units="days since 1999-12-31")
    write_file(tmp_path / "a.nc", data[:2], time=[0.0, 24.0], time_units="hours since 2000-01-01")
    url = daskcfa.aggregate([str(tmp_path / "b.nc"), str(tmp_path / "a.nc")], str(tmp_path / "agg.nc"))
    with daskcfa.open_cfa(url) as ds:
        assert ds["time"].attrs["units"] == "hours since 2000-01-01"
        # b.nc: days 3, 4 since 1999-12-31 = hours 48, 72 since 2000-01-01
        np.testing.assert_allclose(np.asarray(ds["time"][...]), [0.0, 24.0, 48.0, 72.0])
        assert_matches(ds["tas"][...], data)


def test_variables_without_the_concat_dimension_are_copied(tmp_path):
    rng = np.random.default_rng(4)
    data = rng.random((6, 3, 4)).astype("f4")
    orog = rng.random((3, 4))
    for k in range(3):
        write_file(tmp_path / f"f{k}.nc", data[2 * k:2 * k + 2], time=[2.0 * k, 2.0 * k + 1],
                   extra={"orog": (("lat", "lon"), orog), "height": ((), np.float64(2.0))})
    url = daskcfa.aggregate(str(tmp_path / "f*.nc"), str(tmp_path / "agg.nc"))
    with daskcfa.open_cfa(url) as ds:
        assert ds["tas"].is_aggregated and not ds["orog"].is_aggregated
        np.testing.assert_array_equal(np.asarray(ds["orog"][...]), orog)
        assert float(ds["height"][...]) == 2.0
        assert_matches(ds["tas"][...], data)


def test_variables_selects_and_keeps_coordinates(tmp_path):
    rng = np.random.default_rng(5)
    tas, pr = rng.random((2, 4, 3, 4)).astype("f4")
    for k in range(2):
        write_file(tmp_path / f"f{k}.nc", tas[2 * k:2 * k + 2], time=[2.0 * k, 2.0 * k + 1],
                   extra={"pr": (("time", "lat", "lon"), pr[2 * k:2 * k + 2])})
    model = scan(str(tmp_path), variables=["pr"])
    assert [a.name for a in model.aggregated] == ["/pr"]
    assert {v.name for v in model.variables} == {"/time", "/time_bnds", "/lat", "/lon"}
    url = daskcfa.aggregate(str(tmp_path), str(tmp_path / "out.nc"), variables=["pr"])
    assert_matches(daskcfa.from_cfa(url).compute(), pr)


def test_no_time_coordinate_orders_files_as_listed(tmp_path):
    """A concatenation dimension without coordinates: files in the order given."""
    data = np.arange(5 * 3 * 4, dtype="f4").reshape(5, 3, 4)
    for k, (a, b) in enumerate([(0, 2), (2, 3), (3, 5)]):
        with netCDF4.Dataset(str(tmp_path / f"p{k}.nc"), "w") as ds:
            ds.createDimension("step", b - a)
            ds.createDimension("y", 3)
            ds.createDimension("x", 4)
            ds.createVariable("v", "f4", ("step", "y", "x"))[:] = data[a:b]
    url = daskcfa.aggregate(str(tmp_path / "p*.nc"), str(tmp_path / "agg.nc"), concat_dims=["step"])
    assert_matches(daskcfa.from_cfa(url).compute(), data)
    assert daskcfa.read_aggregation(url).fragments.grid.sizes == ((2, 1, 2), (3,), (4,))


def test_one_file(tmp_path):
    data = np.random.default_rng(6).random((3, 3, 4)).astype("f4")
    write_file(tmp_path / "one.nc", data, time=[0.0, 1.0, 2.0])
    url = daskcfa.aggregate(str(tmp_path / "one.nc"), str(tmp_path / "agg.nc"))
    x = daskcfa.from_cfa(url)
    assert x.numblocks == (1, 1, 1)
    assert_matches(x.compute(), data)


# ---------------------------------------------------------------------------
# Two-dimensional tiling
# ---------------------------------------------------------------------------


def test_lat_lon_tiles_out_of_order(tmp_path):
    rng = np.random.default_rng(7)
    lat = np.linspace(80.0, -80.0, 9)  # decreasing, as many grids are
    lon = np.arange(12) * 30.0
    truth = rng.random((2, 9, 12)).astype("f4")
    lat_cuts, lon_cuts = [0, 4, 9], [0, 3, 7, 12]
    paths = []
    for i in range(2):
        for j in range(3):
            ys, xs = slice(lat_cuts[i], lat_cuts[i + 1]), slice(lon_cuts[j], lon_cuts[j + 1])
            paths.append(str(write_file(tmp_path / "tiles" / f"tile_{i}{j}.nc", truth[:, ys, xs], time=[10.0, 11.0],
                                        lat=lat[ys], lon=lon[xs])))
    random.Random(2).shuffle(paths)
    url = daskcfa.aggregate(paths, str(tmp_path / "grid.nc"))
    with daskcfa.open_cfa(url) as ds:
        assert ds["tas"].fragments.shape == (1, 2, 3)
        assert ds["tas"].fragments.grid.sizes == ((2,), (4, 5), (3, 4, 5))
        np.testing.assert_array_equal(np.asarray(ds["lat"][...]), lat)
        np.testing.assert_array_equal(np.asarray(ds["lon"][...]), lon)
        assert_matches(ds["tas"][...], truth)
        assert_matches(ds["tas"][:, 3:6, 2:9], truth[:, 3:6, 2:9])


# ---------------------------------------------------------------------------
# Packing and fill values differing per file
# ---------------------------------------------------------------------------


def test_packed_and_differently_filled_files(tmp_path):
    rng = np.random.default_rng(8)
    truth = np.ma.MaskedArray(np.round(rng.uniform(200, 300, size=(6, 3, 4)), 1), mask=rng.random((6, 3, 4)) < 0.2)
    write_file(tmp_path / "a.nc", truth[:2], time=[0.0, 1.0], packing=(0.01, 250.0), fill=-999)
    write_file(tmp_path / "b.nc", truth[2:4], time=[2.0, 3.0], packing=(0.1, 0.0))
    write_file(tmp_path / "c.nc", truth[4:], time=[4.0, 5.0], dtype="f8", fill=1e20)
    url = daskcfa.aggregate(str(tmp_path / "*.nc"), str(tmp_path / "agg" / "agg.nc"))
    av = daskcfa.read_aggregation(url)
    assert av.dtype == np.float64 and "scale_factor" not in av.attrs
    assert_matches(daskcfa.from_cfa(url).compute(), truth, rtol=1e-6)
    # netCDF4-python's own view of each file agrees with the aggregation's
    with netCDF4.Dataset(str(tmp_path / "b.nc")) as ds:
        assert_matches(daskcfa.from_cfa(url)[2:4].compute(), ds["tas"][...])


def test_same_fill_everywhere_is_kept(tmp_path):
    rng = np.random.default_rng(9)
    truth = np.ma.MaskedArray(rng.random((4, 3, 4)).astype("f4"), mask=rng.random((4, 3, 4)) < 0.3)
    for k in range(2):
        write_file(tmp_path / f"f{k}.nc", truth[2 * k:2 * k + 2], time=[2.0 * k, 2.0 * k + 1], fill=np.float32(-1))
    url = daskcfa.aggregate(str(tmp_path / "*.nc"), str(tmp_path / "agg.nc"))
    av = daskcfa.read_aggregation(url)
    assert av.dtype == np.float32 and av.attrs["_FillValue"] == -1
    assert_matches(daskcfa.from_cfa(url).compute(), truth)


# ---------------------------------------------------------------------------
# Inconsistent inputs are refused, naming the files
# ---------------------------------------------------------------------------


def _series(directory: Path, n: int = 4, **per_file):
    """n two-step files along time; ``per_file[k]`` overrides write_file keywords for file k."""
    rng = np.random.default_rng(10)
    paths = []
    for k in range(n):
        kw = {"time": [2.0 * k, 2.0 * k + 1], **per_file.get(f"f{k}", {})}
        paths.append(write_file(directory / f"f{k}.nc", rng.random((2, 3, 4)).astype("f4"), **kw))
    return paths


@pytest.mark.parametrize("change, words", [
    ({"f2": {"lat": LAT + 1.0}}, ["lat", "f2.nc"]),
    ({"f1": {"time": [1.0, 2.0]}}, ["overlap", "time", "f1.nc"]),
    ({"f3": {"time": [9.0, 10.0]}}, ["gap", "time", "f3.nc"]),
    ({"f2": {"units": "m"}}, ["units", "tas", "f2.nc"]),
    ({"f1": {"name": "pr"}}, ["missing", "f1.nc"]),
    ({"f1": {"calendar": "noleap"}}, ["calendar", "f1.nc"]),
    ({"f2": {"time": [2.0, 3.0]}}, ["f1.nc", "f2.nc"]),  # a duplicate of f1
])
def test_inconsistent_inputs_are_refused(tmp_path, change, words):
    _series(tmp_path / "in", **change)
    target = tmp_path / "agg.nc"
    with pytest.raises(AggregationError) as info:
        daskcfa.aggregate(str(tmp_path / "in"), str(target))
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert not target.exists() and not list(tmp_path.glob(".agg.nc*"))


def test_incomplete_tiling_is_refused(tmp_path):
    lat, lon = np.arange(4.0), np.arange(6.0)
    data = np.zeros((1, 2, 3), "f4")
    for i, j in [(0, 0), (0, 1), (1, 0)]:  # (1, 1) is missing
        write_file(tmp_path / f"t{i}{j}.nc", data, time=[0.0], lat=lat[2 * i:2 * i + 2], lon=lon[3 * j:3 * j + 3])
    with pytest.raises(AggregationError, match="do not tile") as info:
        daskcfa.aggregate(str(tmp_path / "t*.nc"), str(tmp_path / "agg.nc"))
    assert "t01.nc" in str(info.value) or "t10.nc" in str(info.value)


def test_differing_copied_variable_is_refused(tmp_path):
    paths = _series(tmp_path, 3)
    with netCDF4.Dataset(str(paths[1]), "a") as ds:
        ds.createVariable("orog", "f8", ("lat", "lon"))[:] = 1.0
    for p in (paths[0], paths[2]):
        with netCDF4.Dataset(str(p), "a") as ds:
            ds.createVariable("orog", "f8", ("lat", "lon"))[:] = 0.0
    with pytest.raises(AggregationError, match="orog") as info:
        daskcfa.aggregate(str(tmp_path), str(tmp_path / "agg.nc"))
    assert "f1.nc" in str(info.value) and "f2.nc" not in str(info.value).split("than in")[0]


def test_unreadable_file_is_named(tmp_path):
    _series(tmp_path, 2)
    (tmp_path / "broken.nc").write_bytes(b"not netCDF at all")
    with pytest.raises(AggregationError, match="broken.nc"):
        daskcfa.aggregate(str(tmp_path), str(tmp_path / "agg.nc"))


def test_identical_files_have_nothing_to_concatenate(tmp_path):
    _series(tmp_path / "a", 1)
    shutil.copy(tmp_path / "a" / "f0.nc", tmp_path / "a" / "g0.nc")
    with pytest.raises(AggregationError, match="f0.nc"):
        daskcfa.aggregate(str(tmp_path / "a"), str(tmp_path / "agg.nc"), concat_dims=["lat"])


# ---------------------------------------------------------------------------
# Writing: URIs, modes
# ---------------------------------------------------------------------------


def test_relative_uris_survive_a_move_absolute_uris_do_not_need_one(tmp_path):
    truth, _, _ = cmip_like(tmp_path / "tree" / "data", 3)
    rel = daskcfa.aggregate(str(tmp_path / "tree" / "data"), str(tmp_path / "tree" / "agg" / "rel.nc"))
    absolute = daskcfa.aggregate(str(tmp_path / "tree" / "data"), str(tmp_path / "abs.nc"), uris="absolute")
    assert daskcfa.read_aggregation(rel).fragments[(0, 0, 0)].uris == ("../data/tas_000.nc",)
    assert daskcfa.read_aggregation(absolute).fragments[(0, 0, 0)].uris[0].startswith("file:///")
    assert_matches(daskcfa.from_cfa(absolute).compute(), truth)
    os.rename(tmp_path / "tree", tmp_path / "moved")
    assert_matches(daskcfa.from_cfa(str(tmp_path / "moved" / "agg" / "rel.nc")).compute(), truth)


def test_modes(tmp_path):
    truth, _, _ = cmip_like(tmp_path / "d", 2)
    target = str(tmp_path / "agg.nc")
    daskcfa.aggregate(str(tmp_path / "d"), target)
    with pytest.raises(FileExistsError):
        daskcfa.aggregate(str(tmp_path / "d"), target)
    assert daskcfa.aggregate(str(tmp_path / "d"), target, mode="w", format="CFA-0.6.2") == target
    assert daskcfa.read_aggregation(target).dialect.startswith("CFA-0.6")
    assert_matches(daskcfa.from_cfa(target).compute(), truth)
    with pytest.raises(ValueError, match="mode"):
        daskcfa.aggregate(str(tmp_path / "d"), target, mode="r+")


# ---------------------------------------------------------------------------
# Schedulers, S3, interoperability
# ---------------------------------------------------------------------------


def test_scan_on_a_distributed_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    truth, times, _ = cmip_like(tmp_path / "d", 6)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        model = scan(str(tmp_path / "d"), scheduler=client)
    assert model.aggregated[0].fragments.shape == (6, 1, 1)
    time = next(v for v in model.variables if v.name == "/time")
    np.testing.assert_allclose(time.data, times, atol=1e-9)


def test_s3_sources_and_target(s3_server, s3_bucket, s3fs_fs, tmp_path):
    truth, times, paths = cmip_like(tmp_path, 5)
    for p in paths:
        s3fs_fs.put(str(p), f"{s3_bucket}/cmip/{p.name}")
    options = s3_server.storage_options
    url = daskcfa.aggregate(f"s3://{s3_bucket}/cmip/*.nc", f"s3://{s3_bucket}/agg/tas.nc", storage_options=options)
    assert url == f"s3://{s3_bucket}/agg/tas.nc"
    av = daskcfa.read_aggregation(url, storage_options=options)
    assert av.fragments[(0, 0, 0)].uris == ("../cmip/tas_000.nc",)
    assert_matches(daskcfa.from_cfa(url, storage_options=options).compute(), truth)
    with daskcfa.open_cfa(url, storage_options=options) as ds:
        np.testing.assert_allclose(np.asarray(ds["time"][...]), times, atol=1e-9)
    assert not [p for p in s3fs_fs.ls(f"{s3_bucket}/agg") if ".part" in p]


def test_cfdm_reads_the_aggregation(tmp_path, monkeypatch):
    cfdm = pytest.importorskip("cfdm", reason="cfdm (and its UDUNITS library) reads the aggregation file")
    truth, times, _ = cmip_like(tmp_path / "d", 4)
    url = daskcfa.aggregate(str(tmp_path / "d"), str(tmp_path / "agg.nc"))
    monkeypatch.chdir(tmp_path)  # cfdm resolves relative URIs against the working directory
    with netCDF4.Dataset(url) as ds:
        assert ds.Conventions.startswith("CF-1.13")
        assert ds["tas"].aggregated_dimensions == "time lat lon"
    (field,) = cfdm.read(url)
    np.testing.assert_allclose(np.asarray(field.array), truth, rtol=1e-6)
    t = field.construct("time")
    np.testing.assert_allclose(np.asarray(t.array), times, atol=1e-9)
    assert t.get_property("units") == COMMON


@pytest.mark.parametrize("format", ["CF-1.13", "CFA-0.6.2", "CFA-0.5", "CFA-0.4"])
def test_aggregation_file_is_editable_by_netcdf_c(tmp_path, format):
    # issue 13 item 12: netCDF-C could not open daskcfa's aggregation files for writing
    truth, _, paths = cmip_like(tmp_path / "in", 3)
    url = daskcfa.aggregate([str(p) for p in paths], str(tmp_path / "tas.nc"), format=format)
    assert_editable_by_netcdf_c(url)
    assert_matches(daskcfa.from_cfa(url, "tas").compute(), truth)
