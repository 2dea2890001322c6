"""Write generations, leases and retirement: why a write never mixes, loses or resurrects data.

**Generations.** Every write puts its fragments under names of their own: a
*generation* directory, ``g-<16 hex digits>``, inserted before each fragment's
file name (S3netCDF4's readable names are kept inside it:
``a7/g-0123456789abcdef/a7.tas.0.0.nc``). The generation is derived from what
the write stores (the fragments' resume tokens), so the very same call after
a crash continues the same generation and skips what is already stored,
while any other call writes beside the committed dataset, never over it.
The aggregation file is the single switch: until it is replaced, readers see
only the previous generation; after, only the new one.

**Leases.** A write holds a lease on its target for its whole duration: a
small object beside the aggregation file, ``.<name>.lease``, created only if
absent and replaced only by compare-and-swap: on S3 with ``If-None-Match: *``
and ``If-Match: <ETag>``; locally each change is made holding an exclusive
``flock`` on ``.<name>.lease.lock`` (released by the kernel if its process is
killed; removed with the lease), and the record is replaced whole with a
rename, so that a lease never disappears, even for an instant, while
successors race for it. It records the owner (a random id per write), the host and process that
started the write, the generation and an expiry that fragment tasks extend
as they go. A lease whose process is gone (same host) or whose expiry has
passed is stale: a successor takes it over, and one successor only. So is a
record that is malformed (any field of the wrong type, NaN, a pid <= 0; longer
than 64 KiB; locally, a FIFO or a link, read without blocking or following it) or
forged (an expiry further ahead than any lease lasts, plus clock skew).

**Retirement.** The fragments of the previous aggregation that the new one
no longer references, and that a daskcfa writer made (in a generation
directory, or listed in the writer's manifest), are listed in
``<stem>/.daskcfa/retired.json`` *before* the switch (:func:`schedule`), then
deleted with their markers after it (:func:`retire`) -- at once, or by the
first commit after a grace period. A writer killed in between leaves them
listed for the next commit, never orphaned. The list lies beside the data,
where anyone who can write there can plant one: an entry is deleted only if
it is a file or Zarr store in a generation directory under ``<stem>/`` that
the dataset's manifest names (:func:`own_generations`), reached through no
symbolic link; any other is dropped with a warning.

**Abandoned generations.** A writer killed (or paused past its lease) before its
commit leaves its generation unreferenced; no commit's retirement lists it.
The successor that takes its stale lease over records the holder's owner and
generation in ``<stem>/.daskcfa/abandoned.json`` (:meth:`Lease._note_abandoned`)
-- unless the generation is the successor's own: the same ``to_cfa`` re-run,
which resumes it -- and its commit deletes that generation under its lease
(:func:`retire_abandoned`): at once if the holder's process is known to be gone,
else from a lease's time after the takeover (a paused holder may be past its
commit's last lease check, about to put an aggregation referencing it). That writer can never commit: its lease check
fails, and a forced check (the commit's) refuses an owner the record names
even if it has taken the lease again since. A ``daskcfa.Dataset`` writer that
ends without committing (an exception, dropped unclosed) records its own
generation the same way (:meth:`Lease.abandon`): it never resumes. Lease
records and this record are untrusted: only a directory ``<stem>/g-<16 hex>/``
reached through no link is deleted, and only if nothing the committed
aggregation or a kept version references, nor anything retirement still
keeps, lies in it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import math
import os
import posixpath
import re
import socket
import stat
import time
import warnings
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from .. import config
from ..errors import ArgumentError, CFAError, CFAWarning, NotFoundError, StorageError, WriteConflictError, redact
from ..logs import logger
from .atomic import put_atomic
from .local import local_path, real_location
from .manifest import abandoned_uri, check_bookkeeping, retired_uri
from .nofollow import delete_below, delete_directory_below
from .objects import delete, delete_all, exists, filesystem, read_json
from .retry import precondition_failed, translated, with_retries
from .timed import bounded
from .uploads import abort_uploads, has_uploads
from .uri import is_local, scheme_of
from .profiles import ProfileRef

log = logger(__name__)

__all__ = [
    "GENERATION",
    "generation_name",
    "in_generation",
    "generation_of",
    "marker_of",
    "lease_uri",
    "Lease",
    "schedule",
    "own_generations",
    "retire",
    "retired_entries",
    "retire_abandoned",
]

#: The name of a generation directory.
GENERATION = re.compile(r"g-[0-9a-f]{16}")  # matched whole (fullmatch): "$" would let a newline follow


def generation_name(token: str) -> str:
    """The generation of a write whose fragments have resume tokens summarised by ``token``."""
    return "g-" + hashlib.sha256(token.encode()).hexdigest()[:16]


def in_generation(reference: str, generation: str) -> str:
    """A fragment reference moved into ``generation``: the directory goes right before the file name."""
    head, sep, name = reference.rpartition("/")
    return f"{head}{sep}{generation}/{name}"


def generation_of(uri: str) -> str | None:
    """The generation directory a fragment URI lies in, if any."""
    parent = posixpath.basename(posixpath.dirname(uri.split("?", 1)[0].rstrip("/")))
    return parent if GENERATION.fullmatch(parent) else None


def marker_of(fragment: str) -> str:
    """A fragment's resume marker: hidden, in its own directory (rebuild and scans skip it)."""
    head, sep, name = fragment.rpartition("/")
    return f"{head}{sep}.daskcfa/{name}.json"


