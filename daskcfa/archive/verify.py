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
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

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
    redact,
)
from ..fragments.canonical import Target, read_fragment
from ..fragments.chunk_index import VariableIndex, load_index
from ..graph.batches import MAX_TASKS
from ..graph.read import AggregatedArray
from ..model import AggregatedVariable, FragmentRef
from ..storage.access import open_aggregation

__all__ = ["Problem", "VerifyReport", "verify", "KINDS"]

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

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        how = "deep" if self.deep else "quick"
        head = (f"{redact(self.url)}: {self.checked} fragment(s) of {len(self.variables)} variable(s) checked ({how}): "
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
