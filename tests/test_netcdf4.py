"""daskcfa.netcdf4.Dataset: netCDF4-python's API (and S3netCDF4's extensions) writing and reading aggregations.

Every result is checked against numpy ground truth built here, read back with
netCDF4-python (plain files), with ``daskcfa.from_cfa`` and, where it can,
with S3netCDF4 itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tracemalloc

import netCDF4
import numpy as np
import pytest

import daskcfa
from daskcfa.netcdf4 import Dataset

AGGREGATIONS = [("CF-1.13", None), ("CFA-0.6.2", None), ("CFA4", None), ("CFA4", "0.4"), ("CFA3", "0.4")]
PLAIN = ["NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET"]


def field(shape, seed=0, masked=0.0):
    rng = np.random.default_rng(seed)
    values = rng.normal(280, 10, size=shape).astype("f4")
    return np.ma.MaskedArray(values, mask=rng.random(shape) < masked)


def same(got, expected):
    got, expected = np.ma.asarray(got), np.ma.asarray(expected)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))
    np.testing.assert_array_equal(np.ma.filled(got, 0), np.ma.filled(expected, 0))


def surface_dataset(ds, fmt, values):
    """An archive script's dataset: a group (netCDF-4 formats), coordinates with metadata, a field written
    one time step at a time, a scalar and a 1-D variable written at one point."""
    ds.history = f"daskcfa test, format {fmt}"
    group = ds.createGroup("surface") if fmt in ("NETCDF4", "CFA4", "CF-1.13", "CFA-0.6.2") else ds
    group.group_class = "Surface variables"
    ntime, nlat, nlon = values.shape
    for name, size, coords, attrs in [
        ("time", None, np.arange(ntime, dtype="f4"), {"units": "days since 2000-01-01", "axis": "T"}),
        ("latitude", nlat, np.linspace(90, -90, nlat, dtype="f4"), {"units": "degrees_north"}),
        ("longitude", nlon, np.arange(nlon, dtype="f4") * 360 / nlon, {"units": "degrees_east"}),
    ]:
        group.createDimension(name, size)
        var = group.createVariable(name, np.float32, (name,))
        var[:] = coords
        var.setncatts(attrs)
    tmp = group.createVariable("tmp", np.float32, ("time", "latitude", "longitude"), fill_value=2e20,
                               subarray_shape=np.array([4, nlat, nlon], dtype="i"))
    tmp.standard_name = "air_temperature"
    tmp.setncattr("long_name", "Surface temperature at 1m")
    for t in range(ntime):
        tmp[t] = values[t]
    ds.createVariable("scl", np.float32)
    ds.createDimension("vector", 16)
    vec = ds.createVariable("vector", np.int32, ("vector",))
    vec[:] = 12 + np.arange(16)
    velocity = ds.createVariable("velocity", np.float32, ("vector",))
    velocity.units = "m s-1"
    velocity[0] = 10.0
    return "/surface/tmp" if group is not ds else "/tmp"


@pytest.mark.parametrize("fmt,version", AGGREGATIONS + [(p, None) for p in PLAIN])
def test_archive_script_round_trip(tmp_path, fmt, version):
    values = field((10, 5, 8), masked=0.1)
    url = str(tmp_path / f"a_{fmt}.nc")
    with Dataset(url, "w", format=fmt, cfa_version=version) as ds:
        tmp_path_in = surface_dataset(ds, fmt, values)
    with netCDF4.Dataset(url) as nc:  # the file on disk is a netCDF file any tool opens
        assert nc.history == f"daskcfa test, format {fmt}"
    with Dataset(url) as ds:
        tmp = ds[tmp_path_in]
        same(tmp[:], values)
        same(tmp[:, 0, 0], values[:, 0, 0])
        assert tmp.long_name == "Surface temperature at 1m" and tmp.getncattr("standard_name") == "air_temperature"
        assert ds["velocity"][0] == 10.0 and np.ma.getmaskarray(ds["velocity"][1:]).all()
        same(ds["vector"][:], 12 + np.arange(16))
        assert ds.history == f"daskcfa test, format {fmt}"
        assert tmp.is_aggregated == (fmt not in PLAIN)
        if fmt not in PLAIN:
            assert tmp.fragments.shape == (3, 1, 1)
    if fmt not in PLAIN:
        same(daskcfa.from_cfa(url, tmp_path_in).compute(), values)


def test_plain_files_read_by_netcdf4_python(tmp_path):
    values = field((6, 3, 4), masked=0.2)
    url = str(tmp_path / "plain.nc")
    with Dataset(url, "w", format="NETCDF4") as ds:
        surface_dataset(ds, "NETCDF4", values)
        assert not os.path.exists(url)  # built under a temporary name, moved into place at close()
    with netCDF4.Dataset(url) as nc:
        same(nc["surface/tmp"][:], values)
        assert nc["surface"].group_class == "Surface variables"
        assert nc["surface/time"].units == "days since 2000-01-01"
    assert [p.name for p in tmp_path.iterdir()] == ["plain.nc"]


def test_metadata_example_without_data(tmp_path):
    """S3netCDF4's metadata example (CFA3, diskless=True): dimensions, variables, attributes, no data."""
    url = str(tmp_path / "meta_cfa3.nca")
    with Dataset(url, mode="w", diskless=True, format="CFA3") as ds:
        ds.createDimension("lat", 196)
        ds.createDimension("lon", 256)
        lat = ds.createVariable("lat", "f4", ("lat",))
        lon = ds.createVariable("lon", "f4", ("lon",))
        temp = ds.createVariable("tmp", "f4", ("lat", "lon"))
        ds.source = "tutorial"
        ds.units = "degrees C"
        lat.units = "degrees north"
        lon.units = "degrees east"
        temp.author = "someone"
    with Dataset(url) as ds:
        assert ds.source == "tutorial" and ds.getncattr("units") == "degrees C"
        assert ds["tmp"].author == "someone" and ds["lat"].ncattrs() == ["units"]
        assert ds["tmp"].shape == (196, 256)
        assert np.ma.getmaskarray(ds["tmp"][:]).all()  # never written: missing values
    # CFA-0.4 lists the fragments present and readers recover the grid from them: one is written
    assert len(list((tmp_path / "meta_cfa3").rglob("*.nc"))) == 1


