"""What a new user meets in the first hour (issue 18): names checked, errors in the user's terms, the CLI in pipes
and logs. Everything on real files, through the real entry point (``daskcfa`` as a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dask.array as da
import netCDF4
import numpy as np
import pytest

import daskcfa

DASKCFA = str(Path(sys.executable).with_name("daskcfa"))
ROOT = Path(__file__).resolve().parents[1]
DIMS = ("time", "lat", "lon")


def run(*args, **kw) -> subprocess.CompletedProcess:
    # (this checkout's daskcfa, whichever one the venv's entry point was installed from)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([DASKCFA, *map(str, args)], capture_output=True, text=True, timeout=300, env=env, **kw)


def write(path: Path, shape=(8, 4, 6), fragment_shape=(2, 4, 6), **kw) -> str:
    x = da.from_array(np.arange(np.prod(shape), dtype="f4").reshape(shape), chunks=fragment_shape)
    return daskcfa.to_cfa(x, str(path), variable="tas", dims=DIMS, fragment_shape=fragment_shape, **kw)


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


# ---------------------------------------------------------------------------
# 3. Names of dimensions and variables are checked against the data
# ---------------------------------------------------------------------------


def test_misspelt_dimension_in_to_cfa_is_refused_before_writing(tmp_path):
    x = da.zeros((8, 4, 6), chunks=(2, 4, 6))
    with pytest.raises(daskcfa.ArgumentError, match=r"fragment_shape names unknown dimension 'tim' "
                                                    r"\(did you mean 'time'\?\); dimensions: time, lat, lon"):
        daskcfa.to_cfa(x, str(tmp_path / "t.nc"), variable="tas", dims=DIMS, fragment_shape={"tim": 4})
    assert listing(tmp_path) == []


def test_misspelt_dimension_in_refragment_and_its_plan(tmp_path):
    source = write(tmp_path / "s.nc")
    for call in (lambda: daskcfa.plan_refragment(source, fragment_shape={"time": 8, "lattitude": 2}),
                 lambda: daskcfa.refragment(source, str(tmp_path / "r.nc"), fragment_shape={"lattitude": 2})):
        with pytest.raises(daskcfa.ArgumentError, match="'lattitude' \\(did you mean 'latitude'\\?\\)|'lattitude'"):
            call()
    assert not (tmp_path / "r.nc").exists() and not (tmp_path / "r").exists()


def test_misspelt_dimension_in_the_cli(tmp_path):
    source = write(tmp_path / "s.nc")
    proc = run("split", source, tmp_path / "r.nc", "--fragment-shape", "tim=4")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"daskcfa split: error: --fragment-shape names unknown dimension 'tim' "
                                   f"(did you mean 'time'?); dimensions: time, lat, lon (file '{source}')")
    assert not (tmp_path / "r.nc").exists()


def test_bad_variable_and_group_names_are_daskcfa_errors(tmp_path):
    ds = daskcfa.open_cfa(write(tmp_path / "s.nc"))
    with pytest.raises(daskcfa.VariableNotFoundError, match=r"'tsa' \(did you mean 'tas'\?\)"):
        ds["tsa"]
    with pytest.raises(daskcfa.VariableNotFoundError, match="group '/' has no group 'nogroup'") as info:
        ds["/nogroup/tas"]
    assert isinstance(info.value, KeyError) and "nogroup" not in ds  # (still a KeyError, as dict users expect)
    xr = pytest.importorskip("xarray")
    with pytest.raises(daskcfa.VariableNotFoundError, match="'/nogroup' does not exist"):
        xr.open_dataset(ds.url, engine="daskcfa", group="/nogroup")


# ---------------------------------------------------------------------------
# 10. One name for re-fragmenting, messages in the interface's terms
# ---------------------------------------------------------------------------


def test_split_and_refragment_are_one_operation(tmp_path):
    source = write(tmp_path / "s.nc")
    assert daskcfa.split is daskcfa.refragment
    proc = run("refragment", source, tmp_path / "r.nc", "--fragment-shape", "time=4")
    assert proc.returncode == 0, proc.stderr
    assert daskcfa.from_cfa(str(tmp_path / "r.nc")).chunks[0] == (4, 4)
    assert "split (refragment)" in run("--help").stdout


def test_exists_errors_name_the_option_of_their_interface(tmp_path):
    source = write(tmp_path / "s.nc")
    with pytest.raises(FileExistsError, match="mode='w'"):
        write(tmp_path / "s.nc")
    proc = run("split", source, source)
    assert proc.returncode == 1 and "use --overwrite" in proc.stderr and "mode=" not in proc.stderr
    other = write(tmp_path / "other.nc")
    proc = run("relocate", source, "--map", f"{tmp_path}/=/elsewhere/", "--target", other)
    assert proc.returncode == 1 and "use --overwrite" in proc.stderr and "mode=" not in proc.stderr


# ---------------------------------------------------------------------------
# 11. info --plot, pipes, progress in log files
# ---------------------------------------------------------------------------


def test_info_plot_defaults_to_the_two_most_fragmented_dimensions(tmp_path):
    pytest.importorskip("matplotlib")
    from daskcfa.archive.info import _plot_axes

    url = write(tmp_path / "s.nc", fragment_shape=(8, 2, 1))  # grid 1 x 2 x 6
    av = daskcfa.read_aggregation(url, "tas")
    assert _plot_axes(av, None) == (1, 2)
    proc = run("info", url, "--plot", tmp_path / "p.png")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    av = daskcfa.read_aggregation(write(tmp_path / "t.nc", fragment_shape=(2, 4, 3)), "tas")  # grid 4 x 1 x 2
    assert _plot_axes(av, None) == (0, 2)


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """``daskcfa info ... | head -0``: the reader is gone before daskcfa writes."""
    url = write(tmp_path / "s.nc")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    read, write_end = os.pipe()
    os.close(read)  # (the reader has gone: every write fails with EPIPE)
    try:
        proc = subprocess.run([DASKCFA, "info", url, "--json"], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=300, env=env)
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141


def test_progress_in_a_log_file_is_lines_not_carriage_returns(tmp_path):
    source = write(tmp_path / "s.nc", shape=(40, 4, 6), fragment_shape=(1, 4, 6))
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.run([DASKCFA, "split", source, str(tmp_path / "r.nc"), "--fragment-shape", "time=2",
                               "--progress", "--scheduler", "synchronous"], stdout=subprocess.PIPE, stderr=log,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0
    text = (tmp_path / "log").read_text()
    assert "\r" not in text
    lines = text.splitlines()
    percents = [int(line.split()[1].rstrip("%")) for line in lines]
    assert all(line.startswith("daskcfa: ") and " tasks done (" in line for line in lines), lines
    assert percents == sorted(set(percents)) and percents[-1] == 100 and 5 <= len(percents) <= 20
    assert all(p % 5 == 0 for p in percents)


# ---------------------------------------------------------------------------
# 14. netCDF4 conventions on Dataset
# ---------------------------------------------------------------------------


def test_global_and_variable_attributes_as_python_attributes(tmp_path):
    url = write(tmp_path / "s.nc")
    with netCDF4.Dataset(url, "a") as nc:
        nc.author = "A. Person"
        nc["tas"].long_name = "air temperature"
    ds = daskcfa.open_cfa(url)
    assert ds.author == "A. Person" and ds.getncattr("author") == "A. Person"
    assert ds["tas"].long_name == "air temperature"
    with pytest.raises(AttributeError, match=r"'autor' \(did you mean 'author'\?\)"):
        ds.autor
    assert ds["tas"].name == "tas"  # (the object's own names come first)
    import pickle

    assert pickle.loads(pickle.dumps(ds["tas"].attrs)) == ds["tas"].attrs


# ---------------------------------------------------------------------------
# 5. refragment keeps the source's compression; the plan says what it writes
# ---------------------------------------------------------------------------


def _fragment_filters(url: str) -> list[dict]:
    ds = daskcfa.open_cfa(url)
    uris = ds["tas"].aggregation.fragments.locations()
    out = []
    for uri in uris:
        with netCDF4.Dataset(daskcfa.storage.to_local_path(daskcfa.storage.resolve(uri, url))) as nc:
            out.append(nc["tas"].filters())
    return out


def smooth(shape=(8, 128, 128)) -> da.Array:
    """Data zlib shrinks well, in fragments large enough (64 KiB) for the file's own overhead not to matter."""
    t, y, x = np.meshgrid(*(np.arange(n, dtype="f4") for n in shape), indexing="ij")
    return da.from_array(np.round(280 + 10 * np.sin(y / 7) + np.cos(x / 5) + 0.1 * t, 1), chunks=(1, 128, 128))


