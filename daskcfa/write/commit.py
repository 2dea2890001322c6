"""The commit of a write: the aggregation file put in place once every fragment is, as a new version,
then the manifest; the versions beyond retention dropped and the fragments only they referenced retired.

:func:`plan_commit` encodes the aggregation file on the client (every rule of
the dialect checked before the first fragment is written);
:func:`commit_aggregation` is the last task of the write graph, and what
``daskcfa.Dataset``'s aggregation writer runs at ``close()``; both, and a
rollback, go through :func:`switch`, the one home of a commit's order and
of the retention rule (``daskcfa.write.keep-versions``; :func:`prune_versions`
applies it without a switch). :func:`publish` records the version of a
writer that writes no fragment (``aggregate``, ``rebuild``, ``relocate``).
:func:`run_write` is how every writer (``to_cfa``, ``refragment``,
``daskcfa.Dataset``) runs its write to that commit on the client, the lease
given back whatever happens, and then writes the chunk index of what it
committed.
"""

from __future__ import annotations

import json
import posixpath
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .. import config, storage
from ..errors import ArgumentError, CFAError, CFAFormatError, CFAWarning, WriteConflictError
from ..formats import aggregated_variables
from ..formats.encode import encode_aggregation
from ..fragments.write import FragmentRecord
from ..model import AggregationDataset
from ..storage import history
from ..storage.fixity import entry
from ..storage.history import Change
from ..storage.lease import Lease, generation_of, own_generations, retire, retire_abandoned, schedule
from ..storage.publish import UPDATE_MODES, put_aggregation, refuse_existing

__all__ = ["Commit", "Indexer", "plan_commit", "commit_aggregation", "switch", "publish", "prune_versions",
           "kept_fragments", "payload_fragments", "check_chunk_index", "run_write"]


@dataclass(frozen=True)
class Commit:
    """What the commit task needs: the encoded aggregation file and where it goes."""

    url: str
    payload: bytes
    mode: str
    manifest: str  #: URI of the manifest
    header: dict[str, Any]  #: the manifest's description of the write
    variables: tuple[str, ...]  #: variable paths, in the order of the records
    profile: storage.ProfileRef
    retired: str  #: URI of the record of retired fragments kept for a grace period
    keep_previous: float  #: seconds the previous generation's fragments are kept after the commit
    expected: tuple[int, str] | None  #: r+: the aggregation file as the update found it
    references: frozenset[str]  #: every fragment URI the new aggregation file references
    change: Change = Change("to_cfa")  #: what the version it makes records
    #: versions the commit keeps (config ``daskcfa.write.keep-versions`` where the Commit is made, the
    #: client: the commit task may run on a worker whose config is not the user's)
    keep_versions: int = field(default_factory=lambda: _keep(None))


def plan_commit(model: AggregationDataset, url: str, *, format: str, fragment_format: str, generation: str,
                variables: list[str], mode: str, profile: storage.ProfileRef, keep_previous: float = 0.0,
                expected: tuple[int, str] | None = None, file_format: str = "NETCDF4",
                change: Change | None = None) -> Commit:
    """What :func:`commit_aggregation` puts in place: the aggregation file of ``model`` (its fragments
    complete), encoded now, which checks every rule of ``format``, and its manifest's description.
    ``variables`` are the paths of the aggregated variables whose fragment records the commit gets."""
    payload = encode_aggregation(model, format=format, file_format=file_format)
    return Commit(
        url=url, payload=payload, mode=mode, profile=profile,
        manifest=storage.manifest_uri(url),
        header={"aggregation": posixpath.basename(url), "format": format, "fragment_format": fragment_format,
                "generation": generation},
        variables=tuple(variables),
        retired=storage.retired_uri(url), keep_previous=float(keep_previous),
        expected=expected,
        references=frozenset(storage.resolve(u, url) for av in model.aggregated for u in av.fragments.locations()),
        change=change or Change.of("to_cfa", mode=mode, format=format, fragment_format=fragment_format),
    )


