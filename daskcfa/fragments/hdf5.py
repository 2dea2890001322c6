"""Direct reads of netCDF-4 (HDF5) fragment variables.

netCDF4-python and h5py decode chunks inside the HDF5 library, which holds one
process-wide lock while it decompresses: threads reading fragments cannot
decode in parallel, and every call pays the library's per-call overhead.

Here h5py is used only for *metadata* (layout, filters, fill value, where each
chunk lies in the file). The raw bytes are fetched with a ``read_ranges``
callable (``os.preadv`` on a local file by default; a remote backend can fetch
byte ranges concurrently instead), inflated with ISA-L (:mod:`isal`, else
:mod:`zlib`) and un-shuffled
with numpy, all of which release the GIL on large buffers.

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
import zlib

try:  # Intel ISA-L's inflate: the same zlib streams, about 2.3x faster to decode
    from isal import isal_zlib

    _decompressobj = isal_zlib.decompressobj
    _INFLATE_ERRORS: tuple[type[Exception], ...] = (isal_zlib.error, zlib.error)
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    _decompressobj = zlib.decompressobj
    _INFLATE_ERRORS = (zlib.error,)
from typing import Any, BinaryIO, Callable, Iterator, Mapping, Sequence

import h5py
import numpy as np

from ..storage.blocks import Blocks, Buffer
from .codecs import DECODERS

__all__ = ["DirectReadUnsupported", "HDF5File", "HDF5Variable", "ReadRanges"]

#: Fetches ``[(offset, length), ...]`` from a file and returns the bytes of
#: every range, in order. Given all ranges of a read at once, so that remote
#: backends can fetch them concurrently.
ReadRanges = Callable[[list[tuple[int, int]]], Sequence[Buffer]]

#: Where a chunk is stored (``chunk_offset``, ``filter_mask``, ``byte_offset``, ``size``).
StoreInfo = h5py.h5d.StoreInfo
#: A stored chunk to read, the part of it selected and where that goes in the result.
_ChunkRead = tuple[StoreInfo, tuple[slice, ...], tuple[slice, ...]]

_DEFLATE = h5py.h5z.FILTER_DEFLATE
_SHUFFLE = h5py.h5z.FILTER_SHUFFLE
_FLETCHER32 = h5py.h5z.FILTER_FLETCHER32

#: netCDF-C renames a variable whose name clashes with an unrelated dimension.
_NON_COORD_PREFIX = "_nc4_non_coord_"
#: ``NAME`` of a dimension scale that is a netCDF dimension but not a variable.
_DIMENSION_ONLY = b"This is a netCDF dimension but not a netCDF variable"

#: Attributes that netCDF-C keeps for itself and netCDF4-python never reports.
_HIDDEN_ATTRS = frozenset(
    {
        "CLASS",
        "NAME",
        "DIMENSION_LIST",
        "REFERENCE_LIST",
        "_Netcdf4Dimid",
        "_Netcdf4Coordinates",
        "_nc3_strict",
        "_NCProperties",
        "_IsNetcdf4",
        "_SuperblockVersion",
        "_Codecs",
    }
)

#: Compressed bytes handed to one ``read_ranges`` call, to bound memory.
_BATCH_BYTES = 64 << 20
#: Contiguous layout: one more byte range costs about as much as reading this
#: many extra bytes (syscall, Python bookkeeping), used to pick range sizes.
_RANGE_COST = 64 << 10
#: A deflated chunk is inflated only up to the selection when that saves at
#: least this share of it (stopping early has a small fixed cost).
_PARTIAL_INFLATE = 0.8
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


def _inflate_head(raw: Buffer, nbytes: int) -> bytes:
    """The first ``nbytes`` of a zlib stream, inflating no further."""
    return _decompressobj().decompress(raw, nbytes)


class DirectReadUnsupported(Exception):
    """Raised when a variable cannot be read directly; the caller falls back to netCDF4."""


class HDF5File:
    """An open netCDF-4/HDF5 file whose variables are read without the HDF5 data path.

    ``read_ranges`` fetches raw byte ranges; by default they are read with
    ``os.preadv`` on HDF5's own descriptor of ``path`` (POSIX only). Errors opening the
    file (missing, not HDF5, ...) propagate as the :class:`OSError` raised.
    """

    def __init__(self, source: str | os.PathLike[str] | BinaryIO | Blocks | Buffer, *,
                 read_ranges: ReadRanges | None = None, label: str | None = None) -> None:
        # ``source`` is a path, a whole file in memory (Blocks, or one buffer),
        # or a file object (a remote object behind a block cache) that HDF5
        # reads metadata through; then ``read_ranges`` must fetch the data
        # bytes. ``label`` names what is not a path. h5py's low-level API is
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
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)  # closing the file closes its objects
        if is_path:
            name = os.fsencode(self.path)
        elif in_memory and len(source) <= _IMAGE_BYTES:
            # HDF5 reads metadata from its own copy of a small file: no Python
            # callback per metadata read, which matters when threads contend for the GIL
            fapl.set_fapl_core(backing_store=False)
            fapl.set_file_image(source.tobytes())
            name = f"daskcfa-image-{next(_IMAGES)}".encode()
        else:
            fapl.set_fileobj_driver(h5py.h5fd.fileobj_driver, _BlocksFile(source) if in_memory else source)
            name = f"daskcfa-{id(source):x}".encode()
        if in_memory and read_ranges is None:
            # (a range within one block is a read-only view of it; one across blocks, a fresh array)
            read_ranges = functools.partial(_read_blocks, source)
        self._fid = h5py.h5f.open(name, h5py.h5f.ACC_RDONLY, fapl)
        self._fd: int | None = None
        if read_ranges is None:
            # Read data through HDF5's own descriptor: one open file per fragment.
            self._fd = self._fid.get_vfd_handle()
            read_ranges = self._pread_ranges
        self._read_ranges = read_ranges

    def variable(self, name: str) -> HDF5Variable:
        """The netCDF variable ``name`` (``"v"``, ``"grp/v"`` or ``"/grp/v"``); KeyError if absent."""
        head, _, base = name.strip("/").rpartition("/")
        group = "/" + head + "/" if head else "/"
        dsid = _open_dataset(self._fid, group + base) if base else None
        if dsid is not None and _is_dimension_only(dsid):
            dsid = _open_dataset(self._fid, group + _NON_COORD_PREFIX + base)
        if dsid is None:
            raise KeyError(name)
        where = f"variable {group + base!r} of {self.path!r}"
        return HDF5Variable(dsid, base, self._read_ranges, where)

    def close(self) -> None:
        self._fd = None
        if self._fid.valid:
            self._fid.close()

    def __enter__(self) -> HDF5File:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _pread_ranges(self, ranges: list[tuple[int, int]]) -> list[Buffer]:
        if self._fd is None:
            raise ValueError(f"{self.path!r} is closed")
        return [_pread(self._fd, offset, length, self.path) for offset, length in ranges]


class HDF5Variable:
    """One netCDF variable of an :class:`HDF5File`, read straight from its storage.

    Metadata (dimensions, attributes, layout, filters, fill value) is gathered
    once here; :meth:`read` may then be called from several threads at once.
    """

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None
    chunk_nbytes: int
    attrs: dict[str, Any]

    def __init__(self, dsid: h5py.h5d.DatasetID, name: str, read_ranges: ReadRanges, where: str) -> None:
        self.name = name
        self._where = where  # for error messages
        self._stored = _check_dtype(dsid, self._where)
        self.dtype = self._stored.newbyteorder("=")
        self.shape = dsid.shape
        self._read_ranges = read_ranges
        self._dsid = dsid

        dcpl = dsid.get_create_plist()
        layout = dcpl.get_layout()
        if dcpl.get_external_count():
            raise DirectReadUnsupported(f"external storage is not supported ({self._where})")
        self.chunks = dcpl.get_chunk() if layout == h5py.h5d.CHUNKED else None
        if layout == h5py.h5d.CONTIGUOUS:
            self._offset = dsid.get_offset()
        elif layout != h5py.h5d.CHUNKED:
            raise DirectReadUnsupported(f"storage layout {layout} is not supported ({self._where})")
        self._filters = _filter_pipeline(dcpl, self._where)
        self.compressed = bool(self._filters)  #: whether chunks go through filters (read amplification)
        fill = np.zeros((1,), self._stored)
        dcpl.get_fill_value(fill)
        self._fill = fill[0].astype(self.dtype)
        #: Bytes one decoded chunk takes (0: contiguous), which a read holds in memory at once.
        self.chunk_nbytes = 0
        #: stored without netCDF's fill (netCDF-C's NOFILL: HDF5 never writes fill values)
        self.no_fill = dcpl.get_fill_time() == h5py.h5d.FILL_TIME_NEVER
        if self.chunks is not None:
            self.chunk_nbytes = self._chunk_nbytes = math.prod(self.chunks) * self._stored.itemsize
            self._chunk_strides = tuple(math.prod(self.chunks[j + 1:]) for j in range(len(self.chunks)))
            self._nchunks = math.prod(-(-n // c) for n, c in zip(self.shape, self.chunks))
            self._index: dict[tuple[int, ...], StoreInfo] = {}
            self._index_complete = False

        _check_dimensions(dsid, self._where)
        self.attrs = NetCDFAttributes(dsid, self._where)

    @functools.cached_property
    def dims(self) -> tuple[str, ...]:
        """netCDF dimension names (looked up on first use: few reads need them)."""
        return _dimension_names(h5py.Dataset(self._dsid), self._where)

    def __repr__(self) -> str:
        dims = ", ".join(f"{d}: {n}" for d, n in zip(self.dims, self.shape))
        return f"<HDF5Variable {self.name!r} ({dims}) {self.dtype}>"

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

    def _read_chunked(self, starts: list[int], steps: list[int], counts: list[int]) -> np.ndarray:
        assert self.chunks is not None
        spans = [_chunk_spans(*dim) for dim in zip(starts, steps, counts, self.chunks)]
        pieces = list(itertools.product(*spans))
        coords = [tuple(c * size for (c, _, _), size in zip(piece, self.chunks)) for piece in pieces]
        infos = self._chunk_infos(coords)

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
            buffers = self._read_ranges([(info.byte_offset, info.size) for info, _, _ in batch])
            for (info, inner, outer), raw in zip(batch, buffers):
                out[outer] = self._decode(raw, info, self._bytes_needed(inner))[inner]
        return out

    def _chunk_infos(self, coords: list[tuple[int, ...]]) -> list[StoreInfo | None]:
        """The index entries (``StoreInfo``) of the chunks at ``coords``, None if absent."""
        walk = getattr(self._dsid, "chunk_iter", None)  # needs HDF5 >= 1.12.3
        if walk is not None and not self._index_complete and len(coords) * _WALK_RATIO >= self._nchunks:
            index: dict[tuple[int, ...], StoreInfo] = {}
            walk(lambda info: index.__setitem__(info.chunk_offset, info))
            self._index, self._index_complete = index, True
        index = self._index
        if self._index_complete:
            return [index.get(c) for c in coords]
        for c in coords:
            if c not in index:
                index[c] = self._dsid.get_chunk_info_by_coord(c)
        return [index[c] for c in coords]

    def _bytes_needed(self, inner: tuple[slice, ...]) -> int:
        """How much of a chunk's bytes (in C order) hold the selection ``inner`` of it."""
        last = 0
        for s, stride in zip(inner, self._chunk_strides):
            last += (s.start + (len(range(s.start, s.stop, s.step)) - 1) * s.step) * stride
        return (last + 1) * self._stored.itemsize

    def _decode(self, raw: Buffer, info: StoreInfo, needed: int | None = None) -> np.ndarray:
        """Undo the filter pipeline on one stored chunk (filters skipped by its mask stay skipped).

        A chunk only deflated (no shuffle or checksum) is inflated just up to the
        ``needed`` bytes that hold the selection: a point in the middle of a chunk
        costs half the decompression. The rest of the chunk is left unset.
        """
        if (needed is not None and needed < _PARTIAL_INFLATE * self._chunk_nbytes
                and [code for code, _ in self._filters] == [_DEFLATE] and not info.filter_mask & 1):
            try:
                head = _inflate_head(raw, needed)
            except _INFLATE_ERRORS as err:
                raise OSError(f"corrupt chunk at {info.chunk_offset} ({err}; {self._where})") from None
            if len(head) != needed:
                raise OSError(f"chunk at {info.chunk_offset} holds fewer than {needed} bytes ({self._where})")
            chunk = np.empty(self._chunk_nbytes, np.uint8)
            chunk[:needed] = np.frombuffer(head, np.uint8)
            return chunk.view(self._stored).reshape(self.chunks)
        buf = np.frombuffer(raw, np.uint8)
        for i in reversed(range(len(self._filters))):
            if info.filter_mask >> i & 1:
                continue
            code, param = self._filters[i]
            if code == _DEFLATE:
                try:  # never past the chunk's size, a checksum and one byte to tell a longer stream:
                    # a stream inflating to more than its chunk is no bomb
                    buf = np.frombuffer(_inflate_head(buf, self._chunk_nbytes + 5), np.uint8)
                except _INFLATE_ERRORS as err:
                    raise OSError(f"corrupt chunk at {info.chunk_offset} ({err}; {self._where})") from None
            elif code == _SHUFFLE:
                buf = _unshuffle(buf, param)
            elif code in DECODERS:  # its output: the chunk, and the checksums of filters applied before it
                checksums = sum(c == _FLETCHER32 and not info.filter_mask >> j & 1
                                for j, (c, _) in enumerate(self._filters[:i]))
                buf = DECODERS[code](buf, self._chunk_nbytes + 4 * checksums)
            else:
                if not _fletcher32_matches(buf):
                    raise OSError(f"Fletcher-32 checksum mismatch in chunk at {info.chunk_offset} "
                                  f"({self._where})")
                buf = buf[:-4]
        if buf.size != self._chunk_nbytes:
            raise OSError(
                f"chunk at {info.chunk_offset} holds {buf.size} bytes, "
                f"expected {self._chunk_nbytes} ({self._where})"
            )
        return buf.view(self._stored).reshape(self.chunks)


