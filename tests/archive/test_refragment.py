"""``daskcfa.refragment``: new fragment layouts, read back equal to numpy ground truth.

Sources are real netCDF files (written with to_cfa or netCDF4-python); the
result is read back with from_cfa/open_cfa and netCDF4-python. Both plan
strategies run (dask config ``daskcfa.refragment.strategy``); the memory
budget is checked on a real LocalCluster by the workers' own RSS.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import dask
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_editable_by_netcdf_c, generation_dir
from daskcfa.errors import BudgetError, CFAError, VariableNotFoundError

pytestmark = pytest.mark.usefixtures("sync_dask")

DIMS = ("time", "lat", "lon")


def coords(shape):
    return {"time": (np.arange(shape[0], dtype="f8"), {"units": "days since 2000-01-01", "axis": "T"}),
            "lat": np.linspace(-80, 80, shape[1]), "lon": np.linspace(0, 350, shape[2])}


def cfa_source(path: Path, data, fragment_shape, **kwargs) -> str:
    return daskcfa.to_cfa(data, str(path), variable="tas", dims=DIMS, attrs={"units": "K"}, coords=coords(data.shape),
                          fragment_shape=fragment_shape, **kwargs)


def read_back(url: str, variable: str | None = None, **kwargs):
    return daskcfa.from_cfa(url, variable, **kwargs).compute(scheduler="sync")


def fragment_files(url: str) -> list[str]:
    stem = Path(url).with_suffix("")
    return sorted(str(p) for p in stem.glob("g-*/*.nc"))


@pytest.fixture(params=["direct", "staged"])
def strategy(request):
    with dask.config.set({"daskcfa.refragment.strategy": request.param}):
        yield request.param


def test_time_slices_to_tiles(tmp_path, strategy):
    truth = np.random.default_rng(1).normal(280, 5, (24, 16, 20)).astype("f4")
    src = cfa_source(tmp_path / "src.nca", truth, (2, 16, 20), compression={"zlib": True, "chunksizes": (1, 16, 20)})
    out = daskcfa.refragment(src, str(tmp_path / "tiles.nca"), fragment_shape={"lat": 8, "lon": 10}, max_mem="32MiB")
    x = daskcfa.from_cfa(out)
    assert x.chunks == ((24,), (8, 8), (10, 10))
    np.testing.assert_array_equal(x.compute(), truth)
    with daskcfa.open_cfa(out) as ds:  # coordinates and attributes carried over
        np.testing.assert_array_equal(ds["lat"][:], coords(truth.shape)["lat"])
        assert ds["time"].attrs["units"] == "days since 2000-01-01" and ds["tas"].attrs["units"] == "K"
    assert len(fragment_files(out)) == 4
    assert not (tmp_path / "tiles" / ".daskcfa" / "staging").exists() or not any(
        (tmp_path / "tiles" / ".daskcfa" / "staging").iterdir())


def test_tiles_to_time_slices_in_slabs(tmp_path, strategy):
    """Target fragments larger than max_mem are written slab by slab, and still read back equal."""
    truth = np.arange(40 * 64 * 64, dtype="f4").reshape(40, 64, 64)
    src = cfa_source(tmp_path / "src.nca", truth, (40, 32, 32))
    plan = daskcfa.plan_refragment(src, fragment_shape=(20, 64, 64), max_mem="17MiB")
    assert plan.variables["/tas"].slabs.nfragments > plan.variables["/tas"].target.nfragments
    assert plan.peak_memory <= 17 << 20 and "slabs of" in str(plan)
    out = daskcfa.refragment(src, str(tmp_path / "slices.nca"), fragment_shape=(20, 64, 64), max_mem="17MiB")
    x = daskcfa.from_cfa(out)
    assert x.chunks == ((20, 20), (64,), (64,))
    np.testing.assert_array_equal(x.compute(), truth)


def write_plain(path: Path, data, *, time0=0, group=None, packing=None, fill=None, chunks=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.title = "plain"
        node = ds.createGroup(group) if group else ds
        for dim, n in zip(DIMS, data.shape):
            ds.createDimension(dim, n)
        t = ds.createVariable("time", "f8", ("time",))
        t[:], t.units, t.axis = np.arange(time0, time0 + data.shape[0]), "days since 2000-01-01", "T"
        for dim, n in zip(DIMS[1:], data.shape[1:]):
            ds.createVariable(dim, "f8", (dim,))[:] = np.arange(n)
        if packing is not None:
            v = node.createVariable("tas", "i2", DIMS, fill_value=np.int16(fill), chunksizes=chunks)
            v.scale_factor, v.add_offset = packing
        else:
            v = node.createVariable("tas", data.dtype, DIMS, fill_value=fill, chunksizes=chunks,
                                    zlib=chunks is not None)
        v.units = "K"
        v[...] = data


def test_irregular_source_files_via_glob(tmp_path, strategy):
    """Several plain files of different lengths (the multi-file path: scan) -> even tiles."""
    rng = np.random.default_rng(2)
    truth = rng.normal(size=(17, 6, 8)).astype("f4")
    bounds = [0, 3, 4, 11, 17]
    for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
        write_plain(tmp_path / "in" / f"tas_{n}.nc", truth[a:b], time0=a, chunks=(1, 6, 8))
    out = daskcfa.refragment(str(tmp_path / "in" / "tas_*.nc"), str(tmp_path / "out.nca"),
                             fragment_shape={"time": 17, "lat": 3, "lon": 4}, max_mem="24MiB")
    x = daskcfa.from_cfa(out)
    assert x.chunks == ((17,), (3, 3), (4, 4))
    np.testing.assert_array_equal(x.compute(), truth)
    with daskcfa.open_cfa(out) as ds:
        np.testing.assert_array_equal(ds["time"][:], np.arange(17))


def test_masked_data_keep_their_mask(tmp_path, strategy):
    data = np.ma.masked_greater(np.random.default_rng(3).random((12, 10, 10)).astype("f4"), 0.8)
    src = cfa_source(tmp_path / "src.nca", data, (3, 10, 10))
    out = daskcfa.refragment(src, str(tmp_path / "out.nca"), fragment_shape=(12, 5, 5), max_mem="20MiB")
    got = read_back(out)
    assert np.ma.isMaskedArray(got) and got.mask.sum() == data.mask.sum()
    np.testing.assert_array_equal(got.mask, data.mask)
    np.testing.assert_array_equal(got.compressed(), data.compressed())


def test_single_packed_file_stays_packed(tmp_path, strategy):
    """One plain netCDF file: its data variable is re-fragmented; packed values are stored packed, bit for bit."""
    truth = np.ma.masked_less(np.round(np.random.default_rng(4).uniform(200, 300, (8, 6, 10)), 2), 210)
    src = tmp_path / "packed.nc"
    write_plain(src, truth, packing=(0.01, 250.0), fill=-32767)
    out = daskcfa.refragment(str(src), str(tmp_path / "out.nca"), fragment_shape=(8, 3, 5), max_mem="20MiB")
    with netCDF4.Dataset(str(src)) as ds:
        expected = ds["tas"][...]
        ds["tas"].set_auto_maskandscale(False)
        stored = ds["tas"][...]
    got = read_back(out)
    np.testing.assert_array_equal(got.mask, expected.mask)
    np.testing.assert_allclose(got.compressed(), expected.compressed(), rtol=0, atol=1e-9)
    first = fragment_files(out)[0]
    with netCDF4.Dataset(first) as frag:
        assert frag["tas"].dtype == np.int16 and frag["tas"].scale_factor == 0.01
        frag["tas"].set_auto_maskandscale(False)
        np.testing.assert_array_equal(frag["tas"][...], stored[:, :3, :5])
    with daskcfa.open_cfa(out) as ds:
        assert set(ds.variables) == {"tas", "time", "lat", "lon"} and ds.attrs["title"] == "plain"


def test_group_variable_of_a_plain_file(tmp_path):
    truth = np.random.default_rng(5).random((6, 4, 4)).astype("f8")
    src = tmp_path / "grouped.nc"
    write_plain(src, truth, group="model")
    out = daskcfa.refragment(str(src), str(tmp_path / "out.nca"), fragment_shape=(2, 4, 4), max_mem="20MiB")
    np.testing.assert_array_equal(read_back(out, "/model/tas"), truth)


def test_variables_selects_and_unknown_names_are_refused(tmp_path):
    truth = np.ones((4, 3, 3), "f4")
    src = cfa_source(tmp_path / "src.nca", truth, (1, 3, 3))
    with pytest.raises(VariableNotFoundError, match=r"\['/pr'\].*data variables: /tas"):
        daskcfa.plan_refragment(src, variables=["pr"])
    plan = daskcfa.plan_refragment(src, variables=["tas"], fragment_shape=(4, 3, 3))
    assert list(plan.variables) == ["/tas"] and sorted(plan.copied) == ["/lat", "/lon", "/time"]


def test_impossible_budget_is_refused_before_writing(tmp_path):
    truth = np.zeros((4, 64, 64), "f4")
    src = cfa_source(tmp_path / "src.nca", truth, (4, 64, 64), compression={"zlib": True, "chunksizes": (4, 64, 64)})
    target = tmp_path / "out.nca"
    with pytest.raises(BudgetError, match=r"max_mem=1.00 MiB.*'/tas'"):
        daskcfa.refragment(src, str(target), fragment_shape=(4, 32, 32), max_mem="1MiB")
    assert not target.exists() and not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="mode"):
        daskcfa.refragment(src, str(target), mode="r+")
    (tmp_path / "taken.nca").write_bytes(b"")
    with pytest.raises(FileExistsError):
        daskcfa.refragment(src, str(tmp_path / "taken.nca"))


def test_resume_after_failures_skips_finished_fragments(tmp_path, strategy):
    truth = np.random.default_rng(6).random((8, 8, 8)).astype("f4")
    src = cfa_source(tmp_path / "src.nca", truth, (2, 8, 8))
    target = tmp_path / "out.nca"
    kwargs = dict(fragment_shape={"time": 6, "lat": 4, "lon": 4}, max_mem="20MiB", mode="w")
    # 1. A source fragment is missing: the run fails and leaves no aggregation file.
    last = Path(fragment_files(src)[-1])
    last.rename(last.with_name("hidden"))
    with pytest.raises(CFAError, match="not found"):
        daskcfa.refragment(src, str(target), **kwargs)
    assert not target.exists()
    early = {f: os.stat(f).st_mtime_ns for f in fragment_files(str(target))}
    last.with_name("hidden").rename(last)
    # 2. Every fragment is written, then the commit fails (a directory is in the way).
    target.mkdir()
    (target / "keep").write_bytes(b"")
    with pytest.raises(OSError):
        daskcfa.refragment(src, str(target), **kwargs)
    written = {f: os.stat(f).st_mtime_ns for f in fragment_files(str(target))}
    assert len(written) == 8 and all(written[f] == t for f, t in early.items())
    # 3. The re-run resumes: no fragment is written again, and the dataset is complete.
    (target / "keep").unlink()
    target.rmdir()
    daskcfa.refragment(src, str(target), **kwargs)
    np.testing.assert_array_equal(read_back(str(target)), truth)
    assert {f: os.stat(f).st_mtime_ns for f in fragment_files(str(target))} == written


def test_s3_target(tmp_path, s3_server, s3_bucket, strategy):
    truth = np.random.default_rng(7).random((10, 12, 12)).astype("f4")
    src = cfa_source(tmp_path / "src.nca", truth, (2, 12, 12), compression={"zlib": True, "chunksizes": (1, 12, 12)})
    url = f"s3://{s3_bucket}/split/tiles.nca"
    out = daskcfa.refragment(src, url, fragment_shape=(5, 6, 6), max_mem="17MiB",
                             storage_options=s3_server.storage_options)
    assert out == url
    got = daskcfa.from_cfa(url, storage_options=s3_server.storage_options).compute()
    np.testing.assert_array_equal(got, truth)
    listed = s3_server.filesystem().find(f"{s3_bucket}/split/")
    assert sum(p.endswith(".nc") for p in listed) == 8
    assert not any("staging" in p for p in listed)


def test_staged_pieces_on_s3_larger_than_max_memory_are_read(tmp_path, s3_server, s3_bucket):
    """A staged plan's pieces on S3 are read back under their own size, not ``daskcfa.limits.max-memory``
    (the bound of an object read whole that names no size of its own): ``max_mem`` may plan pieces
    larger than that. (Capped at it, each piece was a BudgetError.)"""
    truth = np.random.default_rng(9).random((8, 64, 64)).astype("f4")
    src = cfa_source(tmp_path / "src.nca", truth, (4, 64, 64))
    url = f"s3://{s3_bucket}/staged/tiles.nca"
    with dask.config.set({"daskcfa.refragment.strategy": "staged", "daskcfa.limits.max-memory": "16KiB"}):
        daskcfa.refragment(src, url, fragment_shape=(8, 32, 32), max_mem="17MiB",
                           storage_options=s3_server.storage_options)  # (pieces of 32 KiB)
    got = daskcfa.from_cfa(url, storage_options=s3_server.storage_options).compute()
    np.testing.assert_array_equal(got, truth)


def test_memory_budget_holds_on_a_local_cluster(tmp_path):
    """Every worker's peak RSS growth stays under max_mem (measured on the workers) with slab writes."""
    distributed = pytest.importorskip("distributed")
    from daskcfa_testing.memory import WorkerPeakMemory

    truth = np.random.default_rng(8).random((64, 256, 256)).astype("f4")  # 16 MiB
    src = cfa_source(tmp_path / "src.nca", truth, (8, 256, 256), compression={"zlib": True, "complevel": 1,
                                                                                "chunksizes": (1, 256, 256)})
    warm = cfa_source(tmp_path / "warm.nca", truth[:2, :8, :8], (1, 8, 8))
    max_mem = 32 << 20
    shape = {"time": 64, "lat": 128, "lon": 128}  # 4 MiB tiles, cutting every compressed chunk
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB", processes=True,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        daskcfa.refragment(warm, str(tmp_path / "warm-out.nca"), fragment_shape=(2, 4, 4), max_mem=max_mem)
        # (daskcfa imports dask.array, with xarray, pandas and scipy, and h5py for HDF5 chunks, when first
        # used: on a worker the warm-up gave no task, that is 100 MB (h5py: 15-20 MB) that are not the
        # re-fragmenting's)
        for module in ("dask.array", "h5py"):
            client.run(importlib.import_module, module)
        for strategy in ("direct", "staged"):
            with dask.config.set({"daskcfa.refragment.strategy": strategy}):
                plan = daskcfa.plan_refragment(src, fragment_shape=shape, max_mem=max_mem)
                assert plan.peak_memory <= max_mem and plan.variables["/tas"].slabs.nfragments > 4
                with WorkerPeakMemory(client) as memory:
                    out = daskcfa.refragment(src, str(tmp_path / f"{strategy}.nca"), fragment_shape=shape,
                                             max_mem=max_mem)
                assert len(memory.growth) == 2
                assert all(0 <= g < max_mem for g in memory.growth.values()), (strategy, memory.results)
                np.testing.assert_array_equal(read_back(out), truth)


