"""The fragment grid of the ``aggregated_dimensions`` dialects (daskcfa.formats.cf).

Files are written here with netCDF4-python from the specification text
(``/work/shared/formats.md``): the ``map`` (CFA-0.6.2: ``location``) and its
padding, zero-length dimensions, sums that overflow, and CFA-0.6.2
``address`` over the alternative-URI dimension. Results are compared with
numpy ground truth built by the test, read from local disk and from the S3
test server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskcfa
from builders import assert_matches, build_cf113, build_cfa06, make_truth, write_fragment_file, write_strings

pytestmark = pytest.mark.usefixtures("other_cwd", "sync_dask")

DIMS = ("time", "lat", "lon")
INT64_MAX = 2**63 - 1


def write_map_aggregation(path: Path, dims: dict[str, int], map_rows, *, map_dtype="i4", map_attrs=None,
                          unique_values=None, dialect="CF-1.13", dtype="f4", attrs=None) -> Path:
    """An aggregation from the spec's CDL: ``map`` (or CFA-0.6.2 ``location``) given row by
    row as written (padding included), with ``unique_values`` over the fragment grid.
    For CFA-0.6.2 (no unique values there) every fragment is a wholly missing one."""
    map_rows = np.asarray(map_rows, dtype=object)
    grid = unique_values.shape if unique_values is not None else None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.13" if dialect == "CF-1.13" else "CF-1.11 CFA-0.6.2"
        for name, n in dims.items():
            ds.createDimension(name, n)
        ds.createDimension("i", map_rows.shape[0])
        ds.createDimension("j", map_rows.shape[1])
        m = ds.createVariable("fragment_map", map_dtype, ("i", "j"), fill_value=False)
        m.set_auto_maskandscale(False)
        for k, v in (map_attrs or {}).items():
            m.setncattr(k, np.array(v, dtype=map_dtype) if k in ("_FillValue", "missing_value") else v)
        m[...] = np.array(map_rows.tolist(), dtype=map_dtype)
        fdims = tuple(f"f_{d}" for d in dims)
        if grid is not None:
            for d, n in zip(fdims, grid):
                ds.createDimension(d, n)
        var = ds.createVariable("tas", dtype, ())
        var.setncatts({"units": "K", **(attrs or {})})
        var.aggregated_dimensions = " ".join(dims)
        if dialect == "CF-1.13":
            u = ds.createVariable("fragment_values", dtype, fdims)
            u[...] = unique_values
            var.aggregated_data = "map: fragment_map unique_values: fragment_values"
        else:
            write_strings(ds, "cfa_file", fdims, np.full(grid, "", dtype=object))
            write_strings(ds, "cfa_address", fdims, np.full(grid, "", dtype=object))
            write_strings(ds, "cfa_format", (), "nc")
            var.aggregated_data = "location: fragment_map file: cfa_file format: cfa_format address: cfa_address"
    return path


def expect_format_error(url, options, *mentions):
    with pytest.raises(daskcfa.CFAFormatError) as info:
        daskcfa.from_cfa(url, "tas", storage_options=options)
    err = info.value
    assert err.variable == "/tas" and "'/tas'" in str(err)
    assert err.file is not None and Path(url).name in err.file and Path(url).name in str(err)
    for word in mentions:
        assert word in str(err), str(err)
    return err


# ---------------------------------------------------------------------------
# Zero-length dimensions ("0 is a size, not padding")
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("builder", [build_cf113, build_cfa06])
@pytest.mark.parametrize("shape, sizes", [((0, 4, 5), ((0,), (4,), (2, 3))), ((6, 0, 5), ((2, 4), (0,), (5,)))])
def test_zero_length_dimension_of_one_fragment_of_size_0(tmp_path, placed, builder, shape, sizes):
    built = builder(tmp_path / "ds", make_truth(shape, "i2"), DIMS, sizes, attrs={"scale_factor": 0.5})
    url, options = placed(built.path)
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    truth = np.zeros(shape, "i2") * np.float64(0.5)  # numpy's promotion, as netCDF4-python unpacks
    assert x.shape == shape and x.dtype == truth.dtype
    got = x.compute()
    assert got.shape == shape and got.dtype == truth.dtype
    assert x[:, 1:3].compute().shape == truth[:, 1:3].shape
    with daskcfa.open_cfa(url, storage_options=options) as ds:
        assert ds["tas"].shape == shape
    ds = xarray.open_dataset(url, engine="daskcfa", backend_kwargs={"storage_options": options})
    assert ds["tas"].shape == shape and ds["tas"].load().values.size == 0
    summary = daskcfa.describe(url, storage_options=options)
    assert next(v for v in summary.variables if v.name == "/tas").shape == shape
    report = daskcfa.verify(url, deep=True, storage_options=options)
    assert not report.problems


def test_zero_length_dimension_in_the_cli(tmp_path):
    built = build_cf113(tmp_path / "ds", make_truth((0, 4, 5)), DIMS, ((0,), (4,), (2, 3)))
    for command, shown in ((["info"], "time=0"), (["verify", "--deep"], "OK")):
        run = subprocess.run([sys.executable, "-m", "daskcfa", *command, str(built.path)], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
        assert shown in run.stdout


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6"])
@pytest.mark.parametrize("map_rows", [[[-1, -1], [4, -1], [2, 3]], [[0, -1], [4, -1], [2, 3]]])
def test_zero_length_dimension_with_no_fragment_or_one_of_size_0(tmp_path, placed, dialect, map_rows):
    """A row of padding alone (no fragments along the dimension) or one size 0: an empty array."""
    grid = tuple(sum(1 for s in row if s >= 0) for row in map_rows)
    path = write_map_aggregation(tmp_path / "ds" / "a.nc", {"time": 0, "lat": 4, "lon": 5}, map_rows,
                                 unique_values=np.full(grid, 7.5, "f4"), dialect=dialect)
    url, options = placed(path)
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    assert x.shape == (0, 4, 5) and x.dtype == np.float32
    assert x.compute().shape == (0, 4, 5)
    assert x.rechunk((1, 2, 2)).compute().shape == (0, 4, 5)
    assert daskcfa.from_cfa(url, "tas", chunks="auto", storage_options=options).compute().shape == (0, 4, 5)
    ds = xarray.open_dataset(url, engine="daskcfa", backend_kwargs={"storage_options": options})
    assert ds["tas"].load().shape == (0, 4, 5)
    assert not daskcfa.verify(url, deep=True, storage_options=options).problems


def test_zero_sized_fragment_among_others(tmp_path, placed):
    """0 in the middle of a row is a fragment of size 0, not padding: the others still place right."""
    values = np.array([[[1.0]], [[2.0]], [[3.0]]], "f4")  # grid 3 x 1 x 1 along time
    path = write_map_aggregation(tmp_path / "ds" / "a.nc", {"time": 5, "lat": 2, "lon": 3},
                                 [[2, 0, 3], [2, -1, -1], [3, -1, -1]], unique_values=values)
    url, options = placed(path)
    got = daskcfa.from_cfa(url, "tas", storage_options=options).compute()
    truth = np.concatenate([np.full((2, 2, 3), 1.0), np.full((3, 2, 3), 3.0)]).astype("f4")
    assert_matches(got, truth)


# ---------------------------------------------------------------------------
# The map's padding and integer types; sums that overflow
# ---------------------------------------------------------------------------
PADDINGS = {
    "default fill": ({}, None),
    "negative": ({}, -5),
    "_FillValue": ({"_FillValue": 9}, 9),
    "missing_value": ({"missing_value": 11}, 11),
}


@pytest.mark.parametrize("map_dtype", ["i4", "i8"])
@pytest.mark.parametrize("padding", sorted(PADDINGS))
def test_map_padding_and_integer_types(tmp_path, placed, map_dtype, padding):
    attrs, pad = PADDINGS[padding]
    pad = netCDF4.default_fillvals[map_dtype] if pad is None else pad
    truth = make_truth((9, 4, 12), seed=9, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, ((2, 3, 4), (4,), (12,)))
    with netCDF4.Dataset(str(built.path), "a") as ds:
        ds.createDimension("j2", 3)
        m = ds.createVariable("map2", map_dtype, ("i", "j2"), fill_value=attrs.get("_FillValue", False))
        m.set_auto_maskandscale(False)
        if "missing_value" in attrs:
            m.missing_value = np.array(attrs["missing_value"], map_dtype)
        m[...] = np.array([[2, 3, 4], [4, pad, pad], [12, pad, pad]], map_dtype)
        ds["tas"].aggregated_data = ds["tas"].aggregated_data.replace("fragment_map", "map2")
    url, options = placed(built.path)
    assert_matches(daskcfa.from_cfa(url, "tas", storage_options=options).compute(), built.expected)


@pytest.mark.parametrize("rows, dims, mentions", [
    # "sums" to 4 in int64 arithmetic (wraps), which used to be accepted
    ([[INT64_MAX, INT64_MAX, 6], [4, -1, -1], [5, -1, -1]], {"time": 4, "lat": 4, "lon": 5},
     ("'fragment_map' row 0", "larger than")),
    ([[INT64_MAX, 2, -1], [4, -1, -1], [5, -1, -1]], {"time": 1, "lat": 4, "lon": 5}, ("row 0", "larger than")),
    # zeros used as padding: three fragments along each dimension, the grid variable says one
    ([[3, 0, -1], [4, 0, -1], [5, 0, -1]], {"time": 3, "lat": 4, "lon": 5}, ("(1, 1, 1)", "not padding")),
    ([[3, -1, 1], [4, -1, -1], [5, -1, -1]], {"time": 4, "lat": 4, "lon": 5}, ("row 0", "padding before")),
    ([[-1, -1, -1], [4, -1, -1], [5, -1, -1]], {"time": 3, "lat": 4, "lon": 5}, ("row 0", "no fragment sizes")),
])
def test_malformed_maps_are_refused(tmp_path, placed, rows, dims, mentions):
    path = write_map_aggregation(tmp_path / "ds" / "a.nc", dims, rows, map_dtype="i8",
                                 unique_values=np.zeros((1, 1, 1), "f4"))
    url, options = placed(path)
    expect_format_error(url, options, *mentions)


def test_unsigned_map_beyond_int64_is_refused_not_wrapped(tmp_path):
    """uint64 2**64 - 3 would wrap to -3 (padding) in int64: the map is malformed instead."""
    path = write_map_aggregation(tmp_path / "a.nc", {"time": 4, "lat": 4, "lon": 5},
                                 [[4, 2**64 - 3], [4, 2**64 - 3], [5, 2**64 - 3]], map_dtype="u8",
                                 unique_values=np.zeros((1, 1, 1), "f4"))
    expect_format_error(str(path), None, "beyond the 64-bit")


def test_packing_attributes_on_the_map_are_not_applied(tmp_path):
    """Sizes are never packed: a scale_factor on the map must not turn 4 into 2."""
    path = write_map_aggregation(tmp_path / "a.nc", {"time": 4, "lat": 4, "lon": 5},
                                 [[4], [4], [5]], map_attrs={"scale_factor": 0.5},
                                 unique_values=np.full((1, 1, 1), 2.5, "f4"))
    assert_matches(daskcfa.from_cfa(str(path), "tas").compute(), np.full((4, 4, 5), 2.5, "f4"))


def test_empty_dimension_does_not_lift_the_fragment_limit(tmp_path):
    """A zero-length dimension must not let another row list any number of fragments."""
    import dask

    rows = [[-1] * 50, [1] * 50, [1] * 50]
    path = write_map_aggregation(tmp_path / "a.nc", {"time": 0, "lat": 50, "lon": 50}, rows,
                                 unique_values=np.zeros((0, 50, 50), "f4"))
    with dask.config.set({"daskcfa.limits.max-fragments": 100}):
        expect_format_error(str(path), None, "more than the limit")
    assert daskcfa.from_cfa(str(path), "tas").compute().shape == (0, 50, 50)


def _spec_grid(rows, dims):
    """The fragment sizes that formats.md's rules give a map (the test's own reading of the spec), or None."""
    sizes = []
    for row, n in zip(rows, dims):
        kept = [int(v) for v in row if v >= 0]
        if any(v < 0 for v in row[: len(kept)]) or sum(kept) != n or (not kept and n):
            return None
        sizes.append(kept)
    return sizes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_map_reads_exactly_or_is_a_format_error(tmp_path_factory, data):
    """Hostile maps (any int64 values, any padding) against the spec's rules read by the test itself."""
    dims = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=3), label="dims")
    width = data.draw(st.integers(1, 4), label="width")
    value = st.one_of(st.integers(-3, 7), st.sampled_from([INT64_MAX, -INT64_MAX - 1, 2**62, 2**32 + 1]))
    rows = data.draw(st.lists(st.lists(value, min_size=width, max_size=width), min_size=len(dims),
                              max_size=len(dims)), label="rows")
    sizes = _spec_grid(rows, dims)
    grid = tuple(len(s) for s in sizes) if sizes is not None else tuple(max(1, sum(v >= 0 for v in r)) for r in rows)
    values = np.arange(int(np.prod(grid)), dtype="f4").reshape(grid)
    path = write_map_aggregation(tmp_path_factory.mktemp("map") / "a.nc",
                                 {f"d{k}": n for k, n in enumerate(dims)}, rows, map_dtype="i8",
                                 unique_values=values)
    if sizes is None:
        with pytest.raises(daskcfa.CFAFormatError):
            daskcfa.from_cfa(str(path), "tas")
        return
    truth = values
    for axis, row in enumerate(sizes):
        truth = np.repeat(truth, row, axis=axis)
    assert_matches(daskcfa.from_cfa(str(path), "tas").compute(), truth)


