"""A write's manifest, ``<stem>/.daskcfa/manifest.json``: the generation of the last write and every
fragment of the aggregation it committed. Written by the commit (``write/commit.py``); read here to tell
a fragment that was deleted or moved from one that a newer write replaced, and by the commit,
which merges and retires from what the previous write listed.
"""

from __future__ import annotations

import os
import posixpath
import stat
from typing import Any

from ..errors import CFAError, CFAFormatError, NotFoundError, UnsafeURIError
from .local import local_path
from .objects import exists, read_json
from .profiles import ProfileRef
from .uri import is_local, resolve, scheme_of

__all__ = ["check_bookkeeping", "manifest_uri", "retired_uri", "abandoned_uri", "read_manifest", "manifest_json", "checked_manifest", "listed_fragments",
           "replacing_generation", "missing_directory", "other_owner"]

#: Schemes whose missing "directory" means that nothing is stored under it (HTTP servers need not list).
_LISTABLE = ("file", "s3", "gs", "gcs", "az", "abfs", "memory")


def manifest_uri(url: str) -> str:
    """Where the manifest of the aggregation file ``url`` lives."""
    stem = posixpath.splitext(posixpath.basename(url.rstrip("/")))[0]
    return resolve(posixpath.join(stem, ".daskcfa", "manifest.json"), url)


def retired_uri(url: str) -> str:
    """Where the record of the fragments a commit of ``url`` retired (kept for a grace period) lives."""
    return posixpath.join(posixpath.dirname(manifest_uri(url)), "retired.json")


def abandoned_uri(url: str) -> str:
    """Where the record of the generations of writers whose stale leases were taken over lives (their
    fragments deleted by the next commit of ``url``: :func:`daskcfa.storage.lease.retire_abandoned`)."""
    return posixpath.join(posixpath.dirname(manifest_uri(url)), "abandoned.json")


def read_manifest(url: str, profile: ProfileRef) -> dict[str, Any]:
    """The manifest of the aggregation file ``url``, its malformed parts left out (empty if there is
    none, or it is no JSON object): it lies beside the data, and anyone who can write there can plant
    one, so it is never a bare error and never trusted further than its readers check."""
    return checked_manifest(manifest_json(manifest_uri(url), profile))


def manifest_json(uri: str, profile: ProfileRef) -> Any:
    """The JSON of a manifest (the current one, or a version's copy) as :func:`.objects.read_json`
    reads it, None if there is none or it is no JSON; one larger than daskcfa reads JSON is a
    :class:`~daskcfa.errors.BudgetError` naming the setting, as every other limit."""
    try:
        return read_json(uri, profile)
    except (NotFoundError, CFAFormatError):
        return None


def other_owner(url: str, profile: ProfileRef) -> str | None:
    """The other aggregation file (its URL) whose fragment directory ``<stem>/`` is also ``url``'s
    (``a.nc`` and ``a.nca`` share ``a/``), when its manifest names it and it exists: a write of
    ``url`` there would replace its manifest, versions and retirement record. None otherwise."""
    named = read_manifest(url, profile).get("aggregation")
    if not isinstance(named, str) or named == posixpath.basename(url) or named in ("", ".", "..") or "/" in named:
        return None
    other = resolve(named, url)
    return other if exists(other, profile) else None


def check_bookkeeping(url: str) -> None:
    """Refuse a local dataset whose ``<stem>/.daskcfa`` (or its ``versions/``) is a symbolic link or no
    directory: a writer keeps the manifest, retirement record and versions there, and a link planted
    in their place would make it replace another dataset's (daskcfa makes them plain directories)."""
    if not is_local(url):
        return
    bookkeeping = local_path(posixpath.dirname(manifest_uri(url)))
    for path in (bookkeeping, os.path.join(bookkeeping, "versions")):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        except NotADirectoryError:  # (``<stem>`` a file: the aggregation file itself, named without a suffix)
            mode = 0
        if not stat.S_ISDIR(mode):  # (lstat: a symbolic link is no directory)
            raise UnsafeURIError(f"{path} is a symbolic link or no directory (or lies in a file): a writer keeps "
                                 "this dataset's manifest and versions there, never through a link", file=url)


def checked_manifest(manifest: Any) -> dict[str, Any]:
    """A manifest read from JSON (the current one, or a version's copy), its malformed parts left out."""
    if not isinstance(manifest, dict):
        manifest = {}
    fragments = manifest.get("fragments")
    manifest["fragments"] = {
        variable: {i: e for i, e in entries.items() if isinstance(e, dict) and isinstance(e.get("uri"), str)}
        for variable, entries in (fragments.items() if isinstance(fragments, dict) else ())
        if isinstance(entries, dict)}
    return manifest


def listed_fragments(manifest: dict[str, Any], url: str) -> set[str]:
    """The fragments a manifest (of :func:`read_manifest`) lists, as absolute URIs."""
    return {resolve(e["uri"], url) for entries in manifest["fragments"].values() for e in entries.values()}


def replacing_generation(fragment: str, url: str, generation: str, profile: ProfileRef) -> str | None:
    """The generation of a newer write of ``url`` that no longer lists ``fragment`` (of ``generation``),
    or None: no manifest, the manifest is of that generation, or it still lists the fragment
    (then the fragment was deleted or moved, and reopening the dataset does not bring it back)."""
    try:
        manifest = read_manifest(url, profile)
    except (CFAError, OSError):
        return None
    newer = manifest.get("generation")
    if not isinstance(newer, str) or newer == generation:
        return None
    return None if fragment in listed_fragments(manifest, url) else newer


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
