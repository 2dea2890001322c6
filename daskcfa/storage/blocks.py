"""A whole object in memory, kept as the blocks it arrived in.

A large object fetched as concurrent ranged GETs arrives in parts. Joining
them into one ``bytes`` copies every byte while holding the GIL. Kept as
blocks, the bytes are copied once, by the reader, straight into the array it
returns, with numpy copies that release the GIL; a read within one block (an
object received whole into one buffer is one block) is a view of it.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Sequence, Union

import numpy as np

__all__ = ["Blocks", "Buffer"]

Buffer = Union[bytes, bytearray, memoryview, np.ndarray]


class Blocks:
    """The bytes of one object as a sequence of blocks, read by offset."""

    def __init__(self, blocks: Sequence[Buffer]) -> None:
        self._originals = [b for b in blocks if len(memoryview(b).cast("B"))]
        self._views = [memoryview(b).cast("B") for b in self._originals]
        self._starts = [0, *itertools.accumulate(len(v) for v in self._views)]
        self.nbytes = self._starts[-1]

    def __len__(self) -> int:
        return self.nbytes

    def read(self, offset: int, length: int) -> memoryview | np.ndarray:
        """Bytes ``offset`` to ``offset + length`` (fewer at the end): a read-only
        view when they lie in one block, else a fresh, writable array."""
        offset = max(0, min(offset, self.nbytes))
        length = max(0, min(length, self.nbytes - offset))
        k = bisect.bisect_right(self._starts, offset) - 1
        if k < len(self._views) and offset + length <= self._starts[k + 1]:
            start = offset - self._starts[k]
            return self._views[k][start:start + length].toreadonly()
        out = np.empty(length, np.uint8)
        self.readinto(offset, out)
        return out

    def readinto(self, offset: int, target: Buffer) -> int:
        """Copy the bytes from ``offset`` into ``target``; how many there were."""
        out = np.frombuffer(target, np.uint8) if not isinstance(target, np.ndarray) else target.view(np.uint8)
        done = 0
        k = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while done < len(out) and k < len(self._views):
            start = offset + done - self._starts[k]
            piece = self._views[k][start:start + len(out) - done]
            out[done:done + len(piece)] = np.frombuffer(piece, np.uint8)
            done += len(piece)
            k += 1
        return done

    def tobytes(self) -> bytes:
        """All of it as one ``bytes``: the only block itself when it is one, else a copy."""
        if len(self._originals) == 1 and isinstance(self._originals[0], bytes):
            return self._originals[0]
        return b"".join(self._views)
