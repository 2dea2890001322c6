"""The read graph: an aggregated variable as a dask array whose chunks are fragments.

:class:`AggregatedArray` is a lazily indexed array (in the manner of
xarray's backend arrays): indexing it reads just the needed part of just the
needed fragments. ``dask.array.from_array`` turns it into one task per chunk,
and dask fuses later slicing into those tasks, so ``x[:, 5, 7]`` reads one
point per fragment rather than whole fragments.

A chunk may also hold whole neighbouring fragments (``chunks="256MiB"``):
worth it for thousands of kilobyte fragments, where a dask task costs more
than reading one; a chunk's task then fetches its own next small remote
objects ahead, as a walk across chunks does.
"""

from __future__ import annotations

import itertools
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dask
from ..lazy import dask_array as da
import numpy as np
from dask.utils import parse_bytes

from ..decode import Encoding, join_chars, joined_dtype, text_encoding
from ..errors import ArgumentError, CFAFormatError, FragmentReadError
from .. import storage
from ..fragments import chunk_index, readahead
from ..fragments.chunk_index import IndexEntry
from ..fragments.canonical import Target, read_fragment, reference_set_chunks
from ..fragments.files import whole_object_wanted
from ..fragments.zarr import is_reference_set
from ..model import AggregatedVariable
from ..storage.access import Access
from .indexing import array_axis_move, expand_key, output_shape, split_key
from .plan import merged_chunks, subdivided_chunks

__all__ = ["AggregatedArray", "Access", "to_dask"]

#: Fragments whose read-ahead URI an array remembers at most.
_AHEAD_REMEMBERED = 4096
#: Most reference-set fragments whose chunk grids cut the default chunks (their metadata is read on
#: the client when the graph is built); beyond it each fragment is one chunk.
_CHUNKED_INSPECTED = 256
#: Reference sets whose metadata is read at once when the graph is built.
_INSPECTING_THREADS = 16
#: Most chunks reference sets' chunk grids may make: beyond it, chunks are whole multiples of theirs.
_MOST_CHUNKS = 100_000


