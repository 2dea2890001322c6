"""Attacks on session 15's new doors (attack15c): small remote objects read in batches when the
aggregation's FIRST fragment is one (``graph/batched.py``, ``graph/read.py fetched_whole_ahead``),
large S3 objects by the lean signed GET, and the direct HDF5 reader's final errors. Real files, the
real SeaweedFS server, real dask. Results reported in docs/reliability.md (attack15c)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import dask
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import Frag, assert_matches, build_cf113, make_truth
from remote_helpers import rewrite_uris, upload

from .test_hdf5_meta_attacks import _blocks, _messages, _seal

pytestmark = pytest.mark.usefixtures("other_cwd")

SHAPE = (48, 12, 10)
SIZES = ((1,) * 48, (6, 6), (10,))


def _mixed(tmp_path: Path, s3fs_fs, bucket: str, remote: set[int]):
    """An aggregation of 96 fragments (48 along time) whose fragments at time ``remote`` are small S3
    objects and the others local files (absolute URIs): the first fragment's kind decides batching."""
    built = build_cf113(tmp_path / "ds", make_truth(SHAPE, "f4", seed=11, masked=0.2), ("time", "lat", "lon"),
                        SIZES, frags=lambda index: Frag(storage={"zlib": True, "chunksizes": (1, 3, 5)}))
    base = upload(s3fs_fs, built.path.parent, bucket, "mixed")
    names = {uri: index for index, (uri, *_) in built.fragment_uris.items()}

    def change(uri: str) -> str:
        index = names.get(uri)
        if index is not None and index[0] in remote:
            return f"{base}/{uri}"
        return str((built.path.parent / uri).resolve())

    rewrite_uris(built.path, built.names["uris"], change)
    return built


KEYS = [np.s_[:, 4, 7], np.s_[..., 11, 0], np.s_[3:40, 7, 2:4], np.s_[:, -1, -1], np.s_[5:6, 0, 0],
        np.s_[:, 2:9, 3], np.s_[-30:, 5, :], np.s_[[0, 5, 47], 1, 1], np.s_[::-1, 3, 3], np.s_[::5, 6, 9],
        np.s_[np.arange(48) % 2 == 0, 2, 2], np.s_[:, None, 4, 4], np.s_[np.int64(3), 4, :]]


@pytest.mark.parametrize("remote", [{0}, {0, 1, 2}, set(range(0, 48, 2))], ids=["first", "first3", "even"])
def test_first_fragment_small_s3_object_others_local_files(tmp_path, s3_server, s3_bucket, s3fs_fs, remote):
    """Batching is decided on the first fragment only: small S3 objects first, local files after."""
    built = _mixed(tmp_path, s3fs_fs, s3_bucket, remote)
    with dask.config.set(num_workers=1):
        x = daskcfa.from_cfa(str(built.path), storage_options=s3_server.storage_options)
        for key in KEYS:
            got = x[key].compute(scheduler="threads")
            want = built.expected[key]
            assert_matches(got, want)
            assert np.ma.getmaskarray(got).tolist() == np.ma.getmaskarray(want).tolist(), key


