"""History attacked (docs/reliability.md): what another writer or a careless user does to a
dataset's versions never deletes another dataset's versions or a kept version's fragments, and
out-of-range times are daskcfa errors. Real files."""

from __future__ import annotations

import json
import os
import warnings

import dask
import numpy as np
import pytest

import daskcfa

DIMS = ("time", "lat")


def _write(url: str, x: np.ndarray, **kw) -> str:
    return daskcfa.to_cfa(x, url, variable="tas", dims=DIMS, fragment_shape=(2, 3), **kw)


def _data(seed: int, steps: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).random((steps, 6)).astype("f4") + seed


def test_a_dataset_of_the_same_stem_never_drops_the_others_versions(tmp_path):
    """a.nc and a.nca would share a/ (manifest, versions): the second is refused, the first keeps its history."""
    first = str(tmp_path / "a.nc")
    with dask.config.set({"daskcfa.write.keep-versions": 5}):
        _write(first, _data(1))
        _write(first, _data(2), mode="w")
        before = [v.id for v in daskcfa.history(first)]
        with pytest.raises(daskcfa.TargetExistsError, match="a.nc"):
            _write(str(tmp_path / "a.nca"), _data(3))
    assert [v.id for v in daskcfa.history(first)] == before
    got = daskcfa.from_cfa(first, "tas", version=before[1]).compute()
    np.testing.assert_array_equal(np.ma.getdata(got), _data(1))


def test_a_kept_version_unreadable_during_a_commit_keeps_its_fragments(tmp_path):
    """A kept version's copy missing for a while (a sync, an outage): the commit cannot tell what it
    references, so it retires nothing; once back, it reads whole."""
    url = str(tmp_path / "t.nc")
    first, extra = _data(1), _data(2, steps=2)
    with dask.config.set({"daskcfa.write.keep-versions": 3}):
        _write(url, first)
        _write(url, extra, mode="a", append_dim="time")  # shares the first write's fragments
        _write(url, _data(3), mode="w")
        appended = daskcfa.history(url)[1]
        copy = tmp_path / "t" / ".daskcfa" / "versions" / f"{appended.id}.aggregation"
        os.rename(copy, f"{copy}.away")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", daskcfa.CFAWarning)
            _write(url, _data(4), mode="w")  # the first write leaves retention
        os.rename(f"{copy}.away", copy)
    assert appended.id in [v.id for v in daskcfa.history(url)]
    got = daskcfa.from_cfa(url, "tas", version=appended.id).compute()
    np.testing.assert_array_equal(np.ma.getdata(got), np.concatenate([first, extra]))


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-23:00"])
def test_a_time_beyond_the_calendar_is_a_daskcfa_error(tmp_path, when):
    url = str(tmp_path / "t.nc")
    _write(url, _data(1))
    _write(url, _data(2), mode="w")
    with pytest.raises(daskcfa.ArgumentError, match="years 1 to 9999"):
        daskcfa.from_cfa(url, "tas", version=when)
    parent = daskcfa.history(url)[1]
    record = tmp_path / "t" / ".daskcfa" / "versions" / f"{parent.id}.json"
    planted = json.loads(record.read_text())
    record.write_text(json.dumps({**planted, "time": when}))
    with pytest.raises(daskcfa.CFAFormatError, match=parent.id):
        daskcfa.history(url)


def test_a_signed_source_url_leaves_no_signature_in_the_history(tmp_path, http_server, capsys):
    """A source given as a signed URL (here Google Cloud Storage's ``X-Goog-Signature``) is recorded
    in the version's arguments redacted: the record is kept beside the data for years."""
    import netCDF4

    from daskcfa.cli import main

    with netCDF4.Dataset(http_server.root / "f.nc", "w") as nc:
        nc.createDimension("time", 3)
        nc.createVariable("time", "f8", ("time",))[:] = [0, 1, 2]
        nc["time"].units = "days since 2000-01-01"
        nc.createVariable("tas", "f4", ("time",))[:] = [1, 2, 3]
    signature = "GOOGsig0123456789abcdef"
    source = http_server.url_for("f.nc") + f"?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=cred{signature}" \
                                           f"&X-Goog-Signature={signature}"
    url = str(tmp_path / "t.nc")
    daskcfa.aggregate([source], url)
    stored = "".join(p.read_text() for p in (tmp_path / "t" / ".daskcfa" / "versions").glob("*.json"))
    assert "X-Goog-Signature=***" in stored and signature not in stored
    main(["log", url])
    assert signature not in capsys.readouterr().out


def test_s3_datasets_whose_keys_share_a_prefix_keep_their_own_versions(s3_server):
    """s3://b/a.nc and s3://b/ab.nc: their versions' keys share the prefix ``a``; pruning, rolling
    back and overwriting one never drops a version, nor a fragment, of the other."""
    base, options = f"s3://{s3_server.new_bucket()}", s3_server.storage_options
    a, ab = f"{base}/a.nc", f"{base}/ab.nc"
    with dask.config.set({"daskcfa.write.keep-versions": 5}):
        for url in (a, ab):
            _write(url, _data(1), storage_options=options)
            _write(url, _data(2, steps=2), storage_options=options, mode="a", append_dim="time")
        before = daskcfa.history(ab, storage_options=options)
        daskcfa.rollback(a, daskcfa.history(a, storage_options=options)[1].id, storage_options=options)
        _write(a, _data(3), storage_options=options, mode="w")
        daskcfa.prune(a, keep=0, storage_options=options)
    assert daskcfa.history(ab, storage_options=options) == before
    for version, expected in zip(before, [np.concatenate([_data(1), _data(2, steps=2)]), _data(1)]):
        got = daskcfa.from_cfa(ab, "tas", storage_options=options, version=version.id).compute()
        np.testing.assert_array_equal(np.ma.getdata(got), expected)