# ---------------------------------------------------------------------------
# CFA-0.6.2 address over the alternative-URI dimension
# ---------------------------------------------------------------------------
ALT_SIZES = ((2, 3), (4,), (2, 3))  # a 2 x 1 x 2 grid


def write_cfa062_alternatives(directory: Path, truth: np.ma.MaskedArray, address: str, fmt: str,
                              file_format: str = "NETCDF4") -> Path:
    """CFA-0.6.2 from the spec: ``file`` with a trailing dimension of 2 alternative URIs.

    Fragment (0, 0, 0): first URI absent, second present holding the data as ``tas_b``;
    (0, 0, 1): one URI, padded; (1, 0, 0): first URI present (``tas_a``), the second
    would hold other values under ``tas_b``; (1, 0, 1): inside the aggregation file.
    ``address``: "alternatives" (over file's dimensions, padded with missing values),
    "per-fragment" (names must then agree) or "scalar". netCDF-3 files hold strings as char arrays.
    """
    style = "char" if file_format.startswith("NETCDF3") else "vlen"
    directory.mkdir(parents=True, exist_ok=True)
    offsets = [np.cumsum((0,) + row) for row in ALT_SIZES]

    def block(index):
        return truth[tuple(slice(o[i], o[i + 1]) for o, i in zip(offsets, index))]

    one_name = address != "alternatives"
    a, b = ("tas", "tas") if one_name else ("tas_a", "tas_b")
    files = np.full((2, 1, 2, 2), "", dtype=object)
    names = np.full((2, 1, 2, 2), "", dtype=object)
    files[0, 0, 0], names[0, 0, 0] = ["gone/nowhere.nc", "f000.nc"], ["tas_gone", b]
    files[0, 0, 1], names[0, 0, 1] = ["f001.nc", ""], [a, ""]
    files[1, 0, 0], names[1, 0, 0] = ["f100.nc", "f100_decoy.nc"], [a, b]
    names[1, 0, 1] = ["in_file_tas", ""]
    fill = np.float32(-999.0)
    for index, (name, uri) in {(0, 0, 0): (b, "f000.nc"), (0, 0, 1): (a, "f001.nc"), (1, 0, 0): (a, "f100.nc"),
                               }.items():
        write_fragment_file(directory / uri, name, DIMS, block(index).filled(fill), {"units": "K", "_FillValue": fill})
    write_fragment_file(directory / "f100_decoy.nc", b, DIMS, np.full(block((1, 0, 0)).shape, 1e6, "f4"),
                        {"units": "K"})
    with netCDF4.Dataset(str(directory / "agg.nc"), "w", format=file_format) as ds:
        ds.Conventions = "CF-1.11 CFA-0.6.2"
        for d, row in zip(DIMS, ALT_SIZES):
            ds.createDimension(d, sum(row))
        for d, n in zip(("f_time", "f_lat", "f_lon", "f_alt", "i", "j"), (2, 1, 2, 2, 3, 2)):
            ds.createDimension(d, n)
        location = ds.createVariable("cfa_location", "i4", ("i", "j"))
        location[...] = np.ma.masked_equal([[2, 3], [4, -1], [2, 3]], -1)
        for d, n in zip(("x", "y", "z"), block((1, 0, 1)).shape):  # the in-file fragment's own dimensions
            ds.createDimension(d, n)
        inner = ds.createVariable("in_file_tas", "f4", ("x", "y", "z"), fill_value=fill)
        inner.units = "K"
        inner[...] = block((1, 0, 1))
        file_dims = ("f_time", "f_lat", "f_lon", "f_alt")
        write_strings(ds, "cfa_file", file_dims, files, style=style)
        if address == "alternatives":
            write_strings(ds, "cfa_address", file_dims, names, style=style)
        elif address == "per-fragment":
            write_strings(ds, "cfa_address", file_dims[:-1], np.where(names[..., 0] == "tas_gone", "tas",
                                                                       names[..., 0]), style=style)
        else:
            write_strings(ds, "cfa_address", (), "tas", style=style)
        if fmt == "alternatives":
            write_strings(ds, "cfa_format", file_dims, np.where(files != "", "nc", ""), style=style)
        else:
            write_strings(ds, "cfa_format", (), "nc", style=style)
        var = ds.createVariable("tas", "f4", ())
        var.units = "K"
        var.aggregated_dimensions = " ".join(DIMS)
        var.aggregated_data = "location: cfa_location file: cfa_file format: cfa_format address: cfa_address"
    return directory / "agg.nc"