def lease_uri(url: str) -> str:
    """Where the lease on the aggregation file ``url`` lives: hidden, beside it."""
    head, sep, name = url.rpartition("/")
    return f"{head}{sep}.{name}.lease"


#: When this process last found each (lease, owner) still held (time.monotonic()).
_CONFIRMED: dict[tuple[str, str], float] = {}


def _ttl() -> float:
    return config.number("daskcfa.write.lease-seconds")


#: Seconds another host's clock may run ahead of ours: an expiry further ahead than a lease's
#: time plus this is forged (or from a broken clock) and stale, not a lease to wait for.
CLOCK_SKEW = 300.0


@dataclass(frozen=True)
class _Holder:
    """A lease record whose every field is well-formed (:func:`_holder`)."""

    owner: str
    host: str
    pid: int
    generation: str
    expires: float  #: time.time() at which it ends unless renewed
    seconds: float  #: the lease time its writer declared (0 in records of earlier versions)


def _holder(record: Any) -> _Holder | None:
    """The record's fields, or None if any is malformed (wrong type, NaN, a pid no process has):
    such a record is stale, taken over (a garbled lease must not block a target, nor raise)."""
    if not isinstance(record, dict):
        return None
    owner, host, pid, generation = (record.get(k) for k in ("owner", "host", "pid", "generation"))
    expires, seconds = record.get("expires"), record.get("seconds", 0.0)
    if not (isinstance(owner, str) and owner and isinstance(host, str) and isinstance(generation, str)):
        return None
    if not (type(pid) is int and 0 < pid < 2**31):  # (pid_t; 0 and -1 would signal process groups)
        return None
    if not (_finite(expires) and _finite(seconds)):
        return None
    return _Holder(owner, host, pid, generation, float(expires), float(seconds))


def _finite(value: Any) -> bool:
    """A JSON number that is a finite float: not a bool, NaN or an infinity, nor an integer past a
    float's range (JSON integers have no bound: ``float(10**400)`` raises OverflowError)."""
    return (type(value) is float and math.isfinite(value)) or (type(value) is int and abs(value) < 1e308)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True


