"""Writing aggregations with ``daskcfa.to_cfa`` (issue "Write graph").

Real files only: fragments and aggregation files are written to local disk or
to the real S3 server (SeaweedFS) and read back with ``from_cfa``/``open_cfa``
and with netCDF4-python, against numpy ground truth. Failures are real too:
a block function that raises, a fragment whose final path is taken by a
directory.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import dask
import dask.array as da
from dask.delayed import Delayed
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_editable_by_netcdf_c, assert_matches, build, make_truth
from builders import generation_dir as generation
from daskcfa.formats.encode import WRITE_FORMATS
from daskcfa.fragments.write import FRAGMENT_FORMATS
from daskcfa.storage import NO_PROFILE
from daskcfa.storage.lease import Lease

DIMS = ("time", "lat", "lon")
SHAPE = (7, 4, 6)  # 7 along time with fragments of 3: a ragged last fragment
COORDS = {
    "time": (np.arange(7.0), {"units": "days since 2000-01-01", "axis": "T", "standard_name": "time"}),
    "lat": (np.linspace(-45, 45, 4), {"units": "degrees_north"}),
    "lon": np.arange(0.0, 360.0, 60.0),
}
ATTRS = {"units": "K", "standard_name": "air_temperature", "long_name": "T"}


def truth(dtype="f4", masked=0.1, seed=1) -> np.ma.MaskedArray:
    return make_truth(SHAPE, dtype, masked=masked, seed=seed)


def write(x, url, **kw):
    kw = {"variable": "tas", "dims": DIMS, "attrs": ATTRS, "coords": COORDS, "fragment_shape": (3, 2, 6), **kw}
    return daskcfa.to_cfa(x, str(url), **kw)


def stamps(directory: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every fragment file of every generation (keyed ``generation/name``):
    a rewrite changes the inode (written, then renamed)."""
    return {f"{p.parent.name}/{p.name}": (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.glob("g-*/*.nc")}


def planned_generation(delayed) -> str:
    """The generation a delayed write will write (from its first task's key)."""
    return "g-" + next(str(k) for k in delayed.dask if str(k).startswith("cfa-begin-")).rsplit("-g-", 1)[1]


# ---------------------------------------------------------------------------
# Round trips, fragment files
# ---------------------------------------------------------------------------
def test_round_trip_local(tmp_path, other_cwd):
    x = truth()
    url = write(da.from_array(x, chunks=(3, 2, 3)), tmp_path / "out" / "t.nc")
    assert url == str(tmp_path / "out" / "t.nc")
    y = daskcfa.from_cfa(url, "tas")
    assert y.chunks == ((3, 3, 1), (2, 2), (6,))
    assert_matches(y.compute(), x, rtol=0)
    with daskcfa.open_cfa(url) as ds:
        assert {k: ds["tas"].attrs[k] for k in ATTRS} == ATTRS
        np.testing.assert_array_equal(ds["time"][...], COORDS["time"][0])
        assert ds["time"].attrs["axis"] == "T"
        np.testing.assert_array_equal(ds["lon"][...], COORDS["lon"])
    # relative fragment URIs, S3netCDF4 naming
    with netCDF4.Dataset(url) as nc:
        uris = nc["tas_uris"][...]
    assert uris[2, 1, 0] == f"t/{generation(tmp_path / 'out' / 't').name}/t.tas.2.1.0.nc"
    assert sorted(p.name for p in generation(tmp_path / "out" / "t").glob("*.nc")) == [
        f"t.tas.{i}.{j}.0.nc" for i in range(3) for j in range(2)]


def test_fragments_are_self_describing(tmp_path):
    x = truth()
    write(x, tmp_path / "t.nc", compression={"zlib": True, "complevel": 1, "shuffle": True})
    with netCDF4.Dataset(generation(tmp_path / "t") / "t.tas.2.1.0.nc") as nc:
        assert {d: len(n) for d, n in nc.dimensions.items()} == {"time": 1, "lat": 2, "lon": 6}
        np.testing.assert_array_equal(nc["time"][:], [6.0])
        np.testing.assert_array_equal(nc["lat"][:], COORDS["lat"][0][2:4])
        np.testing.assert_array_equal(nc["lon"][:], COORDS["lon"])
        assert nc["time"].units == "days since 2000-01-01"
        tas = nc["tas"]
        assert tas.dimensions == DIMS
        assert {k: tas.getncattr(k) for k in ATTRS} == ATTRS
        assert "_FillValue" in tas.ncattrs()
        assert tas.filters()["zlib"] and tas.filters()["complevel"] == 1
        assert_matches(tas[...], x[6:7, 2:4, :], rtol=0)


def test_masked_integers_and_fill_value(tmp_path):
    x = truth("i2", masked=0.3)
    url = write(x, tmp_path / "t.nc", attrs={"_FillValue": np.int16(-7)})
    got = daskcfa.from_cfa(url).compute()
    assert_matches(got, x)
    assert got.mask.sum() == x.mask.sum() > 0
    raw = daskcfa.from_cfa(url, mask=False).compute()
    assert (raw[x.mask] == -7).all()


def test_numpy_input_and_fragment_shape_honoured(tmp_path):
    x = truth(masked=0)
    url = write(x.data, tmp_path / "t.nc", fragment_shape={"lat": 3}, coords=None)
    y = daskcfa.from_cfa(url)
    assert y.chunks == ((7,), (3, 1), (6,))
    np.testing.assert_array_equal(y.compute(), x.data)


def test_size_limit_and_unaligned_chunks_are_rechunked(tmp_path):
    x = truth()
    url = write(da.from_array(x, chunks=(5, 3, 4)), tmp_path / "t.nc", fragment_shape=None, max_fragment_size=200)
    plan = daskcfa.plan_fragments(SHAPE, "f4", DIMS, max_fragment_size=200, axes={"time": "T"})
    y = daskcfa.from_cfa(url)
    assert y.chunks == plan.sizes == ((4, 3), (4,), (3, 3))
    assert_matches(y.compute(), x, rtol=0)


def test_group_variable_named_after_its_group(tmp_path):
    x = truth()
    url = write(x, tmp_path / "g.nc", variable="/grp/tas")
    assert (generation(tmp_path / "g") / "g.grp.tas.0.0.0.nc").exists()
    assert_matches(daskcfa.from_cfa(url, "/grp/tas").compute(), x)


@pytest.mark.parametrize("fmt", WRITE_FORMATS)
def test_written_files_are_editable_by_netcdf_c(tmp_path, fmt):
    # issue 13 item 12: netCDF4.Dataset(path, "a") failed with NC_ECANTWRITE on every aggregation file
    x = truth()
    url = write(x, tmp_path / "t.nc", format=fmt)
    assert_editable_by_netcdf_c(url, *sorted((tmp_path / "t").glob("*.nc")))
    assert_matches(daskcfa.from_cfa(url).compute(), x)
    with daskcfa.open_cfa(url) as ds:
        assert ds.attrs["comment"] == "edited second"


@pytest.mark.parametrize("fmt, fragment_format", list(itertools.product(WRITE_FORMATS, FRAGMENT_FORMATS[:-1])))  # (netCDF)
def test_every_format_and_fragment_format(tmp_path, fmt, fragment_format):
    x = truth()
    url = write(x, tmp_path / "t.nc", format=fmt, fragment_format=fragment_format)
    agg = daskcfa.read_aggregation(url, "tas")
    assert agg.dialect.startswith(fmt.rsplit(".", 1)[0] if fmt == "CFA-0.6.2" else fmt)
    assert_matches(daskcfa.from_cfa(url, "tas").compute(), x)
    with netCDF4.Dataset(generation(tmp_path / "t") / "t.tas.0.0.0.nc") as nc:
        assert nc.data_model == fragment_format


def test_xarray_dataset_with_encoding(tmp_path):
    xr = pytest.importorskip("xarray")
    import pandas as pd

    x = truth("f8", masked=0)
    values = np.where(truth().mask, np.nan, x.data)
    ds = xr.Dataset(
        {"tas": (DIMS, da.from_array(values, chunks=(4, 4, 6)), {"units": "K"})},
        coords={"time": pd.date_range("2000-01-01", periods=7), "lat": COORDS["lat"][0], "lon": COORDS["lon"]},
        attrs={"title": "xarray input"},
    )
    ds.tas.encoding = {"dtype": "int16", "scale_factor": 0.01, "add_offset": 250.0, "_FillValue": -32767}
    url = daskcfa.to_cfa(ds, str(tmp_path / "x.nc"), fragment_shape=(3, 4, 6))
    got = daskcfa.from_cfa(url, "tas").compute()
    expected = np.ma.masked_invalid(values)
    assert_matches(got, expected, atol=0.006)
    with daskcfa.open_cfa(url) as back:
        assert back["tas"].dtype == np.float64 and "scale_factor" not in back["tas"].attrs  # unpacked data
        assert back.attrs["title"] == "xarray input"
    with netCDF4.Dataset(generation(tmp_path / "x") / "x.tas.0.0.0.nc") as nc:  # each fragment is packed
        assert nc["tas"].dtype == np.int16 and nc["tas"].scale_factor == 0.01
    reread = xr.decode_cf(xr.open_dataset(generation(tmp_path / "x") / "x.tas.1.0.0.nc", decode_cf=False))
    np.testing.assert_array_equal(reread.time.values, ds.time.values[3:6])
    np.testing.assert_allclose(reread.tas.values, values[3:6], atol=0.006)


def test_xarray_dataarray(tmp_path):
    xr = pytest.importorskip("xarray")
    x = truth(masked=0)
    arr = xr.DataArray(x.data, dims=DIMS, coords={"lat": COORDS["lat"][0]}, attrs={"units": "K"})
    url = daskcfa.to_cfa(arr.chunk({"time": 2}), str(tmp_path / "a.nc"), variable="tas", fragment_shape={"time": 4})
    y = daskcfa.from_cfa(url, "tas")
    assert y.chunks[0] == (4, 3)
    np.testing.assert_array_equal(y.compute(), x.data)
    with netCDF4.Dataset(generation(tmp_path / "a") / "a.tas.1.0.0.nc") as nc:
        np.testing.assert_array_equal(nc["lat"][:], COORDS["lat"][0])
        assert nc["tas"].units == "K"


# ---------------------------------------------------------------------------
# Converting aggregations: open_cfa -> to_cfa
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("source, target", [("CFA-0.4", "CF-1.13"), ("NCA", "CFA-0.5"), ("CF-1.13", "CFA-0.6.2")])
def test_dataset_conversion(tmp_path, source, target):
    x = truth(masked=0.1)
    built = build(source, tmp_path / "in", x, DIMS, [[3, 4], [4], [2, 4]], attrs={"long_name": "T"})
    _check_conversion(tmp_path, built, target)


def test_dataset_conversion_in_a_group(tmp_path):
    built = build("CF-1.13", tmp_path / "in", truth(), DIMS, [[3, 4], [4], [6]], group="grp", dims_in_group=True)
    url = _check_conversion(tmp_path, built, "CFA-0.5", variable="/grp/tas")
    assert (generation(Path(url).parent / "converted") / "converted.grp.tas.3.0.0.nc").exists()  # group after the stem


def _check_conversion(tmp_path, built, target, variable="tas"):
    with daskcfa.open_cfa(str(built.path)) as ds:
        url = daskcfa.to_cfa(ds, str(tmp_path / "out" / "converted.nc"), format=target, fragment_shape={"time": 2})
    with daskcfa.open_cfa(str(built.path)) as before, daskcfa.open_cfa(url) as after:
        for before_group, after_group in zip(before.walk(), after.walk()):
            assert sorted(after_group.variables) == sorted(before_group.variables)
            for name, var in before_group.variables.items():
                assert after_group[name].attrs == var.attrs, name
                assert_matches(after_group[name][...], var[...], rtol=0)
        assert after[variable].fragments.shape == (4, 1, 1)
    assert_matches(daskcfa.from_cfa(url, variable).compute(), built.expected, rtol=0)
    return url


def test_conversion_keeps_packing_bit_for_bit(tmp_path):
    x = truth(masked=0.1)
    built = build("CF-1.13", tmp_path / "in", x, DIMS, [[7], [4], [6]], dtype="i2", agg_scale_factor=0.01,
                  agg_add_offset=250.0)
    with daskcfa.open_cfa(str(built.path)) as ds:
        url = daskcfa.to_cfa(ds, str(tmp_path / "out.nc"), fragment_shape=(2, 4, 6))
    with netCDF4.Dataset(generation(tmp_path / "out") / "out.tas.1.0.0.nc") as nc:
        nc.set_auto_maskandscale(False)
        stored = nc["tas"][...]
        fill = nc["tas"].getncattr("_FillValue") if "_FillValue" in nc["tas"].ncattrs() else netCDF4.default_fillvals["i2"]
        assert (nc["tas"].scale_factor, nc["tas"].add_offset) == (0.01, 250.0)
    with netCDF4.Dataset(built.fragment_files[(0, 0, 0)]) as nc:
        original = nc["tas"][...]
    assert stored.dtype == np.int16
    np.testing.assert_array_equal(stored, original[2:4].filled(fill))  # the same packed integers
    assert_matches(daskcfa.from_cfa(url).compute(), daskcfa.from_cfa(str(built.path)).compute(), rtol=0)


# ---------------------------------------------------------------------------
# Modes, laziness, failures and resuming
# ---------------------------------------------------------------------------
def test_mode_w_minus_refuses_before_writing(tmp_path):
    target = tmp_path / "t.nc"
    target.write_bytes(b"not ours")
    with pytest.raises(FileExistsError, match="mode='w'"):
        write(truth(), target)
    assert target.read_bytes() == b"not ours"
    assert not (tmp_path / "t").exists()
    write(truth(seed=5), target, mode="w")
    assert_matches(daskcfa.from_cfa(str(target)).compute(), truth(seed=5))


def test_compute_false_is_lazy(tmp_path):
    delayed = write(truth(), tmp_path / "t.nc", compute=False)
    assert isinstance(delayed, Delayed)
    assert not (tmp_path / "t.nc").exists() and not (tmp_path / "t").exists()
    # one task per fragment, plus the commit (and the input's own tasks)
    assert sum(1 for k in delayed.dask if isinstance(k, tuple) and str(k[0]).startswith("cfa-write-")) == 6
    assert delayed.compute() == str(tmp_path / "t.nc")
    assert_matches(daskcfa.from_cfa(str(tmp_path / "t.nc")).compute(), truth())


def _failing_array(x: np.ma.MaskedArray, flag: Path) -> da.Array:
    """A dask array whose block at time 3:6, lat 2:4 raises while ``flag`` exists."""

    def block(b, block_info=None):
        location = block_info[0]["array-location"]
        if flag.exists() and location[0][0] == 3 and location[1][0] == 2:
            raise RuntimeError("sensor offline")
        return b

    return da.from_array(x, chunks=(3, 2, 6)).map_blocks(block, dtype=x.dtype)


def test_failed_block_leaves_no_aggregation_and_rerun_resumes(tmp_path, sync_dask):
    x = truth()
    flag = tmp_path / "fail"
    flag.touch()
    target = tmp_path / "t.nc"
    array = _failing_array(x, flag)
    with pytest.raises(RuntimeError, match="sensor offline"):
        write(array, target)
    assert not target.exists()
    before = stamps(tmp_path / "t")
    assert 0 < len(before) < 6 and "t.tas.1.1.0.nc" not in before  # stopped half-way
    flag.unlink()
    write(array, target)  # the very same call
    after = stamps(tmp_path / "t")
    assert len(after) == 6
    assert {k: after[k] for k in before} == before  # nothing else rewritten
    assert_matches(daskcfa.from_cfa(str(target)).compute(), x)
    manifest = json.loads((tmp_path / "t" / ".daskcfa" / "manifest.json").read_text())
    assert len(manifest["fragments"]["/tas"]) == 6


def test_failed_fragment_write_names_the_fragment(tmp_path, sync_dask):
    x = truth()
    blocker = tmp_path / "t" / planned_generation(write(x, tmp_path / "t.nc", compute=False)) / "t.tas.2.0.0.nc"
    (blocker / "in-the-way").mkdir(parents=True)  # the fragment's final path is a non-empty directory
    with pytest.raises(daskcfa.CFAError, match=r"fragment \(2, 0, 0\)") as info:
        write(x, tmp_path / "t.nc")
    assert info.value.fragment == (2, 0, 0) and info.value.variable == "/tas"
    assert "t.tas.2.0.0.nc" in str(info.value)
    assert not (tmp_path / "t.nc").exists()
    assert not list((tmp_path / "t").rglob(".*.part"))  # no temporary file left behind
    (blocker / "in-the-way").rmdir()
    blocker.rmdir()
    before = stamps(tmp_path / "t")
    write(x, tmp_path / "t.nc")
    after = stamps(tmp_path / "t")
    assert {k: after[k] for k in before} == before and len(after) == 6


@pytest.mark.usefixtures("one_version")
def test_changed_call_rewrites_and_mode_w_rerun_skips(tmp_path):
    x = truth()
    target = tmp_path / "t.nc"
    write(x, target)
    first = stamps(tmp_path / "t")
    write(x, target, mode="w")  # same call again: every fragment verified, only the aggregation rewritten
    assert stamps(tmp_path / "t") == first
    write(x, target, mode="w", attrs={**ATTRS, "comment": "changed"})
    after = stamps(tmp_path / "t")  # a new generation; the old one deleted after the commit
    assert len(after) == 6 and not set(after) & set(first)
    with netCDF4.Dataset(generation(tmp_path / "t") / "t.tas.0.0.0.nc") as nc:
        assert nc["tas"].comment == "changed"


def test_tampered_fragment_is_rewritten(tmp_path):
    x = truth()
    target = tmp_path / "t.nc"
    write(x, target)
    victim = generation(tmp_path / "t") / "t.tas.0.1.0.nc"
    victim.write_bytes(b"truncated")
    write(x, target, mode="w")
    assert_matches(daskcfa.from_cfa(str(target)).compute(), x)


def test_processes_scheduler(tmp_path):
    x = truth()
    with dask.config.set(scheduler="processes", num_workers=2):
        url = write(da.from_array(x, chunks=(3, 2, 6)), tmp_path / "t.nc")
    assert_matches(daskcfa.from_cfa(url).compute(scheduler="sync"), x)


# ---------------------------------------------------------------------------
# Sparse writes and updates (region, mode="r+")
# ---------------------------------------------------------------------------
def test_sparse_write_then_update(tmp_path):
    x = truth()
    target = tmp_path / "s.nc"
    write(x[3:6], target, region={"time": slice(3, 6)}, format="CFA-0.6.2")
    assert sorted(p.name for p in generation(tmp_path / "s").glob("*.nc")) == ["s.tas.1.0.0.nc", "s.tas.1.1.0.nc"]
    got = daskcfa.from_cfa(str(target)).compute()
    assert got.shape == SHAPE and got[:3].mask.all() and got[6:].mask.all()
    assert_matches(got[3:6], x[3:6])
    with daskcfa.open_cfa(str(target)) as ds:
        np.testing.assert_array_equal(ds["time"][...], COORDS["time"][0])  # the whole axis, from coords
    first = stamps(tmp_path / "s")
    daskcfa.to_cfa(x[6:, :2], str(target), mode="r+", region={"time": slice(6, None), "lat": slice(0, 2)},
                   format="CFA-0.6.2")
    assert stamps(tmp_path / "s").items() >= first.items()
    got = daskcfa.from_cfa(str(target)).compute()
    assert_matches(got[3:6], x[3:6])
    assert_matches(got[6:, :2], x[6:, :2])
    assert got[:3].mask.all() and got[6:, 2:].mask.all()
    manifest = json.loads((tmp_path / "s" / ".daskcfa" / "manifest.json").read_text())
    assert sorted(manifest["fragments"]["/tas"]) == ["1.0.0", "1.1.0", "2.0.0"]


def test_impossible_writes_refused_before_writing(tmp_path):
    x = truth()
    with pytest.raises(ValueError, match="fragment boundaries"):
        write(x[2:6], tmp_path / "a.nc", region={"time": slice(2, 6)}, format="CFA-0.6.2")
    with pytest.raises(daskcfa.CFAFormatError, match="wholly missing fragment"):
        write(x[3:6], tmp_path / "b.nc", region={"time": slice(3, 6)})
    with pytest.raises(TypeError, match="NETCDF3_CLASSIC fragments cannot hold"):
        write(x.astype("i8"), tmp_path / "c.nc", fragment_format="NETCDF3_CLASSIC")
    with pytest.raises(ValueError, match="unknown aggregation format"):
        write(x, tmp_path / "d.nc", format="CFA-9")
    assert not list(tmp_path.iterdir())  # refused before anything was written


# ---------------------------------------------------------------------------
# S3 and distributed
# ---------------------------------------------------------------------------
def test_round_trip_s3_and_resume(tmp_path, s3_server, s3_bucket, s3fs_fs, sync_dask):
    x = truth()
    url = f"s3://{s3_bucket}/run/t.nca"
    options = s3_server.storage_options
    flag = tmp_path / "fail"
    flag.touch()
    array = _failing_array(x, flag)
    with pytest.raises(RuntimeError):
        write(array, url, storage_options=options, format="CFA-0.5")
    assert not s3fs_fs.exists(url)
    listed = {p: s3fs_fs.info(p)["LastModified"] for p in s3fs_fs.find(f"{s3_bucket}/run/t") if p.endswith(".nc")}
    assert 0 < len(listed) < 6
    time.sleep(1.1)  # S3 times have 1 s resolution
    flag.unlink()
    write(array, url, storage_options=options, format="CFA-0.5")
    again = {p: s3fs_fs.info(p)["LastModified"] for p in s3fs_fs.find(f"{s3_bucket}/run/t") if p.endswith(".nc")}
    assert {p: again[p] for p in listed} == listed and len(again) == 6
    assert_matches(daskcfa.from_cfa(url, storage_options=options).compute(), x)
    with daskcfa.open_cfa(url, storage_options=options) as ds:
        np.testing.assert_array_equal(ds["lat"][...], COORDS["lat"][0])


def test_remote_files_are_editable_by_netcdf_c(tmp_path, s3_server, s3_bucket, s3fs_fs):
    # issue 13 item 12: files built in netCDF-C's memory could not be reopened for writing
    x = truth()
    for fmt, fragment_format in [("CFA-0.4", "NETCDF4"), ("CF-1.13", "NETCDF4_CLASSIC")]:
        url = write(x, f"s3://{s3_bucket}/{fmt}/t.nc", storage_options=s3_server.storage_options, format=fmt,
                    fragment_format=fragment_format)
        local = tmp_path / fmt
        local.mkdir()
        s3fs_fs.get(url, str(local / "t.nc"))
        reference = daskcfa.read_aggregation(url, storage_options=s3_server.storage_options).fragments[
            (2, 1, 0)].uris[0]  # (relative: inside the write's generation)
        (local / reference).parent.mkdir(parents=True)
        s3fs_fs.get(f"{s3_bucket}/{fmt}/{reference}", str(local / reference))
        assert_editable_by_netcdf_c(local / "t.nc", local / reference)
        s3fs_fs.put(str(local / "t.nc"), url)
        assert_matches(daskcfa.from_cfa(url, storage_options=s3_server.storage_options).compute(), x)
        with daskcfa.open_cfa(url, storage_options=s3_server.storage_options) as ds:
            assert ds.attrs["comment"] == "edited second"


def test_convert_local_to_s3_cf113(tmp_path, s3_server, s3_bucket):
    x = truth()
    local = write(x, tmp_path / "t.nc")
    options = s3_server.storage_options
    with daskcfa.open_cfa(local) as ds:
        url = daskcfa.to_cfa(ds, f"s3://{s3_bucket}/copy/t.nc", storage_options=options, fragment_shape={"time": 3},
                             compression="zlib")
    y = daskcfa.from_cfa(url, storage_options=options)
    assert y.chunks == ((3, 3, 1), (4,), (6,))
    assert_matches(y.compute(), x)


def test_local_cluster_with_bounded_uploads(tmp_path, s3_server, s3_bucket):
    distributed = pytest.importorskip("distributed")
    x = truth()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  worker_dashboard_address=None) as cluster, distributed.Client(cluster):
        url = write(da.from_array(x, chunks=(3, 2, 6)), f"s3://{s3_bucket}/c/t.nc",
                    storage_options=s3_server.storage_options, max_concurrent_uploads=1)
        local = write(da.from_array(x, chunks=(3, 2, 6)), tmp_path / "t.nc")
    assert_matches(daskcfa.from_cfa(url, storage_options=s3_server.storage_options).compute(), x)
    assert_matches(daskcfa.from_cfa(local).compute(), x)