# -- metadata ---------------------------------------------------------------


def _open_dataset(fid: h5py.h5f.FileID, path: str) -> h5py.h5d.DatasetID | None:
    """The dataset at ``path``, or None when nothing (or something else) is there."""
    try:
        obj = h5py.h5o.open(fid, path.encode())
    except (KeyError, ValueError):  # no such link, or a path through a non-group
        return None
    return obj if isinstance(obj, h5py.h5d.DatasetID) else None


def _is_dimension_only(dsid: h5py.h5d.DatasetID) -> bool:
    if not h5py.h5a.exists(dsid, b"NAME"):
        return False
    name = _read_attr(h5py.h5a.open(dsid, b"NAME"))
    return isinstance(name, bytes) and name.startswith(_DIMENSION_ONLY)


def _check_dtype(dsid: h5py.h5d.DatasetID, where: str) -> np.dtype:
    """The numpy dtype of a plain numeric dataset; anything else is unsupported."""
    dtype = dsid.dtype
    if dtype.kind in "iuf" and h5py.check_enum_dtype(dtype) is None:
        # the bytes on disk must be exactly this numpy type (no odd precision or
        # padding); the byte order of one-byte types is moot (netCDF-C sets it)
        stored, expected = dsid.get_type(), h5py.h5t.py_create(dtype).copy()
        if dtype.itemsize == 1:
            expected.set_order(stored.get_order())
        if stored.equal(expected):
            return dtype
    raise DirectReadUnsupported(f"data type {dtype} is not supported ({where})")


