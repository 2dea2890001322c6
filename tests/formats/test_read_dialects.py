"""End-to-end reads of every dialect, checked against numpy ground truth.

Every dataset is written by tests/builders.py (netCDF4-python for the
fragments, the dialect's rules from formats.md for the aggregation file) and
every test runs from an unrelated working directory, so relative fragment
URIs must be resolved against the aggregation file's directory.
"""

from __future__ import annotations

import os
import shutil

import dask
import dask.array as da
import netCDF4
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import daskcfa
from builders import DIALECTS, Frag, assert_matches, build, build_cf113, build_cfa04, build_cfa05, build_cfa06
from builders import build_cfapyx_interim, build_cfdm_interim, build_nca, build_nca_virtual, make_truth, DEFAULT_FILL
from builders import write_fragment_file

pytestmark = pytest.mark.usefixtures("other_cwd")

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (2, 3))  # uneven fragments, 3 x 1 x 2 grid
SHAPE = (6, 4, 5)
CF_LIKE = ("CF-1.13", "cfdm-interim", "cfapyx-interim")
URI_DIALECTS = CF_LIKE + ("CFA-0.6",)  # dialects with a URI variable (strings, URI styles)


def truth(masked=0.15, dtype="f4", shape=SHAPE, seed=1):
    return make_truth(shape, dtype, seed=seed, masked=masked)


def read(built, **kw):
    """Open with daskcfa (lazy), check the chunks, compute."""
    x = daskcfa.from_cfa(str(built.path), built.variable, **kw)
    assert isinstance(x, da.Array)
    return x


def check_read(built, *, rtol=1e-6, dtype=None):
    x = read(built)
    assert x.shape == built.expected.shape
    assert x.chunks == built.chunks, "one dask chunk per fragment"
    if dtype is not None:
        assert x.dtype == np.dtype(dtype)
    got = x.compute()
    assert got.dtype == x.dtype, "computed dtype differs from the lazy array's"
    assert_matches(got, built.expected, rtol=rtol)
    return got


# ---------------------------------------------------------------------------
# Every dialect, plain
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_reads_ground_truth(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES)
    got = check_read(b, dtype="f4")
    assert np.ma.isMaskedArray(got), "mask=True must give a masked array when data are missing"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_variable_may_be_omitted_when_only_one(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES)
    x = daskcfa.from_cfa(str(b.path))
    assert x.chunks == b.chunks
    assert_matches(x.compute(), b.expected)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_integer_data_exact(tmp_path, dialect):
    t = make_truth(SHAPE, "i4", seed=5, lo=-1000, hi=1000)
    b = build(dialect, tmp_path, t, DIMS, SIZES, units="1")
    got = check_read(b, dtype="i4")
    np.testing.assert_array_equal(np.ma.getdata(got), np.ma.getdata(t))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_single_fragment(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(), DIMS, ((6,), (4,), (5,)))
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_one_element_fragments(tmp_path, dialect):
    t = truth(shape=(3, 2, 2))
    b = build(dialect, tmp_path, t, DIMS, ((1, 1, 1), (1, 1), (1, 1)))
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_one_dimensional(tmp_path, dialect):
    t = truth(shape=(10,))
    b = build(dialect, tmp_path, t, ("time",), ((3, 3, 4),))
    check_read(b)


# ---------------------------------------------------------------------------
# File formats, string styles, URI styles
# ---------------------------------------------------------------------------
FORMAT_CASES = [
    ("NETCDF4", "vlen"),
    ("NETCDF4", "char"),
    ("NETCDF4_CLASSIC", "char"),
    ("NETCDF3_CLASSIC", "char"),
    ("NETCDF3_64BIT_OFFSET", "char"),
]


@pytest.mark.parametrize("dialect", URI_DIALECTS)
@pytest.mark.parametrize("fmt,strings", FORMAT_CASES)
@pytest.mark.parametrize("uri_style", ["relative", "absolute", "file"])
def test_formats_strings_and_uri_styles(tmp_path, dialect, fmt, strings, uri_style):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, fmt=fmt, strings=strings, uri_style=uri_style)
    check_read(b)


@pytest.mark.parametrize("dialect", ["CFA-0.4", "NCA"])
@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_json_dialects_in_netcdf3_and_4(tmp_path, dialect, fmt):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, fmt=fmt)
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("fragment_format", ["NETCDF3_CLASSIC", "NETCDF4_CLASSIC"])
def test_fragments_in_other_netcdf_formats(tmp_path, dialect, fragment_format):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, frags=lambda i: Frag(format=fragment_format))
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_relative_uris_up_and_across_directories(tmp_path, dialect):
    """Aggregation file in agg/, fragments in data/: URIs like ../data/x.nc."""
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, agg_name="agg/aggregation.nc", fragment_dir="data")
    assert all(u[0].startswith("../data/") for u in b.fragment_uris.values())
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_relative_uris_follow_a_moved_dataset(tmp_path, dialect):
    """Relative URIs are relative to the aggregation file's *current* location."""
    b = build(dialect, tmp_path / "before", truth(), DIMS, SIZES)
    shutil.move(str(tmp_path / "before"), str(tmp_path / "after"))
    moved = tmp_path / "after" / b.path.name
    x = daskcfa.from_cfa(str(moved), b.variable)
    assert_matches(x.compute(), b.expected)


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6"])
def test_aggregation_path_given_as_file_uri(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES)
    x = daskcfa.from_cfa(b.path.resolve().as_uri(), b.variable)
    assert_matches(x.compute(), b.expected)


def test_aggregation_path_given_as_percent_encoded_file_uri(tmp_path):
    b = build_cf113(tmp_path / "my data", truth(), DIMS, SIZES)
    uri = b.path.resolve().as_uri()
    assert "my%20data" in uri
    assert_matches(daskcfa.from_cfa(uri, "tas").compute(), b.expected)


@pytest.mark.parametrize("uri_style", ["relative", "absolute", "file"])
def test_non_ascii_file_names(tmp_path, uri_style):
    b = build_cf113(tmp_path / "données", truth(), DIMS, SIZES, fragment_dir="températures", uri_style=uri_style)
    check_read(b)


def test_aggregated_dimensions_with_irregular_blanks(tmp_path):
    import netCDF4

    b = build_cf113(tmp_path, truth(), DIMS, SIZES)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        ds["tas"].aggregated_dimensions = "  time\tlat   lon \n"
    check_read(b)


def test_aggregation_path_given_relative_to_cwd(tmp_path, monkeypatch):
    """A relative aggregation path is relative to the cwd; its fragments then to the file."""
    b = build_cf113(tmp_path / "sub", truth(), DIMS, SIZES, agg_name="agg/aggregation.nc", fragment_dir="data")
    monkeypatch.chdir(tmp_path)
    x = daskcfa.from_cfa(os.path.join("sub", "agg", "aggregation.nc"), "tas")
    assert_matches(x.compute(), b.expected)