@pytest.mark.parametrize("fmt, file_format", [("scalar", "NETCDF4"), ("alternatives", "NETCDF4"),
                                              ("alternatives", "NETCDF3_CLASSIC")])
@pytest.mark.parametrize("address", ["alternatives", "per-fragment"])
def test_cfa062_address_of_the_alternative_read(tmp_path, placed, address, fmt, file_format):
    truth = make_truth((5, 4, 5), seed=12, masked=0.1)
    path = write_cfa062_alternatives(tmp_path / "ds", truth, address, fmt, file_format)
    url, options = placed(path)
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    assert_matches(x.compute(), truth)
    assert_matches(x[1:4, 2, 1:4].compute(), truth[1:4, 2, 1:4])
    assert not daskcfa.verify(url, deep=True, storage_options=options).problems


def test_cfa062_scalar_address_with_alternatives(tmp_path):
    """cf-python writes a scalar address beside alternatives: every URI holds that name
    (the in-file fragment of the fixture then has no name of its own: it is dropped)."""
    truth = make_truth((5, 4, 5), seed=13)
    path = write_cfa062_alternatives(tmp_path / "ds", truth, "scalar", "scalar")
    with netCDF4.Dataset(str(path), "a") as ds:
        ds["cfa_file"][1, 0, 1, 0] = "f101.nc"
    write_fragment_file(tmp_path / "ds" / "f101.nc", "tas", DIMS, np.asarray(truth[2:5, :, 2:5]), {"units": "K"})
    assert_matches(daskcfa.from_cfa(str(path), "tas").compute(), truth)


