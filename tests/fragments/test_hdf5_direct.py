"""The direct HDF5 reader returns exactly what netCDF4-python returns (raw values,
dimensions, attributes) on real netCDF-4 files, or refuses to read."""

from __future__ import annotations

import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskcfa.fragments.hdf5 import DirectReadUnsupported, HDF5File
from read_helpers import bytes_read

DTYPES = ["i1", "u2", "i4", "i8", "f4", "f8"]
STORAGE = {
    "contiguous": dict(contiguous=True),
    "chunked": dict(chunksizes=(4, 5)),
    "zlib": dict(chunksizes=(4, 5), zlib=True, shuffle=False),
    "zlib-shuffle": dict(chunksizes=(4, 5), zlib=True, shuffle=True),
    "fletcher32": dict(chunksizes=(4, 5), fletcher32=True),
    "fletcher32-zlib-shuffle": dict(chunksizes=(3, 7), zlib=True, shuffle=True, fletcher32=True),
}
KEYS = [
    (slice(None), slice(None)),
    (0, 0),
    (-1, -1),
    (5, slice(None)),
    (slice(None), -3),
    (slice(2, 11, 3), slice(1, None, 4)),
    (slice(None, None, 5), slice(3, 16)),
    (slice(4, 4), slice(None)),
    (slice(20, 30), 2),
    (np.int64(3), slice(None, None, 100)),
]


def random_values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype.kind == "f":
        return rng.normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def create(nc: netCDF4.Dataset | netCDF4.Group, name: str, dtype: str, dims: tuple[str, ...], **kwargs):
    with warnings.catch_warnings():  # "endian-ness of dtype and endian kwarg do not match"
        warnings.simplefilter("ignore", UserWarning)
        return nc.createVariable(name, dtype, dims, **kwargs)


def netcdf4_raw(path: Path, name: str, key: tuple) -> np.ndarray:
    with netCDF4.Dataset(path) as nc:
        var = nc[name]
        var.set_auto_maskandscale(False)
        return np.asarray(var[key])


def assert_same_as_netcdf4(path: Path, name: str, keys: list[tuple]) -> None:
    with HDF5File(path) as f:
        var = f.variable(name)
        for key in keys:
            got = var.read(key)
            expected = netcdf4_raw(path, name, key)
            assert type(got) is np.ndarray
            assert got.dtype == expected.dtype.newbyteorder("=") and got.dtype.isnative, key
            assert got.shape == expected.shape, key
            np.testing.assert_array_equal(got, expected, err_msg=str(key))


# -- values -----------------------------------------------------------------


@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("storage", sorted(STORAGE))
@pytest.mark.parametrize("dtype", DTYPES)
def test_values_match_netcdf4(tmp_path, dtype, storage, endian):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("y", 13)
        nc.createDimension("x", 17)
        var = create(nc, "v", dtype, ("y", "x"), endian=endian, **STORAGE[storage])
        var[...] = random_values(np.dtype(dtype), (13, 17), np.random.default_rng(0))
    assert_same_as_netcdf4(path, "v", KEYS)


@pytest.mark.parametrize("fill_value", [None, -7])
@pytest.mark.parametrize("storage", ["zlib-shuffle", "chunked", "contiguous"])
def test_unwritten_storage_reads_the_fill_value(tmp_path, fill_value, storage):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("y", 13)
        nc.createDimension("x", 17)
        var = create(nc, "partial", "i4", ("y", "x"), fill_value=fill_value, **STORAGE[storage])
        var[2:6, 3:4] = 5
        create(nc, "never", "f8", ("y", "x"), fill_value=fill_value, **STORAGE[storage])
    assert_same_as_netcdf4(path, "partial", KEYS)
    assert_same_as_netcdf4(path, "never", KEYS)