@pytest.mark.parametrize("fmt,written", [("CF-1.13", 12), ("CFA-0.6.2", 0), ("CFA4", 4)])
def test_close_without_writing(tmp_path, fmt, written):
    """Fragments never assigned: written full of missing values (CF-1.13), recorded as missing (CFA-0.6.2),
    or, for CFA-0.5, as few written as let readers recover the grid (one per fragment row and column)."""
    url = str(tmp_path / "empty.nc")
    with Dataset(url, "w", format=fmt) as ds:
        ds.createDimension("x", 12)
        ds.createDimension("y", 12)
        ds.createVariable("v", "f8", ("x", "y"), subarray_shape=[3, 4])
    got = Dataset(url)["v"][:]
    assert got.shape == (12, 12) and np.ma.getmaskarray(got).all()
    assert len(list((tmp_path / "empty").rglob("*.nc"))) == written
    with Dataset(str(tmp_path / "nothing.nc"), "w", format=fmt):
        pass
    assert Dataset(str(tmp_path / "nothing.nc")).variables == {}


# --------------------------------------------------------------------------
# Assignments: netCDF4-python's index rules, overlapping and partial writes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("buffer_size", ["64MiB", 2000])
@pytest.mark.parametrize("fmt", ["CF-1.13", "CFA4"])
def test_assignments_equal_numpy(tmp_path, fmt, buffer_size):
    """Random overlapping assignments of every index kind, one fragment written and overwritten many
    times; with a tiny buffer, incomplete fragments are written early and read back when assigned again."""
    rng = np.random.default_rng(7)
    shape = (9, 7, 6)
    truth = np.ma.masked_all(shape, "f4")
    url = str(tmp_path / "v.nc")
    with Dataset(url, "w", format=fmt, buffer_size=buffer_size) as ds:
        for name, n in zip("tyx", shape):
            ds.createDimension(name, n)
        v = ds.createVariable("v", "f4", ("t", "y", "x"), fill_value=-1.0, subarray_shape=[4, 3, 6])
        keys = [
            (slice(None),), (0,), (-1, slice(2, 5)), (slice(1, 8, 3), [0, 2, 6]), (Ellipsis, 3),
            (np.array([True, False] * 4 + [True]), slice(None, None, 2), slice(1, 4)), (slice(2, 7), 1, -2),
            (4, Ellipsis), ([8, 3, 5], slice(None), [5, 0]),
        ]
        for step in range(40):
            key = keys[rng.integers(len(keys))]
            where, target = orthogonal(key, shape)
            values = np.ma.MaskedArray(rng.normal(size=target).astype("f4"), mask=rng.random(target) < 0.2)
            v[key] = values
            truth[where] = values.reshape([w.size for w in where])
    same(Dataset(url)["v"][:], truth)
    same(daskcfa.from_cfa(url).compute(), truth)


def orthogonal(key, shape):
    """netCDF4-python's (orthogonal) reading of ``key``, built with numpy alone: the np.ix_ index, and the
    shape of the selection (integer-indexed dimensions dropped)."""
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        at = [i for i, k in enumerate(key) if k is Ellipsis][0]
        key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1:]
    key = key + (slice(None),) * (len(shape) - len(key))
    where = [np.arange(n)[k].reshape(-1) for k, n in zip(key, shape)]
    target = tuple(len(w) for k, w in zip(key, where) if not isinstance(k, int))
    return np.ix_(*where), target


def test_scalar_broadcast_and_lenient_shapes(tmp_path):
    url = str(tmp_path / "b.nc")
    with Dataset(url, "w") as ds:
        ds.createDimension("t", 4)
        ds.createDimension("x", 5)
        v = ds.createVariable("v", "f8", ("t", "x"), subarray_shape=[2, 5])
        v[:, :] = 250.0  # a scalar over everything
        v[1] = np.arange(5.0).reshape(1, 5)  # netCDF4-python takes a size-1 leading dimension
        v[2:4, 0] = np.array([[7.0], [8.0]])
    expected = np.full((4, 5), 250.0)
    expected[1] = np.arange(5.0)
    expected[2:4, 0] = [7.0, 8.0]
    same(Dataset(url)["v"][:], expected)


def test_dask_values_and_packing(tmp_path):
    import dask.array as da

    url = str(tmp_path / "p.nc")
    values = np.linspace(0, 100, 60).reshape(6, 10)
    with Dataset(url, "w", format="CFA-0.6.2") as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 10)
        v = ds.createVariable("v", "i2", ("t", "x"), fill_value=-32768, subarray_shape=[4, 10])
        v.scale_factor = 0.01
        v.add_offset = 50.0
        v[0:6] = da.from_array(values, chunks=(3, 5))
    got = Dataset(url)["v"][:]
    np.testing.assert_allclose(got, values, atol=0.005)


