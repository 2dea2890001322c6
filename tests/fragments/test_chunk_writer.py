"""Deflated netCDF-4 fragments written chunk by chunk outside netCDF-C (``fragments/chunk_writer.py``).

Real files throughout: sources written by daskcfa and netCDF4-python, the
results read back with netCDF4-python (masking as it masks) and their stored
chunks read raw with h5py. A level-1 chunk is ISA-L's zlib stream of the
chunk (shuffled first when the variable is shuffled), padded with the fill
value past the variable's edge; the filters netCDF4-python reports are the
ones asked for; netCDF-C can still edit the files.
"""

from __future__ import annotations

import itertools
import zlib

import dask
import h5py
import netCDF4
import numpy as np
import pytest
from isal import isal_zlib

import daskcfa
from builders import assert_editable_by_netcdf_c

pytestmark = pytest.mark.usefixtures("sync_dask")

DIMS = ("time", "lat", "lon")


def _fragments(url: str) -> list[str]:
    import pathlib

    return sorted(str(p) for p in pathlib.Path(url).with_suffix("").glob("g-*/*.nc"))


def _stored_chunks(path: str, name: str) -> list[tuple[tuple[int, ...], bytes]]:
    with h5py.File(path, "r") as f:
        ds = f[name]
        out = []
        for i in range(ds.id.get_num_chunks()):
            offset = ds.id.get_chunk_info(i).chunk_offset
            mask, raw = ds.id.read_direct_chunk(offset)
            assert mask == 0, (path, offset)
            out.append((tuple(offset), raw))
        return out


def _expected_chunk(values: np.ndarray, offset, chunks, fill, shuffle: bool) -> bytes:
    """The chunk's bytes before deflate: padded with ``fill`` past the edge, shuffled if asked."""
    buffer = np.full(chunks, fill, values.dtype)
    piece = values[tuple(slice(o, o + c) for o, c in zip(offset, chunks))]
    buffer[tuple(slice(0, n) for n in piece.shape)] = piece
    raw = buffer.reshape(-1).view(np.uint8)
    if shuffle:
        raw = raw.reshape(-1, values.dtype.itemsize).T.reshape(-1)
    return raw.tobytes()


def _check_fragment(path: str, name: str, want: np.ndarray, *, level: int, shuffle: bool, chunks) -> None:
    """netCDF4-python reads ``want`` and reports the filters asked for; every chunk is the
    deflate stream daskcfa writes at ``level`` (ISA-L's at level 1)."""
    with netCDF4.Dataset(path) as nc:
        var = nc[name]
        var.set_auto_maskandscale(False)
        np.testing.assert_array_equal(var[...], want)
        filters = var.filters()
        assert (filters["zlib"], filters["complevel"], filters["shuffle"], filters["fletcher32"]) == (
            True, level, shuffle, False), filters
        assert var.chunking() == list(chunks)
        fill = var._FillValue if "_FillValue" in var.ncattrs() else netCDF4.default_fillvals[want.dtype.str[1:]]
    stored = _stored_chunks(path, name)
    grid = [range(0, n, c) for n, c in zip(want.shape, chunks)]
    assert sorted(o for o, _ in stored) == sorted(itertools.product(*grid))
    for offset, raw in stored:
        plain = _expected_chunk(want, offset, chunks, fill, shuffle)
        assert zlib.decompress(raw) == plain, offset
        assert raw == (isal_zlib.compress(plain, 1) if level == 1 else zlib.compress(plain, level)), offset