def test_scalar_variables(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        create(nc, "written", "f8", ())[...] = 2.5
        create(nc, "big", "i2", (), endian="big")[...] = -300
        create(nc, "unwritten", "i4", (), fill_value=42)
    for name in ["written", "big", "unwritten"]:
        assert_same_as_netcdf4(path, name, [()])
    with HDF5File(path) as f:
        assert f.variable("written").dims == ()
        assert f.variable("written").shape == ()


def test_unlimited_dimension(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("x", 6)
        rec = create(nc, "rec", "f4", ("time", "x"), zlib=True)
        rec[0:5] = np.arange(30, dtype="f4").reshape(5, 6)
        rec[9, 2] = 1  # records 5-8 never written
        create(nc, "time", "f8", ("time",))[:] = np.arange(10.0)
    keys = [(slice(None), slice(None)), (slice(3, 10, 2), 1), (-1, slice(None)), (7, 0)]
    assert_same_as_netcdf4(path, "rec", keys)
    assert_same_as_netcdf4(path, "time", [(slice(None),), (slice(4, 8),)])


def test_variables_in_groups(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 8)
        inner = nc.createGroup("a").createGroup("b")
        inner.createDimension("y", 3)
        inner_var = create(inner, "v", "u2", ("y", "x"), zlib=True, chunksizes=(2, 3))
        inner_var[...] = np.arange(24, dtype="u2").reshape(3, 8)
    assert_same_as_netcdf4(path, "a/b/v", [(slice(None), slice(None)), (1, slice(2, None, 3))])
    with HDF5File(path) as f:
        for name in ["a/b/v", "/a/b/v", "/a/b/v/"]:
            assert f.variable(name).name == "v"
            assert f.variable(name).dims == ("y", "x")


def test_netcdf4_classic(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF4_CLASSIC") as nc:
        nc.createDimension("t", None)
        nc.createDimension("x", 9)
        var = create(nc, "v", "f4", ("t", "x"), zlib=True, shuffle=True, fill_value=-1.0)
        var[0:4] = np.random.default_rng(1).random((4, 9))
        var.units = "K"
    assert_same_as_netcdf4(path, "v", [(slice(None), slice(None)), (2, slice(None, None, 2))])
    with HDF5File(path) as f:
        assert f.variable("v").attrs == {"_FillValue": np.float32(-1.0), "units": "K"}


def test_non_coordinate_variable_named_like_a_dimension(tmp_path):
    # netCDF-C stores such a variable as "_nc4_non_coord_x".
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("y", 3)
        nc.createDimension("x", 4)
        create(nc, "x", "f4", ("y",))[:] = [1, 2, 3]
    assert_same_as_netcdf4(path, "x", [(slice(None),)])
    with HDF5File(path) as f:
        assert f.variable("x").dims == ("y",)
        assert f.variable("x").name == "x"


# -- metadata ---------------------------------------------------------------


def same_attr(got, expected) -> bool:
    if isinstance(expected, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == expected.dtype and np.array_equal(got, expected)
    return type(got) is type(expected) and got == expected


def test_attributes_and_dimensions_match_netcdf4(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("x", 4)
        nc.createDimension("bare", 2)  # a dimension without a coordinate variable
        create(nc, "x", "f8", ("x",))[:] = np.arange(4.0)
        group = nc.createGroup("g")
        var = create(group, "v", "f8", ("time", "bare", "x"), endian="big", fill_value=np.float64(-9))
        var.setncattr("t_ascii", "hello")
        var.setncattr("t_utf8", "héllo ✓")
        var.setncattr("t_empty", "")
        var.setncattr("t_nul", "ab\x00cd")
        var.setncattr_string("s_one", "one")
        var.setncattr("s_many", ["a", "bb", "ccc"])
        var.setncattr("i1", np.int8(3))
        var.setncattr("u8", np.array([1, 2], "u8"))
        var.setncattr("f_be", np.array([1.5, 2.5], ">f4"))
        var.setncattr("i_list", [1, 2, 3])
        var.setncattr("missing_value", np.array([-9.0]))
        var.setncattr("empty_num", np.array([], "i4"))
        var.setncattr("scale", np.float32(2))
        create(nc, "s", "i4", ())
    with netCDF4.Dataset(path) as nc, HDF5File(path) as f:
        for name in ["g/v", "x", "s"]:
            expected = {k: nc[name].getncattr(k) for k in nc[name].ncattrs()}
            got = f.variable(name).attrs
            assert list(got) == list(expected), name
            for k in expected:
                assert same_attr(got[k], expected[k]), (name, k, got[k], expected[k])
                assert same_attr(got.get(k, "absent"), expected[k]), (name, k)
            assert got.get("no_such_attribute") is None and got.get("DIMENSION_LIST", "hidden") == "hidden"
            assert f.variable(name).dims == nc[name].dimensions


def test_missing_names_raise_key_error(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 4)  # stored as a dataset, but not a netCDF variable
        create(nc, "v", "i4", ("x",))
        nc.createGroup("g")
    with HDF5File(path) as f:
        for name in ["nope", "x", "g", "g/nope", "v/w", "", "/"]:
            with pytest.raises(KeyError):
                f.variable(name)


# -- keys -------------------------------------------------------------------


def test_bad_keys(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 4)
        create(nc, "v", "i4", ("x",))[:] = 1
    with HDF5File(path) as f:
        var = f.variable("v")
        with pytest.raises(IndexError):
            var.read((4,))
        with pytest.raises(IndexError):
            var.read((-5,))
        with pytest.raises(IndexError):
            var.read((slice(None), 0))
        with pytest.raises(IndexError):
            var.read((1.0,))
        with pytest.raises(ValueError):
            var.read((slice(None, None, -1),))


@st.composite
def selections(draw, shape):
    key = []
    for n in shape:
        if draw(st.booleans()):
            key.append(draw(st.integers(-n, n - 1)))
        else:
            start = draw(st.none() | st.integers(-n - 2, n + 2))
            stop = draw(st.none() | st.integers(-n - 2, n + 2))
            step = draw(st.none() | st.integers(1, n + 2))
            key.append(slice(start, stop, step))
    return tuple(key)


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 11)) for _ in range(ndim))
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(["contiguous", "chunked"]))
    unlimited = draw(st.booleans())  # the first dimension; its chunks may be longer than it
    options = {}
    if layout == "chunked" or unlimited:
        limits = [n + 2 if i == 0 and unlimited else n for i, n in enumerate(shape)]
        options["chunksizes"] = tuple(draw(st.integers(1, limit)) for limit in limits)
        options["zlib"] = draw(st.booleans())
        options["shuffle"] = options["zlib"] and draw(st.booleans())
        options["fletcher32"] = draw(st.booleans())
    else:
        options["contiguous"] = True
    options["endian"] = draw(st.sampled_from(["little", "big"]))
    sizes = (None if unlimited else shape[0], *shape[1:])
    # write a random box only, so that some chunks stay unwritten
    halves = [[slice(None), slice(0, max(1, n // 2)), slice(n // 2, None)] for n in shape]
    written = tuple(draw(st.sampled_from(choices)) for choices in halves)
    keys = draw(st.lists(selections(shape), min_size=1, max_size=4))
    return shape, sizes, dtype, options, written, keys


@settings(max_examples=60, deadline=None)
@given(cases())
def test_random_variables_and_selections(case):
    shape, sizes, dtype, options, written, keys = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.nc"
        with netCDF4.Dataset(path, "w") as nc:
            dims = tuple(f"d{i}" for i in range(len(shape)))
            for dim, size in zip(dims, sizes):
                nc.createDimension(dim, size)
            var = create(nc, "v", dtype, dims, **options)
            var[(slice(shape[0] - 1, shape[0]), *([0] * (len(shape) - 1)))] = 0  # sets the unlimited length
            box = np.empty(shape)[written].shape
            var[written] = random_values(np.dtype(dtype), box, np.random.default_rng(len(keys)))
        assert_same_as_netcdf4(path, "v", keys)


# -- reading machinery --------------------------------------------------------


def test_injected_read_ranges_gets_all_ranges_of_a_read_at_once(tmp_path):
    path = tmp_path / "f.nc"
    data = np.arange(20 * 30, dtype="f8").reshape(20, 30)
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("y", 20)
        nc.createDimension("x", 30)
        create(nc, "chunked", "f8", ("y", "x"), zlib=True, chunksizes=(5, 7))[...] = data
        create(nc, "contiguous", "f8", ("y", "x"), contiguous=True)[...] = data
        nc.createDimension("long", 40_000)
        create(nc, "wide", "f8", ("y", "long"), contiguous=True)[...] = np.arange(40_000.0)
    calls = []

    def read_ranges(ranges):
        calls.append(list(ranges))
        with open(path, "rb") as fh:
            out = []
            for offset, length in ranges:
                fh.seek(offset)
                out.append(fh.read(length))
            return out

    with HDF5File(path, read_ranges=read_ranges) as f:
        got = f.variable("chunked").read((slice(None), slice(None)))
        np.testing.assert_array_equal(got, data)
        assert len(calls) == 1 and len(calls[0]) == 4 * 5
        got[0, 0] = -1  # results are writeable, even from immutable bytes

        calls.clear()
        np.testing.assert_array_equal(f.variable("contiguous").read((slice(None), slice(None))), data)
        assert calls == [[(calls[0][0][0], data.nbytes)]]

        calls.clear()  # one point of a contiguous variable: read that point only
        assert f.variable("contiguous").read((7, 9)) == data[7, 9]
        assert [length for _, length in calls[0]] == [8]

        calls.clear()  # a column of long rows: one small range per row, not the whole array
        np.testing.assert_array_equal(f.variable("wide").read((slice(None), 3)), np.full(20, 3.0))
        assert [length for _, length in calls[0]] == [8] * 20


def test_concurrent_reads_of_one_variable(tmp_path):
    path = tmp_path / "f.nc"
    data = np.random.default_rng(2).normal(size=(40, 50)).astype("f4")
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("y", 40)
        nc.createDimension("x", 50)
        create(nc, "v", "f4", ("y", "x"), zlib=True, shuffle=True, chunksizes=(8, 8))[...] = data
    keys = [(slice(i, i + 13), slice(i % 7, None, 1 + i % 3)) for i in range(30)]
    with HDF5File(path) as f:
        var = f.variable("v")
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(var.read, keys))
    for key, got in zip(keys, results):
        np.testing.assert_array_equal(got, data[key])


def test_skipped_filters_in_the_chunk_mask_are_not_undone(tmp_path):
    # HDF5 may store a chunk with an optional filter skipped (bit i of its mask).
    path = tmp_path / "f.h5"
    data = np.arange(2 * 6, dtype="<i4").reshape(2, 6)
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(6)
        f["x"].make_scale("x")
        ds = f.create_dataset("v", shape=(2, 6), dtype="<i4", chunks=(1, 6), shuffle=True, compression="gzip")
        ds.dims[1].attach_scale(f["x"])
        f["y"] = np.arange(2)
        f["y"].make_scale("y")
        ds.dims[0].attach_scale(f["y"])
        ds[0] = data[0]  # through the whole pipeline
        shuffled = data[1].view(np.uint8).reshape(6, 4).T.tobytes()
        ds.id.write_direct_chunk((1, 0), shuffled, filter_mask=0b10)  # deflate skipped
    with HDF5File(path) as f:
        np.testing.assert_array_equal(f.variable("v").read((slice(None), slice(None))), data)


def test_fletcher32_on_large_and_odd_sized_chunks(tmp_path):
    # more than 65535 16-bit words per chunk, and an odd number of bytes
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 400_001)
        for dtype in ("i1", "f4"):
            var = create(nc, dtype, dtype, ("x",), fletcher32=True, chunksizes=(150_001,))
            var[:] = random_values(np.dtype(dtype), (400_001,), np.random.default_rng(3))
    for dtype in ("i1", "f4"):
        assert_same_as_netcdf4(path, dtype, [(slice(None),)])


def test_files_with_a_user_block(tmp_path):
    # HDF5 reports absolute file offsets, user block included
    path = tmp_path / "f.h5"
    with h5py.File(path, "w", userblock_size=1024) as f:
        f["x"] = np.arange(40)
        f["x"].make_scale("x")
        f["contiguous"] = np.arange(40, dtype="i4")
        f.create_dataset("chunked", data=np.arange(40, dtype="i4"), chunks=(7,), compression="gzip")
        for name in ("contiguous", "chunked"):
            f[name].dims[0].attach_scale(f["x"])
    with HDF5File(path) as f:
        for name in ("contiguous", "chunked"):
            np.testing.assert_array_equal(f.variable(name).read((slice(None),)), np.arange(40))


def test_corrupt_chunks_are_detected(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 100)
        create(nc, "sum", "i4", ("x",), fletcher32=True, chunksizes=(50,))[:] = np.arange(100)
        create(nc, "zip", "i4", ("x",), zlib=True, chunksizes=(50,))[:] = np.arange(100)
    with h5py.File(path) as f:
        targets = [f[name].id.get_chunk_info_by_coord((50,)).byte_offset + 10 for name in ("sum", "zip")]
    with open(path, "r+b") as fh:
        for offset in targets:
            fh.seek(offset)
            byte = fh.read(1)
            fh.seek(offset)
            fh.write(bytes([byte[0] ^ 0xFF]))
    with HDF5File(path) as f:
        for name in ("sum", "zip"):
            var = f.variable(name)
            np.testing.assert_array_equal(var.read((slice(0, 50),)), np.arange(50))
            with pytest.raises(OSError):
                var.read((slice(None),))


def test_a_deflated_chunk_is_inflated_only_up_to_the_selection(tmp_path):
    # The tail of the chunk's zlib stream is damaged: a selection near the start
    # never inflates that far (and reads right); one reaching the end fails.
    path = tmp_path / "f.nc"
    values = np.arange(1000, dtype="<i4")
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 1000)
        create(nc, "zip", "i4", ("x",), zlib=True, shuffle=False, chunksizes=(1000,))[:] = values
    with h5py.File(path) as f:
        info = f["zip"].id.get_chunk_info_by_coord((0,))
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size - 6)
        fh.write(b"\xff" * 6)
    with HDF5File(path) as f:
        var = f.variable("zip")
        assert var.read((7,)) == 7
        np.testing.assert_array_equal(var.read((slice(10, 500, 3),)), values[10:500:3])
        with pytest.raises(OSError, match="corrupt"):
            var.read((999,))


@pytest.mark.parametrize("endian", ["little", "big"])
def test_selections_taken_from_partly_inflated_chunks(tmp_path, endian):
    # Selections of 3-D deflated chunks (ints, steps, chunk edges) are taken straight from
    # the bytes inflated up to their last element, and equal numpy's.
    rng = np.random.default_rng(7)
    data = rng.normal(size=(7, 33, 45)).astype("f4")
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        for d, n in zip("tyx", data.shape):
            nc.createDimension(d, n)
        create(nc, "v", "f4", tuple("tyx"), zlib=True, shuffle=False, chunksizes=(3, 10, 16), endian=endian)[:] = data
    keys = [(0, 0, 0), (2, 9, 15), (1, slice(3, 9, 2), slice(1, 14, 5)), (slice(0, 2), 4, slice(None, 7))]
    for _ in range(200):
        key = tuple(int(rng.integers(n)) if rng.random() < 0.4
                    else slice(int(rng.integers(n)), None, int(rng.integers(1, 4))) for n in data.shape)
        keys.append(key)
    with HDF5File(path) as f:
        var = f.variable("v")
        for key in keys:
            got = var.read(key)
            np.testing.assert_array_equal(got, data[key])
            assert got.dtype == np.dtype("f4") and (got.ndim == 0 or got.flags.writeable)


def test_truncated_files_raise_os_error(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 100_000)
        create(nc, "v", "f8", ("x",), contiguous=True)[:] = 1.0
        create(nc, "z", "f8", ("x",), zlib=True)[:] = 1.0
    short = lambda ranges: [b"x" * (length - 1) for _, length in ranges]  # noqa: E731
    with HDF5File(path, read_ranges=short) as f:
        for name in ("v", "z"):
            with pytest.raises(OSError):
                f.variable(name).read((slice(None),))
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 1000)
    with pytest.raises(OSError):  # from h5py's end-of-file check
        HDF5File(path)