@pytest.mark.parametrize("uri_style", ["relative", "absolute", "file"])
def test_fragment_file_names_with_spaces(tmp_path, uri_style):
    """file:// URIs percent-encode the blank (my%20fragments); plain paths do not."""
    b = build_cf113(tmp_path, truth(), DIMS, SIZES, fragment_dir="my fragments", uri_style=uri_style)
    if uri_style == "file":
        assert all("my%20fragments" in u[0] for u in b.fragment_uris.values())
    check_read(b)


def test_percent_encoded_file_uri_of_unusual_name(tmp_path):
    b = build_cf113(tmp_path, truth(), DIMS, SIZES, fragment_dir="d#1 (100%)", uri_style="file")
    assert all("%25" in u[0] and "%23" in u[0] for u in b.fragment_uris.values())
    check_read(b)


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.4"])
def test_aggregation_file_in_directory_with_spaces(tmp_path, dialect):
    b = build(dialect, tmp_path / "my data", truth(), DIMS, SIZES)
    check_read(b)


# ---------------------------------------------------------------------------
# Canonical form of each fragment
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", DIALECTS)
def test_units_celsius_fragment_in_kelvin_aggregation(tmp_path, dialect):
    frags = {(0, 0, 0): Frag(units="degC"), (1, 0, 1): Frag(units="degC")}
    b = build(dialect, tmp_path, truth(dtype="f8"), DIMS, SIZES, units="K", frags=frags)
    check_read(b, rtol=1e-9)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_units_time_reference_and_unit_differ(tmp_path, dialect):
    t = np.ma.MaskedArray(np.arange(40.0, 52.0))
    frags = {(1,): Frag(units="hours since 2000-01-01"), (2,): Frag(units="hours since 2000-01-01", dtype="i4")}
    b = build(dialect, tmp_path, t, ("time",), ((4, 5, 3),), units="days since 1999-12-01", frags=frags)
    got = check_read(b, rtol=1e-12)
    np.testing.assert_allclose(np.ma.getdata(got), np.arange(40.0, 52.0), rtol=1e-12)


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6"])
def test_units_scaled_and_prefixed(tmp_path, dialect):
    t = truth(dtype="f8")
    b = build(dialect, tmp_path, t, DIMS, SIZES, units="m", frags={(0, 0, 1): Frag(units="km")})
    check_read(b, rtol=1e-12)


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6", "CFA-0.4"])
@pytest.mark.parametrize("synonym", ["kelvin", "K ", "degK", "1 K"])
def test_units_spelled_differently_but_equal(tmp_path, dialect, synonym):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, units="K", frags={(1, 0, 1): Frag(units=synonym, raw_units=True)})
    check_read(b, rtol=1e-6)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fragment_without_units_attribute(tmp_path, dialect):
    """A fragment without units is taken to be in the aggregation's units."""
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, units="K", frags={(0, 0, 0): Frag(no_units=True)})
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("frag_dtype", ["f8", "i2", "i4", "u2", "i8"])
def test_fragment_dtype_cast_to_aggregated_dtype(tmp_path, dialect, frag_dtype):
    t = np.ma.MaskedArray(np.round(make_truth(SHAPE, "f4", seed=3, lo=1, hi=300)))
    b = build(dialect, tmp_path, t, DIMS, SIZES, frags=lambda i: Frag(dtype=frag_dtype) if i[0] != 1 else None)
    check_read(b, dtype="f4")


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6", "NCA"])
def test_float_fragments_in_integer_aggregation(tmp_path, dialect):
    t = make_truth(SHAPE, "i4", seed=7, lo=-500, hi=500)
    b = build(dialect, tmp_path, t, DIMS, SIZES, units="1", frags={(0, 0, 0): Frag(dtype="f8"), (2, 0, 1): Frag(dtype="f4")})
    check_read(b, dtype="i4")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fragment_packing_applied(tmp_path, dialect):
    frags = {
        (0, 0, 0): Frag(scale_factor=0.01, add_offset=250.0),
        (1, 0, 1): Frag(scale_factor=0.5),
        (2, 0, 0): Frag(add_offset=100.0, dtype="f4"),
    }
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, frags=frags)
    got = check_read(b, dtype="f4")
    # Packed fragments really are lossy: the expected values are the decoded ones.
    assert not np.allclose(np.ma.getdata(b.expected)[:2, :, :2], np.ma.getdata(truth())[:2, :, :2], rtol=1e-7, atol=0)
    assert got.dtype == np.float32


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("missing", ["_FillValue", "missing_value", "valid_range", "valid_min", "valid_max", "nan", "both"])
def test_fragment_missing_values_applied(tmp_path, dialect, missing):
    t = truth(masked=0.3)
    b = build(dialect, tmp_path, t, DIMS, SIZES, frags=lambda i: Frag(missing=missing))
    got = check_read(b)
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(t))


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.4"])
@pytest.mark.parametrize("missing", ["valid_min", "valid_max", "both"])
@pytest.mark.parametrize("frag_dtype", ["i2", "i4", "f8"])
def test_fragment_missing_values_in_other_dtypes(tmp_path, dialect, missing, frag_dtype):
    t = np.ma.MaskedArray(np.round(truth(masked=0.3)))
    b = build(dialect, tmp_path, t, DIMS, SIZES, frags=lambda i: Frag(missing=missing, dtype=frag_dtype))
    got = check_read(b, dtype="f4")
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(t))


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6", "NCA"])
@pytest.mark.parametrize("frag_dtype", [">f4", ">f8", ">i2", "<i8"])
def test_fragment_byte_order(tmp_path, dialect, frag_dtype):
    """Big-endian fragments: values equal and the result has the aggregation's native dtype."""
    t = np.ma.MaskedArray(np.round(truth(masked=0.2)))
    b = build(dialect, tmp_path, t, DIMS, SIZES, frags=lambda i: Frag(dtype=frag_dtype) if sum(i) % 2 else None)
    got = check_read(b, dtype="f4")
    assert got.dtype == np.dtype("=f4")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_packed_fragment_with_missing_values(tmp_path, dialect):
    t = truth(masked=0.3)
    frags = lambda i: Frag(scale_factor=0.01, add_offset=260.0, missing=["_FillValue", "missing_value", "valid_range"][i[0]])
    b = build(dialect, tmp_path, t, DIMS, SIZES, frags=frags)
    got = check_read(b, rtol=1e-6)
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(t))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fragment_without_its_size1_dimension(tmp_path, dialect):
    t = truth(shape=(5, 1, 4))
    b = build(dialect, tmp_path, t, DIMS, ((2, 1, 2), (1,), (4,)), frags=lambda i: Frag(drop_size1=True))
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fragment_dropping_a_size1_fragment_dimension(tmp_path, dialect):
    """A fragment only 1 long along a dimension that is longer in the aggregation."""
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, frags={(2, 0, 0): Frag(drop_size1=True)})
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fragment_dimension_names_may_differ(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, frags=lambda i: Frag(rename_dims=True))
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_identifiers_per_fragment(tmp_path, dialect):
    frags = lambda i: Frag(identifier=f"v{i[0]}{i[2]}")
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, frags=frags)
    check_read(b)


