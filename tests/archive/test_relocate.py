"""``daskcfa.relocate``: fragment URIs rewritten after an archive moves, the dialect kept.

Archives are written with ``daskcfa.to_cfa`` (or the dialect builders),
really moved -- renamed on disk, copied to the real S3 server with s3fs --
then relocated and read back against the ground truth.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import warnings
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_editable_by_netcdf_c, assert_matches, build, make_truth
from remote_helpers import upload

GENERATION_DIR = re.compile(r"(^|/)g-[0-9a-f]{16}/")

DIMS = ("time", "lat", "lon")
SHAPE = (6, 4, 5)
COORDS = {"time": np.arange(6.0), "lat": np.linspace(-45, 45, 4), "lon": np.arange(5.0)}


def truth():
    return make_truth(SHAPE, "f4", seed=5, masked=0.1)


def write(url, format="CF-1.13", **kw):
    return daskcfa.to_cfa(truth(), str(url), variable="tas", dims=DIMS, attrs={"units": "K"}, coords=COORDS,
                          fragment_shape=(2, 2, 5), format=format, **kw)


def stored_uris(url: str, storage_options=None) -> list[str]:
    """The fragment URIs the file stores, without the writer's generation directory (relocation maps prefixes)."""
    av = daskcfa.read_aggregation(url, storage_options=storage_options)
    return sorted(GENERATION_DIR.sub(r"\1", u) for u in av.fragments.locations())


@pytest.mark.parametrize("format", ["CF-1.13", "CFA-0.6.2", "CFA-0.5", "CFA-0.4"])
def test_fragments_moved_on_disk_dialect_kept(tmp_path, format, caplog):
    url = write(tmp_path / "a" / "t.nc", format=format)
    shutil.move(tmp_path / "a" / "t", tmp_path / "moved")
    with pytest.raises(daskcfa.MissingFragmentError):
        daskcfa.from_cfa(url).compute()
    before = daskcfa.read_aggregation(url)
    caplog.set_level(logging.INFO, logger="daskcfa")
    out = daskcfa.relocate(url, {str(tmp_path / "a" / "t"): str(tmp_path / "moved")})
    assert out == url
    commits = [r.getMessage() for r in caplog.records if r.name == "daskcfa.storage.publish"]
    assert commits == [f"committed aggregation file {url} ({len(before.fragments)} fragments referenced; "
                       f"{os.path.getsize(url)} bytes, mode 'w')"]
    after = daskcfa.read_aggregation(url)
    assert after.dialect == before.dialect
    assert after.fragments.grid == before.fragments.grid
    assert after.attrs == before.attrs
    assert_matches(daskcfa.from_cfa(url).compute(), truth(), rtol=0)
    # relative references stay relative (the fragments are on the same disk)
    assert stored_uris(url)[0] == "../moved/t.tas.0.0.0.nc"
    with daskcfa.open_cfa(url) as ds:  # the rest of the file is as it was
        np.testing.assert_array_equal(ds["lat"][...], COORDS["lat"])
    with netCDF4.Dataset(url) as nc:
        assert nc.data_model == "NETCDF4"


def test_whole_archive_moved_keeps_relative_references(tmp_path):
    write(tmp_path / "old" / "t.nc")
    shutil.move(tmp_path / "old", tmp_path / "new")
    url = str(tmp_path / "new" / "t.nc")
    assert_matches(daskcfa.from_cfa(url).compute(), truth(), rtol=0)  # relative: nothing to do
    out = daskcfa.relocate(url, {str(tmp_path / "new"): str(tmp_path / "elsewhere")}, target=str(tmp_path / "x.nc"))
    assert stored_uris(out)[0] == "elsewhere/t/t.tas.0.0.0.nc"  # relative to the new location of the file
    shutil.move(tmp_path / "new" / "t", tmp_path / "elsewhere" / "t")
    assert_matches(daskcfa.from_cfa(out).compute(), truth(), rtol=0)