# -- what is refused ----------------------------------------------------------


def test_netcdf3_files_are_not_hdf5(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as nc:
        nc.createDimension("x", 3)
        create(nc, "v", "i4", ("x",))[:] = 1
    with pytest.raises(OSError):
        HDF5File(path)


def test_missing_files_raise_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        HDF5File(tmp_path / "absent.nc")


def test_close_releases_the_file_while_its_variables_live_on(tmp_path):
    """Closing drops the file's identifier (not FileID.close): the descriptor is released and
    a variable still referenced fails cleanly rather than reading another file's objects."""
    import os

    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 3)
        create(nc, "v", "i4", ("x",), zlib=True)[:] = [1, 2, 3]
    before = len(os.listdir("/proc/self/fd"))
    f = HDF5File(path)
    var = f.variable("v")
    assert len(os.listdir("/proc/self/fd")) == before + 1
    f.close()
    f.close()  # twice is harmless
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises((ValueError, RuntimeError)):  # (the file reader names the fragment)
        var.read((slice(0, 3, 1),))
    with pytest.raises(ValueError, match="closed"):
        f.variable("v")
    with HDF5File(path) as again:  # the same file opens afresh
        np.testing.assert_array_equal(again.variable("v").read((slice(0, 3, 1),)), [1, 2, 3])