# ---------------------------------------------------------------------------
# String arrays: written whole as vlen strings (NETCDF4 fragments), or refused
# ---------------------------------------------------------------------------
STRINGS = np.array([["a1b2", "c3d4 a longer one ", ""], ["é-ü", "x" * 500, "  z"]], dtype=object)


@pytest.mark.parametrize("place", ["local", "s3"])
@pytest.mark.parametrize("fmt", sorted(WRITE_FORMATS))
@pytest.mark.parametrize("kind", ["object", "unicode", "dask"])
def test_string_array_round_trip(tmp_path, request, place, fmt, kind):
    data = {"object": STRINGS, "unicode": STRINGS.astype(str),
            "dask": da.from_array(STRINGS, chunks=(1, 2))}[kind]
    url, options = str(tmp_path / "s.nc"), {}
    if place == "s3":
        server = request.getfixturevalue("s3_server")
        url, options = f"s3://{request.getfixturevalue('s3_bucket')}/s.nc", {"storage_options": server.storage_options}
    daskcfa.to_cfa(data, url, variable="code", dims=("y", "x"), fragment_shape=(1, 2), format=fmt, **options)
    x = daskcfa.from_cfa(url, "code", **options)
    assert x.dtype == object and x.chunks == ((1, 1), (2, 1))
    got = x.compute()
    assert got.dtype == object and not np.ma.getmaskarray(got).any()
    assert np.ma.getdata(got).tolist() == STRINGS.tolist()