def test_unlimited_growth_and_uneven_last_fragment(tmp_path):
    url = str(tmp_path / "g.nc")
    truth = field((23, 4, 3))
    with Dataset(url, "w", format="CF-1.13") as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", 4)
        ds.createDimension("x", 3)
        t = ds.createVariable("time", "f8", ("time",))
        v = ds.createVariable("v", "f4", ("time", "y", "x"), subarray_shape=[5, 4, 3])
        v[0:10] = truth[0:10]  # a slice past the end grows the dimension
        v[10:] = truth[10:]  # an open slice takes its length from the values
        t[:] = np.arange(23.0)
        assert len(ds.dimensions["time"]) == 23 and v.shape == (23, 4, 3)
    ds = Dataset(url)
    same(ds["v"][:], truth)
    assert ds["v"].fragments.grid.sizes[0] == (5, 5, 5, 5, 3)
    assert ds.dimensions["time"].size == 23


# --------------------------------------------------------------------------
# One time step at a time, memory bounded, on disk and S3
# --------------------------------------------------------------------------


NY, NX, PER_FRAGMENT = 100, 200, 16  # 80 kB a step, 1.28 MB a fragment: 1,000 steps are 80 MB
BUFFER = 2 * 2**20


def write_steps(url, fmt, steps, storage_options=None):
    with Dataset(url, "w", format=fmt, storage_options=storage_options, buffer_size=BUFFER) as ds:
        ds.createDimension("time", None)
        ds.createDimension("lat", NY)
        ds.createDimension("lon", NX)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "hours since 2000-01-01"
        tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), fill_value=1e20,
                                max_subarray_size=NY * NX * 4 * PER_FRAGMENT)
        for t in range(steps):
            time[t] = t
            tas[t] = step_values(t)


def step_values(t):
    return (np.arange(NY * NX, dtype="f4").reshape(NY, NX) + 1000 * t) % 997


def peak_while(write):
    """The most memory Python allocated while ``write`` ran (numpy's arrays included)."""
    tracemalloc.start()
    try:
        write()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def memory_bound(writers):
    """The buffers and the values handed to the writing threads (the budget each), and per writing
    thread a fragment encoded and written (a few copies of it), plus room for Python itself."""
    fragment = NY * NX * 4 * PER_FRAGMENT
    return 2 * BUFFER + (writers + 1) * 4 * fragment + 4 * 2**20


