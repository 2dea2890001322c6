"""Our masking/unpacking equals netCDF4-python's on real files."""

import warnings

import netCDF4
import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from daskcfa.decode import Encoding

DTYPES = ["i1", "u1", "i2", "u2", "i4", "i8", "f4", "f8"]


@st.composite
def variables(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    values = st.integers(int(info.min), int(info.max)) if info else st.floats(-1e6, 1e6, width=32)
    data = np.array(draw(st.lists(values, min_size=1, max_size=12)), dtype=dtype)
    attrs = {}
    pool = list(data) + [draw(values)]
    if draw(st.booleans()):
        attrs["_FillValue"] = dtype.type(draw(st.sampled_from(pool)))
    if draw(st.booleans()):
        attrs["missing_value"] = dtype.type(draw(st.sampled_from(pool)))
    if draw(st.booleans()):
        lo, hi = sorted([draw(st.sampled_from(pool)), draw(st.sampled_from(pool))])
        attrs["valid_range"] = np.array([lo, hi], dtype)
    elif draw(st.booleans()):
        attrs["valid_min"] = dtype.type(draw(st.sampled_from(pool)))
    if draw(st.booleans()):
        attrs["scale_factor"] = np.dtype(draw(st.sampled_from(["f4", "f8"]))).type(draw(st.sampled_from([0.5, 2.0, 0.01, 1.0])))
    if draw(st.booleans()):
        attrs["add_offset"] = np.dtype(draw(st.sampled_from(["f4", "f8"]))).type(draw(st.sampled_from([0.0, 10.0, -3.5])))
    if dtype.kind == "i" and draw(st.booleans()):
        attrs["_Unsigned"] = "true"
    return dtype, data, attrs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=variables(), mask=st.booleans())
def test_decode_matches_netcdf4(tmp_path, case, mask):
    _check_against_netcdf4(tmp_path, *case, mask)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=variables(), mask=st.booleans())
def test_decode_of_large_arrays_matches_netcdf4(tmp_path, case, mask):
    """Arrays large enough to be first tested for missing values from their extremes (the same
    values repeated: a fill value or range bound at an extreme, within them, or beyond them)."""
    dtype, data, attrs = case
    _check_against_netcdf4(tmp_path, dtype, np.resize(data, 5000), attrs, mask)


@pytest.mark.parametrize("dtype", ["f4", "f8"])
@pytest.mark.parametrize("fill", [np.nan, 1e20, -1e20, 7.0])
@pytest.mark.parametrize("special", [None, np.nan, np.inf, -np.inf, 7.0])
def test_decode_of_large_float_arrays_with_nan_and_infinities_matches_netcdf4(tmp_path, dtype, fill, special):
    data = np.linspace(-5, 5, 6000).astype(dtype)
    if special is not None:
        data[[17, 4000]] = special
    for attrs in ({"_FillValue": fill}, {"missing_value": np.array(fill, dtype)},
                  {"_FillValue": fill, "valid_range": np.array([-4, 4], dtype)}, {"valid_max": np.array(4.5, dtype)}):
        _check_against_netcdf4(tmp_path, np.dtype(dtype), data, attrs, True)


def test_decoding_a_large_array_without_missing_values_makes_no_boolean_mask():
    """Stored values that hold no missing value are found so without a boolean array as large as them
    (before: one compared with the fill value, then searched for a True)."""
    import tracemalloc

    data = np.linspace(200, 300, 1 << 20).astype("f4")
    for attrs in ({}, {"_FillValue": np.float32(1e20)}, {"missing_value": np.float32(-999), "valid_range":
                                                        np.array([150, 350], "f4")}):
        enc = Encoding.from_attrs(attrs, data.dtype)
        enc.decode(data)  # (once first: what a first call caches is not the decoding's cost)
        tracemalloc.start()
        got = enc.decode(data)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got.mask is np.ma.nomask and np.shares_memory(got.data, data)
        assert peak < data.size // 8, (attrs, peak)


