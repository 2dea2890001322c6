"""The read graph: one task per fragment, lazy opening, slice pushdown.

What is read is measured with the kernel's own counter of bytes this process
read (``rchar`` in /proc/self/io, page-cache hits included), so the tests see
real I/O, whatever engine reads the fragments.
"""

from __future__ import annotations

import json
import math
import os
import threading

import dask
import numpy as np
import pytest

import daskcfa
from builders import Frag, assert_matches, build_cf113, make_truth, write_strings
from read_helpers import SHAPE, SIZES, bytes_read, chunked_archive, fragment_bytes

pytestmark = pytest.mark.usefixtures("other_cwd")


@pytest.fixture(params=["direct", "netcdf4"])
def engine(request):
    with dask.config.set({"daskcfa.io.engine": request.param}):
        yield request.param


def test_one_task_per_fragment(tmp_path):
    built = chunked_archive(tmp_path)
    x = daskcfa.from_cfa(str(built.path))
    assert x.chunks == SIZES
    graph = dict(x.__dask_graph__())
    # one task per chunk plus the one node holding the lazily indexed array
    assert len(graph) == 4 + 1


def test_point_series_reads_a_small_part_of_each_fragment(tmp_path):
    # The default (direct) engine; netCDF-C itself reads the first 4 MiB of every
    # file it opens, so through netCDF4-python small fragments are read whole.
    built = chunked_archive(tmp_path)
    x = daskcfa.from_cfa(str(built.path))[:, 5, 7]
    daskcfa.from_cfa(str(built.path))[0, 0, 0].compute(scheduler="sync")  # warm-up: imports read files too
    before = bytes_read()
    got = x.compute(scheduler="sync")
    used = bytes_read() - before
    assert_matches(got, built.expected[:, 5, 7])
    total = fragment_bytes(built)
    assert used < total / 4, f"a point series read {used} of {total} fragment bytes"


def test_full_read_reads_everything_once(tmp_path, engine):
    built = chunked_archive(tmp_path)
    x = daskcfa.from_cfa(str(built.path))
    x[0, 0, 0].compute(scheduler="sync")  # warm-up: imports read files too
    before = bytes_read()
    got = x.compute(scheduler="sync")
    used = bytes_read() - before
    assert_matches(got, built.expected)
    total = fragment_bytes(built)
    assert 0.5 * total < used < 3 * total


def test_only_the_needed_fragments_are_opened(tmp_path):
    built = chunked_archive(tmp_path)
    x = daskcfa.from_cfa(str(built.path))
    for index, path in built.fragment_files.items():
        if index[0] != 1:  # keep only the fragment holding times 2-3
            os.remove(path)
    assert_matches(x[2:4, 10:20, 5].compute(), built.expected[2:4, 10:20, 5])
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x[0, 0, 0].compute()
    assert info.value.fragment == (0, 0, 0)


def test_opening_touches_no_fragment(tmp_path):
    built = chunked_archive(tmp_path)
    for path in built.fragment_files.values():
        os.chmod(path, 0)  # unreadable: any open would fail
    try:
        x = daskcfa.from_cfa(str(built.path))
        with daskcfa.open_cfa(str(built.path)) as ds:
            assert ds["tas"].fragments.shape == (4, 1, 1)
        assert x.shape == SHAPE
    finally:
        for path in built.fragment_files.values():
            os.chmod(path, 0o644)


def test_merged_chunks_read_several_fragments_per_task(tmp_path):
    built = chunked_archive(tmp_path)
    x = daskcfa.from_cfa(str(built.path), chunks=2 * 2 * 200 * 160 * 4)
    assert x.chunks == ((4, 4), (200,), (160,))
    assert_matches(x.compute(), built.expected)
    assert_matches(x[1:6:2, 3, ::-7].compute(), built.expected[1:6:2, 3, ::-7])


def test_a_fragment_read_is_a_masked_array_only_where_something_is_masked(tmp_path):
    """A fragment read makes no masked array that its caller only takes apart (nothing masked: a plain
    array); what users get is as before: masked arrays, nothing masked (nomask) or the missing points."""
    from daskcfa.fragments.canonical import read_fragment
    from daskcfa.graph.read import AggregatedArray

    truth = make_truth((4, 3, 5), "f4", seed=5)
    truth[3, 1, 2] = np.ma.masked
    # (missing_value in the fragments, _FillValue in the aggregation: each fragment masks its own values)
    built = build_cf113(tmp_path, truth, ("time", "lat", "lon"), ((2, 2), (3,), (5,)),
                        frags=lambda index: Frag(missing="missing_value", format="NETCDF3_CLASSIC"))
    x = daskcfa.from_cfa(str(built.path))
    (array,) = [v for v in dict(x.__dask_graph__()).values() if isinstance(v, AggregatedArray)]
    key = (slice(0, 2, 1), slice(0, 3, 1), slice(0, 5, 1))
    clean = read_fragment(array.variable.fragments[(0, 0, 0)], key, array.target)
    holed = read_fragment(array.variable.fragments[(1, 0, 0)], key, array.target)
    assert type(clean) is np.ndarray
    assert isinstance(holed, np.ma.MaskedArray) and holed.mask[1, 1, 2] and holed.mask.sum() == 1
    blocks = [x.blocks[i].compute(scheduler="sync") for i in range(2)]
    assert [type(b) for b in blocks] == [np.ma.MaskedArray] * 2
    assert blocks[0].mask is np.ma.nomask
    assert_matches(np.ma.concatenate(blocks), truth)
    assert_matches(x.compute(scheduler="sync"), truth)