@dataclass(frozen=True)
class Lease:
    """The exclusive right to write one target (see the module docstring). Safe to pickle:
    it names the lease object and the owner, never a credential."""

    uri: str  #: the lease object
    target: str  #: the aggregation file it guards
    owner: str
    host: str
    pid: int
    generation: str
    profile: ProfileRef = field(default=ProfileRef(None), compare=False)

    @classmethod
    def new(cls, target: str, profile: ProfileRef, generation: str = "") -> "Lease":
        """A lease for a write this process starts (not yet acquired): on local disk or S3, where a
        lease can be taken atomically (``flock``, conditional writes)."""
        if not is_local(target) and scheme_of(target) != "s3":
            raise ArgumentError(f"daskcfa writes to local disk and S3, not to {scheme_of(target)}:// targets",
                                file=target)
        return cls(lease_uri(target), target, uuid.uuid4().hex, socket.gethostname(), os.getpid(), generation,
                   profile)

    # -- the record --

    def _record(self) -> bytes:
        ttl = _ttl()
        return json.dumps({"owner": self.owner, "host": self.host, "pid": self.pid, "generation": self.generation,
                           "expires": time.time() + ttl, "seconds": ttl}).encode()

    @staticmethod
    def _describe(holder: _Holder | None) -> str:
        if holder is None:
            return "a malformed lease record"
        left = holder.expires - time.time()
        return (f"a write by process {holder.pid} on {holder.host!r} (generation "
                f"{holder.generation}, lease {'expired' if left < 0 else f'valid for {left:.0f} s more'})")

    def _stale(self, holder: _Holder | None) -> bool:
        """Malformed, expired, expiring further ahead than any lease lasts (forged), or its process
        is gone, or it is an earlier attempt at this very write by the process that started this
        one (a failed ``compute()`` re-run: it resumes the same generation)."""
        if holder is None:
            return True
        longest = self._longest(holder)
        if not time.time() <= holder.expires <= time.time() + longest + CLOCK_SKEW:
            return True
        if holder.host != socket.gethostname():
            return False
        if holder.pid == self.pid and holder.generation == self.generation and self.generation:
            return True
        return not _pid_alive(holder.pid)

    # -- operations --

    def acquire(self, wait: float = 0.0) -> "Lease":
        """Take the lease (or confirm we hold it). A live holder makes it wait up to ``wait``
        seconds, then raise :class:`WriteConflictError` naming it; a stale one is taken over."""
        try:
            return self._take(wait)
        except StorageError as exc:
            raise StorageError(f"cannot take the write lease on the target: {exc.reason}", file=self.uri) from None

    def _take(self, wait: float) -> "Lease":
        deadline = time.monotonic() + wait
        delay = 0.05
        for attempt in itertools.count():
            found = _read(self.uri, self.profile)
            if found is None:
                if _create(self.uri, self._record(), self.profile):
                    return self
            else:
                holder, tag = found
                if holder is not None and holder.owner == self.owner:
                    return self
                if self._stale(holder):
                    if _swap(self.uri, tag, self._record(), self.profile):
                        log.warning("took over the stale write lease %s on %s, held by %s", redact(self.uri),
                                    redact(self.target), self._describe(holder))
                        self._note_abandoned(holder)
                        return self
                elif time.monotonic() >= deadline:
                    raise WriteConflictError(f"another writer holds the target: {self._describe(holder)}; "
                                             f"retry when it has finished", file=self.target)
            if attempt >= 20 and time.monotonic() >= deadline:  # (a lease changing under us all along)
                raise WriteConflictError("cannot take the lease on the target: other writers keep changing it",
                                         file=self.target)
            time.sleep(delay)
            delay = min(1.0, delay * 2)

    def _note_abandoned(self, holder: _Holder | None) -> None:
        """Just taken over from ``holder``: record its owner, never to commit (:meth:`confirm`), and its
        generation, for the dataset's next commit to delete (:func:`retire_abandoned`): what that writer
        stored is garbage -- unless this is the very same write re-run, which resumes it (the same
        generation: not recorded). A malformed record names nothing. Never raises: a record that cannot
        be written costs space (its generation stays), never data."""
        if holder is not None and len(holder.owner) <= _OWNER_CHARACTERS:
            self._record_abandoned(holder.generation if holder.generation != self.generation else "", holder.owner,
                                   0.0 if self._gone(holder) else time.time() + self._longest(holder))

    def _gone(self, holder: _Holder) -> bool:
        """Whether ``holder``'s process is known to have ended (on this host): it can publish nothing more.
        Otherwise (another host, or alive but past its lease: paused) it may be between its commit's last
        lease check and its put, for as long as a lease lasts."""
        return holder.host == self.host and not _pid_alive(holder.pid)

    @staticmethod
    def _longest(holder: _Holder) -> float:
        return max(_ttl(), min(holder.seconds, float(config.maximum("daskcfa.write.lease-seconds"))))

    def _record_abandoned(self, generation: str, owner: str, due: float) -> None:
        """Add ``generation`` (if one; deleted from ``due``, a time.time()) and ``owner`` (if one) to the
        record, holding this lease."""
        record = abandoned_uri(self.target)
        try:
            check_bookkeeping(self.target)  # (no record written through a link planted as <stem>/.daskcfa)
        except CFAError:
            return
        generations, owners = _abandoned(record, self.profile)
        if GENERATION.fullmatch(generation) and (generation in generations or len(generations) < _MOST_ABANDONED):
            generations[generation] = max(due, generations.get(generation, 0.0))
        owners = [*(o for o in owners if o != owner), owner] if owner else owners
        _store_abandoned(generations, owners, record, self.profile)

    def abandon(self) -> None:
        """Give the lease up after a write that never resumes (a ``daskcfa.Dataset`` writer) failed or was
        dropped before its commit: its generation is recorded, while the lease is still ours, for the
        next commit to delete (:func:`retire_abandoned`). After a commit the lease is no longer held:
        nothing is recorded; nor when the write stored nothing (no record left beside a dataset never
        made). Never raises (:meth:`release`)."""
        try:
            found = _read(self.uri, self.profile)
            mine = f"{_root(self.target)}{_stem(self.target)}/{self.generation}"
            if found is not None and found[0] is not None and found[0].owner == self.owner and (
                    exists(mine, self.profile) or has_uploads(mine + "/", self.profile)):  # (parts: no object)
                self._record_abandoned(self.generation, "", 0.0)  # (this process publishes nothing of it)
        except (CFAError, OSError):
            pass
        self.release()

    def confirm(self, *, force: bool = False) -> None:
        """Check (in any task of the write) that the lease is still ours, extending it when
        half its time has passed; a writer that lost it stops before writing anything more.

        Fragment tasks look at most every few seconds per process (one small GET per
        fragment would cost an S3 write ~1 %): a lease is only taken over once its
        writer's process is gone or it expired, which takes minutes. ``force``: look now
        (the commit), and refuse also if a successor ever took this lease over, even if this write
        has taken it again since (its first task recomputed after a worker was lost): the successor
        may have deleted what this write stored (:func:`retire_abandoned`)."""
        key = (self.uri, self.owner)
        if not force and time.monotonic() - _CONFIRMED.get(key, -1e9) < min(5.0, _ttl() / 10):
            return
        found = _read(self.uri, self.profile)
        if found is None or found[0] is None or found[0].owner != self.owner:
            holder = "nobody" if found is None else self._describe(found[0])
            raise WriteConflictError(f"this write lost its lease on the target (now held by {holder}); nothing "
                                     "of it was committed", file=self.target)
        holder, tag = found
        if force and self.owner in _abandoned(abandoned_uri(self.target), self.profile)[1]:
            raise WriteConflictError("this write's lease was taken over by another writer, which may have deleted "
                                     "its fragments; nothing of it was committed: run it again", file=self.target)
        if holder.expires - time.time() < _ttl() / 2 and not _swap(self.uri, tag, self._record(), self.profile):
            self.confirm(force=True)  # someone changed it meanwhile: look again
        _CONFIRMED[key] = time.monotonic()

    def release(self) -> None:
        """Give the lease up if it is still ours (after the commit, or when the write failed).
        Never raises: a lease that cannot be removed now (storage down) is stale once this
        process ends or it expires, and the write's own outcome is what the caller must see."""
        try:
            found = _read(self.uri, self.profile)
            if found is not None and found[0] is not None and found[0].owner == self.owner:
                _remove(self.uri, found[1], self.profile)
        except (CFAError, OSError):
            pass


