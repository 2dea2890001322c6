"""Read-ahead of byte ranges (``daskcfa.fragments.readahead.read_ahead_ranges`` / ``take_range``), on the
S3 test server: each range fetched ahead by one GET carrying the version check, handed once to its read,
never for an object that changed, never more in flight than the depth allows, not again once read.
(Whole-object read-ahead along walks: tests/storage/test_remote_read.py; indexed walks and their GETs:
tests/test_index_writer.py.)"""

from __future__ import annotations

import dask
import numpy as np
import pytest

from daskcfa import storage
from daskcfa.fragments import readahead

DATA = np.random.default_rng(5).integers(0, 256, 1 << 16, dtype=np.uint8).tobytes()
RANGES = [(0, 10), (100, 20), (5000, 300), (40000, 1000), (65000, 536)]


@pytest.fixture
def placed(s3_server, s3_bucket, s3fs_fs):
    """An object on S3: its URI, the version ``(size, ETag)`` storage.stat gives, and the profile to read it."""
    uri = f"s3://{s3_bucket}/object.bin"
    s3fs_fs.pipe_file(uri.removeprefix("s3://"), DATA)
    profile = storage.register(s3_server.storage_options, protocol="s3")
    return uri, storage.stat(uri, profile), profile


def started_since(before):
    return {k: v - before[k] for k, v in readahead.stats().items()}


def test_ranges_read_ahead_are_taken_once_and_not_fetched_again(placed):
    uri, version, profile = placed
    before = readahead.stats()
    with dask.config.set({"daskcfa.io.readahead": 8}):
        readahead.read_ahead_ranges([(uri, version, RANGES)], profile)
        assert started_since(before)["started"] == len(RANGES)
        for offset, length in RANGES:
            assert readahead.take_range(uri, offset, length, version[1], profile) == DATA[offset:offset + length]
        assert started_since(before)["used"] == len(RANGES)
        readahead.read_ahead_ranges([(uri, version, RANGES)], profile)  # (just read: not again)
        assert started_since(before)["started"] == len(RANGES)
        assert readahead.take_range(uri, *RANGES[0], version[1], profile) is None  # (handed out once)
        # ... and a range read twice starts the walk again: the others are read ahead anew
        readahead.read_ahead_ranges([(uri, version, RANGES)], profile)
    assert started_since(before)["started"] == 2 * len(RANGES) - 1


def test_a_range_of_another_version_or_credentials_is_not_handed_out(placed, s3_server):
    uri, version, profile = placed
    with dask.config.set({"daskcfa.io.readahead": 8}):
        readahead.read_ahead_ranges([(uri, version, RANGES[:1])], profile)
        assert readahead.take_range(uri, *RANGES[0], '"another"', profile) is None
        assert readahead.take_range(uri, *RANGES[0], version[1], storage.NO_PROFILE) is None
        assert readahead.take_range(uri, *RANGES[0], version[1], profile) == DATA[:10]


def test_an_object_changed_since_its_version_is_refused_ahead(placed, s3fs_fs):
    """If-Match rides on every GET fetched ahead: nothing of another version is handed out, and
    the read's own fetch finds the change out (storage.read_ranges_unchanged gives None)."""
    uri, version, profile = placed
    s3fs_fs.pipe_file(uri.removeprefix("s3://"), DATA[::-1])
    before = readahead.stats()
    with dask.config.set({"daskcfa.io.readahead": 8}):
        readahead.read_ahead_ranges([(uri, version, RANGES)], profile)
        assert started_since(before)["started"] == len(RANGES)
        assert [readahead.take_range(uri, o, n, version[1], profile) for o, n in RANGES] == [None] * len(RANGES)
    assert started_since(before)["used"] == 0
    assert storage.read_ranges_unchanged(uri, RANGES, version, profile) is None


@pytest.mark.parametrize("depth, ahead_bytes, started", [(2, 32 << 20, 2), (8, 2000, 2), (8, 100, 2), (8, 1, 0),
                                                         (0, 32 << 20, 0)])
def test_ranges_in_flight_are_bounded(placed, monkeypatch, depth, ahead_bytes, started):
    """At most the depth of ranges in flight, and no more than ``_AHEAD_BYTES`` of them (none larger)."""
    uri, version, profile = placed
    monkeypatch.setattr(readahead, "_AHEAD_BYTES", ahead_bytes)
    before = readahead.stats()
    with dask.config.set({"daskcfa.io.readahead": depth}):
        readahead.read_ahead_ranges([(uri, version, RANGES)], profile)
    assert started_since(before)["started"] == started
    for offset, length in RANGES:  # (what was fetched ahead is taken, the rest is not there)
        got = readahead.take_range(uri, offset, length, version[1], profile)
        assert got is None or got == DATA[offset:offset + length]


def test_no_ranges_read_ahead_without_a_version_check_on_the_get(tmp_path, placed):
    """Local files (read by pread, checked on the open descriptor) and versions without an ETag
    (the check would need its own request) are left to their reads."""
    uri, (size, _), profile = placed
    local = tmp_path / "object.bin"
    local.write_bytes(DATA)
    before = readahead.stats()
    with dask.config.set({"daskcfa.io.readahead": 8}):
        readahead.read_ahead_ranges([(str(local), storage.stat(str(local)), RANGES)], storage.NO_PROFILE)
        readahead.read_ahead_ranges([(uri, (size, "1700000000.0"), RANGES)], profile)
    assert started_since(before)["started"] == 0


@pytest.mark.parametrize("threads, memory, started", [(2, "512MiB", 4), (1, "512MiB", 2), (3, "512MiB", 6),
                                                      (2, 3 * 8 * 1000, 3), (2, 8 * 1000, 2)])
def test_whole_objects_in_flight_keep_every_thread_fed(s3_server, s3_bucket, s3fs_fs, monkeypatch, threads, memory,
                                                       started):
    """Whole objects fetched ahead: two per dask thread at least (one received while the thread decodes
    another), within an eighth of the memory budget; never fewer than ``_AHEAD_BYTES`` allow (here two)."""
    uris = [f"s3://{s3_bucket}/whole-{k}.bin" for k in range(8)]
    for uri in uris:
        s3fs_fs.pipe_file(uri.removeprefix("s3://"), DATA[:1000])
    profile = storage.register(s3_server.storage_options, protocol="s3")
    monkeypatch.setattr(readahead, "_AHEAD_BYTES", 2000)
    before = readahead.stats()
    with dask.config.set({"daskcfa.io.readahead": 8, "num_workers": threads, "daskcfa.budget.memory": memory}):
        readahead.read_ahead(uris, profile, nbytes=1000)
    assert started_since(before)["started"] == started
    for uri in uris:  # (what was fetched ahead is handed out whole, once)
        got = readahead.take(uri, profile)
        assert got is None or got.tobytes() == DATA[:1000]
