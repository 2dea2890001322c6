"""Zarr fragments (``daskcfa.fragments.zarr``): Zarr v2 and v3 stores written by zarr-python and
xarray, and netCDF-C's NCZarr, mixed with netCDF fragments in one aggregation, locally and on
the S3 test server, read equal to numpy ground truth."""

from __future__ import annotations

import json
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, build_cf113, make_truth
from remote_helpers import rewrite_uris

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (5,))
FILL = np.float32(-1e20)


def _zarr_v2(path: Path, name: str, block: np.ma.MaskedArray) -> str:
    array = zarr.create_array(str(path), name=name, shape=block.shape, dtype="f4", zarr_format=2, fill_value=FILL,
                              attributes={"_ARRAY_DIMENSIONS": list(DIMS), "units": "K"})
    array[...] = block.filled(FILL)
    return path.name


def _zarr_v3(path: Path, name: str, block: np.ma.MaskedArray) -> str:
    array = zarr.create_array(str(path), name=name, shape=block.shape, dtype=">f4", zarr_format=3,
                              chunks=(1,) + block.shape[1:], dimension_names=list(DIMS),
                              attributes={"_FillValue": float(FILL), "units": "K"})
    array[...] = block.filled(FILL)
    return path.name


def _xarray(fmt: int):
    def write(path: Path, name: str, block: np.ma.MaskedArray) -> str:
        data = block.astype("f4").filled(np.nan)
        xr.Dataset({name: (DIMS, data, {"units": "K"})}).to_zarr(str(path), zarr_format=fmt, mode="w",
                                                                consolidated=False)
        return path.name
    return write


def _xarray_packed(path: Path, name: str, block: np.ma.MaskedArray) -> str:
    ds = xr.Dataset({name: (DIMS, block.astype("f8").filled(np.nan), {"units": "K"})})
    ds[name].encoding = {"dtype": "i2", "scale_factor": 0.01, "add_offset": 260.0, "_FillValue": -32768}
    ds.to_zarr(str(path), zarr_format=3, mode="w", consolidated=False)
    return path.name


def _nczarr(path: Path, name: str, block: np.ma.MaskedArray) -> str:
    with netCDF4.Dataset(f"file://{path}#mode=nczarr,file", "w") as nc:
        for dim, n in zip(DIMS, block.shape):
            nc.createDimension(dim, n)
        var = nc.createVariable(name, "f4", DIMS, fill_value=FILL)
        var.units = "K"
        var[...] = block
    return f"{path.name}#mode=nczarr,file"


WRITERS = {"zarr-v2": _zarr_v2, "zarr-v3": _zarr_v3, "xarray-v2": _xarray(2), "xarray-v3": _xarray(3),
           "xarray-packed": _xarray_packed, "nczarr": _nczarr}


def _blocks(sizes):
    """Each fragment's index and its slices of the aggregated array."""
    starts = [np.concatenate([[0], np.cumsum(row)[:-1]]) for row in sizes]
    for index in np.ndindex(*(len(row) for row in sizes)):
        yield index, tuple(slice(int(s[i]), int(s[i]) + row[i]) for s, row, i in zip(starts, sizes, index))


def _with_zarr_fragments(tmp_path: Path, writer: str, every: int = 2):
    """A CF-1.13 aggregation whose every ``every``-th fragment is a Zarr store (the rest netCDF)."""
    built = build_cf113(tmp_path / "ds", make_truth((6, 4, 5), "f4", seed=9, masked=0.2), DIMS, SIZES)
    renamed = {}
    for k, (index, where) in enumerate(_blocks(SIZES)):
        if k % every:
            continue
        old = built.fragment_uris[index][0]
        store = built.path.parent / f"zarr_{k}.zarr"
        renamed[old] = WRITERS[writer](store, "tas", built.expected[where])
    rewrite_uris(built.path, built.names["uris"], lambda u: renamed.get(u, u))
    return built, renamed


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_zarr_fragments_read_equal_to_the_ground_truth(tmp_path, placed, writer):
    built, renamed = _with_zarr_fragments(tmp_path, writer)
    assert renamed, "no fragment was made a Zarr store"
    url, options = placed(built.path)
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    assert x.chunks == built.chunks
    packed = writer == "xarray-packed"
    assert_matches(x.compute(), built.expected, atol=0.006 if packed else 0.0, rtol=0 if packed else 1e-6)
    assert_matches(x[:, 1, 2:4].compute(), built.expected[:, 1, 2:4], atol=0.006 if packed else 0.0,
                   rtol=0 if packed else 1e-6)