# --------------------------------------------------------------------------
# The lease object: create if absent, read, compare-and-swap, remove
# --------------------------------------------------------------------------


def _read(uri: str, profile: ProfileRef) -> tuple[_Holder | None, Any] | None:
    """The lease record (None if malformed) and its tag (the bytes locally, the ETag on S3), or
    None if there is none."""
    if is_local(uri):
        with translated(uri):
            data = _local_current(local_path(uri))
        if data is None:
            return None
        tag: Any = data
    else:
        fs, path = filesystem(uri, profile)
        bucket, key, _ = fs.split_path(path)

        async def get() -> tuple[bytes, Any]:
            response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{_RECORD_BYTES}")
            body = response["Body"]
            try:
                return await body.read(), response.get("ETag")
            finally:
                body.close()

        try:  # (within its deadline, as every remote read: :mod:`.timed`)
            data, tag = with_retries(uri, bounded, fs, uri, _RECORD_BYTES + 1, get)
        except NotFoundError:
            return None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        record = None
    return _holder(record), tag  # an unreadable record is stale, taken over


@contextmanager
def _changing(path: str) -> Iterator[None]:
    """Hold the right to change the local lease at ``path`` (one process or thread at a time): an
    ``flock`` on ``<path>.lock``, which the kernel drops when its process dies. Whoever removes
    the lease removes the lock file too, so each waiter checks, once it holds the lock, that it
    locked the file the name still refers to (else another has just removed it: lock again)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    lock = f"{path}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # (no file made through a planted link)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # (per open file: threads of one process exclude each other too)
            try:
                current = os.stat(lock).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)  # (releases the flock)


#: A lease record is a few hundred bytes: a longer one is malformed, read no further (a planted
#: huge object must not cost its size in memory).
_RECORD_BYTES = 65536

#: What a local lease that is not a regular file reads as: a malformed record (stale, replaced).
_NOT_A_FILE = b"\x00not a regular file"


def _local_current(path: str) -> bytes | None:
    """The local lease record's first bytes (None if absent), opened without following a link or
    waiting for a writer: a FIFO, a link (to ``/dev/zero``, say) or a directory planted there is
    :data:`_NOT_A_FILE`, never a read that blocks or never ends."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return _NOT_A_FILE
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _NOT_A_FILE
        return os.read(fd, _RECORD_BYTES + 1)
    finally:
        os.close(fd)


