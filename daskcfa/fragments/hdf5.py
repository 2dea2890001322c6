"""Direct reads of netCDF-4 (HDF5) fragment variables.

netCDF4-python and h5py decode chunks inside the HDF5 library, which holds one
process-wide lock while it decompresses: threads reading fragments cannot
decode in parallel, and every call pays the library's per-call overhead.

Here the metadata (layout, filters, fill value, where each chunk lies in the file;
netCDF-4's conventions: :mod:`.hdf5_netcdf`) is parsed directly (:mod:`.hdf5_meta`) when
the file is the common, simple case, and read with h5py otherwise. The raw bytes are fetched with a ``read_ranges``
callable (``os.preadv`` on a local file by default; a remote backend can fetch
byte ranges concurrently instead), inflated with ISA-L (:mod:`isal`, else
:mod:`zlib`) and un-shuffled
with numpy (:mod:`.hdf5_filters`), all of which release the GIL on large buffers.

Only the common storage choices are handled: contiguous or chunked layout with
the deflate, shuffle and Fletcher-32 filters (and zstd, blosc, bzip2:
:mod:`.codecs`), and numeric types. Anything else
raises :class:`DirectReadUnsupported` so the caller can fall back to netCDF4.
A netCDF-3 file is not HDF5: opening one raises :class:`OSError` (from h5py).
"""

from __future__ import annotations

import functools
import io
import itertools
import math
import os
from typing import Any, BinaryIO, Callable, Sequence

import numpy as np

from ..lazy import h5py
from ..storage.blocks import Blocks, Buffer
from ..storage.local import pread
from .hdf5_filters import DEFLATE, INFLATE_ERRORS, SUPPORTED_FILTERS, inflate_head, pipeline_of, unfilter
from .layout import StoredLayout
from .hdf5_meta import PARSE_ERRORS, ChunkEntry, DatasetMeta, HDF5Meta
from .hdf5_netcdf import (
    NON_COORD_PREFIX,
    DirectReadUnsupported,
    NetCDFAttributes,
    ParsedAttributes,
    attribute_names,
    check_dimensions,
    check_dtype,
    dimension_names,
    is_dimension_only,
    open_dataset,
    parsed_variable,
)

__all__ = ["DirectReadUnsupported", "HDF5File", "HDF5Variable", "ReadRanges", "StoreInfo", "StoredVariable"]

#: Fetches ``[(offset, length), ...]`` from a file and returns the bytes of
#: every range, in order. Given all ranges of a read at once, so that remote
#: backends can fetch them concurrently.
ReadRanges = Callable[[list[tuple[int, int]]], Sequence[Buffer]]

#: Where a chunk is stored (``chunk_offset``, ``filter_mask``, ``byte_offset``, ``size``): h5py's
#: ``StoreInfo`` has the same fields in the same order (named here without importing h5py).
StoreInfo = ChunkEntry
#: A stored chunk to read, the part of it selected and where that goes in the result.
_ChunkRead = tuple[StoreInfo, tuple[slice, ...], tuple[slice, ...]]

#: Compressed bytes handed to one ``read_ranges`` call, to bound memory.
_BATCH_BYTES = 64 << 20
#: Contiguous layout: one more byte range costs about as much as reading this
#: many extra bytes (syscall, Python bookkeeping), used to pick range sizes.
_RANGE_COST = 64 << 10
#: A deflated chunk is inflated only up to the selection when that saves at
#: least this share of it (stopping early has a small fixed cost).
_PARTIAL_INFLATE = 0.8
#: A chunk inflated only in part is first fetched up to its share of the stream that holds the
#: selection, plus this share of the stream and :data:`_HEAD_MARGIN` bytes (the rest is fetched
#: only if that falls short): a point at the centre of a chunk needs half its bytes.
_HEAD_SLACK = 1 / 32
_HEAD_MARGIN = 512
#: Chunk lookups one by one cost about this many times more per chunk than a
#: walk over the whole chunk index; past that ratio the walk is cheaper.
_WALK_RATIO = 16


#: Files in memory up to this size are handed to HDF5 as a file image (it
#: copies them); larger ones are read through a Python file object.
_IMAGE_BYTES = 1 << 20
_IMAGES = itertools.count()


