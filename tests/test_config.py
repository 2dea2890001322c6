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
            if name.endswith(("config.get", "config_bytes", "config.number")) and isinstance(key, ast.Constant) \
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
    # a profile's prefixes: anything else was a bare TypeError from the first S3 read
    ("daskcfa.storage.profiles", {"p": {"match": 5}}, r"profiles\.p\.match' must be a string or a list, not a value of type int"),
    ("daskcfa.storage.profiles", {"p": {"match": ["s3://a/", None]}}, r"profiles\.p\.match\[1\]' must be a string"),
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


@pytest.mark.parametrize(("key", "value", "message"), [
    ("daskcfa.write.buffer-memory", "x", "a size such as"),  # (was a bare ValueError from the writer)
    ("daskcfa.write.buffer-memory", -1, "at least 1 and at most 1PiB, not -1"),
    ("daskcfa.write.lease-seconds", float("nan"), "at least 1 and at most 86400, not nan"),  # (never expired)
    ("daskcfa.write.lease-seconds", float("inf"), "finite"),
    ("daskcfa.write.lease-wait", 1e12, "at most 86400"),
    ("daskcfa.storage.retries", 10**19, "at most 1000, not 10000000000000000000"),
    ("daskcfa.storage.retry-deadline", float("-inf"), "at least 0"),
    ("daskcfa.storage.part-size", "6GiB", "at most 5GiB"),
    ("daskcfa.io.whole-fragment-fraction", float("nan"), "finite"),
    ("daskcfa.budget.wait-timeout", float("nan"), "finite"),
    ("daskcfa.budget.memory", "1001 YB", "at most 1000 YB"),
    ("daskcfa.limits.max-group-depth", 10**6, "at most 1000"),
    ("daskcfa.write.buffer-memory", "1e400", "a size such as"),  # (a float overflowing: bare OverflowError)
    ("daskcfa.budget.memory", "9" * 400, "a size such as"),  # (the same, through the S3netCDF4 units' key)
])
def test_absurd_values_are_refused_naming_key_and_range(tmp_path, key, value, message):
    """Issue #27, attack 6: NaN, infinities and absurd numbers are a ConfigError naming the key and its
    range, for to_cfa and for the netcdf4.Dataset writer (which did not check the configuration)."""
    with dask.config.set({key: value}):
        with pytest.raises(daskcfa.ConfigError, match=key.replace(".", r"\.") + ".*" + message):
            daskcfa.to_cfa(da.zeros(4, chunks=2), str(tmp_path / "t.nc"), dims=("y",), variable="z")
        with pytest.raises(daskcfa.ConfigError, match=message):
            daskcfa.Dataset(str(tmp_path / "n.nc"), "w", format="CF-1.13")
    assert not any(tmp_path.iterdir())  # nothing written, no lease left


def test_every_number_in_the_schema_is_bounded():
    """Every key that takes a number has a minimum and a maximum (issue #27: no key unbounded)."""
    def leaves(schema, key):
        if "properties" in schema:
            for name, sub in schema["properties"].items():
                yield from leaves(sub, f"{key}.{name}")
        else:
            yield key, schema

    checked = 0
    for key, schema in leaves(config.SCHEMA, "daskcfa"):
        types = schema.get("type", [])
        if {"integer", "number"} & set([types] if isinstance(types, str) else types):
            assert "minimum" in schema and "maximum" in schema, key
            checked += 1
    assert checked == 21


def test_the_writer_checks_its_buffer_size_argument(tmp_path):
    with pytest.raises(daskcfa.ArgumentError, match="buffer_size: the value must be a size such as"):
        daskcfa.Dataset(str(tmp_path / "n.nc"), "w", format="CF-1.13", buffer_size="lots")
    with pytest.raises(daskcfa.ArgumentError, match="buffer_size: the value must be a finite number, at least 1"):
        daskcfa.Dataset(str(tmp_path / "n.nc"), "w", format="CF-1.13", buffer_size=0)
    with pytest.raises(daskcfa.ArgumentError, match="buffer_size: the value must be a size such as"):
        daskcfa.Dataset(str(tmp_path / "n.nc"), "w", format="CF-1.13", buffer_size="1e400")  # (was OverflowError)
    assert not any(tmp_path.iterdir())


# S3netCDF4's sizes (its configuration file; format: size keys): one reader, config.parse_size
@pytest.mark.parametrize("text, expected", [
    ("50MB", 50 * 10**6), ("1GB", 10**9), ("10 kB", 10**4), ("1.5GB", 1_500_000_000), ("2TB", 2 * 10**12),
    ("3PB", 3 * 10**15), ("1EB", 10**18), ("1ZB", 10**21), ("1YB", 10**24), ("512", 512), (4096, 4096), ("7B", 7),
])
def test_sizes_in_decimal_units_up_to_yottabytes(text, expected):
    assert config.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "1XB", "1.2.3GB", "-1MB", True, None, 1.5, "{{ memory }}", "1e3MB"])
def test_sizes_that_are_not(text):
    with pytest.raises(daskcfa.errors.ConfigError):
        config.parse_size(text)


def test_the_fast_yaml_loader_reads_the_files_as_pyyamls_own():
    """The defaults and schema read by libyaml's loader (where PyYAML has it) are what PyYAML's pure-Python
    safe loader reads."""
    import yaml

    from daskcfa import config

    for name, loaded in (("daskcfa.yaml", config.DEFAULTS), ("daskcfa-schema.yaml", {"properties": {
            "daskcfa": config.SCHEMA}})):
        with open(Path(config.__file__).parent / name) as fh:
            reference = yaml.safe_load(fh)
        if name == "daskcfa-schema.yaml":
            reference = {"properties": {"daskcfa": reference["properties"]["daskcfa"]}}
        assert loaded == reference