def test_a_planted_version_that_cannot_be_removed_never_fails_a_committed_write(tmp_path):
    """A well-formed planted record whose copy is a directory: dropping it fails after the switch;
    the write is committed all the same (reported so, not as a StorageError), and the directory stays."""
    url = str(tmp_path / "t.nc")
    _write(url, _data(1))
    versions = tmp_path / "t" / ".daskcfa" / "versions"
    planted = "v-20200101T000000Z-deadbeef"
    record = json.loads((versions / f"{daskcfa.history(url)[0].id}.json").read_text())
    (versions / f"{planted}.json").write_text(json.dumps({**record, "id": planted, "time": "2020-01-01T00:00:00Z"}))
    (versions / f"{planted}.aggregation" / "inner").mkdir(parents=True)
    (versions / f"{planted}.aggregation" / "inner" / "keep.txt").write_text("not daskcfa's")
    for seed in (2, 3):  # (and the next write too)
        _write(url, _data(seed), mode="w")
        np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(url, "tas").compute()), _data(seed))
    assert (versions / f"{planted}.aggregation" / "inner" / "keep.txt").read_text() == "not daskcfa's"


def test_versions_beyond_a_damaged_record_are_not_dropped(tmp_path):
    """A record damaged (or planted) in the middle of the chain cuts the history there; the commits
    after it drop neither it nor the versions beyond it, so repairing it brings them back."""
    url = str(tmp_path / "t.nc")
    with dask.config.set({"daskcfa.write.keep-versions": 5}):
        for seed in (1, 2, 3):
            _write(url, _data(seed), mode="w")
        versions = daskcfa.history(url)
        record = tmp_path / "t" / ".daskcfa" / "versions" / f"{versions[1].id}.json"
        good = record.read_text()
        record.write_text("{damaged")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", daskcfa.CFAWarning)
            _write(url, _data(4), mode="w")
            _write(url, _data(5), mode="w")
        record.write_text(good)
    assert [v.id for v in daskcfa.history(url)][2:] == [v.id for v in versions]
    got = daskcfa.from_cfa(url, "tas", version=versions[2].id).compute()
    np.testing.assert_array_equal(np.ma.getdata(got), _data(1))


def test_a_fifo_planted_as_a_record_never_fails_a_committed_write(tmp_path):
    """A FIFO named as a version's record: never opened for reading (no hang), left as it is, and
    the write commits and says so."""
    url = str(tmp_path / "t.nc")
    _write(url, _data(1))
    versions = tmp_path / "t" / ".daskcfa" / "versions"
    os.mkfifo(versions / "v-20990101T000000Z-00000001.json")
    _write(url, _data(2), mode="w")
    np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(url, "tas").compute()), _data(2))
    assert (versions / "v-20990101T000000Z-00000001.json").exists()


@pytest.mark.parametrize("planted", [".daskcfa", ".daskcfa/versions"])
def test_a_bookkeeping_directory_planted_as_a_link_is_refused(tmp_path, planted):
    """Someone who can write in one dataset's directory links its ``<stem>/.daskcfa`` (or ``versions/``)
    to another dataset's of the same file name: a write there would replace the other's manifest and
    versions. It is refused (UnsafeURIError) and the other dataset keeps its history and values."""
    other, mine = tmp_path / "b" / "t.nc", tmp_path / "a" / "t.nc"
    other.parent.mkdir()
    mine.parent.mkdir()
    with dask.config.set({"daskcfa.write.keep-versions": 5}):
        _write(str(other), _data(1))
        _write(str(other), _data(2), mode="w")
        before = [v.id for v in daskcfa.history(str(other))]
        manifest = (tmp_path / "b" / "t" / ".daskcfa" / "manifest.json").read_bytes()
        if planted == ".daskcfa":
            (tmp_path / "a" / "t").mkdir()
        else:
            (tmp_path / "a" / "t" / ".daskcfa").mkdir(parents=True)
        (tmp_path / "a" / "t" / planted).symlink_to(tmp_path / "b" / "t" / planted)
        for mode in ("w-", "w"):
            with pytest.raises(daskcfa.UnsafeURIError, match="symbolic link"):
                _write(str(mine), _data(3), mode=mode)
    assert (tmp_path / "b" / "t" / ".daskcfa" / "manifest.json").read_bytes() == manifest
    assert [v.id for v in daskcfa.history(str(other))] == before
    np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(str(other), "tas").compute()), _data(2))
    got = daskcfa.from_cfa(str(other), "tas", version=before[1]).compute()
    np.testing.assert_array_equal(np.ma.getdata(got), _data(1))
