"""The Zarr world's tools and daskcfa (issue #29), each reading what the other wrote, with no mocks.

``daskcfa.to_icechunk`` (``daskcfa.archive.icechunk_export``): an aggregation written into a real
Icechunk repository as virtual chunk references, read back with plain ``xr.open_zarr`` in a process that
never imports daskcfa, equal to ``from_cfa`` and numpy ground truth; variables that references cannot
present exactly refused by name, or copied as data; locally and with fragments on the S3 test server.

VirtualiZarr: a kerchunk reference set it builds over netCDF files (its ``HDFParser``), aggregated by
daskcfa, is read one dask chunk per referenced chunk-grid block, with numpy's values; and
``to_references(inline=False)`` is accepted by its kerchunk parser, its values equal to numpy's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import daskcfa
from builders import DEFAULT_FILL, Frag, assert_matches, build_cf113, make_truth

pytest.importorskip("xarray")
pytest.importorskip("zarr")

pytestmark = pytest.mark.usefixtures("other_cwd")

DIMS = ("time", "lat", "lon")
SHAPE = (20, 18, 36)
TEN = ((2,) * 10, (18,), (36,))  # ten fragments of (2, 18, 36), as the benchmark archive's (fewer steps)
FILL = DEFAULT_FILL("f4")
STORAGE = {"zlib-chunked": {"zlib": True, "shuffle": True, "chunksizes": (1, 9, 18)}, "uncompressed": None}


@pytest.fixture
def ic():
    return pytest.importorskip("icechunk")


@pytest.fixture
def vz():
    pytest.importorskip("obstore")
    return pytest.importorskip("virtualizarr")


#: reads the repository as any Zarr user does: icechunk + xarray, no daskcfa (asserted)
_READER = r"""
import json, sys
import numpy as np, icechunk as ic, xarray as xr
path, prefixes, creds, out = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
authorize = ic.containers_credentials({p: (ic.s3_credentials(access_key_id=creds[0], secret_access_key=creds[1])
                                          if creds and p.startswith("s3://") else None) for p in prefixes})
repo = ic.Repository.open(ic.local_filesystem_storage(path), authorize_virtual_chunk_access=authorize)
ds = xr.open_zarr(repo.readonly_session("main").store, consolidated=False)
np.savez(out, **{name: (np.array(ds[name].values.tolist()) if ds[name].dtype.kind in "OT" else ds[name].values)
                 for name in ds.variables})