@pytest.mark.parametrize("fragment_shape", [(1, 2), (2, 1), (2, 3)])
def test_string_variable_refragmented(tmp_path, fragment_shape):
    """Strings (object arrays) are re-fragmented by direct reads: staged pieces
    are .npy files, which cannot hold Python objects without pickle."""
    words = np.array([["a1b2", "c3d4 long ", ""], ["é", "x" * 300, " z"]], dtype=object)
    src = daskcfa.to_cfa(words, str(tmp_path / "src.nc"), variable="code", dims=("y", "x"), fragment_shape=(1, 3))
    out = daskcfa.refragment(src, str(tmp_path / "out.nc"), fragment_shape=fragment_shape)
    x = daskcfa.from_cfa(out, "code")
    assert x.dtype == object and x.chunksize == tuple(min(a, b) for a, b in zip(fragment_shape, words.shape))
    assert np.ma.getdata(x.compute(scheduler="sync")).tolist() == words.tolist()

def test_refragmented_files_are_editable_by_netcdf_c(tmp_path):
    # issue 13 item 12
    truth = np.arange(8 * 4 * 6, dtype="f4").reshape(8, 4, 6)
    src = cfa_source(tmp_path / "src.nca", truth, (2, 4, 6))
    out = daskcfa.refragment(src, str(tmp_path / "out.nca"), fragment_shape=(8, 2, 6), format="CFA-0.6.2",
                             max_mem="20MiB")
    assert_editable_by_netcdf_c(out, *fragment_files(out))
    np.testing.assert_array_equal(read_back(out), truth)