def _local_put(path: str, data: bytes) -> None:
    """The record at ``path`` replaced whole (readers see the old one or the new one)."""
    temporary = f"{path}.{uuid.uuid4().hex}"
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:  # (a directory planted at ``path``: no temporary left beside it)
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def _create(uri: str, data: bytes, profile: ProfileRef) -> bool:
    """Create the lease object only if absent; whether we did."""
    if not is_local(uri):
        return _conditional_put(uri, data, profile, IfNoneMatch="*")
    path = local_path(uri)
    with translated(uri), _changing(path):
        if _local_current(path) is not None:
            return False
        _local_put(path, data)
        return True


def _swap(uri: str, tag: Any, data: bytes, profile: ProfileRef) -> bool:
    """Replace the lease object only if it still is what we read (``tag``); whether we did."""
    if not is_local(uri):
        return _conditional_put(uri, data, profile, IfMatch=tag)
    path = local_path(uri)
    with translated(uri), _changing(path):
        if _local_current(path) != tag:
            return False
        _local_put(path, data)
        return True


def _remove(uri: str, tag: Any, profile: ProfileRef) -> None:
    if not is_local(uri):
        try:
            delete(uri, profile)
        except NotFoundError:
            pass
        return
    path = local_path(uri)
    with _changing(path):
        if _local_current(path) == tag:
            os.unlink(path)
            os.unlink(f"{path}.lock")  # (still held: a waiter sees the name gone and locks anew)



def _conditional_put(uri: str, data: bytes, profile: ProfileRef, **condition: str) -> bool:
    fs, path = filesystem(uri, profile)
    bucket, key, _ = fs.split_path(path)

    def put() -> bool:
        try:
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
            return True
        except Exception as exc:
            if precondition_failed(exc):
                return False
            raise

    # (a retried put whose first attempt took effect is refused; the lease's owner, read next, tells)
    return bool(with_retries(uri, put))


