"""Writing the chunk index of an aggregation: :func:`index` (``daskcfa index URL``, and
``to_cfa(chunk_index=True)`` and :class:`daskcfa.Dataset` once their fragments are written: so it
sits with the API, below the archive operations).

For every fragment of every aggregated variable it records the fragment
object's size and version token (:func:`daskcfa.storage.stat`, the rule of
:mod:`daskcfa.storage.identity`), the fragment
variable's decoding attributes and where each of its chunks lies, with which
filters (the direct readers' :class:`~daskcfa.fragments.layout.StoredLayout`,
as :func:`~daskcfa.to_references` finds it, one dask task
per batch of fragments). Unlike a reference set, each fragment has its own
entry: fragments may differ in chunk shape, filters, type or encoding. The
file format and its reading: :mod:`daskcfa.fragments.chunk_index`.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import storage
from .dataset import OpenedDataset, select_aggregated
from .errors import CFAError, CFAWarning, NotFoundError, redact
from .fragments.canonical import Target, allowed_uris
from .fragments.chunk_index import INDEXED_ATTRS, entry_json, index_json, index_uri
from .fragments.files import open_fragment
from .fragments.zarr import is_zarr
from .graph.batches import in_batches
from .logs import logger
from .model import FragmentRef
from .storage.access import open_aggregation

__all__ = ["index", "IndexReport", "index_fragments"]

#: What a library below may raise on a damaged or unexpected file.
_LIBRARY_ERRORS = (OSError, ValueError, RuntimeError, KeyError, IndexError, TypeError)
#: Fragments a warning names at most (all are counted).
_LISTED = 10
log = logger(__name__)


@dataclass(frozen=True)
class IndexReport:
    """What :func:`index` wrote: the index file, the fragments and chunks it locates, and the
    fragments left out (read the usual way), each with the reason."""

    uri: str
    fragments: int
    chunks: int
    left_out: tuple[str, ...] = ()

    def __str__(self) -> str:
        out = f"{redact(self.uri)}: {self.fragments} fragment(s), {self.chunks} chunk(s) indexed"
        return out + (f"; {len(self.left_out)} fragment(s) left out" if self.left_out else "")


def index(url: str, variable: str | Sequence[str] | None = None, *,
          storage_options: Mapping[str, Any] | None = None,
          allowed_locations: Iterable[str] | None = None) -> IndexReport:
    """Write the chunk index of the aggregation at ``url`` beside it (``.<name>.chunks.json``).

    With it, :func:`~daskcfa.from_cfa` and :func:`~daskcfa.open_cfa` read HDF5
    (and netCDF-3) fragments by byte range with no HDF5 metadata: a point time
    series is one ranged read per fragment. Every aggregated variable is
    indexed (or those named by ``variable``); fragments the direct readers
    cannot locate (Zarr stores, unusual filters or types, missing files) are
    left out with a :class:`~daskcfa.CFAWarning` and read the usual way. The
    file is replaced atomically; write it again after fragments change
    (reads detect a changed fragment and do not use its entry).
    """
    url, access = open_aggregation(url, storage_options, allowed_locations)
    target_uri = index_uri(url)
    access.policy.check(target_uri)
    dataset = OpenedDataset.open(url, access=access)
    names = [variable] if isinstance(variable, str) else variable
    chosen = select_aggregated(dataset, None if names is None else list(names), url)
    found = in_batches(chosen, url, access, index_fragments, "index")
    variables: dict[str, list[dict[str, Any]]] = {}
    left_out: list[str] = []
    chunks = 0
    for av in chosen:
        entries = variables[av.name] = []
        for fragment, entry, problem in found[av.name]:
            if entry is not None:
                entries.append(entry)
                chunks += len(entry["offsets"])
            elif problem is not None:
                left_out.append(f"{av.name} fragment {fragment}: {problem}")
    storage.put_atomic(target_uri, json.dumps(index_json(url, variables), separators=(",", ":")).encode(),
                       access.profile)
    report = IndexReport(target_uri, sum(map(len, variables.values())), chunks, tuple(left_out))
    if left_out:
        more = f"; and {len(left_out) - _LISTED} more" if len(left_out) > _LISTED else ""
        message = (f"chunk index {redact(target_uri)}: {len(left_out)} fragment(s) left out (read without it): "
                   + "; ".join(left_out[:_LISTED]) + more)
        log.warning("%s", message)
        warnings.warn(message, CFAWarning, stacklevel=2)
    log.info("wrote %s", report)
    return report


def index_fragments(refs: Sequence[FragmentRef], target: Target
                    ) -> list[tuple[tuple[int, ...], dict[str, Any] | None, str | None]]:
    """The index entries of fragments of one variable (a task of :func:`index`):
    ``(fragment index, entry or None, why not or None)`` each."""
    return [_index_one(ref, target) for ref in refs]


def _index_one(ref: FragmentRef, target: Target) -> tuple[tuple[int, ...], dict[str, Any] | None, str | None]:
    if ref.is_missing or not ref.uris:
        return ref.index, None, None  # (nothing stored: nothing to index)
    where = {"file": target.source, "variable": target.variable, "fragment": ref.index}
    try:
        candidates = allowed_uris(ref.uris, target.source, target.policy, where)
    except CFAError as exc:
        return ref.index, None, exc.reason
    itemsize = np.dtype(target.dtype).itemsize
    for position, uri in enumerate(candidates):  # the first alternative found, as reads take
        if is_zarr(uri):
            return ref.index, None, "a Zarr store or reference set"
        names = ref.at_alternative(position).variable_names(target.default_identifier)
        try:
            # the version first: a fragment replaced while it is indexed then reads as changed
            size, token = storage.stat(uri, target.profile, policy=target.policy)
            with open_fragment(uri, names, profile=target.profile, policy=target.policy, fraction=1e-12,
                               expected_nbytes=math.prod(ref.shape) * itemsize) as var:
                layout = var.storage_layout()
                attrs = {k: var.attrs[k] for k in INDEXED_ATTRS if k in var.attrs}
                dims, no_fill = tuple(var.dims), var.no_fill
        except NotFoundError:
            continue
        except CFAError as exc:
            return ref.index, None, exc.reason
        except _LIBRARY_ERRORS as exc:
            return ref.index, None, redact(f"{type(exc).__name__}: {exc}")[:300]
        if not token:
            return ref.index, None, "its store gives no version (no ETag or modification time): a replaced file " \
                                    "could not be told"
        if layout is None:
            return ref.index, None, "its storage cannot be located (a type, filter or layout only netCDF-C reads)"
        if layout.dtype.kind not in "iuf":
            return ref.index, None, f"stored as {layout.dtype}, not numbers"
        return ref.index, entry_json(ref.uris[position], list(names), size, token, dims, no_fill, attrs,
                                     layout), None
    return ref.index, None, "fragment file not found"
