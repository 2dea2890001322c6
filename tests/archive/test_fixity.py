"""Fixity: ``daskcfa.verify_fixity`` / ``daskcfa verify --fixity`` against the checksums the writer
recorded, and ``record_fixity`` / ``--record`` for archives daskcfa did not write.

Datasets are written with ``daskcfa.to_cfa`` (netCDF and Zarr fragments) on disk and on the
suite's real S3 server, then damaged for real: a byte flipped, an object truncated, deleted,
one added. Manifests are planted to check that they are read as untrusted input.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import daskcfa
from builders import build_cf113, build_cfa06, make_truth
from daskcfa.archive.verify import FIXITY_KINDS, record_fixity, verify_fixity
from daskcfa.cli import main
from daskcfa.errors import CFAError, CFAFormatError

pytestmark = pytest.mark.usefixtures("other_cwd", "sync_dask")

DIMS = ("time", "lat", "lon")
SHAPE = (8, 6, 10)
FRAGMENT_SHAPE = (2, 3, 10)  # a 4 x 2 x 1 grid


class Place:
    """Where a test's dataset lives, with the raw object operations used to damage it."""

    def __init__(self, kind: str, tmp_path: Path, request) -> None:
        self.kind = kind
        if kind == "local":
            self.root, self.options, self.fs = str(tmp_path / "ds"), None, None
            os.makedirs(self.root)
        else:
            server = request.getfixturevalue("s3_server")
            self.fs, self.options = server.filesystem(), server.storage_options
            self.root = f"s3://{server.new_bucket()}/ds"

    def url(self, name: str = "t.nc") -> str:
        return f"{self.root}/{name}"

    def glob(self, pattern: str) -> list[str]:
        if self.fs is None:
            import glob
            return sorted(glob.glob(f"{self.root}/{pattern}"))
        return sorted("s3://" + p for p in self.fs.glob(f"{self.root}/{pattern}"))

    def read(self, uri: str) -> bytes:
        return Path(uri).read_bytes() if self.fs is None else self.fs.cat_file(uri)

    def write(self, uri: str, data: bytes) -> None:
        if self.fs is None:
            Path(uri).write_bytes(data)
        else:
            self.fs.pipe_file(uri, data)

    def remove(self, uri: str) -> None:
        if self.fs is None:
            os.remove(uri)
        else:
            self.fs.rm_file(uri)

    def flip(self, uri: str) -> None:
        data = bytearray(self.read(uri))
        data[len(data) // 2] ^= 0x01
        self.write(uri, bytes(data))

    def truncate(self, uri: str) -> None:
        self.write(uri, self.read(uri)[: len(self.read(uri)) // 2])


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path):
    return Place(request.param, tmp_path, request)


def write(place: Place, fragment_format: str = "NETCDF4") -> str:
    x = make_truth(SHAPE, "f4", seed=3)
    return daskcfa.to_cfa(x, place.url(), variable="tas", dims=DIMS, attrs={"units": "K"},
                          fragment_shape=FRAGMENT_SHAPE, fragment_format=fragment_format,
                          storage_options=place.options)


def found(report) -> set[tuple[str, str]]:
    """The problems of a report as (kind, URI ending)."""
    return {(p.kind, p.uri.rpartition("/ds/")[2]) for p in report.problems}


def short(uri: str) -> str:
    return uri.rpartition("/ds/")[2]


def test_clean_archives_give_no_report_in_ten_runs(place):
    """No false report: ten checks of an undamaged archive of each fragment format."""
    for fragment_format in ("NETCDF4", "zarr"):
        url = daskcfa.to_cfa(make_truth(SHAPE, "f4", seed=4), place.url(f"{fragment_format}.nc"), variable="tas",
                             dims=DIMS, fragment_shape=FRAGMENT_SHAPE, fragment_format=fragment_format,
                             storage_options=place.options)
        for _ in range(10):
            report = verify_fixity(url, storage_options=place.options)
            assert report.ok and report.fixity and report.checked == 8, str(report)


def test_netcdf_fragments_flipped_truncated_missing_and_extra(place):
    url = write(place)
    frags = place.glob("t/g-*/t.tas.*.nc")
    assert len(frags) == 8
    place.flip(frags[0])
    place.truncate(frags[1])
    place.remove(frags[2])
    stray = frags[3].rpartition("/")[0] + "/stray.nc"
    place.write(stray, b"not part of the dataset")
    report = verify_fixity(url, storage_options=place.options)
    assert found(report) == {("checksum", short(frags[0])), ("size", short(frags[1])),
                             ("missing", short(frags[2])), ("extra", short(stray))}, str(report)
    assert {p.kind for p in report.problems} <= set(FIXITY_KINDS)
    assert [p.index for p in report.problems if p.kind != "extra"] == [(0, 0, 0), (0, 1, 0), (1, 0, 0)]


def test_zarr_fragments_checked_object_by_object(place):
    url = write(place, "zarr")
    stores = place.glob("t/g-*/t.tas.*.zarr")
    assert len(stores) == 8
    chunk = stores[0] + "/tas/0.0.0"  # (Zarr v2: the one chunk of the fragment)
    place.flip(chunk)
    gone = stores[1] + "/tas/.zattrs"
    place.remove(gone)
    planted = stores[2] + "/tas/9.9.9"
    place.write(planted, b"x")
    report = verify_fixity(url, storage_options=place.options)
    assert found(report) == {("checksum", short(chunk)), ("missing", short(gone)), ("extra", short(planted))}, \
        str(report)


def test_the_cli_exit_status_says_whether_there_are_problems(place, capsys):
    url = write(place)
    options = [] if place.options is None else ["--storage-options", json.dumps(place.options)]
    assert main(["verify", "--fixity", url, *options]) == 0
    place.flip(place.glob("t/g-*/t.tas.*.nc")[5])
    assert main(["verify", "--fixity", url, *options]) == 1
    out = capsys.readouterr().out
    assert "checksum" in out and "(fixity)" in out
    if place.options:
        assert place.options["secret"] not in out


def test_record_gives_checksums_to_an_archive_daskcfa_did_not_write(tmp_path):
    truth = make_truth((6, 4, 5), seed=5)
    built = build_cf113(tmp_path / "b", truth, DIMS, ((2, 4), (4,), (5,)))
    url = str(built.path)
    report = verify_fixity(url)
    assert {p.kind for p in report.problems} == {"unrecorded"} and len(report.problems) == 2
    assert main(["verify", "--record", url]) == 0
    record = json.loads((built.path.parent / f".{built.path.name}.fixity.json").read_text())
    assert record["algorithm"] == "crc32" and len(record["fragments"]) == 2
    assert verify_fixity(url).ok
    first = sorted(p for p in built.path.parent.rglob("*.nc") if p != built.path)[0]
    data = bytearray(first.read_bytes())
    data[-100] ^= 0xFF
    first.write_bytes(bytes(data))
    assert [p.kind for p in verify_fixity(url).problems] == ["checksum"]
    record_fixity(url)  # a second record keeps the first checksums: it never blesses a change
    assert [p.kind for p in verify_fixity(url).problems] == ["checksum"]


def test_record_takes_the_alternative_location_that_is_there(tmp_path):
    """CFA-0.6.2 alternative URIs: an absent alternative is no problem, the one there is recorded."""
    truth = make_truth((6, 4, 5), seed=7)
    built = build_cfa06(tmp_path / "b", truth, DIMS, ((2, 4), (4,), (5,)), alternatives=True)
    record_fixity(str(built.path))
    record = json.loads((built.path.parent / f".{built.path.name}.fixity.json").read_text())
    assert len(record["fragments"]) == 2 and not any("nowhere" in e["uri"] for e in record["fragments"])
    assert verify_fixity(str(built.path)).ok


def test_record_refuses_a_fragment_it_cannot_read(tmp_path):
    truth = make_truth((6, 4, 5), seed=6)
    built = build_cf113(tmp_path / "b", truth, DIMS, ((2, 4), (4,), (5,)))
    sorted(p for p in built.path.parent.rglob("*.nc") if p != built.path)[0].unlink()
    with pytest.raises(CFAError):
        record_fixity(str(built.path))
    assert not (built.path.parent / f".{built.path.name}.fixity.json").exists()


def test_checksums_travel_with_relocate(tmp_path):
    place = Place("local", tmp_path, None)
    url = write(place)
    moved = tmp_path / "moved"
    os.rename(place.root + "/t", moved)
    new = daskcfa.relocate(url, {place.root + "/t": str(moved)}, target=str(tmp_path / "new.nc"))
    assert verify_fixity(new).ok
    victim = sorted(moved.glob("g-*/t.tas.*.nc"))[4]
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x80
    victim.write_bytes(bytes(data))
    assert [(p.kind, p.index) for p in verify_fixity(new).problems] == [("checksum", (2, 0, 0))]
    assert [p.kind for p in verify_fixity(url).problems] == ["unrecorded"] * 8  # (its manifest moved too)


@pytest.mark.parametrize("change, mention", [
    (lambda e: e.update(uri="../../../../etc/passwd"), "outside"),
    (lambda e: e.update(uri="/etc/passwd"), "outside"),
    (lambda e: e.update(uri="s3://elsewhere/x.nc"), "outside"),
    (lambda e: e.update(nbytes=-1), "size"),
    (lambda e: e.update(nbytes=10**30), "size"),
    (lambda e: e.update(nbytes="8228"), "size"),
    (lambda e: e.update(crc32="zzzzzzzz"), "checksum"),
    (lambda e: e.update(crc32="12345"), "checksum"),
    (lambda e: e.update(crc32=None), "checksum"),
    (lambda e: e.update(crc32=e["crc32"] + "\n"), "checksum"),  # (was taken, then a false "checksum" problem)
])
def test_hostile_manifest_entries_are_format_errors(tmp_path, change, mention):
    place = Place("local", tmp_path, None)
    url = write(place)
    path = Path(place.root) / "t" / ".daskcfa" / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest["fragments"]["/tas"]["0.0.0"])
    path.write_text(json.dumps(manifest))
    with pytest.raises(CFAFormatError, match=mention) as info:
        verify_fixity(url)
    assert info.value.file.endswith("manifest.json") and info.value.fragment == (0, 0, 0)


@pytest.mark.parametrize("key", ["\u00b2", "0.\u00b9.0", "\u0661.0.0"])
def test_a_manifest_index_of_unicode_digits_is_no_bare_error(tmp_path, key):
    """A fragment index of digits Python's ``isdigit`` knows but ``int`` may not read (superscripts)
    is no index: the entry is still checked, and a bare ValueError never escapes."""
    place = Place("local", tmp_path, None)
    url = write(place)
    path = Path(place.root) / "t" / ".daskcfa" / "manifest.json"
    manifest = json.loads(path.read_text())
    entries = manifest["fragments"]["/tas"]
    entries[key] = {**entries["0.0.0"], "uri": "/etc/passwd"}
    path.write_text(json.dumps(manifest))
    with pytest.raises(CFAFormatError, match="outside") as info:
        verify_fixity(url)
    assert info.value.fragment is None


@pytest.mark.parametrize("content", [b"[]", b"{\"fragments\": 3}", b"not json", b"[" * 100000])
def test_malformed_manifests_are_format_errors(tmp_path, content):
    place = Place("local", tmp_path, None)
    url = write(place)
    (Path(place.root) / "t" / ".daskcfa" / "manifest.json").write_bytes(content)
    with pytest.raises(CFAFormatError):
        verify_fixity(url)


def test_a_hostile_store_entry_names_no_object_outside_its_store(tmp_path):
    place = Place("local", tmp_path, None)
    url = write(place, "zarr")
    path = Path(place.root) / "t" / ".daskcfa" / "manifest.json"
    manifest = json.loads(path.read_text())
    entry = manifest["fragments"]["/tas"]["0.0.0"]
    name, obj = next(iter(entry["objects"].items()))
    entry["objects"] = {**{k: v for k, v in entry["objects"].items() if k != name}, "../../../secret": obj}
    path.write_text(json.dumps(manifest))
    with pytest.raises(CFAFormatError, match="plain name"):
        verify_fixity(url)


@pytest.mark.parametrize("fragment_format", ["NETCDF4", "zarr"])
def test_resumed_fragments_keep_their_checksums(tmp_path, fragment_format):
    """A write re-run after its commit was lost keeps the finished fragments (their resume markers)
    and records the same checksums for them."""
    place = Place("local", tmp_path, None)
    url = write(place, fragment_format)
    manifest = Path(place.root) / "t" / ".daskcfa" / "manifest.json"
    first = json.loads(manifest.read_text())["fragments"]
    fragment = place.glob("t/g-*/t.tas.0.0.0.*")[0]
    written = os.stat(fragment).st_mtime_ns
    os.remove(url)
    manifest.unlink()
    write(place, fragment_format)
    assert os.stat(fragment).st_mtime_ns == written  # (resumed, not written again)
    assert json.loads(manifest.read_text())["fragments"] == first
    assert verify_fixity(url).ok


@pytest.mark.parametrize("record, mention", [
    ({"algorithm": "crc32", "fragments": [{"uri": "/etc/passwd", "nbytes": 1, "crc32": "00000000"}]}, "outside"),
    ({"algorithm": "md5", "fragments": []}, "algorithm"),
    ({"algorithm": "crc32", "fragments": {"a": 1}}, "list"),
    ({"algorithm": "crc32", "fragments": ["x"]}, "URI"),
])
def test_a_planted_fixity_record_is_a_format_error(tmp_path, record, mention):
    truth = make_truth((6, 4, 5), seed=8)
    built = build_cf113(tmp_path / "b", truth, DIMS, ((2, 4), (4,), (5,)))
    (built.path.parent / f".{built.path.name}.fixity.json").write_text(json.dumps(record))
    with pytest.raises(CFAFormatError, match=mention) as info:
        verify_fixity(str(built.path))
    assert info.value.file.endswith(".fixity.json")


def commit_a_region(url: str, value: float) -> None:
    """A real commit by another writer: time steps 2-3 replaced (their fragments retired at once)."""
    daskcfa.to_cfa(np.full((2, 6, 10), value, "f4"), url, mode="r+", region={"time": slice(2, 4)})


def test_a_commit_during_a_fixity_check_is_no_false_report(tmp_path):
    """The check planned, then a commit, then the check run: a WriteConflictError naming the file
    (before: the fragments the commit retired were reported 'missing', its new ones 'unrecorded')."""
    place = Place("local", tmp_path, None)
    url = write(place)
    planned = verify_fixity(url, compute=False)
    commit_a_region(url, 1.0)
    with pytest.raises(daskcfa.WriteConflictError, match="during its fixity check") as info:
        planned.compute()
    assert info.value.file == url
    assert verify_fixity(url).ok


def test_a_fixity_check_a_commit_overtook_is_run_again(tmp_path):
    """``compute=True``: a commit as the first check starts (a dask callback makes it then) is seen
    and the check run again, on the new version: clean, no false report."""
    from dask.callbacks import Callback

    place = Place("local", tmp_path, None)
    url = write(place)
    commits = []

    def start(dsk):
        if not commits:
            commits.append(commit_a_region(url, 2.0))

    with Callback(start=start):
        report = verify_fixity(url)
    assert commits and report.ok and report.checked == 8
