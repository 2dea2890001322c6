"""Issue #27, the writer's trust boundary: what a writer deletes, and writers racing for one target.

A planted ``<stem>/.daskcfa/retired.json`` (attack 3) named another dataset's
aggregation file and directory, and a file outside the tree through a link:
all three were deleted by ``to_cfa(..., mode="w")`` (the directory with
``rmtree``). Now a writer deletes only fragments of this dataset's own
generations (as its manifest names them) under ``<stem>/``, reached through
no link; everything else in the list is ignored with a warning. Real files,
real links, the real S3 server.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import warnings

import dask
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, generation_dir

from .conftest import truth

DIMS = ("time", "lat", "lon")
FORGED = "g-aaaaaaaaaaaaaaaa"


def write(x, url, **kw):
    return daskcfa.to_cfa(x, str(url), variable="tas", dims=DIMS, fragment_shape=(3, 2, 5), **kw)


def _plant(read, put, entries: list[str], generations: list[str]) -> None:
    """A retired list due now, and the manifest also naming ``generations`` as this dataset's own."""
    put("t/.daskcfa/retired.json", json.dumps({"retired": dict.fromkeys(entries, 0)}).encode())
    manifest = json.loads(read("t/.daskcfa/manifest.json"))
    manifest.setdefault("generations", []).extend(generations)
    put("t/.daskcfa/manifest.json", json.dumps(manifest).encode())


def _ignored(caught, expected: str) -> bool:
    """Whether exactly one CFAWarning of ignored retired entries was given, matching ``expected``."""
    found = [str(w.message) for w in caught if issubclass(w.category, daskcfa.CFAWarning)
             and str(w.message).startswith("ignored ")]
    return len(found) == 1 and re.match(expected, found[0]) is not None