def test_refragment_with_absolute_uris(tmp_path):
    # issue 13 item 14
    truth = np.arange(8 * 4 * 6, dtype="f4").reshape(8, 4, 6)
    src = cfa_source(tmp_path / "src.nca", truth, (2, 4, 6))
    out = daskcfa.refragment(src, str(tmp_path / "out.nca"), fragment_shape=(8, 2, 6), max_mem="20MiB",
                             uris="absolute")
    uris = sorted(daskcfa.read_aggregation(out).fragments.locations())
    assert uris == [f"file://{generation_dir(tmp_path / 'out')}/out.tas.0.{j}.0.nc" for j in range(2)]
    np.testing.assert_array_equal(read_back(out), truth)


def test_refragment_writes_the_chunk_index(tmp_path):
    from daskcfa.fragments.chunk_index import index_uri

    x = np.arange(600.0).reshape(12, 50)
    src = daskcfa.to_cfa(x, str(tmp_path / "s.nc"), variable="v", dims=("t", "x"), fragment_shape=(6, 50))
    out = daskcfa.refragment(src, str(tmp_path / "r.nc"), fragment_shape=(3, 50), chunk_index=True)
    assert os.path.exists(index_uri(out).removeprefix("file://"))
    np.testing.assert_array_equal(daskcfa.from_cfa(out, chunk_index=True).compute(), x)
    with pytest.raises(daskcfa.ArgumentError, match="needs compute=True"):
        daskcfa.refragment(src, str(tmp_path / "q.nc"), chunk_index=True, compute=False)


