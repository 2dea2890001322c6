"""The chunk index beside an aggregation file: where every HDF5 chunk of every fragment lies.

``daskcfa index URL`` (:mod:`daskcfa.index_writer`) writes, beside the
aggregation file ``t.nc``, the JSON file ``.t.nc.chunks.json`` (:func:`index_uri`)::

    {"format": "daskcfa-chunk-index", "version": 2, "aggregation": "t.nc",
     "variables": {"/tas": [
        {"uri": "t/f0.nc",              # as the aggregation file names the fragment
         "size": 1234, "token": "...",  # storage.stat's size and version token when indexed
                                        # (daskcfa.storage.identity: inode, ctime, mtime, size; an ETag)
         "variables": ["tas"],          # the names it was looked up by in its file, in order
         "dims": [...], "no_fill": false,
         "attrs": {"_FillValue": {"dtype": "<f4", "data": [1e20]}, "units": {"text": "K"}},
         "dtype": "<f4", "shape": [...], "chunks": [...],
         "filters": [[2, [4]], [1, [1]]], "fill": {"dtype": "<f4", "data": [0.0]},
         "starts": [[0, 0, 0], ...], "offsets": [...], "sizes": [...], "masks": [...]}, ...]}}

Reads of an indexed fragment then need no HDF5 metadata: the chunks holding a
selection are fetched by byte range (one ranged GET each on S3, ``pread``
locally) and decoded by :class:`~daskcfa.fragments.hdf5.StoredVariable`, as
the direct HDF5 reader decodes them. An entry serves only the object it
describes: reads go through :func:`daskcfa.storage.read_ranges_unchanged`
(S3 ``If-Match`` on the GET, ``fstat`` of the open file locally), and a
fragment that changed raises :class:`IndexedFragmentChanged`, upon which the
caller reads it the usual way, with one warning per opened dataset however
many fragments changed (:meth:`VariableIndex.changed`: a copied archive has
new inodes, so every fragment reads as changed). Along a walk (a time series),
the chunks the next fragments' reads will fetch are known before their tasks
run: :func:`read_ahead` starts fetching them (:mod:`.readahead`, each range one
GET with the same ``If-Match``), and the reads take them instead of a GET.

The index is trusted as far as the aggregation file is (it lives beside it
and may only point at the fragments the aggregation names, which pass the
safe-URI policy), but it is checked like any input: a file that is not a
chunk index, or an entry that is out of bounds (chunks off the grid, byte
ranges past the fragment's size, a stored chunk larger than its values can
take, filters not undone here, no version token) is left out with a
:class:`CFAWarning`; never read into memory beyond ``daskcfa.limits.max-memory``.
An index of version 1 (whose local tokens were the modification time alone,
blind to a file replaced with its time kept) is not used: it is reported as
needing to be written again.
"""

from __future__ import annotations

import functools
import json
import math
import secrets
import threading
import warnings
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import dask.config
import numpy as np

from .. import storage
from ..decode import STORAGE_ATTRS
from ..errors import ArgumentError, CFAError, CFAFormatError, CFAWarning, NotFoundError, redact
from ..limits import max_memory
from ..logs import logger
from ..storage.access import Access
from ..storage.policy import LocationPolicy
from ..storage.profiles import ProfileRef
from . import readahead
from .hdf5 import StoreInfo, StoredVariable
from .hdf5_filters import SHUFFLE, SUPPORTED_FILTERS, pipeline_of
from .layout import StoredLayout

__all__ = ["FORMAT", "ChunkIndex", "VariableIndex", "IndexEntry", "IndexedVariable", "IndexedFragmentChanged",
           "INDEXED_ATTRS", "index_uri", "entry_json", "index_json", "load_index", "indexed", "read_ahead"]