@pytest.mark.parametrize("dtype", ["i1", "u1", "i2", "i4", "f4", "f8"])
@pytest.mark.parametrize("where", [None, 0, 20_000, 131_071, 131_072, 299_999])
def test_decode_of_arrays_larger_than_the_scan_blocks_matches_netcdf4(tmp_path, dtype, where):
    """Arrays of more values than the head the extremes are first taken of and than a block of
    the comparisons (``_SCAN_HEAD``, ``_TEST_BLOCK``), with a missing value ``where`` (None:
    none; in the head, after it, either side of a block's end, the last): fill values at the
    type's extremes and NaN, ``missing_value`` with a valid range, ``_Unsigned``."""
    from daskcfa import decode

    dtype = np.dtype(dtype)
    n = 300_000
    assert n > decode._TEST_BLOCK * 2 and n * dtype.itemsize > decode._SCAN_HEAD
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    data = (np.arange(n) % 50 + 10).astype(dtype)
    cases = [{"_FillValue": dtype.type(info.max)}, {"_FillValue": dtype.type(info.min)},
             {"missing_value": dtype.type(3), "valid_range": np.array([5, 70], dtype)},
             {"_FillValue": dtype.type(info.max), "valid_min": dtype.type(5), "missing_value": dtype.type(65)}]
    if dtype.kind == "f":
        cases.append({"_FillValue": dtype.type(np.nan)})
    if dtype.kind == "i":
        cases.append({"_Unsigned": "true", "_FillValue": dtype.type(-1), "valid_max": dtype.type(-3)})
    for attrs in cases:
        for value in ("fill", "missing", "outside"):
            values = data.copy()
            if where is not None:
                if value == "fill" and "_FillValue" in attrs:
                    values[where] = attrs["_FillValue"]
                elif value == "missing" and "missing_value" in attrs:
                    values[where] = attrs["missing_value"]
                elif value == "outside":
                    values[where] = 1
            _check_against_netcdf4(tmp_path, dtype, values, attrs, True)


def _check_against_netcdf4(tmp_path, dtype, data, attrs, mask):
    path = tmp_path / "v.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", data.size)
        var = ds.createVariable("v", dtype, ("x",), fill_value=attrs.get("_FillValue", None))
        var.set_auto_maskandscale(False)
        for k, v in attrs.items():
            if k != "_FillValue":
                var.setncattr(k, v)
        var[:] = data
    with netCDF4.Dataset(path) as ds, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        var = ds["v"]
        var.set_auto_mask(mask)
        try:
            expected = var[:]
        except TypeError:  # netCDF4-python itself fails on some _Unsigned cases: no ground truth
            reject()
        stored_attrs = {k: var.getncattr(k) for k in var.ncattrs()}
        enc = Encoding.from_attrs(stored_attrs, var.dtype)
        got = enc.decode(data, mask=mask)
    assert np.asarray(got).dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))
    np.testing.assert_array_equal(np.ma.filled(got, 0), np.ma.filled(expected, 0))


def test_extra_mask_filled_with_fill_value():
    enc = Encoding.from_attrs({"_FillValue": np.int16(-99), "scale_factor": np.float32(0.5)}, np.dtype("i2"))
    raw = np.array([2, 4, 6], "i2")
    extra = np.array([False, True, False])
    np.testing.assert_array_equal(enc.decode(raw, mask=False, extra_mask=extra), [1.0, -49.5, 3.0])
    got = enc.decode(raw, extra_mask=extra)
    assert got.mask.tolist() == [False, True, False] and got.dtype == np.float32


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_fill_is_masked(dtype):
    fill = netCDF4.default_fillvals[np.dtype(dtype).str[1:]]
    got = Encoding.from_attrs({}, np.dtype(dtype)).decode(np.array([fill, 1], dtype))
    assert got.mask.tolist() == [True, False]


@pytest.mark.parametrize("dtype", ["i1", "i2", "i4"])
def test_unsigned_without_fill_value_masks_nothing_like_netcdf4(tmp_path, dtype):
    """netCDF4-python compares _Unsigned values with the signed default fill: no value is masked."""
    unsigned = np.dtype(dtype.replace("i", "u"))
    default = np.array(netCDF4.default_fillvals[dtype], dtype)
    data = np.array([1, np.iinfo(unsigned).max, default.view(unsigned), 3], unsigned).view(dtype)
    path = tmp_path / "v.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", data.size)
        var = ds.createVariable("v", dtype, ("x",))
        var._Unsigned = "true"
        var[:] = data
    with netCDF4.Dataset(path) as ds:
        expected = ds["v"][:]
    got = Encoding.from_attrs({"_Unsigned": "true"}, np.dtype(dtype)).decode(data)
    assert got.dtype == expected.dtype == unsigned
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))
    np.testing.assert_array_equal(np.ma.getdata(got), np.ma.getdata(expected))


@pytest.mark.parametrize("fill", [None, "-"])
def test_char_masking_like_netcdf4(tmp_path, fill):
    """Characters equal to the fill value (default NUL) are masked, as netCDF4-python masks them."""
    chars = np.array([[b"a", b"b", b"", b""], [b"-", b"-", b"x", b""]], "S1")
    path = tmp_path / "c.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("n", 2)
        ds.createDimension("s", 4)
        var = ds.createVariable("c", "S1", ("n", "s"), fill_value=fill)
        var[...] = chars
    with netCDF4.Dataset(path) as ds:
        expected = ds["c"][...]
        attrs = {k: ds["c"].getncattr(k) for k in ds["c"].ncattrs()}
    got = Encoding.from_attrs(attrs, np.dtype("S1")).decode(chars)
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))
    np.testing.assert_array_equal(np.ma.filled(got), np.ma.filled(expected))


