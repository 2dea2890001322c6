"""Small selections of many local fragments: a batch of fragments per task, the same values."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import daskcfa
from builders import Frag, assert_matches, build_cf113, make_truth

pytestmark = pytest.mark.usefixtures("other_cwd")

SHAPE = (48, 12, 10)
SIZES = ((1,) * 48, (6, 6), (10,))  # 96 fragments, 48 along time


@pytest.fixture
def archive(tmp_path):
    # zlib with HDF5 chunks (1, 3, 5), some points missing (_FillValue), fragment 5 wholly absent
    storage = {"zlib": True, "chunksizes": (1, 3, 5)}
    return build_cf113(tmp_path, make_truth(SHAPE, "f4", seed=7, masked=0.2), ("time", "lat", "lon"), SIZES,
                       frags=lambda index: Frag(storage=storage))


def _tasks(x) -> int:
    """Tasks computing ``x`` once dask has optimised its graph (slices fused into the reads)."""
    (optimised,) = dask.optimize(x)
    return sum(1 for key in dict(optimised.__dask_graph__()) if isinstance(key, tuple))


@pytest.mark.parametrize("key", [
    np.s_[:, 4, 7], np.s_[..., 11, 0], np.s_[3:40, 7, 2:4], np.s_[:, -1, -1], np.s_[5:6, 0, 0], np.s_[:, 2:9, 3],
    np.s_[-30:, 5, :], np.s_[:, 5:8, 2:4],
])
def test_small_selections_read_batches_of_fragments_with_the_same_values(archive, key):
    with dask.config.set(num_workers=1):
        x = daskcfa.from_cfa(str(archive.path))
        assert x.chunks == SIZES  # (the array's own chunks stay the fragments)
        got = x[key]
        one_each = daskcfa.from_cfa(str(archive.path), chunks=SIZES)[key]  # (explicit chunks: never batched)
    assert_matches(got.compute(), archive.expected[key])
    assert_matches(one_each.compute(), archive.expected[key])
    assert np.ma.getmaskarray(got.compute()).tolist() == np.ma.getmaskarray(archive.expected[key]).tolist()


def test_a_point_series_takes_fewer_tasks_than_fragments(archive):
    with dask.config.set(num_workers=1):
        series = daskcfa.from_cfa(str(archive.path))[:, 4, 7]
    assert series.numblocks == (48 // 3,)  # batches of 3 fragments: 48 // (16 tasks per thread)
    assert _tasks(series) < 48  # (one task per fragment: 48)
    assert_matches(series.compute(scheduler="threads"), archive.expected[:, 4, 7])


def test_large_selections_keep_one_task_per_fragment(archive):
    with dask.config.set(num_workers=1):
        x = daskcfa.from_cfa(str(archive.path))
    assert x[:, :, :].chunks == SIZES
    assert x[:, 0:6, 0:5].chunks[0] == (1,) * 48  # (half of each fragment)
    assert x[::2, 4, 7].chunks[0] == (1,) * 24  # (steps other than 1: as dask slices them)
    assert x[:, [1, 4], 7].chunks[0] == (1,) * 48


def test_a_selection_after_an_assignment_sees_the_assigned_values(archive):
    with dask.config.set(num_workers=1):
        x = daskcfa.from_cfa(str(archive.path))
        x[10:20] = -1.0  # (dask's in-place assignment: a new graph for x)
        series = x[:, 4, 7]
    expected = archive.expected[:, 4, 7].copy()
    expected[10:20] = -1.0
    assert_matches(series.compute(), expected)


@pytest.mark.parametrize(("threads", "per_task"), [(1, 20), (3, 6)])
def test_on_a_distributed_cluster_batches_are_sized_by_its_threads_and_larger(tmp_path, threads, per_task):
    """A task costs a distributed cluster milliseconds of CPU: batches of up to 32 fragments there (8 before),
    at least 16 tasks for each of the cluster's threads (before: the client's cores); the same values."""
    from distributed import Client, LocalCluster

    truth = make_truth((320, 4, 4), "f4", seed=11, masked=0.2)
    built = build_cf113(tmp_path, truth, ("time", "lat", "lon"), ((1,) * 320, (4,), (4,)))
    with LocalCluster(n_workers=1, threads_per_worker=threads, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster):
        series = daskcfa.from_cfa(str(built.path))[:, 2, 1]
        assert series.chunks[0] == (per_task,) * (320 // per_task) + ((320 % per_task,) if 320 % per_task else ())
        assert_matches(series.compute(), built.expected[:, 2, 1])
        with dask.config.set(scheduler="threads", num_workers=1):  # (another scheduler chosen: its rule)
            assert daskcfa.from_cfa(str(built.path))[:, 2, 1].numblocks == (320 // 8,)
    with dask.config.set(num_workers=1):  # (the client gone: the threaded scheduler's rule again)
        assert daskcfa.from_cfa(str(built.path))[:, 2, 1].numblocks == (320 // 8,)


def test_a_point_series_over_small_s3_objects_reads_batches_fetched_ahead(archive, s3_server, s3_bucket, s3fs_fs):
    """Small remote objects fetched whole are batched too where the batch's task reads its next objects
    ahead (1,000 tasks, one a fragment, cost the S3 point series 15-25% more CPU): the same values and masks,
    most objects handed over by read-ahead, no more started ahead than there are objects; with read-ahead
    off, or on a distributed cluster, one task per fragment."""
    from remote_helpers import upload

    from daskcfa.fragments import readahead

    base = upload(s3fs_fs, archive.path.parent, s3_bucket, "batched")
    url = f"{base}/{archive.path.name}"
    with dask.config.set(num_workers=1):
        series = daskcfa.from_cfa(url, storage_options=s3_server.storage_options)[:, 4, 7]
        with dask.config.set({"daskcfa.io.readahead": 0}):  # (nothing read ahead: a batch's GETs one by one)
            unbatched = daskcfa.from_cfa(url, storage_options=s3_server.storage_options)[:, 4, 7]
    assert series.numblocks == (48 // 3,)  # (one task per fragment: 48)
    assert unbatched.numblocks == (48,)
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):  # (a distributed default client: its workers read nothing ahead)
        assert daskcfa.from_cfa(url, storage_options=s3_server.storage_options)[:, 4, 7].numblocks == (48,)
    before = readahead.stats()
    got = series.compute(scheduler="threads")
    used = {k: v - before[k] for k, v in readahead.stats().items()}
    assert_matches(got, archive.expected[:, 4, 7])
    assert np.ma.getmaskarray(got).tolist() == np.ma.getmaskarray(archive.expected[:, 4, 7]).tolist()
    # (47 objects: fragment 5 is absent; the first of each batch is fetched by its own task)
    assert 47 - 16 <= used["used"] <= used["started"] <= 47
    assert_matches(unbatched.compute(scheduler="threads"), archive.expected[:, 4, 7])


def test_a_damaged_or_missing_s3_object_mid_batch_is_named(archive, s3_server, s3_bucket, s3fs_fs):
    """A batch of small S3 objects read ahead: an object damaged, then deleted, in the middle of a batch
    (not its first, which its task fetches itself) is named by the error, with its variable and file."""
    from remote_helpers import upload

    base = upload(s3fs_fs, archive.path.parent, s3_bucket, "damaged")
    name = archive.fragment_uris[(22, 0, 0)][0].rsplit("/", 1)[-1]
    victim = f"{base}/{archive.fragment_uris[(22, 0, 0)][0]}".removeprefix("s3://")
    assert s3fs_fs.exists(victim)
    with dask.config.set(num_workers=1):
        series = daskcfa.from_cfa(f"{base}/{archive.path.name}", storage_options=s3_server.storage_options)[:, 4, 7]
    assert series.chunks[0][:8] == (3,) * 8  # (fragments 21-23: one batch)
    s3fs_fs.pipe_file(victim, s3fs_fs.cat_file(victim)[:100])
    with pytest.raises(daskcfa.FragmentReadError) as damaged:
        series.compute(scheduler="threads")
    s3fs_fs.rm_file(victim)
    with pytest.raises(daskcfa.MissingFragmentError) as missing:
        series.compute(scheduler="threads")
    for info in (damaged, missing):
        assert info.value.fragment == (22, 0, 0) and info.value.file.endswith(name)
        assert info.value.variable is not None and s3_server.secret not in str(info.value)
