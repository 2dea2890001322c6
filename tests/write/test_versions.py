"""Issue #29, history: every committed write is a version; earlier versions read back, roll back and
are pruned (storage/history.py, write/commit.py, archive/versions.py). Real files, the real S3 server."""

from __future__ import annotations

import json
import os
import warnings
from datetime import timedelta
from pathlib import Path

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa.storage import history as records
from daskcfa.storage.history import Change

DIMS = ("time", "lat")


def _data(seed: int, steps: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).random((steps, 6)).astype("f4") + seed


def _write(url: str, x: np.ndarray, options=None, **kw) -> str:
    return daskcfa.to_cfa(x, url, variable="tas", dims=DIMS, fragment_shape=(2, 3), storage_options=options, **kw)


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path):
    """Where the dataset goes (a base URL), its storage options and a lister of every object under it."""
    if request.param == "local":
        base = str(tmp_path / "ds")
        os.makedirs(base)
        return base, None, lambda: sorted(str(p) for p in Path(base).rglob("*") if p.is_file())
    server = request.getfixturevalue("s3_server")
    base, fs = f"s3://{server.new_bucket()}", server.filesystem()
    return base, server.storage_options, lambda: sorted(f"s3://{p}" for p in fs.find(base.removeprefix("s3://")))


def _read(url: str, options=None, **kw) -> np.ndarray:
    return np.ma.getdata(daskcfa.from_cfa(url, "tas", storage_options=options, **kw).compute())


def _generations(files: list[str]) -> set[str]:
    return {part for f in files for part in f.split("/") if part.startswith("g-") and len(part) == 18}


def test_three_versions_read_back_by_id_and_time_roll_back_and_prune(place):
    base, options, listing = place
    url = f"{base}/t.nca"
    first, extra, third = _data(1), _data(2, steps=2), _data(3)
    _write(url, first, options)
    _write(url, extra, options, mode="a", append_dim="time")
    _write(url, third, options, mode="w")
    truths = [third, np.concatenate([first, extra]), first]  # newest first
    versions = daskcfa.history(url, storage_options=options)
    assert [v.operation for v in versions] == ["to_cfa"] * 3
    assert [v.arguments["mode"] for v in versions] == ["w", "a", "w-"]
    assert versions[1].arguments["append_dim"] == "time"
    assert [v.parent for v in versions] == [versions[1].id, versions[2].id, None]
    assert versions[0].time > versions[1].time > versions[2].time
    for version, expected in zip(versions, truths):
        np.testing.assert_array_equal(_read(url, options, version=version.id), expected)
        np.testing.assert_array_equal(_read(url, options, version=version.time), expected)  # current at that time
        np.testing.assert_array_equal(_read(url, options, version=(version.time + timedelta(microseconds=1))
                                            .isoformat()), expected)
        opened = daskcfa.open_cfa(url, storage_options=options, version=version.id)
        np.testing.assert_array_equal(np.ma.getdata(opened["tas"][...]), expected)
    with pytest.raises(daskcfa.VersionNotFoundError, match="no version of the dataset was current at"):
        _read(url, options, version=versions[-1].time - timedelta(seconds=1))
    np.testing.assert_array_equal(_read(url, options), third)

    restored = daskcfa.rollback(url, versions[2].id, storage_options=options)
    assert (restored.operation, restored.parent, restored.arguments) == ("rollback", versions[0].id,
                                                                        {"version": versions[2].id})
    np.testing.assert_array_equal(_read(url, options), first)
    assert [v.id for v in daskcfa.history(url, storage_options=options)] == [restored.id, *(v.id for v in versions)]
    np.testing.assert_array_equal(_read(url, options, version=versions[0].id), third)  # still kept

    generations = _generations(listing())
    dropped = daskcfa.prune(url, keep=1, storage_options=options)
    assert dropped == [v.id for v in versions]
    assert [v.id for v in daskcfa.history(url, storage_options=options)] == [restored.id]
    assert _generations(listing()) == {versions[2].generation} < generations  # the others' fragments deleted
    np.testing.assert_array_equal(_read(url, options), first)
    with pytest.raises(daskcfa.VersionNotFoundError, match="pruned"):
        daskcfa.rollback(url, versions[1].id, storage_options=options)
    with pytest.raises(daskcfa.VersionNotFoundError, match="pruned"):
        _read(url, options, version=versions[0].id)
    assert not any(f.endswith(".part") or f.endswith(".lease") for f in listing())