@pytest.mark.parametrize("dialect", CF_LIKE)
@pytest.mark.parametrize("style", ["scalar", "per-fragment"])
def test_identifier_different_from_variable_name(tmp_path, dialect, style):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, frags=lambda i: Frag(identifier="air_temp"), identifiers=style)
    check_read(b)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("ident", ["/tas", "/model/tas", "/a/b/air"])
def test_absolute_path_identifiers(tmp_path, dialect, ident):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, frags=lambda i: Frag(identifier=ident))
    check_read(b)


# ---------------------------------------------------------------------------
# Aggregation variable's own encoding, masking, fill values
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", DIALECTS)
def test_aggregation_scale_factor_add_offset_applied_after(tmp_path, dialect):
    t = truth(masked=0.1)
    b = build(dialect, tmp_path, t, DIMS, SIZES, agg_scale_factor=0.01, agg_add_offset=260.0, fill_value=-32767)
    x = read(b)
    assert x.chunks == b.chunks
    assert x.dtype.kind == "f"
    got = x.compute()
    assert_matches(got, b.expected, rtol=1e-9)
    np.testing.assert_allclose(np.ma.getdata(got)[~t.mask], np.ma.getdata(t)[~t.mask], atol=0.006)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_both_packings_together(tmp_path, dialect):
    """Fragment packed (its own scale) inside a packed aggregation variable."""
    t = truth(masked=0.1)
    b = build(dialect, tmp_path, t, DIMS, SIZES, agg_scale_factor=0.1, agg_add_offset=200.0, fill_value=-32767,
              frags={(0, 0, 0): Frag(scale_factor=2.0, add_offset=10.0, dtype="i2")})
    got = read(b).compute()
    assert_matches(got, b.expected, rtol=1e-9)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mask_false_gives_aggregation_fill_value(tmp_path, dialect):
    t = truth(masked=0.3)
    b = build(dialect, tmp_path, t, DIMS, SIZES, fill_value=-1.0e20,
              frags=lambda i: Frag(missing=["_FillValue", "missing_value", "valid_range"][i[0]]))
    x = daskcfa.from_cfa(str(b.path), b.variable, mask=False)
    assert x.chunks == b.chunks
    got = x.compute()
    assert not np.ma.is_masked(got)
    np.testing.assert_array_equal(np.asarray(got), b.filled)
    assert np.sum(np.asarray(got) == np.float32(-1.0e20)) == t.mask.sum()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mask_false_without_fill_value_gives_netcdf_default(tmp_path, dialect):
    t = truth(masked=0.3)
    b = build(dialect, tmp_path, t, DIMS, SIZES)
    got = daskcfa.from_cfa(str(b.path), b.variable, mask=False).compute()
    assert not np.ma.is_masked(got)
    assert b.fill_value == DEFAULT_FILL("f4")
    np.testing.assert_array_equal(np.asarray(got), b.filled)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mask_false_integer_default_fill(tmp_path, dialect):
    t = make_truth(SHAPE, "i2", seed=2, lo=-100, hi=100, masked=0.2)
    b = build(dialect, tmp_path, t, DIMS, SIZES, units="1")
    got = daskcfa.from_cfa(str(b.path), b.variable, mask=False).compute()
    assert got.dtype == np.int16
    np.testing.assert_array_equal(np.asarray(got), t.filled(DEFAULT_FILL("i2")))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mask_true_without_missing_data_still_equal(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(masked=0.0), DIMS, SIZES)
    got = read(b).compute()
    assert not np.ma.is_masked(got)
    np.testing.assert_array_equal(np.ma.getdata(got), np.ma.getdata(b.expected))


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6"])
def test_values_equal_to_aggregation_fill_value_are_masked(tmp_path, dialect):
    """Like netCDF4-python: the aggregation's _FillValue describes the aggregated data."""
    t = truth(masked=0.0)
    t[0, 0, 0] = -999.0
    t[5, 3, 4] = -999.0
    b = build(dialect, tmp_path, t, DIMS, SIZES, fill_value=-999.0)
    got = read(b).compute()
    assert np.ma.getmaskarray(got)[0, 0, 0] and np.ma.getmaskarray(got)[5, 3, 4]
    assert np.ma.getmaskarray(got).sum() == 2


# ---------------------------------------------------------------------------
# Wholly missing fragments, unique values, in-file fragments, alternatives
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", ["CFA-0.6", "CFA-0.5", "CFA-0.4"])
def test_absent_fragments_read_as_missing(tmp_path, dialect):
    frags = {(0, 0, 1): Frag(absent=True), (2, 0, 0): Frag(absent=True)}
    b = build(dialect, tmp_path, truth(masked=0.0), DIMS, SIZES, frags=frags)
    got = check_read(b)
    assert np.ma.getmaskarray(got)[0:2, :, 2:].all()
    assert np.ma.getmaskarray(got)[5:6, :, 0:2].all()
    assert np.ma.getmaskarray(got).sum() == 2 * 4 * 3 + 1 * 4 * 2


@pytest.mark.parametrize("dialect", ["CFA-0.6", "CFA-0.5", "CFA-0.4"])
def test_absent_fragments_mask_false(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(masked=0.0), DIMS, SIZES, fill_value=-5.0, frags={(1, 0, 1): Frag(absent=True)})
    got = daskcfa.from_cfa(str(b.path), b.variable, mask=False).compute()
    assert (np.asarray(got)[2:5, :, 2:] == -5.0).all()
    np.testing.assert_array_equal(np.asarray(got), b.filled)


@pytest.mark.parametrize("dialect", ["CFA-0.5", "CFA-0.4"])
def test_sparse_partitions_only_one_written(tmp_path, dialect):
    frags = lambda i: None if i == (1, 0, 1) else Frag(absent=True)
    b = build(dialect, tmp_path, truth(masked=0.0), DIMS, SIZES, frags=frags)
    check_read(b)


def unique_truth():
    u = np.ma.zeros((4, 7), dtype="f8")
    u[:1, :3] = 1.5
    u[:1, 3:] = -2.0
    u[1:, :3] = np.ma.masked
    u[1:, 3:] = 4.25
    return u


