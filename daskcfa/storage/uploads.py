"""Incomplete S3 multipart uploads under a prefix, aborted.

A writer killed in the middle of a multipart upload (a large fragment) leaves the parts it sent
stored: no listing of objects shows them, and the store keeps (and bills) them until the upload
is aborted. Where daskcfa deletes a generation directory no writer can add to any more (a dead
writer's, :func:`~daskcfa.storage.lease.retire_abandoned`), it aborts the uploads under it too.
"""

from __future__ import annotations

from .objects import NO_PROFILE, filesystem
from .profiles import ProfileRef
from .retry import with_retries
from .uri import is_local

__all__ = ["abort_uploads"]

#: Pages of listed uploads read at most (1,000 uploads a page): a server listing for ever is cut short.
MAX_PAGES = 1000


def abort_uploads(prefix: str, profile: ProfileRef = NO_PROFILE) -> int:
    """Abort every incomplete multipart upload of an object under ``prefix`` (an S3 URI ending with
    ``/``: a directory, never a part of a name) and return how many; other stores have none to abort."""
    if is_local(prefix) or not prefix.endswith("/"):
        return 0
    fs, path = filesystem(prefix, profile)
    if not hasattr(fs, "call_s3"):
        return 0  # (not S3)
    bucket, key, _ = fs.split_path(path)
    key = key.rstrip("/") + "/"
    aborted, after = 0, {}
    for _ in range(MAX_PAGES):
        listed = with_retries(prefix, fs.call_s3, "list_multipart_uploads", Bucket=bucket, Prefix=key, **after)
        for upload in listed.get("Uploads", []) if isinstance(listed, dict) else ():
            name, upload_id = upload.get("Key"), upload.get("UploadId")
            if isinstance(name, str) and name.startswith(key) and isinstance(upload_id, str):
                with_retries(prefix, fs.call_s3, "abort_multipart_upload", Bucket=bucket, Key=name, UploadId=upload_id)
                aborted += 1
        following = {name: value for name, value in (("KeyMarker", listed.get("NextKeyMarker")),
                                                       ("UploadIdMarker", listed.get("NextUploadIdMarker")))
                     if isinstance(value, str)}
        if not listed.get("IsTruncated") or "KeyMarker" not in following or following == after:
            break  # (the last page; or a server whose markers do not move on)
        after = following
    return aborted
