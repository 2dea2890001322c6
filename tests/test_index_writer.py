"""The chunk index (``daskcfa.index``, ``daskcfa index``; read by ``from_cfa``/``open_cfa`` through
``daskcfa.fragments.chunk_index``): reads equal numpy ground truth with and without it, locally and
on the S3 test server, with no HDF5 metadata read; one GET per fragment for a point series on S3
(the server's own request counters); fragments rewritten after indexing detected and read correctly;
hostile index files refused or left out with a warning, never a wrong value."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import dask
import numpy as np
import pytest

import daskcfa
from builders import Frag, assert_matches, build, make_truth
from read_helpers import bytes_read
from remote_helpers import upload
from daskcfa.errors import CFAFormatError, CFAWarning, NotFoundError
from daskcfa.fragments import canonical, readahead

pytestmark = pytest.mark.usefixtures("other_cwd")

DIMS = ("time", "lat", "lon")
SHAPE = (6, 4, 10)
SIZES = ((2, 2, 2), (4,), (5, 5))
N_FRAGMENTS = 6
#: fragments stored each their own way: an index, unlike a reference set, is per fragment
STORAGE = {
    (0, 0, 0): None,  # contiguous
    (0, 0, 1): {"zlib": True, "shuffle": True, "complevel": 4, "chunksizes": (1, 2, 5)},
    (1, 0, 0): {"zlib": True, "fletcher32": True, "chunksizes": (2, 4, 5)},
    (1, 0, 1): {"compression": "zstd", "chunksizes": (1, 4, 5)},
    (2, 0, 0): {"compression": "bzip2", "shuffle": True, "chunksizes": (2, 2, 5)},
    (2, 0, 1): {"zlib": True, "chunksizes": (1, 3, 3)},  # edge chunks
}


def mixed(index):
    """Different storage, packing and missing-value conventions per fragment."""
    extra = {(1, 0, 0): {"scale_factor": 0.01, "add_offset": 250.0, "dtype": "i2"},
             (2, 0, 1): {"missing": "missing_value"}}.get(index, {})
    return Frag(storage=STORAGE[index], **extra)


@pytest.fixture
def built(tmp_path):
    return build("CF-1.13", tmp_path / "ds", make_truth(SHAPE, "f4", seed=3, masked=0.15), DIMS, SIZES, frags=mixed)


@pytest.fixture
def opens(monkeypatch):
    """Counts the fragment files opened the usual way (HDF5 metadata read)."""
    calls = []
    original = canonical.open_fragment
    monkeypatch.setattr(canonical, "open_fragment", lambda uri, *a, **k: calls.append(uri) or original(uri, *a, **k))
    return calls


def check_reads(url, expected, storage_options=None, **kw):
    x = daskcfa.from_cfa(url, "tas", storage_options=storage_options, **kw)
    assert_matches(x.compute(), expected, rtol=1e-5)
    assert_matches(x[:, 2, 7].compute(), expected[:, 2, 7], rtol=1e-5)
    assert_matches(x[1:5, 1:3, 3:8].compute(), expected[1:5, 1:3, 3:8], rtol=1e-5)
    assert_matches(x[::-2, 0, ::3].compute(), expected[::-2, 0, ::3], rtol=1e-5)
    assert_matches(x[[0, 5, 3], 1, 2:10].compute(), expected[[0, 5, 3], 1, 2:10], rtol=1e-5)


def index_file(built) -> Path:
    return built.path.parent / f".{built.path.name}.chunks.json"


# ---------------------------------------------------------------------------
# Reads with and without the index
# ---------------------------------------------------------------------------
def test_reads_equal_with_and_without_the_index_and_open_no_fragment_file(built, opens):
    report = daskcfa.index(str(built.path))
    assert report.fragments == N_FRAGMENTS and not report.left_out
    assert Path(report.uri) == index_file(built)
    check_reads(str(built.path), built.expected, chunk_index=False)
    assert len(opens) >= N_FRAGMENTS
    opens.clear()
    check_reads(str(built.path), built.expected)
    assert opens == [], "no fragment opened as HDF5 through the index"
    with daskcfa.open_cfa(str(built.path), chunk_index=True) as ds:
        assert_matches(ds["tas"][...], built.expected, rtol=1e-5)
    assert opens == []


def test_unmasked_and_stored_values(built):
    daskcfa.index(str(built.path))
    for kw in ({"mask": False}, {}):
        got = daskcfa.from_cfa(str(built.path), "tas", **kw).compute()
        want = daskcfa.from_cfa(str(built.path), "tas", chunk_index=False, **kw).compute()
        np.testing.assert_array_equal(np.ma.getdata(got), np.ma.getdata(want))
        np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(want))


def test_netcdf3_fragments_and_integers(tmp_path, opens):
    truth = make_truth(SHAPE, "i4", seed=5, masked=0.1, lo=-1000, hi=1000)
    built = build("CF-1.13", tmp_path / "ds", truth, DIMS, SIZES,
                  frags=lambda i: Frag(format="NETCDF3_64BIT_OFFSET" if i[2] else "NETCDF4",
                                       storage=None if i[2] else {"zlib": True, "chunksizes": (1, 4, 5)}))
    assert daskcfa.index(str(built.path)).fragments == N_FRAGMENTS
    check_reads(str(built.path), built.expected)
    assert opens == []


def test_fragments_the_index_cannot_locate_are_left_out(tmp_path, opens):
    """A missing fragment and one in a Zarr-free but unusual way (strings) are read the usual way."""
    built = build("CF-1.13", tmp_path / "ds", make_truth(SHAPE, "f4", seed=2), DIMS, SIZES)
    built.fragment_files[(1, 0, 1)].unlink()
    with pytest.warns(CFAWarning, match=r"1 fragment\(s\) left out.*fragment \(1, 0, 1\): fragment file not found"):
        report = daskcfa.index(str(built.path))
    assert report.fragments == N_FRAGMENTS - 1
    x = daskcfa.from_cfa(str(built.path), "tas", missing="fill")
    with pytest.warns(CFAWarning, match="as missing data"):
        got = x.compute()
    assert_matches(got[:2], built.expected[:2])


def test_index_of_chosen_variables_and_errors(built):
    assert daskcfa.index(str(built.path), "tas").fragments == N_FRAGMENTS
    with pytest.raises(daskcfa.VariableNotFoundError):
        daskcfa.index(str(built.path), "nope")
    with pytest.raises(NotFoundError, match="missing.nc"):  # (the aggregation first: its index only then)
        daskcfa.from_cfa(str(built.path.parent / "missing.nc"), "tas", chunk_index=True)
    with pytest.raises(daskcfa.ArgumentError, match="chunk_index must be True, False or 'auto'"):
        daskcfa.from_cfa(str(built.path), "tas", chunk_index="yes")


def test_no_index_with_chunk_index_true_is_an_error(built):
    with pytest.raises(NotFoundError, match="no chunk index"):
        daskcfa.from_cfa(str(built.path), "tas", chunk_index=True)
    with dask.config.set({"daskcfa.io.chunk-index": False}):
        daskcfa.index(str(built.path))
        assert daskcfa.from_cfa(str(built.path), "tas").compute().shape == SHAPE


# ---------------------------------------------------------------------------
# Changed fragments
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "chunked"])
def test_a_fragment_rewritten_after_indexing_is_read_without_the_index(tmp_path, layout):
    storage = None if layout == "contiguous" else {"zlib": True, "chunksizes": (1, 4, 5)}
    truth = make_truth(SHAPE, "f4", seed=7)
    built = build("CF-1.13", tmp_path / "ds", truth, DIMS, SIZES, frags=lambda i: Frag(storage=storage))
    daskcfa.index(str(built.path))
    expected = truth.copy()
    expected[2:4, :, 5:10] *= 2
    again = build("CF-1.13", tmp_path / "again", expected, DIMS, SIZES, frags=lambda i: Frag(storage=storage))
    os.replace(again.fragment_files[(1, 0, 1)], built.fragment_files[(1, 0, 1)])  # as a re-run writer would
    with pytest.warns(CFAWarning, match=r"changed since the chunk index was written.*fragment \(1, 0, 1\)"):
        got = daskcfa.from_cfa(str(built.path), "tas")[:, 1, 6].compute()
    assert_matches(got, expected[:, 1, 6])


# ---------------------------------------------------------------------------
# Hostile index files
# ---------------------------------------------------------------------------
def entry_edits():
    def first(doc):
        return doc["variables"]["/tas"][1]  # the zlib+shuffle fragment

    def past_end(doc):
        first(doc)["offsets"][0] = first(doc)["size"] - 2

    def absurd_size(doc):
        first(doc)["sizes"][0] = 1 << 40

    def negative(doc):
        first(doc)["offsets"][0] = -5

    def off_grid(doc):
        first(doc)["starts"][0] = [1, 0, 0]

    def swapped_uri(doc):  # entries for fragments the aggregation does not name: never used
        for entry in doc["variables"]["/tas"]:
            entry["uri"] = "elsewhere/" + entry["uri"]

    def outside_policy(doc):
        first(doc)["uri"] = "file:///etc/passwd"

    def unknown_filter(doc):
        first(doc)["filters"] = [[9999, []]]

    def string_type(doc):
        first(doc)["dtype"] = "|S1"

    def wrong_token(doc):  # the object is not the one indexed: never read through the index
        first(doc)["token"] = "0"

    def bad_attribute(doc):
        first(doc)["attrs"]["_FillValue"] = {"dtype": "O", "data": [[1, 2]]}

    return {f.__name__: f for f in (past_end, absurd_size, negative, off_grid, swapped_uri, outside_policy,
                                    unknown_filter, string_type, wrong_token, bad_attribute)}


@pytest.mark.parametrize("edit", list(entry_edits()))
def test_hostile_entries_are_left_out(built, edit):
    daskcfa.index(str(built.path))
    path = index_file(built)
    doc = json.loads(path.read_text())
    entry_edits()[edit](doc)
    path.write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = daskcfa.from_cfa(str(built.path), "tas")
        got, point = x.compute(), x[:, 1, 6].compute()
    assert_matches(got, built.expected, rtol=1e-5)
    assert_matches(point, built.expected[:, 1, 6], rtol=1e-5)
    messages = " ".join(str(w.message) for w in caught if issubclass(w.category, CFAWarning))
    if edit == "wrong_token":
        assert "changed since the chunk index was written" in messages
    elif edit not in ("swapped_uri", "outside_policy"):  # (never looked up: no fragment has that URI)
        assert "entries left out" in messages


@pytest.mark.parametrize("content", [b"", b"garbage {", b"[1, 2]", b'{"format": "other"}',
                                     b'{"format": "daskcfa-chunk-index", "version": 99, "variables": {}}',
                                     b'{"format": "daskcfa-chunk-index", "version": 1, "variables": []}',
                                     b'{"format": "daskcfa-chunk-index", "version": 1, "variables": {"/tas": 3}}',
                                     b"[" * 100000])
def test_hostile_index_files(built, content):
    index_file(built).write_bytes(content)
    with pytest.warns(CFAWarning, match="the chunk index is not used"):
        x = daskcfa.from_cfa(str(built.path), "tas")
    assert_matches(x.compute(), built.expected, rtol=1e-5)
    with pytest.raises(CFAFormatError):
        daskcfa.from_cfa(str(built.path), "tas", chunk_index=True)


def test_an_index_too_large_is_not_read(built):
    daskcfa.index(str(built.path))
    with dask.config.set({"daskcfa.limits.max-memory": 16384}):
        with pytest.warns(CFAWarning, match="more than 1,024 "):
            x = daskcfa.from_cfa(str(built.path), "tas")
    assert_matches(x.compute(), built.expected, rtol=1e-5)


# ---------------------------------------------------------------------------
# S3
# ---------------------------------------------------------------------------
def test_reads_on_s3_with_and_without_the_index(built, placed, opens):
    url, options = placed(built.path)
    daskcfa.index(url, storage_options=options)
    opens.clear()
    check_reads(url, built.expected, options)
    assert opens == []
    check_reads(url, built.expected, options, chunk_index=False)


@pytest.fixture(scope="module")
def counted_s3():
    """An S3 server of this module's own, with its Prometheus request counters on."""
    from daskcfa_testing.servers import S3Server, free_ports

    port, = free_ports(1)
    with S3Server(extra_args=(f"-metricsPort={port}", "-metricsIp=127.0.0.1")) as server:
        yield server, f"http://127.0.0.1:{port}/metrics"