def test_string_arrays_refused_where_they_cannot_be_stored(tmp_path):
    with pytest.raises(TypeError, match="only NETCDF4 fragments store"):
        daskcfa.to_cfa(STRINGS, str(tmp_path / "a.nc"), variable="code", dims=("y", "x"),
                       fragment_format="NETCDF3_64BIT_DATA")
    assert not list(tmp_path.iterdir())
    masked = np.ma.MaskedArray(STRINGS, mask=[[False, True, False], [False, False, False]])
    for data in (masked, da.from_array(masked, chunks=(1, 3), asarray=False)):
        with pytest.raises(daskcfa.FragmentError, match="1 string values are masked"):
            daskcfa.to_cfa(data, str(tmp_path / "b.nc"), variable="code", dims=("y", "x"))
        assert not (tmp_path / "b.nc").exists()


def test_strings_with_nul_refused(tmp_path):
    """A netCDF (vlen) string ends at its first NUL: written, "a\\x00b" would read back as "a"."""
    for i, data in enumerate((np.array(["ab", "a\x00b"], "U4"), np.array(["ab", "cd\x00"], object),
                              da.from_array(np.array(["x", "y\x00z"], object), chunks=1))):
        with pytest.raises(daskcfa.FragmentError, match="holds a NUL character"):
            daskcfa.to_cfa(data, str(tmp_path / f"n{i}.nc"), variable="code", dims=("n",))
        assert not (tmp_path / f"n{i}.nc").exists()