json.dump({name: dict(ds[name].attrs) for name in ds.variables}, open(out + ".json", "w"), default=str)
assert "daskcfa" not in sys.modules, "the reader imported daskcfa"
"""


def read_repository(path: Path, creds=None) -> tuple[dict[str, np.ndarray], dict]:
    """Every variable of the repository's ``main`` branch, read in a subprocess without daskcfa."""
    import icechunk as ic

    prefixes = list(ic.Repository.open(ic.local_filesystem_storage(str(path))).config.virtual_chunk_containers or {})
    out = str(path) + ".npz"
    run = subprocess.run([sys.executable, "-c", _READER, str(path), json.dumps(prefixes), json.dumps(creds), out],
                         cwd=str(path.parent), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(out, allow_pickle=True) as values:
        return dict(values), json.loads(Path(out + ".json").read_text())


def new_repository(path: Path):
    import icechunk as ic

    return ic.Repository.create(ic.local_filesystem_storage(str(path)))


def as_nan(masked) -> np.ndarray:
    """A masked float array as xarray decodes it: masked elements NaN."""
    return np.ma.filled(np.ma.asarray(masked).astype("f8"), np.nan)


def check_equal(got: np.ndarray, url: str, variable: str, truth, rtol: float = 0.0) -> None:
    expected = daskcfa.from_cfa(url, variable).compute()
    np.testing.assert_allclose(got.astype("f8"), as_nan(expected), rtol=rtol, equal_nan=True)
    np.testing.assert_allclose(got.astype("f8"), as_nan(truth), rtol=rtol, equal_nan=True)
    assert np.isnan(got).any(), "the test data have missing values"


@pytest.mark.parametrize("storage", [*STORAGE, "zlib-big-endian"])
def test_benchmark_like_archive_reads_the_same_without_daskcfa(tmp_path, ic, storage):
    truth = make_truth(SHAPE, "f4", seed=3, masked=0.1)
    big = storage == "zlib-big-endian"  # (the byte order is the v3 array's bytes codec's)
    built = build_cf113(tmp_path / "ds", truth, DIMS, TEN, frags=lambda index: Frag(
        fill_value=FILL, storage=STORAGE["zlib-chunked" if big else storage], dtype=">f4" if big else None))
    repo = new_repository(tmp_path / "repo")
    snapshot = daskcfa.to_icechunk(str(built.path), repo)
    values, attrs = read_repository(tmp_path / "repo")
    check_equal(values["tas"], str(built.path), "tas", built.expected)
    for dim in DIMS:  # (coordinates as data)
        np.testing.assert_array_equal(values[dim], np.arange(len(values[dim])) * 1.5 + 10.0)
    assert attrs["tas"]["units"] == "K"
    session = repo.readonly_session("main")
    assert session.snapshot_id == snapshot
    assert session.chunk_type("/tas", [0, 0, 0]) == ic.ChunkType.VIRTUAL
    assert session.chunk_type("/time", [0]) != ic.ChunkType.VIRTUAL, "coordinates are written as data"
    history = list(repo.ancestry(branch="main"))
    assert len(history) == 2 and str(built.path) in history[0].message, "one commit, naming the source"


def per_fragment_fill(index) -> Frag:
    return Frag(fill_value=np.float32(-1000.0 - index[0]), storage={"zlib": True, "chunksizes": (1, 9, 18)})


def per_fragment_packing(index) -> Frag:
    return Frag(dtype="i2", scale_factor=0.01 * (1 + index[0] % 3), add_offset=200.0 + index[0], fill_value=-32767,
                storage={"zlib": True, "chunksizes": (1, 9, 18)})


@pytest.mark.parametrize("frags, reason", [(per_fragment_fill, "missing values .* of its own"),
                                           (per_fragment_packing, "packed")], ids=["fill-values", "packing"])
def test_fragment_encodings_are_refused_by_name_or_copied(tmp_path, ic, frags, reason):
    """Per-fragment fill values or packing: no virtual array reads them right; refused naming the variable
    and why (nothing committed), or with fallback="copy" written as the decoded values, equal to from_cfa."""
    truth = make_truth(SHAPE, "f4", seed=5, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, TEN, frags=frags)
    repo = new_repository(tmp_path / "repo")
    with pytest.raises(daskcfa.ReferencesError, match=rf"variable '/?tas'.*{reason}.*fallback='copy'"):
        daskcfa.to_icechunk(str(built.path), repo)
    assert len(list(repo.ancestry(branch="main"))) == 1, "nothing committed"
    daskcfa.to_icechunk(str(built.path), repo, fallback="copy")
    values, attrs = read_repository(tmp_path / "repo")
    check_equal(values["tas"], str(built.path), "tas", built.expected, rtol=1e-6)
    assert "scale_factor" not in attrs["tas"] and "add_offset" not in attrs["tas"], "decoded values are not packed"
    assert repo.readonly_session("main").chunk_type("/tas", [0, 0, 0]) != ic.ChunkType.VIRTUAL


def test_strings_are_refused_or_copied(tmp_path, ic):
    import dask.array as da

    words = np.array([["a", "bb", "ccc"], ["dd", "", "ffff"]] * 3, dtype=object)
    url = daskcfa.to_cfa(da.from_array(words, chunks=(2, 3)), str(tmp_path / "s.nc"), variable="name",
                         dims=("t", "x"))
    repo = new_repository(tmp_path / "repo")
    with pytest.raises(daskcfa.ReferencesError, match="variable '/?name'"):
        daskcfa.to_icechunk(url, repo)
    daskcfa.to_icechunk(url, repo, fallback="copy")
    values, _ = read_repository(tmp_path / "repo")
    np.testing.assert_array_equal(values["name"], words.astype(str))


def test_a_session_needs_the_containers(tmp_path, ic):
    """A Session cannot have its repository's configuration changed: the missing container is named."""
    built = build_cf113(tmp_path / "ds", make_truth(SHAPE, "f4", seed=1), DIMS, TEN,
                        frags=lambda index: Frag(fill_value=FILL))
    session = new_repository(tmp_path / "repo").writable_session("main")
    container = f"file://{tmp_path / 'ds' / 'fragments'}/"
    with pytest.raises(daskcfa.ArgumentError, match=f"no virtual chunk container for {container}"):
        daskcfa.to_icechunk(str(built.path), session)
    with pytest.raises(daskcfa.ArgumentError, match="fallback must be one of"):
        daskcfa.to_icechunk(str(built.path), session, fallback="skip")


def test_a_commit_that_lost_the_race_is_a_write_conflict(tmp_path, ic):
    """The branch moved after the session began: Icechunk's conflict, as daskcfa's WriteConflictError."""
    built = build_cf113(tmp_path / "ds", make_truth(SHAPE, "f4", seed=2), DIMS, TEN,
                        frags=lambda index: Frag(fill_value=FILL))
    repo = new_repository(tmp_path / "repo")
    daskcfa.to_icechunk(str(built.path), repo)  # (the containers, saved)
    repo = ic.Repository.open(ic.local_filesystem_storage(str(tmp_path / "repo")))
    late = repo.writable_session("main")
    daskcfa.to_icechunk(str(built.path), repo, message="first")
    with pytest.raises(daskcfa.WriteConflictError, match="branch 'main'.*moved"):
        daskcfa.to_icechunk(str(built.path), late)
    assert [s.message for s in repo.ancestry(branch="main")][0] == "first"


def test_fragments_on_s3_without_credentials_in_the_repository(tmp_path, ic, s3_server):
    truth = make_truth(SHAPE, "f4", seed=7, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, TEN,
                        frags=lambda index: Frag(fill_value=FILL, storage={"zlib": True, "chunksizes": (2, 9, 36)}))
    fs, bucket = s3_server.filesystem(), s3_server.new_bucket()
    fs.put(str(built.path.parent) + "/", f"{bucket}/ds/", recursive=True)
    url, options = f"s3://{bucket}/ds/{built.path.name}", s3_server.storage_options
    repo = new_repository(tmp_path / "repo")
    daskcfa.to_icechunk(url, repo, storage_options=options)
    saved = ic.Repository.open(ic.local_filesystem_storage(str(tmp_path / "repo"))).config
    assert list(saved.virtual_chunk_containers) == [f"s3://{bucket}/"], "the container added and saved"
    values, _ = read_repository(tmp_path / "repo", creds=[s3_server.key, s3_server.secret])
    check_equal(values["tas"], str(built.path), "tas", built.expected)  # (from_cfa of the same fragments)
    for file in (tmp_path / "repo").rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            assert s3_server.key.encode() not in data and s3_server.secret.encode() not in data, file


def cli(*args) -> subprocess.CompletedProcess:
    """``python -m daskcfa`` of this checkout's package."""
    root = str(Path(daskcfa.__file__).parents[1])
    return subprocess.run([sys.executable, "-m", "daskcfa", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root}, timeout=300)


def test_cli(tmp_path, ic):
    built = build_cf113(tmp_path / "ds", make_truth(SHAPE, "f4", seed=9, masked=0.1), DIMS, TEN,
                        frags=lambda index: Frag(fill_value=FILL, storage={"zlib": True, "chunksizes": (1, 9, 18)}))
    run = cli("icechunk", built.path, tmp_path / "repo")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip(), "the snapshot id"
    values, _ = read_repository(tmp_path / "repo")
    check_equal(values["tas"], str(built.path), "tas", built.expected)
    again = cli("icechunk", built.path, tmp_path / "repo", "--message", "second")
    assert again.returncode == 0, again.stderr
    repo = ic.Repository.open(ic.local_filesystem_storage(str(tmp_path / "repo")))
    assert [s.message for s in repo.ancestry(branch="main")][0] == "second", "an existing repository: a new commit"


# -- VirtualiZarr ----------------------------------------------------------------------------------


def registry():
    """VirtualiZarr's way to local files: obstore's LocalStore for ``file://`` URLs."""
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore

    return ObjectStoreRegistry({"file://": LocalStore()})


@pytest.mark.parametrize("storage", list(STORAGE))
def test_virtualizarr_reference_set_aggregated_keeps_its_chunk_grid(tmp_path, vz, storage):
    """VirtualiZarr's own reference set of ten files, given to ``aggregate``: one dask chunk per chunk of
    the set's Zarr grid (a contiguous file is one chunk: ten chunks), not one chunk of the whole array."""
    truth = make_truth(SHAPE, "f4", seed=11, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, TEN,
                        frags=lambda index: Frag(fill_value=FILL, storage=STORAGE[storage]))
    files = [f"file://{path}" for _, path in sorted(built.fragment_files.items())]
    virtual = vz.open_virtual_mfdataset(files, parser=vz.parsers.HDFParser(), registry=registry(), concat_dim="time",
                                        combine="nested")
    refs = str(tmp_path / "vz.json")
    virtual.vz.to_kerchunk(refs, format="json")
    aggregation = daskcfa.aggregate([refs], str(tmp_path / "agg.nc"))
    array = daskcfa.from_cfa(aggregation, "tas")
    chunk = (1, 9, 18) if STORAGE[storage] else (2, 18, 36)
    assert array.numblocks == tuple(math.ceil(n / c) for n, c in zip(SHAPE, chunk))
    assert array.npartitions == (80 if STORAGE[storage] else 10)
    assert_matches(array.compute(), built.expected, rtol=0)


def test_to_references_inline_false_is_read_by_virtualizarr(tmp_path, vz):
    """VirtualiZarr's kerchunk parser takes the whole set (coordinates by reference, URIs written out,
    codecs as filters) and loads values equal to numpy's."""
    truth = make_truth(SHAPE, "f4", seed=13, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, TEN,
                        frags=lambda index: Frag(fill_value=FILL, storage=STORAGE["zlib-chunked"]))
    out = daskcfa.to_references(str(built.path), output=str(tmp_path / "refs.json"), inline=False)
    url = f"file://{out}"
    virtual = vz.open_virtual_dataset(url, parser=vz.parsers.KerchunkJSONParser(), registry=registry())
    assert set(virtual.variables) == {"time", "lat", "lon", "tas"}
    assert type(virtual["tas"].data).__name__ == "ManifestArray", "tas by reference"
    loaded = vz.open_virtual_dataset(url, parser=vz.parsers.KerchunkJSONParser(), registry=registry(),
                                     loadable_variables=["tas", "time", "lat", "lon"])
    got = np.ma.masked_invalid(loaded["tas"].values)
    assert_matches(got, built.expected, rtol=0)
    np.testing.assert_array_equal(loaded["lat"].values, np.arange(18) * 1.5 + 10.0)



#: every commit of ``main``, oldest first: its message and its ``tas``, read without daskcfa (asserted)
_HISTORY_READER = r"""
import json, sys
import numpy as np, icechunk as ic, xarray as xr
path, prefixes, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
repo = ic.Repository.open(ic.local_filesystem_storage(path),
                          authorize_virtual_chunk_access=ic.containers_credentials({p: None for p in prefixes}))
commits = [s for s in repo.ancestry(branch="main") if "daskcfa version" in s.message][::-1]
values = {f"c{i}": xr.open_zarr(repo.readonly_session(snapshot_id=s.id).store, consolidated=False)["tas"].values
          for i, s in enumerate(commits)}
np.savez(out, **values)
json.dump([s.message for s in commits], open(out + ".json", "w"))
assert "daskcfa" not in sys.modules, "the reader imported daskcfa"
"""


def test_one_commit_per_kept_version_each_read_without_daskcfa(tmp_path, ic):
    """``versions=True``: the dataset's kept versions (write, append, overwrite) as commits, oldest first,
    each reading back its own values in a process without daskcfa; a pruned version is not exported."""
    url = str(tmp_path / "ds" / "t.nca")
    rng = np.random.default_rng(5)
    first, extra, third = (rng.random((n, 6)).astype("f4") for n in (4, 2, 4))

    def write(x, **kw):
        daskcfa.to_cfa(x, url, variable="tas", dims=("time", "lat"), fragment_shape=(2, 3), **kw)

    write(first)
    write(extra, mode="a", append_dim="time")
    write(third, mode="w")
    versions = daskcfa.history(url)[::-1]  # oldest first
    repo = tmp_path / "repo"
    daskcfa.to_icechunk(url, str(repo), versions=True)
    prefixes = list(ic.Repository.open(ic.local_filesystem_storage(str(repo))).config.virtual_chunk_containers)
    out = str(tmp_path / "commits.npz")
    run = subprocess.run([sys.executable, "-c", _HISTORY_READER, str(repo), json.dumps(prefixes), out],
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    messages = json.loads(Path(out + ".json").read_text())
    assert [m.split("daskcfa version ")[1].split()[0] for m in messages] == [v.id for v in versions]
    with np.load(out) as got:
        for i, truth in enumerate([first, np.concatenate([first, extra]), third]):
            np.testing.assert_array_equal(got[f"c{i}"], truth)

    daskcfa.prune(url, keep=1)
    again = tmp_path / "again"
    run = cli("icechunk", url, again, "--versions")  # (the command line's way)
    assert run.returncode == 0, run.stderr[-3000:]
    commits = [s.message for s in ic.Repository.open(ic.local_filesystem_storage(str(again))).ancestry(branch="main")
               if "daskcfa version" in s.message]
    assert len(commits) == 1 and versions[-1].id in commits[0]
    with pytest.raises(daskcfa.ArgumentError, match="not a session"):
        daskcfa.to_icechunk(url, ic.Repository.open(ic.local_filesystem_storage(str(again))).writable_session("main"),
                            versions=True)
