"""The direct netCDF-3 reader (``daskcfa.fragments.netcdf3``) against netCDF4-python.

Files are written with netCDF4-python in the three netCDF-3 formats (every
type each allows, fixed and record variables, one or several record
variables, attributes of every type); every variable, attribute and
selection read directly must equal what netCDF4-python returns with
``set_auto_maskandscale(False)``: values, dtype, shape, attribute types.
"""

from __future__ import annotations

import os
import random
import struct

import dask
import netCDF4
import numpy as np
import pytest

import daskcfa
from daskcfa.errors import CFAError, FragmentReadError
from daskcfa.fragments.files import open_fragment
from daskcfa.fragments.netcdf3 import NetCDF3File, NetCDF3Variable, open_netcdf3
from daskcfa.storage.blocks import Blocks

FORMATS = ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA"]
CLASSIC_TYPES = ["i1", "i2", "i4", "f4", "f8"]
CDF5_TYPES = CLASSIC_TYPES + ["u1", "u2", "u4", "i8", "u8"]


def _write(path, fmt: str, nrecord: int) -> None:
    """Every type as a fixed (t0, y, x) and, ``nrecord`` of them, as record variables."""
    types = CDF5_TYPES if fmt == "NETCDF3_64BIT_DATA" else CLASSIC_TYPES
    rng = np.random.default_rng(3)
    with netCDF4.Dataset(path, "w", format=fmt) as nc:
        nc.createDimension("t", None)
        nc.createDimension("t0", 4)
        nc.createDimension("y", 3)
        nc.createDimension("x", 5)
        nc.title = "h\u00e9llo"
        nc.numbers = np.arange(3, dtype="i2")
        for k, t in enumerate(types):
            info = np.iinfo(t) if t[0] in "iu" else np.finfo(t)
            values = rng.integers(int(max(info.min, -1e6)), int(min(info.max, 1e6)), (4, 3, 5)).astype(t)
            fixed = nc.createVariable(f"fixed_{t}", t, ("t0", "y", "x"), fill_value=np.array(7, t))
            fixed[:] = values
            fixed.units = "K"
            fixed.scale_factor = np.float32(0.5)
            fixed.valid_range = np.array([0, 100], t)
            fixed.flag = np.array([1], "i1")
            fixed.empty = ""
            if k < nrecord:
                rec = nc.createVariable(f"rec_{t}", t, ("t", "y", "x"))
                rec[:4] = values[::-1]
                rec.long_name = "record"
        nc.createVariable("scalar", "f8", ()).assignValue(2.5)
        nc.createVariable("text", "S1", ("y", "x"))[:] = np.array([list("abcde")] * 3, "S1")


KEYS = [
    (slice(None), slice(None), slice(None)),
    (slice(1, 4, 2), 1, slice(0, 5, 3)),
    (2, slice(None), 4),
    (slice(0, 4, 3), slice(None), slice(None)),
    (slice(3, 3), slice(None), slice(None)),
    (-1, slice(1, None), slice(None, None, 2)),
]


def _same_attributes(got: dict, nc_var) -> None:
    want = {k: nc_var.getncattr(k) for k in nc_var.ncattrs()}
    assert list(got) == list(want)
    for k, value in want.items():
        assert type(got[k]) is type(value) and np.array_equal(got[k], value), (k, got[k], value)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("nrecord", [0, 1, 3])
@pytest.mark.parametrize("where", ["disk", "bytes", "blocks"])
def test_every_variable_reads_as_netcdf4_python_reads_it(tmp_path, fmt, nrecord, where):
    path = tmp_path / "f.nc"
    _write(path, fmt, nrecord)
    data = path.read_bytes()
    if where == "disk":
        f = open_netcdf3(str(path))
    else:  # whole objects in memory, as remote fragments arrive (in several blocks, too)
        f = NetCDF3File(data=data if where == "bytes" else Blocks([data[:1000], data[1000:1001], data[1001:]]))
    with netCDF4.Dataset(path) as nc:
        for name, v in nc.variables.items():
            v.set_auto_maskandscale(False)
            if v.dtype == np.dtype("S1"):
                continue
            got = f.variable(name)
            assert (got.dims, got.shape, got.dtype) == (v.dimensions, v.shape, v.dtype), name
            _same_attributes(got.attrs, v)
            for key in KEYS[:1] if v.ndim != 3 else KEYS:
                if v.ndim == 0:
                    want, value = np.asarray(v.getValue()), got.read(())
                else:
                    want, value = np.asarray(v[key[:v.ndim]]), got.read(key[:v.ndim])
                assert value.dtype == want.dtype and value.shape == want.shape, (name, key)
                np.testing.assert_array_equal(value, want, err_msg=f"{name} {key}")
    f.close()