def _filter_pipeline(dcpl: h5py.h5p.PropDCID, where: str) -> list[tuple[int, int]]:
    """``(filter code, shuffle element size)`` per filter, in the order applied on write."""
    pipeline = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, values, name = dcpl.get_filter(i)
        if code not in (_DEFLATE, _SHUFFLE, _FLETCHER32) and code not in DECODERS:
            label = name.decode(errors="replace")
            raise DirectReadUnsupported(f"filter {label!r} ({code}) is not supported ({where})")
        pipeline.append((code, int(values[0]) if code == _SHUFFLE else 0))
    return pipeline


def _check_dimensions(dsid: h5py.h5d.DatasetID, where: str) -> None:
    """The cheap part of :func:`_dimension_names`'s checks, done when a variable is opened."""
    if dsid.rank == 0:
        return
    if h5py.h5ds.is_scale(dsid):
        if dsid.rank > 1:
            raise DirectReadUnsupported(f"multi-dimensional coordinate variables are not supported ({where})")
    elif not h5py.h5a.exists(dsid, b"DIMENSION_LIST"):
        raise DirectReadUnsupported(f"a dimension has no dimension scale ({where})")


def _dimension_names(dataset: h5py.Dataset, where: str) -> tuple[str, ...]:
    """netCDF dimension names, from the dimension scales attached to ``dataset``."""
    if dataset.ndim == 0:
        return ()
    if dataset.is_scale:
        # A coordinate variable is its own dimension scale; netCDF-C records the
        # other dimensions of a multi-dimensional one only by dimension id.
        if dataset.ndim == 1:
            return (dataset.name.rpartition("/")[2],)
        raise DirectReadUnsupported(f"multi-dimensional coordinate variables are not supported ({where})")
    scales = dataset.attrs.get("DIMENSION_LIST")  # object references, a list per axis
    if scales is None or len(scales) != dataset.ndim or not all(len(refs) for refs in scales):
        raise DirectReadUnsupported(f"a dimension has no dimension scale ({where})")
    names = []
    for refs in scales:
        path = h5py.h5r.get_name(refs[0], dataset.id).decode()  # 3x faster than dataset.dims
        names.append(path.rpartition("/")[2].removeprefix(_NON_COORD_PREFIX))
    return tuple(names)