def check_steps(url, storage_options=None):
    with Dataset(url, storage_options=storage_options) as ds:
        got = ds["tas"]
        assert got.shape == (1000, NY, NX)
        assert len(got.fragments) == -(-1000 // PER_FRAGMENT)
        for t in (0, 1, 15, 16, 500, 999):
            same(got[t], step_values(t))
        same(ds["time"][:], np.arange(1000.0))
    x = daskcfa.from_cfa(url, "tas", storage_options=storage_options)
    same(x[::37].compute(), np.stack([step_values(t) for t in range(0, 1000, 37)]))


@pytest.mark.parametrize("fmt", ["CF-1.13", "CFA4"])
def test_thousand_steps_local_memory_bounded(tmp_path, fmt):
    url = str(tmp_path / "steps.nc")
    peak = peak_while(lambda: write_steps(url, fmt, 1000))
    assert peak < memory_bound(writers=2) < 80e6 / 2, peak  # far below the 80 MB written
    check_steps(url)


@pytest.mark.parametrize("fmt", ["CF-1.13", "CFA4"])
def test_thousand_steps_on_s3_memory_bounded(s3_server, fmt):
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/steps.nc"
    write_steps(f"s3://{bucket}/warm-up.nc", fmt, 2, s3_server.storage_options)  # (botocore's imports: not ours)
    peak = peak_while(lambda: write_steps(url, fmt, 1000, s3_server.storage_options))
    assert peak < memory_bound(writers=4) < 80e6 / 2, peak
    check_steps(url, s3_server.storage_options)


# --------------------------------------------------------------------------
# Updates (mode "a"), commits, writers killed before close()
# --------------------------------------------------------------------------


@pytest.mark.usefixtures("one_version")
@pytest.mark.parametrize("fmt", ["CF-1.13", "CFA4", "CFA3"])
def test_append_and_update(tmp_path, fmt):
    url = str(tmp_path / "u.nc")
    truth = np.ma.masked_all((12, 3, 4), "f4")
    with Dataset(url, "w", format=fmt) as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", 3)
        ds.createDimension("x", 4)
        time = ds.createVariable("time", "f8", ("time",))
        v = ds.createVariable("v", "f4", ("time", "y", "x"), fill_value=-9.0, subarray_shape=[4, 3, 4])
        truth[:6] = field((6, 3, 4), seed=1)
        v[:6] = truth[:6]
        time[:6] = np.arange(6.0)
    first = {p for p in tmp_path.rglob("*.nc") if p.name != "u.nc"}
    with Dataset(url, "a") as ds:
        v = ds["v"]
        assert v.shape == (6, 3, 4)
        truth[6:12] = field((6, 3, 4), seed=2)
        v[6:12] = truth[6:12]  # completes the partial fragment 1 (4:8) and adds fragment 2
        ds["time"][6:12] = np.arange(6.0, 12.0)
        truth[1, 1, 1:3] = [5.0, 6.0]
        v[1, 1, 1:3] = [5.0, 6.0]  # part of fragment 0: merged with what it held
        ds.comment = "appended"
        assert v.shape == (12, 3, 4)
    ds = Dataset(url)
    same(ds["v"][:], truth)
    same(ds["time"][:], np.arange(12.0))
    assert ds.comment == "appended" and ds["v"].fragments.shape == (3, 1, 1)
    now = {p for p in tmp_path.rglob("*.nc") if p.name != "u.nc"}
    assert not (first & now), "the replaced fragments are retired"


KILLED = textwrap.dedent("""
    import os, sys
    import numpy as np
    from daskcfa.netcdf4 import Dataset
    url, mode = sys.argv[1], sys.argv[2]
    ds = Dataset(url, mode, format="CF-1.13")
    if mode == "w":
        ds.createDimension("t", None)
        ds.createDimension("x", 5)
        ds.createVariable("t", "f8", ("t",))
        v = ds.createVariable("v", "f4", ("t", "x"), subarray_shape=[2, 5])
    v = ds["v"]
    for t in range(8):
        ds["t"][t] = t
        v[t] = np.full(5, 99.0)  # complete fragments are written along the way
    os._exit(1)  # killed before close()
""")


@pytest.mark.parametrize("mode", ["w", "a"])
def test_killed_before_close_leaves_previous_state(tmp_path, mode):
    url = str(tmp_path / "k.nc")
    old = field((4, 5), seed=4)
    with Dataset(url, "w") as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 5)
        ds.createVariable("t", "f8", ("t",))[:] = np.arange(4.0)  # (it keeps "t" unlimited in the file)
        ds.createVariable("v", "f4", ("t", "x"), subarray_shape=[2, 5])[:] = old
    done = subprocess.run([sys.executable, "-c", KILLED, url, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    same(Dataset(url)["v"][:], old)  # the previous aggregation, untouched
    with Dataset(url, "a") as ds:  # the dead writer's lease is taken over
        ds["v"][4] = np.arange(5.0)
        ds["t"][4] = 4.0
    expected = np.ma.concatenate([old, np.arange(5.0)[None]])
    same(Dataset(url)["v"][:], expected)


def test_new_dataset_killed_before_close_leaves_nothing(tmp_path):
    url = str(tmp_path / "new.nc")
    done = subprocess.run([sys.executable, "-c", KILLED, url, "w"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert not os.path.exists(url)
    with pytest.raises(daskcfa.NotFoundError):
        Dataset(url)


def test_second_writer_refused_while_first_writes(tmp_path):
    url = str(tmp_path / "c.nc")
    first = Dataset(url, "w")
    with pytest.raises(daskcfa.WriteConflictError, match="another writer"):
        Dataset(url, "w")
    first.close()


# --------------------------------------------------------------------------
# Bad input: clear daskcfa errors
# --------------------------------------------------------------------------


def test_bad_input(tmp_path):
    url = str(tmp_path / "bad.nc")
    with pytest.raises(daskcfa.ArgumentError, match="mode must be"):
        Dataset(url, "rw")
    with pytest.raises(daskcfa.ArgumentError, match="unknown format 'CFA5'"):
        Dataset(url, "w", format="CFA5")
    with pytest.raises(daskcfa.ArgumentError, match="cfa_version='0.5' does not go with format='CFA3'"):
        Dataset(url, "w", format="CFA3", cfa_version="0.5")
    with pytest.raises(daskcfa.ArgumentError, match="parallel=True"):
        Dataset(url, "w", parallel=True)
    with pytest.raises(daskcfa.NotFoundError):
        Dataset(url, "a")
    with Dataset(url, "w") as ds:
        ds.createDimension("x", 4)
        v = ds.createVariable("v", "f4", ("x",))
        with pytest.raises(daskcfa.ArgumentError, match=r"cannot assign values of shape \(3,\) to a selection of shape \(4,\)"):
            v[:] = np.arange(3.0)
        with pytest.raises(daskcfa.ArgumentError, match="out of bounds"):
            v[4] = 1.0
        with pytest.raises(daskcfa.ArgumentError, match="dimension 'y' is not defined"):
            ds.createVariable("w", "f4", ("y",))
        with pytest.raises(daskcfa.ArgumentError, match="already exists"):
            ds.createVariable("v", "f4", ("x",))
        with pytest.raises(daskcfa.ArgumentError, match="netCDF cannot store"):
            ds.createVariable("c", "c16", ("x",))
        with pytest.raises(daskcfa.ArgumentError, match="read it after close"):
            v[:]
        v[:] = np.arange(4.0)
        with pytest.raises(daskcfa.ArgumentError, match="_FillValue cannot change"):
            v._FillValue = 3.0
    with pytest.raises(daskcfa.ArgumentError, match="closed"):
        v[0] = 1.0
    ro = Dataset(url)
    with pytest.raises(daskcfa.ArgumentError, match="opened for reading"):
        ro["v"][0] = 5.0
    with pytest.raises(daskcfa.ArgumentError, match="opened for reading"):
        ro.createDimension("y", 3)
    with pytest.raises(FileExistsError):
        Dataset(url, "x")
    with pytest.raises(FileExistsError):
        Dataset(url, "w", clobber=False)


# --------------------------------------------------------------------------
# S3netCDF4 reads what the migrated scripts write, on disk and through its S3 alias
# --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,version", [("CFA4", "0.5"), ("CFA4", "0.4"), ("CFA3", "0.4")])
def test_s3netcdf4_reads_migrated_script_output(tmp_path, s3netcdf4, fmt, version):
    from s3netcdf4_helpers import check_filled, read_by_s3netcdf4, s3nc_config

    values = field((10, 5, 8), masked=0.1)
    url = str(tmp_path / "out" / "a.nc")
    with Dataset(url, "w", format=fmt, cfa_version=version) as ds:
        variable = surface_dataset(ds, fmt, values)
    got = read_by_s3netcdf4(s3netcdf4, s3nc_config(tmp_path / "s3nc.json"), url, variable, tmp_path / "out")
    check_filled(got, values, 2e20)


@pytest.mark.parametrize("fmt,version", [("CFA4", "0.5"), ("CFA3", "0.4"), ("NETCDF4", None)])
def test_s3_alias_write_read_by_s3netcdf4_and_daskcfa(tmp_path, s3netcdf4, s3_server, s3_bucket, monkeypatch, fmt,
                                                       version):
    """S3netCDF4's S3 example with only the import changed: the alias of ``~/.s3nc.json`` (here
    ``$S3_NC_CONFIG``) names the server; fragments referenced absolutely, as S3netCDF4 reads them."""
    from s3netcdf4_helpers import check_filled, read_by_s3netcdf4, s3nc_config

    config = s3nc_config(tmp_path / "s3nc.json", s3_server)
    monkeypatch.setenv("S3_NC_CONFIG", str(config))
    values = field((10, 5, 8), masked=0.1)
    url = f"s3://tenancy-0/{s3_bucket}/run/a.nc"
    options = {"uris": "absolute"} if fmt != "NETCDF4" else {}
    with Dataset(url, "w", format=fmt, cfa_version=version, **options) as ds:
        variable = surface_dataset(ds, fmt, values)
    if fmt != "CFA3":  # S3netCDF4 2.1rc1 opens no netCDF-3 file from S3 ("inmemory.nc": Operation not
        # permitted), its own CFA3 output included: only daskcfa reads that one back
        check_filled(read_by_s3netcdf4(s3netcdf4, config, url, variable, tmp_path), values, 2e20)
    with Dataset(url) as ds:  # daskcfa reads it back through the alias
        same(ds[variable][:], values)
        assert ds["velocity"][0] == 10.0
    real = f"s3://{s3_bucket}/run/a.nc"  # and by the real URL with storage options
    with Dataset(real, storage_options=s3_server.storage_options) as ds:
        same(ds[variable][:, 2], values[:, 2])


@pytest.mark.parametrize("fmt,version,dialect", [("CFA4", "0.4", "CFA-0.4"), ("CFA3", None, "CFA-0.4"),
                                                 ("CFA-0.6.2", None, "CFA-0.6"), ("NETCDF3_CLASSIC", None, None)])
def test_update_keeps_the_format(tmp_path, fmt, version, dialect):
    """mode="a" without format= keeps what the file is: its dialect and file format, or a plain file."""
    url = str(tmp_path / "keep.nc")
    with Dataset(url, "w", format=fmt, cfa_version=version) as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 3)
        ds.createVariable("t", "f8", ("t",))[0:2] = [0.0, 1.0]
        ds.createVariable("v", "f4", ("t", "x"), subarray_shape=[1, 3])[0:2] = np.ones((2, 3))
    with Dataset(url, "a") as ds:
        ds["v"][2] = np.full(3, 2.0)
        ds["t"][2] = 2.0
    with netCDF4.Dataset(url) as nc:
        assert nc.data_model == ("NETCDF3_CLASSIC" if fmt.endswith("3") or fmt == "NETCDF3_CLASSIC" else "NETCDF4")
    if dialect is not None:
        assert daskcfa.read_aggregation(url, "v").dialect == dialect
    same(Dataset(url)["v"][:], np.array([[1.0] * 3, [1.0] * 3, [2.0] * 3]))


def test_exception_inside_with_abandons_the_write(tmp_path):
    url = str(tmp_path / "e.nc")
    with Dataset(url, "w") as ds:
        ds.createDimension("x", 4)
        ds.createVariable("v", "f4", ("x",))[:] = np.arange(4.0)
    for fmt in ("CF-1.13", "NETCDF4"):
        target = url if fmt == "CF-1.13" else str(tmp_path / "plain.nc")
        with pytest.raises(ZeroDivisionError):
            with Dataset(target, "a" if fmt == "CF-1.13" else "w", format=fmt) as ds:
                if fmt == "CF-1.13":
                    ds["v"][:] = np.full(4, -1.0)
                1 / 0
    same(Dataset(url)["v"][:], np.arange(4.0))  # the update was not committed
    assert not os.path.exists(tmp_path / "plain.nc")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no lease, no temporary left
    with Dataset(url, "w") as ds:  # and the lease was given back
        ds.createDimension("x", 1)


def test_writer_dropped_unclosed_gives_its_lease_back(tmp_path):
    import gc

    url = str(tmp_path / "d.nc")
    ds = Dataset(url, "w")
    ds.createDimension("x", 2)
    del ds
    gc.collect()
    with Dataset(url, "w") as again:
        again.createDimension("x", 2)
        again.createVariable("v", "i4", ("x",))[:] = [1, 2]
    same(Dataset(url)["v"][:], np.array([1, 2]))


def test_strings_and_characters_in_the_aggregation_file(tmp_path):
    url = str(tmp_path / "s.nc")
    with Dataset(url, "w") as ds:
        ds.createDimension("station", 3)
        ds.createDimension("t", 4)
        names = ds.createVariable("name", str, ("station",))
        names[0] = "Reading"
        names[2] = "Chilbolton"  # station 1 never named
        ds.createVariable("v", "f4", ("t", "station"))[:] = np.ones((4, 3))
    got = Dataset(url)["name"][:]
    assert list(got) == ["Reading", "", "Chilbolton"]


# --------------------------------------------------------------------------
# Found by trying to break it: values the stored type cannot hold, hostile attribute names,
# netCDF4-python's orthogonal reads, packing changed after values were assigned
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,values", [("i1", 300), ("i1", [300, 5]), ("i1", np.array([300, 5])),
                                          ("i1", np.array([1e10, 5.0])), ("u1", np.array([-1, 5])),
                                          ("i4", np.array([np.inf, 5.0]))])
def test_values_the_stored_type_cannot_hold_are_refused(tmp_path, dtype, values):
    """netCDF4-python raises for Python integers (numpy's OverflowError) and wraps numpy arrays into
    garbage (300 -> 44): daskcfa refuses both, before anything is buffered or a dimension grows."""
    url = str(tmp_path / "r.nc")
    with Dataset(url, "w") as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 2)
        v = ds.createVariable("v", dtype, ("t", "x"))
        with pytest.raises(daskcfa.ArgumentError, match=f"outside the range of {np.dtype(dtype)}.*'/v'"):
            v[0] = values
        assert v.shape == (0, 2)
        v[0] = [1, 2]
    same(Dataset(url)["v"][:], np.array([[1, 2]], dtype))