def test_netcdf3_fragments_use_the_direct_reader_and_text_falls_back(tmp_path):
    # issue 13 item 11: the engine follows the file's signature; h5py is not tried on netCDF-3
    path = tmp_path / "f.nc"
    _write(path, "NETCDF3_CLASSIC", 1)
    with open_fragment(str(path), "fixed_f4") as var:
        assert isinstance(var._var, NetCDF3Variable)
        with netCDF4.Dataset(path) as nc:
            np.testing.assert_array_equal(var.read((slice(None),) * 3), nc["fixed_f4"][:].data)
    with open_fragment(str(path), "text") as var:  # character data: netCDF4-python's rules
        assert not isinstance(var._var, NetCDF3Variable)
    with dask.config.set({"daskcfa.io.engine": "netcdf4"}):
        with open_fragment(str(path), "rec_i1") as var:
            assert not isinstance(var._var, NetCDF3Variable)
    with pytest.raises(FragmentReadError, match="not found"):
        with open_fragment(str(path), "grp/fixed_f4"):
            pass


def test_aggregation_of_netcdf3_fragments_reads_the_ground_truth(tmp_path):
    truth = np.random.default_rng(0).normal(280, 5, (9, 4, 6)).astype("f4")
    truth[2, 1, 1] = netCDF4.default_fillvals["f4"]
    for fmt in FORMATS:
        url = daskcfa.to_cfa(truth, str(tmp_path / f"{fmt}.nc"), variable="tas", dims=("time", "lat", "lon"),
                             fragment_shape=(2, 4, 3), fragment_format=fmt)
        got = daskcfa.from_cfa(url).compute()
        expected = np.ma.masked_equal(truth, netCDF4.default_fillvals["f4"])
        np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))
        np.testing.assert_array_equal(got.filled(0), expected.filled(0))
        np.testing.assert_array_equal(daskcfa.from_cfa(url)[::4, 3, ::2].compute(), truth[::4, 3, ::2])


def test_damaged_headers_give_values_or_a_daskcfa_error(tmp_path):
    # hostile input: 400 random byte changes in the header, each read directly;
    # a header change may legitimately change values (netCDF-3 has no checksums),
    # but nothing may escape as a bare Python error, hang or allocate without bound
    path = tmp_path / "f.nc"
    _write(path, "NETCDF3_64BIT_OFFSET", 2)
    data = path.read_bytes()
    header_end = min(v.begin for v in NetCDF3File(data=data)._layout.vars.values())
    rng = random.Random(11)
    outcomes = {"read": 0, "error": 0}
    for _ in range(400):
        damaged = bytearray(data)
        for _ in range(rng.choice((1, 2, 4))):
            damaged[rng.randrange(4, header_end)] = rng.randrange(256)
        try:
            f = NetCDF3File(data=bytes(damaged))
            for name in ("fixed_f4", "rec_i1", "scalar"):
                v = f.variable(name)
                v.read((slice(None),) * len(v.shape))
            outcomes["read"] += 1
        except (CFAError, KeyError):
            outcomes["error"] += 1
        except Exception as exc:  # DirectReadUnsupported (a variable turned to text) is a fallback, fine
            assert type(exc).__name__ == "DirectReadUnsupported", repr(exc)
            outcomes["error"] += 1
    assert outcomes["read"] and outcomes["error"], outcomes


def test_a_small_truncated_file_is_refused_and_its_descriptor_closed_once(tmp_path):
    """A small file is read whole and its descriptor closed at once; when its header then turns out
    bad, the error is the FragmentReadError, not a second close's EBADF (which, in a threaded
    process, could also close another thread's file)."""
    path = tmp_path / "f.nc"
    _write(path, "NETCDF3_CLASSIC", 2)
    path.write_bytes(path.read_bytes()[:-8])
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(FragmentReadError, match="truncated"):
            open_netcdf3(str(path))
    assert len(os.listdir("/proc/self/fd")) == before


