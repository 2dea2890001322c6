"""A dataset's versions: ``<stem>/.daskcfa/versions/``, one per committed switch of its aggregation file.

Each version is three objects named by its id (``v-<UTC time>-<8 hex>``):
``<id>.aggregation``, a copy of the aggregation file it put in place; ``<id>.manifest.json``,
the writer's manifest of it (if any); and ``<id>.json``, its record (time,
operation, redacted arguments, generation, parent, size and SHA-256 of the
copy), written last and atomically, *before* the aggregation file is switched.

A record counts only once the aggregation file put in place is the one it
describes: the *current* version is the one the manifest names when the
aggregation file's SHA-256 is its copy's, else the newest record whose copy it
is (a writer killed between the switch and the manifest); the history is the
chain of parents from it. A writer killed before the switch leaves a record no
chain reaches: never a version, removed by the next commit.

Records lie beside the data, where anyone who can write there can plant one:
each is read bounded (:data:`MAX_RECORD` bytes), checked field by field, and a
malformed one is a :class:`~daskcfa.errors.CFAFormatError` naming it; ids are
checked before they become object names. Nothing here deletes a fragment: which
fragments old versions keep, and which go, is decided by the commit
(``write/commit.py``) under the trust rules of :mod:`.lease`.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from ..errors import ArgumentError, CFAError, CFAFormatError, NotFoundError, StorageError, VersionNotFoundError, redact
from ..logs import logger
from .atomic import put_atomic, temporary_of
from .local import local_path
from .manifest import manifest_json, manifest_uri, read_manifest
from .nesting import HDF5_SIGNATURE
from .objects import delete, exists, listdir, read_bytes, size
from .profiles import ProfileRef
from .uri import is_local

__all__ = ["VERSION_ID", "MAX_RECORD", "Change", "Version", "versions_uri", "current", "chain", "record", "unfinished",
           "adopt", "payload", "manifest_of", "find", "drop_except"]

log = logger(__name__)

#: A version's id: also the name of its objects, so nothing but these characters.
VERSION_ID = re.compile(r"v-[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}")
#: Most bytes a version record may have (they are a few hundred).
MAX_RECORD = 65536
#: Longest chain of parents followed (a planted cycle or endless chain stops here).
MAX_CHAIN = 100_000
#: The length of the time at the start of a version id (``v-YYYYmmddTHHMMSSZ``).
_ID_TIME = 18
#: The suffixes of a version's objects.
_SUFFIXES = (".json", ".aggregation", ".manifest.json")
#: Longest string kept in a recorded argument, and most arguments kept.
_MAX_TEXT, _MAX_ARGUMENTS = 1024, 32


@dataclass(frozen=True)
class Change:
    """What a write did: its operation (``to_cfa``, ``refragment``, ``rollback``...) and its
    arguments, reduced to JSON scalars with credentials removed (:func:`Change.of`)."""

    operation: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, operation: str, **arguments: Any) -> "Change":
        """The change ``operation`` made with ``arguments``: None values left out, strings redacted
        and bounded, anything else that is not a JSON scalar kept as its type's name (an array's
        values, a storage options mapping never reach a record)."""
        kept: dict[str, Any] = {}
        for name, value in list(arguments.items())[:_MAX_ARGUMENTS]:
            if value is None or name == "storage_options":
                continue
            if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str, bool)) for v in value):
                kept[name] = [_scalar(v) for v in value[:_MAX_ARGUMENTS]]
            else:
                kept[name] = _scalar(value)
        return cls(operation, kept)


def _scalar(value: Any) -> Any:
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (str, os.PathLike)):
        return redact(os.fspath(value))[:_MAX_TEXT]
    if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in
                                          value.items()):
        return {redact(k)[:_MAX_TEXT]: _scalar(v) for k, v in list(value.items())[:_MAX_ARGUMENTS]}
    return f"<{type(value).__name__}>"


@dataclass(frozen=True)
class Version:
    """One committed version of a dataset (see the module docstring)."""

    id: str
    time: datetime  #: when it was recorded (UTC)
    operation: str
    arguments: Mapping[str, Any]
    generation: str | None  #: the generation directory of the fragments it wrote, if any
    parent: str | None  #: the version it replaced (None: the first recorded)
    sha256: str  #: of its copy of the aggregation file
    size: int

    def as_json(self) -> dict[str, Any]:
        """The record, as stored and as ``daskcfa log --json`` prints it."""
        return {"id": self.id, "time": self.time.isoformat().replace("+00:00", "Z"), "operation": self.operation,
                "arguments": dict(self.arguments), "generation": self.generation, "parent": self.parent,
                "sha256": self.sha256, "size": self.size}


def versions_uri(url: str) -> str:
    """The directory (prefix) of the versions of the aggregation file ``url``."""
    return posixpath.join(posixpath.dirname(manifest_uri(url)), "versions")


def _object(url: str, version_id: str, suffix: str) -> str:
    if not VERSION_ID.fullmatch(version_id):  # (an id from a record or a caller becomes an object name)
        raise CFAFormatError(f"{version_id!r} is not a version id", file=versions_uri(url))
    return f"{versions_uri(url)}/{version_id}{suffix}"


def _read(url: str, version_id: str, profile: ProfileRef) -> Version:
    """The record of ``version_id``, checked (:class:`NotFoundError` if there is none)."""
    uri = _object(url, version_id, ".json")
    nbytes = size(uri, profile)
    if nbytes > MAX_RECORD:
        raise CFAFormatError(f"the version record is larger than {MAX_RECORD} bytes: not one daskcfa wrote", file=uri)
    try:
        raw = json.loads(read_bytes(uri, profile, known_size=nbytes, max_bytes=MAX_RECORD))
    except (ValueError, RecursionError) as exc:
        raise CFAFormatError(f"the version record is not JSON ({type(exc).__name__})", file=uri) from None
    return _parse(raw, version_id, uri)


def _parse(raw: Any, version_id: str, uri: str) -> Version:
    def bad(what: str) -> CFAFormatError:
        return CFAFormatError(f"malformed version record: {what}", file=uri)

    if not isinstance(raw, dict):
        raise bad("not a JSON object")
    if raw.get("id") != version_id:
        raise bad(f"its id {str(raw.get('id'))[:80]!r} is not its name's")
    texts = {k: raw.get(k) for k in ("time", "operation", "sha256")}
    if not all(isinstance(v, str) for v in texts.values()):
        raise bad("time, operation and sha256 must be strings")
    try:
        time = datetime.fromisoformat(texts["time"].replace("Z", "+00:00"))
        utc = time.astimezone(timezone.utc) if time.tzinfo is not None else None
    except (ValueError, OverflowError):  # (an offset can carry a time past year 1 or 9999 in UTC)
        raise bad(f"time {texts['time'][:80]!r} is not an ISO 8601 time in years 1 to 9999 UTC") from None
    if utc is None:
        raise bad("time has no time zone")
    if not re.fullmatch(r"[0-9a-f]{64}", texts["sha256"]):
        raise bad("sha256 is not 64 hex digits")
    parent, generation, arguments, nbytes = (raw.get(k) for k in ("parent", "generation", "arguments", "size"))
    if parent is not None and not (isinstance(parent, str) and VERSION_ID.fullmatch(parent)):
        raise bad(f"parent {str(parent)[:80]!r} is not a version id")
    if generation is not None and not (isinstance(generation, str) and re.fullmatch(r"g-[0-9a-f]{16}", generation)):
        raise bad(f"generation {str(generation)[:80]!r} is not a generation's name")
    if not isinstance(arguments, dict) or type(nbytes) is not int or nbytes < 0:
        raise bad("arguments must be an object and size a count of bytes")
    return Version(version_id, utc, texts["operation"][:_MAX_TEXT], arguments, generation,
                   parent, texts["sha256"], nbytes)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def current(url: str, profile: ProfileRef) -> Version | None:
    """The version the aggregation file ``url`` is now (see the module docstring), or None: it was
    written before versions were recorded, or by a tool that does not record them, or is absent."""
    try:
        digest = _sha256(read_bytes(url, profile))
    except NotFoundError:
        return None
    named = _manifest_version(url, profile)
    if named is not None:
        try:
            found = _read(url, named, profile)
            if found.sha256 == digest:
                return found
        except (NotFoundError, CFAFormatError):
            pass
    candidates = []
    for version_id in _ids(url, profile):
        try:
            found = _read(url, version_id, profile)
        except (NotFoundError, CFAFormatError):
            continue  # (a planted or half-removed record is no version)
        if found.sha256 == digest:
            candidates.append(found)
    return max(candidates, key=lambda v: (v.time, v.id), default=None)


def _manifest_version(url: str, profile: ProfileRef) -> str | None:
    named = read_manifest(url, profile).get("version")
    return named if isinstance(named, str) and VERSION_ID.fullmatch(named) else None


def _ids(url: str, profile: ProfileRef) -> set[str]:
    """The ids of the records stored (whatever their state)."""
    return {name[:-len(".json")] for name in _names(url, profile)
            if name.endswith(".json") and VERSION_ID.fullmatch(name[:-len(".json")])}


def _names(url: str, profile: ProfileRef) -> list[str]:
    """The names of the objects directly in the versions directory."""
    directory = versions_uri(url)
    try:
        found = listdir(directory, profile)
    except (NotFoundError, StorageError):
        return []
    parent = local_path(directory) if is_local(directory) else directory.rstrip("/")
    return [posixpath.basename(p) for p in found if posixpath.dirname(p) == parent]


def chain(url: str, profile: ProfileRef, *, strict: bool = True) -> list[Version]:
    """The committed versions of ``url``, newest first: the current one and its parents as far as
    their records are kept. A malformed record on the chain is a :class:`CFAFormatError` (not
    ``strict``: the chain ends before it)."""
    found = current(url, profile)
    versions: list[Version] = []
    seen: set[str] = set()
    while found is not None and found.id not in seen and len(versions) < MAX_CHAIN:
        versions.append(found)
        seen.add(found.id)
        if found.parent is None:
            break
        try:
            found = _read(url, found.parent, profile)
            if found.time > versions[-1].time:
                raise CFAFormatError(f"version {versions[-1].id} names a newer version as its parent",
                                     file=_object(url, versions[-1].id, ".json"))
        except NotFoundError:
            break  # pruned
        except CFAFormatError:
            if strict:
                raise
            break
    return versions


def record(url: str, data: bytes, change: Change, generation: str | None, parent: str | None, profile: ProfileRef,
           manifest: Mapping[str, Any] | None = None) -> Version:
    """Store the version that putting ``data`` at ``url`` makes (before the switch: see the module
    docstring): the copy, the manifest, then the record."""
    now = datetime.now(timezone.utc)
    version_id = f"v-{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(4)}"
    version = Version(version_id, now, change.operation, dict(change.arguments), generation, parent, _sha256(data),
                      len(data))
    put_atomic(_object(url, version_id, ".aggregation"), data, profile)
    if manifest is not None:
        put_atomic(_object(url, version_id, ".manifest.json"), json.dumps({**manifest, "version": version_id},
                                                                          indent=1).encode(), profile)
    put_atomic(_object(url, version_id, ".json"), json.dumps(version.as_json(), indent=1).encode(), profile)
    log.debug("recorded version %s (%s) of %s", version_id, change.operation, redact(url))
    return version


def unfinished(url: str, profile: ProfileRef) -> list[str]:
    """The version objects whose temporaries a writer killed while recording (:func:`record`) left in the
    versions directory: each write records under a new id, so no later write names them again; a commit
    (holding the lease) removes them."""
    found = []
    for name in _names(url, profile):
        target = temporary_of(name) or ""
        for suffix in (".manifest.json", ".aggregation", ".json"):
            if target.endswith(suffix) and VERSION_ID.fullmatch(target[:-len(suffix)]):
                found.append(_object(url, target[:-len(suffix)], suffix))
                break
    return found


def adopt(url: str, profile: ProfileRef) -> Version | None:
    """The current version of ``url``; an aggregation file no version describes (written before
    versions were recorded, or by another tool) is recorded now as operation ``"unrecorded"``, so
    that a write replacing it keeps it readable and restorable. None: there is no file, or it is no
    netCDF file (nothing a version could be read from)."""
    found = current(url, profile)
    if found is not None:
        return found
    try:
        data = read_bytes(url, profile)
    except NotFoundError:
        return None
    if not data.startswith((b"CDF", HDF5_SIGNATURE)):
        return None
    manifest = manifest_json(manifest_uri(url), profile)
    generation = manifest.get("generation") if isinstance(manifest, dict) else None
    generation = generation if isinstance(generation, str) and re.fullmatch(r"g-[0-9a-f]{16}", generation) else None
    return record(url, data, Change("unrecorded"), generation, None, profile,
                  manifest if isinstance(manifest, dict) else None)


def find(url: str, which: str | datetime | Version, versions: list[Version]) -> Version:
    """The version of ``versions`` (a :func:`chain`) that ``which`` names: an id, or a time (a
    datetime, naive meaning UTC, or an ISO 8601 string): the version current at that time."""
    if isinstance(which, Version):
        which = which.id
    if isinstance(which, str) and VERSION_ID.fullmatch(which):
        for version in versions:
            if version.id == which:
                return version
        raise VersionNotFoundError(f"no version {which!r} in the history of the dataset (unknown, or pruned: "
                                   f"its fragments may be deleted); see daskcfa.history(url)", file=url)
    when = _time(which)
    for version in versions:
        if version.time <= when:
            return version
    pruned = bool(versions) and versions[-1].parent is not None
    raise VersionNotFoundError(
        f"no version of the dataset was current at {when.isoformat()}: "
        + ("the version current then was pruned" if pruned else
           "the oldest recorded is " + (versions[-1].time.isoformat() if versions else "none")), file=url)


def _time(which: Any) -> datetime:
    if isinstance(which, str):
        try:
            which = datetime.fromisoformat(which.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ArgumentError(f"version= is a version id (v-YYYYmmddTHHMMSSZ-xxxxxxxx) or a time (a datetime or "
                                f"an ISO 8601 string), not {which[:80]!r}") from None
    if not isinstance(which, datetime):
        raise ArgumentError(f"version= is a version id or a time, not {type(which).__name__}")
    try:
        return which.replace(tzinfo=timezone.utc) if which.tzinfo is None else which.astimezone(timezone.utc)
    except OverflowError:
        raise ArgumentError(f"version= {which.isoformat()} is not a time in years 1 to 9999 UTC") from None


def payload(url: str, version: Version, profile: ProfileRef) -> bytes:
    """The aggregation file ``version`` put in place, checked against its record."""
    uri = _object(url, version.id, ".aggregation")
    try:
        data = read_bytes(uri, profile, known_size=version.size)
    except NotFoundError:
        raise VersionNotFoundError(f"the copy of version {version.id} is missing", file=uri) from None
    if _sha256(data) != version.sha256:
        raise CFAFormatError(f"the copy of version {version.id} is not the file its record describes", file=uri)
    return data


def manifest_of(url: str, version: Version, profile: ProfileRef) -> dict[str, Any]:
    """The manifest ``version``'s writer wrote (empty if none was kept, or it is no JSON object)."""
    found = manifest_json(_object(url, version.id, ".manifest.json"), profile)
    return found if isinstance(found, dict) else {}


