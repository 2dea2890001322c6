"""The write room and its bookkeeping attacked (attack16a): writers killed mid-way, careless and hostile
input to the write doors. Real files, real forked writer processes really SIGKILLed, real netCDF4-python.

Each kill trial forks a writer (the synchronous scheduler), kills it at a random moment of a
calibrated run, then requires: the target reads exactly the old or exactly the new values (never a
mix); the history holds no half version; the same call re-run gives the new values; and the
dataset's directory then holds exactly the fragments its kept versions reference (no orphan counted
as data, no temporary, no lease).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa.fragments.manager import manager
from daskcfa.netcdf4 import Dataset
from daskcfa.storage.access import open_aggregation
from daskcfa.write.commit import kept_fragments

from .conftest import wait_for

DIMS = ("time", "lat", "lon")
SHAPE = (12, 30, 40)


def values(seed: int, steps: int = SHAPE[0]) -> np.ndarray:
    """Values distinct for each seed (integer part = seed)."""
    return np.random.default_rng(seed).random((steps, *SHAPE[1:])).astype("f4") + seed


def write(url: str, data: np.ndarray, mode: str = "w", **kw) -> str:
    return daskcfa.to_cfa(data, url, variable="tas", dims=DIMS, fragment_shape=(2, 30, 40), mode=mode, **kw)


def read(url: str) -> np.ndarray | None:
    manager().close_all()
    if not os.path.exists(url):
        return None
    return np.ma.getdata(daskcfa.from_cfa(url).compute(scheduler="sync"))


def _append(url: str) -> None:
    write(url, values(2, 4), mode="a", append_dim="time")


def _region(url: str) -> None:
    write(url, values(2)[3:9], mode="r+", region={"time": slice(3, 9)})  # (not on fragment boundaries)


def _dataset_a(url: str) -> None:
    with Dataset(url, "a", buffer_size=1) as ds:  # (a budget of one byte: fragments written as they go)
        new = values(2)
        for t in range(3, 9):
            ds["tas"][t] = new[t]


def _overwrite(url: str) -> None:
    write(url, values(2), mode="w")


def _refragment(url: str) -> None:
    source = str(Path(url).parent.parent / "source" / "s.nc")  # (written by _prepare)
    daskcfa.refragment(source, url, fragment_shape=(3, 30, 40), mode="w")


def _rollback(url: str) -> None:
    daskcfa.rollback(url, daskcfa.history(url)[-1].id)  # (the oldest: values(2), written by _prepare)


def _prepare(op: str, url: str) -> None:
    """The dataset the operation changes: values(1) (for a rollback, written over values(2))."""
    if op == "refragment" and not os.path.exists(Path(url).parent.parent / "source" / "s.nc"):
        write(str(Path(url).parent.parent / "source" / "s.nc"), values(2))
    if op == "rollback":
        write(url, values(2))
    write(url, values(1))


def _new_values(op: str) -> np.ndarray:
    old = values(1)
    if op == "append":
        return np.concatenate([old, values(2, 4)])
    if op in ("region", "dataset-a"):
        old[3:9] = values(2)[3:9]
        return old
    return values(2)


OPERATIONS: dict[str, Callable[[str], None]] = {"append": _append, "region": _region, "dataset-a": _dataset_a,
                                                "overwrite": _overwrite, "refragment": _refragment,
                                                "rollback": _rollback}


def _child(op: str, url: str, started) -> None:
    started.set()
    with dask.config.set(scheduler="synchronous"):
        OPERATIONS[op](url)


def _fork(op: str, url: str) -> multiprocessing.Process:
    context = multiprocessing.get_context("fork")
    started = context.Event()
    proc = context.Process(target=_child, args=(op, url, started))
    proc.start()
    assert started.wait(120), "the forked writer did not start"
    return proc


def _files(url: str) -> list[Path]:
    return sorted(p for p in Path(url).parent.rglob("*") if p.is_file())


def assert_tidy(url: str, stale_lease: bool = False) -> None:
    """Exactly the fragments the kept versions reference, no temporary, and no lease (but ``stale_lease``:
    a writer killed after its commit, never re-run, leaves its lease and may leave temporaries of its
    bookkeeping, which the next commit removes). A killed ``Dataset`` writer's generation is gone once
    its successor has committed (:func:`test_a_killed_dataset_writer_s_fragments_are_removed_by_its_successor`)."""
    referenced = kept_fragments(url, open_aggregation(url)[1].profile)
    fragments = {str(p) for p in _files(url) if p.suffix == ".nc" and str(p) != url}
    unreferenced = fragments - referenced
    assert not unreferenced and referenced <= fragments, \
        f"unreferenced {sorted(unreferenced)[:3]}, missing {sorted(referenced - fragments)[:3]}"
    bookkeeping = Path(url).with_suffix("") / ".daskcfa"
    leftovers = [p for p in _files(url) if (p.name.endswith(".part") and not (stale_lease and bookkeeping in p.parents))
                 or (p.name.endswith(".lease") and not stale_lease)]
    assert not leftovers, leftovers


@pytest.mark.parametrize("op", list(OPERATIONS))
def test_a_writer_killed_at_random_moments_leaves_old_or_new_and_reruns_to_new(tmp_path, op):
    rng = np.random.default_rng(16)
    manager().close_all()
    calibration = str(tmp_path / "calibration" / "t.nc")
    _prepare(op, calibration)
    t0 = time.perf_counter()
    proc = _fork(op, calibration)
    proc.join(300)
    duration = time.perf_counter() - t0
    assert proc.exitcode == 0
    assert np.array_equal(read(calibration), _new_values(op))
    outcomes: Counter = Counter()
    for trial in range(12):
        url = str(tmp_path / f"trial-{trial}" / "t.nc")
        _prepare(op, url)
        before = daskcfa.history(url)
        manager().close_all()
        proc = _fork(op, url)
        time.sleep(rng.uniform(0, 1.2 * duration))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)
        got = read(url)
        outcome = "old" if np.array_equal(got, values(1)) else "new" if np.array_equal(got, _new_values(op)) \
            else "MIXED"
        outcomes[(outcome, "killed" if proc.exitcode == -signal.SIGKILL else "finished")] += 1
        assert outcome != "MIXED", f"trial {trial}: neither old nor new ({outcomes})"
        after = daskcfa.history(url)
        assert after == before if outcome == "old" else [v.id for v in after[1:]] == [v.id for v in before]
        for version in after:
            kept = np.ma.getdata(daskcfa.from_cfa(url, version=version.id).compute(scheduler="sync"))
            assert np.array_equal(kept, values(1)) or np.array_equal(kept, _new_values(op))
        if outcome == "old":
            OPERATIONS[op](url)  # the same call again
        assert np.array_equal(read(url), _new_values(op))
        assert_tidy(url, stale_lease=outcome == "new" and proc.exitcode == -signal.SIGKILL)
    print(f"\nkilled {op}: {dict(outcomes)} (run {duration:.2f} s)")


#: assigns every time step (a buffer of one byte: each fragment is written when complete), then waits to be
#: killed before close()
DATASET_WRITER = """
import sys, time
import numpy as np
from daskcfa.netcdf4 import Dataset
ds = Dataset(sys.argv[1], "a", buffer_size=1)
for t in range(%d):
    ds["tas"][t] = np.full(%r, 5.0, "f4")
