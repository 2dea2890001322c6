"""Fixity: a checksum of every stored fragment, so that bytes changed at rest are found.

The checksum is CRC-32 (zlib's) of the stored bytes, computed with ISA-L
(``isal``, already a core dependency: about 15 GB/s on one core, against
0.7 GB/s for MD5), in blocks, so memory stays one block. A netCDF fragment
is one object; a Zarr fragment is a store, checksummed object by object.

Checksums come from the writer's manifest (``<stem>/.daskcfa/manifest.json``,
see :mod:`.manifest`) or, for archives daskcfa did not write, from a fixity
record beside the aggregation file (``.<name>.fixity.json``, written by
``daskcfa verify --record``). Both lie beside the data, where anyone who can
write can plant one: every entry read here is checked (a plain URI the
aggregation's location policy allows, a sane size, a hex checksum), and one
that fails is a :class:`~daskcfa.errors.CFAFormatError` naming the file and
the entry, never a read elsewhere.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
import time
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping

from ..errors import CFAFormatError, NotFoundError, redact
from .atomic import put_atomic
from .local import open_local
from .manifest import manifest_uri
from .objects import NO_PROFILE, read_bytes, read_stream, size
from .policy import LocationPolicy
from .profiles import ProfileRef
from .retry import translated
from .uri import is_local, resolve

try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # (isal is a dependency; zlib's is 7x slower)
    from zlib import crc32 as _crc32

__all__ = ["ALGORITHM", "Fixity", "crc32_of", "file_fixity", "local_fixity", "marker_fixity", "fixity_uri", "entry",
           "recorded", "write_record"]

#: The checksum recorded, by the name a record gives it.
ALGORITHM = "crc32"
#: Largest size a record may claim for one object (1 PiB): larger is a planted or broken record.
MAX_NBYTES = 1 << 50
#: Bytes read at a time when a checksum of a remote object is computed (one GET each).
BLOCK = 8 << 20
#: Bytes read at a time from a local file.
LOCAL_BLOCK = 1 << 20
_HEX = re.compile(r"[0-9a-f]{8}")  #: matched whole (``$`` would take a trailing newline)
#: Most bytes a manifest or fixity record may have (256 MiB: a million fragments and more).
_MAX_RECORD = 256 << 20


@dataclass(frozen=True)
class Fixity:
    """What a fragment's stored bytes were: one object's size and CRC-32 (hex), or, for a Zarr
    store, those of each of its objects by name below the store."""

    nbytes: int
    crc32: str = ""
    objects: tuple[tuple[str, int, str], ...] = ()  #: a store's (name, nbytes, crc32), by name


def crc32_of(blocks: Iterable[bytes]) -> tuple[int, str]:
    """Size and CRC-32 (8 hex digits) of the bytes of ``blocks``."""
    nbytes, value = 0, 0
    for block in blocks:
        nbytes += len(block)
        value = _crc32(block, value)
    return nbytes, f"{value & 0xFFFFFFFF:08x}"


def file_fixity(uri: str, profile: ProfileRef, policy: LocationPolicy | None = None) -> tuple[int, str]:
    """Size and CRC-32 of the object at ``uri``, streamed (NotFoundError when it is absent). A local
    file is read into one reused buffer of :data:`LOCAL_BLOCK` bytes (as fast as ``cat``: no
    allocation per block, the buffer stays in the CPU's cache)."""
    if not is_local(uri):
        return crc32_of(read_stream(uri, profile, policy=policy, block=BLOCK))
    buffer = bytearray(LOCAL_BLOCK)
    view = memoryview(buffer)
    nbytes, value = 0, 0
    with open_local(uri) as f, translated(uri):
        while n := f.readinto(buffer):
            nbytes += n
            value = _crc32(view[:n], value)
    return nbytes, f"{value & 0xFFFFFFFF:08x}"


def local_fixity(path: str) -> Fixity:
    """The fixity of a fragment just written at the local ``path``: a file, or a Zarr store
    (a directory: each of its regular files, by ``/``-separated name below it)."""
    if not os.path.isdir(path):
        return Fixity(*file_fixity(path, NO_PROFILE))
    objects = []
    for directory, _, names in os.walk(path):
        for name in names:
            full = os.path.join(directory, name)
            if stat.S_ISREG(os.lstat(full).st_mode):
                objects.append((os.path.relpath(full, path).replace(os.sep, "/"), *file_fixity(full, NO_PROFILE)))
    objects.sort()
    return Fixity(sum(n for _, n, _ in objects), objects=tuple(objects))


def marker_fixity(marker: Mapping[str, Any]) -> Fixity | None:
    """The fixity a resume marker (of :func:`entry`'s form) recorded, if it is well formed."""
    try:
        return _fixity(marker, {})
    except CFAFormatError:
        return None


def fixity_uri(url: str) -> str:
    """Where the fixity record of the aggregation file ``url`` lives: hidden, beside it."""
    head, sep, name = url.rpartition("/")
    return f"{head}{sep}.{name}.fixity.json"


def entry(uri: str, fixity: Fixity) -> dict[str, Any]:
    """A record's JSON entry for the fragment ``uri`` (as the aggregation file writes it)."""
    if fixity.objects:
        return {"uri": uri, "nbytes": fixity.nbytes,
                "objects": {name: {"nbytes": n, ALGORITHM: c} for name, n, c in fixity.objects}}
    return {"uri": uri, "nbytes": fixity.nbytes, ALGORITHM: fixity.crc32}


def recorded(url: str, profile: ProfileRef, references: Collection[str], manifest: str | None = None
             ) -> dict[str, Fixity]:
    """Every checksum recorded for the aggregation file ``url``, by absolute fragment URI: the
    writer's manifest first, then the fixity record for fragments the manifest has none of.
    Entries without a checksum (older writers) are left out; malformed ones raise, and so do ones
    outside the dataset: neither among the fragment URIs the aggregation ``references`` nor a
    plain path below its directory (a stale entry, of a fragment since moved). Only referenced
    fragments are ever read. ``manifest``: where the manifest is, if it moved with the fragments
    (its entries still resolve against ``url``)."""
    found = _record(fixity_uri(url), url, profile, references, "fragments")
    found.update(_record(manifest or manifest_uri(url), url, profile, references, "manifest"))
    return found


def write_record(url: str, fixities: Mapping[str, Fixity], profile: ProfileRef) -> str:
    """Put the fixity record of ``url`` in place (atomically), its entries relative to the aggregation
    file where they lie below its directory; returns the record's URI."""
    root = url.rpartition("/")[0] + "/"
    entries = [entry(u[len(root):] if u.startswith(root) else u, f) for u, f in sorted(fixities.items())]
    record = {"aggregation": posixpath.basename(url), "algorithm": ALGORITHM,
              "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "fragments": entries}
    put_atomic(fixity_uri(url), json.dumps(record, indent=1).encode(), profile)
    return fixity_uri(url)


def _record(uri: str, url: str, profile: ProfileRef, references: Collection[str], layout: str
            ) -> dict[str, Fixity]:
    """The checksummed entries of a manifest (``layout="manifest"``: entries by variable and index)
    or of a fixity record (a list); {} when there is none."""
    where: dict[str, Any] = {"file": uri}
    try:
        nbytes = size(uri, profile)
        if nbytes > _MAX_RECORD:
            raise CFAFormatError(f"{nbytes:,} bytes: too large for a record of checksums", **where)
        data = read_bytes(uri, profile, known_size=nbytes)
    except NotFoundError:
        return {}
    try:
        content = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CFAFormatError(f"not a JSON record of checksums ({type(exc).__name__})", **where) from None
    if not isinstance(content, dict):
        raise CFAFormatError("not a JSON object", **where)
    if layout == "manifest":
        variables = content.get("fragments", {})
        if not isinstance(variables, dict) or not all(isinstance(v, dict) for v in variables.values()):
            raise CFAFormatError("'fragments' is not a mapping of variables to fragments", **where)
        items = [({**where, "variable": str(v)[:200], "fragment": _index(i)}, e)
                 for v, entries in variables.items() for i, e in entries.items()]
    else:
        if content.get("algorithm") != ALGORITHM:
            raise CFAFormatError(f"algorithm {str(content.get('algorithm'))[:40]!r} is not {ALGORITHM!r}", **where)
        fragments = content.get("fragments")
        if not isinstance(fragments, list):
            raise CFAFormatError("'fragments' is not a list", **where)
        items = [({**where, "fragment": (i,)}, e) for i, e in enumerate(fragments)]
    found = {}
    for place, raw in items:
        parsed = _entry(raw, url, references, place)
        if parsed is not None:
            found[parsed[0]] = parsed[1]
    return found


def _index(key: str) -> tuple[int, ...] | None:
    """A manifest's fragment index (``"0.3.1"``), if it is one."""
    parts = str(key).split(".")
    ascii_digits = all(p.isascii() and p.isdigit() and len(p) < 19 for p in parts)  # (not "²": no int)
    return tuple(int(p) for p in parts) if ascii_digits else None


def _entry(raw: Any, url: str, references: Collection[str], where: dict[str, Any]) -> tuple[str, Fixity] | None:
    """One checked entry: its absolute URI and fixity; None when it records no checksum."""
    if not isinstance(raw, dict) or not isinstance(raw.get("uri"), str):
        raise CFAFormatError("an entry without a fragment URI", **where)
    fixity = _fixity(raw, where)
    if fixity is None:
        return None  # (written before checksums were recorded)
    uri = resolve(raw["uri"], url) if raw["uri"] else ""
    root = url.rpartition("/")[0] + "/"
    if uri not in references and not (uri.startswith(root) and _plain(uri[len(root):])):
        raise CFAFormatError(f"lists {redact(raw['uri'])[:200]!r}, outside the dataset (neither a fragment the "
                             "aggregation references nor below its directory)", **where)
    return uri, fixity


def _plain(relative: str) -> bool:
    """A plain relative path: no empty, ``.`` or ``..`` segment, nothing a URI or server reads otherwise."""
    return bool(relative) and not any(p in ("", ".", "..") for p in relative.split("/")) \
        and not any(ch in relative for ch in "\x00\\?#%")


def _fixity(raw: dict[str, Any], where: dict[str, Any]) -> Fixity | None:
    """The checked size and checksum(s) of an entry (None: it has no checksum)."""
    if ALGORITHM not in raw and "objects" not in raw:
        return None
    nbytes = _size(raw.get("nbytes"), where)
    if "objects" not in raw:
        return Fixity(nbytes, _checksum(raw.get(ALGORITHM), where))
    objects = raw["objects"]
    if not isinstance(objects, dict) or not objects:
        raise CFAFormatError("'objects' of a store is not a mapping of names", **where)
    checked = []
    for name, obj in sorted(objects.items()):
        if not _plain(str(name)):
            raise CFAFormatError(f"store object {redact(str(name))[:80]!r} is not a plain name", **where)
        if not isinstance(obj, dict):
            raise CFAFormatError(f"store object {name!r} has no size and checksum", **where)
        checked.append((name, _size(obj.get("nbytes"), where), _checksum(obj.get(ALGORITHM), where)))
    if sum(n for _, n, _ in checked) != nbytes:
        raise CFAFormatError("the sizes of a store's objects do not add up to its size", **where)
    return Fixity(nbytes, objects=tuple(checked))


def _size(value: Any, where: dict[str, Any]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NBYTES:
        raise CFAFormatError(f"size {str(value)[:40]!r} is not a byte count of at most {MAX_NBYTES:,}", **where)
    return value


def _checksum(value: Any, where: dict[str, Any]) -> str:
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise CFAFormatError(f"checksum {str(value)[:40]!r} is not a {ALGORITHM} of 8 hex digits", **where)
    return value
