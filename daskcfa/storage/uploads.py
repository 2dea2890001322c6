"""Incomplete S3 multipart uploads under a prefix, aborted.

A writer killed in the middle of a multipart upload (a large fragment) leaves the parts it sent
stored: no listing of objects shows them, and the store keeps (and bills) them until the upload
is aborted. Where daskcfa deletes a generation directory no writer can add to any more (a dead
writer's, :func:`~daskcfa.storage.lease.retire_abandoned`), it aborts the uploads under it too.
A writer abandoned with nothing but such parts stored still has its generation recorded
(:func:`has_uploads`, :meth:`~daskcfa.storage.lease.Lease.abandon`).
"""

from __future__ import annotations

from typing import Any, Iterator

from .objects import NO_PROFILE, filesystem
from .profiles import ProfileRef
from .retry import with_retries
from .uri import is_local

__all__ = ["abort_uploads", "has_uploads"]

#: Uploads asked for a page of the listing (S3's own default; SeaweedFS's is 10,000).
PAGE = 1000
#: Pages of listed uploads read at most: a server listing for ever is cut short.
MAX_PAGES = 1000


def _listed(prefix: str, profile: ProfileRef) -> Iterator[tuple[Any, str, list[tuple[str, str]]]]:
    """Pages of the incomplete uploads of objects under ``prefix`` (an S3 directory URI ending with ``/``):
    the filesystem, the bucket and each page's (key, upload id). A page after a truncated one is asked
    from its markers; a server naming no key marker (SeaweedFS names only the upload id's) is asked from
    the start again, which shows what the caller has not aborted yet."""
    if is_local(prefix) or not prefix.endswith("/"):
        return
    fs, path = filesystem(prefix, profile)
    if not hasattr(fs, "call_s3"):
        return  # (not S3)
    bucket, key, _ = fs.split_path(path)
    key = key.rstrip("/") + "/"
    after: dict[str, str] = {}
    shown: list[tuple[str, str]] = []
    for _ in range(MAX_PAGES):
        listed = with_retries(prefix, fs.call_s3, "list_multipart_uploads", Bucket=bucket, Prefix=key,
                              MaxUploads=PAGE, **after)
        listed = listed if isinstance(listed, dict) else {}
        page = [(name, upload_id) for upload in listed.get("Uploads", []) if isinstance(upload, dict)
                for name, upload_id in [(upload.get("Key"), upload.get("UploadId"))]
                if isinstance(name, str) and name.startswith(key) and isinstance(upload_id, str)]
        if page == shown:
            return  # (nothing of ours; or the same page again: what was aborted still listed)
        yield fs, bucket, page
        shown = page
        following = {name: value for name, value in (("KeyMarker", listed.get("NextKeyMarker")),
                                                       ("UploadIdMarker", listed.get("NextUploadIdMarker")))
                     if isinstance(value, str) and value}
        if not listed.get("IsTruncated") or following == after:
            return  # (the last page; or a server whose markers do not move on)
        after = following if "KeyMarker" in following else {}


def has_uploads(prefix: str, profile: ProfileRef = NO_PROFILE) -> bool:
    """Whether an object under ``prefix`` (as :func:`abort_uploads`) has an incomplete multipart upload:
    a writer whose only trace is a large fragment cut short has stored parts no listing of objects shows."""
    return any(page for _, _, page in _listed(prefix, profile))


def abort_uploads(prefix: str, profile: ProfileRef = NO_PROFILE) -> int:
    """Abort every incomplete multipart upload of an object under ``prefix`` (an S3 URI ending with
    ``/``: a directory, never a part of a name) and return how many; other stores have none to abort."""
    aborted = 0
    for fs, bucket, page in _listed(prefix, profile):
        for name, upload_id in page:
            with_retries(prefix, fs.call_s3, "abort_multipart_upload", Bucket=bucket, Key=name, UploadId=upload_id)
            aborted += 1
    return aborted