@pytest.mark.usefixtures("one_version")
def test_a_planted_retired_list_deletes_nothing_outside_the_dataset(tmp_path):
    ds, outside = tmp_path / "ds", tmp_path / "elsewhere"
    outside.mkdir()
    secret = outside / "secret.nc"
    secret.write_bytes(b"not yours")
    write(truth(seed=1), ds / "other.nc")  # another dataset beside this one
    theirs = generation_dir(ds / "other")
    their_files = sorted(p for p in (ds / "other").rglob("*") if p.is_file())
    write(truth(seed=2), ds / "t.nc")
    ours = generation_dir(ds / "t")
    (ds / "t" / "link").symlink_to(outside)  # a link inside our directory, to outside the tree
    (ds / "t" / FORGED).symlink_to(outside)  # a link named as a generation (the manifest names it too)
    entries = ["other.nc", "other", f"other/{theirs.name}", f"other/{theirs.name}/{their_files[0].name}",
               "t/link/secret.nc", f"t/{FORGED}/secret.nc", "../elsewhere/secret.nc", str(secret),
               f"t/{ours.name}/../../other.nc", f"t//{ours.name}/x.nc", "t/link"]

    def put(relative: str, data: bytes) -> None:
        (ds / relative).write_bytes(data)

    _plant(lambda relative: (ds / relative).read_bytes(), put, entries, [f"t/{FORGED}", f"other/{theirs.name}", "t/link", "other"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write(truth(seed=3), ds / "t.nc", mode="w")
    assert secret.read_bytes() == b"not yours"
    assert (ds / "other.nc").is_file() and all(p.is_file() for p in their_files)
    assert _ignored(caught, r"ignored 11 entries of .*retired\.json that are not fragments of this dataset's "
                            r"own generations \(nothing deleted\)")
    assert_matches(daskcfa.from_cfa(str(ds / "other.nc")).compute(), truth(seed=1))
    assert_matches(daskcfa.from_cfa(str(ds / "t.nc")).compute(), truth(seed=3))
    assert (ds / "t" / "link").is_symlink() and (ds / "t" / FORGED).is_symlink()
    assert json.loads((ds / "t" / ".daskcfa" / "retired.json").read_text())["retired"] == {}  # (dropped)
    assert not ours.exists()  # our own previous generation was retired as before


def test_a_directory_in_our_own_generation_is_not_removed_unless_a_zarr_store(tmp_path):
    """Even inside this dataset's own generation, only regular files and Zarr stores are deleted: a
    directory planted there (or a link to one) is never removed with everything under it."""
    write(truth(seed=1), tmp_path / "t.nc")
    ours = generation_dir(tmp_path / "t")
    planted = ours / "data.nc"
    planted.mkdir()
    (planted / "keep.nc").write_bytes(b"keep")
    fake = ours / "fake.zarr"  # named as a store, not one
    fake.mkdir()
    (fake / "keep.nc").write_bytes(b"keep")
    (ours / "link.nc").symlink_to(planted / "keep.nc")
    retired = tmp_path / "t" / ".daskcfa" / "retired.json"
    names = ["data.nc", "fake.zarr", "link.nc"]
    retired.write_text(json.dumps({"retired": {f"t/{ours.name}/{n}": 0 for n in names}}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write(truth(seed=2), tmp_path / "t.nc", mode="w")
    assert (planted / "keep.nc").read_bytes() == b"keep" and (fake / "keep.nc").read_bytes() == b"keep"
    assert (ours / "link.nc").is_symlink()
    assert _ignored(caught, "ignored 3 entries")
    assert_matches(daskcfa.from_cfa(str(tmp_path / "t.nc")).compute(), truth(seed=2))


@pytest.mark.usefixtures("one_version")
def test_a_planted_retired_list_deletes_no_key_outside_the_dataset_on_s3(s3_server):
    fs, bucket = s3_server.filesystem(), s3_server.new_bucket()
    options = s3_server.storage_options
    fs.pipe(f"{bucket}/elsewhere/secret.nc", b"not yours")
    write(truth(seed=1), f"s3://{bucket}/ds/other.nc", storage_options=options)
    theirs = sorted(fs.find(f"{bucket}/ds/other"))
    their_generation = next(p.split("/")[3] for p in theirs if p.split("/")[3].startswith("g-"))
    write(truth(seed=2), f"s3://{bucket}/ds/t.nc", storage_options=options)
    entries = ["other.nc", "other", f"other/{their_generation}", theirs[0].split("/", 2)[2],
               "../elsewhere/secret.nc", f"t/{FORGED}/../../other.nc", "t/../other.nc",
               f"/{bucket}/elsewhere/secret.nc"]
    _plant(lambda relative: fs.cat(f"{bucket}/ds/{relative}"),
           lambda relative, data: fs.pipe(f"{bucket}/ds/{relative}", data), entries,
           [f"other/{their_generation}", "other", "../elsewhere"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write(truth(seed=3), f"s3://{bucket}/ds/t.nc", storage_options=options, mode="w")
    fs.invalidate_cache()
    assert fs.cat(f"{bucket}/elsewhere/secret.nc") == b"not yours"
    assert fs.exists(f"{bucket}/ds/other.nc") and all(fs.exists(p) for p in theirs)
    assert _ignored(caught, f"ignored {len(entries)} entries")
    assert_matches(daskcfa.from_cfa(f"s3://{bucket}/ds/other.nc", storage_options=options).compute(), truth(seed=1))
    assert_matches(daskcfa.from_cfa(f"s3://{bucket}/ds/t.nc", storage_options=options).compute(), truth(seed=3))
    assert len({p.split("/")[3] for p in fs.find(f"{bucket}/ds/t") if "/g-" in p}) == 1  # ours retired


@pytest.mark.usefixtures("one_version")
def test_the_manifest_names_the_generations_retirement_may_touch(tmp_path):
    """Overwrites with a grace period: every generation still listed for retirement stays named by the
    manifest until its fragments are gone (a writer killed in between leaves them to the next commit)."""
    target = tmp_path / "t.nc"
    write(truth(seed=1), target)
    first = generation_dir(tmp_path / "t").name
    write(truth(seed=2), target, mode="w", keep_previous=60)
    manifest = json.loads((tmp_path / "t" / ".daskcfa" / "manifest.json").read_text())
    assert len(manifest["generations"]) == 2 and f"t/{first}" in manifest["generations"]
    write(truth(seed=3), target, mode="w", keep_previous=60)
    assert len(json.loads((tmp_path / "t" / ".daskcfa" / "manifest.json").read_text())["generations"]) == 3
    retired = tmp_path / "t" / ".daskcfa" / "retired.json"
    retired.write_text(json.dumps({"retired": {k: 0 for k in json.loads(retired.read_text())["retired"]}}))
    write(truth(seed=4), target, mode="w")
    assert len(list((tmp_path / "t").glob("g-*"))) == 1  # (the manifest still names the three just retired)
    write(truth(seed=4), target, mode="w")  # (the same write: nothing leaves)
    assert json.loads((tmp_path / "t" / ".daskcfa" / "manifest.json").read_text())["generations"] == \
        [f"t/{generation_dir(tmp_path / 't').name}"]
    assert_matches(daskcfa.from_cfa(str(target)).compute(), truth(seed=4))


@pytest.mark.parametrize("manifest", [
    {"fragments": [1]}, {"fragments": {"/v": {"0": {"uri": 5}}}}, {"fragments": {"/v": [1]}},
    {"fragments": {"/v": None}}, {"generation": [1], "generations": "t/g-0123456789abcdef"},
    {"generations": [1, None, {}]}, [1], "[" * 100000 + "]" * 100000,
], ids=["fragments-list", "uri-int", "entries-list", "entries-none", "generation-list", "generations-junk",
        "a-list", "nested"])
@pytest.mark.parametrize("mode", ["w", "r+"])
def test_a_planted_manifest_is_no_bare_error(tmp_path, manifest, mode):
    """The manifest lies beside the data too: a malformed one made every overwrite and update fail with
    a bare AttributeError, TypeError or RecursionError. Its malformed parts are left out."""
    url, x = str(tmp_path / "t.nc"), np.arange(24.0).reshape(4, 6)
    keywords = {"variable": "v", "dims": ("a", "b"), "fragment_shape": (2, 6)}
    daskcfa.to_cfa(x, url, **keywords)
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (tmp_path / "t" / ".daskcfa" / "manifest.json").write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", daskcfa.CFAWarning)  # (our old fragments are no longer named: kept)
        if mode == "w":
            daskcfa.to_cfa(x + 1, url, mode="w", **keywords)
            expected = x + 1
        else:
            daskcfa.to_cfa(x[:2] + 2, url, mode="r+", region={"a": slice(0, 2)}, **keywords)
            expected = np.concatenate([x[:2] + 2, x[2:]])
    np.testing.assert_array_equal(daskcfa.from_cfa(url).compute(), expected)


# ---------------------------------------------------------------------------
# Writers of one target through daskcfa.Dataset (netCDF4-python's API)
# ---------------------------------------------------------------------------
@pytest.fixture(params=["local", "s3"])
def target(request, tmp_path):
    """(url, storage_options, lease object exists?, remove the lease object) of a fresh target."""
    if request.param == "local":
        url = str(tmp_path / "t.nc")
        lease = tmp_path / ".t.nc.lease"
        return url, None, lease.exists, lease.unlink
    server = request.getfixturevalue("s3_server")
    bucket, fs = server.new_bucket(), server.filesystem()
    key = f"{bucket}/d/.t.nc.lease"
    return f"s3://{bucket}/d/t.nc", server.storage_options, lambda: fs.exists(key), lambda: fs.rm(key)


def _create(url, options, value: float, **kw) -> daskcfa.Dataset:
    ds = daskcfa.Dataset(url, "w", format="CF-1.13", storage_options=options, **kw)
    ds.createDimension("t", 4)
    ds.createDimension("x", 6)
    ds.createVariable("v", "f4", ("t", "x"), subarray_shape=(2, 6))[0:2] = np.full((2, 6), value)
    return ds


def _read(url, options) -> np.ndarray:
    return np.asarray(daskcfa.from_cfa(url, "v", storage_options=options).compute())


def test_concurrent_dataset_writers_exclude_one_another(target):
    """Four ``Dataset(url, "w")`` at once, three times over: exactly one writes, the others get a
    WriteConflictError naming the holder at once, before writing anything."""
    url, options, *_ = target
    for attempt in range(3):
        barrier, won, refused = threading.Barrier(4), [], []

        def open_one(value: float) -> None:
            barrier.wait()
            try:
                won.append(_create(url, options, value))
            except daskcfa.WriteConflictError as exc:
                refused.append(str(exc))

        threads = [threading.Thread(target=open_one, args=(float(v),)) for v in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(refused) == 3, (won, refused)
        assert all("another writer holds the target: a write by process" in m for m in refused)
        ds = won[0]
        ds["v"][2:4] = np.full((2, 6), 9.0)
        ds.close()
        value = float(_read(url, options)[0, 0])
        assert value in (0.0, 1.0, 2.0, 3.0)
        np.testing.assert_array_equal(_read(url, options), np.r_[np.full((2, 6), value), np.full((2, 6), 9.0)])


def test_a_lease_deleted_mid_write_stops_the_commit(target):
    """Someone deletes the lease object while a Dataset is written: its close() commits nothing and says
    the write lost its lease; the previous dataset is intact."""
    url, options, _, remove = target
    _create(url, options, 1.0).close()
    ds = _create(url, options, 2.0)
    remove()
    with pytest.raises(daskcfa.WriteConflictError, match=r"lost its lease on the target \(now held by nobody\)"):
        ds.close()
    np.testing.assert_array_equal(_read(url, options)[:2], np.full((2, 6), 1.0))


def test_a_writer_resuming_after_its_lease_was_taken_over(target):
    """A writer paused past its lease's time; another took the lease over and committed. The first,
    resuming, is stopped at its next assignment (and its close) and never commits over the second."""
    url, options, exists, _ = target
    with dask.config.set({"daskcfa.write.lease-seconds": 1}):
        slow = _create(url, options, 1.0)
        time.sleep(1.3)  # (its lease expired)
        _create(url, options, 2.0).close()  # takes the stale lease over
        with pytest.raises(daskcfa.WriteConflictError, match="lost its lease"):
            slow["v"][2:4] = np.full((2, 6), 3.0)
        with pytest.raises(daskcfa.WriteConflictError):
            slow.close()
    np.testing.assert_array_equal(_read(url, options)[:2], np.full((2, 6), 2.0))
    assert not exists()  # (the second writer released it; the first never took it back)


@pytest.mark.parametrize("how", ["dimension", "unlimited", "product"])
def test_huge_dimension_sizes_are_refused_when_defined(tmp_path, how):
    """A size past daskcfa.limits.max-elements is an ArgumentError naming it when defined: it used to be
    a bare OverflowError (10**30) or MemoryError (2**62) while the fragments were planned."""
    url = str(tmp_path / "h.nc")
    ds = daskcfa.Dataset(url, "w", format="CF-1.13")
    with pytest.raises(daskcfa.ArgumentError, match="more than 100,000,000,000,000 .*'daskcfa.limits.max-elements'"):
        if how == "dimension":
            ds.createDimension("x", 10**30)
            ds.createVariable("v", "f4", ("x",))  # (was a bare OverflowError here)
        elif how == "unlimited":
            ds.createDimension("x", None)
            ds.createVariable("v", "f4", ("x",))[2**62] = 1.0
        else:
            ds.createDimension("x", 2**31)
            ds.createDimension("y", 2**31)
            ds.createVariable("v", "f4", ("x", "y"))
    ds.close()


@pytest.mark.parametrize("record", [{"pid": "abc"}, {"expires": "soon"}, [1], {"pid": 2**80}, {"pid": 0},
                                    {"expires": 1e12}], ids=["pid-text", "expiry-text", "list", "pid-2**80", "pid-0",
                                                             "far-future"])
def test_to_cfa_over_a_garbage_lease(tmp_path, record):
    """Issue #27, attack 5, through to_cfa: each of these raised a bare ValueError, TypeError or
    OverflowError, or (pid 0, far future) blocked the target with a WriteConflictError."""
    target = tmp_path / "t.nc"
    write(truth(seed=1), target)
    if isinstance(record, dict):
        record = {"owner": "someone", "host": socket.gethostname(), "pid": 1, "generation": FORGED,
                  "expires": time.time() + 60, **record}
        if record["expires"] == 1e12:
            record["host"] = "elsewhere"
    (tmp_path / ".t.nc.lease").write_text(json.dumps(record))
    write(truth(seed=2), target, mode="w")
    assert_matches(daskcfa.from_cfa(str(target)).compute(), truth(seed=2))
    assert not (tmp_path / ".t.nc.lease").exists()


@pytest.mark.usefixtures("one_version")
def test_a_stem_directory_that_is_a_link_is_never_retired_into(tmp_path):
    """``<stem>/`` replaced by a link (here to another dataset's directory): the overwrite succeeds and
    deletes nothing there, saying so; the documented price is that a legitimately linked ``<stem>/``
    keeps its old generations."""
    write(truth(seed=1), tmp_path / "other" / "t.nc")
    theirs = sorted(p for p in (tmp_path / "other" / "t").rglob("*") if p.is_file())
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "t").symlink_to(tmp_path / "other" / "t")
    (tmp_path / "ds" / "t.nc").write_bytes((tmp_path / "other" / "t.nc").read_bytes())  # (relative references)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write(truth(seed=2), tmp_path / "ds" / "t.nc", mode="w")
    assert all(p.is_file() for p in theirs)
    assert _ignored(caught, r"ignored \d+ entries")
    assert_matches(daskcfa.from_cfa(str(tmp_path / "other" / "t.nc")).compute(), truth(seed=1))
    assert_matches(daskcfa.from_cfa(str(tmp_path / "ds" / "t.nc")).compute(), truth(seed=2))


def test_a_retired_list_that_is_a_directory_costs_space_not_the_write(tmp_path):
    """``<stem>/.daskcfa/retired.json`` planted as a directory: the overwrite failed with a bare
    IsADirectoryError (moving the new list into place). A list that cannot be stored costs space
    only: the write succeeds, the old generation stays, no temporary is left."""
    write(truth(seed=1), tmp_path / "t.nc")
    old = generation_dir(tmp_path / "t")
    (tmp_path / "t" / ".daskcfa" / "retired.json").mkdir()
    write(truth(seed=2), tmp_path / "t.nc", mode="w")
    assert_matches(daskcfa.from_cfa(str(tmp_path / "t.nc")).compute(), truth(seed=2))
    assert old.is_dir() and (tmp_path / "t" / ".daskcfa" / "retired.json").is_dir()
    assert not [p for p in (tmp_path / "t" / ".daskcfa").iterdir() if p.name.endswith(".part")]


def test_a_link_planted_as_a_resume_marker_overwrites_nothing_outside(tmp_path):
    """A fragment's resume marker has a predictable name (``<stem>/g-.../.daskcfa/<fragment>.json``):
    a link planted there, for a fragment the rerun of a write must store again, made the writer
    overwrite the file it named, outside the dataset, with the marker's JSON. Now the marker is
    never written through a link: the write fails with a CFAError naming the fragment."""
    precious = tmp_path / "elsewhere" / "precious.txt"
    precious.parent.mkdir()
    precious.write_text("precious data")
    write(truth(seed=1), tmp_path / "t.nc")
    ours = generation_dir(tmp_path / "t")
    fragment = sorted(ours.glob("*.nc"))[0]
    marker = ours / ".daskcfa" / (fragment.name + ".json")
    fragment.unlink()
    marker.unlink()
    marker.symlink_to(precious)
    with pytest.raises(daskcfa.CFAError, match="symbolic link") as failed:
        write(truth(seed=1), tmp_path / "t.nc", mode="w")  # (the very same call: it resumes that generation)
    assert failed.value.fragment is not None and failed.value.variable is not None
    assert precious.read_text() == "precious data" and marker.is_symlink()


@pytest.mark.usefixtures("one_version")
def test_a_retired_entry_due_at_a_huge_integer_is_no_bare_error(tmp_path):
    """A JSON integer has no bound: an entry due at 10**400 made every overwrite fail with a bare
    OverflowError (converting it to a float). Such an entry is dropped; the others still count."""
    write(truth(seed=1), tmp_path / "t.nc")
    retired = tmp_path / "t" / ".daskcfa" / "retired.json"
    retired.write_text('{"retired": {"t/%s/x.nc": 1%s}}' % (FORGED, "0" * 400))
    write(truth(seed=2), tmp_path / "t.nc", mode="w")
    assert_matches(daskcfa.from_cfa(str(tmp_path / "t.nc")).compute(), truth(seed=2))
    assert len([p for p in (tmp_path / "t").iterdir() if p.name.startswith("g-")]) == 1  # the old one retired


def test_a_deeply_nested_resume_marker_is_rewritten(tmp_path):
    """A resume marker of 100,000 nested brackets made the rerun of a write fail (RecursionError,
    wrapped as a FragmentError), every time; like any other unreadable marker, it is rewritten."""
    write(truth(seed=1), tmp_path / "t.nc")
    ours = generation_dir(tmp_path / "t")
    fragment = sorted(ours.glob("*.nc"))[0]
    (ours / ".daskcfa" / (fragment.name + ".json")).write_text("[" * 100000 + "]" * 100000)
    write(truth(seed=1), tmp_path / "t.nc", mode="w")  # (the very same call: it resumes that generation)
    assert_matches(daskcfa.from_cfa(str(tmp_path / "t.nc")).compute(), truth(seed=1))
    assert json.loads((ours / ".daskcfa" / (fragment.name + ".json")).read_text())["uri"].endswith(fragment.name)


#: 7 MiB of JSON that grows about 20-fold when parsed (``[[],[],...]``: a 56-byte list per 3 characters)
_GROWING_JSON = "[" + ",".join(["[]"] * ((7 << 20) // 3)) + "]"


@pytest.mark.parametrize("document", ["manifest", "retired"])
def test_bookkeeping_json_is_read_only_if_it_fits_max_memory_once_parsed(tmp_path, document):
    """The manifest and the list of retired fragments lie beside the data: 7 MiB of JSON planted as
    either, under ``max-memory=64MiB``, was parsed whole (about 140 MiB). Now a manifest too large
    to parse within the limit is a BudgetError naming it and the setting, before anything is written;
    such a retired list is left unread (it only ever deletes), and the write goes on."""
    import tracemalloc

    url, x = str(tmp_path / "t.nc"), np.arange(24.0).reshape(4, 6)
    keywords = {"variable": "v", "dims": ("a", "b"), "fragment_shape": (2, 6)}
    daskcfa.to_cfa(x, url, **keywords)
    planted = tmp_path / "t" / ".daskcfa" / ("manifest.json" if document == "manifest" else "retired.json")
    planted.write_text(_GROWING_JSON)
    tracemalloc.start()
    try:
        with dask.config.set({"daskcfa.limits.max-memory": "64MiB", "scheduler": "sync"}):
            if document == "manifest":
                with pytest.raises(daskcfa.BudgetError, match="max-memory") as caught:
                    daskcfa.to_cfa(x + 1, url, mode="w", **keywords)
                assert caught.value.file.endswith("manifest.json")
            else:
                daskcfa.to_cfa(x + 1, url, mode="w", **keywords)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB traced at the peak"
    np.testing.assert_array_equal(daskcfa.from_cfa(url).compute(), x if document == "manifest" else x + 1)