def test_unsupported_types_and_dimensions(tmp_path):
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("y", 2)
        nc.createDimension("x", 3)
        create(nc, "chars", "S1", ("x",))
        create(nc, "strings", str, ("x",))
        create(nc, "vlen", nc.createVLType(np.int32, "ragged"), ("x",))
        create(nc, "compound", nc.createCompoundType(np.dtype([("a", "i4"), ("b", "f4")]), "pair"), ("x",))
        create(nc, "enum", nc.createEnumType(np.uint8, "flag", {"off": 0, "on": 1}), ("x",))
        create(nc, "y", "f4", ("y", "x"))  # a two-dimensional coordinate variable
    with HDF5File(path) as f:
        for name in ["chars", "strings", "vlen", "compound", "enum", "y"]:
            with pytest.raises(DirectReadUnsupported):
                f.variable(name)


def test_unsupported_storage(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(8)
        f["x"].make_scale("x")
        f.create_dataset("lzf", data=np.arange(8), compression="lzf")
        f.create_dataset("scaleoffset", data=np.arange(8), scaleoffset=0)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple((8,))
        h5py.h5d.create(f.id, b"compact", h5py.h5t.NATIVE_INT32, space, dcpl=dcpl)
        f.create_dataset("external", data=np.arange(8), external=[(str(tmp_path / "raw.bin"), 0, 64)])
        for name in ["lzf", "scaleoffset", "compact", "external"]:
            f[name].dims[0].attach_scale(f["x"])
        f["nodims"] = np.arange(8)  # no dimension scales: netCDF would invent "phony" names
    with HDF5File(path) as f:
        for name in ["lzf", "scaleoffset", "compact", "external", "nodims"]:
            with pytest.raises(DirectReadUnsupported):
                f.variable(name)


# ---------------------------------------------------------------------------
# Files in memory (whole remote objects): a file image when small, a zero-copy file object when large
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "zlib"])
@pytest.mark.parametrize("size", ["small", "large"])  # either side of the file-image threshold (1 MiB)
def test_file_in_memory_reads_like_the_file_on_disk(tmp_path, layout, size):
    shape = (8, 16, 20) if size == "small" else (16, 128, 160)
    data = np.random.default_rng(0).normal(size=shape).astype("f4")
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        for d, n in zip("tyx", shape):
            nc.createDimension(d, n)
        create(nc, "v", "f4", tuple("tyx"), **({"contiguous": True} if layout == "contiguous"
                                                else {"chunksizes": (2, 16, 20), "zlib": True}))[...] = data
    raw = path.read_bytes()
    assert (len(raw) > 1 << 20) == (size == "large")
    for source in (raw, bytearray(raw), np.frombuffer(raw, np.uint8).copy()):
        with HDF5File(source, label="in memory") as f:
            var = f.variable("v")
            assert var.dims == ("t", "y", "x")
            for key in [(slice(None),) * 3, (1, slice(2, 9, 3), slice(None)), (7, 15, 19)]:
                np.testing.assert_array_equal(var.read(key), data[key])