FORMAT = "daskcfa-chunk-index"
_VERSION = 2
#: The fragment attributes a read uses (masking, packing, units), recorded with each entry.
INDEXED_ATTRS = (*STORAGE_ATTRS, "units", "calendar")
#: An index file may take this share of ``daskcfa.limits.max-memory`` (parsed JSON takes several times more).
_FILE_SHARE = 16
#: Entries a warning names at most (all are counted).
_LISTED = 5
#: The opened datasets (:attr:`VariableIndex.dataset`) whose stale index this process has warned of.
_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()
log = logger(__name__)


class IndexedFragmentChanged(Exception):
    """The fragment is no longer the object its index entry describes (read it the usual way)."""


def index_uri(aggregation: str) -> str:
    """Where the chunk index of the aggregation file at ``aggregation`` lives: ``.<name>.chunks.json`` beside it."""
    head, _, name = aggregation.rpartition("/")
    return f"{head}/.{name}.chunks.json" if head else f".{name}.chunks.json"


# -- writing --------------------------------------------------------------------------------------


def _values(value: Any) -> dict[str, Any]:
    """An attribute or fill value as JSON that reads back to the same type and bits."""
    if isinstance(value, (str, bytes)):
        return {"text": value.decode("utf-8", "replace") if isinstance(value, bytes) else value}
    array = np.asarray(value)
    if array.dtype.kind in "SU":
        return {"text": str(array.astype(str).reshape(-1)[0]) if array.size else ""}
    return {"dtype": array.dtype.str, "data": array.reshape(-1).tolist()}


def entry_json(reference: str, variables: Sequence[str], size: int, token: str, dims: Sequence[str],
               no_fill: bool, attrs: Mapping[str, Any], layout: StoredLayout) -> dict[str, Any]:
    """One fragment's entry: the object (``reference`` as the aggregation names it, its ``size``
    and version ``token``), its variable (looked up by ``variables``, in order), its decoding
    attributes and where its chunks lie."""
    return {"uri": reference, "size": int(size), "token": str(token), "variables": [str(v) for v in variables],
            "dims": [str(d) for d in dims], "no_fill": bool(no_fill),
            "attrs": {k: _values(attrs[k]) for k in INDEXED_ATTRS if k in attrs},
            "dtype": layout.dtype.str, "shape": [int(n) for n in layout.shape],
            "chunks": [int(n) for n in layout.chunks],
            "filters": [[int(code), [int(v) for v in values]] for code, values in layout.filters],
            "fill": _values(layout.dtype.type(0) if layout.fill_value is None else layout.fill_value),
            "starts": layout.starts.tolist(), "offsets": layout.byte_offsets.tolist(),
            "sizes": layout.sizes.tolist(), "masks": layout.filter_masks.tolist()}


def index_json(aggregation: str, variables: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The whole index of the aggregation file at ``aggregation``: entries per aggregated variable."""
    return {"format": FORMAT, "version": _VERSION, "aggregation": aggregation.rpartition("/")[2],
            "variables": dict(variables)}


# -- reading --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class IndexEntry:
    """One fragment's entry, checked: everything needed to read it without opening it as HDF5."""

    uri: str
    size: int
    token: str
    variables: tuple[str, ...]
    dims: tuple[str, ...]
    no_fill: bool
    attrs: dict[str, Any]
    layout: StoredLayout

    @property
    def contiguous(self) -> bool:
        """Stored as one unfiltered block of its whole shape (read by sub-range, as contiguous HDF5 is)."""
        layout = self.layout
        return not layout.filters and layout.chunks == layout.shape and len(layout.sizes) <= 1

    @functools.cached_property
    def chunk_infos(self) -> dict[tuple[int, ...], StoreInfo]:
        """Its stored chunks by their first element: built once per process (a read, and a read
        ahead, of the fragment looks chunks up in it)."""
        layout = self.layout
        return {tuple(start): StoreInfo(tuple(start), int(mask), int(offset), int(size))
                for start, mask, offset, size in zip(layout.starts.tolist(), layout.filter_masks.tolist(),
                                                     layout.byte_offsets.tolist(), layout.sizes.tolist())}

    def chunk_ranges(self, key: tuple) -> list[tuple[int, int]]:
        """The byte ranges of the chunks a read at ``key`` (in the fragment's own dimensions) fetches.
        The last key's are remembered: a walk plans each fragment ahead of it several times."""
        planned = self.__dict__.get("_planned")
        if planned is None or planned[0] != key:
            planned = (key, IndexedVariable(self.uri, self, storage.NO_PROFILE, None).chunk_ranges(key))
            object.__setattr__(self, "_planned", planned)  # (a cache, not a field: frozen all the same)
        return planned[1]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("chunk_infos", "_planned")}  # (rebuilt where read)