class AggregatedArray:
    """Read-on-demand view of one aggregated variable (numpy indexing semantics)."""

    def __init__(self, variable: AggregatedVariable, *, mask: bool = True, access: Access | None = None,
                 decode: bool = True, strings: bool = True, nan_where: Encoding | None = None) -> None:
        access = (access or Access.default(variable.source)).with_logins(variable.logins)
        self.variable = variable
        self.mask = mask
        #: False: stored values (missing points hold the fill value), for clients
        #: such as xarray that apply the variable's own masking and packing
        self.decode = decode
        self.encoding = Encoding.from_attrs(variable.attrs, variable.dtype)
        if nan_where is not None and (decode or self.encoding.stored_dtype.kind != "f"
                                      or nan_where.dtype != self.encoding.stored_dtype or nan_where.is_packed):
            raise ArgumentError("nan_where: stored values of a float variable only, by an unpacked encoding of its type")
        #: with ``decode=False``, a float variable's masking done here (by ``nan_where.missing_mask``, which
        #: then passes on a fragment stored with that encoding as it is stored): NaN where it marks stored
        #: values and at every missing point, for xarray, which masks such a variable so and does no more
        self.nan_where = nan_where
        attrs = variable.attrs
        try:
            chars_encoding = text_encoding(attrs, variable.dtype, len(variable.shape))
        except ValueError as exc:
            raise CFAFormatError(str(exc), file=variable.source, variable=variable.name) from None
        #: a char variable with ``_Encoding``: its last dimension (the string length)
        #: joined into strings, as netCDF4-python returns it (None: characters; ``strings=False``
        #: keeps them, for writers that store the variable as it was)
        self.text = chars_encoding if decode and strings else None
        self.shape = variable.shape[:-1] if self.text else variable.shape
        self.ndim = len(self.shape)
        if self.text:
            self.dtype = joined_dtype(self.text, variable.shape[-1])
        else:
            self.dtype = self.encoding.decoded_dtype if decode else np.dtype(variable.dtype)
        self.target = Target(
            variable=variable.name,
            source=variable.source,
            dims=variable.dims,
            dtype=self.encoding.stored_dtype,
            units=None if attrs.get("units") is None else str(attrs["units"]),
            calendar=None if attrs.get("calendar") is None else str(attrs["calendar"]),
            profile=access.profile,
            policy=access.policy,
            missing=access.missing,
            masked_as=self._masked_as(decode and mask or bool(chars_encoding)),
            text_encoding=chars_encoding,
            chunk_index=None if access.chunk_index is None else access.chunk_index.variable(variable.name),
        )
        self._last_read: tuple[int, ...] | None = None  # fragment read last (read-ahead's guide)
        self._ahead_uris: dict[tuple[int, ...], tuple[str | None, int]] = {}
        self._entries: dict[tuple[int, ...], tuple[str, IndexEntry, bool] | None] = {}  # (indexed fragments looked up)

    def __repr__(self) -> str:
        return f"AggregatedArray({self.variable.name!r}, shape={self.shape}, dtype={self.dtype})"

    def __getstate__(self) -> dict:
        # what read-ahead learnt in this process stays here (a worker starts afresh)
        return {**self.__dict__, "_last_read": None, "_ahead_uris": {}, "_entries": {}}

    def __dask_tokenize__(self) -> str:
        # The aggregation file's version (a rewrite gives new fragment names, so a new version), not
        # the storage profile's name, which differs between processes: a resumed write must match.
        # (Tokenized here: dask does not normalise what this returns, so the policy's own token
        # would not be used.)
        return dask.base.tokenize(
            type(self).__name__, self.variable.source, storage.version(self.variable.source, self.target.profile),
            self.variable.name, self.mask, self.decode, self.nan_where, self.text, self.target.policy, self.target.missing,
            self.target.chunk_index)

    def __getitem__(self, key: Any) -> np.ndarray:
        grid = self.variable.fragments.grid
        if self.text:  # whole strings: every character
            key = expand_key(key, self.ndim) + (slice(None),)
        dims = split_key(grid, key)
        stored = self._assemble(dims)
        raw = np.ma.getdata(stored)
        missing = np.ma.getmask(stored)
        if self.text:  # characters as stored, the fill value where missing (joined below)
            result = stored if missing is np.ma.nomask else np.ma.MaskedArray(
                np.where(missing, self.encoding.output_fill, raw), mask=missing)
        elif not self.decode:
            result = self._stored(raw, missing)
        else:
            from .masked import MaskedChunk  # (with dask.array's dispatch: not for metadata-only work)

            # (a masked chunk made as such, not as a view of another masked array it would keep alive)
            result = self.encoding.decode(raw, mask=self.mask, extra_mask=None if missing is np.ma.nomask else missing,
                                          masked_type=MaskedChunk)
        flips = tuple(slice(None, None, -1) if d.reverse else slice(None) for d in dims if d.length is not None)
        if any(d.reverse for d in dims):
            result = result[flips]
        move = array_axis_move(key, len(self.variable.shape))
        result = result if move is None else np.moveaxis(result, *move)
        return self._join(result) if self.text else result

    def _masked_as(self, masked: bool) -> Encoding | None:
        """The masking the caller applies to the assembled values (:attr:`Target.masked_as`): a
        fragment stored with it is then passed on as stored. Stored values (``decode=False``) are
        those of such a fragment as it stores them (its ``missing_value`` too, as xarray reads
        the fragment), unless it has a valid range, which xarray ignores but the fragment's own
        decoding (netCDF4-python's rules) applies, as to a fragment stored otherwise."""
        if masked:
            return self.encoding
        if self.decode:
            return None
        if self.nan_where is not None:
            return self.nan_where
        return self.encoding if self.encoding.valid_min is None and self.encoding.valid_max is None else None

    def _stored(self, raw: np.ndarray, missing: Any) -> np.ndarray:
        """Stored values in the variable's own type (xarray applies ``_Unsigned``): missing points
        hold the fill value, or NaN, as do the values ``nan_where`` marks."""
        fill = self.encoding.output_fill
        if self.nan_where is not None:
            fill = np.nan
            marked = self.nan_where.missing_mask(raw)
            if marked is not None and marked.any():
                missing = marked if missing is np.ma.nomask else missing | marked
        if missing is not np.ma.nomask:
            raw = np.where(missing, np.asarray(fill).astype(raw.dtype), raw)
        return raw.view(self.dtype) if raw.dtype != self.dtype else raw

    def _join(self, chars: np.ma.MaskedArray) -> np.ndarray:
        """Characters joined into strings (netCDF4-python's rule); a string with a
        character from a missing fragment is masked, as missing strings are."""
        try:
            strings = join_chars(np.ma.getdata(chars), self.text)
        except UnicodeDecodeError as exc:
            raise FragmentReadError(f"characters {exc.object[:80]!r} are not {self.text} text, as the variable's "
                                    f"_Encoding says ({exc.reason})", file=self.variable.source,
                                    variable=self.variable.name) from None
        if not self.mask:
            return strings
        missing = np.ma.getmask(chars)
        result = np.ma.MaskedArray(strings, mask=np.ma.nomask if missing is np.ma.nomask else missing.any(axis=-1))
        result.set_fill_value("" if strings.dtype.kind == "U" else b"")
        return result

    def _assemble(self, dims: list) -> np.ndarray:
        """Read every fragment piece the index touches, in canonical (stored) form (masked where any
        is missing: taken apart with ``np.ma.getdata`` and ``np.ma.getmask``)."""
        shape = output_shape(dims)
        combos = list(itertools.product(*(d.pieces for d in dims)))
        if not combos:
            return np.ma.MaskedArray(np.empty(shape, self.target.dtype))
        if len(combos) == 1:
            self._read_ahead(combos[0])
            return self._piece(combos[0])
        # values and mask assembled apart: masked-array item assignment costs ~3x a copy
        values = np.empty(shape, self.target.dtype)
        mask = np.ma.nomask
        depth = readahead.depth()  # (looked up once a chunk: it reads the dask config)
        for k, pieces in enumerate(combos):
            if depth:
                self._read_ahead_within(combos, k, depth)
            block = self._piece(pieces)
            where = _placement(pieces)
            values[where] = np.ma.getdata(block)
            block_mask = np.ma.getmask(block)
            if block_mask is not np.ma.nomask and block_mask.any():
                if mask is np.ma.nomask:
                    mask = np.zeros(shape, bool)
                mask[where] = block_mask
        return np.ma.MaskedArray(values, mask=mask, copy=False)

    def _piece(self, pieces: tuple) -> np.ndarray:
        """One fragment's part of the index, in canonical form."""
        ref = self.variable.fragments[tuple(p.fragment for p in pieces)]
        return _take(read_fragment(ref, tuple(p.local for p in pieces), self.target), pieces)

    def _read_ahead(self, pieces: tuple) -> None:
        """When reads walk along one fragment axis (a time series, say), start
        fetching the next small remote fragments on it (see :mod:`..fragments.readahead`)."""
        index = tuple(p.fragment for p in pieces)
        last, self._last_read = self._last_read, index
        if last is None or self.is_local(index):  # (looked at first: cheaper than the depth, on a worker)
            return
        depth = readahead.depth()
        if not depth:
            return
        moved = [a for a, (i, j) in enumerate(zip(index, last)) if i != j]
        if len(moved) != 1 or abs(index[moved[0]] - last[moved[0]]) > 2:  # (threads take turns)
            return
        axis = moved[0]
        step = 1 if index[axis] > last[axis] else -1
        grid = self.variable.fragments.grid
        if self.target.chunk_index is not None and self._indexed(index) is not None:
            self._read_ahead_indexed(pieces, axis, step, depth)
            return
        # (the fragments ahead are read as this one is: fetched whole too when most of each is wanted)
        selected = math.prod(1 if isinstance(p.local, int) else len(range(p.local.start, p.local.stop, p.local.step))
                             for p in pieces)
        fraction = selected / max(1, math.prod(grid.fragment_shape(index)))
        uris, largest = [], 0
        for k in range(1, depth + 1):
            position = index[axis] + k * step
            if not 0 <= position < grid.grid_shape[axis]:
                break
            uri, nbytes = self._ahead_uri(index[:axis] + (position,) + index[axis + 1:], fraction)
            if uri is None:
                break
            if uri:
                uris.append(uri)
                largest = max(largest, nbytes)
        readahead.read_ahead(uris, self.target.profile, self.target.policy, nbytes=largest)

    def _read_ahead_indexed(self, pieces: tuple, axis: int, step: int, depth: int) -> None:
        """A walk through indexed fragments: start fetching the chunks the next ones on ``axis``
        will read, when it takes the whole of each along it (its key is then known: the others'
        are the same) and they are stored in the aggregation's order (their own key is the same)."""
        grid = self.variable.fragments.grid
        index = tuple(p.fragment for p in pieces)
        local = pieces[axis].local
        whole = (0, grid.fragment_shape(index)[axis], 1)
        if not (isinstance(local, slice) and (local.start, local.stop, local.step) == whole):
            return
        ahead = []
        for k in range(1, depth + 1):
            at = index[:axis] + (index[axis] + k * step,) + index[axis + 1:]
            if not 0 <= at[axis] < grid.grid_shape[axis]:
                break
            found = self._indexed(at)
            if found is None or not found[2]:
                break
            uri, entry, _ = found
            key = tuple(slice(0, entry.layout.shape[a], 1) if a == axis else p.local for a, p in enumerate(pieces))
            ahead.append((uri, entry, key))
        chunk_index.read_ahead(ahead, self.target.profile, self.target.policy)

    def _indexed(self, index: tuple[int, ...]) -> tuple[str, IndexEntry, bool] | None:
        """The URI and chunk index entry of the fragment at ``index`` (None: not read through the index),
        and whether it is stored as the aggregation orders it (a key of the aggregation's is then its own)."""
        known = self._entries.get(index, False)  # (one look: another thread may clear it)
        if known is not False:
            return known
        ref = self.variable.fragments[index]
        found = None
        if not ref.is_missing and ref.uris and self.target.chunk_index is not None:
            uri = storage.resolve(ref.uris[0], self.target.source)
            entry = self.target.chunk_index.entry(uri, ref.variable_names(self.target.default_identifier))
            plain = entry is not None and ref.axes is None and ref.part is None and not any(ref.reversed or ()) \
                and entry.layout.shape == tuple(ref.shape)
            found = None if entry is None else (uri, entry, plain)
        if len(self._entries) >= _AHEAD_REMEMBERED:  # (a walk needs those near it only)
            self._entries.clear()
        self._entries[index] = found
        return found

    def _read_ahead_within(self, combos: list[tuple], k: int, depth: int) -> None:
        """In a chunk of several fragments, start fetching its own next small remote objects (never
        another chunk's: a thread running that chunk would fetch them too), ``depth`` of them."""
        index = tuple(p.fragment for p in combos[k])
        if self.is_local(index):
            return
        ahead = [self._ahead_uri(tuple(p.fragment for p in pieces), 0.0) for pieces in combos[k + 1:k + 1 + depth]]
        readahead.read_ahead([uri for uri, _ in ahead if uri], self.target.profile, self.target.policy,
                             nbytes=max((n for uri, n in ahead if uri), default=0))

    def is_local(self, index: tuple[int, ...]) -> bool:
        """Whether the fragment at ``index`` is (first) a local file: a walk from it reads
        nothing ahead (a cheap look, made before the fragments ahead are looked up)."""
        uris = self.variable.fragments.uris
        first = uris[index][0] if uris is not None else None
        return storage.is_local(self.variable.source) and (not first or storage.is_local(str(first)))

    def fetched_whole_ahead(self, index: tuple[int, ...]) -> bool:
        """Whether a small selection of the fragment at ``index`` is read from the whole object, which
        read-ahead fetches (a small remote object, not read through a chunk index): a task reading a
        batch of such fragments has its next ones fetched while it decodes one."""
        return self.target.chunk_index is None and bool(self._ahead_uri(index, 0.0)[0])

    def _ahead_uri(self, index: tuple[int, ...], fraction: float) -> tuple[str | None, int]:
        """What read-ahead may fetch for the fragment at ``index``, of which ``fraction`` is
        wanted, and its size: its URI, "" to pass over it (missing, or not allowed), or None to
        stop there (a local or OPeNDAP fragment, or one its own task would not fetch whole in
        one GET: a large object of which little is wanted, or one fetched in concurrent parts).
        Remembered: a walk asks ``depth`` times."""
        known = self._ahead_uris.get(index)
        if known is None:
            ref = self.variable.fragments[index]
            uri: str | None = ""
            nbytes = math.prod(ref.shape) * self.target.dtype.itemsize
            if not ref.is_missing and ref.uris:
                uri = storage.resolve(ref.uris[0], self.target.source)
                if storage.is_local(uri) or storage.is_opendap(uri) or self._indexed(index) is not None:
                    uri = None  # (an indexed fragment is read by byte range: fetching it whole only adds GETs)
                elif self.target.policy is not None and not self.target.policy.allows(uri):
                    uri = ""
            if len(self._ahead_uris) >= _AHEAD_REMEMBERED:  # (a walk needs those near it only)
                self._ahead_uris.clear()
            known = self._ahead_uris[index] = (uri, nbytes)
        uri, nbytes = known
        if uri and not (whole_object_wanted(fraction, nbytes) and nbytes <= 2 * storage.part_size()):
            return None, nbytes
        return known