def test_retention_keeps_the_newest_versions_and_their_fragments(tmp_path):
    """``daskcfa.write.keep-versions`` = 2: a third write drops the first version and its
    generation; 1 (or 0) is the behaviour of before: only the current generation stays."""
    url = str(tmp_path / "t.nca")
    with dask.config.set({"daskcfa.write.keep-versions": 2}):
        for seed in (1, 2, 3):
            _write(url, _data(seed), mode="w")
        versions = daskcfa.history(url)
        assert len(versions) == 2
        assert _generations([str(p) for p in tmp_path.rglob("*.nc")]) == {v.generation for v in versions}
        np.testing.assert_array_equal(_read(url, version=versions[1].id), _data(2))
    for keep in (1, 0):
        with dask.config.set({"daskcfa.write.keep-versions": keep}):
            _write(url, _data(4 + keep), mode="w")
        assert len(daskcfa.history(url)) == 1
        assert _generations([str(p) for p in tmp_path.rglob("*.nc")]) == {daskcfa.history(url)[0].generation}
    with dask.config.set({"daskcfa.write.keep-versions": -1}), pytest.raises(daskcfa.ConfigError,
                                                                             match="keep-versions"):
        _write(url, _data(9), mode="w")


def test_every_writer_records_its_operation(tmp_path):
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    daskcfa.refragment(url, str(tmp_path / "r.nca"), fragment_shape=(4, 6))
    assert [v.operation for v in daskcfa.history(str(tmp_path / "r.nca"))] == ["refragment"]
    with daskcfa.Dataset(url, "a") as ds:
        ds["tas"][0, 0] = 42.0
    daskcfa.relocate(url, {str(tmp_path): str(tmp_path)}, uris="absolute")
    versions = daskcfa.history(url)
    assert [v.operation for v in versions] == ["relocate", "Dataset.close", "to_cfa"]
    moved = str(tmp_path / "moved.nca")
    daskcfa.relocate(url, {}, target=moved, uris="absolute")
    assert [(v.operation, v.arguments["source"]) for v in daskcfa.history(moved)] == [("relocate", url)]
    assert len(daskcfa.history(url)) == 3  # (the source's history stays with it)
    np.testing.assert_array_equal(_read(url, version=versions[2].id), _data(1))
    assert _read(url)[0, 0] == 42.0


def test_an_aggregation_without_history(tmp_path):
    """Written before versions were recorded (here: its versions removed): an empty history and a
    clear message; the next write records it first (operation "unrecorded"), so it stays readable."""
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    for each in (tmp_path / "t" / ".daskcfa" / "versions").iterdir():
        each.unlink()
    assert daskcfa.history(url) == []
    with pytest.raises(daskcfa.VersionNotFoundError):
        _read(url, version="2020-01-01T00:00:00Z")
    _write(url, _data(2), mode="w")
    versions = daskcfa.history(url)
    assert [v.operation for v in versions] == ["to_cfa", "unrecorded"]
    np.testing.assert_array_equal(_read(url, version=versions[1].id), _data(1))


def test_a_write_killed_between_its_record_and_the_switch_is_no_version(tmp_path):
    """A record stored but never switched to (its writer killed): not in the history, not readable,
    removed by the next commit."""
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    before = daskcfa.history(url)
    payload = Path(url).read_bytes() + b"\0"  # (another file: not the one in place)
    orphan = records.record(url, payload, Change("to_cfa"), None, before[0].id, daskcfa.storage.NO_PROFILE)
    assert daskcfa.history(url) == before
    with pytest.raises(daskcfa.VersionNotFoundError):
        _read(url, version=orphan.id)
    _write(url, _data(2), mode="w")
    assert [v.parent for v in daskcfa.history(url)] == [before[0].id, None]
    assert not list((tmp_path / "t" / ".daskcfa" / "versions").glob(f"{orphan.id}*"))