def test_file_in_memory_reads_are_fresh_writable_arrays(tmp_path):
    """A whole contiguous variable read from blocks in memory is copied once, straight out of
    the blocks, into an aligned array of its own (not a view of what was received)."""
    from daskcfa.storage.blocks import Blocks

    data = np.arange(4 * 300 * 300, dtype="f4").reshape(4, 300, 300)
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        for d, n in zip("tyx", data.shape):
            nc.createDimension(d, n)
        create(nc, "v", "f4", tuple("tyx"), contiguous=True)[...] = data
    raw = path.read_bytes()
    everything = (slice(None),) * 3
    pieces = [raw[k:k + 65536] for k in range(0, len(raw), 65536)]
    for source in (Blocks(pieces), raw, Blocks([raw])):
        with HDF5File(source, label="in memory") as f:
            var = f.variable("v")
            first, second = var.read(everything), var.read(everything)
        for got in (first, second):
            np.testing.assert_array_equal(got, data)
            assert got.flags.writeable and got.flags.aligned
        assert not np.shares_memory(first, second)
        first[0, 0, 0] = -1  # the caller's to change
        np.testing.assert_array_equal(second, data)

def one_deflated_chunk(path: Path, data: np.ndarray) -> Path:
    """A file whose 2-D variable ``v`` holds ``data`` in one chunk, deflated only (no shuffle)."""
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("y", data.shape[0])
        nc.createDimension("x", data.shape[1])
        create(nc, "v", data.dtype.str, ("y", "x"), zlib=True, shuffle=False, chunksizes=data.shape)[:] = data
    return path


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's per-process I/O counters")
def test_a_point_in_a_local_deflated_chunk_reads_only_the_head_of_its_stream(tmp_path):
    # Incompressible values in one 4 MB chunk: a point a tenth of the way in needs about a tenth of
    # the stream, and only that much (plus a small margin) is read from the file.
    data = np.random.default_rng(3).integers(0, 2**31, size=(1000, 1000), dtype="<i4")
    with HDF5File(one_deflated_chunk(tmp_path / "f.nc", data)) as f:
        var = f.variable("v")
        before = bytes_read()
        assert var.read((100, 500)) == data[100, 500]
        assert bytes_read() - before < 0.2 * data.nbytes