class VariableIndex:
    """The entries of one aggregated variable, by fragment URI (resolved): what a read task carries.

    ``dataset`` names the opened dataset (the index, its version and this opening): the variables
    of one dataset share it, so that fragments found changed are reported once for all of them.
    """

    def __init__(self, entries: Mapping[str, IndexEntry], token: str, dataset: str) -> None:
        self._entries = dict(entries)
        self._token = token
        self.dataset = dataset

    def __dask_tokenize__(self) -> str:
        return self._token

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, uri: str, names: Sequence[str]) -> IndexEntry | None:
        """The entry of fragment ``uri`` when it was indexed looking its variable up by ``names``
        (None: read it the usual way)."""
        entry = self._entries.get(uri)
        return entry if entry is not None and entry.variables == tuple(names) else None

    def changed(self, uri: str, variable: str, fragment: tuple[int, ...]) -> None:
        """Report that fragment ``uri`` is no longer the object its entry describes (it is then
        read without it): one warning per opened dataset in this process, the rest logged. After a
        copy of the archive (``cp -r``: new inodes) every fragment reads as changed."""
        where = str(CFAError("the fragment changed since the chunk index was written", file=uri, variable=variable,
                             fragment=fragment))
        with _WARNED_LOCK:
            first = self.dataset not in _WARNED
            _WARNED.add(self.dataset)
        if not first:
            log.debug("%s", where)
            return
        index = self.dataset.partition("|")[0]
        message = (f"chunk index {redact(index)} is stale: {where}. Fragments that changed (this one and any "
                   "other: this is said once per dataset opened) are read without the index, correctly but more "
                   "slowly; `daskcfa verify` lists them; write the index again (daskcfa.index(), `daskcfa index`)")
        log.warning("%s", message)
        warnings.warn(message, CFAWarning, stacklevel=3)


class ChunkIndex:
    """A chunk index as read (checked) beside an aggregation file."""

    def __init__(self, uri: str, token: str, variables: Mapping[str, VariableIndex]) -> None:
        self.uri = uri
        self.token = token
        self._variables = dict(variables)

    def variable(self, name: str) -> VariableIndex | None:
        """The entries of the aggregated variable ``name`` (None: none indexed)."""
        return self._variables.get(name)


def indexed(aggregation: str, access: Access, use: bool | str | None) -> Access:
    """``access`` with the chunk index of the aggregation at ``aggregation`` loaded as ``use`` asks
    (:func:`load_index`). Called once the aggregation file has been read: an unreachable store then
    fails once, on the aggregation file, not first on the index beside it."""
    return replace(access, chunk_index=load_index(aggregation, access.profile, access.policy, use))