@pytest.mark.parametrize("variable, shape", [("cfa_address", (2, 1, 2, 3)), ("cfa_address", (2, 1)),
                                             ("cfa_format", (2, 1, 2, 3)), ("cfa_format", (1, 1, 2))])
def test_cfa062_address_or_format_of_another_shape_is_refused(tmp_path, variable, shape):
    path = write_cfa062_alternatives(tmp_path / "ds", make_truth((5, 4, 5)), "alternatives", "scalar")
    with netCDF4.Dataset(str(path), "a") as ds:
        dims = []
        for k, n in enumerate(shape):
            ds.createDimension(f"bad{k}", n)
            dims.append(f"bad{k}")
        write_strings(ds, "bad", dims, np.full(shape, "nc" if variable == "cfa_format" else "tas", dtype=object))
        ds["tas"].aggregated_data = ds["tas"].aggregated_data.replace(variable, "bad")
    expect_format_error(str(path), None, "'bad'", str(shape))


def test_cfa062_fragment_format_that_is_not_netcdf_is_refused(tmp_path):
    path = write_cfa062_alternatives(tmp_path / "ds", make_truth((5, 4, 5)), "alternatives", "alternatives")
    with netCDF4.Dataset(str(path), "a") as ds:
        ds["cfa_format"][1, 0, 0, 1] = "um"
    err = expect_format_error(str(path), None, "'um'", "not netCDF")
    assert err.fragment == (1, 0, 0)


