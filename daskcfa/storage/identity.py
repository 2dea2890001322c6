"""File identity: the one rule telling one version of a file or object from another.

Every cache or index keyed on a file's version uses it: the chunk index's
entries, the fragment file manager's handles, read-ahead, resume markers,
dask tokens, the S3netCDF4 configuration file.

A local file is its inode, change time, modification time and size. ``cp -p``,
``rsync -t`` and ``tar`` keep the modification time (and a replacement may
have the same size); the change time only the kernel sets (``utime`` cannot
set it back), and a file renamed into place has another inode. A remote
object is its ETag (S3: the digest of its bytes, checked by ``If-Match``),
else its version id or modification time, as the store reports them.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

__all__ = ["local_token", "remote_token"]

#: The keys of an fsspec ``info`` mapping that identify an object's version, best first.
_REMOTE_KEYS = ("ETag", "etag", "VersionId", "LastModified", "mtime", "Last-Modified", "created")


def local_token(info: os.stat_result) -> str:
    """The version token of a local file, from its ``stat`` (or ``fstat``)."""
    return f"ino{info.st_ino}-c{info.st_ctime_ns}-m{info.st_mtime_ns}-s{info.st_size}"


def remote_token(info: Mapping[str, Any]) -> str:
    """The version token of a remote object, from its fsspec ``info`` ("" when the store gives none)."""
    return next((str(info[k]) for k in _REMOTE_KEYS if info.get(k) is not None), "")