def requests_by_type(metrics_url, bucket):
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("SeaweedFS_s3_request_total{") and f'bucket="{bucket}"' in line:
            kind = line.split('type="', 1)[1].split('"', 1)[0]
            counts[kind] = counts.get(kind, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def spent_since(before, metrics, bucket):
    after = requests_by_type(metrics, bucket)
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def started_since(before):
    return {k: v - before[k] for k, v in readahead.stats().items()}


def one_get_each(n):
    return ({"GET": n}, {"GetObject": n})


@pytest.mark.parametrize("scheduler", ["synchronous", "threads"])
def test_a_point_series_on_s3_is_one_get_per_fragment(tmp_path, counted_s3, scheduler):
    """One ranged GET per fragment, also while the chunks of the next fragments are fetched
    ahead (a read ahead that fetched any chunk twice, or one not needed, would add GETs)."""
    server, metrics = counted_s3
    n = 12
    truth = make_truth((n, 30, 40), "f4", seed=9)
    built = build("CF-1.13", tmp_path / "ds", truth, DIMS, ((1,) * n, (30,), (40,)),
                  frags=lambda i: Frag(storage={"zlib": True, "shuffle": True, "chunksizes": (1, 10, 10)}))
    bucket = server.new_bucket()
    server.filesystem().put(str(built.path.parent) + "/", f"{bucket}/ds/", recursive=True)
    url = f"s3://{bucket}/ds/{built.path.name}"
    daskcfa.index(url, storage_options=server.storage_options)
    x = daskcfa.from_cfa(url, "tas", storage_options=server.storage_options)  # (the aggregation and index read)
    ahead = readahead.stats()
    with dask.config.set(scheduler=scheduler, num_workers=2):
        for _ in range(2):  # (done again: what was read is not read ahead again)
            before = requests_by_type(metrics, bucket)
            got = x[:, 17, 23].compute()
            assert_matches(got, truth[:, 17, 23])
            assert spent_since(before, metrics, bucket) in one_get_each(n)
        assert readahead.stats()["used"] - ahead["used"] >= n // 2

        # a fragment replaced on S3 after indexing: If-Match refuses it (also when fetched ahead), and
        # it is read the usual way
        fs = server.filesystem()
        changed = truth.copy()
        changed[4] += 1
        build_one = build("CF-1.13", tmp_path / "again", changed, DIMS, ((1,) * n, (30,), (40,)),
                          frags=lambda i: Frag(storage={"zlib": True, "shuffle": True, "chunksizes": (1, 10, 10)}))
        relative = built.fragment_files[(4, 0, 0)].relative_to(built.path.parent)
        fs.put_file(str(build_one.fragment_files[(4, 0, 0)]), f"{bucket}/ds/{relative}")
        readahead._READ_AHEAD._recent.clear()  # (the same walk again, as a fresh process does it: read ahead again)
        ahead = readahead.stats()
        with pytest.warns(CFAWarning, match=r"changed since the chunk index.*fragment \(4, 0, 0\)"):
            got = x[:, 17, 23].compute()
        spent = started_since(ahead)
        assert spent["started"] >= n // 2
        if scheduler == "synchronous":  # (fragment 4 was fetched ahead, and refused: If-Match)
            assert spent["started"] - spent["used"] == 1
    assert_matches(got, changed[:, 17, 23])


def test_a_fragment_deleted_after_indexing_is_named_also_when_read_ahead(tmp_path, counted_s3):
    """The GETs fetched ahead fail (404): the read fetches again itself and fails naming the
    file, variable and fragment; with missing="fill" it reads as missing data."""
    server, _ = counted_s3
    n = 8
    truth = make_truth((n, 6, 8), "f4", seed=13)
    built = build("CF-1.13", tmp_path / "ds", truth, DIMS, ((1,) * n, (6,), (8,)),
                  frags=lambda i: Frag(storage={"zlib": True, "chunksizes": (1, 3, 4)}))
    bucket = server.new_bucket()
    fs = server.filesystem()
    fs.put(str(built.path.parent) + "/", f"{bucket}/ds/", recursive=True)
    url = f"s3://{bucket}/ds/{built.path.name}"
    daskcfa.index(url, storage_options=server.storage_options)
    relative = built.fragment_files[(5, 0, 0)].relative_to(built.path.parent)
    fs.rm_file(f"{bucket}/ds/{relative}")
    ahead = readahead.stats()
    with dask.config.set(scheduler="synchronous"):
        x = daskcfa.from_cfa(url, "tas", storage_options=server.storage_options)
        with pytest.raises(daskcfa.errors.MissingFragmentError) as caught:
            x[:, 2, 3].compute()
        assert readahead.stats()["started"] > ahead["started"]
        assert caught.value.fragment == (5, 0, 0) and caught.value.variable.endswith("tas")
        assert str(relative.name) in str(caught.value)
        x = daskcfa.from_cfa(url, "tas", storage_options=server.storage_options, missing="fill")
        with pytest.warns(CFAWarning, match=r"fragment \(5, 0, 0\) as missing data"):
            got = x[:, 2, 3].compute()
    expected = np.ma.masked_array(truth[:, 2, 3], mask=np.arange(n) == 5)
    assert_matches(got, expected)


def test_looking_for_a_chunk_index_on_s3_is_one_head_not_a_listing(tmp_path, counted_s3):
    """An aggregation without a chunk index is opened with one HEAD for the index, not a HEAD and
    a LIST of its prefix as a directory (s3fs's ``info`` after a 404): a round trip less before
    any fragment is read; with chunk_index=True its absence is still the error naming it."""
    server, metrics = counted_s3
    truth = make_truth((2, 6, 8), "f4", seed=14)
    built = build("CF-1.13", tmp_path / "ds", truth, DIMS, ((1, 1), (6,), (8,)))
    bucket = server.new_bucket()
    server.filesystem().put(str(built.path.parent) + "/", f"{bucket}/ds/", recursive=True)
    url = f"s3://{bucket}/ds/{built.path.name}"
    before = requests_by_type(metrics, bucket)
    x = daskcfa.from_cfa(url, "tas", storage_options=server.storage_options)
    spent = spent_since(before, metrics, bucket)
    assert not [kind for kind in spent if "list" in kind.lower()], spent
    assert_matches(x.compute(), truth)
    with pytest.raises(NotFoundError, match="no chunk index"):
        daskcfa.from_cfa(url, "tas", storage_options=server.storage_options, chunk_index=True)


def test_entries_keep_what_reads_learnt_in_their_process(built):
    """An entry's chunk lookup and last planned read are built where it is read, not pickled
    with the graph to workers."""
    import pickle

    from daskcfa.graph.read import AggregatedArray

    daskcfa.index(str(built.path))
    x = daskcfa.from_cfa(str(built.path), "tas", chunk_index=True)
    (array,) = [v for v in dict(x.__dask_graph__()).values() if isinstance(v, AggregatedArray)]
    entry = next(e for e in array.target.chunk_index._entries.values() if not e.contiguous)
    key = (slice(0, entry.layout.shape[0], 1), 1, 2)
    assert entry.chunk_ranges(key) and entry.chunk_infos
    copy = pickle.loads(pickle.dumps(entry))
    assert "chunk_infos" not in copy.__dict__ and "_planned" not in copy.__dict__
    assert copy.chunk_ranges(key) == entry.chunk_ranges(key)
    assert_matches(pickle.loads(pickle.dumps(x))[:, 1, 2].compute(), built.expected[:, 1, 2], rtol=1e-5)


def test_chunks_read_ahead_match_uneven_fragments_and_partial_walks(tmp_path, counted_s3):
    """Fragments of different lengths along the walk: each is read ahead at its own length, so a
    whole series is still one GET per fragment; a walk that stops early has fetched at most the
    read-ahead depth of fragments beyond it."""
    server, metrics = counted_s3
    sizes = (3, 1, 4, 2, 5, 1, 3, 2, 4, 1)
    n = len(sizes)
    truth = make_truth((sum(sizes), 20, 20), "f4", seed=11, masked=0.1)
    built = build("CF-1.13", tmp_path / "ds", truth, DIMS, (sizes, (20,), (20,)),
                  frags=lambda i: Frag(storage={"zlib": True, "chunksizes": (sizes[i[0]], 5, 5)}))
    bucket = server.new_bucket()
    server.filesystem().put(str(built.path.parent) + "/", f"{bucket}/ds/", recursive=True)
    url = f"s3://{bucket}/ds/{built.path.name}"
    daskcfa.index(url, storage_options=server.storage_options)
    x = daskcfa.from_cfa(url, "tas", storage_options=server.storage_options)
    with dask.config.set({"scheduler": "synchronous", "daskcfa.io.readahead": 3}):
        before, ahead = requests_by_type(metrics, bucket), readahead.stats()
        assert_matches(x[:, 7, 12].compute(), truth[:, 7, 12])
        assert spent_since(before, metrics, bucket) in one_get_each(n)
        assert readahead.stats()["used"] - ahead["used"] >= n // 2

        x = daskcfa.from_cfa(url, "tas", storage_options=server.storage_options)
        before = requests_by_type(metrics, bucket)
        assert_matches(x[:10, 3, 4].compute(), truth[:10, 3, 4])  # (fragments 0 to 3)
        gets = sum(spent_since(before, metrics, bucket).values())
        assert 4 <= gets <= 4 + 3


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------
def test_cli_index(built):
    here = {"PYTHONPATH": str(Path(daskcfa.__file__).parents[1])}  # (this checkout's daskcfa)
    done = subprocess.run([sys.executable, "-m", "daskcfa", "index", str(built.path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **here})
    assert done.returncode == 0, done.stderr
    assert f".{built.path.name}.chunks.json: 6 fragment(s)" in done.stdout
    assert index_file(built).exists()
    check_reads(str(built.path), built.expected, chunk_index=True)


# ---------------------------------------------------------------------------
# File identity: a fragment replaced in place with its size and time kept (cp -p,
# rsync -t, tar), a copied archive (cp -r)
# ---------------------------------------------------------------------------
def with_decoy(path: Path, values: np.ndarray, first: str) -> Path:
    """A netCDF-4 fragment file at ``path`` holding ``tas`` (``values``) and a decoy variable of
    the same shape and type, ``first`` written first: the same size either way, but each variable's
    bytes lie where the other's lay."""
    import netCDF4

    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(path, "w") as nc:
        for name, n in zip(DIMS, values.shape):
            nc.createDimension(name, n)
        for name in (first, "decoy" if first == "tas" else "tas"):
            var = nc.createVariable(name, "f4", DIMS, fill_value=False)  # (contiguous)
            var.units = "K"
            var[...] = values if name == "tas" else values + 1000
    return path


def copy_keeping_times(source: Path, target: Path) -> None:
    """``cp -p source target`` onto an existing file: its bytes rewritten in place (the same
    inode), then its times set back to the old ones."""
    before = os.stat(target)
    shutil.copyfile(source, target)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(target)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)


@pytest.fixture
def decoyed(tmp_path):
    """Six fragments with a decoy variable each (tas first), indexed; and a same-size
    replacement (decoy first) for fragment (1, 0, 1) holding other values."""
    truth = make_truth(SHAPE, "f4", seed=21, masked=0.0)
    built = build("CF-1.13", tmp_path / "ds", truth, DIMS, SIZES)
    for index, path in built.fragment_files.items():
        where = tuple(slice(sum(r[:i]), sum(r[:i + 1])) for r, i in zip(SIZES, index))
        with_decoy(path, np.ma.getdata(truth[where]), "tas")
    daskcfa.index(str(built.path))
    expected = truth.copy()
    expected[2:4, :, 5:10] = -np.ma.getdata(truth[2:4, :, 5:10]) - 5
    new = with_decoy(tmp_path / "new" / "f.nc", np.ma.getdata(expected[2:4, :, 5:10]), "decoy")
    assert new.stat().st_size == built.fragment_files[(1, 0, 1)].stat().st_size
    time.sleep(0.02)  # (the change time moves on with the kernel's clock)
    return built, new, expected


def stale_warnings(caught):
    return [w for w in caught if issubclass(w.category, CFAWarning) and "chunk index" in str(w.message)]


def test_a_fragment_replaced_with_its_size_and_time_kept_is_read_as_the_new_file(decoyed):
    built, new, expected = decoyed
    copy_keeping_times(new, built.fragment_files[(1, 0, 1)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = daskcfa.from_cfa(str(built.path), "tas")
        got, point = x.compute(), x[:, 1, 6].compute()
    assert_matches(got, expected)
    assert_matches(point, expected[:, 1, 6])
    stale = stale_warnings(caught)
    assert len(stale) == 1, [str(w.message) for w in stale]
    assert re.search(r"stale.*changed since the chunk index was written.*fragment \(1, 0, 1\)", str(stale[0].message))


def test_a_cached_fragment_file_replaced_with_its_size_and_time_kept_is_opened_again(decoyed):
    """The fragment file manager's handles are keyed on the same identity as the index."""
    built, new, expected = decoyed
    x = daskcfa.from_cfa(str(built.path), "tas", chunk_index=False)
    assert_matches(x.compute(), built.expected)  # (the handle now cached)
    copy_keeping_times(new, built.fragment_files[(1, 0, 1)])
    assert_matches(x.compute(), expected)
    assert_matches(x[:, 1, 6].compute(), expected[:, 1, 6])


def test_verify_reports_a_stale_index_entry_and_indexing_again_clears_it(decoyed, capsys):
    from daskcfa.cli import main

    built, new, expected = decoyed
    assert daskcfa.verify(str(built.path)).ok
    copy_keeping_times(new, built.fragment_files[(1, 0, 1)])
    report = daskcfa.verify(str(built.path))
    assert [(p.kind, p.index) for p in report.problems] == [("stale-index", (1, 0, 1))]
    assert "write the index again" in report.problems[0].message
    assert main(["verify", str(built.path)]) == 1
    assert "stale-index" in capsys.readouterr().out
    daskcfa.index(str(built.path))
    assert daskcfa.verify(str(built.path)).ok
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = daskcfa.from_cfa(str(built.path), "tas").compute()
    assert_matches(got, expected)
    assert stale_warnings(caught) == []


def test_a_copied_archive_warns_once_and_reads_correctly(tmp_path):
    n = 50
    truth = make_truth((n, 4, 5), "f4", seed=22, masked=0.1)
    built = build("CF-1.13", tmp_path / "ds", truth, DIMS, ((1,) * n, (4,), (5,)),
                  frags=lambda i: Frag(storage={"zlib": True, "chunksizes": (1, 2, 5)}))
    daskcfa.index(str(built.path))
    subprocess.run(["cp", "-r", str(built.path.parent), str(tmp_path / "copy")], check=True, timeout=60)
    copied = tmp_path / "copy" / built.path.name
    assert (tmp_path / "copy" / index_file(built).name).exists()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = daskcfa.from_cfa(str(copied), "tas")
        got = x.compute()
    assert_matches(got, built.expected)
    assert len(stale_warnings(caught)) == 1, len(stale_warnings(caught))
    assert len(daskcfa.verify(str(copied)).problems) == n


def test_objects_replaced_on_s3_warn_once_and_read_the_new_bytes(decoyed, s3_server, s3_bucket):
    built, new, expected = decoyed
    fs = s3_server.filesystem()
    base = upload(fs, built.path.parent, s3_bucket, "ds")
    url = f"{base}/{built.path.name}"
    options = s3_server.storage_options
    daskcfa.index(url, storage_options=options)
    replacement = truth_with(expected, built, (1, 0, 0), new.parent / "g.nc")
    for index, source in (((1, 0, 1), new), ((1, 0, 0), replacement)):
        relative = built.fragment_files[index].relative_to(built.path.parent).as_posix()
        assert fs.info(f"{s3_bucket}/ds/{relative}")["size"] == source.stat().st_size
        fs.put(str(source), f"{s3_bucket}/ds/{relative}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        got, point = x.compute(), x[:, 1, 2:8].compute()
    assert_matches(got, expected)
    assert_matches(point, expected[:, 1, 2:8])
    assert len(stale_warnings(caught)) == 1
    report = daskcfa.verify(url, storage_options=options)
    assert sorted(p.index for p in report.problems if p.kind == "stale-index") == [(1, 0, 0), (1, 0, 1)]


def truth_with(expected, built, index, path):
    """Fragment ``index`` of ``expected`` changed again, written decoy first at ``path``."""
    where = tuple(slice(sum(r[:i]), sum(r[:i + 1])) for r, i in zip(SIZES, index))
    expected[where] = np.ma.getdata(expected[where]) * 3 + 1
    return with_decoy(path, np.ma.getdata(expected[where]), "decoy")


def test_an_index_written_on_disk_and_served_over_http_warns_once(built, make_http_server):
    """Served over HTTP, the fragments' versions are the server's ETags, not the files' identities
    the index holds: every entry is stale, and the dataset still reads correctly, with one warning."""
    daskcfa.index(str(built.path))
    server = make_http_server(built.path.parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = daskcfa.from_cfa(server.url_for(built.path.name), "tas")
        got, point = x.compute(), x[:, 1, 6].compute()
    assert_matches(got, built.expected, rtol=1e-5)
    assert_matches(point, built.expected[:, 1, 6], rtol=1e-5)
    assert len(stale_warnings(caught)) == 1


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's per-process I/O counters")
def test_a_point_read_through_the_index_reads_only_the_head_of_a_local_chunk(tmp_path):
    # One fragment in one deflated chunk of 2 MB of poorly compressible values: a point a tenth of the
    # way into it needs about a tenth of the stream, and only that much (and a margin) is read
    # (with the index: no HDF5 metadata read either).
    built = build("CF-1.13", tmp_path / "ds", make_truth((1, 500, 1000), "f4", seed=5), DIMS, ((1,), (500,), (1000,)),
                  frags=lambda index: Frag(storage={"zlib": True, "shuffle": False, "chunksizes": (1, 500, 1000)}))
    daskcfa.index(str(built.path))
    x = daskcfa.from_cfa(str(built.path), "tas", chunk_index=True)
    before = bytes_read()
    assert x[0, 50, 500].compute(scheduler="sync") == built.expected[0, 50, 500]
    assert bytes_read() - before < 0.3 * 4 * 500 * 1000