def _classic(dims: list[tuple[str, int]], dimids: tuple[int, ...], values: np.ndarray) -> bytes:
    """A netCDF-3 classic file written byte by byte: ``dims``, no global attributes, and one
    float variable ``v`` over ``dimids`` with ``units`` "K", holding ``values`` (a header may
    be made wrong on purpose)."""
    def name(text: str) -> bytes:
        raw = text.encode()
        return struct.pack(">I", len(raw)) + raw + b"\0" * (-len(raw) % 4)

    dim_list = struct.pack(">II", 0x0A, len(dims)) + b"".join(name(n) + struct.pack(">I", size) for n, size in dims)
    units = struct.pack(">II", 0x0C, 1) + name("units") + struct.pack(">II", 2, 1) + b"K\0\0\0"
    data = values.astype(">f4").tobytes()
    head = b"CDF\x01" + struct.pack(">I", 0) + dim_list + struct.pack(">II", 0, 0)
    var = name("v") + struct.pack(f">I{len(dimids)}I", len(dimids), *dimids) + units + struct.pack(">II", 5, len(data))
    var_list = struct.pack(">II", 0x0B, 1) + var
    begin = len(head) + len(var_list) + 4
    return head + var_list + struct.pack(">I", begin) + data


def test_a_variable_list_read_before_is_reused_only_in_a_header_where_it_means_the_same(tmp_path):
    """Headers of an archive's fragments mostly hold the same variable list, which is parsed once and
    then compared byte for byte (issue #31). The same bytes after a dimension list as long but with
    fewer dimensions name a dimension that does not exist there: that header is refused, as when
    parsed afresh, not given the variables of the first (nor a bare IndexError)."""
    values = np.arange(6, dtype="f4").reshape(2, 3, 1)
    good = _classic([("t", 2), ("y", 3), ("q", 1)], (0, 1, 2), values)
    wrong = _classic([("t", 2), ("yyyyyyyyyyyyyyyy", 3)], (0, 1, 2), values)  # (its dimension list as long)
    assert good[52:] == wrong[52:]  # (all but the dimension lists, 44 bytes after the first 8, are the same)
    for _ in range(2):  # (the second time, the good file's variable list is the one remembered)
        path = tmp_path / "good.nc"
        path.write_bytes(good)
        with netCDF4.Dataset(path) as nc:
            want = nc["v"][:].data
        got = open_netcdf3(str(path)).variable("v")
        np.testing.assert_array_equal(got.read((slice(None),) * 3), want)
        assert got.attrs == {"units": "K"}
        with pytest.raises(FragmentReadError, match="malformed"):
            NetCDF3File(data=wrong)


def test_a_variable_found_again_has_its_attributes_decoded_once_and_each_reader_its_own(tmp_path):
    """Fragments holding the same variable list (the same bytes at the same place) share its variables,
    whose attributes are decoded once (issue #31): each file's are still netCDF4-python's, and each
    reader gets its own dict and arrays, so what one caller changes no other sees."""
    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.nc"
        with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as nc:
            nc.history = f"file {name}"  # (as long in both: the variable lists are at the same place)
            nc.createDimension("x", 3)
            var = nc.createVariable("v", "i2", ("x",))
            var.long_name = "a variable"
            var.valid_range = np.array([0, 10], "i2")
            var[:] = [1, 2, 3]
        paths.append(str(path))
    truth = []
    for path in paths:
        with netCDF4.Dataset(path) as nc:
            truth.append(nc["v"].__dict__)
    first, second = (open_netcdf3(p).variable("v") for p in paths)
    for got, want in zip((first, second), truth):
        assert got.attrs.keys() == want.keys()
        for key, value in want.items():
            np.testing.assert_array_equal(got.attrs[key], value)
            assert type(got.attrs[key]) is type(value) and np.asarray(got.attrs[key]).dtype == np.asarray(value).dtype
    assert first.attrs["long_name"] is second.attrs["long_name"]  # (decoded once)
    assert first.attrs is not second.attrs and first.attrs["valid_range"] is not second.attrs["valid_range"]
    first.attrs["valid_range"][0] = 99
    first.attrs["units"] = "K"
    for other in (second, open_netcdf3(paths[0]).variable("v")):
        np.testing.assert_array_equal(other.attrs["valid_range"], [0, 10])
        assert "units" not in other.attrs
