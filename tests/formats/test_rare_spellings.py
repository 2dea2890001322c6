"""Aggregations spelled as formats.md allows but the usual tools do not write (attack16b).

Every dataset is written by tests/builders.py from numpy ground truth, then one
detail is respelled the way another tool (or a hand) may write it.
"""

from __future__ import annotations

import numpy as np
import pytest

import daskcfa
from builders import assert_matches, build, make_truth, write_netcdf
from remote_helpers import rewrite_uris

pytestmark = pytest.mark.usefixtures("other_cwd")

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (2, 3))


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6"])
@pytest.mark.parametrize("spelling", ["file:{path}", "FILE://{path}", "File://localhost{path}"],
                         ids=["rfc8089-one-slash", "upper-case-scheme", "mixed-case-localhost"])
def test_file_uris_in_every_rfc_8089_spelling(tmp_path, dialect, spelling):
    """``file:/abs/path`` (RFC 8089's minimal form, what Java's ``File.toURI`` writes, so netCDF-Java
    based tools) and scheme names in any case are absolute URIs: never paths relative to the
    aggregation file (before: ``<directory>/file:/abs/path``, or the working directory for ``FILE://``)."""
    built = build(dialect, tmp_path, make_truth((6, 4, 5), "f4", seed=2, masked=0.1), DIMS, SIZES)
    rewrite_uris(built.path, built.names.get("uris") or built.names["file"],
                 lambda u: spelling.format(path=(built.path.parent / u).resolve().as_posix()))
    assert_matches(daskcfa.from_cfa(str(built.path), built.variable).compute(), built.expected)


def test_zarr_v3_string_fragment_written_by_xarray_is_refused_saying_why(tmp_path):
    """xarray writes a Zarr v3 string array with a configured data type (an object, not a name):
    daskcfa does not read Zarr strings, and says so (before: "unhashable type: 'dict'")."""
    xr = pytest.importorskip("xarray")
    xr.Dataset({"v": ("x", np.array(["a", "bbbb", "c"]))}).to_zarr(tmp_path / "a.zarr", zarr_format=3,
                                                                   consolidated=False)
    write_netcdf(tmp_path / "agg.nc", dims={"x": 3, "i": 1, "j": 1, "f": 1}, variables={
        "map": dict(dtype="i4", dims=("i", "j"), data=[[3]]),
        "uris": dict(dtype="vlen", dims=("f",), data=["a.zarr"]),
        "ids": dict(dtype="vlen", dims=(), data="v"),
        "v": dict(dtype="vlen", dims=(), attrs={"aggregated_dimensions": "x",
                                                "aggregated_data": "map: map uris: uris identifiers: ids"})})
    with pytest.raises(daskcfa.FragmentReadError, match="data type .*fixed_length_utf32.* is not one daskcfa reads"):
        daskcfa.from_cfa(str(tmp_path / "agg.nc"), "v").compute()


@pytest.mark.xfail(strict=True, reason="the xarray backend declares netCDF's default _FillValue on every integer "
                                       "aggregated variable without one (so that absent fragments are masked): "
                                       "xarray then decodes int32 as float64 even when nothing can be missing")
def test_integer_aggregation_without_fill_value_keeps_its_dtype_through_xarray(tmp_path):
    """cfdm and CFAPyX copy the fragments' attributes: integer data written without a _FillValue gives
    an aggregation variable without one. xarray's netcdf4 engine gives such a variable in one file its
    integer dtype; through engine="daskcfa" it comes back as float64."""
    xr = pytest.importorskip("xarray")
    values = np.arange(6, dtype="i4")
    for name, part in (("whole", values), ("a", values[:3]), ("b", values[3:])):
        write_netcdf(tmp_path / f"{name}.nc", dims={"x": len(part)},
                     variables={"v": dict(dtype="i4", dims=("x",), data=part, fill_value=False)})
    write_netcdf(tmp_path / "agg.nc", dims={"x": 6, "i": 1, "j": 2, "f": 2}, variables={
        "map": dict(dtype="i4", dims=("i", "j"), data=[[3, 3]]),
        "uris": dict(dtype="vlen", dims=("f",), data=["a.nc", "b.nc"]),
        "ids": dict(dtype="vlen", dims=(), data="v"),
        "v": dict(dtype="i4", dims=(), fill_value=False, attrs={
            "aggregated_dimensions": "x", "aggregated_data": "map: map uris: uris identifiers: ids"})})
    want = xr.open_dataset(tmp_path / "whole.nc", engine="netcdf4")["v"]
    got = xr.open_dataset(tmp_path / "agg.nc", engine="daskcfa")["v"]
    assert daskcfa.from_cfa(str(tmp_path / "agg.nc"), "v").dtype == want.dtype == np.dtype("i4")
    xr.testing.assert_identical(got.variable.load(), want.variable.load())
    assert got.dtype == want.dtype  # (assert_identical compares values, not dtypes)
