"""The ``daskcfa`` command line, run as a user runs it: a subprocess of the installed entry point.

Every subcommand is exercised on real files (and the real S3 server, and a
real distributed cluster for ``--scheduler``); results are read back
against numpy ground truth; failures must be one line on stderr with a
non-zero exit status (a traceback only with ``--debug``) and never show
credentials.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, generation_dir, make_truth

DASKCFA = str(Path(sys.executable).with_name("daskcfa"))
COMMANDS = ("info", "split", "aggregate", "rebuild", "verify", "relocate", "references", "icechunk", "index")
DIMS = ("time", "lat", "lon")
SHAPE = (8, 4, 6)
COORDS = {"time": (np.arange(8.0), {"units": "days since 2000-01-01", "axis": "T", "standard_name": "time"}),
          "lat": (np.linspace(-45, 45, 4), {"units": "degrees_north"}),
          "lon": (np.arange(0.0, 360.0, 60.0), {"units": "degrees_east"})}


#: The command's environment: it imports the daskcfa under test (in a worktree, not the installed checkout's).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(daskcfa.__file__).parents[1]),
                                                            os.environ.get("PYTHONPATH")) if p)}


def run(*args, cwd=None, input=None) -> subprocess.CompletedProcess:
    return subprocess.run([DASKCFA, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300,
                          input=input, env=ENV)


def truth():
    return make_truth(SHAPE, "f4", seed=4, masked=0.1)


def write(url, storage_options=None, **kw):
    return daskcfa.to_cfa(truth(), str(url), variable="tas", dims=DIMS, attrs={"units": "K"}, coords=COORDS,
                          fragment_shape=(2, 4, 6), compression="zlib", storage_options=storage_options, **kw)


def assert_one_line_error(proc: subprocess.CompletedProcess, command: str, *parts: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"daskcfa {command}: error: "), lines[0]
    assert "Traceback" not in proc.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


# ---------------------------------------------------------------------------
# Help, version, usage errors
# ---------------------------------------------------------------------------
def test_help_everywhere():
    top = run("--help")
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout
    helps = {}
    for command in COMMANDS:
        proc = run(command, "--help")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: daskcfa {command}")
        for option in ("--scheduler", "--storage-options", "--progress", "--debug"):
            assert option in proc.stdout
        helps[command] = proc.stdout
    assert "--plan-only" in helps["split"] and "--map OLD=NEW" in helps["relocate"]


def test_usage_errors_exit_2():
    assert run().returncode == 2
    proc = run("relocate", "x.nc")  # --map is required (unless --uris absolute)
    assert proc.returncode == 2 and "--map" in proc.stderr
    proc = run("relocate", "x.nc", "--map", "no-equals-sign")
    assert proc.returncode == 2 and "expected OLD=NEW" in proc.stderr
    proc = run("split", "a.nc", "b.nc", "--fragment-shape", "time=x")
    assert proc.returncode == 2 and "--fragment-shape" in proc.stderr
    assert run("frobnicate").returncode == 2


def test_python_m_and_version():
    proc = subprocess.run([sys.executable, "-m", "daskcfa", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"daskcfa {daskcfa.__version__}"
    proc = subprocess.run([sys.executable, "-m", "daskcfa", "verify", "/nonexistent/x.nc"], capture_output=True,
                          text=True, timeout=120)
    assert_one_line_error(proc, "verify", "file not found", "/nonexistent/x.nc")


@pytest.mark.parametrize("command", ["info", "verify", "relocate", "split", "rebuild"])
def test_missing_input_is_one_line_and_debug_shows_the_traceback(tmp_path, command):
    missing = tmp_path / "missing.nc"
    extra = {"relocate": ["--map", "/a=/b"], "split": [tmp_path / "out.nc"], "rebuild": [tmp_path / "out.nc"]}
    args = [command, missing, *extra.get(command, [])]
    proc = run(*args)
    assert_one_line_error(proc, command, str(missing))
    if command == "verify":
        debug = run(*args, "--debug")
        assert debug.returncode == 1
        assert "Traceback (most recent call last)" in debug.stderr
        assert debug.stderr.splitlines()[-1] == proc.stderr.strip()


# ---------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------
def test_info(tmp_path):
    url = write(tmp_path / "t.nc")
    proc = run("info", url)
    assert proc.returncode == 0, proc.stderr
    for part in ("dialect: CF-1.13", "/tas (time=8, lat=4, lon=6) float32",
                 "4 fragment(s) in a 4 x 1 x 1 grid", f"file://{tmp_path}/t"):
        assert part in proc.stdout
    summary = json.loads(run("info", url, "--json", "--storage-size").stdout)
    assert summary["stored_bytes"] == sum(p.stat().st_size for p in (tmp_path / "t").glob("g-*/*.nc"))
    (tas,) = [v for v in summary["variables"] if v["dialect"]]
    assert tas["grid"] == [4, 1, 1] and tas["dtype"] == "float32"


def test_info_plot(tmp_path):
    pytest.importorskip("matplotlib")
    url = write(tmp_path / "t.nc")
    proc = run("info", url, "--plot", tmp_path / "layout.png", "--dims", "time,lon")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "layout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fragment layout drawn in" in proc.stderr


# ---------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------
def damage(directory: Path) -> tuple[Path, Path]:
    """Corrupt a compressed chunk of one fragment and truncate another."""
    corrupt, truncated = directory / "t.tas.1.0.0.nc", directory / "t.tas.3.0.0.nc"
    with h5py.File(corrupt, "r") as h5:
        info = h5["tas"].id.get_chunk_info(0)
    with open(corrupt, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(range(100, 132)))
    os.truncate(truncated, truncated.stat().st_size // 2)
    return corrupt, truncated


def test_verify(tmp_path):
    url = write(tmp_path / "t.nc")
    healthy = run("verify", url, "--deep")
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.strip() == f"{url}: 4 fragment(s) of 1 variable(s) checked (deep): OK"
    corrupt, truncated = damage(generation_dir(tmp_path / "t"))
    quick = run("verify", url)
    assert quick.returncode == 1 and quick.stderr == ""
    assert "1 problem(s)" in quick.stdout and str(truncated) in quick.stdout and str(corrupt) not in quick.stdout
    deep = run("verify", url, "--deep")
    assert deep.returncode == 1
    lines = deep.stdout.splitlines()
    assert lines[0].endswith("4 fragment(s) of 1 variable(s) checked (deep): 2 problem(s)")
    assert lines[1].startswith(f"  /tas [1,0,0] corrupt: {corrupt}: ")
    assert lines[2].startswith(f"  /tas [3,0,0] unreadable: {truncated}: ")
    report = json.loads(run("verify", url, "--deep", "--json").stdout)
    assert report["ok"] is False and report["checked"] == 4
    assert [(p["index"], p["kind"]) for p in report["problems"]] == [([1, 0, 0], "corrupt"),
                                                                     ([3, 0, 0], "unreadable")]
    proc = run("verify", url, "--variables", "pr")
    assert_one_line_error(proc, "verify", "'pr' is not an aggregated variable")


def test_references(tmp_path):
    xr = pytest.importorskip("xarray")
    url = write(tmp_path / "t.nc")
    printed = run("references", url)
    assert printed.returncode == 0, printed.stderr
    refs = json.loads(printed.stdout)
    assert refs["version"] == 1 and len(refs["templates"]) == 4
    out = tmp_path / "t.refs.json"
    written = run("references", url, "-o", out)
    assert written.returncode == 0 and written.stdout.strip() == str(out), written.stderr
    assert json.loads(out.read_text()) == refs
    with xr.open_dataset("reference://", engine="zarr", chunks=None,
                         backend_kwargs={"storage_options": {"fo": str(out)}, "consolidated": False}) as ds:
        assert_matches(ds["tas"].to_masked_array(), truth())
    assert_one_line_error(run("references", url, "-o", out), "references", "exists; use --overwrite")
    assert run("references", url, "-o", out, "--overwrite").returncode == 0
    with netCDF4.Dataset(generation_dir(tmp_path / "t") / "t.tas.2.0.0.nc", "a") as nc:
        nc["tas"].units = "degC"
    assert_one_line_error(run("references", url), "references", "fragment (2, 0, 0)", "units 'degC' are converted")


def test_progress_bar_locally_and_on_a_cluster(tmp_path):
    from distributed import Client, LocalCluster

    url = write(tmp_path / "t.nc")
    # (stderr is not a terminal here: progress as lines, daskcfa.progress; a terminal gets dask's bar)
    local = run("verify", url, "--deep", "--progress")
    assert local.returncode == 0 and local.stderr.splitlines()[-1].startswith("daskcfa: 100% of ")
    assert "\r" not in local.stderr and "tasks done" not in local.stdout
    assert "tasks done" not in run("verify", url, "--deep").stderr  # no progress unless asked
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None,
                      worker_dashboard_address=None, protocol="tcp://", host="127.0.0.1") as cluster, \
            Client(cluster):
        proc = run("verify", url, "--deep", "--scheduler", cluster.scheduler_address, "--progress")
        assert proc.returncode == 0, proc.stderr
        assert "daskcfa: 100% of " in proc.stderr and "\r" not in proc.stderr
        assert "verify-tas" in cluster.scheduler.task_prefixes  # the checks ran on the cluster
    proc = run("verify", url, "--scheduler", "synchronous")
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------
# relocate
# ---------------------------------------------------------------------------
def test_relocate(tmp_path):
    url = write(tmp_path / "a" / "t.nc", format="CFA-0.6.2")
    (tmp_path / "a" / "t").rename(tmp_path / "moved")
    assert run("verify", url).returncode == 1
    proc = run("relocate", url, "--map", f"{tmp_path}/a/t={tmp_path}/moved", "--map", "/nowhere=/x")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == url
    assert proc.stderr.strip() == f"daskcfa: warning: {url}: no fragment URI starts with /nowhere"
    assert run("verify", url, "--deep").returncode == 0
    assert daskcfa.read_aggregation(url).dialect == "CFA-0.6"
    assert_matches(daskcfa.from_cfa(url).compute(), truth(), rtol=0)
    target = tmp_path / "b" / "t.nc"
    proc = run("relocate", url, "--map", f"{tmp_path}/moved={tmp_path}/moved", "--target", target,
               "--format", "CF-1.13")
    assert proc.returncode == 0, proc.stderr
    assert daskcfa.read_aggregation(str(target)).dialect == "CF-1.13"
    proc = run("relocate", url, "--map", f"{tmp_path}/moved={tmp_path}/moved", "--target", target)
    assert_one_line_error(proc, "relocate", "exists")
    assert run("relocate", url, "--map", f"{tmp_path}/moved={tmp_path}/x", "--target", target,
               "--overwrite").returncode == 0


def test_uris_absolute_in_aggregate_and_relocate(tmp_path):
    # issue 13 item 14: archives older tools (cfdm, CFAPyX, S3netCDF4) read from any working directory
    url = write(tmp_path / "a" / "t.nc")
    generation = generation_dir(tmp_path / "a" / "t")
    assert daskcfa.read_aggregation(url).fragments[(0, 0, 0)].uris[0] == f"t/{generation.name}/t.tas.0.0.0.nc"
    proc = run("relocate", url, "--uris", "absolute")  # no --map: converted in place
    assert proc.returncode == 0, proc.stderr
    assert daskcfa.read_aggregation(url).fragments[(0, 0, 0)].uris[0] == f"file://{generation}/t.tas.0.0.0.nc"
    assert_matches(daskcfa.from_cfa(url).compute(), truth(), rtol=0)
    target = tmp_path / "b" / "agg.nc"
    proc = run("aggregate", *sorted(str(p) for p in generation.glob("*.nc")), str(target), "--uris", "absolute")
    assert proc.returncode == 0, proc.stderr
    assert all(u.startswith(f"file://{generation}/") for u in daskcfa.read_aggregation(str(target)).fragments.uris.ravel())
    assert run("split", url, str(tmp_path / "c.nc"), "--uris", "sideways").returncode == 2


# ---------------------------------------------------------------------------
# Remote storage: options from a file, never printed
# ---------------------------------------------------------------------------
def test_s3_with_storage_options(tmp_path, s3_server, s3_bucket):
    options = s3_server.storage_options
    url = write(f"s3://{s3_bucket}/cli/t.nc", storage_options=options)
    options_file = tmp_path / "options.json"
    options_file.write_text(json.dumps(options))
    secrets = (s3_server.secret, s3_server.key)

    proc = run("info", url, "--storage-options", f"@{options_file}", "--storage-size")
    assert proc.returncode == 0, proc.stderr
    assert f"s3://{s3_bucket}/cli/t" in proc.stdout
    proc = run("verify", url, "--deep", "--storage-options", json.dumps(options))
    assert proc.returncode == 0, proc.stderr
    outputs = [proc.stdout + proc.stderr]

    wrong = {**options, "secret": "Wr0ngSecretValue"}
    proc = run("verify", url, "--storage-options", json.dumps(wrong), "--debug")
    assert proc.returncode == 1
    outputs.append(proc.stdout + proc.stderr)
    assert "Wr0ngSecretValue" not in outputs[-1]
    proc = run("info", url, "--storage-options", '{"key": "abc", "secret": ')
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr and '"secret"' not in proc.stderr
    for text in outputs:
        for secret in secrets:
            assert secret not in text


# ---------------------------------------------------------------------------
# split, aggregate, rebuild (daskcfa.refragment, daskcfa.aggregate, daskcfa.rebuild)
# ---------------------------------------------------------------------------
def test_split(tmp_path):
    pytest.importorskip("daskcfa.archive.refragment")
    source = write(tmp_path / "src.nc")  # one fragment per two time steps
    plan = run("split", source, tmp_path / "tiles.nc", "--fragment-shape", "time=8,lat=2,lon=3", "--plan-only",
               "--max-mem", "64MiB")
    assert plan.returncode == 0, plan.stderr
    assert "read amplification" in plan.stdout and "/tas" in plan.stdout
    assert not (tmp_path / "tiles.nc").exists()
    proc = run("split", source, tmp_path / "tiles.nc", "--fragment-shape", "time=8,lat=2,lon=3", "--max-mem",
               "64MiB")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "tiles.nc")
    y = daskcfa.from_cfa(str(tmp_path / "tiles.nc"))
    assert y.chunks == ((8,), (2, 2), (3, 3))
    assert_matches(y.compute(), truth(), rtol=0)
    again = run("split", source, tmp_path / "tiles.nc", "--fragment-shape", "time=8,lat=2,lon=3")
    assert_one_line_error(again, "split", "exists")
    proc = run("split", source, tmp_path / "tiles.nc", "--fragment-shape", "8,4,6", "--overwrite",
               "--format", "CFA-0.6.2")
    assert proc.returncode == 0, proc.stderr
    assert daskcfa.from_cfa(str(tmp_path / "tiles.nc")).chunks == ((8,), (4,), (6,))


def write_time_slices(directory: Path, x: np.ndarray, per_file: int, units=lambda start: "K") -> list[Path]:
    directory.mkdir(parents=True)
    paths = []
    for start in range(0, x.shape[0], per_file):
        path = directory / f"slice_{start:03d}.nc"
        with netCDF4.Dataset(path, "w") as nc:
            nc.createDimension("time", None)
            nc.createDimension("lat", x.shape[1])
            nc.createDimension("lon", x.shape[2])
            t = nc.createVariable("time", "f8", ("time",))
            t.units, t.calendar, t.axis = "days since 2000-01-01", "standard", "T"
            t[:] = np.arange(start, start + per_file, dtype="f8")
            for name, values in (("lat", COORDS["lat"][0]), ("lon", COORDS["lon"][0])):
                nc.createVariable(name, "f8", (name,))[:] = values
            v = nc.createVariable("tas", "f4", DIMS)
            v.units = units(start)
            v[:] = x[start:start + per_file]
        paths.append(path)
    return paths


def test_aggregate(tmp_path):
    x = truth().filled(250.0)
    write_time_slices(tmp_path / "files", x, 2)
    proc = run("aggregate", f"{tmp_path}/files/slice_*.nc", tmp_path / "agg.nc")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "agg.nc")
    y = daskcfa.from_cfa(str(tmp_path / "agg.nc"), "tas")
    assert y.chunks[0] == (2, 2, 2, 2)
    np.testing.assert_array_equal(y.compute(), x)
    # an inconsistent file is refused, naming it
    write_time_slices(tmp_path / "bad", x, 2, units=lambda start: "m" if start == 4 else "K")
    proc = run("aggregate", f"{tmp_path}/bad/slice_*.nc", tmp_path / "agg2.nc", "--concat-dims", "time")
    assert_one_line_error(proc, "aggregate", "slice_004.nc")
    assert not (tmp_path / "agg2.nc").exists()


def test_rebuild(tmp_path):
    url = write(tmp_path / "t.nc")
    os.unlink(url)
    proc = run("rebuild", tmp_path / "t", tmp_path / "rebuilt.nc")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "rebuilt.nc")
    assert_matches(daskcfa.from_cfa(str(tmp_path / "rebuilt.nc"), "tas").compute(), truth(), rtol=0)
    assert run("verify", tmp_path / "rebuilt.nc", "--deep").returncode == 0


def test_a_misspelt_option_gets_the_commands_usage(capsys):
    """``daskcfa info --jsn``: the error and usage of ``info``, not of the top level (issue 28 item 5).
    (In-process: the entry point's subprocess imports whichever daskcfa is installed.)"""
    from daskcfa.cli import main

    with pytest.raises(SystemExit) as info:
        main(["info", "--jsn", "x.nc"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: daskcfa info ") and "--json" in err
    assert "daskcfa info: error: unrecognized arguments: --jsn" in err
    with pytest.raises(SystemExit):
        main(["--bogus"])
    assert capsys.readouterr().err.startswith("usage: daskcfa [-h]")


def test_log_rollback_and_prune(tmp_path):
    """``daskcfa log`` lists the versions newest first (``--json``: the records); ``rollback``
    makes an earlier one current as a new version and prints its id; ``prune`` drops the rest."""
    url = str(tmp_path / "t.nc")
    proc = run("log", url)
    assert_one_line_error(proc, "log", "no aggregation file")
    write(url)
    daskcfa.to_cfa(truth() + 1, url, variable="tas", dims=DIMS, fragment_shape=(4, 4, 6), mode="w")
    proc = run("log", url)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    versions = daskcfa.history(url)
    assert [line.split()[0] for line in lines] == [v.id for v in versions]
    assert all(" to_cfa " in line for line in lines) and 'mode="w"' in lines[0] and 'mode="w-"' in lines[1]
    assert [r["id"] for r in json.loads(run("log", url, "--json").stdout)] == [v.id for v in versions]
    proc = run("rollback", url, versions[1].id)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == daskcfa.history(url)[0].id != versions[0].id
    assert_matches(daskcfa.from_cfa(url).compute(), truth(), rtol=0)
    proc = run("prune", url, "--keep", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["dropped 2 versions", versions[0].id, versions[1].id]
    assert_one_line_error(run("rollback", url, versions[0].id), "rollback", "no version", "pruned")
    assert_one_line_error(run("rollback", url, "last tuesday"), "rollback", "version id")
    (tmp_path / "t" / ".daskcfa" / "manifest.json").unlink()
    for each in (tmp_path / "t" / ".daskcfa" / "versions").iterdir():
        each.unlink()
    assert run("log", url).stdout.startswith("no versions recorded for")


def test_log_shows_a_planted_records_text_escaped(tmp_path):
    """A version record lies beside the data: its operation and argument names reach the terminal
    escaped, never as control sequences (clear the screen, set the title...)."""
    url = str(tmp_path / "t.nc")
    write(url)
    record = next((tmp_path / "t" / ".daskcfa" / "versions").glob("v-*[0-9a-f].json"))
    planted = json.loads(record.read_text())
    planted["operation"] = "to_cfa\x1b[2J\x1b]0;owned\x07"
    planted["arguments"] = {"mode\x1b[31m": "w\x1b[0m", "\u202eevil": 1}
    record.write_text(json.dumps(planted))
    proc = run("log", url)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "\u202e" not in proc.stdout
    assert "to_cfa\\x1b[2J" in proc.stdout and "mode\\x1b[31m=" in proc.stdout