def _take(block: np.ndarray, pieces: tuple) -> np.ndarray:
    axis = 0
    for p in pieces:
        if p.out is None:
            continue
        if p.take is not None:
            block = block.take(p.take, axis=axis)
        axis += 1
    return block


def _placement(pieces: tuple) -> tuple:
    """Where a block goes in the output; array positions become an open mesh."""
    kept = [p.out for p in pieces if p.out is not None]
    if not any(isinstance(o, np.ndarray) for o in kept):
        return tuple(kept)
    arrays = [np.arange(o.start, o.stop) if isinstance(o, slice) else o for o in kept]
    return np.ix_(*arrays)


def _chunks_for(array: AggregatedArray, chunks: Any) -> Any:
    grid = array.variable.fragments.grid
    if isinstance(chunks, str) and chunks == "fragments":
        return _dask_chunks(_fragment_chunks(array))[: array.ndim]  # (joined strings: every fragment along their length)
    if isinstance(chunks, str) and chunks == "auto":
        chunks = dask.config.get("array.chunk-size")
    wrong = f"chunks={chunks!r} is neither 'fragments', 'auto', a size nor dask's chunks for shape {array.shape}"
    try:
        if isinstance(chunks, (str, int)) and not isinstance(chunks, bool):
            limit = parse_bytes(chunks) if isinstance(chunks, str) else int(chunks)
            if limit < 1:
                raise ArgumentError(f"{wrong} (a size is at least one byte)", variable=array.variable.name)
            return _dask_chunks(merged_chunks(grid, array.encoding.stored_dtype.itemsize, limit))[: array.ndim]
        return da.core.normalize_chunks(chunks, array.shape, dtype=array.dtype)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ArgumentError):
            raise
        raise ArgumentError(f"{wrong} ({exc})", variable=array.variable.name) from None


