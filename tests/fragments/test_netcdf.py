"""netCDF-3 fragments read through netCDF4-python: a file cut short is refused, not misread.

netCDF-C reads the missing tail of a truncated netCDF-3 file without an error
(values come back as zeros or garbage), so daskcfa checks a netCDF-3 file's
length against what its header describes before opening it.
"""

from __future__ import annotations

import os

import netCDF4
import numpy as np
import pytest

import daskcfa
from daskcfa.errors import FragmentReadError
from daskcfa.fragments.netcdf import NetCDF4File

FORMATS = ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA"]


def _write(path, fmt, *, record: bool, nvars: int) -> int:
    with netCDF4.Dataset(path, "w", format=fmt) as d:
        d.createDimension("t", None if record else 5)
        d.createDimension("y", 3)
        d.createDimension("x", 7)
        d.title = "x" * 13
        d.values = np.arange(5, dtype="i2")
        for k in range(nvars):
            v = d.createVariable(f"v{k}", "i2" if k else "f4", ("t", "y", "x"))
            v.units = "K"
            v[:] = np.arange(5 * 21).reshape(5, 3, 7)
        d.createVariable("c", "f8", ("y",))[:] = [1.0, 2.0, 3.0]
    return os.path.getsize(path)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("nvars", [1, 2])
def test_whole_files_open_and_cut_files_are_refused(tmp_path, fmt, record, nvars):
    path = tmp_path / "f.nc"
    size = _write(path, fmt, record=record, nvars=nvars)
    data = path.read_bytes()
    with NetCDF4File(str(path)) as f:
        np.testing.assert_array_equal(f.variable("v0").read((slice(None),) * 3), np.arange(105).reshape(5, 3, 7))
    NetCDF4File("mem", memory=data).close()
    for cut in (4, 40, size // 2, size - 30):
        short = data[: size - cut]
        path.write_bytes(short)
        with pytest.raises(FragmentReadError, match="truncated|malformed"):
            NetCDF4File(str(path))
        with pytest.raises(FragmentReadError, match="truncated|malformed"):
            NetCDF4File("mem", memory=short)


def test_truncated_netcdf3_fragment_is_reported_by_from_cfa_and_verify(tmp_path):
    values = np.arange(6 * 4 * 5, dtype="f4").reshape(6, 4, 5)
    url = daskcfa.to_cfa(values, str(tmp_path / "a.nc"), variable="tas", dims=("time", "lat", "lon"),
                         fragment_shape=(2, 4, 5), fragment_format="NETCDF3_CLASSIC")
    np.testing.assert_array_equal(daskcfa.from_cfa(url).compute(), values)
    fragment = sorted((tmp_path / "a").glob("g-*/*.nc"))[1]
    fragment.write_bytes(fragment.read_bytes()[:250])  # the header and part of the data
    with pytest.raises(FragmentReadError) as info:
        daskcfa.from_cfa(url).compute()
    message = str(info.value)
    assert "truncated" in message and fragment.name in message and "(1, 0, 0)" in message
    report = daskcfa.verify(url)
    assert not report.ok and [p.index for p in report.problems] == [(1, 0, 0)]


def test_truncated_netcdf3_fragment_over_http_is_refused(tmp_path, make_http_server):
    values = np.arange(6 * 4 * 5, dtype="f4").reshape(6, 4, 5)
    www = tmp_path / "www"
    daskcfa.to_cfa(values, str(www / "a.nc"), variable="tas", dims=("time", "lat", "lon"),
                   fragment_shape=(2, 4, 5), fragment_format="NETCDF3_64BIT_OFFSET")
    fragment = sorted((www / "a").glob("g-*/*.nc"))[2]
    fragment.write_bytes(fragment.read_bytes()[:300])
    http = make_http_server(www)
    x = daskcfa.from_cfa(http.url_for("a.nc"))
    np.testing.assert_array_equal(x[:4].compute(), values[:4])
    with pytest.raises(FragmentReadError, match="truncated") as info:
        x[4:].compute()
    assert "(2, 0, 0)" in str(info.value)