def test_version_arguments_are_checked(tmp_path):
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    for bad in ("../../etc/passwd", "v-../x", "yesterday"):
        with pytest.raises(daskcfa.ArgumentError, match="version id"):
            _read(url, version=bad)
    with pytest.raises(daskcfa.VersionNotFoundError, match="no version 'v-20200101T000000Z-00000000'"):
        daskcfa.rollback(url, "v-20200101T000000Z-00000000")
    with pytest.raises(daskcfa.ArgumentError, match="keep"):
        daskcfa.prune(url, keep=-1)


def test_recorded_arguments_hold_no_credentials(place):
    base, options, listing = place
    url = f"{base}/t.nca"
    _write(url, _data(1), options)
    change = Change.of("relocate", source="s3://user:hunter2@host/b/t.nca?X-Amz-Signature=abc123",
                       mapping={"s3://k:hunter2@old/": "s3://new/"}, storage_options={"secret": "hunter2"},
                       data=np.zeros(3))
    assert "hunter2" not in json.dumps(change.arguments) and "abc123" not in json.dumps(change.arguments)
    assert change.arguments["data"] == "<ndarray>" and "storage_options" not in change.arguments
    stored = json.dumps([v.as_json() for v in daskcfa.history(url, storage_options=options)])
    assert "storage_options" not in stored
    if options is not None:
        assert options["secret"] not in stored and options["key"] not in stored


def test_a_rollback_waits_for_the_lease(tmp_path):
    """Concurrent writers still exclude each other: a rollback while another writer holds the lease
    is a WriteConflictError (after daskcfa.write.lease-wait), and changes nothing."""
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    _write(url, _data(2), mode="w")
    versions = daskcfa.history(url)
    lease = daskcfa.storage.lease.Lease.new(url, daskcfa.storage.NO_PROFILE, "g-0123456789abcdef").acquire()
    try:
        with dask.config.set({"daskcfa.write.lease-wait": 0}), pytest.raises(daskcfa.WriteConflictError):
            daskcfa.rollback(url, versions[1].id)
    finally:
        lease.release()
    assert daskcfa.history(url) == versions
    np.testing.assert_array_equal(_read(url), _data(2))


# --------------------------------------------------------------------------
# Hostile records: planted by someone with write access to the dataset
# --------------------------------------------------------------------------


def _record_path(tmp_path: Path, version_id: str) -> Path:
    return tmp_path / "t" / ".daskcfa" / "versions" / f"{version_id}.json"


def _edit(path: Path, **fields) -> None:
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps(record))


@pytest.mark.parametrize("planted", [
    {"parent": "../../../elsewhere/v"}, {"parent": 7}, {"time": ["now"]}, {"sha256": "x" * 64},
    {"generation": "../other/g-0123456789abcdef"}, {"arguments": "all"}, {"size": -1},
    {"id": "v-20200101T000000Z-00000000"}, {"pad": "x" * 70000},
], ids=["parent-path", "parent-type", "time-type", "sha", "generation", "arguments", "size", "id", "huge"])
def test_a_malformed_record_on_the_chain_is_a_format_error_naming_it(tmp_path, planted):
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    _write(url, _data(2), mode="w")
    versions = daskcfa.history(url)
    path = _record_path(tmp_path, versions[1].id)
    _edit(path, **planted)
    with pytest.raises(daskcfa.CFAFormatError, match=r"version record.*" + path.name.replace(".", r"\.")):
        daskcfa.history(url)
    with warnings.catch_warnings(record=True) as caught:  # a write goes on: the history stops before it
        warnings.simplefilter("always")
        _write(url, _data(3), mode="w")
    assert any("malformed version record" in str(w.message) for w in caught)
    np.testing.assert_array_equal(_read(url), _data(3))
    assert path.exists()  # (left as it is: beyond a malformed record nothing is read or deleted)