def test_every_fragment_zarr_and_strided_selection(tmp_path):
    built, _ = _with_zarr_fragments(tmp_path, "zarr-v3", every=1)
    x = daskcfa.from_cfa(str(built.path), "tas")
    assert_matches(x[::2, 1:, ::3].compute(), built.expected[::2, 1:, ::3])
    assert_matches(x[5, 3, 4].compute(), built.expected[5, 3, 4])


def test_missing_zarr_store_is_a_missing_fragment(tmp_path):
    built, renamed = _with_zarr_fragments(tmp_path, "zarr-v2")
    gone = built.path.parent / next(iter(renamed.values()))
    import shutil

    shutil.rmtree(gone)
    x = daskcfa.from_cfa(str(built.path), "tas")
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    assert info.value.fragment == (0, 0, 0) and "zarr_0.zarr" in str(info.value)
    with pytest.warns(daskcfa.CFAWarning, match="zarr_0.zarr|fragment \\(0, 0, 0\\)"):
        values = daskcfa.from_cfa(str(built.path), "tas", missing="fill")[:2].compute()
    assert np.ma.getmaskarray(values).all()


@pytest.mark.parametrize("special", ["fifo", "device"])
@pytest.mark.parametrize("what", ["metadata", "chunk"])
def test_zarr_store_files_that_are_not_regular_files_are_refused(tmp_path, special, what):
    """A store's metadata or chunk made a FIFO (a read would block) or a link to /dev/zero (a read
    would never end): refused as a fragment error before it is read, as any fragment file is."""
    import os
    import signal

    built, renamed = _with_zarr_fragments(tmp_path, "zarr-v2")
    store = built.path.parent / next(iter(renamed.values()))
    victim = store / "tas" / (".zarray" if what == "metadata" else "0.0.0")
    victim.unlink()
    if special == "fifo":
        os.mkfifo(victim)
    else:
        victim.symlink_to("/dev/zero")
    signal.alarm(60)  # (a blocked read must fail the test, not hang the run)
    try:
        with pytest.raises(daskcfa.FragmentReadError) as info:
            daskcfa.from_cfa(str(built.path), "tas").compute()
    finally:
        signal.alarm(0)
    assert info.value.fragment == (0, 0, 0)


@pytest.mark.parametrize("damage", ["metadata", "variable", "strings"])
def test_damaged_zarr_store_is_a_clear_fragment_error(tmp_path, damage):
    built, renamed = _with_zarr_fragments(tmp_path, "zarr-v2")
    store = built.path.parent / next(iter(renamed.values()))
    if damage == "metadata":
        (store / "tas" / ".zarray").write_text("{not json")
    elif damage == "variable":
        (store / "tas").rename(store / "other")
    else:
        array = zarr.create_array(str(store), name="tas", shape=(2, 4, 5), dtype="U4", zarr_format=2,
                                  overwrite=True, attributes={"_ARRAY_DIMENSIONS": list(DIMS)})
        array[...] = "abcd"
    x = daskcfa.from_cfa(str(built.path), "tas")
    with pytest.raises(daskcfa.FragmentReadError) as info:
        x.compute()
    assert info.value.fragment == (0, 0, 0)
    assert "zarr_0.zarr" in str(info.value)


def test_zarr_fragment_refused_outside_the_allowed_locations(tmp_path):
    built, renamed = _with_zarr_fragments(tmp_path, "zarr-v3")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = next(iter(renamed.values()))
    (built.path.parent / moved).rename(elsewhere / moved)
    rewrite_uris(built.path, built.names["uris"], lambda u: str(elsewhere / u) if u == moved else u)
    x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=[str(built.path.parent)])
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        x.compute()
    assert info.value.fragment == (0, 0, 0)
    assert_matches(daskcfa.from_cfa(str(built.path), "tas").compute(), built.expected)  # (local: anywhere)


def test_nczarr_written_by_netcdf_c_keeps_its_float32_fill(tmp_path):
    """NCZarr records each attribute's netCDF type: a float32 fill value is compared as float32
    (-1e20 in float64 is not the float32 value stored)."""
    built, renamed = _with_zarr_fragments(tmp_path, "nczarr", every=1)
    store = built.path.parent / next(iter(renamed.values())).split("#")[0]
    attrs = json.loads((store / "tas" / ".zattrs").read_text())
    assert attrs["_nczarr_attr"]["types"]["_FillValue"] == "<f4"
    values = daskcfa.from_cfa(str(built.path), "tas").compute()
    assert np.ma.getmaskarray(values).sum() == np.ma.getmaskarray(built.expected).sum() > 0