def test_refragment_keeps_compression_by_default(tmp_path):
    x = smooth()
    source = daskcfa.to_cfa(x, str(tmp_path / "s.nc"), variable="tas", dims=DIMS, fragment_shape=(1, 128, 128),
                            compression={"zlib": True, "complevel": 3, "shuffle": False})
    target = daskcfa.refragment(source, str(tmp_path / "r.nc"), fragment_shape={"time": 4, "lat": 64})
    filters = _fragment_filters(target)
    assert len(filters) == 4
    assert all(f["zlib"] and f["complevel"] == 3 and not f["shuffle"] for f in filters)
    np.testing.assert_array_equal(daskcfa.from_cfa(target).compute(), x.compute())
    plain = daskcfa.refragment(source, str(tmp_path / "p.nc"), fragment_shape={"time": 4}, compression="none")
    assert not any(f["zlib"] for f in _fragment_filters(plain))
    zstd_or_zlib = daskcfa.refragment(source, str(tmp_path / "z.nc"), fragment_shape={"time": 4},
                                      compression={"zlib": True, "complevel": 1})
    assert all(f["zlib"] and f["complevel"] == 1 and f["shuffle"] for f in _fragment_filters(zstd_or_zlib))


def test_plan_shows_compression_and_estimated_size(tmp_path):
    x = smooth()
    source = daskcfa.to_cfa(x, str(tmp_path / "s.nc"), variable="tas", dims=DIMS, fragment_shape=(1, 128, 128),
                            compression="zlib")
    plan = daskcfa.plan_refragment(source, fragment_shape={"time": 4})
    (output,) = plan.outputs.values()
    assert output.origin == "source" and output.compression["compression"] == "zlib"
    assert output.raw_bytes == x.nbytes and output.fragments == 2
    assert output.nbytes < x.nbytes  # (smooth data: zlib shrinks it)
    text = str(plan)
    assert "(as the source)" in text and "estimated output size: " in text and "in memory)" in text
    target = daskcfa.refragment(source, str(tmp_path / "r.nc"), fragment_shape={"time": 4})
    written = sum(p.stat().st_size for p in (tmp_path / "r").rglob("*.nc"))
    assert 0.5 * written < plan.output_bytes < 2 * written
    assert target
    none = daskcfa.plan_refragment(source, fragment_shape={"time": 4}, compression="none")
    assert none.output_bytes == x.nbytes and "uncompressed" in str(none)
    proc = run("split", source, tmp_path / "c.nc", "--fragment-shape", "time=4", "--plan-only")
    assert proc.returncode == 0 and "estimated output size: " in proc.stdout and "as the source" in proc.stdout