def commit_aggregation(commit: Commit, records: list[list[FragmentRecord]], lease: Lease) -> str:
    """Put the aggregation file in place (every fragment has succeeded) as a new version, then the
    manifest; then retire what neither it nor the versions kept reference (:func:`switch`).

    Temporary files that writers killed mid-fragment left beside these
    fragments are removed first: every fragment is now in place, and the
    lease keeps any other writer out.
    """
    try:
        lease.confirm(force=True)
        if commit.expected is not None and storage.stat(commit.url, commit.profile) != commit.expected:
            raise WriteConflictError("the aggregation file was changed by another writer since this update read it; "
                                     "run the update again", file=commit.url)
        new = {storage.resolve(rec.uri, commit.url) for recs in records for rec in recs}
        fragments: dict[str, dict[str, Any]] = {}
        if commit.mode in UPDATE_MODES:  # the fragments written earlier are still part of the aggregation
            fragments = storage.read_manifest(commit.url, commit.profile)["fragments"]
        for variable, recs in zip(commit.variables, records):
            entries = fragments.setdefault(variable, {})
            for rec in recs:
                entries[".".join(map(str, rec.index))] = (
                    {"uri": rec.uri, "nbytes": rec.nbytes} if rec.fixity is None else entry(rec.uri, rec.fixity))
        resumed = sum(rec.resumed for recs in records for rec in recs)
        switch(commit, fragments, lease, new, detail=f"generation {commit.header['generation']}: "
                                                     f"{sum(map(len, records)) - resumed} fragments written, "
                                                     f"{resumed} resumed")
    finally:
        lease.release()
    return commit.url


def switch(commit: Commit, fragments: dict[str, Any], lease: Lease, new: Iterable[str] = (), *,
           detail: str = "") -> history.Version:
    """Under ``lease``: make ``commit.payload`` the current version of ``commit.url``, its manifest
    listing ``fragments``; keep the newest versions (``commit.keep_versions``, at least the new
    one) and retire the fragments only the others referenced. The one home of the order that makes
    a killed write never a version and never costs a kept version a fragment: the fragments leaving
    are listed, the version is recorded, the file switched, the manifest written, then the versions
    beyond retention dropped and their fragments retired (those of this dataset's own generations
    only: :mod:`daskcfa.storage.lease`)."""
    url, profile = commit.url, commit.profile
    earlier = storage.read_manifest(url, profile)
    previous = _previous_fragments(commit, earlier)
    past, whole = _past(url, profile) if commit.mode != "w-" else ([], True)
    kept = past[:max(1, commit.keep_versions) - 1]
    references, generations, kept, complete = _retain(url, profile, earlier, past, kept, set(commit.references),
                                                      previous, commit.keep_previous, commit.header["generation"])
    storage.remove_stale_temporaries([url, commit.manifest, commit.retired, storage.abandoned_uri(url), *new,
                                      *history.unfinished(url, profile)], profile)
    manifest = {**commit.header, "generations": generations, "fragments": fragments}
    version = history.record(url, commit.payload, commit.change, commit.header["generation"],
                             past[0].id if past else None, profile, manifest)
    put_aggregation(url, commit.payload, commit.mode, profile, lease, detail=detail)
    storage.put_atomic(commit.manifest, json.dumps({**manifest, "version": version.id}, indent=1).encode(), profile)
    history.drop_except(url, [version.id, *(v.id for v in kept)], [v.id for v in past[len(kept):]],
                        past[0] if past else None, profile)
    retire(references, url, commit.retired, profile, generations)
    retire_abandoned(references if complete and whole else None, url, profile, commit.header["generation"])
    return version