def test_cfa062_alternative_addresses_survive_relocation(tmp_path):
    """relocate re-encodes CFA-0.6.2: the address of each alternative is kept, the file spec-conformant."""
    truth = make_truth((5, 4, 5), seed=14, masked=0.1)
    path = write_cfa062_alternatives(tmp_path / "ds", truth, "alternatives", "scalar")
    import shutil

    shutil.copytree(tmp_path / "ds", tmp_path / "moved")
    for name in ("f000.nc", "f001.nc", "f100.nc", "f100_decoy.nc"):
        (tmp_path / "ds" / name).unlink()
    out = daskcfa.relocate(str(path), {f"{tmp_path / 'ds'}/": f"{tmp_path / 'moved'}/"},
                           target=str(tmp_path / "ds" / "new.nc"))
    with netCDF4.Dataset(out) as ds:
        address = [v for v in ds.variables if v.endswith("_address")][0]
        file = [v for v in ds.variables if v.endswith("_file")][0]
        assert ds[address].dimensions == ds[file].dimensions
    assert_matches(daskcfa.from_cfa(out, "tas").compute(), truth)


# ---------------------------------------------------------------------------
# CFA-0.6.2 in-file fragments found by CF's name search
# ---------------------------------------------------------------------------
def write_cfa062_grouped_in_file(path: Path, truth: np.ma.MaskedArray) -> Path:
    """``/g/tas`` (2 fragments along time, both inside the aggregation file) whose instruction
    variables sit in ``/cfa``: fragment 0 is ``frag`` in ``/cfa`` (the ``address`` variable's
    group), fragment 1 is ``frag1`` in ``/g`` (the aggregated variable's group, searched after
    ``/cfa`` and the root). A decoy ``/frag`` holds other values: a search from the root finds it."""
    halves = (truth[:2], truth[2:])
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.11 CFA-0.6.2"
        cfa, g = ds.createGroup("cfa"), ds.createGroup("g")
        for d, n in zip(DIMS, truth.shape):
            ds.createDimension(d, n)
        ds.createDimension("t2", 2)
        for d, n in (("f_time", 2), ("f_lat", 1), ("f_lon", 1), ("i", 3), ("j", 2)):
            cfa.createDimension(d, n)
        for owner, name, values in ((cfa, "frag", halves[0]), (g, "frag1", halves[1]),
                                    (ds, "frag", np.full(halves[0].shape, 1e6))):
            var = owner.createVariable(name, "f4", ("t2", "lat", "lon"), fill_value=np.float32(-999))
            var.units = "K"
            var[...] = values
        location = cfa.createVariable("cfa_location", "i4", ("i", "j"))
        location[...] = np.ma.masked_equal([[2, 2], [truth.shape[1], -1], [truth.shape[2], -1]], -1)
        write_strings(cfa, "cfa_file", ("f_time", "f_lat", "f_lon"), np.full((2, 1, 1), "", dtype=object))
        write_strings(cfa, "cfa_address", ("f_time", "f_lat", "f_lon"), np.array(["frag", "frag1"],
                                                                                  dtype=object).reshape(2, 1, 1))
        write_strings(cfa, "cfa_format", (), "nc")
        var = g.createVariable("tas", "f4", ())
        var.units = "K"
        var.aggregated_dimensions = " ".join(DIMS)
        var.aggregated_data = ("location: /cfa/cfa_location file: /cfa/cfa_file format: /cfa/cfa_format "
                               "address: /cfa/cfa_address")
    return path