def test_a_chunk_whose_head_holds_less_than_its_share_is_read_on(tmp_path):
    # Random values then zeros in one chunk: the stream's first 40% holds far less than 40% of the
    # values, so the head first read falls short and the rest of the stream is read after it.
    data = np.zeros((1000, 250), "<f4")
    data[:500] = np.random.default_rng(4).normal(size=(500, 250))
    with HDF5File(one_deflated_chunk(tmp_path / "f.nc", data)) as f:
        var = f.variable("v")
        for key in [(400, 7), (499, 249), (10, slice(None)), (slice(300, 600, 7), 3), (700, 1)]:
            np.testing.assert_array_equal(var.read(key), data[key])


def test_numeric_types_are_read_only_when_exactly_the_numpy_type(tmp_path):
    # Types with the size, sign and byte order of a numpy type but other bits (a 24-bit integer in
    # 4 bytes, an enumeration, a 16-bit float with an odd exponent) are refused; big-endian
    # attributes read as netCDF4-python reads them.
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 3)
        create(nc, "v", "f4", ("x",))[:] = [1, 2, 3]
    odd_int = h5py.h5t.STD_I32LE.copy()
    odd_int.set_precision(24)
    odd_float = h5py.h5t.IEEE_F64LE.copy()
    odd_float.set_fields(63, 52, 11, 0, 52)
    odd_float.set_ebias(1000)
    with h5py.File(path, "r+") as f:
        for name, tid in (("odd_int", odd_int), ("odd_float", odd_float)):
            h5py.h5d.create(f.id, name.encode(), tid, h5py.h5s.create(h5py.h5s.SCALAR))
        f.create_dataset("enum", data=np.int16(1), dtype=h5py.enum_dtype({"a": 0, "b": 1}, basetype="i2"))
        for k, dtype in enumerate([">i2", ">u4", ">i8", ">f4", ">f8", "<u8", "i1"]):
            f["v"].attrs.create(f"a{k}", np.array([1, 2, 250]).astype(dtype), dtype=dtype)
    with HDF5File(path) as f, netCDF4.Dataset(path) as nc:
        for name in ("odd_int", "odd_float", "enum"):
            with pytest.raises(DirectReadUnsupported, match="data type"):
                f.variable(name)
        attrs = f.variable("v").attrs
        for k in range(7):
            expected = nc["v"].getncattr(f"a{k}")
            np.testing.assert_array_equal(attrs[f"a{k}"], expected)
            assert attrs[f"a{k}"].dtype == expected.dtype


