"""HDF5's filter pipeline undone on one stored chunk, outside the HDF5 library; and
applied (shuffle and deflate: :func:`filter_chunk`), for chunks written straight into a file.

Deflate (ISA-L's inflate, else zlib), shuffle and Fletcher-32 here; zstd,
blosc and bzip2 in :mod:`.codecs`. Every decoder stops at the chunk's size:
a stream that inflates to more is refused, never a memory bomb.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..storage.blocks import Buffer
from .codecs import DECODERS, INFLATE_ERRORS, deflate, inflate_head

__all__ = ["DEFLATE", "SHUFFLE", "FLETCHER32", "SUPPORTED_FILTERS", "ENCODED_FILTERS", "INFLATE_ERRORS", "inflate_head",
           "pipeline_of", "unfilter", "filter_chunk"]

# HDF5's identifiers of its own filters (H5Zpublic.h: H5Z_FILTER_DEFLATE, _SHUFFLE, _FLETCHER32), fixed by
# the file format: named here without importing h5py (tests/fragments check them against h5py.h5z's)
DEFLATE = 1
SHUFFLE = 2
FLETCHER32 = 3

#: Every filter a chunk may have passed through that this module (or :mod:`.codecs`) undoes.
SUPPORTED_FILTERS = frozenset({DEFLATE, SHUFFLE, FLETCHER32, *DECODERS})
#: The filters :func:`filter_chunk` applies.
ENCODED_FILTERS = frozenset({DEFLATE, SHUFFLE})


def pipeline_of(filters: Sequence[tuple[int, Sequence[int]]]) -> list[tuple[int, int]]:
    """What :func:`unfilter` undoes, from HDF5's ``(filter code, parameters)`` in the order
    applied on write: ``(filter code, shuffle element size)``."""
    return [(int(code), int(values[0]) if code == SHUFFLE else 0) for code, values in filters]


def unfilter(raw: Buffer, pipeline: list[tuple[int, int]], filter_mask: int, nbytes: int,
             offset: tuple[int, ...], where: str) -> np.ndarray:
    """The ``nbytes`` of one chunk, its ``pipeline`` (``(filter code, shuffle element size)``
    in the order applied on write) undone; filters skipped by its ``filter_mask`` stay
    skipped. Damage raises :class:`OSError` naming the chunk (its ``offset``) and ``where``."""
    buf = np.frombuffer(raw, np.uint8)
    for i in reversed(range(len(pipeline))):
        if filter_mask >> i & 1:
            continue
        code, param = pipeline[i]
        if code == DEFLATE:
            try:  # never past the chunk's size, a checksum and one byte to tell a longer stream:
                # a stream inflating to more than its chunk is no bomb
                buf = np.frombuffer(inflate_head(buf, nbytes + 5), np.uint8)
            except INFLATE_ERRORS as err:
                raise OSError(f"corrupt chunk at {offset} ({err}; {where})") from None
        elif code == SHUFFLE:
            buf = _shuffle(buf, param, undo=True)
        elif code in DECODERS:  # its output: the chunk, and the checksums of filters applied before it
            checksums = sum(c == FLETCHER32 and not filter_mask >> j & 1 for j, (c, _) in enumerate(pipeline[:i]))
            buf = DECODERS[code](buf, nbytes + 4 * checksums)
        else:
            if not _fletcher32_matches(buf):
                raise OSError(f"Fletcher-32 checksum mismatch in chunk at {offset} ({where})")
            buf = buf[:-4]
    if buf.size != nbytes:
        raise OSError(f"chunk at {offset} holds {buf.size} bytes, expected {nbytes} ({where})")
    return buf


def filter_chunk(chunk: np.ndarray, pipeline: Sequence[tuple[int, int]]) -> bytes:
    """The bytes HDF5 stores for one whole chunk (a C-contiguous array in the stored dtype)
    passed through ``pipeline``: ``(filter code, parameter)`` in the order applied on write,
    the parameter being the shuffle's element size or the deflate level (:data:`ENCODED_FILTERS` only)."""
    buf: np.ndarray | bytes = chunk.reshape(-1).view(np.uint8)
    for code, param in pipeline:
        if code == SHUFFLE:
            buf = _shuffle(np.frombuffer(buf, np.uint8), param)
        elif code == DEFLATE:
            buf = deflate(buf, param)
        else:
            raise ValueError(f"HDF5 filter {code} is not applied by daskcfa")
    return bytes(buf) if isinstance(buf, np.ndarray) else buf


def _shuffle(buf: np.ndarray, itemsize: int, undo: bool = False) -> np.ndarray:
    """HDF5's shuffle filter: byte ``j`` of every element goes to plane ``j``; ``undo``: back."""
    n = buf.size // itemsize
    if n <= 1 or itemsize == 1:
        return buf
    out = np.empty_like(buf)
    elements = (out if undo else buf)[: n * itemsize].reshape(n, itemsize)
    planes = (buf if undo else out)[: n * itemsize].reshape(itemsize, n)
    for j in range(itemsize):  # one plane at a time is ~3x faster than a transposed copy
        if undo:
            elements[:, j] = planes[j]
        else:
            planes[j] = elements[:, j]
    out[n * itemsize :] = buf[n * itemsize :]  # a ragged tail is stored unshuffled
    return out


def _fletcher32_matches(buf: np.ndarray) -> bool:
    """Check the checksum HDF5 appends (4 bytes, little-endian) to a Fletcher-32 filtered chunk.

    HDF5 sums big-endian 16-bit words modulo 65535 (an odd last byte is the high
    byte of a final word). ``sum2`` weighs word ``i`` of ``n`` by ``n - i``;
    those weights repeat every 65535 words, so words are first summed per
    position modulo 65535 and weighted once. HDF5 also accepts the checksum
    with the bytes of each half swapped (written by releases before 1.6.3).
    """
    modulus = 65535
    body, tail = buf[:-4], buf[-4:]
    if body.size % 2:
        body = np.append(body, np.uint8(0))
    words = body.view(">u2")
    n = words.size
    if n >= modulus:
        full = n - n % modulus
        columns = words[:full].reshape(-1, modulus).sum(axis=0, dtype=np.uint64)
        columns[: n - full] += words[full:]
    else:
        columns = words.astype(np.uint64)
    weights = ((n - np.arange(columns.size, dtype=np.int64)) % modulus).astype(np.uint64)
    sum1 = int(columns.sum()) % modulus
    sum2 = int(((columns % modulus) * weights).sum()) % modulus
    stored = int.from_bytes(tail.tobytes(), "little")
    halves_swapped = int.from_bytes(tail[[1, 0, 3, 2]].tobytes(), "little")
    return any((c & 0xFFFF) % modulus == sum1 and (c >> 16) % modulus == sum2 for c in (stored, halves_swapped))