@pytest.mark.parametrize("dialect", CF_LIKE)
def test_unique_values(tmp_path, dialect):
    b = build(dialect, tmp_path, unique_truth(), ("y", "x"), ((1, 3), (3, 4)), unique=True, fill_value=-1e30)
    got = check_read(b, dtype="f8")
    assert np.ma.getmaskarray(got)[1:, :3].all()
    mf = daskcfa.from_cfa(str(b.path), b.variable, mask=False).compute()
    np.testing.assert_array_equal(np.asarray(mf), unique_truth().filled(-1e30))


@pytest.mark.parametrize("dialect", CF_LIKE)
def test_unique_values_with_their_own_fill_value(tmp_path, dialect):
    """unique_values marks missing fragments with its own _FillValue; mask=False gives the aggregation's."""
    b = build(dialect, tmp_path, unique_truth(), ("y", "x"), ((1, 3), (3, 4)), unique=True, fill_value=-1e30,
              unique_fill=-7.0)
    got = check_read(b)
    assert np.ma.getmaskarray(got).sum() == 9
    mf = daskcfa.from_cfa(str(b.path), b.variable, mask=False).compute()
    np.testing.assert_array_equal(np.asarray(mf), unique_truth().filled(-1e30))


@pytest.mark.parametrize("dialect", CF_LIKE)
def test_unique_values_without_fill_value_attribute(tmp_path, dialect):
    u = unique_truth()
    u[1:, :3] = 7.0  # no missing fragments
    b = build(dialect, tmp_path, u, ("y", "x"), ((1, 3), (3, 4)), unique=True)
    check_read(b)


def test_unique_values_integer(tmp_path):
    u = np.ma.zeros((6,), dtype="i2")
    u[:2], u[2:5], u[5:] = 3, -4, 9
    b = build_cf113(tmp_path, u, ("t",), ((2, 3, 1),), unique=True, units="1")
    check_read(b, dtype="i2")


def test_unique_values_with_fragments_deleted_elsewhere(tmp_path):
    """unique_values never opens any file besides the aggregation file."""
    b = build_cf113(tmp_path, unique_truth(), ("y", "x"), ((1, 3), (3, 4)), unique=True)
    assert not b.fragment_files
    check_read(b)


def test_cfa06_in_file_fragments(tmp_path):
    frags = {(0, 0, 0): Frag(in_file=True), (1, 0, 1): Frag(in_file=True, scale_factor=0.01, add_offset=250.0)}
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, frags=frags)
    check_read(b)


def test_cfa06_in_file_absent_and_external_mixed(tmp_path):
    frags = {(0, 0, 0): Frag(in_file=True), (0, 0, 1): Frag(absent=True), (2, 0, 1): Frag(units="degC")}
    b = build_cfa06(tmp_path, truth(dtype="f8"), DIMS, SIZES, frags=frags)
    check_read(b)


@pytest.mark.parametrize("strings", ["vlen", "char"])
def test_cfa06_alternative_uris(tmp_path, strings):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, alternatives=True, strings=strings)
    assert any(len(u) == 2 for u in b.fragment_uris.values()), "some first alternatives must not exist"
    check_read(b)


@pytest.mark.parametrize("strings", ["vlen", "char"])
def test_cfa06_substitutions(tmp_path, strings):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, substitutions=True, strings=strings)
    check_read(b)


def test_cfa06_substitutions_and_alternatives(tmp_path):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, substitutions=True, alternatives=True,
                    frags={(1, 0, 0): Frag(absent=True)})
    check_read(b)


def test_cfa06_per_fragment_format_and_address(tmp_path):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, per_fragment_format=True, address="per-fragment")
    check_read(b)


def test_cfa06_keywords_are_case_insensitive(tmp_path):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, keyword_case="mixed")
    check_read(b)


def test_cfa04_base_and_old_dimension_attribute(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES, base=True, dims_attr="cf_dimensions")
    check_read(b)


def test_nca_transposed_and_reversed_partitions(tmp_path):
    """NCA partitions may store their dims in another order or direction.

    Interpretation used (formats.md gives only the key names): a partition's
    ``dimensions`` lists the fragment variable's dims in its stored order;
    ``directions`` maps dim -> false where the fragment runs the other way.
    """
    frags = {(0, 0, 1): Frag(transpose=(2, 0, 1)), (1, 0, 0): Frag(reverse=(True, False, True)),
             (2, 0, 1): Frag(transpose=(1, 2, 0), reverse=(False, True, False))}
    b = build_nca(tmp_path, truth(), DIMS, SIZES, frags=frags)
    check_read(b)


# ---------------------------------------------------------------------------
# Groups, scalars, multi-line instructions, map variants
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", CF_LIKE)
@pytest.mark.parametrize("dims_in_group", [False, True])
def test_variable_in_group(tmp_path, dialect, dims_in_group):
    """Map in the group (plain name), URIs in root ("/name"), identifiers by full path."""
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, group="grp", dims_in_group=dims_in_group)
    assert b.variable == "/grp/tas"
    check_read(b)
    x = daskcfa.from_cfa(str(b.path))  # the only aggregated variable
    assert_matches(x.compute(), b.expected)


def test_variable_in_nested_group(tmp_path):
    b = build_cf113(tmp_path, truth(), DIMS, SIZES, group="model/run1")
    assert b.variable == "/model/run1/tas"
    check_read(b)


def test_instruction_variables_found_in_ancestor_group(tmp_path):
    """A plain name not in the variable's group is searched in its ancestors (cfdm writes this)."""
    import netCDF4

    b = build_cf113(tmp_path, truth(), DIMS, SIZES)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        g = ds.createGroup("forecast")
        v = g.createVariable("tas", "f4", ())
        for k in ds["tas"].ncattrs():
            v.setncattr(k, ds["tas"].getncattr(k))
        ds.renameVariable("tas", "tas_root_copy")
        ds["tas_root_copy"].delncattr("aggregated_data")
        ds["tas_root_copy"].delncattr("aggregated_dimensions")
    x = daskcfa.from_cfa(str(b.path), "/forecast/tas")
    assert x.chunks == b.chunks
    assert_matches(x.compute(), b.expected)


@pytest.mark.parametrize("dialect", CF_LIKE + ("CFA-0.6",))
def test_scalar_aggregated_data(tmp_path, dialect):
    t = np.ma.MaskedArray(np.float32(288.25))
    b = build(dialect, tmp_path, t, (), ())
    x = read(b)
    assert x.shape == ()
    got = x.compute()
    assert float(got) == 288.25


