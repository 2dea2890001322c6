"""Fragments written as Zarr stores (``to_cfa(..., fragment_format="zarr")``, the writer in
``daskcfa.fragments.write``): read back with ``from_cfa``, by xarray and by netCDF-C's NCZarr
equal to numpy ground truth, locally and on the S3 test server; failed and killed writes resume;
retired stores are deleted whole."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import dask.array as da
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, make_truth

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

DIMS = ("time", "lat", "lon")
SHAPE = (7, 4, 6)
COORDS = {"time": (np.arange(7.0), {"units": "days since 2000-01-01", "standard_name": "time"}),
          "lat": (np.linspace(-45, 45, 4), {"units": "degrees_north"}), "lon": np.arange(0.0, 360.0, 60.0)}
ATTRS = {"units": "K", "standard_name": "air_temperature", "_FillValue": np.float32(-1e20)}
GRID = (3, 2, 6)


def truth(dtype="f4") -> np.ma.MaskedArray:
    return make_truth(SHAPE, dtype, masked=0.15, seed=3)


def write(x, url, **kw):
    kw = {"variable": "tas", "dims": DIMS, "attrs": ATTRS, "coords": COORDS, "fragment_shape": GRID,
          "fragment_format": "zarr", **kw}
    return daskcfa.to_cfa(x, str(url), **kw)


def stores(directory: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every store's consolidated metadata: a rewritten store has new ones."""
    return {p.parent.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.glob("g-*/*.zarr/.zmetadata")}


def _slices(index):
    return tuple(slice(i * g, (i + 1) * g) for i, g in zip(index, GRID))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_zarr_fragments_round_trip(tmp_path, request, where):
    x = truth()
    if where == "local":
        url, options = str(tmp_path / "t.nc"), None
    else:
        server = request.getfixturevalue("s3_server")
        url, options = f"s3://{server.new_bucket()}/run/t.nc", server.storage_options
    write(da.from_array(x, chunks=(2, 4, 6)), url, compression={"zlib": True, "complevel": 6}, storage_options=options)
    assert_matches(daskcfa.from_cfa(url, "tas", storage_options=options).compute(), x)
    agg = daskcfa.read_aggregation(url, "tas", storage_options=options)
    assert agg.fragments.grid.grid_shape == (3, 2, 1)
    reference = agg.fragments[(1, 1, 0)].uris[0]
    assert reference.startswith("t/g-") and reference.endswith("/t.tas.1.1.0.zarr")
    if where == "s3":
        fs = request.getfixturevalue("s3_server").filesystem()
        fs.get(url.rsplit("/", 1)[0][len("s3://"):] + "/t/", str(tmp_path / "t"), recursive=True)
        assert fs.exists(f"{url.rsplit('/', 1)[0][len('s3://'):]}/{reference}/.zmetadata")
    store = tmp_path / reference
    meta = json.loads((store / ".zmetadata").read_text())["metadata"]
    assert meta["tas/.zarray"]["compressor"] == {"id": "zlib", "level": 6}
    assert meta["tas/.zarray"]["filters"] == [{"id": "shuffle", "elementsize": 4}]
    where_ = _slices((1, 1, 0))
    with xr.open_zarr(str(store)) as ds:  # xarray alone: dimension names, coordinates, fill value
        assert ds["tas"].dims == DIMS and ds.attrs["Conventions"].startswith("CF-")
        np.testing.assert_array_equal(ds["lat"].values, COORDS["lat"][0][where_[1]])
        assert_matches(np.ma.masked_invalid(ds["tas"].values), x[where_])


def test_zarr_fragment_read_by_netcdf_c(tmp_path):
    """netCDF-C's NCZarr (netCDF4-python's bundled library) reads a fragment: dimensions,
    coordinates, values and the mask (by its _FillValue, in the variable's type)."""
    x = truth()
    write(x, tmp_path / "t.nc", compression="zlib")
    store = next((tmp_path / "t").glob("g-*/t.tas.2.0.0.zarr"))
    for mode in ("zarr", "nczarr"):
        try:
            nc = netCDF4.Dataset(f"file://{store}#mode={mode},file")
        except OSError as exc:
            pytest.skip(f"the bundled netCDF-C does not read Zarr ({exc})")
        with nc:
            assert nc["tas"].dimensions == DIMS and nc["tas"].dtype == np.float32
            assert nc["tas"].getncattr("_FillValue") == ATTRS["_FillValue"]
            np.testing.assert_array_equal(nc["time"][:], [6.0])
            assert_matches(nc["tas"][...], x[_slices((2, 0, 0))])