@pytest.mark.parametrize("strategy", ["direct", "staged"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_refragmented_deflate_chunks_are_written_directly(tmp_path, strategy, shuffle):
    """Slabs cut the target's chunks (max_mem) and chunks overhang the fragment's edge: every chunk
    is whole, padded, ISA-L's stream, and netCDF4-python reads the values with the filters asked for."""
    truth = np.random.default_rng(3).normal(280, 5, (40, 64, 64)).astype("f4")
    src = daskcfa.to_cfa(truth, str(tmp_path / "src.nca"), variable="tas", dims=DIMS, fragment_shape=(4, 64, 64),
                         compression={"zlib": True, "complevel": 1, "chunksizes": (1, 64, 64)})
    chunks = (5, 16, 24)
    compression = {"zlib": True, "complevel": 1, "shuffle": shuffle, "chunksizes": chunks}
    with dask.config.set({"daskcfa.refragment.strategy": strategy}):
        plan = daskcfa.plan_refragment(src, fragment_shape=(40, 32, 64), max_mem="17MiB", compression=compression)
        slabs = plan.variables["/tas"].slabs.sizes[0]
        assert any(n % chunks[0] for n in slabs[:-1]), slabs  # a slab boundary cuts a chunk
        out = daskcfa.refragment(src, str(tmp_path / "out.nca"), fragment_shape=(40, 32, 64), max_mem="17MiB",
                                 compression=compression)
    files = _fragments(out)
    assert len(files) == 2
    for j, path in enumerate(files):
        _check_fragment(path, "tas", truth[:, 32 * j:32 * (j + 1)], level=1, shuffle=shuffle, chunks=chunks)
    assert_editable_by_netcdf_c(*files)  # (before daskcfa's reader holds the files open)
    np.testing.assert_array_equal(daskcfa.from_cfa(out).compute(), truth)


def test_to_cfa_packed_masked_big_endian(tmp_path):
    """Stored dtype, _FillValue and masked points as netCDF4-python reads them back (values given
    big-endian are stored as netCDF-C defines the variable: native order)."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(5)
    values = np.ma.masked_array(rng.normal(10, 3, (13, 9, 10)), mask=rng.random((13, 9, 10)) < 0.2)
    da = xr.DataArray(values.filled(np.nan), dims=DIMS, name="v")
    da.encoding = {"dtype": np.dtype(">i2"), "scale_factor": 0.01, "add_offset": 10.0, "_FillValue": np.int16(-999)}
    out = daskcfa.to_cfa(da.to_dataset(), str(tmp_path / "p.nca"), fragment_shape=(13, 9, 10),
                         compression={"zlib": True, "complevel": 1, "shuffle": True, "chunksizes": (4, 4, 4)})
    [path] = _fragments(out)
    with netCDF4.Dataset(path) as nc:  # masked and unpacked as netCDF4-python does
        got = nc["v"][...]
        assert nc["v"].dtype == np.dtype("<i2") and nc["v"].endian() == "little"
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(values))
    np.testing.assert_allclose(got.compressed(), values.compressed(), atol=0.005 + 1e-12)
    packed = np.where(values.mask, -999, np.around((values.data - 10.0) / 0.01)).astype("<i2")
    _check_fragment(path, "v", packed, level=1, shuffle=True, chunks=(4, 4, 4))


@pytest.mark.parametrize("compression", [{"zlib": True, "complevel": 1, "fletcher32": True},
                                         {"zlib": True, "complevel": 1, "significant_digits": 3}])
def test_other_pipelines_are_written_by_netcdf_c(tmp_path, compression):
    """A checksum or quantization is netCDF-C's to apply: such fragments are written through it."""
    truth = np.random.default_rng(7).normal(280, 5, (12, 8, 8)).astype("f4")
    out = daskcfa.to_cfa(truth, str(tmp_path / "q.nca"), variable="tas", dims=DIMS, fragment_shape=(12, 8, 8),
                         compression={**compression, "chunksizes": (4, 8, 8)})
    [path] = _fragments(out)
    with netCDF4.Dataset(path) as nc:
        var = nc["tas"]
        if "fletcher32" in compression:
            assert var.filters()["fletcher32"]
            np.testing.assert_array_equal(var[...], truth)
        else:
            assert var.quantization() == (3, "BitGroom")
            np.testing.assert_allclose(var[...], truth, rtol=1e-3)


def test_slabs_in_any_order_cutting_chunks_on_every_dimension(tmp_path):
    """Blocks of any grid, in any order, some never written: the chunks they cut are completed
    across blocks, and what no block wrote reads as the fill value (as netCDF-C leaves it)."""
    from daskcfa.fragments.chunk_writer import ChunkWriter

    path = str(tmp_path / "f.nc")
    with netCDF4.Dataset(path, "w") as nc:
        for dim, n in zip(DIMS, (10, 9, 11)):
            nc.createDimension(dim, n)
        nc.createVariable("v", "i4", DIMS, zlib=True, complevel=1, shuffle=True, chunksizes=(3, 4, 5),
                          fill_value=-7)
    truth = np.arange(10 * 9 * 11, dtype="i4").reshape(10, 9, 11)
    cuts = [(0, 4, 7, 10), (0, 2, 9), (0, 6, 11)]
    blocks = [tuple(slice(a, b) for a, b in cell)
              for cell in itertools.product(*(list(zip(c, c[1:])) for c in cuts))]
    order = np.random.default_rng(2).permutation(len(blocks))
    skipped = blocks[order[-1]]
    with ChunkWriter(path, "/v") as writer:
        for i in order[:-1]:
            writer.write(blocks[i], truth[blocks[i]])
    want = truth.copy()
    want[skipped] = -7
    _check_fragment(path, "v", want, level=1, shuffle=True, chunks=(3, 4, 5))


def test_a_forked_process_compresses_with_threads_of_its_own(tmp_path):
    """The compression threads do not survive a fork: a child started by fork (multiprocessing's
    default on Linux) after the parent compressed gets a pool of its own instead of hanging."""
    import multiprocessing

    truth = np.arange(6 * 8 * 8, dtype="f4").reshape(6, 8, 8)
    compression = {"zlib": True, "complevel": 1, "chunksizes": (2, 8, 8)}
    daskcfa.to_cfa(truth, str(tmp_path / "parent.nca"), variable="tas", dims=DIMS, compression=compression)
    context = multiprocessing.get_context("fork")
    child = context.Process(target=daskcfa.to_cfa, args=(truth, str(tmp_path / "child.nca")),
                            kwargs={"variable": "tas", "dims": DIMS, "compression": compression})
    child.start()
    try:
        child.join(60)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    [path] = _fragments(str(tmp_path / "child.nca"))
    _check_fragment(path, "tas", truth, level=1, shuffle=True, chunks=(2, 8, 8))
