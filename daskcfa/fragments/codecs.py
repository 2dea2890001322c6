"""Decoders of the HDF5 compression filters beyond deflate, for the direct reader.

netCDF-C writes zstd, bzip2 and blosc chunks (``compression="zstd"`` and so
on in netCDF4-python); without a decoder here the direct reader would hand
such fragments to netCDF-C, which decodes them under the process-wide lock
and holds a second open file per fragment. The bytes of each filter are the
compressor's own stream, decoded with numcodecs (zstd, blosc; the Zarr
project's codecs, wheels on every platform) and the standard library (bz2).

Every decoder is given the exact size its output must have and never
produces more: a stream claiming or inflating to more is an error, not an
allocation (a hostile chunk cannot be a memory bomb). szip and LZ4 are not
decoded here: netCDF4-python reads them.
"""

from __future__ import annotations

import bz2
from typing import Callable

import numpy as np

from ..lazy import LazyModule

__all__ = ["BZIP2", "BLOSC", "ZSTD", "DECODERS"]

# (imported by the first chunk that needs them: 0.1 s that metadata-only work does not pay)
blosc = LazyModule("numcodecs.blosc")
zstd = LazyModule("numcodecs.zstd")

#: HDF5 filter identifiers (registered with The HDF Group).
BZIP2 = 307
BLOSC = 32001
ZSTD = 32015

#: Blosc's header: version, versionlz, flags, typesize, then nbytes, blocksize, cbytes (little-endian).
_BLOSC_HEADER = 16


def _zstd(raw: bytes | np.ndarray, size: int) -> np.ndarray:
    claimed = _zstd_content_size(bytes(memoryview(raw)[:18]))
    if claimed is not None and claimed != size:
        raise OSError(f"corrupt zstd chunk (its frame claims {claimed:,} bytes, expected {size:,})")
    out = np.empty(size, np.uint8)
    try:  # into ``out``: a frame of unknown size must fill it exactly
        zstd.decompress(raw, out)
    except (RuntimeError, ValueError) as err:
        raise OSError(f"corrupt zstd chunk ({err})") from None
    return out


def _zstd_content_size(head: bytes) -> int | None:
    """The content size a zstd frame header records (None: not recorded), per RFC 8878."""
    if len(head) < 5 or head[:4] != b"\x28\xb5\x2f\xfd":
        raise OSError("corrupt zstd chunk (no zstd frame)")
    descriptor = head[4]
    single_segment = descriptor >> 5 & 1
    field = (0 if not single_segment else 1, 2, 4, 8)[descriptor >> 6]
    if not field:
        return None
    start = 5 + (not single_segment) + (0, 1, 2, 4)[descriptor & 3]
    if len(head) < start + field:
        raise OSError("corrupt zstd chunk (frame header cut short)")
    return int.from_bytes(head[start:start + field], "little") + (256 if field == 2 else 0)


def _blosc(raw: bytes | np.ndarray, size: int) -> np.ndarray:
    header = bytes(memoryview(raw)[:_BLOSC_HEADER])
    if len(header) < _BLOSC_HEADER:
        raise OSError("corrupt blosc chunk (shorter than its header)")
    claimed, compressed = int.from_bytes(header[4:8], "little"), int.from_bytes(header[12:16], "little")
    if claimed != size or compressed != memoryview(raw).nbytes:
        raise OSError(f"corrupt blosc chunk (header claims {claimed:,} bytes from {compressed:,}, "
                      f"expected {size:,} from {memoryview(raw).nbytes:,})")
    out = np.empty(size, np.uint8)
    try:
        blosc.decompress(raw, out)
    except (RuntimeError, ValueError) as err:
        raise OSError(f"corrupt blosc chunk ({err})") from None
    return out


def _bzip2(raw: bytes | np.ndarray, size: int) -> np.ndarray:
    decompressor = bz2.BZ2Decompressor()
    try:
        out = decompressor.decompress(raw, size + 1)
    except (OSError, ValueError, EOFError) as err:
        raise OSError(f"corrupt bzip2 chunk ({err})") from None
    if len(out) > size:
        raise OSError(f"bzip2 chunk inflates to more than its {size:,} bytes")
    if not decompressor.eof or len(out) != size:
        raise OSError(f"corrupt bzip2 chunk (cut short: {len(out):,} of {size:,} bytes)")
    return np.frombuffer(out, np.uint8)


#: Filter identifier -> ``decode(stored bytes, size of the output) -> bytes of exactly that size``.
DECODERS: dict[int, Callable[[bytes | np.ndarray, int], np.ndarray]] = {ZSTD: _zstd, BLOSC: _blosc, BZIP2: _bzip2}