def test_move_local_archive_to_s3(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """The acceptance case: a local archive copied to S3 with s3fs, relocated, read back from S3."""
    options = s3_server.storage_options
    url = write(tmp_path / "archive" / "t.nc", format="CFA-0.6.2")
    base = upload(s3fs_fs, tmp_path / "archive", s3_bucket, "cmip")
    shutil.rmtree(tmp_path / "archive" / "t")  # the local fragments are gone: reads must go to S3

    # 1. the aggregation file stays on disk, its fragments now on S3 (absolute URIs)
    local = daskcfa.relocate(url, {str(tmp_path / "archive"): base}, target=str(tmp_path / "local.nc"),
                             storage_options=options)
    assert stored_uris(local)[0] == f"{base}/t/t.tas.0.0.0.nc"
    assert_matches(daskcfa.from_cfa(local, storage_options=options).compute(), truth(), rtol=0)

    # 2. the aggregation file on S3 too: relative references within the bucket
    remote = daskcfa.relocate(url, {str(tmp_path / "archive"): base}, target=f"{base}/t.nc", mode="w",
                              storage_options=options)
    assert remote == f"{base}/t.nc"
    assert stored_uris(remote, options)[0] == "t/t.tas.0.0.0.nc"
    assert daskcfa.read_aggregation(remote, storage_options=options).dialect == "CFA-0.6"
    assert_matches(daskcfa.from_cfa(remote, storage_options=options).compute(), truth(), rtol=0)
    assert daskcfa.verify(remote, storage_options=options, deep=True).ok

    # 3. bucket rename: copy the objects, relocate the remote aggregation file in place
    renamed = s3_server.new_bucket()
    s3fs_fs.copy(f"{s3_bucket}/cmip/", f"{renamed}/cmip/", recursive=True)
    s3fs_fs.rm(f"{s3_bucket}/cmip/", recursive=True)
    moved = f"s3://{renamed}/cmip/t.nc"
    before = s3fs_fs.info(moved[5:])["ETag"]
    with pytest.warns(daskcfa.CFAWarning, match="no fragment URI starts with"):  # relative: already right
        assert daskcfa.relocate(moved, {f"s3://{s3_bucket}/": f"s3://{renamed}/"}, storage_options=options) == moved
    assert s3fs_fs.info(moved[5:])["ETag"] == before  # untouched
    with pytest.warns(daskcfa.CFAWarning, match="outside what readers"):
        daskcfa.relocate(local, {f"s3://{s3_bucket}/": f"s3://{renamed}/"}, storage_options=options,
                         target=f"s3://{s3_bucket}/stale.nc")  # another bucket's fragments: refused by readers
    assert_matches(daskcfa.from_cfa(moved, storage_options=options).compute(), truth(), rtol=0)
    # the relative references of a relocated remote file were already right; absolute ones are mapped
    in_place = daskcfa.relocate(local, {f"s3://{s3_bucket}/": f"s3://{renamed}/"}, storage_options=options)
    assert stored_uris(in_place)[0] == f"s3://{renamed}/cmip/t/t.tas.0.0.0.nc"
    assert_matches(daskcfa.from_cfa(in_place, storage_options=options).compute(), truth(), rtol=0)


def test_cfa06_substitutions_are_expanded(tmp_path):
    x = make_truth((4, 3), "f4", seed=2)
    built = build("CFA-0.6", tmp_path / "a", x, ("time", "x"), ((2, 2), (3,)), substitutions=True)
    with netCDF4.Dataset(built.path) as nc:
        assert "substitutions" in nc[built.names["file"]].ncattrs()
    shutil.move(tmp_path / "a" / "fragments", tmp_path / "b")
    out = daskcfa.relocate(str(built.path), {str(tmp_path / "a" / "fragments"): str(tmp_path / "b")})
    assert all(u.startswith(f"{tmp_path / 'b'}/") for u in stored_uris(out))  # (the form the mapping gave)
    assert_matches(daskcfa.from_cfa(out, built.variable).compute(), built.expected)


def test_in_file_fragment_moves_with_the_file(tmp_path):
    from builders import Frag

    x = make_truth((4, 3), "f4", seed=2)
    built = build("CFA-0.6", tmp_path / "a", x, ("time", "x"), ((2, 2), (3,)), frags={(1, 0): Frag(in_file=True)})
    shutil.move(tmp_path / "a" / "fragments", tmp_path / "b")
    out = daskcfa.relocate(str(built.path), {str(tmp_path / "a" / "fragments"): str(tmp_path / "b")},
                           target=str(tmp_path / "c" / "t.nc"))
    assert "t.nc" in stored_uris(out)
    assert_matches(daskcfa.from_cfa(out, built.variable).compute(), built.expected)


@pytest.mark.parametrize("dialect", ["cfdm-interim", "NCA"])
def test_dialects_that_cannot_be_written_are_refused_or_converted(tmp_path, dialect):
    x = make_truth((4, 3), "f4", seed=2)
    built = build(dialect, tmp_path / "a", x, ("time", "x"), ((2, 2), (3,)))
    shutil.move(tmp_path / "a" / "fragments", tmp_path / "b")
    mapping = {str(tmp_path / "a" / "fragments"): str(tmp_path / "b")}
    original = built.path.read_bytes()
    with pytest.raises(daskcfa.CFAFormatError, match="reads but does not write; relocate it with format="):
        daskcfa.relocate(str(built.path), mapping)
    assert built.path.read_bytes() == original
    out = daskcfa.relocate(str(built.path), mapping, format="CF-1.13")
    assert daskcfa.read_aggregation(out, built.variable).dialect == "CF-1.13"
    assert_matches(daskcfa.from_cfa(out, built.variable).compute(), built.expected)


def test_prefixes_match_whole_segments_and_unmatched_mappings(tmp_path):
    url = write(tmp_path / "t.nc")
    original = Path(url).read_bytes()
    with pytest.warns(daskcfa.CFAWarning, match="no fragment URI starts with"):
        daskcfa.relocate(url, {str(tmp_path / "t" / "t.ta"): "/elsewhere"})  # not a whole path segment
    assert Path(url).read_bytes() == original  # nothing matched: untouched
    with pytest.warns(daskcfa.CFAWarning, match="no fragment URI starts with /nowhere"):
        daskcfa.relocate(url, {"/nowhere": "/x", str(tmp_path / "t"): str(tmp_path / "u")},
                         target=str(tmp_path / "r.nc"))
    # the longest prefix wins
    with pytest.warns(daskcfa.CFAWarning):  # (the shorter prefix is never used)
        out = daskcfa.relocate(url, {str(tmp_path): "/short", str(tmp_path / "t"): "s3://b/long/"},
                               target=str(tmp_path / "l.nc"))
    assert stored_uris(out)[0] == "s3://b/long/t.tas.0.0.0.nc"
    with pytest.raises(ValueError, match="needs a mapping"):
        daskcfa.relocate(url, {})


def test_existing_target_is_refused_unless_overwritten(tmp_path):
    url = write(tmp_path / "t.nc")
    shutil.copytree(tmp_path / "t", tmp_path / "u")
    target = tmp_path / "other.nc"
    target.write_bytes(b"keep me")
    mapping = {str(tmp_path / "t"): str(tmp_path / "u")}
    with pytest.raises(FileExistsError, match="mode='w'"):
        daskcfa.relocate(url, mapping, target=str(target))
    assert target.read_bytes() == b"keep me"
    daskcfa.relocate(url, mapping, target=str(target), mode="w")
    shutil.rmtree(tmp_path / "t")
    assert_matches(daskcfa.from_cfa(str(target)).compute(), truth(), rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about
        daskcfa.relocate(str(target), {str(tmp_path / "u"): str(tmp_path / "v")})
    assert not list(tmp_path.glob(".*.part"))  # no temporary left behind


def test_missing_aggregation_file(tmp_path):
    with pytest.raises(daskcfa.NotFoundError):
        daskcfa.relocate(str(tmp_path / "none.nc"), {"/a": "/b"})


def test_moving_only_the_aggregation_file_rebases_relative_references(tmp_path):
    url = write(tmp_path / "a" / "t.nc")
    with pytest.warns(daskcfa.CFAWarning, match="no fragment URI starts with /unused"):
        out = daskcfa.relocate(url, {"/unused": "/x"}, target=str(tmp_path / "b" / "t.nc"))
    assert stored_uris(out)[0] == "../a/t/t.tas.0.0.0.nc"
    assert_matches(daskcfa.from_cfa(out).compute(), truth(), rtol=0)


@pytest.mark.parametrize("format", ["CF-1.13", "CFA-0.4"])
def test_relocated_file_is_editable_by_netcdf_c(tmp_path, format):
    # issue 13 item 12
    url = write(tmp_path / "a" / "t.nc", format=format)
    shutil.move(tmp_path / "a" / "t", tmp_path / "moved")
    daskcfa.relocate(url, {str(tmp_path / "a" / "t"): str(tmp_path / "moved")})
    assert_editable_by_netcdf_c(url)
    assert_matches(daskcfa.from_cfa(url).compute(), truth(), rtol=0)


def test_relocate_to_absolute_uris(tmp_path):
    # issue 13 item 14: in place without a mapping, or while moving
    url = write(tmp_path / "a" / "t.nc", format="CFA-0.5")
    with pytest.raises(ValueError, match="needs a mapping"):
        daskcfa.relocate(url, {})
    assert daskcfa.relocate(url, {}, uris="absolute") == url
    assert stored_uris(url)[0] == f"{tmp_path}/a/t/t.tas.0.0.0.nc"  # (S3netCDF4's dialect: a plain path)
    assert_matches(daskcfa.from_cfa(url).compute(), truth(), rtol=0)
    shutil.move(tmp_path / "a" / "t", tmp_path / "moved")
    daskcfa.relocate(url, {str(tmp_path / "a" / "t"): str(tmp_path / "moved")}, uris="absolute")
    assert stored_uris(url)[0] == f"{tmp_path}/moved/t.tas.0.0.0.nc"
    daskcfa.relocate(url, {}, uris="absolute", target=str(tmp_path / "cf.nc"), format="CF-1.13")
    assert stored_uris(str(tmp_path / "cf.nc"))[0] == f"file://{tmp_path}/moved/t.tas.0.0.0.nc"
    assert_matches(daskcfa.from_cfa(url).compute(), truth(), rtol=0)
