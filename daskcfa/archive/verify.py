"""Check that every fragment of an aggregation is there and fits: :func:`verify`.

Each fragment is checked by the read path itself
(:func:`daskcfa.fragments.canonical.read_fragment`), so verification means
exactly what reading means: the file exists (or one of its alternatives),
opens, holds the named variable with a shape that fits its place (missing
size-1 dimensions allowed), a numeric type and units convertible to the
aggregation's. The quick check reads an empty selection, which costs the
file's metadata only; ``deep=True`` then reads every value, which is what
finds corrupt compressed chunks. A fragment that the chunk index beside the
aggregation describes is also checked against its entry: one that is no
longer the object indexed (same path, another file: :mod:`daskcfa.storage.identity`)
is a ``stale-index`` problem until the index is written again.

The checks are a dask graph (batches of fragments per task), so they run in
parallel on whatever scheduler is current, a ``distributed`` cluster
included; tasks carry fragment references and an opaque storage profile,
never credentials. Every problem is reported, not just the first.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import dask
import numpy as np
from dask.delayed import Delayed

from .. import storage
from ..dataset import OpenedDataset, select_aggregated
from ..errors import (
    BudgetError,
    CFAError,
    FragmentReadError,
    FragmentShapeError,
    MissingFragmentError,
    NotFoundError,
    StorageError,
    UnitsError,
    UnsafeURIError,
    WriteConflictError,
    redact,
)
from ..fragments.canonical import Target, read_fragment
from ..fragments.chunk_index import VariableIndex, load_index
from ..graph.batches import MAX_TASKS
from ..graph.read import AggregatedArray
from ..model import AggregatedVariable, FragmentRef
from ..fragments.zarr import is_zarr, store_uri
from ..storage import fixity
from ..storage.access import open_aggregation
from ..storage.fixity import Fixity
from ..storage.lease import own_generations, retired_entries
from ..write.commit import kept_fragments
from ..storage.policy import LocationPolicy

__all__ = ["Problem", "VerifyReport", "verify", "verify_fixity", "record_fixity", "check_fixity", "KINDS",
           "FIXITY_KINDS"]

#: What can be wrong with a fragment (see :class:`Problem`).
KINDS = ("missing", "unsafe", "unreadable", "shape", "units", "corrupt", "storage", "budget", "error",
         "stale-index")

#: Deep checks read a fragment in slabs of at most this many bytes (bounded memory per task).
SLAB_BYTES = 64 << 20


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one fragment.

    ``kind`` is one of :data:`KINDS`: ``missing`` (no file at any of its
    URIs), ``unsafe`` (outside the locations the aggregation may reference),
    ``unreadable`` (not netCDF, damaged header, variable absent or not
    numeric), ``shape``, ``units``, ``corrupt`` (opens, but its data cannot be
    read: found by deep checks), ``storage`` (access denied, unreachable),
    ``budget``, ``error`` or ``stale-index`` (the file changed since the chunk
    index was written: reads do not use its entry; write the index again). ``uri`` and ``message`` never hold credentials.
    """

    variable: str
    index: tuple[int, ...]
    uri: str
    kind: str
    message: str

    def __str__(self) -> str:
        if not self.variable:  # (an object, found by a fixity check: no fragment of its own)
            return f"{self.kind}: {self.uri}: {self.message}"
        index = ",".join(map(str, self.index)) or "scalar"
        return f"{self.variable} [{index}] {self.kind}: {self.uri}: {self.message}"


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`: how many fragments were checked and what is wrong."""

    url: str
    deep: bool
    checked: int
    variables: tuple[str, ...] = ()
    problems: list[Problem] = field(default_factory=list)
    fixity: bool = False  #: a fixity check (:func:`verify_fixity`): ``checked`` counts objects

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        how = "fixity" if self.fixity else "deep" if self.deep else "quick"
        head = (f"{redact(self.url)}: {self.checked} {'object' if self.fixity else 'fragment'}(s) of {len(self.variables)} variable(s) checked ({how}): "
                + ("OK" if self.ok else f"{len(self.problems)} problem(s)"))
        return "\n".join([head, *(f"  {p}" for p in self.problems)])


def verify(
    url: str,
    *,
    deep: bool = False,
    variables: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    allowed_locations: Iterable[str] | None = None,
    compute: bool = True,
) -> VerifyReport | Delayed:
    """Check every fragment of every aggregated variable of ``url`` (or of ``variables``).

    ``deep=True`` also reads all the data. Problems are collected, never
    raised: the report's ``ok`` says whether there were any. An aggregation
    file that cannot be opened or parsed raises, as :func:`daskcfa.open_cfa`
    does. ``compute=False`` returns a :class:`dask.delayed.Delayed` computing
    the report (for progress bars, or to run with other work).
    """
    url, access = open_aggregation(url, storage_options, allowed_locations)
    chosen = select_aggregated(OpenedDataset.open(url, access=access), variables, url)
    index = load_index(url, access.profile, access.policy, "auto")
    batches = []
    checked = 0
    total = sum(len(av.fragments) for av in chosen)
    per_task = max(1, math.ceil(total / MAX_TASKS))
    for av in chosen:
        target = AggregatedArray(av, access=access).target
        refs = [ref for ref in av.fragments if ref.uris]
        checked += len(refs)
        entries = None if index is None else index.variable(av.name)
        for start in range(0, len(refs), per_task):
            batch = refs[start:start + per_task]
            indexed = _indexed(batch, target, entries)
            batches.append(dask.delayed(check_fragments, pure=True)(batch, target, deep, indexed,
                                                                    dask_key_name=_key(url, av, batch, deep, indexed)))
    report = dask.delayed(_report, pure=True)(url, deep, checked, tuple(av.name for av in chosen), *batches)
    return report.compute() if compute else report


def _key(url: str, av: AggregatedVariable, batch: list[FragmentRef], deep: bool, indexed: Mapping[Any, Any]) -> str:
    first = ".".join(map(str, batch[0].index)) or "0"
    return f"verify-{av.basename}-{first}-{dask.base.tokenize(url, av.name, batch, deep, indexed)}"


def _indexed(refs: Sequence[FragmentRef], target: Target, entries: VariableIndex | None
             ) -> dict[tuple[int, ...], tuple[str, int, str]]:
    """The fragments the chunk index describes: by fragment index, the URI (the first alternative
    with an entry) and the size and version token indexed (all a task needs of the index)."""
    found: dict[tuple[int, ...], tuple[str, int, str]] = {}
    if entries is None:
        return found
    for ref in refs:
        names = ref.variable_names(target.default_identifier)
        for reference in ref.uris:
            uri = storage.resolve(reference, target.source)
            entry = entries.entry(uri, names)
            if entry is not None:
                found[ref.index] = (uri, entry.size, entry.token)
                break
    return found


def _report(url: str, deep: bool, checked: int, variables: tuple[str, ...], *batches: list[Problem]) -> VerifyReport:
    problems = [p for batch in batches for p in batch]
    problems.sort(key=lambda p: (p.variable, p.index))
    return VerifyReport(url=url, deep=deep, checked=checked, variables=variables, problems=problems)


def check_fragments(refs: Sequence[FragmentRef], target: Target, deep: bool,
                    indexed: Mapping[tuple[int, ...], tuple[str, int, str]] | None = None) -> list[Problem]:
    """Check fragments of one variable (a task of the verification graph); ``indexed``: the
    URI, size and version token the chunk index holds for some of them (see :func:`_indexed`)."""
    problems = []
    for ref in refs:
        problem = check_fragment(ref, target, deep)
        if problem is None and indexed and ref.index in indexed:
            problem = _check_indexed(ref, target, *indexed[ref.index])
        if problem is not None:
            problems.append(problem)
    return problems


def _check_indexed(ref: FragmentRef, target: Target, uri: str, size: int, token: str) -> Problem | None:
    """A ``stale-index`` problem if fragment ``uri`` is no longer the object its index entry describes."""
    try:
        current = storage.stat(uri, target.profile, policy=target.policy)
    except CFAError:
        current = None  # (gone or unreachable since it was read: reads do not use the entry either)
    if current == (size, token):
        return None
    return Problem(variable=target.variable, index=ref.index, uri=redact(uri), kind="stale-index",
                   message="the file changed since the chunk index was written: reads do not use its entry "
                           "(write the index again: daskcfa.index(), `daskcfa index`)")


def check_fragment(ref: FragmentRef, target: Target, deep: bool) -> Problem | None:
    """What is wrong with one fragment, if anything."""
    empty = tuple(slice(0, 0, 1) for _ in ref.shape)
    try:
        read_fragment(ref, empty, target)
    except Exception as exc:  # every failure is a finding, reported with the others
        return _problem(ref, target, exc, _kind(exc))
    if not deep:
        return None
    try:
        for key in _slabs(ref.shape, target.dtype.itemsize):
            read_fragment(ref, key, target)
    except Exception as exc:
        kind = _kind(exc)
        return _problem(ref, target, exc, "corrupt" if kind in ("unreadable", "error") else kind)
    return None


def _slabs(shape: tuple[int, ...], itemsize: int) -> Iterable[tuple[slice, ...]]:
    """Keys covering a fragment in slabs along its first dimension, each at most :data:`SLAB_BYTES`."""
    if not shape:
        yield ()
        return
    row = itemsize * int(np.prod(shape[1:], dtype=np.int64))
    step = max(1, SLAB_BYTES // max(row, 1))
    rest = tuple(slice(0, n, 1) for n in shape[1:])
    for start in range(0, shape[0], step):
        yield (slice(start, min(start + step, shape[0]), 1), *rest)


def _kind(exc: BaseException) -> str:
    for cls, kind in (
        ((MissingFragmentError, NotFoundError), "missing"),
        (UnsafeURIError, "unsafe"),
        (FragmentShapeError, "shape"),
        (UnitsError, "units"),
        (FragmentReadError, "unreadable"),
        (BudgetError, "budget"),
        (StorageError, "storage"),
    ):
        if isinstance(exc, cls):
            return kind
    return "error"


def _problem(ref: FragmentRef, target: Target, exc: BaseException, kind: str) -> Problem:
    if isinstance(exc, CFAError):
        message, uri = exc.reason, exc.file
    else:
        message, uri = f"{type(exc).__name__}: {exc}", None
    if uri is None or uri == redact(target.source):
        uri = storage.resolve(ref.uris[0], target.source)
    return Problem(variable=target.variable, index=ref.index, uri=redact(uri), kind=kind,
                   message=redact(str(message)))


# --------------------------------------------------------------------------
# Fixity: the stored bytes against the checksums recorded when they were written
# --------------------------------------------------------------------------

#: What a fixity check expects of an object: the variable and fragment it holds, and the recorded fixity.
_Expected = tuple[str, tuple[int, ...], Fixity]

#: What a fixity check can find (see :func:`verify_fixity`).
FIXITY_KINDS = ("checksum", "size", "missing", "extra", "unrecorded", "unsafe", "storage", "error")


def verify_fixity(
    url: str,
    *,
    variables: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    allowed_locations: Iterable[str] | None = None,
    compute: bool = True,
) -> VerifyReport | Delayed:
    """Check the stored bytes of every fragment of ``url`` against the checksums recorded when they
    were written (the writer's manifest, or :func:`record_fixity`'s record): what finds bit rot, a
    truncated or replaced object, which reading may not.

    Problems (kinds :data:`FIXITY_KINDS`): a different ``checksum`` or ``size``, a ``missing``
    object, an ``extra`` object under the dataset's own generation directories that no fragment
    or retired fragment accounts for (only when all variables are checked), a fragment with no
    checksum recorded (``unrecorded``). Every object is read once, streamed, by a dask task (a
    batch of fragments each), on whatever scheduler is current. A manifest or record that is
    malformed or lists objects outside the dataset raises a :class:`~daskcfa.errors.CFAFormatError`.
    A commit during the check (the aggregation file or its manifest replaced: its findings could
    mix two versions, e.g. fragments retired since) runs it again, up to :data:`FIXITY_ATTEMPTS`
    times, then is a :class:`~daskcfa.errors.WriteConflictError` (with ``compute=False``: at once).
    """
    url, access = open_aggregation(url, storage_options, allowed_locations)
    attempts = 1
    while True:
        report = _fixity_graph(url, access, variables)
        if not compute:
            return report
        try:
            return report.compute()
        except WriteConflictError:
            if attempts == FIXITY_ATTEMPTS:
                raise
            attempts += 1


#: Checks :func:`verify_fixity` makes while commits keep changing the dataset under it.
FIXITY_ATTEMPTS = 3


def _fixity_graph(url: str, access: Any, variables: Sequence[str] | None) -> Delayed:
    before = _versions(url, access.profile)
    dataset = OpenedDataset.open(url, access=access)
    chosen = select_aggregated(dataset, variables, url)
    references = set(_referenced(select_aggregated(dataset, None, url), url))
    recorded = fixity.recorded(url, access.profile, references)
    wanted, problems = _fixity_targets(chosen, url, access.policy, recorded)
    per_task = max(1, math.ceil(len(wanted) / MAX_TASKS))
    items = sorted(wanted.items())
    batches = [items[i:i + per_task] for i in range(0, len(items), per_task)]
    tasks = [dask.delayed(check_fixity, pure=True)(batch, access.profile, access.policy,
                                                   dask_key_name=f"fixity-{dask.base.tokenize(url, batch)}")
             for batch in batches]
    if variables is None:
        tasks += [dask.delayed(_extra_objects, pure=True)(directory, names, access.profile)
                  for directory, names in _generation_directories(
                      url, references | kept_fragments(url, access.profile), access.profile).items()]
    return dask.delayed(_fixity_report, pure=True)(url, before, access.profile, len(items),
                                                   tuple(av.name for av in chosen), problems, *tasks)


def _versions(url: str, profile: storage.ProfileRef) -> tuple[Any, Any]:
    """What changes when a commit replaces the aggregation file or its manifest."""
    return storage.version(url, profile), storage.version(storage.manifest_uri(url), profile)


def _fixity_report(url: str, before: tuple[Any, Any], profile: storage.ProfileRef, checked: int,
                   variables: tuple[str, ...], *batches: list[Problem]) -> VerifyReport:
    if _versions(url, profile) != before:
        raise WriteConflictError("a commit changed the dataset during its fixity check (the aggregation file "
                                 "or its manifest was replaced): its findings could mix two versions; run it "
                                 "again", file=url)
    return replace(_report(url, False, checked, variables, *batches), fixity=True)


def record_fixity(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    allowed_locations: Iterable[str] | None = None,
) -> str:
    """Give checksums to the fragments of an archive daskcfa did not write: compute them (in dask
    tasks, streamed) and write the fixity record beside the aggregation file (atomically). Fragments
    with a checksum already (the writer's manifest, an earlier record) keep it and are not read: a
    record never blesses bytes changed since. Returns the record's URI. A fragment none of whose
    alternative locations holds an object raises :class:`~daskcfa.errors.MissingFragmentError`,
    writing nothing: a record never says an absent object was there."""
    url, access = open_aggregation(url, storage_options, allowed_locations)
    chosen = select_aggregated(OpenedDataset.open(url, access=access), None, url)
    references = _referenced(chosen, url)
    known = fixity.recorded(url, access.profile, set(references))
    uris = [uri for uri in references if uri not in known]
    for uri in uris:
        access.policy.check(uri)
    per_task = max(1, math.ceil(len(uris) / MAX_TASKS))
    batches = [dask.delayed(_measure_all, pure=False)(uris[i:i + per_task], access.profile, access.policy)
               for i in range(0, len(uris), per_task)]
    measured = {uri: f for batch in dask.compute(*batches) for uri, f in batch}
    for av in chosen:  # (absent alternative locations are no problem: a fragment with none present is)
        for ref in av.fragments:
            uris = [u for u in (storage.resolve(r, av.source or url) for r in ref.uris) if u != url]
            if uris and not any(u in measured or u in known for u in uris):
                raise MissingFragmentError("no object at any of its locations: nothing recorded", file=uris[0],
                                           variable=av.name, fragment=ref.index)
    recorded = {u: known[u] for u in references if u in known}
    return fixity.write_record(url, {**recorded, **measured}, access.profile)


def _referenced(chosen: Sequence[AggregatedVariable], url: str) -> list[str]:
    """Every fragment URI (alternatives included) the variables reference, absolute, the
    aggregation file itself (CFA-0.6 in-file fragments) left out."""
    uris = {storage.resolve(u, av.source or url) for av in chosen for u in av.fragments.locations()}
    return sorted(uris - {url})


def _fixity_targets(chosen: Sequence[AggregatedVariable], url: str, policy: LocationPolicy,
                    recorded: Mapping[str, Fixity]) -> tuple[dict[str, _Expected], list[Problem]]:
    """What to check, by object location: the variable and fragment first found there and the recorded
    fixity, for every fragment alternative with a checksum; and the problems found without reading
    (no checksum for any alternative, unsafe)."""
    wanted: dict[str, _Expected] = {}
    problems = []
    for av in chosen:
        for ref in av.fragments:
            uris = [storage.resolve(u, av.source or url) for u in ref.uris]
            uris = [u for u in uris if u != url]
            if not uris:
                continue
            known = [u for u in uris if u in recorded]
            for uri in known:
                if not policy.allows(uri):
                    problems.append(Problem(av.name, ref.index, redact(uri), "unsafe",
                                            "outside what the aggregation may reference: not read"))
                else:
                    wanted.setdefault(_location(uri), (av.name, ref.index, recorded[uri]))
            if not known:
                problems.append(Problem(av.name, ref.index, redact(uris[0]), "unrecorded",
                                        "no checksum recorded (record them: `daskcfa verify --record`)"))
    return wanted, problems


def _location(uri: str) -> str:
    """Where a fragment's bytes are: a Zarr store's own URI, else the URI."""
    return store_uri(uri) if is_zarr(uri) else uri


def _is_store(uri: str) -> bool:
    """A fragment stored as many objects (a Zarr store, a Parquet reference set), not one file."""
    return is_zarr(uri) and not store_uri(uri).rstrip("/").endswith(".json")


def check_fixity(items: Sequence[tuple[str, _Expected]], profile: storage.ProfileRef,
                 policy: LocationPolicy) -> list[Problem]:
    """Check stored objects against their recorded fixity (a task of :func:`verify_fixity`)."""
    problems = []
    for location, (variable, index, expected) in items:
        def problem(uri: str, kind: str, message: str) -> Problem:
            return Problem(variable, index, redact(uri), kind, redact(message))
        try:
            problems += _check_store(location, expected, profile, policy, problem) if expected.objects \
                else _check_object(location, expected.nbytes, expected.crc32, profile, policy, problem)
        except Exception as exc:  # every failure is a finding, reported with the others
            kind = {"missing": "missing", "unsafe": "unsafe", "storage": "storage"}.get(_kind(exc), "error")
            message = exc.reason if isinstance(exc, CFAError) else f"{type(exc).__name__}: {exc}"
            problems.append(problem(location, kind, str(message)))
    return problems


def _check_object(uri: str, nbytes: int, crc32: str, profile: storage.ProfileRef, policy: LocationPolicy,
                  problem: Callable[[str, str, str], Problem]) -> list[Problem]:
    stored = storage.size(uri, profile, policy=policy)
    if stored == nbytes:  # (else no need to read it)
        stored, found = fixity.file_fixity(uri, profile, policy)
        if stored == nbytes and found != crc32:
            return [problem(uri, "checksum", f"{fixity.ALGORITHM} {found}, recorded {crc32}")]
    if stored != nbytes:
        return [problem(uri, "size", f"{stored:,} bytes stored, {nbytes:,} recorded")]
    return []


def _check_store(uri: str, expected: Fixity, profile: storage.ProfileRef, policy: LocationPolicy,
                 problem: Callable[[str, str, str], Problem]) -> list[Problem]:
    base = uri.rstrip("/")
    present = storage.tree_sizes(base, profile, policy=policy)
    problems = [problem(f"{base}/{name}", "extra", "in the store, not recorded")
                for name in sorted(set(present) - {name for name, _, _ in expected.objects})]
    for name, nbytes, crc32 in expected.objects:
        if name not in present:
            problems.append(problem(f"{base}/{name}", "missing", "recorded, not stored"))
        else:
            problems += _check_object(f"{base}/{name}", nbytes, crc32, profile, policy, problem)
    return problems


def _measure_all(uris: Sequence[str], profile: storage.ProfileRef, policy: LocationPolicy
                 ) -> list[tuple[str, Fixity]]:
    """The fixity of each fragment stored at ``uris`` that is there (a task of :func:`record_fixity`)."""
    measured = []
    for uri in uris:
        location = _location(uri)
        try:
            if _is_store(uri):
                base = location.rstrip("/")
                objects = tuple(sorted((name, *fixity.file_fixity(f"{base}/{name}", profile, policy))
                                       for name in storage.tree_sizes(base, profile, policy=policy)))
                measured.append((uri, Fixity(sum(n for _, n, _ in objects), objects=objects)))
            else:
                measured.append((uri, Fixity(*fixity.file_fixity(location, profile, policy))))
        except NotFoundError:
            continue  # (an alternative location left empty; a fragment with none is refused by the caller)
    return measured


def _generation_directories(url: str, references: set[str], profile: storage.ProfileRef) -> dict[str, list[str]]:
    """The dataset's own generation directories (as its manifest names them) holding fragments it
    (or a version kept) references or retired ones, by URI, with the names below each that account
    for objects there."""
    manifest = storage.read_manifest(url, profile)
    retired = retired_entries(storage.retired_uri(url), profile)
    root = url.rpartition("/")[0] + "/"
    generation = manifest.get("generation")
    directories = own_generations(manifest, (), references, retired, url,
                                  generation if isinstance(generation, str) else "")
    known = {*(u[len(root):] for u in references if u.startswith(root)), *retired}
    return {root + d + "/": sorted(posixpath.basename(r) for r in known if posixpath.dirname(r) == d)
            for d in directories}


def _extra_objects(directory: str, names: Sequence[str], profile: storage.ProfileRef) -> list[Problem]:
    """Objects under a generation directory that no fragment named ``names`` accounts for (resume
    markers, in its hidden ``.daskcfa/``, are bookkeeping)."""
    try:
        present = storage.tree_sizes(directory.rstrip("/"), profile)
    except NotFoundError:
        return []
    accounted = set(names)
    return [Problem("", (), redact(directory + name), "extra", "under the dataset's generation directory, "
                    "but no fragment of the aggregation (nor a retired one) is stored there")
            for name in sorted(present)
            if name.split("/")[0] not in accounted and not name.startswith(".daskcfa/")]