def test_token_is_deterministic_and_tracks_the_file(tmp_path):
    built = chunked_archive(tmp_path)
    a = daskcfa.from_cfa(str(built.path))
    b = daskcfa.from_cfa(str(built.path))
    assert a.name == b.name
    assert daskcfa.from_cfa(str(built.path), mask=False).name != a.name
    stat = os.stat(built.path)
    os.utime(built.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert daskcfa.from_cfa(str(built.path)).name != a.name


def test_threads_share_the_netcdf_library_safely(tmp_path, engine):
    built = build_cf113(tmp_path, make_truth((16, 30, 40), "f8", seed=5), ("time", "lat", "lon"),
                        ((1,) * 16, (30,), (40,)), frags=lambda index: Frag(format="NETCDF3_CLASSIC"))
    x = daskcfa.from_cfa(str(built.path))
    results = []

    def work():
        results.append(x.mean(axis=(1, 2)).compute(scheduler="threads", num_workers=4))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = built.expected.mean(axis=(1, 2))
    assert len(results) == 4
    for r in results:
        np.testing.assert_allclose(r, expected, rtol=1e-12)


def write_reference_set_aggregation(directory, length: int, chunk: int, stored: np.ndarray) -> str:
    """A CFA-0.6.2 aggregation of one fragment: a JSON reference set of ``x(t)``, ``length`` long in
    chunks of ``chunk`` (as a hostile set may declare), whose first chunk holds ``stored`` inline."""
    import netCDF4

    zarray = {"shape": [length], "chunks": [chunk], "dtype": "<f4", "compressor": None, "fill_value": None,
              "filters": None, "order": "C", "zarr_format": 2}
    refs = {"version": 1, "refs": {".zgroup": json.dumps({"zarr_format": 2}), "x/.zarray": json.dumps(zarray),
                                   "x/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["t"]}),
                                   "x/0": "base64:" + __import__("base64").b64encode(stored.tobytes()).decode()}}
    (directory / "refs.json").write_text(json.dumps(refs))
    path = directory / "agg.nc"
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.11 CFA-0.6.2"
        for name, n in (("t", length), ("f_t", 1), ("i", 1), ("j", 1)):
            ds.createDimension(name, n)
        ds.createVariable("cfa_location", "i8", ("i", "j"))[...] = [[length]]
        write_strings(ds, "cfa_file", ("f_t",), np.array(["refs.json"], dtype=object))
        write_strings(ds, "cfa_address", ("f_t",), np.array(["x"], dtype=object))
        write_strings(ds, "cfa_format", (), "nc")
        var = ds.createVariable("x", "f4", ())
        var.aggregated_dimensions = "t"
        var.aggregated_data = "location: cfa_location file: cfa_file format: cfa_format address: cfa_address"
    return str(path)


def test_many_reference_sets_are_each_cut_by_their_own_chunk_grid(tmp_path):
    """40 reference-set fragments, their metadata read side by side when the graph is built: each
    fragment's chunk is cut by its own set's chunk grid (3 or 4 long: a set matched with another's grid
    shows), and every value comes back where it belongs."""
    import base64

    import netCDF4

    n, length = 40, 12
    chunk_of = {k: (3 if k % 7 else 4) for k in range(n)}
    for k in range(n):
        values = np.arange(k * length, (k + 1) * length, dtype="<f4")
        c = chunk_of[k]
        zarray = {"shape": [length], "chunks": [c], "dtype": "<f4", "compressor": None, "fill_value": None,
                  "filters": None, "order": "C", "zarr_format": 2}
        refs = {".zgroup": json.dumps({"zarr_format": 2}), "x/.zarray": json.dumps(zarray),
                "x/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["t"]})}
        for i in range(length // c):
            refs[f"x/{i}"] = "base64:" + base64.b64encode(values[i * c:(i + 1) * c].tobytes()).decode()
        (tmp_path / f"r{k}.json").write_text(json.dumps({"version": 1, "refs": refs}))
    path = tmp_path / "agg.nc"
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.11 CFA-0.6.2"
        for name, size in (("t", n * length), ("f_t", n), ("i", 1), ("j", n)):
            ds.createDimension(name, size)
        ds.createVariable("cfa_location", "i8", ("i", "j"))[...] = [[length] * n]
        write_strings(ds, "cfa_file", ("f_t",), np.array([f"r{k}.json" for k in range(n)], dtype=object))
        write_strings(ds, "cfa_address", ("f_t",), np.array(["x"] * n, dtype=object))
        write_strings(ds, "cfa_format", (), "nc")
        var = ds.createVariable("x", "f4", ())
        var.aggregated_dimensions = "t"
        var.aggregated_data = "location: cfa_location file: cfa_file format: cfa_format address: cfa_address"
    x = daskcfa.from_cfa(str(path), "x")
    assert x.chunks == (sum(((chunk_of[k],) * (length // chunk_of[k]) for k in range(n)), ()),)
    np.testing.assert_array_equal(x.compute(), np.arange(n * length, dtype="f4"))


def test_a_reference_set_of_a_trillion_chunks_is_cut_in_bounded_memory(tmp_path):
    """A reference set declaring 10**12 one-element chunks: dask chunks of whole multiples of them,
    counted without listing a trillion pieces (which was a bare MemoryError; 10**8 of them took
    1.8 GB and 21 s), and its first values read right."""
    stored = np.array([3.5, -1.0, 7.25], dtype="<f4")
    x = daskcfa.from_cfa(write_reference_set_aggregation(tmp_path, 10**12, len(stored), stored), "x")
    assert math.prod(x.numblocks) <= 100_000 and sum(x.chunks[0]) == 10**12
    np.testing.assert_array_equal(x[:3].compute(), stored)