# --------------------------------------------------------------------------
# Retirement of the previous generation
# --------------------------------------------------------------------------


def _listed(record: str, profile: ProfileRef) -> dict[str, float]:
    """The entries of the retired record (references relative to the aggregation file's
    directory, unchecked: :func:`retire` checks each) and when each is due."""
    try:
        listed = read_json(record, profile).get("retired", {})
        return {r: float(t) for r, t in listed.items() if isinstance(r, str) and _finite(t)}
    except (CFAError, ValueError, AttributeError, TypeError):  # (read_json's errors are CFAErrors)
        return {}


def retired_entries(record: str, profile: ProfileRef) -> set[str]:
    """The fragments (relative to the aggregation file's directory) the retired ``record`` lists:
    still stored for their grace period, no longer referenced."""
    return set(_listed(record, profile))


def _store(listed: dict[str, float], record: str, profile: ProfileRef) -> None:
    try:
        put_atomic(record, json.dumps({"retired": listed}, indent=1).encode(), profile)
    except CFAError:
        pass  # the fragments stay: space, never data


def _root(target: str) -> str:
    return target.rpartition("/")[0] + "/"


def _stem(target: str) -> str:
    """The dataset's own fragment directory's name (``<stem>/``), beside its aggregation file."""
    return posixpath.splitext(posixpath.basename(target))[0]


def _inside(uri: str, root: str) -> str:
    """``uri`` relative to ``root`` ("" if it is not below it)."""
    return uri[len(root):] if uri.startswith(root) else ""


def _clean(relative: str) -> bool:
    """A plain relative path: no empty, ``.`` or ``..`` component, nothing a URI or a path reads otherwise."""
    return bool(relative) and not any(c in ("", ".", "..") for c in relative.split("/")) \
        and not any(ch in relative for ch in "\x00\\?#")


def schedule(old: Iterable[str], new: Iterable[str], target: str, record: str, profile: ProfileRef,
             keep_for: float = 0.0) -> set[str]:
    """Before the switch: list in ``record`` the fragments ``old`` (absolute URIs the previous
    aggregation referenced and a daskcfa writer made) that ``new`` does not reference, due in
    ``keep_for`` seconds. Listed first, so that a writer killed between the switch and
    :func:`retire` leaves them for the next commit to delete, never orphaned. The list holds
    references relative to the aggregation file's directory (a copied dataset never deletes
    the original's files). Returns every entry now listed."""
    root = _root(target)
    listed = _listed(record, profile)
    leaving = {r for r in (_inside(u, root) for u in set(old) - set(new)) if r} - set(listed)
    if leaving:
        due = time.time() + keep_for
        listed.update(dict.fromkeys(leaving, due))
        _store(listed, record, profile)
    return set(listed)


def own_generations(manifest: Any, previous: Iterable[str], references: Iterable[str], listed: Iterable[str],
                    target: str, generation: str) -> list[str]:
    """The generation directories (relative to the aggregation file's directory) a writer of this
    dataset made whose fragments the new aggregation references or the retired record lists: what
    the new manifest records, and the only directories :func:`retire` deletes from.

    Known from the previous ``manifest``'s list, from the generation it names (a manifest of an
    earlier version lists none) among the ``previous`` aggregation's fragments, and from this
    write's own ``generation`` among the ``references``; only directories under the dataset's
    own fragment directory, ``<stem>/``, count."""
    root = _root(target)
    stem = _stem(target)
    earlier = manifest if isinstance(manifest, dict) else {}
    known = earlier.get("generations")
    known = {g for g in known if isinstance(g, str)} if isinstance(known, list) else set()
    named = {generation, earlier.get("generation") if isinstance(earlier.get("generation"), str) else generation}
    known |= {posixpath.dirname(_inside(u, root)) for u in (*previous, *references) if generation_of(u) in named}
    wanted = {posixpath.dirname(r) for r in listed} | {posixpath.dirname(_inside(u, root)) for u in references}
    return sorted(g for g in known & wanted
                  if _clean(g) and g.split("/")[0] == stem and GENERATION.fullmatch(posixpath.basename(g)))