def _read_blocks(blocks: Blocks, ranges: list[tuple[int, int]]) -> list[Buffer]:
    return [blocks.read(offset, length) for offset, length in ranges]


class _BlocksFile(io.RawIOBase):
    """A read-only file over :class:`Blocks` in memory, which it does not copy whole."""

    def __init__(self, blocks: Blocks) -> None:
        super().__init__()
        self._blocks = blocks
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        done = self._blocks.readinto(self._position, target)
        self._position += done
        return done

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._blocks)}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position


class HDF5File:
    """An open netCDF-4/HDF5 file whose variables are read without the HDF5 data path.

    ``read_ranges`` fetches raw byte ranges; by default they are read with
    ``os.preadv`` on a descriptor of ``path`` (POSIX only). Errors opening the
    file (missing, not HDF5, ...) propagate as the :class:`OSError` raised.

    A local file or one in memory whose metadata :mod:`.hdf5_meta` parses is not opened
    with HDF5 at all; otherwise (or for a variable it does not parse) h5py opens it.
    """

    def __init__(self, source: str | os.PathLike[str] | BinaryIO | Blocks | Buffer, *,
                 read_ranges: ReadRanges | None = None, label: str | None = None, parse: bool = True) -> None:
        # ``source`` is a path, a whole file in memory (Blocks, or one buffer),
        # or a file object (a remote object behind a block cache) that HDF5
        # reads metadata through; then ``read_ranges`` must fetch the data
        # bytes. ``label`` names what is not a path; ``parse``: False reads the metadata with h5py
        # only (the reference :mod:`.hdf5_meta` is tested against). h5py's low-level API is
        # used throughout: its high-level File and Dataset objects cost more to
        # open and close than HDF5 itself (File.close walks every object open in
        # the process), which shows on 1,000s of files.
        is_path = isinstance(source, (str, os.PathLike))
        if isinstance(source, (bytes, bytearray, memoryview, np.ndarray)):
            source = Blocks([source])
        in_memory = isinstance(source, Blocks)
        if not (is_path or in_memory) and read_ranges is None:
            raise ValueError("read_ranges is required when reading from a file object")
        self.path = os.fspath(source) if is_path else (label or repr(source))
        self._fid: h5py.h5f.FileID | None = None
        self._fd: int | None = None
        self._own_fd: int | None = None  # (a descriptor this object opened, and closes)
        self._meta: HDF5Meta | None = None
        self._source = source
        self._read_ranges = read_ranges  # (None: pread; not the bound method, a cycle to collect)
        if in_memory and read_ranges is None:
            # (a range within one block is a read-only view of it; one across blocks, a fresh array)
            self._read_ranges = functools.partial(_read_blocks, source)
        try:
            if is_path and read_ranges is None and parse:
                fd = self._fd = self._own_fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                path = self.path  # (the reader refers to neither this object nor its methods: no cycle)
                self._meta = _parsed(lambda offset, length: pread(fd, offset, length, path), os.fstat(fd).st_size)
            elif in_memory and parse:
                self._meta = _parsed(source.read, len(source))
            if self._meta is None:
                if self._own_fd is not None:  # (h5py's own descriptor reads the data, as before)
                    os.close(self._own_fd)
                    self._fd = self._own_fd = None
                self._open_hdf5()
        except BaseException:
            self.close()
            raise

    def _open_hdf5(self) -> h5py.h5f.FileID:
        """The file opened with h5py (once), for what :mod:`.hdf5_meta` does not parse."""
        if self._fid is not None:
            return self._fid
        source = self._source
        is_path, in_memory = isinstance(source, (str, os.PathLike)), isinstance(source, Blocks)
        if is_path:
            fapl = _path_access()
            name = os.fsencode(self.path)
        elif in_memory and len(source) <= _IMAGE_BYTES:
            fapl = _file_access()
            # HDF5 reads metadata from its own copy of a small file: no Python
            # callback per metadata read, which matters when threads contend for the GIL
            fapl.set_fapl_core(backing_store=False)
            fapl.set_file_image(source.tobytes())
            name = f"daskcfa-image-{next(_IMAGES)}".encode()
        else:
            fapl = _file_access()
            fapl.set_fileobj_driver(h5py.h5fd.fileobj_driver, _BlocksFile(source) if in_memory else source)
            name = f"daskcfa-{id(source):x}".encode()
        self._fid = h5py.h5f.open(name, h5py.h5f.ACC_RDONLY, fapl)
        if self._read_ranges is None and self._own_fd is None:
            # Read data through HDF5's own descriptor: one open file per fragment.
            self._fd = self._fid.get_vfd_handle()
        return self._fid

    def variable(self, name: str) -> HDF5Variable | ParsedVariable:
        """The netCDF variable ``name`` (``"v"``, ``"grp/v"`` or ``"/grp/v"``); KeyError if absent."""
        if self._source is None:
            raise ValueError(f"{self.path!r} is closed")
        head, _, base = name.strip("/").rpartition("/")
        group = "/" + head + "/" if head else "/"
        local = self._read_ranges is None
        if self._meta is not None and base:
            try:
                found = parsed_variable(self._meta, group, base)
            except PARSE_ERRORS:
                pass  # (h5py reads it, as it did before this parser)
            else:
                if found is None:
                    raise KeyError(name)
                return ParsedVariable(*found, base, self._pread_ranges if local else self._read_ranges,
                                      f"variable {group + base!r} of {self.path!r}",
                                      end=self._meta.size if local else None)
        fid = self._open_hdf5()
        dsid = open_dataset(fid, group + base) if base else None
        names = frozenset() if dsid is None else attribute_names(dsid)
        if dsid is not None and is_dimension_only(dsid, names):
            dsid = open_dataset(fid, group + NON_COORD_PREFIX + base)
            names = frozenset() if dsid is None else attribute_names(dsid)
        if dsid is None:
            raise KeyError(name)
        where = f"variable {group + base!r} of {self.path!r}"
        local = self._read_ranges is None
        return HDF5Variable(dsid, base, self._pread_ranges if local else self._read_ranges, where, names,
                            end=self._size if local else None)

    def close(self) -> None:
        # Dropping the one reference to the file's identifier closes the file and (strong close
        # degree) every object open in it. ``FileID.close()`` would first scan every h5py object
        # alive in the process (h5py's ``nonlocal_close``): ~0.7 ms a file with 1,000 of them.
        self._fd = None
        self._fid = None
        self._meta = self._source = None
        if self._own_fd is not None:
            fd, self._own_fd = self._own_fd, None
            os.close(fd)

    def __enter__(self) -> HDF5File:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @functools.cached_property
    def _size(self) -> int:
        """The local file's size (asked for once)."""
        if self._fd is None:
            raise ValueError(f"{self.path!r} is closed")
        return os.fstat(self._fd).st_size

    def _pread_ranges(self, ranges: list[tuple[int, int]]) -> list[Buffer]:
        if self._fd is None:
            raise ValueError(f"{self.path!r} is closed")
        return [pread(self._fd, offset, length, self.path) for offset, length in ranges]