print("assigned", flush=True)
time.sleep(600)
""" % (SHAPE[0], SHAPE[1:])


def test_a_killed_dataset_writer_s_fragments_are_removed_by_its_successor(tmp_path):
    """``Dataset(url, "a")`` killed (SIGKILL) after all its fragments were written, before ``close()``: the
    dataset is intact, and the next writer, taking over the dead writer's lease, commits. Then the
    dataset's directory must hold only the fragments its kept versions reference. (Before lease18: the
    dead writer's 6 fragments, a whole copy of the data, stayed for ever, and ``verify_fixity`` reported
    OK. Now the successor records the dead writer's generation and deletes it at its commit.)"""
    url = str(tmp_path / "t.nc")
    write(url, values(1))
    manager().close_all()
    before = {str(p) for p in _files(url) if p.suffix == ".nc"}
    source = str(Path(daskcfa.__file__).parents[1])  # (the child imports this daskcfa)
    proc = subprocess.Popen([sys.executable, "-c", DATASET_WRITER, url], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": source})
    try:
        assert proc.stdout.readline().strip() == "assigned"
        wait_for(lambda: len({str(p) for p in _files(url) if p.suffix == ".nc"} - before) == 6,
                 what="the writer's 6 fragments")
        time.sleep(0.5)  # (its last fragment renamed into place: nothing more to come)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    assert np.array_equal(read(url), values(1))
    with Dataset(url, "a") as ds:  # the successor: takes over the dead writer's lease
        ds["tas"][0] = np.full(SHAPE[1:], 7.0, "f4")
    expected = values(1)
    expected[0] = 7.0
    assert np.array_equal(read(url), expected)
    assert_tidy(url)


# --------------------------------------------------------------------------
# Careless configuration: credentials in a malformed value
# --------------------------------------------------------------------------

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

MALFORMED_STORAGE_CONFIG = {
    "options-protocol-a-string": {"daskcfa.storage.options": {"s3": f"key=AKIAEXAMPLE,secret={SECRET}"}},
    "options-a-list": {"daskcfa.storage.options": [{"key": "AKIAEXAMPLE", "secret": SECRET}]},
    "profile-a-string": {"daskcfa.storage.profiles": {"p": f"s3://bucket/ key=AKIAEXAMPLE secret={SECRET}"}},
    "profiles-a-list": {"daskcfa.storage.profiles": [{"match": "s3://bucket/", "secret": SECRET}]},
}


@pytest.mark.parametrize("setting", list(MALFORMED_STORAGE_CONFIG))
def test_a_malformed_storage_setting_is_refused_without_echoing_its_secret(tmp_path, setting):
    """A dask config value holding credentials, of the wrong type (a ``"key=...,secret=..."`` string, a
    list): a ConfigError naming the key, for a write and a read. (On main the message quoted the value
    whole, secret included: in the exception, its traceback and any log of it.)"""
    url = str(tmp_path / "t.nc")
    write(url, values(1))
    with dask.config.set(MALFORMED_STORAGE_CONFIG[setting]):
        for act in (lambda: write(url, values(2)), lambda: daskcfa.from_cfa(url).compute()):
            with pytest.raises(daskcfa.ConfigError, match=r"daskcfa\.storage\.(options|profiles)") as info:
                act()
            assert SECRET not in f"{info.value} {info.value!r} {info.value.reason}"
    assert np.array_equal(read(url), values(1))


@pytest.mark.parametrize("wrong", ["protocol-a-string", "key-a-list"])
def test_malformed_storage_options_are_an_argument_error_before_any_request(s3_server, wrong):
    """``storage_options={"s3": "secret=..."}`` (a protocol's options not a mapping) and a ``key`` that is
    not a string, given to a read of the real S3 server: an ArgumentError naming the protocol, no
    secret. (On main: a bare ``ValueError`` from daskcfa's profiles, and a bare ``TypeError`` from
    botocore's signer.)"""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/t.nc"
    write(url, values(1), storage_options=s3_server.storage_options)
    options = {"s3": f"key=AKIAEXAMPLE,secret={SECRET}"} if wrong == "protocol-a-string" else \
        {**s3_server.storage_options, "key": [s3_server.key], "secret": SECRET}
    for act in (lambda: daskcfa.from_cfa(url, storage_options=options).compute(),
                lambda: write(url, values(2), storage_options=options)):
        with pytest.raises(daskcfa.ArgumentError, match=r"storage_options for s3://") as info:
            act()
        assert SECRET not in f"{info.value} {info.value!r}"


# --------------------------------------------------------------------------
# Exports replacing their output
# --------------------------------------------------------------------------


@pytest.mark.parametrize("output", ["the-dataset-directory", "its-fragment-directory", "a-parent-directory",
                                    "the-aggregation-file"])
def test_a_parquet_export_with_mode_w_replaces_only_a_reference_set(tmp_path, output):
    """``to_references(url, output=..., format="parquet", mode="w")`` given, by mistake, a directory holding
    the archive (or the aggregation file itself): refused, nothing deleted. (On main: ``shutil.rmtree`` of
    whatever the output named: the aggregation file and every fragment gone, or a parent directory with
    every dataset in it; the aggregation file replaced by the reference set.) A reference set is replaced."""
    url = str(tmp_path / "archive" / "ds" / "t.nc")
    write(url, values(1))
    beside = str(tmp_path / "archive" / "other" / "o.nc")
    write(beside, values(2))
    target = {"the-dataset-directory": Path(url).parent, "its-fragment-directory": Path(url).with_suffix(""),
              "a-parent-directory": tmp_path / "archive", "the-aggregation-file": Path(url)}[output]
    files = {p: p.read_bytes() for p in (tmp_path / "archive").rglob("*") if p.is_file()}
    with pytest.raises((daskcfa.TargetExistsError, daskcfa.ArgumentError), match="not a Parquet reference set|"
                                                                                 "the aggregation file itself"):
        daskcfa.to_references(url, output=str(target), format="parquet", mode="w")
    assert {p: p.read_bytes() for p in (tmp_path / "archive").rglob("*") if p.is_file()} == files
    assert np.array_equal(read(url), values(1)) and np.array_equal(read(beside), values(2))
    refs = str(tmp_path / "refs.parq")
    daskcfa.to_references(url, output=refs, format="parquet")
    daskcfa.to_references(beside, output=refs, format="parquet", mode="w")  # (a reference set: replaced)
    assert (Path(refs) / ".zmetadata").is_file()


@pytest.mark.parametrize("output", ["the-dataset-directory", "the-aggregation-file"])
def test_an_icechunk_export_into_the_archive_is_a_daskcfa_error_and_touches_nothing(tmp_path, output):
    """``to_icechunk(url, <a directory holding files>)`` or ``(url, <the aggregation file>)``: an
    ArgumentError naming the place, every file as it was. (On main: a bare ``IcechunkError``, and for the
    file a Rust panic, ``pyo3_runtime.PanicException``, a BaseException that ``except Exception`` misses.)"""
    pytest.importorskip("icechunk")
    url = str(tmp_path / "ds" / "t.nc")
    write(url, values(1))
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    target = str(Path(url).parent) if output == "the-dataset-directory" else url
    with pytest.raises(daskcfa.ArgumentError, match="Icechunk repository") as info:
        daskcfa.to_icechunk(url, target)
    assert info.value.file == target
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    assert np.array_equal(read(url), values(1))


# --------------------------------------------------------------------------
# Careless targets: a source, another dataset's fragment
# --------------------------------------------------------------------------


def _plain_files(directory: Path) -> list[str]:
    """Two netCDF files of two time steps each, along an unlimited time."""
    import netCDF4

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(2):
        path = directory / f"p{i}.nc"
        with netCDF4.Dataset(path, "w") as nc:
            nc.createDimension("time", None)
            nc.createDimension("lat", SHAPE[1])
            nc.createDimension("lon", SHAPE[2])
            time_ = nc.createVariable("time", "f8", ("time",))
            time_.units = "days since 2000-01-01"
            time_[:] = [2 * i, 2 * i + 1]
            nc.createVariable("tas", "f4", DIMS)[:] = values(1)[2 * i:2 * i + 2]
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("call", ["aggregate-glob", "aggregate-list", "rebuild"])
def test_an_aggregation_written_over_one_of_its_own_sources_is_refused(tmp_path, call):
    """``aggregate("p*.nc", "p1.nc", mode="w")`` (or ``rebuild``): the target is one of the files it
    references. Refused, the file intact. (On main: p1.nc was replaced by an aggregation file whose
    fragment is p1.nc itself: its data gone, the aggregation unreadable.)"""
    paths = _plain_files(tmp_path)
    files = {p: Path(p).read_bytes() for p in paths}
    act = {"aggregate-glob": lambda: daskcfa.aggregate(str(tmp_path / "p*.nc"), paths[1], mode="w"),
           "aggregate-list": lambda: daskcfa.aggregate(paths, paths[0], mode="w"),
           "rebuild": lambda: daskcfa.rebuild(paths, paths[0], mode="w")}[call]
    with pytest.raises(daskcfa.ArgumentError, match="one of the files it would aggregate"):
        act()
    assert {p: Path(p).read_bytes() for p in paths} == files
    url = daskcfa.aggregate(paths, str(tmp_path / "agg.nc"))
    assert np.array_equal(np.ma.getdata(daskcfa.from_cfa(url, "tas").compute()), values(1)[:4])


@pytest.mark.parametrize("call", ["to_cfa", "Dataset-w", "relocate", "refragment"])
def test_a_write_whose_target_is_another_dataset_s_fragment_is_refused(tmp_path, call):
    """A target named by mistake inside another dataset's generation directory (one of its fragments),
    ``mode="w"``: refused, the other dataset intact. (On main: the fragment was replaced by an
    aggregation file, and the other dataset failed to read: FragmentShapeError.)"""
    other = str(tmp_path / "other" / "t.nc")
    write(other, values(2))
    fragment = str(sorted((tmp_path / "other" / "t").rglob("*.nc"))[0])
    source = str(tmp_path / "mine" / "m.nc")
    write(source, values(1))
    files = {p: p.read_bytes() for p in (tmp_path / "other").rglob("*") if p.is_file()}

    def dataset_w() -> None:
        with Dataset(fragment, "w") as ds:
            ds.createDimension("x", 3)

    act = {"to_cfa": lambda: write(fragment, values(1), mode="w"), "Dataset-w": dataset_w,
           "relocate": lambda: daskcfa.relocate(source, {"/nowhere/": "/elsewhere/"}, target=fragment, mode="w"),
           "refragment": lambda: daskcfa.refragment(source, fragment, mode="w")}[call]
    with pytest.raises(daskcfa.ArgumentError, match="generation directory"):
        act()
    assert {p: p.read_bytes() for p in (tmp_path / "other").rglob("*") if p.is_file()} == files
    assert np.array_equal(read(other), values(2))


@pytest.mark.parametrize("call", ["rollback", "prune", "to_cfa-r+", "Dataset-a"])
def test_an_update_of_an_aggregation_file_named_without_a_suffix_is_a_daskcfa_error(tmp_path, call):
    """An aggregation file copied to a name without a suffix (``cp t.nc archive``), then updated: its
    ``<stem>/`` is the file itself. A daskcfa error naming it, the file unchanged. (On main: a bare
    ``NotADirectoryError`` from every update door.)"""
    url = str(tmp_path / "t.nc")
    write(url, values(1))
    bare = tmp_path / "archive"
    bare.write_bytes(Path(url).read_bytes())
    before = bare.read_bytes()

    def dataset_a() -> None:
        with Dataset(str(bare), "a") as ds:
            ds["tas"][0] = values(2)[0]

    act = {"rollback": lambda: daskcfa.rollback(str(bare), daskcfa.history(url)[0].id),
           "prune": lambda: daskcfa.prune(str(bare)),
           "to_cfa-r+": lambda: write(str(bare), values(2)[:2], mode="r+", region={"time": slice(0, 2)}),
           "Dataset-a": dataset_a}[call]
    with pytest.raises(daskcfa.CFAError, match="no directory") as info:
        act()
    assert info.value.file == str(bare)
    assert bare.read_bytes() == before


def test_temporaries_of_a_writer_killed_while_recording_its_version_are_removed_by_the_next_commit(tmp_path):
    """A writer killed while putting its version record, copy or manifest copy in place leaves
    ``.v-<id>.json.<hex>.part`` (and ``.aggregation``, ``.manifest.json``) in ``<stem>/.daskcfa/versions/``.
    Each write records under a new id, so the next commit removed none of them: left for ever (seen in
    the rollback kill sweep above). Now the next commit removes them; other files there stay."""
    url = str(tmp_path / "t.nc")
    write(url, values(1))
    versions = tmp_path / "t" / ".daskcfa" / "versions"
    dead = "v-20261129T000000Z-0123abcd"
    planted = [versions / f".{dead}{suffix}.{'ab' * 16}.part" for suffix in (".json", ".aggregation",
                                                                            ".manifest.json")]
    for path in planted:
        path.write_bytes(b"{half a rec")
    other = versions / f".notes.txt.{'cd' * 16}.part"  # not a version object's temporary: kept
    other.write_bytes(b"x")
    write(url, values(2))
    assert [p.name for p in planted if p.exists()] == []
    assert other.exists()
    assert np.array_equal(read(url), values(2))
    assert [v.id for v in daskcfa.history(url)][1:] != [] and all(dead != v.id for v in daskcfa.history(url))
