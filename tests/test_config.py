"""daskcfa's dask configuration: registered defaults, the schema, and checks when an operation starts."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
from dask.utils import parse_bytes

import daskcfa
from daskcfa import config

PACKAGE = Path(daskcfa.__file__).parent


@pytest.fixture
def archive(tmp_path):
    path = str(tmp_path / "a.nc")
    daskcfa.to_cfa(da.from_array(np.arange(24.0).reshape(4, 6), chunks=(2, 3)), path, dims=("y", "x"),
                   variable="v")
    return path


def _config_reads():
    """(module, key, default expression) of every ``dask.config.get("daskcfa...", default)`` in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = ast.unparse(node.func)
            key = node.args[0]
            if name.endswith(("config.get", "config_bytes")) and isinstance(key, ast.Constant) \
                    and str(key.value).startswith("daskcfa."):
                yield module, key.value, node.args[1] if len(node.args) > 1 else None


def test_defaults_registered_in_a_fresh_process():
    code = "import daskcfa, dask; print(dask.config.get('daskcfa.io.engine'), dask.config.get('daskcfa.write'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.split(" ", 1)[0] == "auto" and "'lease-seconds': 600" in out


def test_user_settings_win_over_the_defaults():
    env = {**os.environ, "DASK_DASKCFA__IO__ENGINE": "netcdf4"}
    code = "import daskcfa, dask; print(dask.config.get('daskcfa.io.engine'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "netcdf4"


def test_every_key_the_code_reads_is_in_the_schema_and_defaults():
    reads = list(_config_reads())
    assert len(reads) >= 20  # (the scan finds them)
    known = set(config.keys())
    for module, key, _ in reads:
        assert key in known, f"{module} reads {key}, which daskcfa-schema.yaml does not describe"
        assert dask.config.get(key, "<missing>") != "<missing>", f"{key} has no default in daskcfa.yaml"


def test_yaml_defaults_equal_the_code_defaults():
    """A default written in the code (``dask.config.get(key, DEFAULT)``) is the one daskcfa.yaml registers."""
    compared = 0
    for module, key, default in _config_reads():
        if default is None:
            continue
        expected = eval(compile(ast.Expression(default), module, "eval"), vars(importlib.import_module(module)))
        value = config.DEFAULTS
        for part in key.split("."):
            value = value[part]
        if isinstance(value, str) and isinstance(expected, int):
            value = parse_bytes(value)
        if isinstance(expected, str) and isinstance(value, int):
            expected = parse_bytes(expected)
        assert value == expected, f"{key}: daskcfa.yaml has {value!r}, {module} {expected!r}"
        compared += 1
    assert compared >= 15


def test_defaults_pass_the_schema():
    config._checked = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.check()


def test_bad_engine_is_an_error_at_open_not_at_compute(archive):
    with dask.config.set({"daskcfa.io.engine": "fast"}):
        with pytest.raises(daskcfa.ConfigError, match=r"daskcfa\.io\.engine.*'auto', 'netcdf4', 'direct'.*'fast'"):
            daskcfa.from_cfa(archive, "v")
        with pytest.raises(daskcfa.ConfigError):
            daskcfa.open_cfa(archive)
        with pytest.raises(daskcfa.ConfigError):
            daskcfa.to_cfa(da.zeros(4, chunks=2), archive + ".2.nc", dims=("y",), variable="z")
    assert float(daskcfa.from_cfa(archive, "v").sum().compute()) == 276.0  # (valid again afterwards)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("daskcfa.storage.part-size", "16 parsecs", "a size such as"),
    ("daskcfa.budget.filehandles", "many", "an integer or null"),
    ("daskcfa.storage.retries", -1, "at least 0"),
    ("daskcfa.refragment.strategy", "fastest", "'auto', 'direct', 'staged'"),
    ("daskcfa.budget.memory", "lots", "S3netCDF4's '2 YB'"),
])
def test_bad_values(archive, key, value, message):
    with dask.config.set({key: value}), pytest.raises(daskcfa.ConfigError, match=message):
        daskcfa.open_cfa(archive)


def test_unknown_key_warns_with_the_nearest_valid_one(archive):
    with dask.config.set({"daskcfa.io.enigne": "netcdf4"}), pytest.warns(daskcfa.CFAWarning) as record:
        ds = daskcfa.open_cfa(archive)
    assert ds["v"].shape == (4, 6)
    (warning,) = [w for w in record if "enigne" in str(w.message)]
    assert "did you mean 'daskcfa.io.engine'" in str(warning.message)
    assert warning.filename == __file__  # (points at the user's call)
    with dask.config.set({"daskcfa.io.zzz": 1}), \
            pytest.warns(daskcfa.CFAWarning, match="valid keys: daskcfa.io.engine"):
        daskcfa.open_cfa(archive)


def test_open_ended_sections_and_s3netcdf4_sizes_are_accepted(archive):
    with dask.config.set({"daskcfa.budget.memory": "2 YB", "daskcfa.storage.options": {"s3": {"anon": True}},
                          "daskcfa.storage.profiles": {"cold": {"match": "s3://cold/", "anon": True}}}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            daskcfa.open_cfa(archive)