def test_packed_values_the_stored_type_cannot_hold_are_refused(tmp_path):
    url = str(tmp_path / "p.nc")
    with pytest.raises(daskcfa.CFAError, match="outside the range of int8"):
        with Dataset(url, "w") as ds:
            ds.createDimension("x", 2)
            v = ds.createVariable("v", "i1", ("x",))
            v.scale_factor = 0.01
            v[:] = [1.0, 5.0]  # 500 packed: netCDF4-python stores -12
            ds.close()
    assert not os.path.exists(url)


def test_nan_into_an_integer_variable_is_missing(tmp_path):
    """NaN cannot be an integer: missing (daskcfa's writing rule), never INT_MIN as netCDF4-python
    stores it, nor a cast of NaN."""
    url = str(tmp_path / "n.nc")
    with Dataset(url, "w") as ds:
        ds.createDimension("x", 3)
        ds.createDimension("t", 2)
        ds.createVariable("x", "i4", ("x",))[:] = np.array([1.0, np.nan, 3.0])
        v = ds.createVariable("v", "i2", ("t", "x"), fill_value=-9)
        v[0] = np.array([np.nan, 2.0, 3.0])
        v[1, 0] = np.nan
    ds = Dataset(url)
    same(ds["x"][:], np.ma.MaskedArray([1, 0, 3], mask=[0, 1, 0]))
    same(ds["v"][:], np.ma.MaskedArray([[0, 2, 3], [0, 0, 0]], mask=[[1, 0, 0], [1, 1, 1]]))