def test_packed_fragments_from_xarray(tmp_path):
    """xarray's encoding packs each fragment (int16, scale_factor, add_offset, _FillValue): the
    stores hold the packed integers and read back unpacked."""
    x = truth("f8")
    ds = xr.Dataset({"tas": (DIMS, np.ma.filled(x, np.nan), {"units": "K"})})
    ds.tas.encoding = {"dtype": "int16", "scale_factor": 0.01, "add_offset": 250.0, "_FillValue": -32767}
    url = daskcfa.to_cfa(ds.chunk({"time": 3}), str(tmp_path / "t.nc"), fragment_shape={"time": 3},
                         fragment_format="zarr")
    assert_matches(daskcfa.from_cfa(url, "tas").compute(), x, atol=0.006, rtol=0)
    store = next((tmp_path / "t").glob("g-*/t.tas.0.0.0.zarr"))
    assert json.loads((store / "tas" / ".zarray").read_text())["dtype"] == "<i2"
    with xr.open_zarr(str(store)) as back:
        assert_matches(np.ma.masked_invalid(back["tas"].values), x[:3], atol=0.006, rtol=0)


def _failing(x: np.ma.MaskedArray, flag: Path) -> da.Array:
    def block(b, block_info=None):
        location = block_info[0]["array-location"]
        if flag.exists() and location[0][0] == 3 and location[1][0] == 2:
            raise RuntimeError("sensor offline")
        return b
    return da.from_array(x, chunks=GRID).map_blocks(block, dtype=x.dtype)


def test_failed_write_resumes_without_rewriting_finished_stores(tmp_path, sync_dask):
    x, flag = truth(), tmp_path / "fail"
    flag.touch()
    with pytest.raises(RuntimeError, match="sensor offline"):
        write(_failing(x, flag), tmp_path / "t.nc")
    before = stores(tmp_path / "t")
    assert 0 < len(before) < 6 and not (tmp_path / "t.nc").exists()
    assert not list((tmp_path / "t").rglob(".*.part"))  # (the failed store's temporary removed)
    flag.unlink()
    write(_failing(x, flag), tmp_path / "t.nc")
    after = stores(tmp_path / "t")
    assert len(after) == 6 and {k: after[k] for k in before} == before
    assert_matches(daskcfa.from_cfa(str(tmp_path / "t.nc"), "tas").compute(), x)


def test_killed_write_leftovers_are_rewritten_or_removed(tmp_path):
    """A writer killed mid-store leaves a temporary directory (removed at the commit); one killed
    between the rename and its marker leaves a finished store without a marker (rewritten);
    a store whose consolidated metadata is gone is unfinished (rewritten)."""
    x = truth()
    write(x, tmp_path / "t.nc")
    generation = next((tmp_path / "t").glob("g-*"))
    (generation / ".daskcfa" / "t.tas.0.0.0.zarr.json").unlink()  # killed before the marker
    (generation / "t.tas.1.0.0.zarr" / ".zmetadata").unlink()  # unfinished
    stale = generation / ".t.tas.2.0.0.zarr.0123456789abcdef0123456789abcdef.part"
    (stale / "tas").mkdir(parents=True)
    (stale / "tas" / "0.0.0").write_bytes(b"partial")
    before = stores(tmp_path / "t")
    write(x, tmp_path / "t.nc", mode="w")
    after = stores(tmp_path / "t")
    assert after["t.tas.0.0.0.zarr"] != before["t.tas.0.0.0.zarr"] and "t.tas.1.0.0.zarr" in after
    assert {k: v for k, v in after.items() if k not in ("t.tas.0.0.0.zarr", "t.tas.1.0.0.zarr")} == \
        {k: v for k, v in before.items() if k != "t.tas.0.0.0.zarr"}
    assert not stale.exists()
    assert_matches(daskcfa.from_cfa(str(tmp_path / "t.nc"), "tas").compute(), x)