@pytest.mark.parametrize("dialect", CF_LIKE)
def test_scalar_unique_value(tmp_path, dialect):
    t = np.ma.MaskedArray(np.float64(-3.5))
    b = build(dialect, tmp_path, t, (), (), unique=True)
    assert float(read(b).compute()) == -3.5


@pytest.mark.parametrize("dialect", CF_LIKE)
def test_multiline_aggregated_data(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, multiline=True)
    check_read(b)


@pytest.mark.parametrize("map_dtype", ["i4", "i8", "i2"])
@pytest.mark.parametrize("map_pad", ["default", "negative", "fillvalue", "missing_value"])
def test_map_dtypes_and_padding(tmp_path, map_dtype, map_pad):
    b = build_cf113(tmp_path, truth(), DIMS, SIZES, map_dtype=map_dtype, map_pad=map_pad)
    check_read(b)


def test_map_without_padding(tmp_path):
    """Every dimension has the same number of fragments: no padding at all."""
    t = truth(shape=(4, 6, 2))
    b = build_cf113(tmp_path, t, DIMS, ((1, 3), (2, 4), (1, 1)))
    check_read(b)


def test_global_conventions_attribute_is_not_trusted(tmp_path):
    """A stale Conventions attribute must not decide the dialect."""
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES)
    import netCDF4

    with netCDF4.Dataset(str(b.path), "a") as ds:
        ds.Conventions = "CF-1.13"
    check_read(b)
    c = build_cf113(tmp_path / "c", truth(), DIMS, SIZES, global_attrs={"Conventions": "CF-1.8 CFA-0.4"})
    check_read(c)


def test_many_fragments(tmp_path):
    t = truth(shape=(40, 3, 6), masked=0.05)
    b = build_cf113(tmp_path, t, DIMS, ((1,) * 40, (2, 1), (3, 3)))
    assert len(b.fragment_files) == 160
    check_read(b)


# ---------------------------------------------------------------------------
# chunks= merging
# ---------------------------------------------------------------------------
MERGE_SIZES = ((2, 2, 2, 2), (3, 3), (5, 5))  # 16 fragments of 2*3*5*4 = 120 bytes


def _boundaries(rows):
    return [set(np.cumsum((0,) + tuple(r)).tolist()) for r in rows]


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6", "CFA-0.4"])
@pytest.mark.parametrize("limit,limit_bytes", [("500B", 500), ("1KiB", 1024), ("2KiB", 2048)])
def test_chunks_by_size_merge_whole_fragments(tmp_path, dialect, limit, limit_bytes):
    t = truth(shape=(8, 6, 10), masked=0.1)
    b = build(dialect, tmp_path, t, DIMS, MERGE_SIZES)
    x = daskcfa.from_cfa(str(b.path), b.variable, chunks=limit)
    frag_b = _boundaries(b.sizes)
    chunk_b = _boundaries(x.chunks)
    for d in range(3):
        assert chunk_b[d] <= frag_b[d], f"chunk boundaries along {DIMS[d]} must be fragment boundaries"
    assert x.npartitions < 16, "neighbouring fragments must be merged"
    for block_shape in np.ndindex(*x.numblocks):
        nbytes = np.prod([x.chunks[d][i] for d, i in enumerate(block_shape)]) * 4
        assert nbytes <= limit_bytes
    assert_matches(x.compute(), b.expected)


def test_chunks_by_large_size_merge_everything(tmp_path):
    b = build_cf113(tmp_path, truth(shape=(8, 6, 10)), DIMS, MERGE_SIZES)
    x = daskcfa.from_cfa(str(b.path), "tas", chunks="256MiB")
    assert x.npartitions == 1
    assert_matches(x.compute(), b.expected)


def test_chunks_smaller_than_a_fragment_keep_fragments(tmp_path):
    """A size smaller than one fragment never splits nor merges fragments."""
    b = build_cf113(tmp_path, truth(shape=(8, 6, 10)), DIMS, MERGE_SIZES)
    x = daskcfa.from_cfa(str(b.path), "tas", chunks="64B")
    assert all(cb <= fb for cb, fb in zip(_boundaries(x.chunks), _boundaries(b.sizes)))
    assert_matches(x.compute(), b.expected)


def test_chunks_fragments_is_default(tmp_path):
    b = build_cf113(tmp_path, truth(shape=(8, 6, 10)), DIMS, MERGE_SIZES)
    assert daskcfa.from_cfa(str(b.path), "tas", chunks="fragments").chunks == b.chunks
    assert daskcfa.from_cfa(str(b.path), "tas").chunks == b.chunks


# ---------------------------------------------------------------------------
# Indexing: numpy semantics
# ---------------------------------------------------------------------------
KEYS = [
    (),
    Ellipsis,
    (0,),
    (-1,),
    (slice(None, None, -1),),
    (slice(1, 5), slice(None), slice(1, 4)),
    (slice(None, None, 2), 1, slice(None, None, 3)),
    (slice(5, 0, -2), slice(-1, None), -2),
    (1, 2, 3),
    (-6, -4, -5),
    (Ellipsis, 2),
    (slice(2, 2),),
    (slice(4, 1), slice(None), 0),
    (slice(-100, 100), slice(None, None, -3)),
    (slice(1, 2), slice(3, 4), slice(4, 5)),
    (np.int64(3), Ellipsis, np.int32(-1)),
    ([0, 5, 2],),
    (slice(None), [3, 0]),
    (np.array([True, False, True, False, False, True]),),
]


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    b = build_cfa06(tmp_path_factory.mktemp("idx"), truth(masked=0.2), DIMS, SIZES)
    return b, daskcfa.from_cfa(str(b.path.resolve()), b.variable)


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_indexing_matches_numpy(indexed, key):
    b, x = indexed
    expected = b.expected[key]
    got = x[key].compute()
    assert_matches(got, expected)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_indexing_every_dialect(tmp_path, dialect):
    b = build(dialect, tmp_path, truth(masked=0.2), DIMS, SIZES)
    x = read(b)
    for key in KEYS[:16]:
        assert_matches(x[key].compute(), b.expected[key])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=hnp.basic_indices(SHAPE, min_dims=0, allow_ellipsis=True, allow_newaxis=True))
def test_indexing_hypothesis(indexed, key):
    b, x = indexed
    with dask.config.set(scheduler="synchronous"):
        got = x[key].compute()
    assert_matches(got, b.expected[key])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_chained_indexing_hypothesis(indexed, data):
    b, x = indexed
    k1 = data.draw(hnp.basic_indices(SHAPE, allow_ellipsis=False))
    sub = b.expected[k1]
    k2 = data.draw(hnp.basic_indices(sub.shape, allow_ellipsis=True))
    with dask.config.set(scheduler="synchronous"):
        got = x[k1][k2].compute()
    assert_matches(got, sub[k2])