def test_a_planted_version_naming_another_dataset_deletes_nothing_of_it(tmp_path):
    """A version planted into the history whose aggregation file references the fragments of
    another dataset beside this one, and a versions directory that is a link to elsewhere: pruning
    deletes none of their files and reads nothing through the link."""
    other = str(tmp_path / "other.nca")
    _write(other, _data(7))
    theirs = sorted(p for p in (tmp_path / "other").rglob("*") if p.is_file())
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    current = daskcfa.history(url)[0]
    planted = records.record(url, Path(other).read_bytes(), Change("to_cfa"),
                             daskcfa.history(other)[0].generation, None, daskcfa.storage.NO_PROFILE)
    _edit(_record_path(tmp_path, planted.id), time="2000-01-01T00:00:00Z")
    _edit(_record_path(tmp_path, current.id), parent=planted.id)
    assert [v.id for v in daskcfa.history(url)] == [current.id, planted.id]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert daskcfa.prune(url, keep=1) == [planted.id]
    assert any("not fragments of this dataset's own generations" in str(w.message) for w in caught)
    assert all(p.is_file() for p in theirs)
    np.testing.assert_array_equal(_read(other), _data(7))
    np.testing.assert_array_equal(_read(url), _data(1))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bait = elsewhere / "v-20200101T000000Z-00000000.json"
    bait.write_text("{}")
    versions = tmp_path / "t" / ".daskcfa" / "versions"
    for each in versions.iterdir():
        each.unlink()
    versions.rmdir()
    versions.symlink_to(elsewhere)
    with pytest.raises(daskcfa.UnsafeURIError, match="symbolic link"):  # (nothing is written through the link)
        _write(url, _data(2), mode="w")
    with pytest.raises(daskcfa.UnsafeURIError, match="symbolic link"):
        daskcfa.prune(url, keep=1)
    assert bait.read_text() == "{}" and [p.name for p in elsewhere.iterdir()] == [bait.name]


def test_xarray_reads_an_earlier_version(tmp_path):
    xr = pytest.importorskip("xarray")
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    _write(url, _data(2), mode="w")
    first = daskcfa.history(url)[1]
    with xr.open_dataset(url, engine="daskcfa", version=first.id) as ds:
        np.testing.assert_array_equal(ds["tas"].values, _data(1))
    with xr.open_dataset(url, engine="daskcfa") as ds:
        np.testing.assert_array_equal(ds["tas"].values, _data(2))


def test_fixity_counts_the_fragments_of_kept_versions_as_the_datasets(tmp_path):
    """``verify --fixity`` reports objects in the dataset's generation directories that nothing
    accounts for: the fragments of the versions kept are accounted for, not ``extra``."""
    url = str(tmp_path / "t.nca")
    _write(url, _data(1))
    first = daskcfa.history(url)[0].generation
    _write(url, _data(2)[:2], mode="r+", region={"time": slice(0, 2)})  # (half of the first generation replaced)
    report = daskcfa.verify_fixity(url)
    assert report.ok, report
    stray = tmp_path / "t" / first / "stray.nc"
    stray.write_bytes(b"x")
    assert [p.kind for p in daskcfa.verify_fixity(url).problems] == ["extra"]


def test_the_users_retention_holds_when_a_worker_commits(tmp_path):
    """The commit is the write graph's last task: on a cluster a worker runs it, whose dask config is
    not the user's. The retention set on the client (``keep-versions`` 1) still decides what it keeps."""
    distributed = pytest.importorskip("distributed")
    url = str(tmp_path / "t.nca")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  worker_dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        assert client.run(lambda: dask.config.get("daskcfa.write.keep-versions")) != {}
        with dask.config.set({"daskcfa.write.keep-versions": 1}):
            _write(url, _data(1))
            _write(url, _data(2), mode="w")
        assert len(daskcfa.history(url)) == 1
        assert len(_generations([str(p) for p in tmp_path.rglob("*.nc")])) == 1
        _write(url, _data(3), mode="w")  # (the default, 5, again: this version and the one before are kept)
        assert len(daskcfa.history(url)) == 2
    np.testing.assert_array_equal(_read(url), _data(3))