@pytest.mark.parametrize("fmt", ["CF-1.13", "NETCDF4"])
def test_attribute_names_of_the_python_object(tmp_path, fmt):
    """netCDF4-python makes every name it does not reserve a netCDF attribute (``url``, ``_writer``...):
    they were daskcfa's own fields, and ``ds.url = ...`` redirected the write."""
    url = str(tmp_path / "h.nc")
    elsewhere = str(tmp_path / "elsewhere.nc")
    names = ["url", "_writer", "_url", "_scratch", "_nc", "_closed", "attrs", "dims", "_x"]
    with Dataset(url, "w", format=fmt) as ds:
        ds.createDimension("x", 2)
        v = ds.createVariable("v", "f4", ("x",))
        for name in names:
            setattr(ds, name, elsewhere)
            setattr(v, name, elsewhere)
        for name in ("name", "path", "dimensions", "variables", "groups", "parent"):
            with pytest.raises(AttributeError):
                setattr(ds, name, "x")
        with pytest.raises(AttributeError):
            v.name = "w"
        v[:] = [1.0, 2.0]
    assert not os.path.exists(elsewhere)
    with netCDF4.Dataset(url) as nc:
        assert all(nc.getncattr(n) == elsewhere and nc["v"].getncattr(n) == elsewhere for n in names)
    same(Dataset(url)["v"][:], np.array([1.0, 2.0]))


@pytest.mark.parametrize("fmt", ["CF-1.13", "NETCDF4"])
def test_scalar_variables_take_any_one_index(tmp_path, fmt):
    """netCDF4-python's scalars: v[:] = x, v[0] = x, v.assignValue(x), v.getValue()."""
    url = str(tmp_path / "s.nc")
    with Dataset(url, "w", format=fmt) as ds:
        for i, key in enumerate([slice(None), 0, Ellipsis, ()]):
            ds.createVariable(f"s{i}", "f8")[key] = 5.0 + i
        ds.createVariable("a", "i4").assignValue(9)
        assert ds["a"].getValue() == 9
    with Dataset(url) as ds:
        assert [float(ds[f"s{i}"][:]) for i in range(4)] == [5.0, 6.0, 7.0, 8.0]
        assert ds["a"].getValue() == 9 and ds["a"][0] == 9