# ---------------------------------------------------------------------------
# Laziness
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", DIALECTS)
def test_open_reads_only_the_aggregation_file(tmp_path, dialect, sync_dask):
    b = build(dialect, tmp_path, truth(), DIMS, SIZES)
    for p in b.fragment_files.values():
        p.unlink()
    x = daskcfa.from_cfa(str(b.path), b.variable)  # must not touch fragments
    assert x.chunks == b.chunks
    with daskcfa.open_cfa(str(b.path)) as ds:
        v = ds.variables["tas"]
        assert v.shape == SHAPE
        assert v.fragments.shape == b.grid_shape
        _ = v.data
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x[4, 1, 3].compute()  # fragment (1, 0, 1)
    err = info.value
    assert err.fragment == (1, 0, 1)
    assert err.variable in ("tas", "/tas")
    assert "aggregation.tas.1.0.1.nc" in str(err) and "tas" in str(err)
    # (whether .file is the fragment's URI is checked in test_bad_input.py)


def test_only_the_needed_fragments_are_read(tmp_path, sync_dask):
    b = build_cf113(tmp_path, truth(), DIMS, SIZES)
    for idx, p in b.fragment_files.items():
        if idx != (0, 0, 1):
            p.unlink()
    x = daskcfa.from_cfa(str(b.path), "tas")
    assert_matches(x[0:2, :, 2:].compute(), b.expected[0:2, :, 2:])
    assert_matches(x[1, 3, 4].compute(), b.expected[1, 3, 4])


def test_fragment_added_after_open_is_read_at_compute(tmp_path):
    b = build_cf113(tmp_path, truth(), DIMS, SIZES, frags={(0, 0, 0): Frag(write_file=False)})
    x = daskcfa.from_cfa(str(b.path), "tas")
    with pytest.raises(daskcfa.MissingFragmentError):
        x.compute()
    from builders import write_fragment_file

    write_fragment_file(b.fragment_files[(0, 0, 0)], "tas", DIMS, np.ma.getdata(truth())[:2, :, :2], {"units": "K"})
    good = np.ma.MaskedArray(np.ma.getdata(truth())[:2, :, :2])
    assert_matches(x[:2, :, :2].compute(), good)


