"""daskcfa.dataset: reads through the Dataset API (results larger than memory as memory maps)."""

from __future__ import annotations

import mmap

import dask
import numpy as np

import daskcfa


def mapped(array) -> bool:
    """Whether ``array``'s memory is a memory-mapped file (it, or an array it views, is)."""
    while array is not None:
        if isinstance(array, (np.memmap, mmap.mmap)):
            return True
        array = getattr(array, "base", None)
    return False


def test_big_reads_go_to_memory_maps_in_the_cache_directory(tmp_path):
    """S3netCDF4's ``cache_location``: a result larger than the memory budget is a numpy.memmap there."""
    truth = np.ma.masked_greater(np.arange(4000.0).reshape(40, 100), 3900)
    url = daskcfa.to_cfa(truth, str(tmp_path / "big.nc"), variable="v", dims=("t", "x"), fragment_shape=(10, 100))
    cache = tmp_path / "cache"
    with dask.config.set({"daskcfa.budget.memory": "16KiB", "daskcfa.io.cache-location": str(cache)}):
        got = daskcfa.Dataset(url)["v"][:]
        small = daskcfa.Dataset(url)["v"][0]  # within the budget: in memory
    assert mapped(got.data) and mapped(got.mask)
    np.testing.assert_array_equal(got.mask, truth.mask)
    np.testing.assert_array_equal(got.filled(0), truth.filled(0))
    assert not mapped(small.data)
    assert list(cache.iterdir()) == []  # unlinked once mapped: nothing left behind


def test_memory_maps_from_the_s3netcdf4_configuration(tmp_path, monkeypatch):
    truth = np.arange(3000, dtype="f4").reshape(30, 100)
    url = daskcfa.to_cfa(truth, str(tmp_path / "big.nc"), variable="v", dims=("t", "x"), fragment_shape=(10, 100))
    config = tmp_path / "s3nc.json"
    config.write_text('{"version": "9", "cache_location": "%s", "resource_allocation": {"memory": "4kB"}}'
                      % (tmp_path / "s3nc-cache"))
    monkeypatch.setenv("S3_NC_CONFIG", str(config))
    got = daskcfa.Dataset(url)["v"][:]
    assert mapped(np.ma.getdata(got))
    np.testing.assert_array_equal(np.ma.getdata(got), truth)


def test_indexing_is_netcdf4_pythons(tmp_path):
    """var[key] reads as netCDF4-python does: integer and boolean sequences select orthogonally (dask's
    indexing refused two of them), 0-d integer arrays are integers, a scalar variable takes any one index."""
    import netCDF4
    import pytest

    truth = np.arange(60.0).reshape(3, 4, 5)
    url = daskcfa.to_cfa(truth, str(tmp_path / "o.nc"), variable="v", dims=("t", "y", "x"), fragment_shape=(2, 2, 5))
    plain = str(tmp_path / "plain.nc")
    with netCDF4.Dataset(plain, "w") as nc:
        for name, n in zip("tyx", truth.shape):
            nc.createDimension(name, n)
        nc.createVariable("v", "f8", ("t", "y", "x"))[:] = truth
        nc.createVariable("s", "f8", ())[...] = 7.0
    keys = [([0, 2], [1, 3]), ([0, 2], slice(None), [3, 1]), ([2, 0, 2], [True, False, True, False]),
            (np.array(1),), (1, np.array([0, 3]), np.array(4)), (Ellipsis, [4, 0]), (slice(None, None, -1), [1, 1], 0)]
    with netCDF4.Dataset(plain) as nc:
        for reader in (daskcfa.Dataset(url), daskcfa.Dataset(plain)):
            for key in keys:
                expected = nc["v"][key]
                got = reader["v"][key]
                assert got.shape == expected.shape, key
                np.testing.assert_array_equal(got, expected)
        scalar = daskcfa.Dataset(plain)["s"]
        for key in (slice(None), 0, Ellipsis, (), [0]):
            assert scalar[key] == nc["s"][key] == 7.0
        with pytest.raises(daskcfa.ArgumentError):
            scalar[0, 0]
