"""Helpers shared by the read-graph tests (graph/test_read.py, test_xarray_backend.py):
an archive of small HDF5 chunks, and what the process really read.

What is read is measured with the kernel's own counter of bytes this process
read (``rchar`` in /proc/self/io, page-cache hits included).
"""

from __future__ import annotations

import os

from builders import Frag, build_cf113, make_truth

SHAPE = (8, 200, 160)
SIZES = ((2, 2, 2, 2), (200,), (160,))


def bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def chunked_archive(tmp_path, **kw):
    # Fragments chunked (1, 20, 20) in HDF5, zlib: a point lives in one small chunk.
    storage = {"zlib": True, "chunksizes": (1, 20, 20)}
    return build_cf113(tmp_path, make_truth(SHAPE, "f4", seed=3), ("time", "lat", "lon"), SIZES,
                       frags=lambda index: Frag(storage=storage), **kw)


def fragment_bytes(built) -> int:
    return sum(os.path.getsize(p) for p in built.fragment_files.values())
