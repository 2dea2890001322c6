"""A write's manifest, ``<stem>/.daskcfa/manifest.json``: the generation of the last write and every
fragment of the aggregation it committed. Written by the commit (``graph/write.py``); read here to tell
a fragment that was deleted or moved from one that a newer write replaced.
"""

from __future__ import annotations

import json
import posixpath

from ..errors import CFAError
from .objects import exists, read_bytes
from .profiles import ProfileRef
from .uri import resolve, scheme_of

__all__ = ["manifest_uri", "replacing_generation", "missing_directory"]

#: Schemes whose missing "directory" means that nothing is stored under it (HTTP servers need not list).
_LISTABLE = ("file", "s3", "gs", "gcs", "az", "abfs", "memory")


def manifest_uri(url: str) -> str:
    """Where the manifest of the aggregation file ``url`` lives."""
    stem = posixpath.splitext(posixpath.basename(url.rstrip("/")))[0]
    return resolve(posixpath.join(stem, ".daskcfa", "manifest.json"), url)


def replacing_generation(fragment: str, url: str, generation: str, profile: ProfileRef) -> str | None:
    """The generation of a newer write of ``url`` that no longer lists ``fragment`` (of ``generation``),
    or None: no manifest, the manifest is of that generation, or it still lists the fragment
    (then the fragment was deleted or moved, and reopening the dataset does not bring it back)."""
    try:
        manifest = json.loads(read_bytes(manifest_uri(url), profile))
    except (CFAError, ValueError, OSError):
        return None
    if not isinstance(manifest, dict):
        return None
    newer = manifest.get("generation")
    if not isinstance(newer, str) or newer == generation:
        return None
    listed = {resolve(e["uri"], url) for entries in (manifest.get("fragments") or {}).values()
              if isinstance(entries, dict) for e in entries.values() if isinstance(e, dict) and "uri" in e}
    return None if fragment in listed else newer


def missing_directory(uri: str, profile: ProfileRef) -> str | None:
    """The directory (prefix) of ``uri`` when nothing at all is stored there, else None: a relocation
    to a prefix that does not exist, or a tree that was removed."""
    if scheme_of(uri) not in _LISTABLE:
        return None
    parent = posixpath.dirname(uri.split("?", 1)[0].rstrip("/"))
    try:
        return None if exists(parent, profile) else parent
    except (CFAError, OSError):
        return None