# ---------------------------------------------------------------------------
# open_cfa: the netCDF4-python-like Dataset
# ---------------------------------------------------------------------------
HIDDEN = {
    "CF-1.13": {"fragment_map", "fragment_uris", "fragment_identifiers"},
    "cfdm-interim": {"fragment_map", "fragment_uris", "fragment_identifiers"},
    "cfapyx-interim": {"fragment_map", "fragment_uris", "fragment_identifiers"},
    "CFA-0.6": {"cfa_location", "cfa_file", "cfa_format", "cfa_address"},
    "CFA-0.5": set(),
    "CFA-0.4": set(),
    "NCA": set(),
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_open_cfa_dataset(tmp_path, dialect):
    t = truth(masked=0.2)
    b = build(dialect, tmp_path, t, DIMS, SIZES, attrs={"standard_name": "air_temperature", "long_name": "T"},
              fill_value=-1e20)
    with daskcfa.open_cfa(str(b.path)) as ds:
        assert isinstance(ds, daskcfa.Dataset)
        names = set(ds.variables)
        assert {"tas", "time", "lat", "lon"} <= names
        assert not (HIDDEN[dialect] & names), "instruction variables must be hidden"
        assert names == {"tas", "time", "lat", "lon"}
        for d, n in zip(DIMS, SHAPE):
            assert len(ds.dimensions[d]) == n
        assert "Conventions" in ds.ncattrs()
        assert isinstance(ds.getncattr("Conventions"), str)

        v = ds.variables["tas"]
        assert tuple(v.dims) == DIMS
        assert v.shape == SHAPE
        assert v.dtype == np.float32
        assert v.attrs["units"] == "K"
        assert v.attrs["standard_name"] == "air_temperature"
        assert v.attrs["long_name"] == "T"
        assert v.fragments is not None
        assert tuple(v.fragments.shape) == b.grid_shape
        assert isinstance(v.data, da.Array)
        assert v.data.chunks == b.chunks
        assert_matches(v.data.compute(), b.expected)
        full = v[...]
        assert isinstance(full, np.ndarray)
        assert np.ma.isMaskedArray(full)
        assert_matches(full, b.expected)
        assert_matches(v[1:5, ::2, -1], b.expected[1:5, ::2, -1])
        assert_matches(v[3], b.expected[3])

        for d, n in zip(DIMS, SHAPE):
            c = ds.variables[d]
            assert c.fragments is None
            assert tuple(c.dims) == (d,)
            assert c.shape == (n,)
            np.testing.assert_array_equal(np.asarray(c[...]), np.arange(n) * 1.5 + 10.0)
            np.testing.assert_array_equal(np.asarray(c.data.compute()), np.arange(n) * 1.5 + 10.0)
            assert c.attrs["long_name"] == f"{d} coordinate"


def test_open_cfa_groups(tmp_path):
    b = build_cf113(tmp_path, truth(), DIMS, SIZES, group="grp", attrs={"standard_name": "air_temperature"})
    with daskcfa.open_cfa(str(b.path)) as ds:
        assert "grp" in ds.groups
        g = ds.groups["grp"]
        assert "tas" in g.variables
        assert "tas" not in ds.variables
        v = g.variables["tas"]
        assert v.shape == SHAPE
        assert v.attrs["standard_name"] == "air_temperature"
        assert_matches(v[...], b.expected)
        assert "fragment_map" not in g.variables and "fragment_identifiers" not in g.variables
        assert "fragment_uris" not in ds.variables
        assert {"time", "lat", "lon"} <= set(ds.variables)


def test_open_cfa_context_manager_and_close(tmp_path):
    b = build_cf113(tmp_path, truth(), DIMS, SIZES)
    ds = daskcfa.open_cfa(str(b.path))
    with ds as same:
        assert same is ds
        x = same.variables["tas"].data
    # The lazy array outlives the Dataset.
    assert_matches(x.compute(), b.expected)
    ds.close()  # closing twice is harmless


def test_open_cfa_ordinary_data_variable(tmp_path):
    """A plain (non-aggregated) data variable in the aggregation file is readable too."""
    import netCDF4

    b = build_cf113(tmp_path, truth(), DIMS, SIZES)
    plain = make_truth((4, 5), "f8", seed=9, masked=0.3)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        v = ds.createVariable("orog", "f8", ("lat", "lon"), fill_value=-1.0)
        v.units = "m"
        v[...] = plain
    with daskcfa.open_cfa(str(b.path)) as ds:
        o = ds.variables["orog"]
        assert o.fragments is None
        assert o.dims == ("lat", "lon")
        assert o.attrs["units"] == "m"
        assert_matches(o[...], plain)
        assert_matches(o[1:, ::-1], plain[1:, ::-1])
        assert_matches(o.data.compute(), plain)


def test_open_cfa_two_aggregated_variables(tmp_path):
    b1 = build_cf113(tmp_path, truth(seed=1), DIMS, SIZES, name="tas")
    b2 = build_cf113(tmp_path, truth(seed=2, dtype="f8"), DIMS, ((6,), (1, 3), (5,)), name="pr", append=True, units="kg m-2 s-1")
    with daskcfa.open_cfa(str(b1.path)) as ds:
        assert {"tas", "pr"} <= set(ds.variables)
        assert tuple(ds.variables["tas"].fragments.shape) == (3, 1, 2)
        assert tuple(ds.variables["pr"].fragments.shape) == (1, 2, 1)
        assert_matches(ds.variables["tas"][...], b1.expected)
        assert_matches(ds.variables["pr"][...], b2.expected)
    assert_matches(daskcfa.from_cfa(str(b1.path), "pr").compute(), b2.expected)
    assert daskcfa.from_cfa(str(b1.path), "pr").chunks == b2.chunks


def test_open_cfa_scalar_variable(tmp_path):
    b = build_cf113(tmp_path, np.ma.MaskedArray(np.float32(1.25)), (), ())
    with daskcfa.open_cfa(str(b.path)) as ds:
        v = ds.variables["tas"]
        assert v.shape == () and tuple(v.dims) == ()
        assert float(v[...]) == 1.25


def test_open_cfa_cfa05_hides_its_instruction_group(tmp_path):
    b = build_cfa05(tmp_path, truth(), DIMS, SIZES)
    with daskcfa.open_cfa(str(b.path)) as ds:
        assert "cfa_tas" not in ds.groups
        assert_matches(ds.variables["tas"][...], b.expected)


# ---------------------------------------------------------------------------
# Schedulers: thread safety, picklable graphs
# ---------------------------------------------------------------------------
def test_many_threads_many_fragments(tmp_path):
    t = truth(shape=(30, 4, 6), masked=0.1)
    b = build_cf113(tmp_path, t, DIMS, ((1,) * 30, (2, 2), (3, 3)),
                    frags=lambda i: Frag(scale_factor=0.01, add_offset=260.0) if i[0] % 3 == 0 else Frag(units="degC") if i[0] % 3 == 1 else None)
    x = daskcfa.from_cfa(str(b.path), "tas")
    with dask.config.set(scheduler="threads", num_workers=8):
        for _ in range(4):
            assert_matches(x.compute(), b.expected)
            assert_matches(x.mean(axis=0).compute(), b.expected.mean(axis=0), rtol=1e-5)


def test_process_scheduler(tmp_path):
    """The graph pickles and works in other processes (as on a cluster)."""
    b = build_cfa06(tmp_path, truth(masked=0.2), DIMS, SIZES, frags={(1, 0, 0): Frag(units="degC")})
    x = daskcfa.from_cfa(str(b.path), "tas")
    with dask.config.set(scheduler="processes", num_workers=2):
        got = x.compute()
    assert_matches(got, b.expected)


def test_graph_is_picklable(tmp_path):
    import pickle

    b = build_cf113(tmp_path, truth(), DIMS, SIZES)
    x = daskcfa.from_cfa(str(b.path), "tas")
    y = pickle.loads(pickle.dumps(x))
    assert_matches(y.compute(), b.expected)


# ---------------------------------------------------------------------------
# Random aggregations (hypothesis): any dialect, map, fragment encoding
# ---------------------------------------------------------------------------
_FRAG_CHOICES = [
    Frag(),
    Frag(units="degC"),
    Frag(dtype="f8"),
    Frag(dtype="i4"),
    Frag(scale_factor=0.01, add_offset=250.0),
    Frag(missing="missing_value"),
    Frag(missing="valid_range"),
    Frag(missing="nan"),
    Frag(drop_size1=True),
    Frag(identifier="/g/var"),
    Frag(rename_dims=True),
    Frag(absent=True),
]


@st.composite
def aggregations(draw):
    """(dialect, sizes, shape, per-fragment Frag, masked fraction, seed, builder options)."""
    dialect = draw(st.sampled_from(DIALECTS))
    ndim = draw(st.integers(1, 3))
    sizes = tuple(tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))) for _ in range(ndim))
    shape = tuple(sum(r) for r in sizes)
    grid = tuple(len(r) for r in sizes)
    allowed = [f for f in _FRAG_CHOICES if not (f.absent and dialect not in ("CFA-0.6", "CFA-0.5", "CFA-0.4"))]
    if dialect == "CFA-0.6":
        allowed.append(Frag(in_file=True))
    choice = {idx: draw(st.sampled_from(allowed)) for idx in np.ndindex(*grid)}
    masked = draw(st.sampled_from([0.0, 0.3]))
    seed = draw(st.integers(0, 2**16))
    opts = {}
    if dialect != "CFA-0.5":
        opts["fmt"] = draw(st.sampled_from(["NETCDF4", "NETCDF3_CLASSIC"]))
    if dialect in URI_DIALECTS:
        opts["uri_style"] = draw(st.sampled_from(["relative", "absolute", "file"]))
        if opts["fmt"] == "NETCDF4":
            opts["strings"] = draw(st.sampled_from(["vlen", "char"]))
    if dialect in CF_LIKE:
        opts["multiline"] = draw(st.booleans())
        opts["map_pad"] = draw(st.sampled_from(["default", "negative", "fillvalue", "missing_value"]))
        if opts["fmt"] == "NETCDF4" and draw(st.booleans()):
            opts["group"] = "grp"
    if dialect == "CFA-0.6":
        opts["alternatives"] = draw(st.booleans())
        opts["substitutions"] = draw(st.booleans())
    if draw(st.booleans()):
        opts["fill_value"] = -1.0e30
    if draw(st.booleans()):
        opts["agg_name"] = "sub dir/agg.nc"
        opts["fragment_dir"] = draw(st.sampled_from(["frags", "sub dir/frags"]))
    opts_key = draw(hnp.basic_indices(shape, min_dims=0, allow_ellipsis=True))
    return dialect, sizes, shape, choice, masked, seed, (opts, opts_key)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(agg=aggregations())
