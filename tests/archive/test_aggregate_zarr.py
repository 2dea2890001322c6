"""``daskcfa.aggregate`` (and ``verify``, ``describe``, ``refragment``) over Zarr stores and
fsspec reference sets: Zarr v2 and v3 (zarr-python, xarray), netCDF-C's NCZarr (netCDF4-python),
kerchunk's JSON reference sets, mixed with netCDF files, locally and on the S3 test server;
every aggregation read back equal to numpy ground truth."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_matches
from daskcfa.errors import AggregationError

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

pytestmark = [pytest.mark.usefixtures("other_cwd"), pytest.mark.filterwarnings("ignore::UserWarning")]

DIMS = ("time", "lat", "lon")
LAT = np.array([-45.0, 0.0, 45.0])
LON = np.array([0.0, 90.0, 180.0, 270.0])
STEPS = 3  # time steps per source
FILL = np.float32(-1e20)
TIME_ATTRS = {"units": "days since 2000-01-01", "calendar": "standard", "standard_name": "time"}


def _truth(n: int) -> np.ma.MaskedArray:
    rng = np.random.default_rng(5)
    data = rng.uniform(200, 320, size=(n * STEPS, len(LAT), len(LON))).astype("f4")
    return np.ma.masked_array(data, mask=rng.uniform(size=data.shape) < 0.15)


def _times(k: int) -> np.ndarray:
    return np.arange(k * STEPS, (k + 1) * STEPS, dtype="f8")


def _netcdf(path: Path, k: int, block: np.ma.MaskedArray) -> str:
    with netCDF4.Dataset(str(path), "w") as nc:
        nc.title = "zarr sources"
        for dim, n in zip(DIMS, block.shape):
            nc.createDimension(dim, n)
        for name, values, attrs in (("time", _times(k), TIME_ATTRS), ("lat", LAT, {"units": "degrees_north"}),
                                    ("lon", LON, {"units": "degrees_east"})):
            var = nc.createVariable(name, "f8", (name,))
            var.setncatts(attrs)
            var[...] = values
        var = nc.createVariable("tas", "f4", DIMS, fill_value=FILL, zlib=True)
        var.units = "K"
        var[...] = block
    return path.name


def _coordinates(array_attrs: dict, k: int) -> list[tuple[str, np.ndarray, dict]]:
    return [("time", _times(k), TIME_ATTRS), ("lat", LAT, {"units": "degrees_north"}),
            ("lon", LON, {"units": "degrees_east"})]


def _zarr(fmt: int):
    """A store written by zarr-python alone: v2 with ``_ARRAY_DIMENSIONS``, v3 with ``dimension_names``."""
    def write(path: Path, k: int, block: np.ma.MaskedArray) -> str:
        group = zarr.open_group(str(path), mode="w", zarr_format=fmt, attributes={"title": "zarr sources"})
        for name, values, attrs in _coordinates({}, k):
            dims = {"dimension_names": [name]} if fmt == 3 else {}
            attrs = attrs if fmt == 3 else {"_ARRAY_DIMENSIONS": [name], **attrs}
            group.create_array(name, shape=values.shape, dtype="f8", attributes=attrs, **dims)[...] = values
        dims = {"dimension_names": list(DIMS)} if fmt == 3 else {}
        attrs = {"units": "K"} if fmt == 3 else {"_ARRAY_DIMENSIONS": list(DIMS), "units": "K"}
        if fmt == 3:
            attrs["_FillValue"] = float(FILL)
        array = group.create_array("tas", shape=block.shape, dtype="f4", fill_value=FILL, attributes=attrs,
                                   chunks=(1,) + block.shape[1:], **dims)
        array[...] = block.filled(FILL)
        return path.name
    return write


def _xarray(fmt: int):
    def write(path: Path, k: int, block: np.ma.MaskedArray) -> str:
        ds = xr.Dataset({"tas": (DIMS, block.filled(np.nan), {"units": "K"})},
                        coords={"time": ("time", _times(k), TIME_ATTRS), "lat": ("lat", LAT, {"units": "degrees_north"}),
                                "lon": ("lon", LON, {"units": "degrees_east"})}, attrs={"title": "zarr sources"})
        ds.time.encoding = {"units": TIME_ATTRS["units"], "calendar": "standard"}
        ds.to_zarr(str(path), zarr_format=fmt, mode="w")
        return path.name
    return write


def _nczarr(path: Path, k: int, block: np.ma.MaskedArray) -> str:
    """NCZarr, written by netCDF-C (netCDF4-python's bundled library)."""
    _netcdf_into(f"file://{path}#mode=nczarr,file", k, block)
    return f"{path.name}#mode=nczarr,file"


def _netcdf_into(url: str, k: int, block: np.ma.MaskedArray) -> None:
    with netCDF4.Dataset(url, "w") as nc:
        nc.title = "zarr sources"
        for dim, n in zip(DIMS, block.shape):
            nc.createDimension(dim, n)
        for name, values, attrs in _coordinates({}, k):
            var = nc.createVariable(name, "f8", (name,))
            var.setncatts(attrs)
            var[...] = values
        var = nc.createVariable("tas", "f4", DIMS, fill_value=FILL)
        var.units = "K"
        var[...] = block


def _reference_set(path: Path, k: int, block: np.ma.MaskedArray) -> str:
    """kerchunk's JSON references into a netCDF-4 file kept in a subdirectory."""
    kerchunk_hdf = pytest.importorskip("kerchunk.hdf")
    data = path.parent / "referenced"
    data.mkdir(exist_ok=True)
    target = data / f"{path.stem}.nc"
    _netcdf(target, k, block)
    refs = kerchunk_hdf.SingleHdf5ToZarr(str(target), url=f"referenced/{target.name}").translate()
    path.with_suffix(".json").write_text(json.dumps(refs))
    return path.with_suffix(".json").name


WRITERS = {"netcdf": lambda p, k, b: _netcdf(p.with_suffix(".nc"), k, b), "zarr-v2": _zarr(2), "zarr-v3": _zarr(3),
           "xarray-v2": _xarray(2), "xarray-v3": _xarray(3), "nczarr": _nczarr, "references": _reference_set}


def _sources(directory: Path, kinds: list[str]) -> tuple[list[str], np.ma.MaskedArray]:
    """One source per kind, in time order (named in reverse so that order comes from the coordinates)."""
    directory.mkdir(parents=True, exist_ok=True)
    truth = _truth(len(kinds))
    names = []
    for k, kind in enumerate(kinds):
        block = truth[k * STEPS:(k + 1) * STEPS]
        names.append(WRITERS[kind](directory / f"s{len(kinds) - k}.zarr", k, block))
    return names, truth


def _placed(directory: Path, names: list[str], where: str, request) -> tuple[list[str], str, dict | None]:
    """Source URLs and the aggregation's URL, local or on the S3 test server (the directory uploaded)."""
    if where == "local":
        return [str(directory / n) for n in names], str(directory.parent / "agg.nc"), None
    server = request.getfixturevalue("s3_server")
    bucket = server.new_bucket()
    server.filesystem().put(str(directory) + "/", f"{bucket}/src/", recursive=True)
    return ([f"s3://{bucket}/src/{n.replace('#mode=nczarr,file', '#mode=nczarr,s3')}" for n in names],
            f"s3://{bucket}/agg.nc", server.storage_options)


def _check(url: str, truth: np.ma.MaskedArray, options: dict | None) -> None:
    assert_matches(daskcfa.from_cfa(url, "tas", storage_options=options).compute(), truth)
    with daskcfa.open_cfa(url, storage_options=options) as ds:
        np.testing.assert_array_equal(ds["time"][...], np.arange(truth.shape[0], dtype="f8"))
        np.testing.assert_array_equal(ds["lat"][...], LAT)
        assert ds.attrs["title"] == "zarr sources"
        assert ds["tas"].attrs["units"] == "K"


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("kind", ["zarr-v2", "zarr-v3", "xarray-v2", "xarray-v3", "nczarr", "references"])
def test_zarr_sources_aggregate_and_read_equal_to_the_ground_truth(tmp_path, request, where, kind):
    names, truth = _sources(tmp_path / "src", [kind] * 3)
    sources, target, options = _placed(tmp_path / "src", names, where, request)
    url = daskcfa.aggregate(sources, target, storage_options=options)
    _check(url, truth, options)
    agg = daskcfa.read_aggregation(url, "tas", storage_options=options)
    assert agg.fragments.grid.grid_shape == (3, 1, 1)
    first = agg.fragments[(0, 0, 0)].uris[0]  # (the earliest data, given first, named last)
    assert first == f"src/{sources[0].rsplit('/src/', 1)[1]}"  # (relative, as for files)
    if kind == "nczarr":  # netCDF-C's storage mode kept in the reference
        assert "#mode=nczarr," in first


@pytest.mark.parametrize("where", ["local", "s3"])
def test_netcdf_and_zarr_sources_mixed_in_one_aggregation(tmp_path, request, where):
    kinds = ["netcdf", "zarr-v3", "xarray-v2", "nczarr", "references", "zarr-v2"]
    names, truth = _sources(tmp_path / "src", kinds)
    sources, target, options = _placed(tmp_path / "src", names, where, request)
    url = daskcfa.aggregate(sources[::-1], target, storage_options=options)
    _check(url, truth, options)
    report = daskcfa.verify(url, deep=True, storage_options=options)
    assert report.ok and report.checked == len(kinds), str(report)
    summary = daskcfa.describe(url, storage_options=options, storage_size=True)
    assert summary.stored_bytes > truth.nbytes // 4 and not summary.missing_files


def test_a_directory_lists_its_stores_and_a_store_is_one_source(tmp_path):
    """A directory contributes its netCDF files and Zarr stores (never the files inside a store);
    a ``.zarr`` directory named on its own is one source; a glob matches stores."""
    names, truth = _sources(tmp_path / "src", ["netcdf", "zarr-v2", "xarray-v3", "zarr-v3"])
    (tmp_path / "src" / "notes.json").write_text("{}")  # (JSON files in a directory are not sources)
    url = daskcfa.aggregate(str(tmp_path / "src"), str(tmp_path / "agg.nc"))
    _check(url, truth, None)
    assert daskcfa.read_aggregation(url, "tas").fragments.grid.grid_shape == (4, 1, 1)
    url = daskcfa.aggregate(str(tmp_path / "src" / "*.zarr"), str(tmp_path / "globbed.nc"))
    assert_matches(daskcfa.from_cfa(url, "tas").compute(), truth[STEPS:])
    one = daskcfa.aggregate(str(tmp_path / "src" / names[1]), str(tmp_path / "one.nc"))
    assert_matches(daskcfa.from_cfa(one, "tas").compute(), truth[STEPS:2 * STEPS])


def test_nczarr_source_given_as_a_file_url_keeps_its_mode(tmp_path):
    _, truth = _sources(tmp_path / "src", ["nczarr", "nczarr"])
    sources = [f"file://{tmp_path}/src/s{k}.zarr#mode=nczarr,file" for k in (1, 2)]
    url = daskcfa.aggregate(sources, str(tmp_path / "agg.nc"), uris="absolute")
    uris = set(daskcfa.read_aggregation(url, "tas").fragments.uris.ravel())
    assert uris == {f"file://{tmp_path}/src/s{k}.zarr#mode=nczarr,file" for k in (1, 2)}
    _check(url, truth, None)


@pytest.mark.parametrize("damage", ["group-metadata", "array-metadata", "dimensions"])
def test_store_with_garbage_metadata_is_an_error_naming_the_store(tmp_path, damage):
    _sources(tmp_path / "src", ["zarr-v2", "zarr-v2"])
    store = tmp_path / "src" / "s1.zarr"
    if damage == "group-metadata":
        (store / ".zgroup").write_text("\x00garbage{")
    elif damage == "array-metadata":
        (store / "tas" / ".zarray").write_text('{"zarr_format": 2, "shape": "many"}')
    else:
        (store / "tas" / ".zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["time"]}))
    with pytest.raises(AggregationError) as info:
        daskcfa.aggregate(str(tmp_path / "src"), str(tmp_path / "agg.nc"))
    assert "s1.zarr" in str(info.value)  # (zarr-python lists no array whose metadata it cannot read: "missing")
    assert not (tmp_path / "agg.nc").exists()


def test_missing_store_is_an_error_naming_it(tmp_path):
    _sources(tmp_path / "src", ["zarr-v3"])
    with pytest.raises(AggregationError, match="gone.zarr"):
        daskcfa.aggregate([str(tmp_path / "src" / "s1.zarr"), str(tmp_path / "src" / "gone.zarr")],
                          str(tmp_path / "agg.nc"))


def test_refragment_zarr_sources_into_netcdf_and_into_zarr(tmp_path):
    names, truth = _sources(tmp_path / "src", ["zarr-v2", "nczarr", "xarray-v3"])
    sources = [str(tmp_path / "src" / n) for n in names]
    for fragment_format in ("NETCDF4", "zarr"):
        url = daskcfa.refragment(sources, str(tmp_path / f"{fragment_format}.nc"), fragment_format=fragment_format,
                                 fragment_shape={"time": 9, "lat": 1, "lon": 4})
        assert daskcfa.read_aggregation(url, "tas").fragments.grid.grid_shape == (1, 3, 1)
        _check(url, truth, None)
    one = daskcfa.refragment(sources[0], str(tmp_path / "one.nc"), fragment_shape={"lat": 1})
    assert_matches(daskcfa.from_cfa(one, "tas").compute(), truth[:STEPS])


def test_verify_finds_a_damaged_store(tmp_path):
    names, _ = _sources(tmp_path / "src", ["zarr-v3", "zarr-v3"])
    url = daskcfa.aggregate([str(tmp_path / "src" / n) for n in names], str(tmp_path / "agg.nc"))
    assert daskcfa.verify(url, deep=True).ok
    for chunk in (tmp_path / "src" / "s1.zarr" / "tas" / "c").rglob("*"):
        if chunk.is_file():
            chunk.write_bytes(b"\x00" * 3)
    report = daskcfa.verify(url, deep=True)
    assert [(p.index, p.kind) for p in report.problems] == [((1, 0, 0), "corrupt")]
    shutil.rmtree(tmp_path / "src" / "s1.zarr")
    report = daskcfa.verify(url)
    assert [(p.index, p.kind) for p in report.problems] == [((1, 0, 0), "missing")]
    assert daskcfa.describe(url, storage_size=True).missing_files


def test_rebuild_from_zarr_fragments(tmp_path):
    """``rebuild`` places the writer's Zarr fragments by their names (``t.tas.1.0.0.zarr``), as
    it does netCDF ones; the stores' own files are never taken for fragments."""
    x = _truth(2)
    url = daskcfa.to_cfa(x, str(tmp_path / "t.nc"), variable="tas", dims=DIMS, attrs={"units": "K"},
                         fragment_shape=(STEPS, 1, 4), fragment_format="zarr")
    (tmp_path / "t.nc").unlink()
    rebuilt = daskcfa.rebuild(str(tmp_path / "t"), str(tmp_path / "again.nc"))
    assert daskcfa.read_aggregation(rebuilt, "tas").fragments.grid.grid_shape == (2, 3, 1)
    assert_matches(daskcfa.from_cfa(rebuilt, "tas").compute(), x)
    assert url.endswith("t.nc")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_reference_set_fragment_keeps_its_chunks(tmp_path, request, where):
    """kerchunk's reference set of a 100-chunk netCDF-4 array, given to ``aggregate`` as the one
    source: one dask chunk per chunk of the set (not one chunk of the whole array), right values."""
    kerchunk_hdf = pytest.importorskip("kerchunk.hdf")
    directory = tmp_path / "src"
    (directory / "referenced").mkdir(parents=True)
    truth = _truth(100 // STEPS + 1)[:100]
    target = directory / "referenced" / "big.nc"
    with netCDF4.Dataset(str(target), "w") as nc:
        for dim, n in zip(DIMS, truth.shape):
            nc.createDimension(dim, n)
        for name, values, attrs in (("time", np.arange(100.0), TIME_ATTRS), ("lat", LAT, {}), ("lon", LON, {})):
            nc.createVariable(name, "f8", (name,))[...] = values
            nc[name].setncatts(attrs)
        var = nc.createVariable("tas", "f4", DIMS, fill_value=FILL, zlib=True, chunksizes=(1, 3, 4))
        var.units = "K"
        var[...] = truth
    refs = kerchunk_hdf.SingleHdf5ToZarr(str(target), inline_threshold=0).translate()
    refs["refs"] = {k: ["referenced/big.nc", *v[1:]] if isinstance(v, list) else v for k, v in refs["refs"].items()}
    (directory / "big.json").write_text(json.dumps(refs))
    sources, agg, options = _placed(directory, ["big.json"], where, request)
    url = daskcfa.aggregate(sources, agg, storage_options=options)
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    assert daskcfa.read_aggregation(url, "tas", storage_options=options).fragments.grid.nfragments == 1
    assert x.numblocks == (100, 1, 1) and x.chunks[0] == (1,) * 100
    assert_matches(x.compute(), truth)
    assert_matches(x[37:41, 1:, ::2].compute(), truth[37:41, 1:, ::2])
    assert daskcfa.from_cfa(url, "tas", chunks="fragments", storage_options=options).numblocks == (100, 1, 1)