def test_packing_cannot_change_once_values_are_assigned(tmp_path):
    """netCDF4-python reads the values stored so far with the new scale_factor (1, 5, 7 read 0.5, 2.5,
    3.5); daskcfa packed them with it at close (1, 5, 7 read 1, 5, 7, or 0, 4, 8 when it changed
    between assignments): both silently differ from what was meant, so it is refused."""
    url = str(tmp_path / "k.nc")
    with Dataset(url, "w") as ds:
        ds.createDimension("x", 6)
        for aggregate in (True, False):
            v = ds.createVariable(f"v{aggregate}", "i2", ("x",), aggregate=aggregate)
            v.scale_factor = 0.5
            v[0:3] = [1.0, 5.0, 7.0]
            for name in ("scale_factor", "add_offset", "_Unsigned"):
                with pytest.raises(daskcfa.ArgumentError, match=f"{name} cannot change once values are assigned"):
                    v.setncattr(name, 2.0)
    for aggregate in (True, False):
        same(Dataset(url)[f"v{aggregate}"][:3], np.array([1.0, 5.0, 7.0]))


def test_names_netcdf_refuses_are_refused_when_defined(tmp_path):
    """A group '..' was taken, its fragments written, and close() failed with netCDF-C's RuntimeError."""
    with Dataset(str(tmp_path / "n.nc"), "w") as ds:
        ds.createDimension("x", 2)
        for bad in ("..", ".", "-a", "a ", "x\x01"):
            with pytest.raises(daskcfa.ArgumentError, match="is not a netCDF name"):
                ds.createGroup(bad)
            with pytest.raises(daskcfa.ArgumentError, match="is not a netCDF name"):
                ds.createVariable(bad, "f4", ("x",))
        ds.createGroup("a b").createVariable("é", "f4", ("x",))[:] = [1.0, 2.0]
    same(Dataset(str(tmp_path / "n.nc"))["a b/é"][:], np.array([1.0, 2.0]))


def test_targets_that_cannot_be_written(monkeypatch):
    """HTTP has no atomic write: refused clearly (it was an AttributeError of fsspec's), the
    credentials of the URL nowhere in the message."""
    for url in ("https://user:hunter2@example.org/x.nc", "http://example.org/x.nc"):
        with pytest.raises(daskcfa.ArgumentError, match="local disk and S3") as raised:
            Dataset(url, "w")
        assert "hunter2" not in str(raised.value) and "hunter2" not in repr(raised.value)
        with pytest.raises(daskcfa.ArgumentError, match="local disk and S3"):
            daskcfa.to_cfa(np.zeros(3), url, variable="v", dims=("x",))


def test_chunk_index_written_at_close(tmp_path):
    from daskcfa.fragments.chunk_index import index_uri

    url = str(tmp_path / "ix.nc")
    with Dataset(url, "w", format="CFA4", chunk_index=True) as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 6)
        ds.createVariable("t", "f8", ("t",))[:] = np.arange(8.0)
        v = ds.createVariable("v", "f4", ("t", "x"), subarray_shape=[4, 6], zlib=True)
        v[:] = np.arange(48.0).reshape(8, 6)
    assert os.path.exists(index_uri(url).removeprefix("file://"))
    same(daskcfa.from_cfa(url, "v", chunk_index=True)[:, 2].compute(), np.arange(48.0).reshape(8, 6)[:, 2])


# ---------------------------------------------------------------------------
# Issue 28 item 4: netCDF4-python's read side, side by side with netCDF4-python on the same file
# ---------------------------------------------------------------------------
def _packed_archive(tmp_path):
    """An aggregation (packed int16 with a fill value, a coordinate, a string variable) written by daskcfa."""
    url = str(tmp_path / "p.nc")
    with Dataset(url, "w", format="CF-1.13") as ds:
        ds.createDimension("time", 4)
        ds.createDimension("x", 3)
        t = ds.createVariable("time", "f8", ("time",))
        t[:] = np.arange(4.0)
        v = ds.createVariable("tas", "i2", ("time", "x"), fill_value=np.int16(-999), subarray_shape=(2, 3),
                              zlib=True)
        v.scale_factor, v.add_offset = 0.5, 100.0
        v[:] = np.ma.masked_values(np.array([[1, 2, -999], [4, 5, 6], [7, -999, 9], [10, 11, 12]]) * 0.5 + 100.0,
                                   -999 * 0.5 + 100.0)
        p = ds.createVariable("p", "i2", ("x",), fill_value=np.int16(-1), aggregate=False)  # packed, ordinary
        p.scale_factor = 0.25
        p[:] = np.ma.masked_values([1.0, -0.25, 2.0], -0.25)
    return url


def test_read_side_methods_are_netcdf4_pythons(tmp_path):
    url = _packed_archive(tmp_path)
    with netCDF4.Dataset(url) as nc:
        ours = Dataset(url)
        assert (ours.file_format, ours.data_model, ours.filepath(), ours.isopen()) == (
            nc.file_format, nc.data_model, nc.filepath(), nc.isopen())
        mine, theirs = ours["time"], nc["time"]  # an ordinary variable of the aggregation file: the very same
        assert (mine.datatype, mine.chunking(), mine.filters()) == (theirs.datatype, theirs.chunking(), theirs.filters())
        tas = ours["tas"]  # aggregated: the aggregation variable's type, its fragments' storage
        assert tas.datatype == nc["tas"].datatype and tas.chunking() == [2, 3]
        fragment = sorted(p for p in (tmp_path / "p").rglob("*.nc"))[0]
        with netCDF4.Dataset(fragment) as frag:
            assert tas.filters() == frag["tas"].filters() and tas.filters()["zlib"] is True
    ours.close()
    assert not ours.isopen()