def test_unsigned_aggregation_rewritten(tmp_path):
    """``byte`` data with ``_Unsigned`` written by ``to_cfa``, then re-fragmented, read back as uint8."""
    values = np.array([0, 1, 127, 128, 200, 254, 7, 255], "u1")
    expected = np.ma.MaskedArray(values, mask=values == 7)  # 7: the _FillValue
    daskcfa.to_cfa(values.view("i1"), str(tmp_path / "a.nc"), variable="v", dims=("t",),
                   attrs={"_Unsigned": "true", "_FillValue": np.int8(7)}, fragment_shape=(3,))
    with daskcfa.open_cfa(str(tmp_path / "a.nc")) as ds:
        daskcfa.to_cfa(ds, str(tmp_path / "b.nc"), fragment_shape={"t": 5})
    for name in ("a.nc", "b.nc"):
        got = daskcfa.from_cfa(str(tmp_path / name), "v").compute()
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(np.ma.getmaskarray(got), expected.mask)
        np.testing.assert_array_equal(np.ma.getdata(got)[~expected.mask], values[~expected.mask])


def _unsigned_aggregation(tmp_path, **attrs):
    """An _Unsigned byte aggregation (``attrs`` on its variable) of two fragments, the second absent."""
    frag = tmp_path / "f0.nc"
    with netCDF4.Dataset(str(frag), "w") as ds:
        ds.createDimension("t", 2)
        v = ds.createVariable("v", "u1", ("t",), fill_value=False)
        v[:] = [200, 3]
    agg = tmp_path / "agg.nc"
    with netCDF4.Dataset(str(agg), "w") as ds:
        ds.createDimension("t", 4)
        ds.createDimension("f_t", 2)
        ds.createDimension("i", 1)
        m = ds.createVariable("m", "i4", ("i", "f_t"))
        m[...] = [[2, 2]]
        u = ds.createVariable("u", str, ("f_t",))
        u[...] = np.array(["f0.nc", "absent.nc"], object)
        ident = ds.createVariable("ident", str, ())
        ident[0] = "v"
        v = ds.createVariable("v", "i1", ())
        v._Unsigned = "true"
        v.setncatts(attrs)
        v.aggregated_dimensions = "t"
        v.aggregated_data = "map: m uris: u identifiers: ident"
    return agg