def test_mixed_batches_are_batched(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """(The attack above reaches batching: a point series over the mixed aggregation is read in batches.)"""
    built = _mixed(tmp_path, s3fs_fs, s3_bucket, {0})
    with dask.config.set(num_workers=1):
        assert daskcfa.from_cfa(str(built.path), storage_options=s3_server.storage_options)[:, 4, 7].numblocks[0] < 48


def test_a_missing_local_fragment_mid_batch_after_an_s3_first(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """A local fragment deleted in a batch led by S3 objects: ``missing="fill"`` masks it, the default
    names it (file, variable, fragment)."""
    built = _mixed(tmp_path, s3fs_fs, s3_bucket, {0, 1})
    victim = built.fragment_files[(22, 0, 0)]
    victim.unlink()
    want = built.expected[:, 4, 7].copy()
    want[22] = np.ma.masked
    with dask.config.set(num_workers=1):
        filled = daskcfa.from_cfa(str(built.path), storage_options=s3_server.storage_options, missing="fill")
        got = filled[:, 4, 7].compute(scheduler="threads")
        assert np.ma.getmaskarray(got).tolist() == np.ma.getmaskarray(want).tolist()
        assert_matches(got, want)
        with pytest.raises(daskcfa.MissingFragmentError) as info:
            daskcfa.from_cfa(str(built.path), storage_options=s3_server.storage_options)[:, 4, 7].compute(
                scheduler="threads")
    assert info.value.fragment == (22, 0, 0) and info.value.file.endswith(victim.name), info.value


def test_local_fragments_disallowed_after_an_allowed_s3_first(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """``allowed_locations`` naming the bucket only: the local fragments a batch reads are refused, named."""
    built = _mixed(tmp_path, s3fs_fs, s3_bucket, {0})
    with dask.config.set(num_workers=1):
        x = daskcfa.from_cfa(str(built.path), storage_options=s3_server.storage_options,
                             allowed_locations=[f"s3://{s3_bucket}/"])
        with pytest.raises(daskcfa.CFAError) as info:
            x[:, 4, 7].compute(scheduler="threads")
    assert info.value.fragment is not None and info.value.fragment[0] >= 1, info.value
    assert "s3" not in type(info.value).__name__.lower()


# -- the direct HDF5 reader: a chunk B-tree whose inner nodes are shared ----------------------------------


def _shared_inner_nodes(path: Path, n: int, levels: int) -> bytes:
    """A netCDF-4 file at ``path`` whose variable ``w`` (``n`` chunks of one value) has its chunk B-tree
    replaced by ``levels`` nodes appended to the file, each of 64 entries all pointing to the node below:
    about 13 KB of nodes that HDF5's walk of the index (h5py's ``chunk_iter``) follows 64**levels times."""
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("n", n)
        nc.createVariable("w", "i4", ("n",), chunksizes=(1,))[:] = np.arange(n)
    data = path.read_bytes()
    layout = next(m for m in _messages(data, 0x08) if data[m.body + 1] == 2)
    tree = struct.unpack_from("<Q", data, layout.body + 3)[0]
    first_key = data[tree + 24:tree + 48]  # (1-D: size, filter mask, two offsets)
    child, patched = struct.unpack_from("<Q", data, tree + 48)[0], bytearray(data)
    for level in range(data[tree + 5], data[tree + 5] + levels):
        node = b"TREE" + bytes([1, level]) + struct.pack("<HQQ", 64, 2**64 - 1, 2**64 - 1)
        node += (first_key + struct.pack("<Q", child)) * 64 + first_key
        child = len(patched)
        patched += node
    struct.pack_into("<Q", patched, layout.body + 3, child)
    struct.pack_into("<Q", patched, 28, len(patched))  # (the end of allocation past the new nodes)
    return _seal(patched, _blocks(data))


@pytest.mark.parametrize("n, levels", [(64, 5), (100, 4)], ids=["walked", "checked"])
def test_a_chunk_btree_of_shared_inner_nodes_is_refused_not_walked_for_ever(tmp_path, n, levels):
    """A 17-23 KB fragment whose chunk index shares its inner nodes level after level: h5py's walk
    (a whole read) visited 64**levels leaves (hours of CPU; netCDF4-python reads it in a moment, all
    fill). A located LoopedChunkIndex, whether the index is small enough for the parser to walk (64
    chunks) or only checked (100). Run in a child process with a 60 s limit (main never ends)."""
    good, bad = tmp_path / "a.nc", tmp_path / "b.nc"
    for i, path in enumerate((good, bad)):
        with netCDF4.Dataset(path, "w") as nc:
            nc.createDimension("n", n)
            nc.createVariable("n", "i4", ("n",))[:] = np.arange(n) + n * i
            nc.createVariable("w", "i4", ("n",), chunksizes=(1,))[:] = np.arange(n)
    target = str(tmp_path / "agg.nc")
    daskcfa.aggregate([str(good), str(bad)], target, concat_dims=["n"])
    bad.write_bytes(_shared_inner_nodes(tmp_path / "shared.nc", n, levels))
    code = ("import sys, daskcfa\n"
            "try:\n    daskcfa.from_cfa(sys.argv[1], 'w').compute()\n"
            "except daskcfa.CFAError as exc:\n    print(type(exc).__name__, '|', exc)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, target], cwd=Path(daskcfa.__file__).parents[1],
                              capture_output=True, text=True, timeout=60)  # (the daskcfa under test)
    except subprocess.TimeoutExpired:
        pytest.fail("the read did not end within 60 s")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("LoopedChunkIndex |"), done.stdout
    assert "b.nc'" in done.stdout and "variable '/w'" in done.stdout and "fragment (1,)" in done.stdout


def test_a_written_mixed_array_reads_its_own_values(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """``x[...] = v`` on an array batched for its small S3 first fragment, then small selections."""
    built = _mixed(tmp_path, s3fs_fs, s3_bucket, {0, 1})
    want = built.expected.copy()
    want[3:30:3, 4, :] = -1.5
    with dask.config.set(num_workers=1):
        x = daskcfa.from_cfa(str(built.path), storage_options=s3_server.storage_options)
        x[3:30:3, 4, :] = -1.5
        for key in (np.s_[:, 4, 7], np.s_[:, 4, 1:3], np.s_[[3, 6, 7], 4, 0]):
            got = x[key].compute(scheduler="threads")
            assert_matches(got, want[key])
            assert np.ma.getmaskarray(got).tolist() == np.ma.getmaskarray(want[key]).tolist(), key