def prune_versions(url: str, profile: storage.ProfileRef, lease: Lease, keep: int | None = None) -> list[str]:
    """Under ``lease``: keep the ``keep`` newest versions of ``url`` (default config
    ``daskcfa.write.keep-versions``; at least the current one), drop the others and delete the
    fragments only they referenced, at once (the rules of :func:`switch`). Returns the ids dropped."""
    lease.confirm(force=True)
    earlier = storage.read_manifest(url, profile)
    past, whole = _past(url, profile)
    kept = past[:_keep(keep)]
    references, generations, kept, complete = _retain(url, profile, earlier, past, kept, set(), set(), 0.0,
                                                      str(earlier.get("generation", "")))
    history.drop_except(url, [v.id for v in kept], [v.id for v in past[len(kept):]], past[0] if past else None,
                        profile)
    retire(references, url, storage.retired_uri(url), profile, generations)
    retire_abandoned(references if complete and whole else None, url, profile, "")
    return [v.id for v in past[len(kept):]]


def _keep(keep: int | None) -> int:
    """How many versions a commit keeps (``keep``, or the config's; 0 means 1: the current)."""
    return max(1, int(config.number("daskcfa.write.keep-versions")) if keep is None else int(keep))


def _retain(url: str, profile: storage.ProfileRef, earlier: dict[str, Any], past: list[history.Version],
            kept: list[history.Version], references: set[str], leaving: set[str], keep_for: float,
            generation: str) -> tuple[set[str], list[str], list[history.Version], bool]:
    """What a commit keeps when the ``kept`` newest of ``past`` stay: every fragment URI referenced
    (``references``, the new file's, and those of the kept versions), the dataset's own
    generations (:func:`own_generations`), the versions kept, and whether each of them could be
    read; the fragments ``leaving`` and those that only the versions beyond reference are listed
    for retirement (in ``keep_for`` seconds) first. If a kept version cannot be read, what it
    references is unknown: nothing leaves, every version stays and no abandoned generation is
    deleted (space, never a kept version's fragment)."""
    found = [_referenced(url, v, profile) for v in kept]
    complete = all(uris is not None for uris in found)
    if not complete:
        warnings.warn("a kept version cannot be read: this commit retires no fragment and drops no version",
                      CFAWarning, stacklevel=3)
        kept, leaving = past, set()
    references = references.union(*(uris or set() for uris in found))
    leaving = leaving.union(*(_made(url, v, profile) for v in past[len(kept):]))
    retired = storage.retired_uri(url)
    listed = schedule(leaving, references, url, retired, profile, keep_for)
    return references, own_generations(earlier, leaving, references, listed, url, generation), kept, complete


def _past(url: str, profile: storage.ProfileRef) -> tuple[list[history.Version], bool]:
    """The committed versions of ``url``, newest first, and whether that is all of them; an aggregation
    file no version describes is recorded first (:func:`history.adopt`). A malformed record ends the
    chain, with a warning: what lies beyond it is neither read nor deleted (nor, what it might
    reference, any abandoned generation: :func:`retire_abandoned`)."""
    history.adopt(url, profile)
    try:
        return history.chain(url, profile), True
    except CFAFormatError as exc:
        warnings.warn(f"the history stops at a malformed version record: {exc}", CFAWarning, stacklevel=3)
        return history.chain(url, profile, strict=False), False


def kept_fragments(url: str, profile: storage.ProfileRef) -> set[str]:
    """The fragment URIs the versions of ``url`` whose records are kept reference (the current one's
    too): what retirement keeps, and what ``verify --fixity`` does not call extra."""
    return set().union(*(_referenced(url, v, profile) or set() for v in history.chain(url, profile, strict=False)))


def payload_fragments(url: str, data: bytes | None, profile: storage.ProfileRef) -> set[str]:
    """The fragment URIs (absolute) the aggregation file ``data`` of ``url`` references (None: the
    file at ``url`` now)."""
    with storage.netcdf_file(url, profile=profile, whole=True, contents=data) as ds:
        found = aggregated_variables(ds, url)
    return {storage.resolve(u, url) for v in found.values() for u in v.fragments.locations()}