@pytest.mark.parametrize("a, b, dtype, same", [
    (np.float32("nan"), np.float32("nan"), None, True),
    (np.float64("nan"), np.float32("nan"), "f4", True),
    (np.array([1.0, np.nan]), np.array([1.0, np.nan], "f4"), "f4", True),
    (np.array([1.0, np.nan]), np.array([np.nan, 1.0]), None, False),
    (1e20, np.float32(1e20), "f4", True),
    (1e20, np.float32(1e20), None, False),  # not the same number until stored as float32
    (np.int16(-999), -999.0, "i2", True),
    (np.int16(-999), -998, "i2", False),
    (b"K", "K", None, True),
    ("1", 1, None, False),
    (np.array([1, 2]), np.array([1, 2, 3]), None, False),
])
def test_same_value_is_the_one_rule_for_attribute_values(a, b, dtype, same):
    from daskcfa.decode import same_value

    assert same_value(a, b, dtype) is same
    assert same_value(b, a, dtype) is same


def test_encodings_with_nan_fill_values_are_equal(tmp_path):
    """Two variables written by xarray (``_FillValue = NaN``) decode alike: their encodings are
    equal, so a fragment's masking is left to the aggregation's (issue 28 item 1)."""
    path = tmp_path / "nan.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 2)
        for name in ("a", "b"):
            ds.createVariable(name, "f4", ("x",), fill_value=np.float32("nan"))
    with netCDF4.Dataset(path) as ds:
        a, b = (Encoding.from_attrs(ds[n].__dict__, ds[n].dtype) for n in ("a", "b"))
    assert a == b and hash(a) == hash(b)
    assert a != Encoding.from_attrs({"_FillValue": np.float32(0)}, np.dtype("f4"))


def test_a_negative_zero_fill_value_keeps_its_sign_whatever_was_read_before(tmp_path):
    """A ``_FillValue`` of -0.0 is the masked array's fill value, as netCDF4-python gives it, after a
    variable filled with +0.0 was read, and the other way round: the cast fill values were cached by
    value, where -0.0 == 0.0, so the first one read was every later one's (``filled()`` bytes differed)."""
    import daskcfa

    def archive(name: str, fill: float) -> tuple[str, np.ma.MaskedArray]:
        path = tmp_path / f"{name}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("t", 2)
            ds.createDimension("x", 3)
            time = ds.createVariable("t", "f8", ("t",))
            time.units = "days since 2000-01-01"
            time[:] = [0, 1]
            var = ds.createVariable("v", "f4", ("t", "x"), fill_value=np.float32(fill))
            var.set_auto_maskandscale(False)
            var[:] = np.array([[1, fill, 2], [3, 4, fill]], "f4")
        with netCDF4.Dataset(path) as ds:
            expected = ds["v"][:]
        return daskcfa.aggregate([str(path)], str(tmp_path / f"{name}.nca")), expected

    archives = [archive("plus", 0.0), archive("minus", -0.0)]
    for url, expected in archives + archives[::-1]:
        got = daskcfa.from_cfa(url, "v").compute()
        assert np.asarray(got.fill_value).tobytes() == np.asarray(expected.fill_value).tobytes(), url
        assert got.filled().tobytes() == expected.filled().tobytes(), url


def test_an_encoding_is_worked_out_once_per_stored_type_and_storage_attributes():
    """Every fragment read works out its variable's encoding, and an archive's fragments mostly share
    one (issue #31): attributes that say nothing of storage do not make another, a type or a storage
    attribute does."""
    attrs = {"_FillValue": np.float32(-1), "units": "K"}
    first = Encoding.from_attrs(attrs, np.dtype("f4"))
    assert Encoding.from_attrs({"_FillValue": np.float32(-1), "long_name": "x"}, np.dtype("f4")) is first
    assert Encoding.from_attrs(attrs, np.dtype(">f4")) is not first
    assert Encoding.from_attrs({**attrs, "missing_value": np.float32(-2)}, np.dtype("f4")) is not first