def _fragment_chunks(array: AggregatedArray) -> tuple[tuple[int, ...], ...]:
    """Chunks of whole fragments, except that fragments that are reference sets are cut by their own
    chunk grid (a reference set of a whole archive is one fragment: one chunk of it all would be read
    by one task). Only the metadata of at most :data:`_CHUNKED_INSPECTED` sets is read, here."""
    fragments = array.variable.fragments
    grid = fragments.grid
    uris = fragments.uris
    if uris is None or grid.ndim != array.ndim or grid.nfragments == 0:
        return grid.sizes
    first = uris[..., 0].reshape(-1).tolist()
    if not any(marker in "\n".join(u for u in first if u) for marker in (".json", ".parq")):
        return grid.sizes  # (one pass over the URIs as text: quick for a million fragments)
    sets = [index for index, u in zip(grid.indices(), first) if u and is_reference_set(str(u))]
    if not sets or len(sets) > _CHUNKED_INSPECTED:
        return grid.sizes
    found: list[list[set[int | None]]] = [[set() for _ in sizes] for sizes in grid.sizes]
    # (each set's metadata is a request or two, remote ones tens of milliseconds: read side by side)
    with ThreadPoolExecutor(min(len(sets), _INSPECTING_THREADS), thread_name_prefix="daskcfa-inspect") as pool:
        grids = list(pool.map(lambda index: reference_set_chunks(fragments[index], array.target), sets))
    for index, chunks in zip(sets, grids):
        for d, i in enumerate(index):
            found[d][i].add(None if chunks is None else chunks[d])
    lengths = [[next(iter(s)) if len(s) == 1 else None for s in row] for row in found]
    return subdivided_chunks(grid, lengths, _MOST_CHUNKS)


