"""Bounded decoders of compressed chunks: HDF5's filters beyond deflate (for the direct
reader), and every compressor daskcfa lets a Zarr store or reference set use; and
:func:`deflate`, the encoder of the chunks daskcfa writes itself.

netCDF-C writes zstd, bzip2 and blosc chunks (``compression="zstd"`` and so
on in netCDF4-python); without a decoder here the direct reader would hand
such fragments to netCDF-C, which decodes them under the process-wide lock
and holds a second open file per fragment. The bytes of each filter are the
compressor's own stream, decoded with numcodecs (zstd, blosc; the Zarr
project's codecs, wheels on every platform) and the standard library (bz2).

Every decoder is given the exact size its output must have and never
produces more: a stream claiming or inflating to more is an error, not an
allocation (a hostile chunk cannot be a memory bomb). szip and HDF5's LZ4 are
not decoded here: netCDF4-python reads them. :data:`COMPRESSORS` names the
decoders by their Zarr codec names (numcodecs' ids, Zarr v3's names): the
only compressors a Zarr chunk is decoded with.
"""

from __future__ import annotations

import bz2
import zlib
from typing import Any, Callable

import numpy as np

from ..lazy import LazyModule

try:  # Intel ISA-L's inflate: the same zlib streams, about 2.3x faster to decode
    from isal import isal_zlib

    _decompressobj = isal_zlib.decompressobj
    _fast_compress: Callable[[Any, int], bytes] = isal_zlib.compress
    INFLATE_ERRORS: tuple[type[Exception], ...] = (isal_zlib.error, zlib.error)
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    _decompressobj = zlib.decompressobj
    _fast_compress = zlib.compress
    INFLATE_ERRORS = (zlib.error,)

__all__ = ["BZIP2", "BLOSC", "ZSTD", "DECODERS", "COMPRESSORS", "INFLATE_ERRORS", "deflate", "inflate_head"]

# (imported by the first chunk that needs them: 0.1 s that metadata-only work does not pay)
blosc = LazyModule("numcodecs.blosc")
zstd = LazyModule("numcodecs.zstd")
lz4 = LazyModule("numcodecs.lz4")

#: HDF5 filter identifiers (registered with The HDF Group).
BZIP2 = 307
BLOSC = 32001
ZSTD = 32015

#: Blosc's header: version, versionlz, flags, typesize, then nbytes, blocksize, cbytes (little-endian).
_BLOSC_HEADER = 16


def deflate(data: Any, level: int) -> bytes:
    """``data`` (a contiguous buffer) as one zlib stream, releasing the GIL while it compresses.

    Level 1, the level asked for speed, is ISA-L's level 1: about 8x faster
    than zlib's (490 against 61 MB/s a core on the benchmarks' float32 noise),
    its streams about 6% larger there. Every other level is zlib's own, as
    netCDF-C would write it (the bytes users asking for more compression expect).
    """
    return _fast_compress(data, 1) if level == 1 else zlib.compress(data, level)


def inflate_head(raw: bytes | np.ndarray, nbytes: int, wbits: int = 15,
                 rest: Callable[[], Any] | None = None) -> bytes:
    """The first ``nbytes`` of a zlib stream (gzip: ``wbits=31``), inflating no further.

    ``raw`` may be only the start of the stream, and ``rest()`` the bytes after it: they are
    fetched only when ``raw`` inflates to fewer than ``nbytes`` (a point in a chunk needs
    about as much of the stream as of the chunk)."""
    decompressor = _decompressobj(wbits)
    head = decompressor.decompress(raw, nbytes)
    if rest is None or len(head) >= nbytes or decompressor.eof:
        return head
    more = bytes(decompressor.unconsumed_tail) + bytes(memoryview(rest()))
    return head + decompressor.decompress(more, nbytes - len(head))


def _bounded(decompressor: Any, raw: bytes | np.ndarray, size: int, name: str,
             errors: tuple[type[Exception], ...]) -> np.ndarray:
    """A streaming decompressor's output, exactly ``size`` bytes: one byte past the size tells a
    longer stream, which is never inflated further."""
    try:
        out = decompressor.decompress(raw, size + 1)
    except errors as err:
        raise OSError(f"corrupt {name} chunk ({err})") from None
    if len(out) > size:
        raise OSError(f"{name} chunk inflates to more than its {size:,} bytes")
    if not decompressor.eof or len(out) != size:
        raise OSError(f"corrupt {name} chunk (cut short: {len(out):,} of {size:,} bytes)")
    return np.frombuffer(out, np.uint8)


def _zlib(raw: bytes | np.ndarray, size: int) -> np.ndarray:
    return _bounded(_decompressobj(15), raw, size, "zlib", INFLATE_ERRORS)


def _gzip(raw: bytes | np.ndarray, size: int) -> np.ndarray:
    return _bounded(_decompressobj(31), raw, size, "gzip", INFLATE_ERRORS)


def _into(decompress: Callable[[Any, Any], Any], raw: bytes | np.ndarray, size: int, name: str) -> np.ndarray:
    """numcodecs' ``decompress`` into a buffer of exactly ``size`` bytes, which it cannot overrun."""
    out = np.empty(size, np.uint8)
    try:
        decompress(raw, out)
    except (RuntimeError, ValueError) as err:
        raise OSError(f"corrupt {name} chunk ({err})") from None
    return out


def _lz4(raw: bytes | np.ndarray, size: int) -> np.ndarray:
    """numcodecs' LZ4: the decoded size (4 bytes, little-endian), then one LZ4 block."""
    head = bytes(memoryview(raw)[:4])
    claimed = int.from_bytes(head, "little") if len(head) == 4 else None
    if claimed != size:
        raise OSError(f"corrupt lz4 chunk (it claims {'no' if claimed is None else f'{claimed:,}'} bytes, "
                      f"expected {size:,})")
    return _into(lz4.decompress, raw, size, "lz4")


def _zstd(raw: bytes | np.ndarray, size: int) -> np.ndarray:
    claimed = _zstd_content_size(bytes(memoryview(raw)[:18]))
    if claimed is not None and claimed != size:
        raise OSError(f"corrupt zstd chunk (its frame claims {claimed:,} bytes, expected {size:,})")
    return _into(zstd.decompress, raw, size, "zstd")  # (a frame of unknown size must fill it exactly)


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
    return _into(blosc.decompress, raw, size, "blosc")


def _bzip2(raw: bytes | np.ndarray, size: int) -> np.ndarray:
    return _bounded(bz2.BZ2Decompressor(), raw, size, "bzip2", (OSError, ValueError, EOFError))


#: Filter identifier -> ``decode(stored bytes, size of the output) -> bytes of exactly that size``.
DECODERS: dict[int, Callable[[bytes | np.ndarray, int], np.ndarray]] = {ZSTD: _zstd, BLOSC: _blosc, BZIP2: _bzip2}

#: Zarr compressor name (numcodecs' id; Zarr v3's name, ``numcodecs.`` prefix removed) ->
#: the same kind of decoder: the allow-list of compressors a Zarr chunk may use.
COMPRESSORS: dict[str, Callable[[bytes | np.ndarray, int], np.ndarray]] = {
    "zlib": _zlib, "gzip": _gzip, "zstd": _zstd, "blosc": _blosc, "lz4": _lz4, "bz2": _bzip2}
