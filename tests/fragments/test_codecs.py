"""The direct reader decodes zstd, blosc and bzip2 chunks as netCDF-C wrote them, never
producing more bytes than a chunk holds."""

from __future__ import annotations

import bz2

import netCDF4
import numpy as np
import pytest
from numcodecs import blosc, zstd

from daskcfa.fragments.codecs import BLOSC, BZIP2, DECODERS, ZSTD
from daskcfa.fragments.hdf5 import DirectReadUnsupported, HDF5File

COMPRESSIONS = ["zstd", "bzip2", "blosc_lz", "blosc_lz4", "blosc_lz4hc", "blosc_zlib", "blosc_zstd"]


def _write(path, compression: str, data: np.ndarray, **options) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in zip(("t", "y"), data.shape):
            ds.createDimension(d, n)
        var = ds.createVariable("x", data.dtype, ("t", "y"), compression=compression, chunksizes=(70, 50),
                                **options)
        var[...] = data


@pytest.mark.parametrize("options", [{}, {"shuffle": True}, {"shuffle": True, "fletcher32": True}],
                         ids=["plain", "shuffle", "shuffle-fletcher32"])
@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("dtype", ["f4", "i2", "f8"])
def test_compressed_chunks_read_directly_as_numpy_wrote_them(tmp_path, compression, options, dtype):
    rng = np.random.default_rng(3)
    data = rng.integers(-20, 20, size=(230, 170)).astype(dtype)  # (netCDF-C's blosc filter fails on incompressible chunks)
    data[:, 3] = 0
    path = tmp_path / "f.nc"
    _write(path, compression, data, **options)
    with HDF5File(path) as f:
        var = f.variable("x")
        np.testing.assert_array_equal(var.read((slice(None), slice(None))), data)
        np.testing.assert_array_equal(var.read((slice(2, 200, 3), 4)), data[2:200:3, 4])
        np.testing.assert_array_equal(var.read((229, slice(160, 170))), data[229, 160:])


def test_szip_is_left_to_netcdf4(tmp_path):
    data = np.arange(230 * 170, dtype="i4").reshape(230, 170)
    path = tmp_path / "f.nc"
    _write(path, "szip", data, szip_coding="nn", szip_pixels_per_block=8)
    with HDF5File(path) as f, pytest.raises(DirectReadUnsupported, match="szip"):
        f.variable("x")


@pytest.mark.parametrize("code, stream", [
    (ZSTD, zstd.compress(bytes(100_000), 3)),
    (BLOSC, blosc.compress(bytes(100_000), b"lz4", 5, 1)),
    (BZIP2, bz2.compress(bytes(10_000_000))),
], ids=["zstd", "blosc", "bzip2"])
def test_streams_holding_more_than_their_chunk_are_refused(code, stream):
    """A stream of more bytes than the chunk declares: an OSError, nothing inflated past the chunk."""
    with pytest.raises(OSError, match="corrupt|more than"):
        DECODERS[code](np.frombuffer(stream, np.uint8), 1000)
    assert len(DECODERS[code](np.frombuffer(stream, np.uint8), 100_000 if code != BZIP2 else 10_000_000)) > 0


def test_damaged_streams_are_oserrors():
    data = np.random.default_rng(1).integers(0, 4, 4096, dtype=np.uint8).tobytes()
    for code, stream in ((ZSTD, zstd.compress(data, 3)), (BLOSC, blosc.compress(data, b"zstd", 5, 1)),
                         (BZIP2, bz2.compress(data))):
        assert DECODERS[code](np.frombuffer(stream, np.uint8), len(data)).tobytes() == data
        damaged = bytearray(stream)
        damaged[len(damaged) // 2:] = bytes(len(damaged) - len(damaged) // 2)
        with pytest.raises(OSError):
            DECODERS[code](np.frombuffer(bytes(damaged), np.uint8), len(data))
        with pytest.raises(OSError):
            DECODERS[code](np.frombuffer(stream[:5], np.uint8), len(data))