@pytest.mark.parametrize("dtype", ["f8", "i2"])
def test_nczarr_shuffled_by_netcdf_c_reads_exactly(tmp_path, dtype):
    """netCDF-C records its shuffle filter with ``elementsize: 0`` and shuffles by the type's size:
    read as numcodecs reads that (no unshuffle), every value was wrong, silently."""
    from remote_helpers import write_cf113

    truth = (np.arange(20) * 3 - 7).astype(dtype)
    with netCDF4.Dataset(f"file://{tmp_path}/f.zarr#mode=nczarr,file", "w") as nc:
        nc.createDimension("n", 20)
        nc.createVariable("x", dtype, ("n",), zlib=True, shuffle=True, chunksizes=(8,))[:] = truth
    assert json.loads((tmp_path / "f.zarr" / "x" / ".zarray").read_text())["filters"] == [
        {"id": "shuffle", "elementsize": 0}]
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[20]], [["f.zarr#mode=nczarr,file"]], dtype=dtype)
    np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(str(path), "x").compute()), truth)


def test_zarr_chunk_larger_than_the_memory_budget_is_refused_before_decoding(tmp_path):
    """A store may declare one chunk of gigabytes (its bytes a few of zeros compressed): the chunk
    is counted against the memory budget before zarr decodes it, as HDF5 chunks are."""
    import dask

    built, renamed = _with_zarr_fragments(tmp_path, "zarr-v3", every=1)
    store = built.path.parent / next(iter(renamed.values()))
    meta = json.loads((store / "tas" / "zarr.json").read_text())
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [20_000, 20_000, 20_000]  # 32 TB a chunk
    (store / "tas" / "zarr.json").write_text(json.dumps(meta))
    for chunk in (store / "tas" / "c").rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    with dask.config.set({"daskcfa.budget.memory": "64MiB"}):
        with pytest.raises(daskcfa.BudgetError) as info:
            daskcfa.from_cfa(str(built.path), "tas")[:2].compute()
    assert info.value.fragment == (0, 0, 0)


# ---------------------------------------------------------------------------
# fsspec reference sets (kerchunk's format) as fragments
# ---------------------------------------------------------------------------
def _reference_set(nc_path: Path, name: str, target: str, version: int = 1) -> dict:
    """A reference set for variable ``name`` of a netCDF-4 file, built from the fsspec reference
    specification and the file's HDF5 chunk locations (no kerchunk)."""
    import h5py

    with netCDF4.Dataset(nc_path) as nc:
        var = nc[name]
        attrs = {k: var.getncattr(k) for k in var.ncattrs()}
        dims = list(var.dimensions)
    zattrs = {"_ARRAY_DIMENSIONS": dims, **{k: (v.item() if hasattr(v, "item") else v) for k, v in attrs.items()}}
    with h5py.File(nc_path, "r") as f:
        d = f[name]
        chunks = list(d.chunks or d.shape)
        compressor = {"id": "zlib", "level": int(d.compression_opts)} if d.compression == "gzip" else None
        filters = [{"id": "shuffle", "elementsize": d.dtype.itemsize}] if d.shuffle else None
        where = "{{u}}" if version == 1 else target
        refs = {".zgroup": json.dumps({"zarr_format": 2}), f"{name}/.zattrs": json.dumps(zattrs),
                f"{name}/.zarray": json.dumps({"zarr_format": 2, "shape": list(d.shape), "chunks": chunks,
                                                "dtype": d.dtype.str, "compressor": compressor,
                                                "filters": filters, "fill_value": None, "order": "C"})}
        if d.chunks is None:
            refs[f"{name}/" + ".".join("0" * len(chunks))] = [where, d.id.get_offset(), d.id.get_storage_size()]
        else:
            for i in range(d.id.get_num_chunks()):
                info = d.id.get_chunk_info(i)
                key = ".".join(str(o // c) for o, c in zip(info.chunk_offset, chunks))
                refs[f"{name}/{key}"] = [where, info.byte_offset, info.size]
    return {"version": 1, "templates": {"u": target}, "refs": refs} if version == 1 else refs


def _with_reference_fragments(tmp_path: Path, version: int = 1,
                              target=lambda path: f"{path.parent.name}/{path.name}"):
    """A CF-1.13 aggregation whose every other fragment is a reference set into its netCDF file."""
    built = build_cf113(tmp_path / "ds", make_truth((6, 4, 5), "f4", seed=9, masked=0.2), DIMS, SIZES)
    renamed = {}
    for k, (index, _) in enumerate(_blocks(SIZES)):
        if k % 2:
            continue
        nc_path = built.fragment_files[index]
        refs = _reference_set(nc_path, "tas", target(nc_path), version)
        name = f"refs_{k}.json"
        (built.path.parent / name).write_text(json.dumps(refs))
        renamed[built.fragment_uris[index][0]] = name
    rewrite_uris(built.path, built.names["uris"], lambda u: renamed.get(u, u))
    return built, renamed


@pytest.mark.parametrize("version", [0, 1])
def test_reference_set_fragments_read_equal_to_the_ground_truth(tmp_path, placed, version, other_cwd):
    # relative targets resolve against the reference set's location (the aggregation's directory),
    # never the working directory
    built, renamed = _with_reference_fragments(tmp_path, version)
    url, options = placed(built.path)
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    assert_matches(x.compute(), built.expected)
    assert_matches(x[1:4, 2, ::2].compute(), built.expected[1:4, 2, ::2])


def test_reference_set_target_outside_the_allowed_locations_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 4096)
    built, renamed = _with_reference_fragments(tmp_path, target=lambda p: str(secret))
    x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=[str(built.path.parent)])
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        x.compute()
    assert info.value.fragment in {(0, 0, 0), (2, 0, 0)} and "secret.bin" in str(info.value)