def test_random_aggregations(tmp_path_factory, agg):
    dialect, sizes, shape, choice, masked, seed, (opts, key2) = agg
    t = make_truth(shape, "f4", seed=seed, masked=masked)
    dims = ("time", "lat", "lon")[: len(shape)]
    directory = tmp_path_factory.mktemp("rand")
    b = build(dialect, directory, t, dims, sizes, frags=choice, **opts)
    with dask.config.set(scheduler="synchronous"):
        x = daskcfa.from_cfa(str(b.path), b.variable)
        absent = any(f.absent for f in choice.values())
        if not (absent and dialect in ("CFA-0.5", "CFA-0.4")):
            # (CFA-0.4/0.5 do not record where absent partitions' boundaries lie)
            assert x.chunks == b.chunks
        assert x.shape == shape
        assert x.dtype == np.float32
        assert_matches(x.compute(), b.expected, rtol=1e-6)
        key = tuple(slice(None, None, -1) if k % 2 else slice(1, None) for k in range(len(shape)))
        assert_matches(x[key].compute(), b.expected[key], rtol=1e-6)
        filled = daskcfa.from_cfa(str(b.path), b.variable, mask=False).compute()
        assert not np.ma.is_masked(filled)
        assert_matches(np.ma.MaskedArray(np.asarray(filled)), np.ma.MaskedArray(b.filled), rtol=1e-6)
        assert_matches(x[key2].compute(), b.expected[key2], rtol=1e-6)
        merged = daskcfa.from_cfa(str(b.path), b.variable, chunks="200B")
        if not (absent and dialect in ("CFA-0.5", "CFA-0.4")):
            for cb, fb in zip(_boundaries(merged.chunks), _boundaries(b.sizes)):
                assert cb <= fb
        assert_matches(merged.compute(), b.expected, rtol=1e-6)


@pytest.mark.parametrize("dialect", ["CFA-0.5", "CFA-0.4"])
def test_s3netcdf4_variable_in_a_group(tmp_path, dialect):
    """S3netCDF4 puts /forecast/tas at /forecast/tas of each sub-array file while ``ncvar`` says tas."""
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, group="forecast")
    assert b.variable == "/forecast/tas"
    check_read(b)


@pytest.mark.parametrize("dialect", ["CFA-0.5", "CFA-0.4"])
def test_s3netcdf4_group_falls_back_to_the_root_of_the_fragment(tmp_path, dialect):
    """Sub-array files with the variable at the root still read (the group path is tried first);
    a fragment holding neither is refused naming both places."""
    b = build(dialect, tmp_path, truth(), DIMS, SIZES, group="forecast")
    b.fragment_files[(0, 0, 0)].unlink()
    with netCDF4.Dataset(b.fragment_files[(0, 0, 0)], "w") as nc:  # the root only, other values
        for d, n in zip(DIMS, b.expected[:2, :, :2].shape):
            nc.createDimension(d, n)
        nc.createVariable("tas", "f4", DIMS)[...] = np.full((2, 4, 2), 7.0, dtype="f4")
    expected = b.expected.copy()
    expected[:2, :, :2] = 7.0
    assert_matches(read(b).compute(), expected)
    b.fragment_files[(0, 0, 0)].unlink()
    with netCDF4.Dataset(b.fragment_files[(0, 0, 0)], "w") as nc:
        nc.createGroup("forecast")
    with pytest.raises(daskcfa.FragmentReadError, match="'/forecast/tas' or 'tas' not found") as info:
        read(b).compute()
    assert info.value.fragment == (0, 0, 0)


@pytest.mark.parametrize("cf_role", [True, False])
def test_nca_virtual_partitions_extra_dims_quotes_and_in_file(tmp_path, cf_role):
    """NCA as its convention writes it: ``part`` ranges and index lists (two partitions of one
    file variable), a size-1 file dimension the aggregation lacks, own units and directions,
    a sub-array in the NCA file itself, Python-style quotes; with or without ``cf_role``."""
    b = build_nca_virtual(tmp_path, truth(masked=0), cf_role=cf_role)
    x = daskcfa.from_cfa(str(b.path), "tas")
    assert x.chunks == b.chunks
    assert_matches(x.compute(), b.expected, rtol=1e-5)
    # pieces across partitions, reversed and strided selections, single points
    for key in [(slice(1, 5), slice(None), slice(2, 4)), (slice(None, None, -2), 2, slice(None, None, -1)),
                (4, slice(3, 0, -1), 4), (slice(2, 5), slice(1, 3), slice(0, 5, 3)), (5, 0, 0)]:
        assert_matches(x[key].compute(), b.expected[key], rtol=1e-5)


def test_nca_bad_virtual_partitions_are_refused(tmp_path):
    b = build_nca_virtual(tmp_path, truth(masked=0))
    with netCDF4.Dataset(b.path) as ds:
        text = ds["tas"].nca_array
    for old, new, error, match in [
        ("(2, 4, 1), (0, 3, 1)", "(2, 4, 1), (1, 3, 1)", daskcfa.CFAFormatError, "does not fit the shape"),
        ("(0, 3, 1), (0, 2, 1)]'", "(0, 1, 1), [0, 1, 2, 0, 1, 2]]'", daskcfa.CFAFormatError,
         "selects 2 elements along 'lat', but it spans 4"),
        ("[7, 5, 6]", "[7, 5, 8]", daskcfa.CFAFormatError, "within the file variable"),
        ("'[(2, 4, 1), (0, 3, 1), (0, 2, 1)]'", "'[(2, 4, 1), (0, 3, 1)]'", daskcfa.CFAFormatError,
         "one index selection per dimension"),
        ("(2, 4, 1), (0, 3, 1)", "(2, 4, 0), (0, 3, 1)", daskcfa.CFAFormatError, "not a non-empty range"),
        ("'shape': [1, 3, 4, 2]", "'shape': [1, 3, 4, 2], 'format': 'PP'", daskcfa.CFAFormatError, "format 'PP'"),
        ("'tas_p11'", "'nowhere'", daskcfa.CFAFormatError, "no variable 'nowhere'"),
    ]:
        assert old in text
        with netCDF4.Dataset(b.path, "a") as ds:
            ds["tas"].nca_array = text.replace(old, new, 1)
        with pytest.raises(error, match=match):
            daskcfa.from_cfa(str(b.path), "tas").compute()
    with netCDF4.Dataset(b.path, "a") as ds:
        ds["tas"].nca_array = text
    b.path.parent.joinpath("sub", "high.nc").unlink()  # now with two elements along 'height'
    write_fragment_file(b.path.parent / "sub" / "high.nc", "tas", ("height", "time", "lat", "lon"),
                        np.zeros((2, 3, 4, 2), dtype="f4"), {"units": "degC"})
    with pytest.raises(daskcfa.FragmentShapeError, match=r"shape \(2, 3, 4, 2\), expected \(1, 3, 4, 2\)") as info:
        daskcfa.from_cfa(str(b.path), "tas").compute()
    assert info.value.fragment == (0, 0, 1)