_CLASS_VALUES = [
    (b"DIMENSIOq_SCALE", False),  # a hostile 16-byte value: HDF5 2.0's H5DSis_scale frees twice, aborting
    (b"DIMENSION_SCALE", True),
    (b"DIMENSION", True),  # HDF5 compares the shorter of the two texts: a prefix is a scale
    (b"", True),
]


@pytest.mark.parametrize("value, scale", _CLASS_VALUES, ids=["other", "exact", "prefix", "empty"])
def test_a_class_attribute_of_any_value_never_kills_the_reader(tmp_path, value, scale):
    """A coordinate variable's ``CLASS`` is told as HDF5 tells a dimension scale, without HDF5's
    own call, which aborted the whole process on a value other than a scale's."""
    import subprocess
    import sys

    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 3)
        ds.createVariable("x", "f8", ("x",))[:] = [1.0, 2.0, 3.0]
        ds.createVariable("v", "f4", ("x",))[:] = [4.0, 5.0, 6.0]
    with h5py.File(path, "r+") as f:
        dsid = f["x"].id
        h5py.h5a.delete(dsid, b"CLASS")
        tid = h5py.h5t.C_S1.copy()
        tid.set_size(16)
        tid.set_strpad(h5py.h5t.STR_NULLTERM)
        h5py.h5a.create(dsid, b"CLASS", tid, h5py.h5s.create(h5py.h5s.SCALAR)).write(
            np.array(value, "S16"), mtype=tid)
    code = (
        "import sys\n"
        "from daskcfa.fragments.hdf5 import DirectReadUnsupported, HDF5File\n"
        "with HDF5File(sys.argv[1], parse=False) as f:\n"
        "    for name in ('x', 'v'):\n"
        "        try:\n"
        "            print(name, f.variable(name).dims)\n"
        "        except DirectReadUnsupported:\n"
        "            print(name, 'unsupported')\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = ["x ('x',)", "v ('x',)"] if scale else ["x unsupported", "v ('x',)"]
    assert done.stdout.split("\n")[:2] == expected
