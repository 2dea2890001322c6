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

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import daskcfa
from builders import assert_matches, make_truth

REPO = Path(__file__).resolve().parents[2]
PEER = Path(__file__).resolve().parents[1] / "s3netcdf4_peer.py"
DIMS = ("time", "lat", "lon")
SHAPE = (8, 4, 6)
SUBARRAY = (4, 2, 6)  # S3netCDF4 honours a sub-array shape that divides the array evenly
FORMATS = {"CFA-0.5": "0.5", "CFA-0.4": "0.4"}
VARIABLES = ["tas", "/forecast/tas"]


@pytest.fixture(scope="session")
def s3netcdf4() -> str:
    """The interpreter of the S3netCDF4 venv, made on first use by ``ci/s3nc-venv``."""
    env = {**os.environ, "PYTHON": os.environ.get("DASKCFA_S3NC_PYTHON", sys.executable)}
    done = subprocess.run(["bash", str(REPO / "ci" / "s3nc-venv")], env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        pytest.skip(f"S3netCDF4 is not available (ci/s3nc-venv exit {done.returncode}): {done.stderr.strip()[-500:]}")
    return str(REPO / ".venv-s3nc" / "bin" / "python")


def peer(python: str, config: Path, cwd: Path, *args: str) -> None:
    done = subprocess.run([python, str(PEER), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "S3_NC_CONFIG": str(config)})
    assert done.returncode == 0, f"S3netCDF4 failed:\n{done.stderr[-3000:]}"


def s3nc_config(path: Path, s3_server=None, alias: str = "tenancy-0") -> Path:
    """An S3netCDF4 configuration; with ``s3_server``, the alias for it (the serial backend:
    the default asynchronous one silently uploads nothing here)."""
    hosts = {}
    if s3_server is not None:
        hosts[f"s3://{alias}"] = {"alias": alias, "url": s3_server.endpoint_url,
                                  "credentials": {"accessKey": s3_server.key, "secretKey": s3_server.secret},
                                  "backend": "s3FileObject", "api": "S3v4"}
    backend = {"maximum_part_size": "50MB", "maximum_parts": 4, "enable_multipart_download": False,
               "enable_multipart_upload": False, "connect_timeout": 30.0, "read_timeout": 30.0}
    path.write_text(json.dumps({"version": "9", "hosts": hosts, "backends": {"s3FileObject": backend},
                                "resource_allocation": {"memory": "100MB", "filehandles": 20}}))
    return path


def truth() -> np.ma.MaskedArray:
    return make_truth(SHAPE, "f4", seed=3, masked=0.1)


def read_by_s3netcdf4(python: str, config: Path, path: Path | str, variable: str, cwd: Path) -> np.ma.MaskedArray:
    out = cwd / "s3netcdf4-read.npz"
    peer(python, config, cwd, "read", path, variable, out)
    with np.load(out) as saved:
        return np.ma.MaskedArray(saved["data"], mask=saved["mask"])


def check_filled(got: np.ma.MaskedArray, expected: np.ma.MaskedArray, fill: float) -> None:
    """S3netCDF4 returns fill values where data are missing (masked or not): compare with them filled."""
    np.testing.assert_array_equal(np.ma.filled(got, fill), np.ma.filled(expected, fill))


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