def _dask_chunks(rows: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Fragment rows as dask chunks: a zero-length dimension listing no fragments is one empty chunk."""
    return tuple(row or (0,) for row in rows)


def to_dask(variable: AggregatedVariable, *, chunks: Any = "fragments", mask: bool = True,
            access: Access | None = None, strings: bool = True, decode: bool = True,
            batched: bool = False) -> da.Array:
    """A dask array over ``variable``; by default exactly one chunk per fragment (``strings``,
    ``decode``: see :class:`AggregatedArray`; stored values are never masked). ``batched``: as a
    :class:`~.batched.FragmentArray`, which reads small selections of many local fragments (or small
    remote objects fetched ahead) in batches (for users' reads; writers plan their tasks on the
    fragments' own chunks)."""
    from . import masked  # noqa: F401  (registers masked chunks' dispatch with dask.array)
    from .batched import FragmentArray  # (a dask.array class: not for metadata-only work)

    mask = mask and decode
    array = AggregatedArray(variable, mask=mask, access=access, strings=strings, decode=decode)
    meta = np.empty((0,) * array.ndim, dtype=array.dtype)
    if mask:
        meta = np.ma.MaskedArray(meta)  # (the chunks are MaskedChunks: numpy.ma.MaskedArray to dask and users)

    def chunked(normal: tuple, given: Any = None) -> da.Array:
        name = f"cfa-{variable.basename}-{dask.base.tokenize(array, normal if given is None else given)}"
        return da.from_array(array, chunks=normal, name=name, asarray=False, fancy=True, lock=False,
                             inline_array=False, meta=meta)

    plain = chunked(_chunks_for(array, chunks), chunks)
    if not batched or not (isinstance(chunks, str) and chunks == "fragments") or not array.ndim \
            or not len(variable.fragments):  # (no fragment: nothing to batch)
        return plain
    first = (0,) * array.ndim
    local = array.is_local(first)
    return FragmentArray.over(plain, meta, chunked, local, ahead=not local and array.fetched_whole_ahead(first))