def load_index(aggregation: str, profile: ProfileRef, policy: LocationPolicy,
               use: bool | str | None) -> ChunkIndex | None:
    """The chunk index beside the aggregation file at ``aggregation``, if ``use`` asks for it.

    ``use``: ``"auto"`` (read it when present; an unusable one is left out with a
    :class:`CFAWarning`), True (it must be there and usable: else a
    :class:`CFAFormatError` or :class:`NotFoundError`), False (never looked for),
    None (dask config ``daskcfa.io.chunk-index``).
    """
    if use is None:
        use = dask.config.get("daskcfa.io.chunk-index", "auto")
    if not (use is True or use is False or use == "auto"):
        raise ArgumentError(f"chunk_index must be True, False or 'auto', got {use!r}")
    required = use is True
    if use is False or (storage.is_opendap(aggregation) and not required):  # (an endpoint: nothing beside it)
        return None
    uri = index_uri(aggregation)
    try:
        policy.check(uri)  # (beside the aggregation: allowed where the aggregation is)
        size, token = storage.stat(uri, profile, policy=policy, objects_only=True)
    except NotFoundError:
        if required:
            raise NotFoundError("chunk_index=True, but the aggregation has no chunk index (write one with "
                                "daskcfa.index() or `daskcfa index`)", file=uri) from None
        return None
    except CFAError as exc:  # (a store may refuse to say whether an object it does not hold exists: 403)
        if required:
            raise
        log.debug("no chunk index looked for at %s: %s", redact(uri), exc)
        return None
    try:
        limit = max_memory() // _FILE_SHARE
        if size > limit:
            raise CFAFormatError(f"the chunk index has {size:,} bytes, more than {limit:,} (a sixteenth of dask "
                                 "config 'daskcfa.limits.max-memory')", file=uri)
        raw = storage.read_bytes(uri, profile, known_size=size, policy=policy)
        index = _parse(raw, uri, token, aggregation, policy)
    except CFAError as exc:
        if required:
            raise
        _warn(f"the chunk index is not used: {exc}")
        return None
    return index


def _warn(message: str) -> None:
    log.warning("%s", message)
    warnings.warn(message, CFAWarning, stacklevel=4)


def _parse(raw: bytes, uri: str, token: str, aggregation: str, policy: LocationPolicy) -> ChunkIndex:
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CFAFormatError(f"not a chunk index (not JSON: {str(exc)[:100]})", file=uri) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CFAFormatError(f"not a chunk index (no \"format\": {FORMAT!r})", file=uri)
    if document.get("version") == 1:
        raise CFAFormatError("chunk index version 1, whose version tokens of local files (their modification "
                             "time alone) cannot tell a file replaced with its time kept: write it again with "
                             "daskcfa.index()", file=uri)
    if document.get("version") != _VERSION:
        raise CFAFormatError(f"chunk index version {document.get('version')!r}: this daskcfa reads version "
                             f"{_VERSION} (write it again with daskcfa.index())", file=uri)
    variables = document.get("variables")
    if not isinstance(variables, dict):
        raise CFAFormatError("not a chunk index (no \"variables\" mapping)", file=uri)
    parsed: dict[str, VariableIndex] = {}
    refused: list[str] = []
    dataset = f"{uri}|{token}|{secrets.token_hex(8)}"  # (this opening: its stale entries are warned of once)
    for name, entries in variables.items():
        if not isinstance(name, str) or not isinstance(entries, list):
            raise CFAFormatError(f"variable {name!r} has no list of fragments", file=uri)
        found: dict[str, IndexEntry] = {}
        for position, item in enumerate(entries):
            try:
                entry = _entry(item)
                resolved = storage.resolve(entry.uri, aggregation)
                if not policy.allows(resolved):
                    raise ValueError(f"{redact(resolved)} is not an allowed location")
            except (ValueError, TypeError, KeyError, OverflowError, CFAError) as exc:
                refused.append(f"{name} #{position}: {redact(str(exc))[:200]}")
                continue
            found[resolved] = entry
        parsed[name] = VariableIndex(found, f"{uri}|{token}|{name}", dataset)
    if refused:
        more = f" and {len(refused) - _LISTED} more" if len(refused) > _LISTED else ""
        _warn(f"chunk index {redact(uri)}: {len(refused)} entries left out (their fragments are read without "
              f"it): {'; '.join(refused[:_LISTED])}{more}")
    return ChunkIndex(uri, token, parsed)


