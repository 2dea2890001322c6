"""S3netCDF4 2.1rc1 and daskcfa read each other's CFA-0.5 and CFA-0.4, with and without groups.

S3netCDF4 cannot be installed from PyPI; ``ci/s3nc-venv`` puts the wheel from
``../shared/peers/`` into ``.venv-s3nc`` and the peer runs there, in a
subprocess (tests/s3netcdf4_peer.py). Every answer is checked against numpy
ground truth built here. Skipped, saying why, when the wheel is absent or
does not fit this interpreter.

S3netCDF4 resolves relative sub-array paths against its working directory:
it runs from the aggregation's directory.
"""

from __future__ import annotations

import numpy as np
import pytest

import daskcfa
from builders import assert_matches, make_truth
from s3netcdf4_helpers import check_filled, peer, read_by_s3netcdf4, s3nc_config

DIMS = ("time", "lat", "lon")
SHAPE = (8, 4, 6)
SUBARRAY = (4, 2, 6)  # S3netCDF4 honours a sub-array shape that divides the array evenly
FORMATS = {"CFA-0.5": "0.5", "CFA-0.4": "0.4"}
VARIABLES = ["tas", "/forecast/tas"]


def truth() -> np.ma.MaskedArray:
    return make_truth(SHAPE, "f4", seed=3, masked=0.1)


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_daskcfa_output_read_by_s3netcdf4(tmp_path, s3netcdf4, fmt, variable):
    x = truth()
    url = daskcfa.to_cfa(x, str(tmp_path / "out" / "a7.nca"), variable=variable, dims=DIMS, format=fmt,
                         fragment_shape=dict(zip(DIMS, SUBARRAY)), attrs={"_FillValue": np.float32(-999)})
    got = read_by_s3netcdf4(s3netcdf4, s3nc_config(tmp_path / "s3nc.json"), url, variable, tmp_path / "out")
    check_filled(got, x, -999)
    assert_matches(daskcfa.from_cfa(url, variable).compute(), x)


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_s3netcdf4_output_read_by_daskcfa(tmp_path, s3netcdf4, fmt, variable):
    x = truth()
    np.save(tmp_path / "in.npy", np.ma.filled(x, -999))
    expected = np.ma.masked_equal(np.ma.filled(x, -999), -999)
    config = s3nc_config(tmp_path / "s3nc.json")
    path = tmp_path / "s3" / "a7.nca"
    path.parent.mkdir()
    peer(s3netcdf4, config, path.parent, "write", path, "CFA4", FORMATS[fmt], variable, tmp_path / "in.npy",
         ",".join(map(str, SUBARRAY)))
    check_filled(read_by_s3netcdf4(s3netcdf4, config, path, variable, path.parent), expected, -999)  # (sanity)
    y = daskcfa.from_cfa(str(path), variable)
    assert daskcfa.read_aggregation(str(path), variable).dialect == fmt
    assert y.chunks == tuple((s,) * (n // s) for n, s in zip(SHAPE, SUBARRAY))
    assert_matches(y.compute(), expected)


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_s3netcdf4_output_on_s3_read_by_daskcfa(tmp_path, s3netcdf4, s3_server, s3_bucket, monkeypatch, fmt,
                                                 variable):
    """S3netCDF4 writes through its alias (fragment URIs ``s3://tenancy-0/<bucket>/...``); daskcfa,
    given the same configuration file, reads through the alias and by the real URL with storage
    options (the alias's endpoint and bucket are the same location)."""
    x = truth()
    np.save(tmp_path / "in.npy", np.ma.filled(x, -999))
    expected = np.ma.masked_equal(np.ma.filled(x, -999), -999)
    config = s3nc_config(tmp_path / "s3nc.json", s3_server)
    alias_url = f"s3://tenancy-0/{s3_bucket}/run/a7.nca"
    peer(s3netcdf4, config, tmp_path, "write", alias_url, "CFA4", FORMATS[fmt], variable, tmp_path / "in.npy",
         ",".join(map(str, SUBARRAY)))
    check_filled(read_by_s3netcdf4(s3netcdf4, config, alias_url, variable, tmp_path), expected, -999)  # (sanity)
    monkeypatch.setenv("S3_NC_CONFIG", str(config))  # the user's one file, for both tools
    y = daskcfa.from_cfa(f"s3://{s3_bucket}/run/a7.nca", variable, storage_options=s3_server.storage_options)
    assert_matches(y.compute(), expected)
    assert_matches(daskcfa.from_cfa(alias_url, variable).compute(), expected)


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_daskcfa_output_on_s3_read_by_s3netcdf4(tmp_path, s3netcdf4, s3_server, s3_bucket, monkeypatch, fmt,
                                                 variable):
    """daskcfa writes through the alias with absolute fragment URIs (S3netCDF4 resolves relative
    ones against its working directory, never against an S3 aggregation); S3netCDF4 reads them."""
    x = truth()
    config = s3nc_config(tmp_path / "s3nc.json", s3_server)
    monkeypatch.setenv("S3_NC_CONFIG", str(config))
    url = f"s3://tenancy-0/{s3_bucket}/out/a7.nca"
    daskcfa.to_cfa(x, url, variable=variable, dims=DIMS, format=fmt, fragment_shape=dict(zip(DIMS, SUBARRAY)),
                   attrs={"_FillValue": np.float32(-999)},
                   fragment_name=f"s3://tenancy-0/{s3_bucket}/out/{{stem}}/{{stem}}.{{var}}.{{index}}.nc")
    check_filled(read_by_s3netcdf4(s3netcdf4, config, url, variable, tmp_path), x, -999)
    assert_matches(daskcfa.from_cfa(url, variable).compute(), x)