def drop_except(url: str, keep: Iterable[str], beyond: Iterable[str], since: Version | None,
                profile: ProfileRef) -> list[str]:
    """Delete the objects of the versions ``beyond`` retention (ids), and of every other version
    not in ``keep`` recorded no earlier than ``since`` (the current version before the commit;
    None: all): writes killed before their switch. An older version the chain did not reach
    (beyond a malformed record) stays. Only objects named as a version's, directly in the
    versions directory, and (locally) only when no symbolic link leads there; a record that cannot
    be read is left as it is, and so is an object that cannot be removed (with a warning).
    Returns the ids."""
    keep, beyond = set(keep), set(beyond)
    if not _own_directory(url):
        return []
    dropped = set()
    for name in _names(url, profile):
        suffix = next((s for s in sorted(_SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)
        version_id = name[:-len(suffix)] if suffix else ""
        if VERSION_ID.fullmatch(version_id) and version_id not in keep:
            dropped.add(version_id)
    for version_id in sorted(dropped - beyond):
        try:
            recent = since is None or _read(url, version_id, profile).time >= since.time
        except NotFoundError:  # (objects a removal left without their record: by the time in the id)
            recent = since is None or version_id[:_ID_TIME] >= since.id[:_ID_TIME]
        except CFAError:  # (not understood, not touched: a planted or damaged record stays)
            recent = False
        if not recent:
            dropped.discard(version_id)
    for version_id in sorted(dropped):
        for suffix in (".json", ".aggregation", ".manifest.json"):  # (the record first: a half-removed version is none)
            uri = _object(url, version_id, suffix)
            try:
                if exists(uri, profile):
                    delete(uri, profile)
            except NotFoundError:
                pass
            except CFAError as exc:  # (after the switch: a failure costs space, never the commit)
                log.warning("could not remove %s of a dropped version (%s): it stays", redact(uri), exc)
    return sorted(dropped)


def _own_directory(url: str) -> bool:
    """Whether the versions directory is, locally, reached through no symbolic link from the
    aggregation file's directory (a planted link must not lead deletions elsewhere)."""
    if not is_local(url):
        return True
    home = os.path.dirname(local_path(url))
    directory = local_path(versions_uri(url))
    return os.path.realpath(directory) == os.path.join(os.path.realpath(home), os.path.relpath(directory, home))