# ---------------------------------------------------------------------------
# 12, 13. Names without suffix; examples' --help; storage option spellings
# ---------------------------------------------------------------------------


def test_aggregation_file_without_suffix_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = da.zeros((4, 6), chunks=(2, 6))
    with pytest.raises(daskcfa.ArgumentError, match="give it a suffix, such as 'myarchive.nc'"):
        daskcfa.to_cfa(x, "myarchive", variable="v", dims=("y", "x"))
    source = write(tmp_path / "s.nc")
    with pytest.raises(daskcfa.ArgumentError, match="'tiles/'"):
        daskcfa.refragment(source, str(tmp_path / "tiles"), fragment_shape={"time": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s", "s.nc"]  # (nothing of "myarchive", "tiles")
    daskcfa.to_cfa(x, "myarchive.nc", variable="v", dims=("y", "x"))  # (as the message says)
    np.testing.assert_array_equal(daskcfa.from_cfa("myarchive.nc").compute(), np.zeros((4, 6)))


def test_sample_example_help_writes_nothing(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "sample.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "usage:" in proc.stdout and "URL" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_other_libraries_spellings_of_s3_options_are_named(tmp_path):
    """``anonymous=True`` (s3fs says ``anon``) is refused before any request (no server needed), naming s3fs's."""
    with pytest.raises(daskcfa.ArgumentError, match="'anonymous' -> anon"):
        daskcfa.from_cfa("s3://bucket/x.nc", storage_options={"anonymous": True})
    with pytest.raises(daskcfa.ArgumentError, match="'aws_secret_access_key' -> secret") as info:
        daskcfa.to_cfa(da.zeros(4, chunks=2), "s3://bucket/x.nc", variable="v", dims=("x",),
                       storage_options={"s3": {"key": "k", "aws_secret_access_key": "very-secret"}})
    assert "very-secret" not in str(info.value)
    proc = run("info", "s3://bucket/x.nc", "--storage-options", '{"anonymous": true}')
    assert proc.returncode == 1 and "--storage-options for s3:// use s3fs's names: 'anonymous' -> anon" in proc.stderr


@pytest.mark.parametrize("options, named", [
    ({"anno": True}, r"unknown option 'anno' \(did you mean 'anon'\?\)"),
    ({"s3": {"endpoint": "http://127.0.0.1:1"}}, r"unknown option 'endpoint' \(did you mean 'endpoint_url'\?\)"),
    ({"client_kwargs": "us-east-1"}, "client_kwargs is a mapping, not a str"),
    ({"client_kwargs": {"region": "us-east-1"}}, r"client_kwargs names unknown option 'region'"),
    ({"config_kwargs": {"read_timeut": 5}}, r"config_kwargs names unknown option 'read_timeut' \(did you mean "
                                            r"'read_timeout'\?\)"),
    ({"s3_additional_kwargs": ["ServerSideEncryption"]}, "s3_additional_kwargs is a mapping, not a list"),
])
def test_s3_options_s3fs_or_botocore_do_not_take_are_named_before_any_request(options, named):
    """A misspelt s3fs, botocore ``Config`` or client option, or a nested option that is no mapping: an
    ArgumentError naming it (and the nearest valid name), for a read and a write, no server needed.
    (Before: a bare ``TypeError`` from aiobotocore at the first request.)"""
    for act in (lambda: daskcfa.from_cfa("s3://bucket/x.nc", storage_options=options),
                lambda: daskcfa.to_cfa(da.zeros(4, chunks=2), "s3://bucket/x.nc", variable="v", dims=("x",),
                                       storage_options=options)):
        with pytest.raises(daskcfa.ArgumentError, match=named):
            act()


def test_s3_options_s3fs_and_botocore_take_are_accepted(s3_server, s3_bucket):
    """Options of each kind the check reads from the libraries' signatures (s3fs's own, fsspec's listing
    cache, botocore's Config and client, request parameters) reach the server and read."""
    url = f"s3://{s3_bucket}/ok.nc"
    daskcfa.to_cfa(da.arange(4, chunks=2), url, variable="v", dims=("x",), storage_options=s3_server.storage_options)
    base = s3_server.storage_options
    options = {**base, "default_block_size": 1 << 20, "listings_expiry_time": 5,
               "config_kwargs": {"read_timeout": 30, "connect_timeout": 5, "max_pool_connections": 4},
               "client_kwargs": {**base.get("client_kwargs", {}), "region_name": "us-east-1"},
               "s3_additional_kwargs": {"RequestPayer": "requester"}}
    assert daskcfa.from_cfa(url, storage_options=options).compute().tolist() == [0, 1, 2, 3]


# ---------------------------------------------------------------------------
# Issue 28 item 4: silent traps
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["CFA-0.4", "CFA-0.5", "CFA-0.6.2", "CF-1.13"])
def test_converting_an_aggregation_to_another_dialect_keeps_its_fragments(tmp_path, fmt):
    """``to_cfa(open_cfa(src), out, format=...)`` once merged 10 fragments into 1 (its default 50 MB plan)."""
    src = write(tmp_path / "src.nc", shape=(10, 4, 6), fragment_shape=(1, 2, 6))
    out = daskcfa.to_cfa(daskcfa.open_cfa(src), str(tmp_path / "out.nc"), format=fmt)
    converted, original = daskcfa.from_cfa(out), daskcfa.from_cfa(src)
    assert converted.chunks == original.chunks == ((1,) * 10, (2, 2), (6,))
    np.testing.assert_array_equal(converted.compute(), original.compute())
    assert len(list((tmp_path / "out").rglob("*.nc"))) == 20  # (chunks are fragments)
    # a plan asked for is a plan
    merged = daskcfa.to_cfa(daskcfa.open_cfa(src), str(tmp_path / "merged.nc"), format=fmt, max_fragment_size="50MB")
    assert daskcfa.from_cfa(merged).chunks == ((10,), (4,), (6,))
    shaped = daskcfa.to_cfa(daskcfa.open_cfa(src), str(tmp_path / "shaped.nc"), format=fmt, fragment_shape=(5, 4, 6))
    assert daskcfa.from_cfa(shaped).chunks == ((5, 5), (4,), (6,))


@pytest.mark.parametrize("fmt", ["CFA-0.4", "CFA-0.5", "CFA-0.6.2", "CF-1.13"])
def test_aggregation_files_say_how_to_open_them(tmp_path, fmt):
    """``xr.open_dataset(agg)`` without ``engine="daskcfa"`` shows the instructions: the file says how to open it,
    where ncdump and xarray's netCDF engines show it; daskcfa's readers leave it out of the data's attributes."""
    import xarray as xr

    url = write(tmp_path / "t.nc", format=fmt)
    with netCDF4.Dataset(url) as nc:
        hint = nc.getncattr("daskcfa_how_to_open")
    assert "daskcfa.from_cfa(url)" in hint and "engine='daskcfa'" in hint
    with xr.open_dataset(url, engine="netcdf4") as plain:
        assert plain.attrs["daskcfa_how_to_open"] == hint
    with daskcfa.open_cfa(url) as ds:
        assert "daskcfa_how_to_open" not in ds.attrs
    with xr.open_dataset(url, engine="daskcfa") as ds:
        assert "daskcfa_how_to_open" not in ds.attrs
        np.testing.assert_array_equal(ds["tas"].values, daskcfa.from_cfa(url).compute())
        ds.to_netcdf(tmp_path / "copy.nc")  # a plain copy of the data: no hint carried into it
    with netCDF4.Dataset(tmp_path / "copy.nc") as nc:
        assert "daskcfa_how_to_open" not in nc.ncattrs()
    again = daskcfa.to_cfa(daskcfa.open_cfa(url), str(tmp_path / "again.nc"), format=fmt)
    with netCDF4.Dataset(again) as nc:
        assert nc.getncattr("daskcfa_how_to_open") == hint


def test_plain_files_written_by_daskcfa_have_no_hint(tmp_path):
    with daskcfa.Dataset(str(tmp_path / "plain.nc"), "w", format="NETCDF4") as ds:
        ds.createDimension("x", 2)
        ds.createVariable("v", "f4", ("x",))[:] = [1, 2]
    with netCDF4.Dataset(tmp_path / "plain.nc") as nc:
        assert "daskcfa_how_to_open" not in nc.ncattrs()


def test_cfdm_reads_an_aggregation_with_the_hint(tmp_path):
    cfdm = pytest.importorskip("cfdm")
    url = daskcfa.to_cfa(np.arange(24.0).reshape(4, 6), str(tmp_path / "t.nc"), variable="tas", dims=("y", "x"),
                         attrs={"units": "K"}, fragment_shape=(2, 6), uris="absolute")
    fields = cfdm.read(url)
    assert len(fields) == 1
    np.testing.assert_array_equal(fields[0].array, np.arange(24.0).reshape(4, 6))
