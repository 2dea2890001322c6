"""Objects that appear whole or not at all: temporaries, the move into place, and
the removal of temporaries that killed writers left behind."""

from __future__ import annotations

import os
import re
import shutil
import uuid
from typing import Sequence

from ..errors import CFAError
from .local import local_path
from .objects import NO_PROFILE, delete, exists, filesystem, put_bytes
from .profiles import ProfileRef
from .retry import translated, with_retries
from .uri import is_local

__all__ = ["commit", "temporary_name", "temporary_of", "put_atomic", "remove_stale_temporaries"]


def commit(temporary: str, final: str, profile: ProfileRef = NO_PROFILE) -> None:
    """Move a fully written object into place: a rename locally, copy then delete remotely."""
    fs, src = filesystem(temporary, profile)
    _, dst = filesystem(final, profile)
    if is_local(final):
        with translated(final):  # (a directory planted at ``final``: a StorageError naming it)
            os.replace(src, dst)
        return
    with_retries(final, fs.copy, src, dst)
    with_retries(temporary, fs.rm_file, src)


#: ``.<name>.<32 hex digits>.part``: what :func:`temporary_name` makes of ``<name>``.
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{32}\.part")  # matched whole (fullmatch)


def temporary_name(uri: str) -> str:
    """A unique hidden name beside ``uri``, to write it under before moving it into place."""
    head, sep, name = uri.rpartition("/")
    return f"{head}{sep}.{name}.{uuid.uuid4().hex}.part"


def temporary_of(name: str) -> str | None:
    """The name that a temporary named ``name`` (:func:`temporary_name`) stands for; None if it is none."""
    match = _TEMPORARY.fullmatch(name)
    return match.group("name") if match else None


def put_atomic(uri: str, data: bytes, profile: ProfileRef = NO_PROFILE) -> None:
    """Write an object so that it appears whole or not at all: an object store shows
    one PUT whole or not at all (a temporary and a copy would leave the temporary
    behind when the writer is killed between them); a local file is written
    under a temporary name, then renamed, the temporary removed if anything fails."""
    if not is_local(uri):
        put_bytes(uri, data, profile)
        return
    partial = temporary_name(uri)
    try:
        put_bytes(partial, data, profile)
        commit(partial, uri, profile)
    except BaseException:
        try:
            if exists(partial, profile):
                delete(partial, profile)
        except CFAError:
            pass  # the original failure is the one to report
        raise


def remove_stale_temporaries(uris: Sequence[str], profile: ProfileRef = NO_PROFILE) -> list[str]:
    """Delete the temporaries of ``uris`` that writers killed mid-write left behind.

    Only local files have them (objects are uploaded in one request). Call it
    only when no other writer of these URIs can be running. Returns what was
    removed.
    """
    wanted: dict[str, set[str]] = {}
    for uri in uris:
        if is_local(uri):
            directory, name = os.path.split(local_path(uri))
            wanted.setdefault(directory, set()).add(name)
    removed = []
    for directory, names in wanted.items():
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for entry in entries:
            if temporary_of(entry.name) in names:
                with translated(entry.path):
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path)  # (a Zarr store's temporary directory)
                        else:
                            os.remove(entry.path)
                    except FileNotFoundError:
                        continue
                removed.append(entry.path)
    return removed