def test_masked_unsigned_without_fill_value_refused(tmp_path):
    """Without a _FillValue (or missing_value), netCDF4-python reads no value of an _Unsigned variable as
    missing: masked points (here a missing fragment) are refused, not unmasked."""
    agg = _unsigned_aggregation(tmp_path)
    with pytest.warns(daskcfa.CFAWarning), daskcfa.open_cfa(str(agg), missing="fill") as ds:
        assert ds["v"][...].tolist() == [200, 3, None, None]
        with pytest.raises(daskcfa.FragmentError, match="without _FillValue or missing_value"):
            daskcfa.to_cfa(ds, str(tmp_path / "out.nc"))
    assert not (tmp_path / "out.nc").exists()


def test_masked_unsigned_with_a_missing_value_stored_as_it(tmp_path):
    """An _Unsigned variable with a ``missing_value`` (-1: 255 unsigned) and no _FillValue: masked points
    are stored as the missing value, as netCDF4-python stores them, and read back masked by daskcfa and
    by netCDF4-python from the fragment. (Before: refused as if there were no missing value.)"""
    agg = _unsigned_aggregation(tmp_path, missing_value=np.int8(-1))
    out = tmp_path / "out" / "out.nc"
    with pytest.warns(daskcfa.CFAWarning), daskcfa.open_cfa(str(agg), missing="fill") as ds:
        daskcfa.to_cfa(ds, str(out), fragment_shape={"t": 4})
    got = daskcfa.from_cfa(str(out)).compute()
    assert got.tolist() == [200, 3, None, None] and got.dtype == np.uint8
    fragments = sorted((tmp_path / "out").rglob("*.nc"))
    fragments.remove(out)
    with netCDF4.Dataset(str(fragments[0])) as nc:
        assert nc["v"][:].tolist() == [200, 3, None, None]
        nc.set_auto_mask(False)
        assert nc["v"][:].tolist() == [200, 3, 255, 255]