def test_interrupted_upload_is_rewritten_on_s3(tmp_path, s3_server, sync_dask):
    """On S3 a store is a prefix: objects an interrupted upload left (no consolidated metadata)
    are removed and the store written again; the finished stores are kept."""
    bucket = s3_server.new_bucket()
    fs, options = s3_server.filesystem(), s3_server.storage_options
    x, flag = truth(), tmp_path / "fail"
    url = f"s3://{bucket}/t.nc"
    flag.touch()
    with pytest.raises(RuntimeError):
        write(_failing(x, flag), url, storage_options=options)
    done = {p: fs.info(p)["LastModified"] for p in fs.find(f"{bucket}/t") if p.endswith("/.zmetadata")}
    assert 0 < len(done) < 6
    generation = next(iter(done)).split("/")[2]
    partial = f"{bucket}/t/{generation}/t.tas.1.1.0.zarr"
    assert not fs.exists(f"{partial}/.zmetadata")
    fs.pipe({f"{partial}/tas/0.0.0": b"junk", f"{partial}/tas/9.9.9": b"junk"})  # an upload killed part-way
    time.sleep(1.1)  # (S3 times have 1 s resolution)
    flag.unlink()
    write(_failing(x, flag), url, storage_options=options)
    again = {p: fs.info(p)["LastModified"] for p in fs.find(f"{bucket}/t") if p.endswith("/.zmetadata")}
    assert len(again) == 6 and {p: again[p] for p in done} == done
    assert not fs.exists(f"{partial}/tas/9.9.9")
    assert_matches(daskcfa.from_cfa(url, "tas", storage_options=options).compute(), x)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_retired_zarr_fragments_are_deleted_whole(tmp_path, request, where, one_version):
    if where == "local":
        url, options, fs, root = str(tmp_path / "t.nc"), None, None, tmp_path
    else:
        server = request.getfixturevalue("s3_server")
        bucket = server.new_bucket()
        url, options, fs = f"s3://{bucket}/t.nc", server.storage_options, server.filesystem()
    x = truth()
    write(x, url, storage_options=options)

    def listed() -> set[str]:
        if fs is None:
            return {str(p.relative_to(tmp_path)) for p in (tmp_path / "t").rglob("*") if p.is_file()}
        return {p.split("/", 1)[1] for p in fs.find(f"{bucket}/t")}

    first = listed()
    old = {p.split("/")[1] for p in first if p.startswith("t/g-")}
    write(x * 2, url, storage_options=options, mode="w")
    now = listed()
    assert not any(p.split("/")[1] in old for p in now if p.startswith("t/g-")), sorted(now)[:5]
    assert_matches(daskcfa.from_cfa(url, "tas", storage_options=options).compute(), x * 2)


def test_refragment_into_zarr_fragments(tmp_path):
    x = truth()
    source = daskcfa.to_cfa(x, str(tmp_path / "s.nc"), variable="tas", dims=DIMS, attrs=ATTRS, coords=COORDS,
                            fragment_shape=(1, 4, 6), compression="zlib")
    url = daskcfa.refragment(source, str(tmp_path / "r.nc"), fragment_format="zarr",
                             fragment_shape={"time": 7, "lat": 2, "lon": 3})
    assert_matches(daskcfa.from_cfa(url, "tas").compute(), x)
    store = next((tmp_path / "r").glob("g-*/r.tas.0.1.1.zarr"))
    assert json.loads((store / "tas" / ".zarray").read_text())["compressor"]["id"] == "zlib"  # (as the source)
    with xr.open_zarr(str(store)) as ds:
        assert_matches(np.ma.masked_invalid(ds["tas"].values), x[:, 2:, 3:])


@pytest.mark.parametrize("kw, message", [
    ({"compression": "zstd"}, "zlib only"),
    ({"compression": {"zlib": True, "fletcher32": True}}, "fletcher32"),
    ({"compression": {"zlib": True, "complevel": 12}}, "complevel"),
    ({"format": "CFA-0.6.2"}, "CF-1.13"),
    ({"fragment_name": "{stem}/{var}.{index}.nc"}, "must end in '.zarr'"),
])
def test_zarr_fragment_arguments_are_checked_before_anything_is_written(tmp_path, kw, message):
    with pytest.raises(daskcfa.ArgumentError, match=message):
        write(truth(), tmp_path / "t.nc", **kw)
    assert not os.path.exists(tmp_path / "t")


def test_strings_are_refused_for_zarr_fragments(tmp_path):
    words = np.array([["a", "b"], ["c", "d"]], dtype=object)
    with pytest.raises(daskcfa.ArgumentError, match="numbers only"):
        daskcfa.to_cfa(words, str(tmp_path / "w.nc"), variable="w", dims=("x", "y"), fragment_format="zarr")


def test_custom_zarr_fragment_name(tmp_path):
    url = write(truth(), tmp_path / "t.nc", fragment_name="{stem}/frag-{index}.zarr")
    assert daskcfa.read_aggregation(url, "tas").fragments[(0, 0, 0)].uris[0].endswith("/frag-0.0.0.zarr")
    assert_matches(daskcfa.from_cfa(url, "tas").compute(), truth())