def _entry(item: Any) -> IndexEntry:
    """One entry, checked (ValueError, TypeError or KeyError: why it cannot serve)."""
    if not isinstance(item, dict):
        raise TypeError("an entry is not a mapping")
    uri, token, variables = item["uri"], item["token"], tuple(item["variables"])
    if not all(isinstance(v, str) for v in (uri, token, *variables)) or not uri or not variables:
        raise TypeError("uri, token and variables must be strings")
    if not token:
        raise ValueError("no version token: a replaced fragment could not be told")
    size = _integer(item["size"], "size")
    dtype = np.dtype(item["dtype"])
    if dtype.kind not in "iuf" or dtype.itemsize not in (1, 2, 4, 8):
        raise ValueError(f"type {dtype.str} is not a number type the direct reader decodes")
    shape = tuple(_integer(n, "shape") for n in item["shape"])
    chunks = tuple(_integer(n, "chunks") for n in item["chunks"])
    if len(chunks) != len(shape) or (shape and min(chunks) < 1):
        raise ValueError(f"chunks {chunks} do not fit shape {shape}")
    filters = tuple((_integer(code, "filter"), tuple(_integer(v, "filter parameter") for v in values))
                    for code, values in item["filters"])
    for code, values in filters:
        if code not in SUPPORTED_FILTERS:
            raise ValueError(f"HDF5 filter {code} is not one the direct reader undoes")
        if code == SHUFFLE and not (values and 1 <= values[0] <= 255):
            raise ValueError(f"shuffle without its element size ({values})")
    n = len(item["offsets"])
    starts = np.asarray(item["starts"], np.int64).reshape(n, len(shape))
    offsets = np.asarray(item["offsets"], np.int64).reshape(n)
    sizes = np.asarray(item["sizes"], np.int64).reshape(n)
    masks = np.asarray(item["masks"], np.int64).reshape(n)
    chunk_nbytes = math.prod(chunks) * dtype.itemsize
    grid = [-(-s // c) for s, c in zip(shape, chunks)]
    if n > math.prod(grid):
        raise ValueError(f"{n} chunks where the shape holds {math.prod(grid)}")
    if n:
        if (starts < 0).any() or (starts % np.array(chunks, np.int64)).any() or (starts >= np.array(shape)).any():
            raise ValueError("chunk starts off the chunk grid or outside the shape")
        if len({tuple(row) for row in starts.tolist()}) != n:
            raise ValueError("a chunk listed twice")
        if (offsets < 0).any() or (sizes < 1).any() or (offsets + sizes > size).any():
            raise ValueError(f"byte ranges outside the fragment's {size} bytes")
        if (masks < 0).any() or (masks >= 1 << len(filters)).any():
            raise ValueError("filter masks naming filters the chunk does not have")
        unfiltered = masks == (1 << len(filters)) - 1
        if (sizes[unfiltered] != chunk_nbytes).any():
            raise ValueError(f"an unfiltered chunk of other than {chunk_nbytes} bytes")
        # (deflate, blosc, zstd and bzip2 add at most a few per cent to incompressible data)
        if (sizes > chunk_nbytes + chunk_nbytes // 8 + 1024).any():
            raise ValueError(f"stored chunks larger than their {chunk_nbytes} bytes of values can take")
    attrs = {k: _attribute(v) for k, v in item["attrs"].items() if k in INDEXED_ATTRS}
    layout = StoredLayout(dtype=dtype, shape=shape, chunks=chunks, filters=filters,
                          fill_value=_attribute(item["fill"]), starts=starts, byte_offsets=offsets, sizes=sizes,
                          filter_masks=masks)
    dims = tuple(item["dims"])
    if len(dims) != len(shape) or not all(isinstance(d, str) for d in dims):
        raise ValueError(f"dimension names {dims} do not fit shape {shape}")
    return IndexEntry(uri, size, token, variables, dims, bool(item["no_fill"]), attrs, layout)


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
        raise ValueError(f"{what} {value!r} is not a non-negative integer")
    return value


def _attribute(value: Any) -> Any:
    if not isinstance(value, dict):
        raise TypeError("an attribute is not a mapping")
    if "text" in value:
        if not isinstance(value["text"], str):
            raise TypeError("text attribute is not a string")
        return value["text"]
    dtype = np.dtype(value["dtype"])
    if dtype.kind not in "iuf":
        raise ValueError(f"attribute type {dtype.str}")
    data = np.asarray(value["data"], dtype)
    if data.ndim != 1 or not 0 < data.size <= 1024:
        raise ValueError("attribute values are not a short list")
    return data[0] if data.size == 1 else data


class IndexedVariable(StoredVariable):
    """A fragment variable read from its index entry alone: no HDF5 metadata, no file handle kept.

    Every fetch is of the object the entry describes, or raises
    :class:`IndexedFragmentChanged` (nothing of a changed object is decoded).
    """

    def __init__(self, uri: str, entry: IndexEntry, profile: ProfileRef, policy: LocationPolicy | None) -> None:
        layout = entry.layout
        self.name = entry.variables[-1]
        self.dims = entry.dims
        self.attrs = entry.attrs
        self.no_fill = entry.no_fill
        self._uri, self._expected, self._profile, self._policy = uri, (entry.size, entry.token), profile, policy
        contiguous = entry.contiguous
        self._ahead = _read_ahead_applies(uri, entry)
        self._local = storage.is_local(uri)
        offset = int(layout.byte_offsets[0]) if contiguous and len(layout.byte_offsets) else None
        super().__init__(layout.dtype, layout.shape, None if contiguous else layout.chunks, offset,
                         pipeline_of(layout.filters), layout.fill_value, self._fetch,
                         f"variable {self.name!r} of {redact(uri)}, through its chunk index")
        self._index = {} if contiguous else entry.chunk_infos

    def _fetch(self, ranges: list[tuple[int, int]]) -> Sequence[Any]:
        token = self._expected[1]
        got = [None] * len(ranges) if not self._ahead else [
            readahead.take_range(self._uri, offset, length, token, self._profile, self._policy)
            for offset, length in ranges]
        missing = [k for k, data in enumerate(got) if data is None]
        if missing:
            fetched = storage.read_ranges_unchanged(self._uri, [ranges[k] for k in missing], self._expected,
                                                    self._profile, policy=self._policy)
            if fetched is None:
                raise IndexedFragmentChanged(f"fragment {redact(self._uri)} changed since its chunk index was written")
            for k, data in zip(missing, fetched):
                got[k] = data
        return got

    def _chunk_infos(self, coords: list[tuple[int, ...]]) -> list[StoreInfo | None]:
        return [self._index.get(c) for c in coords]


def _read_ahead_applies(uri: str, entry: IndexEntry) -> bool:
    """Whether reads of this indexed fragment are read ahead: not a contiguous one (many small
    sub-ranges) nor a local one (``pread`` costs no round trip); those are left to their reads."""
    return not (entry.contiguous or storage.is_local(uri))


def read_ahead(fragments: Sequence[tuple[str, IndexEntry, tuple]], profile: ProfileRef,
               policy: LocationPolicy | None) -> None:
    """Start fetching the chunks that reads of these indexed fragments will fetch, nearest first
    (:func:`.readahead.read_ahead_ranges`): each fragment's URI, entry and the key (in its own
    dimensions) it will be read at. Each GET carries the version check its own read would."""
    wanted = []
    for uri, entry, key in fragments:
        if not _read_ahead_applies(uri, entry):
            continue
        try:
            ranges = entry.chunk_ranges(key)
        except (IndexError, ValueError):  # best effort: the read itself reports any error
            continue
        if ranges:
            wanted.append((uri, (entry.size, entry.token), ranges))
    readahead.read_ahead_ranges(wanted, profile, policy)