# ---------------------------------------------------------------------------
# Absolute URIs and fragment Conventions (issue 13 item 14)
# ---------------------------------------------------------------------------
def test_uris_absolute_local_and_s3(tmp_path, s3_server, s3_bucket, other_cwd):
    # issue 13 item 14: absolute fragment URIs on request; the default stays relative
    x = truth()
    url = write(x, tmp_path / "out" / "t.nc", uris="absolute")
    uris = sorted(daskcfa.read_aggregation(url).fragments.locations())
    assert uris[0] == f"file://{generation(tmp_path / 'out' / 't')}/t.tas.0.0.0.nc", uris
    # S3netCDF4 takes file:// for an S3 host name: its dialects get plain absolute paths
    s3nc = write(x, tmp_path / "s3nc" / "t.nca", uris="absolute", format="CFA-0.4")
    assert sorted(daskcfa.read_aggregation(s3nc).fragments.locations())[0] == (
        f"{generation(tmp_path / 's3nc' / 't')}/t.tas.0.0.0.nc")
    (tmp_path / "out" / "t.nc").rename(tmp_path / "elsewhere.nc")  # absolute URIs need no move
    assert_matches(daskcfa.from_cfa(str(tmp_path / "elsewhere.nc")).compute(), x)
    options = s3_server.storage_options
    remote = write(x, f"s3://{s3_bucket}/abs/t.nc", storage_options=options, uris="absolute")
    first = sorted(daskcfa.read_aggregation(remote, storage_options=options).fragments.locations())[0]
    assert re.fullmatch(rf"s3://{s3_bucket}/abs/t/g-[0-9a-f]+/t\.tas\.0\.0\.0\.nc", first), first
    assert_matches(daskcfa.from_cfa(remote, storage_options=options).compute(), x)
    with pytest.raises(ValueError, match="uris must be one of"):
        write(x, tmp_path / "bad.nc", uris="Absolute")
    assert not (tmp_path / "bad.nc").exists()