def test_fragments_behind_a_login_in_their_uris_are_refragmented(tmp_path, make_http_server):
    """Fragment URIs holding ``user:pw@`` are read by ``from_cfa`` with that login; ``refragment`` read the
    first fragment's layout without it (noticed by attack14: HTTP 401 from the server). The new
    fragments hold the values; no file written holds the password."""
    import secrets

    from remote_helpers import rewrite_uris

    password = f"rf-pw-{secrets.token_urlsafe(18)}"
    data = np.arange(4 * 6 * 8, dtype="f4").reshape(4, 6, 8)
    (tmp_path / "www").mkdir()
    source = cfa_source(tmp_path / "www" / "src.nc", data, (2, 6, 8))
    server = make_http_server(tmp_path / "www", username="reader", password=password)
    with netCDF4.Dataset(source) as nc:
        uris_variable = next(v for v in nc.variables.values() if v.dtype is str and v.ndim)
        name = uris_variable.name
    rewrite_uris(Path(source), name, lambda u: server.url_for(
        os.path.relpath(os.path.join(os.path.dirname(source), u), tmp_path / "www")).replace(
        "://", f"://reader:{password}@", 1))
    np.testing.assert_array_equal(read_back(source, "tas"), data)  # (the login in the URIs is sent)
    target = str(tmp_path / "out" / "tiles.nc")
    daskcfa.refragment(source, target, fragment_shape=(4, 3, 4))
    np.testing.assert_array_equal(read_back(target, "tas"), data)
    written = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert password.encode() not in written
