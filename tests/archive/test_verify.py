"""``daskcfa.verify``: every problem of every fragment, found by the read path's own checks.

Datasets are written with ``daskcfa.to_cfa`` and then damaged for real:
bytes overwritten in the middle of a compressed HDF5 chunk (only a deep
check reads it), a header overwritten, a file truncated or deleted, a
fragment replaced by one of the wrong shape or units. Remote cases run on
the real S3 server.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import dask
import h5py
import netCDF4
import numpy as np
import pytest
from dask.delayed import Delayed

import daskcfa
from builders import generation_dir, make_truth
from daskcfa.archive.verify import KINDS, Problem, VerifyReport

DIMS = ("time", "lat", "lon")
SHAPE = (8, 6, 10)
FRAGMENT_SHAPE = (2, 3, 10)  # a 4 x 2 x 1 grid
COORDS = {"time": np.arange(8.0), "lat": np.linspace(-50, 50, 6), "lon": np.arange(0.0, 360.0, 36.0)}


def write(url, *, storage_options=None, **kw):
    x = make_truth(SHAPE, "f4", seed=3)
    return daskcfa.to_cfa(x, str(url), variable="tas", dims=DIMS, attrs={"units": "K"}, coords=COORDS,
                          fragment_shape=FRAGMENT_SHAPE, compression={"zlib": True, "complevel": 1},
                          storage_options=storage_options, **kw)


def fragment(directory: Path, index: tuple[int, ...]) -> Path:
    return generation_dir(directory / "t") / f"t.tas.{'.'.join(map(str, index))}.nc"


def corrupted(data: bytes) -> bytes:
    """The fragment with bytes overwritten in the middle of its first compressed chunk (header intact)."""
    with h5py.File(io.BytesIO(data), "r") as h5:
        info = h5["tas"].id.get_chunk_info(0)
    assert info.size > 64
    middle = info.byte_offset + info.size // 2
    return data[:middle] + bytes(range(200, 232)) + data[middle + 32:]


def corrupt_compressed_chunk(path: Path) -> None:
    path.write_bytes(corrupted(path.read_bytes()))


def replace_fragment(path: Path, shape=(2, 3, 10), units="K", name="tas", dtype="f4") -> None:
    path.unlink()
    with netCDF4.Dataset(path, "w") as nc:
        for d, n in zip(DIMS, shape):
            nc.createDimension(d, n)
        v = nc.createVariable(name, dtype, DIMS)
        v.units = units
        v[...] = np.ones(shape, dtype)


@pytest.fixture
def archive(tmp_path):
    return Path(write(tmp_path / "t.nc")).parent


def kinds(report: VerifyReport) -> dict[tuple[int, ...], str]:
    return {p.index: p.kind for p in report.problems}


def test_healthy_dataset(archive):
    for deep in (False, True):
        report = daskcfa.verify(str(archive / "t.nc"), deep=deep)
        assert report.ok and bool(report)
        assert report.checked == 8 and report.problems == []
        assert report.variables == ("/tas",)
        assert str(report).endswith("8 fragment(s) of 1 variable(s) checked (" + ("deep" if deep else "quick")
                                    + "): OK")


def test_corrupt_chunk_and_truncated_file(archive):
    """The acceptance case: corrupt one fragment, truncate another; verify reports exactly those two."""
    corrupt_compressed_chunk(fragment(archive, (1, 0, 0)))
    truncated = fragment(archive, (2, 1, 0))
    os.truncate(truncated, truncated.stat().st_size // 2)
    quick = daskcfa.verify(str(archive / "t.nc"))
    assert kinds(quick) == {(2, 1, 0): "unreadable"}  # the corrupt chunk is not read by a quick check
    deep = daskcfa.verify(str(archive / "t.nc"), deep=True)
    assert not deep.ok
    assert kinds(deep) == {(1, 0, 0): "corrupt", (2, 1, 0): "unreadable"}
    assert deep.checked == 8
    corrupt = deep.problems[0]
    assert corrupt == Problem("/tas", (1, 0, 0), str(fragment(archive, (1, 0, 0))), "corrupt", corrupt.message)
    assert "corrupt chunk" in corrupt.message
    text = str(deep)
    assert "2 problem(s)" in text
    assert f"/tas [1,0,0] corrupt: {fragment(archive, (1, 0, 0))}" in text
    assert f"/tas [2,1,0] unreadable: {truncated}" in text


def test_corrupt_header(archive):
    path = fragment(archive, (0, 1, 0))
    with open(path, "r+b") as fh:
        fh.seek(0)
        fh.write(b"\0" * 64)
    report = daskcfa.verify(str(archive / "t.nc"))
    assert kinds(report) == {(0, 1, 0): "unreadable"}
    assert "netCDF" in report.problems[0].message


def test_missing_wrong_shape_wrong_units_and_wrong_variable_all_reported(archive):
    fragment(archive, (0, 0, 0)).unlink()
    replace_fragment(fragment(archive, (1, 1, 0)), shape=(3, 3, 10))
    replace_fragment(fragment(archive, (2, 0, 0)), units="m")
    replace_fragment(fragment(archive, (3, 0, 0)), name="pr")
    report = daskcfa.verify(str(archive / "t.nc"))
    assert kinds(report) == {(0, 0, 0): "missing", (1, 1, 0): "shape", (2, 0, 0): "units",
                             (3, 0, 0): "unreadable"}
    by_index = {p.index: p for p in report.problems}
    assert by_index[(0, 0, 0)].uri == str(fragment(archive, (0, 0, 0)))
    assert "(3, 3, 10)" in by_index[(1, 1, 0)].message
    assert "'m'" in by_index[(2, 0, 0)].message and "'K'" in by_index[(2, 0, 0)].message
    assert "'tas' not found" in by_index[(3, 0, 0)].message
    assert [p.index for p in report.problems] == sorted(by_index)  # in fragment order
    assert set(by_index[i].kind for i in by_index) <= set(KINDS)


def test_convertible_units_and_other_numeric_dtypes_are_not_problems(archive):
    """What the read path makes canonical (formats.md) is no problem."""
    replace_fragment(fragment(archive, (0, 0, 0)), units="degC")
    replace_fragment(fragment(archive, (1, 0, 0)), dtype="i2")
    for deep in (False, True):
        assert daskcfa.verify(str(archive / "t.nc"), deep=deep).ok


def test_dropped_size1_dimension_is_accepted(tmp_path):
    x = make_truth((3, 4), "f4", seed=1)
    url = daskcfa.to_cfa(x, str(tmp_path / "s.nc"), variable="v", dims=("time", "x"), attrs={"units": "K"},
                         fragment_shape=(1, 4))
    path = generation_dir(tmp_path / "s") / "s.v.1.0.nc"
    path.unlink()
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 4)
        v = nc.createVariable("v", "f8", ("x",))
        v.units = "degC"
        v[...] = np.arange(4.0)
    for deep in (False, True):
        assert daskcfa.verify(url, deep=deep).ok


def test_variables_selection_and_unknown_variable(archive):
    fragment(archive, (0, 0, 0)).unlink()
    assert kinds(daskcfa.verify(str(archive / "t.nc"), variables=["tas"])) == {(0, 0, 0): "missing"}
    with pytest.raises(daskcfa.VariableNotFoundError, match="'pr' is not an aggregated variable"):
        daskcfa.verify(str(archive / "t.nc"), variables=["pr"])
    with pytest.raises(daskcfa.NotFoundError):
        daskcfa.verify(str(archive / "nothing.nc"))


def test_compute_false_and_batched_tasks(archive, monkeypatch):
    from daskcfa.archive import verify as module

    monkeypatch.setattr(module, "MAX_TASKS", 3)  # 8 fragments in batches of 3
    fragment(archive, (3, 1, 0)).unlink()
    delayed = daskcfa.verify(str(archive / "t.nc"), compute=False)
    assert isinstance(delayed, Delayed)
    graph = dict(delayed.__dask_graph__())
    assert sum(1 for key in graph if str(key).startswith("verify-tas-")) == 3
    (report,) = dask.compute(delayed, scheduler="synchronous")
    assert kinds(report) == {(3, 1, 0): "missing"} and report.checked == 8


def test_on_a_distributed_cluster(archive):
    from distributed import Client, LocalCluster

    corrupt_compressed_chunk(fragment(archive, (0, 1, 0)))
    fragment(archive, (3, 0, 0)).unlink()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, \
            Client(cluster):
        report = daskcfa.verify(str(archive / "t.nc"), deep=True)
    assert kinds(report) == {(0, 1, 0): "corrupt", (3, 0, 0): "missing"}


def test_remote_fragments_on_s3(s3_server, s3_bucket, s3fs_fs):
    options = s3_server.storage_options
    url = write(f"s3://{s3_bucket}/arch/t.nc", storage_options=options)
    assert daskcfa.verify(url, storage_options=options, deep=True).ok
    generation = next(p for p in s3fs_fs.find(f"{s3_bucket}/arch/t") if p.endswith(".nc")).rsplit("/", 1)[0]
    s3fs_fs.rm(f"{generation}/t.tas.0.0.0.nc")
    key = f"{generation}/t.tas.1.1.0.nc"
    # (objects built in memory end with unused space: cut into the data themselves)
    s3fs_fs.pipe_file(key, s3fs_fs.cat_file(key)[:4096])
    key = f"{generation}/t.tas.2.0.0.nc"
    s3fs_fs.pipe_file(key, corrupted(s3fs_fs.cat_file(key)))

    report = daskcfa.verify(url, storage_options=options, deep=True)
    assert kinds(report) == {(0, 0, 0): "missing", (1, 1, 0): "unreadable", (2, 0, 0): "corrupt"}
    assert report.problems[0].uri == f"s3://{generation}/t.tas.0.0.0.nc"
    for text in [str(report), *(repr(p) for p in report.problems)]:
        assert s3_server.secret not in text and s3_server.key not in text


def test_wrong_credentials_are_storage_problems_without_secrets(tmp_path, s3_server, s3_bucket):
    """A local aggregation whose fragments are on S3: wrong credentials make every fragment a finding."""
    options = s3_server.storage_options
    write(f"s3://{s3_bucket}/w/t.nc", storage_options=options)
    from remote_helpers import write_cf113

    uris = [[[f"s3://{s3_bucket}/w/t/t.tas.{i}.{j}.0.nc"] for j in range(2)] for i in range(4)]
    agg = write_cf113(tmp_path / "local.nc", "tas", DIMS, ((2, 2, 2, 2), (3, 3), (10,)), uris)
    bad = {**options, "secret": "not-the-secret-" + "x" * 8}
    report = daskcfa.verify(str(agg), storage_options=bad)
    assert len(report.problems) == 8
    assert {p.kind for p in report.problems} <= {"storage", "missing"}
    assert "not-the-secret" not in str(report)


# ---------------------------------------------------------------------------
# What a missing fragment's message says (issue 28 item 2): the truth, never "overwritten"
# ---------------------------------------------------------------------------
def test_a_deleted_fragment_is_named_not_blamed_on_an_overwrite(archive):
    gone = fragment(archive, (2, 1, 0))
    gone.unlink()
    report = daskcfa.verify(str(archive / "t.nc"))
    assert kinds(report) == {(2, 1, 0): "missing"}
    message = report.problems[0].message
    assert f"not found at {gone}" in message
    with pytest.raises(daskcfa.MissingFragmentError) as caught:
        daskcfa.from_cfa(str(archive / "t.nc")).compute()
    for text in (message, str(caught.value)):
        assert "overwritten" not in text and "reopen" not in text and "generation" not in text
    assert f"not found at {gone}" in str(caught.value) and caught.value.fragment == (2, 1, 0)


def test_relocation_to_a_missing_prefix_says_nothing_is_there(archive, tmp_path):
    moved = daskcfa.relocate(str(archive / "t.nc"), {f"{archive}/t/": f"{tmp_path}/nowhere/"},
                             target=str(archive / "moved.nc"))
    report = daskcfa.verify(moved)
    assert kinds(report) == dict.fromkeys([(i, j, 0) for i in range(4) for j in range(2)], "missing")
    with pytest.raises(daskcfa.MissingFragmentError) as caught:
        daskcfa.from_cfa(moved).compute()
    for text in (report.problems[0].message, str(caught.value)):
        assert f"not found at {tmp_path}/nowhere/" in text
        assert f"nothing is stored under {tmp_path}/nowhere/" in text
        assert "overwritten" not in text and "reopen" not in text


@pytest.mark.usefixtures("one_version")
def test_a_fragment_of_a_replaced_write_says_the_dataset_was_overwritten(archive):
    old = daskcfa.from_cfa(str(archive / "t.nc"))
    daskcfa.to_cfa(make_truth(SHAPE, "f4", seed=4), str(archive / "t.nc"), variable="tas", dims=DIMS, mode="w",
                   fragment_shape=(4, 6, 10))
    with pytest.raises(daskcfa.MissingFragmentError, match="overwritten or updated since it was opened") as caught:
        old.compute()
    new_generation = generation_dir(archive / "t").name
    assert f"generation {new_generation}" in str(caught.value) and "reopen it" in str(caught.value)


def test_a_deleted_fragment_on_s3(s3_server, s3_bucket, s3fs_fs):
    options = s3_server.storage_options
    url = write(f"s3://{s3_bucket}/del/t.nc", storage_options=options)
    generation = next(p for p in s3fs_fs.find(f"{s3_bucket}/del/t") if p.endswith(".nc")).rsplit("/", 1)[0]
    s3fs_fs.rm(f"{generation}/t.tas.1.0.0.nc")
    with pytest.raises(daskcfa.MissingFragmentError) as caught:
        daskcfa.from_cfa(url, storage_options=options).compute()
    text = str(caught.value)
    assert f"not found at s3://{generation}/t.tas.1.0.0.nc" in text
    assert "overwritten" not in text and "nothing is stored" not in text
    moved = daskcfa.relocate(url, {f"s3://{s3_bucket}/del/t/": f"s3://{s3_bucket}/nowhere/"},
                             target=f"s3://{s3_bucket}/del/moved.nc", storage_options=options)
    with pytest.raises(daskcfa.MissingFragmentError, match=f"nothing is stored under s3://{s3_bucket}/nowhere/"):
        daskcfa.from_cfa(moved, storage_options=options).compute()