def retire(new: Iterable[str], target: str, record: str, profile: ProfileRef, generations: Iterable[str]) -> list[str]:
    """After the switch: delete the listed fragments that are due and that ``new`` (the
    committed aggregation) does not reference, with their markers.

    An entry is deleted only if it is a fragment of one of ``generations`` (:func:`own_generations`:
    this dataset's, as its manifest names them) and, on local disk, is reached from the
    aggregation file's directory through no symbolic link, and is a regular file or a Zarr store;
    any other entry is dropped from the record with a warning, nothing deleted. Returns what was
    deleted. Failures cost space, never data: they stay listed for the next commit.
    """
    root = _root(target)
    listed = _listed(record, profile)
    if not listed:
        return []
    current = {_inside(u, root) for u in new}
    own = set(generations)
    now = time.time()
    waiting: dict[str, float] = {}
    deleted, ignored = [], []
    for relative, due in sorted(listed.items()):
        if relative in current:
            continue
        if not (_clean(relative) and posixpath.dirname(relative) in own
                and not posixpath.basename(relative).startswith(".")):
            ignored.append(relative)
        elif due > now:
            waiting[relative] = due
        else:
            try:
                if _delete_fragment(root, relative, profile):
                    deleted.append(root + relative)
                else:
                    ignored.append(relative)
            except (CFAError, OSError):
                waiting[relative] = now
    if ignored:
        shown = ", ".join(repr(redact(r)) for r in ignored[:3]) + (f" and {len(ignored) - 3} more"
                                                                    if len(ignored) > 3 else "")
        message = (f"ignored {len(ignored)} entries of {redact(record)} that are not fragments of this "
                   f"dataset's own generations (nothing deleted): {shown}")
        log.warning("%s", message)
        warnings.warn(message, CFAWarning, stacklevel=2)
    _prune_empty(deleted)
    _store(waiting, record, profile)
    return deleted


def _delete_fragment(root: str, relative: str, profile: ProfileRef) -> bool:
    """Delete the fragment ``relative`` (checked by :func:`retire`) and its marker; False, deleting
    nothing, if it is not a file or a Zarr store, or (locally) lies behind a symbolic link."""
    zarr = relative.endswith(".zarr")
    if is_local(root):
        base = os.path.realpath(local_path(root))
        marker = _inside(marker_of(root + relative), root)
        return delete_below(base, relative, zarr) and delete_below(base, marker, False)
    uri = root + relative
    if zarr:
        if any(exists(f"{uri}/{m}", profile) for m in (".zgroup", ".zarray", "zarr.json")):
            delete_all(uri, profile)
        elif exists(uri, profile):
            return False  # an object, not a store
    elif exists(uri, profile):
        delete(uri, profile)
    if exists(marker_of(uri), profile):
        delete(marker_of(uri), profile)
    return True


def _prune_empty(deleted: list[str]) -> None:
    """Remove local generation directories (and their marker directories) left empty."""
    for directory in sorted({posixpath.dirname(u) for u in deleted if is_local(u)}, reverse=True):
        if generation_of(directory + "/x") is None:
            continue
        for each in (posixpath.join(directory, ".daskcfa"), directory):
            try:
                os.rmdir(local_path(each))
            except (OSError, StorageError):
                pass


# --------------------------------------------------------------------------
# Generations of writers whose stale leases were taken over
# --------------------------------------------------------------------------

#: Abandoned generations a record holds at most (one planted with more is read no further: space, never data).
_MOST_ABANDONED = 256

#: Owners of leases taken over that a record remembers (the newest): a write is refused at its commit if
#: its lease was ever taken over, long after (a lease lasts minutes, a recomputed first task comes soon).
_MOST_OWNERS = 1024

#: Characters of an owner's id (daskcfa's are 32 hex digits; a longer one is malformed, not recorded).
_OWNER_CHARACTERS = 64