class NetCDFAttributes(Mapping[str, Any]):
    """A variable's attributes as netCDF4-python reports them (see its ``_get_att``).

    Each value is read on first use: decoding needs a few of them, and reading
    every attribute of every fragment would cost more than finding its chunk.
    An attribute of a type netCDF4-python reads but this reader does not raises
    :class:`DirectReadUnsupported` when read.
    """

    def __init__(self, dsid: h5py.h5d.DatasetID, where: str) -> None:
        self._dsid = dsid
        self._where = where
        self._values: dict[str, Any] = {}
        self._names: list[str] | None = None

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            pass
        if name not in self:
            raise KeyError(name)
        value = self._values[name] = _netcdf_attr(h5py.h5a.open(self._dsid, name.encode()), name, self._where)
        return value

    def __contains__(self, name: object) -> bool:
        if name in self._values:
            return True
        return (isinstance(name, str) and name not in _HIDDEN_ATTRS
                and bool(h5py.h5a.exists(self._dsid, name.encode())))

    def __iter__(self) -> Iterator[str]:
        if self._names is None:
            tracked = self._dsid.get_create_plist().get_attr_creation_order() & h5py.h5p.CRT_ORDER_TRACKED
            order = h5py.h5.INDEX_CRT_ORDER if tracked else h5py.h5.INDEX_NAME
            names: list[str] = []
            h5py.h5a.iterate(self._dsid, lambda name: names.append(name.decode("utf-8", errors="replace")),
                             index_type=order)
            self._names = [name for name in names if name not in _HIDDEN_ATTRS]
        return iter(self._names)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _netcdf_attr(aid: h5py.h5a.AttrID, name: str, where: str) -> Any:
    tid = aid.get_type()
    if isinstance(tid, h5py.h5t.TypeStringID):
        if aid.get_space().get_simple_extent_type() == h5py.h5s.NULL:
            return ""
        if tid.is_variable_str():
            strings = [_text(s) for s in np.ravel(_read_attr(aid))]
            return strings[0] if len(strings) == 1 else strings
        # NC_CHAR: read the bytes as stored, NULs and all, as netCDF-C does
        raw = np.empty(aid.shape, aid.dtype)
        aid.read(raw, mtype=tid)
        return _text(raw.tobytes())
    if isinstance(tid, (h5py.h5t.TypeIntegerID, h5py.h5t.TypeFloatID)):  # not enums
        native = np.dtype(aid.dtype).newbyteorder("=")
        if aid.shape is None:  # an HDF5 null dataspace
            return np.empty(0, native)
        values = np.asarray(_read_attr(aid), native).ravel()
        return values[0] if values.size == 1 else values
    raise DirectReadUnsupported(f"attribute {name!r} has an unsupported type ({where})")