@pytest.mark.parametrize("dtype, attrs", [
    ("f4", [{"_FillValue": np.float32(0.0)}, {"_FillValue": np.float32(-0.0)}, {"_FillValue": 0.0}]),
    ("f8", [{"missing_value": np.float32(0.1)}, {"missing_value": 0.1}, {"missing_value": [0.1]}]),
    ("i2", [{"_Unsigned": "true"}, {"_Unsigned": "false"}, {"_Unsigned": "TRUE"}, {"_Unsigned": True}]),
    ("i2", [{"valid_min": np.int16(1)}, {"valid_min": np.float32(1.5)}, {"valid_min": True}, {"valid_min": 1}]),
    ("u1", [{"scale_factor": np.float32(2)}, {"scale_factor": np.float64(2)}, {"scale_factor": 2}]),
    ("f4", [{"valid_range": np.array([0, 1], "f4")}, {"valid_range": np.array([-0.0, 1], "f4")},
            {"valid_range": np.array([0, 1], "f8")}, {"valid_range": [0, 1]}]),
])
def test_an_encoding_worked_out_before_is_taken_only_for_the_same_types_and_bits(dtype, attrs):
    """Storage attributes that compare equal but are not the same (-0.0 and 0.0, a float32 and a
    float64, ``True`` and 1) each get the encoding they decode to, whatever was worked out before:
    the same fields, of the same types and bits, as worked out afresh."""
    import daskcfa.decode as decode

    def fields(encoding: Encoding) -> list:
        return [(type(v).__name__, np.asarray(v).dtype.str, np.asarray(v).tobytes()) if v is not None else None
                for v in (getattr(encoding, f) for f in ("dtype", "fill_value", "explicit_fill", "valid_min",
                                                         "valid_max", "scale_factor", "add_offset", "unsigned"))
                ] + [[(type(v).__name__, np.asarray(v).tobytes()) for v in encoding.missing_values]]

    for order in (attrs, attrs[::-1]):
        decode._ENCODINGS.clear()
        fresh = []
        for given in order:
            fresh.append(fields(Encoding.from_attrs(given, np.dtype(dtype))))
            decode._ENCODINGS.clear()
        for given, want in zip(order, fresh):
            assert fields(Encoding.from_attrs(given, np.dtype(dtype))) == want, given


def test_an_encoding_of_long_storage_attributes_is_not_kept():
    """A file's ``missing_value`` may hold any number of values: its encoding is worked out afresh,
    never kept (hundreds of such files would otherwise hold their attributes in memory)."""
    import daskcfa.decode as decode

    decode._ENCODINGS.clear()
    many = {"missing_value": np.arange(10_000, dtype="f4")}
    encoding = Encoding.from_attrs(many, np.dtype("f4"))
    assert len(encoding.missing_values) == 10_000 and not decode._ENCODINGS
    assert Encoding.from_attrs({"_Unsigned": "true" * 100}, np.dtype("i2")).unsigned is False and not decode._ENCODINGS
    assert Encoding.from_attrs({"missing_value": np.arange(4, dtype="f4")}, np.dtype("f4")) is not None
    assert len(decode._ENCODINGS) == 1


@pytest.mark.parametrize("size", [100, 50_000])  # (small arrays compared; large ones first by their extremes)
@pytest.mark.parametrize("missing, low, high", [
    (-999.0, 200.0, 320.0),   # the usual: missing_value and the default fill both outside the valid range
    (200.0, 200.0, 320.0),    # a missing value at the valid minimum: only its equality masks it
    (320.0, 200.0, 320.0),    # ... at the valid maximum
    (250.0, 200.0, 320.0),    # inside the range
    (np.nan, 200.0, 320.0),   # NaN: never outside by comparison
    (-999.0, 200.0, None),    # valid_min alone
    (999.0, None, 320.0),     # valid_max alone
])
def test_missing_values_outside_the_valid_range_mask_as_netcdf4_python(tmp_path, size, missing, low, high):
    """A ``missing_value`` or fill value beyond the valid range is not compared (the range's test masks it):
    the mask is still netCDF4-python's, point for point, at the range's edges, for NaN, and with one bound."""
    rng = np.random.default_rng(5)
    values = rng.uniform(150, 370, size).astype("f4")
    picks = rng.integers(0, size, (5, size // 10))
    values[picks[0]] = missing
    values[picks[1]] = 200.0
    values[picks[2]] = 320.0
    values[picks[3]] = netCDF4.default_fillvals["f4"]
    values[picks[4]] = np.nan
    attrs = {"missing_value": np.float32(missing)}
    if low is not None and high is not None:
        attrs["valid_range"] = np.array([low, high], "f4")
    elif low is not None:
        attrs["valid_min"] = np.float32(low)
    else:
        attrs["valid_max"] = np.float32(high)
    with netCDF4.Dataset(tmp_path / "v.nc", "w") as nc:
        nc.createDimension("x", size)
        v = nc.createVariable("v", "f4", ("x",))
        v.setncatts(attrs)
        v.set_auto_mask(False)
        v[:] = values
    with netCDF4.Dataset(tmp_path / "v.nc") as nc:
        expected = np.ma.getmaskarray(nc["v"][:])
    got = Encoding.from_attrs(attrs, np.dtype("f4")).missing_mask(values)
    assert np.array_equal(np.zeros(size, bool) if got is None else got, expected)
