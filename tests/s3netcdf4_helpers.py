"""Running S3netCDF4 2.1rc1 (the peer daskcfa succeeds) from the tests: its venv, its configuration file,
and reading with it (tests/s3netcdf4_peer.py runs in that venv, in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
PEER = Path(__file__).resolve().parent / "s3netcdf4_peer.py"


def s3netcdf4_python() -> str:
    """The interpreter of the S3netCDF4 venv, made on first use by ``ci/s3nc-venv`` (skips when it cannot be)."""
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


def read_by_s3netcdf4(python: str, config: Path, path: Path | str, variable: str, cwd: Path) -> np.ma.MaskedArray:
    out = cwd / "s3netcdf4-read.npz"
    peer(python, config, cwd, "read", path, variable, out)
    with np.load(out) as saved:
        return np.ma.MaskedArray(saved["data"], mask=saved["mask"])


def check_filled(got: np.ma.MaskedArray, expected: np.ma.MaskedArray, fill: float) -> None:
    """S3netCDF4 returns fill values where data are missing (masked or not): compare with them filled."""
    np.testing.assert_array_equal(np.ma.filled(got, fill), np.ma.filled(expected, fill))