def test_auto_mask_and_scale_switches_are_netcdf4_pythons(tmp_path):
    """Ordinary variables (one packed) side by side with netCDF4-python on the aggregation file; the aggregated
    one by the aggregation's own encoding: unmasked, a missing point holds its ``_FillValue``."""
    url = _packed_archive(tmp_path)
    ours = Dataset(url)
    truth = ours["tas"][:]
    fill = ours["tas"].attrs["_FillValue"]
    for name, flag in [("set_auto_mask", False), ("set_auto_maskandscale", False), ("set_auto_maskandscale", True),
                       ("set_auto_mask", True)]:
        for var in ("p", "time"):
            with netCDF4.Dataset(url) as nc:
                getattr(nc[var], name)(flag)
                expected = nc[var][:]
            getattr(ours[var], name)(flag)
            got = ours[var][:]
            assert type(got) is type(expected) and got.dtype == expected.dtype, (var, name, flag)
            np.testing.assert_array_equal(np.ma.getdata(got), np.ma.getdata(expected))
            np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))
        getattr(ours["tas"], name)(flag)
        got = ours["tas"][:]
        if ours["tas"].auto_mask:
            assert type(got) is np.ma.MaskedArray
            np.testing.assert_array_equal(got.mask, truth.mask)
        else:
            assert type(got) is np.ndarray
            np.testing.assert_array_equal(got, truth.filled(fill))


def test_reading_after_close_raises_as_netcdf4_python(tmp_path):
    url = _packed_archive(tmp_path)
    with netCDF4.Dataset(url) as nc:
        theirs = nc["time"]
    with pytest.raises(RuntimeError):
        theirs[:]
    with Dataset(url) as ds:
        tas, time = ds["tas"], ds["time"]
        data = tas.data
    for var in (tas, time):
        with pytest.raises(daskcfa.ClosedError, match="closed") as info:
            var[:]
        assert isinstance(info.value, RuntimeError) and info.value.variable == var.path
    assert data.compute().shape == (4, 3)  # a dask array taken before close() keeps working


def test_a_new_dataset_without_format_warns_of_its_dialect(tmp_path):
    """S3netCDF4 writes CFA-0.5 by default, netCDF4-python a plain file: no silent change (migration.md)."""
    with pytest.warns(daskcfa.CFAWarning, match="without format= writes a CF-1.13 aggregation"):
        with Dataset(str(tmp_path / "a.nc"), "w") as ds:
            ds.createDimension("x", 2)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fmt in ("CF-1.13", "CFA4", "NETCDF4"):
            with Dataset(str(tmp_path / f"{fmt}.nc"), "w", format=fmt) as ds:
                ds.createDimension("x", 2)
        with Dataset(str(tmp_path / "a.nc"), "a") as ds:  # an update keeps the file's own format: no warning
            ds.title = "kept"


def test_dataset_and_group_switches_reach_every_variable(tmp_path):
    """``nc.set_auto_mask(False)`` / ``set_auto_scale`` / ``set_auto_maskandscale`` on the dataset or a group, as
    netCDF4-python: every variable in it and its sub-groups (a migrating script calls them on the dataset)."""
    url = _packed_archive(tmp_path)
    with netCDF4.Dataset(url, "a") as nc:  # a sub-group's packed variable, beside the aggregation's own
        q = nc.createGroup("g").createVariable("q", "i2", ("x",), fill_value=np.int16(-1))
        q.scale_factor = 0.5
        q[:] = np.ma.masked_values([1.0, -0.5, 3.0], -0.5)
    for name, flag in [("set_auto_mask", False), ("set_auto_maskandscale", False), ("set_auto_scale", False),
                       ("set_auto_maskandscale", True), ("set_auto_scale", True), ("set_auto_mask", True)]:
        for on in ("/", "/g"):
            ours = Dataset(url)
            with netCDF4.Dataset(url) as nc:
                getattr(nc if on == "/" else nc[on], name)(flag)
                getattr(ours if on == "/" else ours[on], name)(flag)
                for var in ("/p", "/time", "/g/q"):
                    mine, theirs = ours[var], nc[var]
                    assert (mine.auto_mask, mine.auto_scale) == (theirs.mask, theirs.scale), (name, flag, on, var)
                    if mine.auto_mask and not mine.auto_scale and "scale_factor" in mine.attrs:
                        continue  # (masking without unpacking a packed variable: refused by daskcfa)
                    got, expected = mine[:], theirs[:]
                    assert type(got) is type(expected) and got.dtype == expected.dtype, (name, flag, on, var)
                    np.testing.assert_array_equal(np.ma.getdata(got), np.ma.getdata(expected))
                    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))
            tas = ours["/tas"]  # (in the root group only: a group's switch leaves it as it was)
            assert tas.auto_mask is (flag or on == "/g" or name == "set_auto_scale"), (name, flag, on)
            assert tas.auto_scale is (flag or on == "/g" or name == "set_auto_mask"), (name, flag, on)
