"""The commit of a write: the aggregation file put in place once every fragment is, then the manifest,
the generations the dataset owns, and the retirement of the fragments the new file no longer references.

:func:`plan_commit` encodes the aggregation file on the client (every rule of
the dialect checked before the first fragment is written);
:func:`commit_aggregation` is the last task of the write graph, and what
``daskcfa.Dataset``'s aggregation writer runs at ``close()``;
:func:`run_write` is how every writer (``to_cfa``, ``refragment``,
``daskcfa.Dataset``) runs its write to that commit on the client, the lease
given back whatever happens, and then writes the chunk index of what it
committed.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any, Callable

from .. import storage
from ..errors import ArgumentError, CFAError, WriteConflictError
from ..formats import aggregated_variables
from ..formats.encode import encode_aggregation
from ..fragments.write import FragmentRecord
from ..model import AggregationDataset
from ..storage.fixity import entry
from ..storage.lease import Lease, generation_of, own_generations, retire, schedule
from ..storage.publish import UPDATE_MODES, put_aggregation

__all__ = ["Commit", "Indexer", "plan_commit", "commit_aggregation", "check_chunk_index", "run_write"]


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


def plan_commit(model: AggregationDataset, url: str, *, format: str, fragment_format: str, generation: str,
                variables: list[str], mode: str, profile: storage.ProfileRef, keep_previous: float = 0.0,
                expected: tuple[int, str] | None = None, file_format: str = "NETCDF4") -> Commit:
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
    )


def commit_aggregation(commit: Commit, records: list[list[FragmentRecord]], lease: Lease) -> str:
    """Put the aggregation file in place (every fragment has succeeded), then the manifest;
    then retire what the previous aggregation referenced and this one does not.

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
        earlier = storage.read_manifest(commit.url, commit.profile)
        previous = _previous_fragments(commit, earlier)
        listed = schedule(previous, commit.references, commit.url, commit.retired, commit.profile,
                          commit.keep_previous)
        generations = own_generations(earlier, previous, commit.references, listed, commit.url,
                                      commit.header["generation"])
        storage.remove_stale_temporaries([commit.url, commit.manifest, commit.retired, *new], commit.profile)
        resumed = sum(rec.resumed for recs in records for rec in recs)
        put_aggregation(commit.url, commit.payload, commit.mode, commit.profile, lease,
                        detail=f"generation {commit.header['generation']}: "
                               f"{sum(map(len, records)) - resumed} fragments written, {resumed} resumed")
        fragments: dict[str, dict[str, Any]] = {}
        if commit.mode in UPDATE_MODES:  # the fragments written earlier are still part of the aggregation
            fragments = earlier["fragments"]
        for variable, recs in zip(commit.variables, records):
            entries = fragments.setdefault(variable, {})
            for rec in recs:
                entries[".".join(map(str, rec.index))] = (
                    {"uri": rec.uri, "nbytes": rec.nbytes} if rec.fixity is None else entry(rec.uri, rec.fixity))
        manifest = {**commit.header, "generations": generations, "fragments": fragments}
        storage.put_atomic(commit.manifest, json.dumps(manifest, indent=1).encode(), commit.profile)
        retire(commit.references, commit.url, commit.retired, commit.profile, generations)
    finally:
        lease.release()
    return commit.url


def _previous_fragments(commit: Commit, manifest: dict[str, Any]) -> set[str]:
    """Fragments the aggregation file about to be replaced references that a daskcfa writer
    made (in a generation directory, or listed in its manifest): what the commit may retire."""
    if commit.mode == "w-" or not storage.exists(commit.url, commit.profile):
        return set()
    listed = storage.listed_fragments(manifest, commit.url)
    try:
        with storage.netcdf_file(commit.url, profile=commit.profile, whole=True) as ds:
            found = aggregated_variables(ds, commit.url)
        uris = {storage.resolve(u, commit.url) for v in found.values() for u in v.fragments.locations()}
    except (CFAError, ValueError):
        return set()  # not an aggregation we can read: nothing of it is touched
    return {u for u in uris if generation_of(u) is not None or u in listed}


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