def test_fragments_declare_plain_cf_conventions(tmp_path):
    # issue 13 item 14: fragments are plain CF files, whatever dialect the aggregation is in
    x = truth()
    write(x, tmp_path / "a.nc")
    with netCDF4.Dataset(generation(tmp_path / "a") / "a.tas.0.0.0.nc") as nc:
        assert nc.Conventions == "CF-1.13"
    converted = write(x, tmp_path / "b.nc", format="CFA-0.5")
    with daskcfa.open_cfa(converted) as ds:
        assert "CFA-0.5" in ds.attrs["Conventions"]
        daskcfa.to_cfa(ds, str(tmp_path / "c.nc"), fragment_shape={"time": 3})
    with netCDF4.Dataset(generation(tmp_path / "c") / "c.tas.0.0.0.nc") as nc:
        assert "CFA" not in nc.Conventions and nc.Conventions.startswith("CF-")


# ---------------------------------------------------------------------------
# Generations: overwrites never touch the committed fragments (issue 14)
# ---------------------------------------------------------------------------
@pytest.mark.usefixtures("one_version")
def test_overwrite_retires_the_old_generation_and_leaves_no_orphans(tmp_path):
    target = tmp_path / "t.nc"
    old = daskcfa.from_cfa(write(truth(seed=1), target, fragment_shape=(1, 1, 6)))  # 28 fragments
    new = truth(seed=2)
    write(new, target, mode="w", fragment_shape=(4, 4, 6))  # 2 fragments
    assert len(stamps(tmp_path / "t")) == 2  # the 28 of the old generation are gone, with their markers
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [".daskcfa", generation(tmp_path / "t").name]
    assert_matches(daskcfa.from_cfa(str(target)).compute(), new)
    with pytest.raises(daskcfa.MissingFragmentError, match="overwritten or updated since it was opened"):
        old.compute()  # a reader of the replaced dataset: a clear error, never the new values


@pytest.mark.usefixtures("one_version")
def test_keep_previous_leaves_old_readers_a_grace_period(tmp_path):
    target = tmp_path / "t.nc"
    old = daskcfa.from_cfa(write(truth(seed=1), target))
    write(truth(seed=2), target, mode="w", keep_previous=0.5)
    assert_matches(old.compute(), truth(seed=1))  # the old generation is still there
    assert len(list((tmp_path / "t").glob("g-*"))) == 2
    retired = json.loads((tmp_path / "t" / ".daskcfa" / "retired.json").read_text())["retired"]
    assert len(retired) == 6
    time.sleep(0.6)
    write(truth(seed=3), target, mode="w")  # the first commit after the grace period deletes it
    assert len(stamps(tmp_path / "t")) == 6
    assert_matches(daskcfa.from_cfa(str(target)).compute(), truth(seed=3))


def test_delayed_update_refused_when_the_target_changed_meanwhile(tmp_path):
    x = truth()
    target = tmp_path / "u.nc"
    write(x, target, format="CFA-0.6.2")
    late = daskcfa.to_cfa(x[:3] + 1, str(target), mode="r+", region={"time": slice(0, 3)}, format="CFA-0.6.2",
                          compute=False)
    daskcfa.to_cfa(x[3:6] + 2, str(target), mode="r+", region={"time": slice(3, 6)}, format="CFA-0.6.2")
    with pytest.raises(daskcfa.WriteConflictError, match="changed by another writer"):
        late.compute()  # it would drop the other update's region
    expected = x.copy()
    expected[3:6] += 2
    assert_matches(daskcfa.from_cfa(str(target)).compute(), expected)


def test_second_writer_fails_fast_naming_the_holder(tmp_path):
    target = tmp_path / "t.nc"
    holder = Lease.new(str(target), NO_PROFILE).acquire()
    with pytest.raises(daskcfa.WriteConflictError, match=r"another writer holds the target: a write by process \d+"):
        write(truth(), target, mode="w")
    assert not target.exists() and not (tmp_path / "t").exists()  # nothing written
    holder.release()
    write(truth(), target, mode="w")