def _abandoned(record: str, profile: ProfileRef) -> tuple[dict[str, float], list[str]]:
    """The generations the record lists (each a ``g-<16 hex>`` name, others left out) with the time
    each may be deleted from (0 if none is recorded), and the owners of the leases taken over."""
    try:
        found = read_json(record, profile)
        generations, owners, due = found.get("abandoned", []), found.get("owners", []), found.get("due", {})
    except (CFAError, OSError, ValueError, AttributeError):
        return {}, []
    generations = [g for g in generations if isinstance(g, str) and GENERATION.fullmatch(g)] \
        if isinstance(generations, list) else []
    due = due if isinstance(due, dict) else {}
    owners = [o for o in owners if isinstance(o, str) and 0 < len(o) <= _OWNER_CHARACTERS] \
        if isinstance(owners, list) else []
    return ({g: float(due[g]) if _finite(due.get(g)) else 0.0 for g in list(dict.fromkeys(generations))[:_MOST_ABANDONED]},
            owners[-_MOST_OWNERS:])


def _store_abandoned(generations: dict[str, float], owners: list[str], record: str, profile: ProfileRef) -> None:
    try:
        put_atomic(record, json.dumps({"abandoned": list(generations), "due": generations,
                                       "owners": owners[-_MOST_OWNERS:]}, indent=1).encode(), profile)
    except (CFAError, OSError):
        pass  # the generations stay: space, never data


def retire_abandoned(references: Iterable[str] | None, target: str, profile: ProfileRef, generation: str) -> list[str]:
    """After the switch, under the lease: delete the generation directories of the writers whose stale
    leases were taken over (:meth:`Lease._note_abandoned`), fragments, markers and temporaries; returns
    the directories deleted.

    The record, like the lease records it comes from, is untrusted. A generation is deleted only as
    the directory ``<stem>/g-<16 hex>/`` right under the dataset's own fragment directory, reached
    through no symbolic link (a link there is left alone), and only if no fragment of ``references``
    (the committed aggregation's and the kept versions'; None if one of these could not be read:
    then nothing is deleted) lies in it -- compared by real path too, so that a reference through
    a linked directory counts -- and no fragment the retired record still keeps for its grace period
    does. A generation in use (referenced, or this write's own ``generation``) leaves the record;
    one with fragments still kept waits in it for a later commit, as does one not yet due: a writer
    paused (not known dead) when its lease was taken over may be past its commit's last lease check,
    about to put an aggregation referencing it, for as long as a lease lasts."""
    record = abandoned_uri(target)
    listed, owners = _abandoned(record, profile)
    if not listed or references is None:
        return []
    root, references = _root(target), set(references)
    stem = _stem(target)
    base = os.path.realpath(local_path(root)) if is_local(root) else ""
    used = {_inside(u, root) for u in references} | {
        os.path.relpath(real_location(u), base) for u in references if base and is_local(u)}
    kept = set(_listed(retired_uri(target), profile))
    deleted: list[str] = []
    waiting: dict[str, float] = {}
    for name, due in listed.items():
        directory = f"{stem}/{name}"
        if name == generation or any(u.startswith(directory + "/") for u in used):
            continue  # in use: not abandoned (a hostile record naming a kept generation ends here)
        if due > time.time() or any(k.startswith(directory + "/") for k in kept):
            waiting[name] = due
            continue
        try:
            if base:
                removed = delete_directory_below(base, directory)
            else:
                delete_all(root + directory + "/", profile)
                abort_uploads(root + directory + "/", profile)  # (a part-sent fragment's parts)
                removed = True
        except (CFAError, OSError):
            waiting[name] = due
            continue
        if removed:
            deleted.append(root + directory)
        else:
            log.warning("left %s alone: not a directory reached through no link", redact(root + directory))
    _store_abandoned(waiting, owners, record, profile)
    if deleted:
        log.info("deleted %d generations that writers whose leases were taken over left: %s", len(deleted),
                 ", ".join(redact(d) for d in deleted))
    return deleted