def _parsed(read_at: Callable[[int, int], Any], size: int) -> HDF5Meta | None:
    """The file's metadata parsed directly, or None when :mod:`.hdf5_meta` leaves it to h5py."""
    try:
        return HDF5Meta(read_at, size)
    except PARSE_ERRORS:
        return None


def _file_access() -> h5py.h5p.PropFAID:
    """File access properties: closing the file closes every object open in it."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)
    return fapl


@functools.cache
def _path_access() -> h5py.h5p.PropFAID:
    """The file access properties of a local file, made once (HDF5 copies them at each open;
    making them costs a quarter of opening a small file)."""
    return _file_access()


class StoredVariable:
    """Raw values read straight from a variable's stored bytes: contiguous, or chunks
    located by :meth:`_chunk_infos` and decoded outside any lock.

    Subclasses locate the chunks: :class:`HDF5Variable` with h5py, and
    :class:`~daskcfa.fragments.chunk_index.IndexedVariable` from a chunk index
    saved beside an aggregation (no HDF5 at all). :meth:`read` may be called
    from several threads at once.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None
    chunk_nbytes: int
    #: whether a byte range costs no round trip (a local file), so that a chunk inflated in part
    #: is fetched in two steps (its head, then the rest if needed) rather than whole
    _local = False
    #: the size of the local file holding the chunks: a chunk whose head alone is fetched must
    #: still lie within it, as a whole fetch checks (None: not known)
    _end: int | None = None

    def __init__(self, stored: np.dtype, shape: tuple[int, ...], chunks: tuple[int, ...] | None, offset: int | None,
                 pipeline: list[tuple[int, int]], fill: Any, read_ranges: ReadRanges, where: str) -> None:
        # ``stored``: the type with its byte order; ``offset``: a contiguous variable's (None: never
        # written); ``pipeline``: ``(filter code, shuffle element size)`` in the order applied on write
        self._where = where  # for error messages
        self._stored = stored
        self.dtype = stored.newbyteorder("=")
        self.shape = tuple(shape)
        self.chunks = None if chunks is None else tuple(chunks)
        self._offset = offset
        self._read_ranges = read_ranges
        self._filters = pipeline
        self.compressed = bool(pipeline)  #: whether chunks go through filters (read amplification)
        self._given_fill = fill
        #: Bytes one decoded chunk takes (0: contiguous), which a read holds in memory at once.
        self.chunk_nbytes = 0
        if self.chunks is not None:
            self.chunk_nbytes = self._chunk_nbytes = math.prod(self.chunks) * self._stored.itemsize
            self._chunk_strides = tuple(math.prod(self.chunks[j + 1:]) for j in range(len(self.chunks)))
            self._chunk_byte_strides = tuple(stride * self._stored.itemsize for stride in self._chunk_strides)
            self._nchunks = math.prod(-(-n // c) for n, c in zip(self.shape, self.chunks))

    def _chunk_infos(self, coords: list[tuple[int, ...]]) -> list[StoreInfo | None]:
        """The index entries (``StoreInfo``) of the chunks at ``coords``, None if absent."""
        raise NotImplementedError

    @functools.cached_property
    def _fill(self) -> Any:
        """The value never-written storage reads as (looked up on first need: most reads never need it)."""
        fill = self._given_fill() if callable(self._given_fill) else self._given_fill
        return np.asarray(fill).astype(self.dtype)[()]

    def read(self, key: tuple) -> np.ndarray:
        """The raw stored values at ``key`` (one int or step>0 slice per dimension).

        Like netCDF4 with ``set_auto_maskandscale(False)``: no masking, scaling
        or ``_Unsigned`` conversion; never-written storage reads as the fill value.
        """
        starts, steps, counts, out_shape = normalize_key(key, self.shape)
        if 0 in counts:
            return np.empty(out_shape, self.dtype)
        if self.chunks is None:
            data = self._read_contiguous(starts, steps, counts)
        else:
            data = self._read_chunked(starts, steps, counts)
        return data.reshape(out_shape)

    # -- contiguous layout --------------------------------------------------

    def _read_contiguous(self, starts: list[int], steps: list[int], counts: list[int]) -> np.ndarray:
        if self._offset is None:  # never written
            return np.full(counts, self._fill, self.dtype)
        itemsize = self._stored.itemsize
        strides = [itemsize * math.prod(self.shape[j + 1 :]) for j in range(len(self.shape))]
        jumps = [st * s for st, s in zip(steps, strides)]
        # Read one byte range per index of the leading ``split`` dimensions,
        # each spanning the selection in the trailing ones: few large ranges
        # when the selection is dense, many small ones when it is sparse.
        split, span = min(
            (
                (k, itemsize + sum((c - 1) * j for c, j in zip(counts[k:], jumps[k:])))
                for k in range(len(counts) + 1)
            ),
            key=lambda ks: math.prod(counts[: ks[0]]) * (ks[1] + _RANGE_COST),
        )
        first = self._offset + sum(s * st for s, st in zip(starts, strides))
        offsets = np.array(first, dtype=np.int64)
        for count, jump in zip(counts[:split], jumps[:split]):
            offsets = np.add.outer(offsets, np.arange(count, dtype=np.int64) * jump)
        buffers = self._read_ranges([(int(o), span) for o in offsets.ravel()])
        for buf in buffers:
            _check_length(buf, span, self._where)
        data: Buffer = buffers[0] if len(buffers) == 1 else bytearray().join(buffers)
        view = np.ndarray(
            (len(buffers), *counts[split:]), self._stored, buffer=data, strides=(span, *jumps[split:])
        ).reshape(counts)
        if view.flags.writeable and view.flags.c_contiguous and view.nbytes == memoryview(data).nbytes:
            # the freshly read buffer is exactly the result: no copy
            return view if view.dtype.isnative else view.byteswap(inplace=True).view(self.dtype)
        return np.array(view, dtype=self.dtype, order="C")

    # -- chunked layout -----------------------------------------------------

    def _chunk_pieces(self, starts: list[int], steps: list[int], counts: list[int]
                      ) -> tuple[list[tuple], list[StoreInfo | None]]:
        """Per chunk holding selected points: its ``(chunk index, slice in it, slice of the result)``
        along each dimension, and its index entry (None: never written)."""
        assert self.chunks is not None
        spans = [_chunk_spans(*dim) for dim in zip(starts, steps, counts, self.chunks)]
        pieces = list(itertools.product(*spans))
        coords = [tuple(c * size for (c, _, _), size in zip(piece, self.chunks)) for piece in pieces]
        return pieces, self._chunk_infos(coords)

    def chunk_ranges(self, key: tuple) -> list[tuple[int, int]]:
        """The ``(offset, length)`` of every stored chunk a :meth:`read` at ``key`` fetches (none
        for a contiguous variable), in the order fetched: what may be fetched ahead of it."""
        starts, steps, counts, _ = normalize_key(key, self.shape)
        if self.chunks is None or 0 in counts:
            return []
        _, infos = self._chunk_pieces(starts, steps, counts)
        return sorted((info.byte_offset, info.size) for info in infos
                      if info is not None and info.byte_offset is not None)

    def _read_chunked(self, starts: list[int], steps: list[int], counts: list[int]) -> np.ndarray:
        pieces, infos = self._chunk_pieces(starts, steps, counts)
        out = np.empty(counts, self.dtype)
        stored: list[_ChunkRead] = []
        for piece, info in zip(pieces, infos):
            inner = tuple(s for _, s, _ in piece)
            outer = tuple(s for _, _, s in piece)
            if info is None or info.byte_offset is None:  # never written
                out[outer] = self._fill
            else:
                stored.append((info, inner, outer))
        stored.sort(key=lambda item: item[0].byte_offset)
        for batch in _batches(stored):
            parts = [self._partly(info, inner) for info, inner, _ in batch]
            ranges = [(info.byte_offset, self._fetched(info, needed)) for (info, _, _), needed in zip(batch, parts)]
            buffers = self._read_ranges(ranges)
            for (info, inner, outer), needed, (_, fetched), raw in zip(batch, parts, ranges, buffers):
                out[outer] = self._selected(raw, info, inner, needed, fetched)
        return out

    def _bytes_needed(self, inner: tuple[slice, ...]) -> int:
        """How much of a chunk's bytes (in C order) hold the selection ``inner`` of it."""
        last = 0
        for s, stride in zip(inner, self._chunk_strides):
            last += (s.start + (len(range(s.start, s.stop, s.step)) - 1) * s.step) * stride
        return (last + 1) * self._stored.itemsize

    def _partly(self, info: StoreInfo, inner: tuple[slice, ...]) -> int | None:
        """The bytes of a stored chunk's decoded values that hold the selection ``inner``, when
        only they are inflated (a chunk only deflated: no shuffle or checksum); else None."""
        needed = self._bytes_needed(inner)
        if (needed < _PARTIAL_INFLATE * self._chunk_nbytes
                and [code for code, _ in self._filters] == [DEFLATE] and not info.filter_mask & 1):
            return needed
        return None

    def _fetched(self, info: StoreInfo, needed: int | None) -> int:
        """How many of a stored chunk's bytes are fetched first, ``needed`` bytes of its values
        being inflated (None: all of them). A chunk of a local file must lie within it: checked before
        any buffer is made for it (a size of 4 GiB in a B-tree entry of a small file is a buffer of 4 GiB)."""
        if self._end is not None and info.byte_offset + info.size > self._end:
            raise OSError(f"chunk at {info.chunk_offset} runs past the end of the file, at byte {self._end} "
                          f"(truncated file?) ({self._where})")
        if needed is None or not self._local:
            return info.size
        return min(info.size, info.size * needed // self._chunk_nbytes + int(info.size * _HEAD_SLACK) + _HEAD_MARGIN)

    def _selected(self, raw: Buffer, info: StoreInfo, inner: tuple[slice, ...], needed: int | None,
                  fetched: int) -> np.ndarray:
        """The selection ``inner`` of one stored chunk, its filters undone; ``raw`` holds its
        first ``fetched`` bytes (the rest is fetched if needed).

        A chunk only deflated (no shuffle or checksum) is inflated just up to the
        ``needed`` bytes that hold the selection (:meth:`_partly`): a point in the middle of a
        chunk costs half the decompression, and the selection is taken from those bytes as they are.
        """
        if needed is not None:
            offset, size = info.byte_offset + fetched, info.size - fetched
            rest = None if size <= 0 else lambda: self._read_ranges([(offset, size)])[0]
            try:
                head = inflate_head(raw, needed, rest=rest)
            except INFLATE_ERRORS as err:
                raise OSError(f"corrupt chunk at {info.chunk_offset} ({err}; {self._where})") from None
            if len(head) != needed:
                raise OSError(f"chunk at {info.chunk_offset} holds fewer than {needed} bytes ({self._where})")
            # the chunk's leading corner up to the last element ``inner`` selects, over just the
            # bytes inflated (numpy checks that they hold it)
            corner = tuple(s.start + (len(range(s.start, s.stop, s.step)) - 1) * s.step + 1 for s in inner)
            return np.ndarray(corner, self._stored, buffer=head, strides=self._chunk_byte_strides)[inner]
        return self._decode(raw, info)[inner]

    def _decode(self, raw: Buffer, info: StoreInfo) -> np.ndarray:
        """Undo the filter pipeline on one stored chunk (filters skipped by its mask stay skipped)."""
        buf = unfilter(raw, self._filters, info.filter_mask, self._chunk_nbytes, info.chunk_offset, self._where)
        return buf.view(self._stored).reshape(self.chunks)


class _IndexedHDF5:
    """What :class:`HDF5Variable` and :class:`ParsedVariable` share: their description and layout."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None
    _stored: np.dtype
    _offset: int | None
    _fill: Any

    def __repr__(self) -> str:
        dims = ", ".join(f"{d}: {n}" for d, n in zip(self.dims, self.shape))
        return f"<{type(self).__name__} {self.name!r} ({dims}) {self.dtype}>"

    def _all_chunk_infos(self) -> list[StoreInfo]:
        raise NotImplementedError

    def _layout(self, filters: tuple[tuple[int, tuple[int, ...]], ...]) -> StoredLayout:
        """Where every stored chunk lies, the filters being ``(code, values)`` in the order applied on write."""
        fill = np.asarray(self._fill).astype(self._stored)[()]
        if self.chunks is None:
            return StoredLayout.contiguous(self._stored, self.shape, self._offset, fill)
        infos = self._all_chunk_infos()
        ndim = len(self.shape)
        return StoredLayout(
            dtype=self._stored, shape=self.shape, chunks=tuple(self.chunks), filters=filters, fill_value=fill,
            starts=np.array([i.chunk_offset for i in infos], np.int64).reshape(len(infos), ndim),
            byte_offsets=np.array([i.byte_offset for i in infos], np.int64),
            sizes=np.array([i.size for i in infos], np.int64),
            filter_masks=np.array([i.filter_mask for i in infos], np.int64))


class HDF5Variable(_IndexedHDF5, StoredVariable):
    """One netCDF variable of an :class:`HDF5File`, read straight from its storage.

    Metadata (dimensions, attributes, layout, filters, fill value) is gathered
    once here; :meth:`read` may then be called from several threads at once.
    """

    name: str
    dims: tuple[str, ...]
    attrs: dict[str, Any]

    def __init__(self, dsid: h5py.h5d.DatasetID, name: str, read_ranges: ReadRanges, where: str,
                 names: frozenset[str], *, end: int | None = None) -> None:
        # ``names``: the dataset's attribute names (:func:`.hdf5_netcdf.attribute_names`); ``end``:
        # the size of the local file ``read_ranges`` reads (None: not a local file)
        self.name = name
        self._local, self._end = end is not None, end
        self._dsid = dsid
        stored = check_dtype(dsid, where)
        dcpl = dsid.get_create_plist()
        layout = dcpl.get_layout()
        if layout == h5py.h5d.CONTIGUOUS and dcpl.get_external_count():  # (HDF5 stores only those externally)
            raise DirectReadUnsupported(f"external storage is not supported ({where})")
        if layout not in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED):
            raise DirectReadUnsupported(f"storage layout {layout} is not supported ({where})")
        shape = dsid.shape
        super().__init__(stored, shape, dcpl.get_chunk() if layout == h5py.h5d.CHUNKED else None,
                         dsid.get_offset() if layout == h5py.h5d.CONTIGUOUS else None,
                         _filter_pipeline(dcpl, where), functools.partial(_fill_value, dcpl, stored), read_ranges,
                         where)
        #: stored without netCDF's fill (netCDF-C's NOFILL: HDF5 never writes fill values)
        self.no_fill = dcpl.get_fill_time() == h5py.h5d.FILL_TIME_NEVER
        if self.chunks is not None:
            self._index: dict[tuple[int, ...], StoreInfo] = {}
            self._index_complete = False

        check_dimensions(dsid, len(shape), names, self._where)
        self._names = names
        self.attrs = NetCDFAttributes(dsid, self._where, names)

    @functools.cached_property
    def dims(self) -> tuple[str, ...]:  # type: ignore[override]
        """netCDF dimension names (looked up on first use: few reads need them)."""
        return dimension_names(self._dsid, self._names, self._where)

    def storage_layout(self) -> StoredLayout:
        """Where every stored chunk lies (a walk over the chunk index, no data read)."""
        dcpl = self._dsid.get_create_plist()
        filters = tuple((int(code), tuple(int(v) for v in values))
                        for code, _flags, values, _name in map(dcpl.get_filter, range(dcpl.get_nfilters())))
        return self._layout(filters)

    def _all_chunk_infos(self) -> list[StoreInfo]:
        """Every chunk written, in the index's order."""
        if self._walk_index():
            infos = list(self._index.values())
        else:
            infos = [self._dsid.get_chunk_info(i) for i in range(self._dsid.get_num_chunks())]
        return [i for i in infos if i.byte_offset is not None]

    def _walk_index(self) -> bool:
        """Read the whole chunk index in one walk, once (False: this HDF5 cannot walk it)."""
        walk = getattr(self._dsid, "chunk_iter", None)  # needs HDF5 >= 1.12.3
        if walk is not None and not self._index_complete:
            index: dict[tuple[int, ...], StoreInfo] = {}
            walk(lambda info: index.__setitem__(info.chunk_offset, info))
            self._index, self._index_complete = index, True
        return walk is not None

    def _chunk_infos(self, coords: list[tuple[int, ...]]) -> list[StoreInfo | None]:
        """The index entries (``StoreInfo``) of the chunks at ``coords``, None if absent."""
        if len(coords) * _WALK_RATIO >= self._nchunks:
            self._walk_index()
        index = self._index
        if self._index_complete:
            return [index.get(c) for c in coords]
        for c in coords:
            if c not in index:
                index[c] = self._dsid.get_chunk_info_by_coord(c)
        return [index[c] for c in coords]


class ParsedVariable(_IndexedHDF5, StoredVariable):
    """One netCDF variable of an :class:`HDF5File`, described by metadata :mod:`.hdf5_meta` parsed
    (no HDF5 call at all); read as :class:`HDF5Variable` is."""

    def __init__(self, meta: DatasetMeta, dims: tuple[str, ...], name: str, read_ranges: ReadRanges, where: str,
                 *, end: int | None = None) -> None:
        # ``dims``: the dimension names; ``end``: as :class:`HDF5Variable`'s
        self.name = name
        self._local, self._end = end is not None, end
        self._filter_values = tuple((code, values) for code, values, _ in meta.filters)
        super().__init__(meta.dtype, meta.shape, meta.chunks, meta.offset, _pipeline(meta.filters, where),
                         meta.fill, read_ranges, where)
        self.no_fill = meta.fill_never
        self.dims = dims
        self._index = {} if meta.chunk_index is None else {info.chunk_offset: info for info in meta.chunk_index}
        self.attrs = ParsedAttributes(meta.attributes, where)

    def storage_layout(self) -> StoredLayout:
        """Where every stored chunk lies (no data read)."""
        return self._layout(self._filter_values)

    def _all_chunk_infos(self) -> list[StoreInfo]:
        return list(self._index.values())

    def _chunk_infos(self, coords: list[tuple[int, ...]]) -> list[StoreInfo | None]:
        return [self._index.get(c) for c in coords]


def _fill_value(dcpl: h5py.h5p.PropDCID, stored: np.dtype) -> Any:
    """The dataset's fill value, from its creation properties."""
    fill = np.zeros((1,), stored)
    dcpl.get_fill_value(fill)
    return fill[0]


def _filter_pipeline(dcpl: h5py.h5p.PropDCID, where: str) -> list[tuple[int, int]]:
    """``(filter code, shuffle element size)`` per filter, in the order applied on write."""
    filters = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, values, name = dcpl.get_filter(i)
        filters.append((code, tuple(values), name.decode(errors="replace")))
    return _pipeline(filters, where)


def _pipeline(filters: list[tuple[int, tuple[int, ...], str]], where: str) -> list[tuple[int, int]]:
    """``(filter code, shuffle element size)`` of ``(code, values, name)`` per filter (an
    unsupported filter: :class:`DirectReadUnsupported`)."""
    for code, _values, name in filters:
        if code not in SUPPORTED_FILTERS:
            raise DirectReadUnsupported(f"filter {name!r} ({code}) is not supported ({where})")
    return pipeline_of([(code, values) for code, values, _ in filters])


# -- selections -------------------------------------------------------------


def normalize_key(
    key: tuple, shape: tuple[int, ...]
) -> tuple[list[int], list[int], list[int], tuple[int, ...]]:
    """Start, step and count per dimension, and the result shape (int entries dropped)."""
    if not isinstance(key, tuple) or len(key) != len(shape):
        raise IndexError(f"key {key!r} must be a tuple of {len(shape)} ints or slices")
    starts, steps, counts, out_shape = [], [], [], []
    for k, n in zip(key, shape):
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step <= 0:
                raise ValueError(f"slice step must be positive, got {k!r}")
            count = len(range(start, stop, step))
            starts.append(start if count else 0)
            steps.append(step)
            counts.append(count)
            out_shape.append(count)
        else:
            if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
                raise IndexError(f"key entries must be ints or slices, got {k!r}")
            i = int(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for a dimension of size {n}")
            starts.append(i % n)
            steps.append(1)
            counts.append(1)
    return starts, steps, counts, tuple(out_shape)


def _chunk_spans(start: int, step: int, count: int, size: int) -> list[tuple[int, slice, slice]]:
    """Along one dimension: ``(chunk index, slice in that chunk, slice of the result)``
    for every chunk holding selected points, skipping chunks a large step jumps over."""
    spans = []
    i = 0
    while i < count:
        chunk, first = divmod(start + i * step, size)
        end = min(count, -(-((chunk + 1) * size - start) // step))
        spans.append((chunk, slice(first, first + (end - i - 1) * step + 1, step), slice(i, end)))
        i = end
    return spans


def _batches(items: list[_ChunkRead]) -> list[list[_ChunkRead]]:
    """Split chunk reads into groups of at most ``_BATCH_BYTES`` stored bytes (at least one each)."""
    batches: list[list[_ChunkRead]] = []
    size = 0
    for item in items:
        if not batches or size + item[0].size > _BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(item)
        size += item[0].size
    return batches


# -- bytes ------------------------------------------------------------------



def _check_length(buf: Buffer, expected: int, where: str) -> None:
    got = memoryview(buf).nbytes
    if got != expected:
        raise OSError(f"short read: got {got} bytes, expected {expected} ({where})")