def test_reference_set_target_on_another_bucket_is_refused(tmp_path, s3_server):
    fs = s3_server.filesystem()
    home, other = s3_server.new_bucket(), s3_server.new_bucket()
    fs.pipe(f"{other}/victim.nc", b"\x00" * 4096)
    built, renamed = _with_reference_fragments(tmp_path, target=lambda p: f"s3://{other}/victim.nc")
    fs.put(str(built.path.parent) + "/", f"{home}/ds/", recursive=True)
    x = daskcfa.from_cfa(f"s3://{home}/ds/{built.path.name}", "tas", storage_options=s3_server.storage_options)
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        x.compute()
    assert info.value.fragment in {(0, 0, 0), (2, 0, 0)}


@pytest.mark.parametrize("damage", ["not-json", "not-an-object", "fifo-target", "missing-target"])
def test_damaged_reference_set_is_a_clear_fragment_error(tmp_path, damage):
    import os

    built, renamed = _with_reference_fragments(tmp_path)
    refs = built.path.parent / next(iter(renamed.values()))
    if damage == "not-json":
        refs.write_text("{oops")
    elif damage == "not-an-object":
        refs.write_text("[1, 2]")
    else:
        target = tmp_path / "target.nc"
        if damage == "fifo-target":
            os.mkfifo(target)
        text = json.loads(refs.read_text())
        text["templates"]["u"] = str(target)
        refs.write_text(json.dumps(text))
    x = daskcfa.from_cfa(str(built.path), "tas")
    with pytest.raises(daskcfa.FragmentReadError) as info:
        x.compute()
    assert info.value.fragment == (0, 0, 0)


def test_parquet_reference_set_fragment(tmp_path, placed):
    """A reference set stored as Parquet (fsspec's lazy format, written here with its own writer)."""
    pytest.importorskip("kerchunk", reason="fsspec writes Parquet references through kerchunk")
    pytest.importorskip("fastparquet")
    from fsspec.implementations.local import LocalFileSystem
    from fsspec.implementations.reference import LazyReferenceMapper

    built, renamed = _with_reference_fragments(tmp_path, version=0)
    for name in renamed.values():
        refs = json.loads((built.path.parent / name).read_text())
        parquet = name.replace(".json", ".parq")
        lazy = LazyReferenceMapper.create(root=str(built.path.parent / parquet), fs=LocalFileSystem(), record_size=4)
        for key, value in refs.items():
            lazy[key] = value.encode() if isinstance(value, str) else value
        lazy.flush()
        (built.path.parent / name).unlink()
    rewrite_uris(built.path, built.names["uris"], lambda u: u.replace(".json", ".parq"))
    url, options = placed(built.path)
    assert_matches(daskcfa.from_cfa(url, "tas", storage_options=options).compute(), built.expected)