def test_cfa062_in_file_fragments_found_by_cf_group_search(tmp_path, placed):
    """An in-file fragment's address is looked up from the address variable's group upward,
    then from the aggregated variable's group upward (CF's search), not from the root."""
    truth = make_truth((4, 3, 5), seed=14, masked=0.1)
    url, options = placed(write_cfa062_grouped_in_file(tmp_path / "agg.nc", truth))
    assert_matches(daskcfa.from_cfa(url, "/g/tas", storage_options=options).compute(), truth)
    assert not daskcfa.verify(url, deep=True, storage_options=options).problems


def write_cfa062_in_file_addresses(path: Path, truth: np.ma.MaskedArray, address0: str,
                                   variables: list[tuple[str, np.ndarray]]) -> Path:
    """:func:`write_cfa062_grouped_in_file`'s layout with fragment 0's address ``address0`` and
    ``variables`` (absolute path, values with the shape of fragment 0) written first; fragment 1 is
    ``/cfa/frag1``."""
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.11 CFA-0.6.2"
        for d, n in zip(DIMS, truth.shape):
            ds.createDimension(d, n)
        ds.createDimension("t2", 2)
        ds.createDimension("none", 0)
        for where, values in [*variables, ("/cfa/frag1", truth[2:])]:
            owner = ds
            *groups, name = where.strip("/").split("/")
            for part in groups:
                owner = owner.groups.get(part) or owner.createGroup(part)
            dims = ("none", "lat", "lon") if values.shape[0] == 0 else ("t2", "lat", "lon")
            owner.createVariable(name, "f4", dims, fill_value=np.float32(-999))[...] = values
        cfa, g = ds["cfa"], ds.groups.get("g") or ds.createGroup("g")
        for d, n in (("f_time", 2), ("f_lat", 1), ("f_lon", 1), ("i", 3), ("j", 2)):
            cfa.createDimension(d, n)
        location = cfa.createVariable("cfa_location", "i4", ("i", "j"))
        location[...] = np.ma.masked_equal([[2, 2], [truth.shape[1], -1], [truth.shape[2], -1]], -1)
        write_strings(cfa, "cfa_file", ("f_time", "f_lat", "f_lon"), np.full((2, 1, 1), "", dtype=object))
        write_strings(cfa, "cfa_address", ("f_time", "f_lat", "f_lon"),
                      np.array([address0, "frag1"], dtype=object).reshape(2, 1, 1))
        write_strings(cfa, "cfa_format", (), "nc")
        var = g.createVariable("tas", "f4", ())
        var.aggregated_dimensions = " ".join(DIMS)
        var.aggregated_data = ("location: /cfa/cfa_location file: /cfa/cfa_file format: /cfa/cfa_format "
                               "address: /cfa/cfa_address")
    return path