def _read_attr(aid: h5py.h5a.AttrID) -> Any:
    """An attribute's value as numpy (variable-length strings as ``bytes`` objects)."""
    shape = aid.shape
    value = np.zeros(shape if shape is not None else (), aid.dtype)
    aid.read(value, mtype=h5py.h5t.py_create(aid.dtype))
    return value[()] if shape == () else value


def _text(value: str | bytes) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value.replace("\x00", "")


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
    size = _BATCH_BYTES
    for item in items:
        if size + item[0].size > _BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(item)
        size += item[0].size
    return batches


# -- bytes ------------------------------------------------------------------


def _pread(fd: int, offset: int, length: int, path: str) -> np.ndarray:
    buf = np.empty(length, np.uint8)  # unlike bytearray, not zeroed first
    view = memoryview(buf)
    done = 0
    while done < length:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise OSError(f"{path!r} ends before byte {offset + length} (truncated file?)")
        done += got
    return buf


def _check_length(buf: Buffer, expected: int, where: str) -> None:
    got = memoryview(buf).nbytes
    if got != expected:
        raise OSError(f"short read: got {got} bytes, expected {expected} ({where})")


def _unshuffle(buf: np.ndarray, itemsize: int) -> np.ndarray:
    """Undo HDF5's shuffle filter: byte ``j`` of every element was stored in plane ``j``."""
    n = buf.size // itemsize
    if n <= 1 or itemsize == 1:
        return buf
    out = np.empty_like(buf)
    elements = out[: n * itemsize].reshape(n, itemsize)
    for j in range(itemsize):  # one plane at a time is ~3x faster than a transposed copy
        elements[:, j] = buf[j * n : (j + 1) * n]
    out[n * itemsize :] = buf[n * itemsize :]  # a ragged tail is stored unshuffled
    return out