def test_changed_remote_source_is_rewritten(tmp_path, s3_server, s3_bucket):
    """Resume identity carries the source's version: converting again after the S3 source was
    rewritten stores the new values (it used to skip every fragment and keep the old ones)."""
    options = s3_server.storage_options
    source, target = f"s3://{s3_bucket}/src/s.nc", tmp_path / "t.nc"
    write(truth(seed=1), source, storage_options=options)
    with daskcfa.open_cfa(source, storage_options=options) as ds:
        daskcfa.to_cfa(ds, str(target))
    write(truth(seed=2), source, storage_options=options, mode="w")
    with daskcfa.open_cfa(source, storage_options=options) as ds:
        daskcfa.to_cfa(ds, str(target), mode="w")
    assert_matches(daskcfa.from_cfa(str(target)).compute(), truth(seed=2))


def test_resume_identity_is_the_same_in_a_new_process(tmp_path, s3_server, s3_bucket):
    """A rerun in a new process (the usual case after a crash) plans the same generation, so it
    resumes; the storage profile's per-process name is not part of it."""
    options = s3_server.storage_options
    source = f"s3://{s3_bucket}/src/s.nc"
    write(truth(seed=1), source, storage_options=options)
    code = (f"import json, sys, daskcfa\n"
            f"ds = daskcfa.open_cfa({source!r}, storage_options=json.loads(sys.stdin.read()))\n"
            f"d = daskcfa.to_cfa(ds, {str(tmp_path / 't.nc')!r}, compute=False)\n"
            "print([str(k) for k in d.dask if str(k).startswith('cfa-begin-')][0])\n")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(options), capture_output=True, text=True,
                         check=True).stdout.strip()
    with daskcfa.open_cfa(source, storage_options=options) as ds:
        here = planned_generation(daskcfa.to_cfa(ds, str(tmp_path / "t.nc"), compute=False))
    assert out.endswith(here)


def test_overwrite_never_deletes_files_outside_the_dataset(tmp_path):
    """The replaced aggregation file may point anywhere (here: another dataset's generation, as
    ``aggregate`` made it): only fragments inside the target's own directory are retired."""
    x = truth(seed=1)
    write(x, tmp_path / "src" / "t.nc")
    theirs = sorted(generation(tmp_path / "src" / "t").glob("*.nc"))
    target = tmp_path / "other" / "t.nc"
    daskcfa.aggregate([str(p) for p in theirs], str(target))
    write(truth(seed=2), target, mode="w")
    assert all(p.exists() for p in theirs)
    assert_matches(daskcfa.from_cfa(str(tmp_path / "src" / "t.nc")).compute(), x)
    assert_matches(daskcfa.from_cfa(str(target)).compute(), truth(seed=2))


def test_a_failed_write_leaves_no_lease_behind(tmp_path):
    """When one task fails, compute() raises while the write's other tasks may still run: the lease
    must not be taken by a task that runs after the caller released it (it was: a retry in the same
    process then met "another writer holds the target" for the lease's whole lifetime)."""
    def boom(block):
        raise RuntimeError("the input cannot be computed")

    good = da.ones((6, 4), chunks=(2, 4), dtype="f4")
    for attempt in range(5):
        target = tmp_path / f"t{attempt}.nca"
        bad = good.map_blocks(boom, dtype="f4")
        with pytest.raises(RuntimeError, match="cannot be computed"):
            daskcfa.to_cfa(bad, str(target), variable="v", dims=("a", "b"), fragment_shape=(2, 4))
        time.sleep(0.2)  # (time for tasks left running by the failed computation to finish)
        assert not (tmp_path / f".t{attempt}.nca.lease").exists()
        daskcfa.to_cfa(good, str(target), variable="v", dims=("a", "b"), fragment_shape=(2, 4))
        assert daskcfa.from_cfa(str(target)).compute().sum() == 24


def test_commits_are_logged_with_fragments_written_and_resumed(tmp_path, caplog):
    data = np.arange(24, dtype="f4").reshape(4, 6)
    url = str(tmp_path / "t.nca")
    caplog.set_level(logging.INFO, logger="daskcfa")
    for mode in ("w-", "w"):  # the same write again: every fragment verified and kept
        daskcfa.to_cfa(data, url, variable="v", dims=("time", "x"), fragment_shape=(1, 6), mode=mode)
    commits = [r.getMessage() for r in caplog.records if r.name == "daskcfa.storage.publish"]
    assert len(commits) == 2 and all(m.startswith(f"committed aggregation file {url} (generation g-") for m in commits)
    assert "4 fragments written, 0 resumed" in commits[0] and "0 fragments written, 4 resumed" in commits[1]
    assert "mode 'w-')" in commits[0] and "mode 'w')" in commits[1]


@pytest.mark.parametrize("compression", [{"compression": "bogus"}, {"zlib": True, "complevel": "x"}])
def test_compression_netcdf_c_refuses_is_refused_before_writing(tmp_path, compression):
    """The fragments' shared chunk shape is asked of netCDF-C when the graph is built: settings it
    refuses are an ArgumentError then, naming the variable, before any fragment is written."""
    with pytest.raises(daskcfa.ArgumentError, match=r"compression .* is refused by netCDF4-python/netCDF-C") as info:
        daskcfa.to_cfa(np.ones((5, 4), "f4"), str(tmp_path / "b.nc"), variable="v", dims=("t", "x"),
                       fragment_shape=(2, 4), compression=compression)
    assert info.value.variable == "/v"
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.nc").exists()
