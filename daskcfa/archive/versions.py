"""A dataset's history: :func:`history` lists its versions, :func:`rollback` makes an earlier one
current again (as a new version), :func:`prune` drops the versions beyond retention.

Every committed write records a version (:mod:`daskcfa.storage.history`
stores them; ``write/commit.py`` records them and applies the retention
rule, config ``daskcfa.write.keep-versions``). ``from_cfa(url, version=...)``
and ``open_cfa(url, version=...)`` read an earlier one.
"""

from __future__ import annotations

import posixpath
from datetime import datetime
from typing import Any, Mapping

from .. import storage
from ..errors import ArgumentError, NotFoundError
from ..storage import history as records
from ..storage.access import open_aggregation
from ..storage.history import Change, Version
from ..write.commit import Commit, payload_fragments, prune_versions, switch
from ..write.target import WriteTarget

__all__ = ["history", "rollback", "prune", "Version"]


def history(url: str, *, storage_options: Mapping[str, Any] | None = None) -> list[Version]:
    """The versions of the aggregation at ``url`` whose records are kept, newest first (the first
    is the current one). Empty when the aggregation file is no recorded version: written before
    daskcfa recorded versions, or by another tool; the next write records it. A malformed record
    is a :class:`~daskcfa.CFAFormatError` naming it."""
    url, access = open_aggregation(url, storage_options)
    if not storage.exists(url, access.profile):
        raise NotFoundError("no aggregation file", file=url)
    return records.chain(url, access.profile)


def rollback(url: str, version: str | datetime, *, storage_options: Mapping[str, Any] | None = None) -> Version:
    """Make ``version`` (an id, or a time: the version current then) of the aggregation at ``url``
    current again, as a new version (operation ``"rollback"``, its parent the version it replaces),
    under the write lease. Returns the new version. A version not in the history (unknown, or
    pruned) is a :class:`~daskcfa.VersionNotFoundError`."""
    target = WriteTarget.open(url, storage_options, "r+")
    url, profile = target.url, target.profile
    lease = target.lease(acquire=True)
    try:
        chosen = records.find(url, version, records.chain(url, profile))
        data = records.payload(url, chosen, profile)
        manifest = storage.checked_manifest(records.manifest_of(url, chosen, profile))
        header = {k: manifest[k] for k in ("format", "fragment_format") if isinstance(manifest.get(k), str)}
        commit = Commit(url=url, payload=data, mode="w", manifest=storage.manifest_uri(url),
                        header={**header, "aggregation": posixpath.basename(url),
                                "generation": chosen.generation or ""},
                        variables=(), profile=profile, retired=storage.retired_uri(url), keep_previous=0.0,
                        expected=None, references=frozenset(payload_fragments(url, data, profile)),
                        change=Change.of("rollback", version=chosen.id))
        return switch(commit, manifest["fragments"], lease, detail=f"rollback to {chosen.id}")
    finally:
        lease.release()


def prune(url: str, *, keep: int | None = None, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Keep the ``keep`` newest versions of the aggregation at ``url`` (default: config
    ``daskcfa.write.keep-versions``; 0 or 1 keeps the current one only), drop the others and delete
    the fragments only they referenced -- fragments of this dataset's own generations only, never
    through a symbolic link, never outside ``<stem>/``. Returns the ids of the versions dropped."""
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
        raise ArgumentError(f"keep is a number of versions >= 0, got {keep!r}")
    target = WriteTarget.open(url, storage_options, "r+")
    lease = target.lease(acquire=True)
    try:
        return prune_versions(target.url, target.profile, lease, keep)
    finally:
        lease.release()