def _fletcher32_matches(buf: np.ndarray) -> bool:
    """Check the checksum HDF5 appends (4 bytes, little-endian) to a Fletcher-32 filtered chunk.

    HDF5 sums big-endian 16-bit words modulo 65535 (an odd last byte is the high
    byte of a final word). ``sum2`` weighs word ``i`` of ``n`` by ``n - i``;
    those weights repeat every 65535 words, so words are first summed per
    position modulo 65535 and weighted once. HDF5 also accepts the checksum
    with the bytes of each half swapped (written by releases before 1.6.3).
    """
    modulus = 65535
    body, tail = buf[:-4], buf[-4:]
    if body.size % 2:
        body = np.append(body, np.uint8(0))
    words = body.view(">u2")
    n = words.size
    if n >= modulus:
        full = n - n % modulus
        columns = words[:full].reshape(-1, modulus).sum(axis=0, dtype=np.uint64)
        columns[: n - full] += words[full:]
    else:
        columns = words.astype(np.uint64)
    weights = ((n - np.arange(columns.size, dtype=np.int64)) % modulus).astype(np.uint64)
    sum1 = int(columns.sum()) % modulus
    sum2 = int(((columns % modulus) * weights).sum()) % modulus
    stored = int.from_bytes(tail.tobytes(), "little")
    halves_swapped = int.from_bytes(tail[[1, 0, 3, 2]].tobytes(), "little")
    return any((c & 0xFFFF) % modulus == sum1 and (c >> 16) % modulus == sum2 for c in (stored, halves_swapped))