def _referenced(url: str, version: history.Version, profile: storage.ProfileRef) -> set[str] | None:
    """The fragments a kept ``version`` references; None, with a warning, if its copy cannot be read
    (missing for now, damaged, unreachable): then no fragment may be retired on its account."""
    try:
        return payload_fragments(url, history.payload(url, version, profile), profile)
    except (CFAError, ValueError) as exc:
        warnings.warn(f"version {version.id} cannot be read ({exc})", CFAWarning, stacklevel=3)
        return None


def _made(url: str, version: history.Version, profile: storage.ProfileRef) -> set[str]:
    """The fragments of a ``version`` leaving retention that a daskcfa writer made (in a generation
    directory, or listed in its manifest): what may be retired if no kept version references them."""
    try:
        uris = payload_fragments(url, history.payload(url, version, profile), profile)
    except (CFAError, ValueError):
        return set()  # (unreadable: nothing of it is touched)
    return _made_by_daskcfa(url, uris, storage.checked_manifest(history.manifest_of(url, version, profile)))


def _previous_fragments(commit: Commit, manifest: dict[str, Any]) -> set[str]:
    """Fragments the aggregation file about to be replaced references that a daskcfa writer
    made (in a generation directory, or listed in its manifest): what the commit may retire."""
    if commit.mode == "w-" or not storage.exists(commit.url, commit.profile):
        return set()
    try:
        uris = payload_fragments(commit.url, None, commit.profile)
    except (CFAError, ValueError):
        return set()  # not an aggregation we can read: nothing of it is touched
    return _made_by_daskcfa(commit.url, uris, manifest)


def _made_by_daskcfa(url: str, uris: set[str], manifest: dict[str, Any]) -> set[str]:
    """Those of ``uris`` that a daskcfa writer of ``url`` made: in a generation directory, or listed in
    the writer's ``manifest``."""
    listed = storage.listed_fragments(manifest, url)
    return {u for u in uris if generation_of(u) is not None or u in listed}


def publish(url: str, payload: bytes, mode: str, profile: storage.ProfileRef, change: Change, *,
            detail: str = "") -> history.Version:
    """Put an aggregation file over fragments written before (``aggregate``, ``rebuild``,
    ``relocate``) in place as a new version, under a lease. It writes no fragment, so it deletes
    none and drops no version: the next commit of a write (or :func:`daskcfa.prune`) applies the
    retention rule."""
    lease = Lease.new(url, profile).acquire()
    try:
        refuse_existing(url, mode, profile)
        parent = _past(url, profile)[0][:1] if mode != "w-" else []
        version = history.record(url, payload, change, None, parent[0].id if parent else None, profile)
        put_aggregation(url, payload, mode, profile, lease, detail=detail)
    finally:
        lease.release()
    return version


#: What writes the chunk index of a committed aggregation (its URL given): the API layer's
#: ``daskcfa.index``, bound to the write's storage options, which stay on the client.
Indexer = Callable[[str], Any]


def check_chunk_index(chunk_index: bool, compute: bool) -> None:
    """A write that is not computed now cannot index what it has not written."""
    if chunk_index and not compute:
        raise ArgumentError("chunk_index=True indexes the fragments once they are written: it needs compute=True "
                            "(or run daskcfa.index(url) after computing the write)")


def run_write(commit: Callable[[], str], lease: Lease, index: Indexer | None = None) -> str:
    """Run a write to its commit (``commit()``: computing the write graph, whose last task is
    :func:`commit_aggregation`, or calling it), give the lease back whatever happens (a no-op once
    the commit has), then write the chunk index of the aggregation committed (``index``, when asked).

    A write that fails or is interrupted leaves the previous aggregation (or none) and no lease
    behind; the chunk index, written only after the commit, never describes fragments that are not
    referenced.
    """
    try:
        url = commit()
    finally:
        lease.release()
    if index is not None:
        index(url)
    return url