@pytest.mark.parametrize("address0, variables, error", [
    # A relative path is resolved from the address variable's group: /cfa/sub/frag does not exist,
    # so the root's /sub/frag (which a lookup from the root finds) is not it.
    ("sub/frag", [("/sub/frag", 1e6)], daskcfa.FragmentReadError),
    # The address variable's group holds an empty frag: that is the fragment (of the wrong shape),
    # not /g/frag further along the search (an empty variable is falsy).
    ("frag", [("/cfa/frag", None), ("/g/frag", 1e6)], daskcfa.FragmentShapeError),
    # The aggregated variable itself (a scalar, also falsy-tested): a shape error, not a bare TypeError.
    ("/g/tas", [], daskcfa.FragmentShapeError),
], ids=["unresolved-relative-path", "empty-variable-first", "the-aggregated-variable"])
def test_cfa062_in_file_address_never_reads_another_variable(tmp_path, address0, variables, error):
    """Hostile in-file addresses: the variable CF's search resolves, or an error naming the fragment;
    never another variable's values, never a bare Python error."""
    truth = make_truth((4, 3, 5), seed=15)
    empty = np.zeros((0, *truth.shape[1:]), "f4")
    written = [(where, empty if value is None else np.full((2, *truth.shape[1:]), value, "f4"))
               for where, value in variables]
    path = write_cfa062_in_file_addresses(tmp_path / "agg.nc", truth, address0, written)
    with pytest.raises(error) as raised:
        daskcfa.from_cfa(str(path), "/g/tas").compute()
    assert raised.value.fragment == (0, 0, 0) and raised.value.variable == "/g/tas"
