"""Write one fragment file: the worker side of :func:`daskcfa.to_cfa`.

A fragment is a complete, self-describing netCDF file (S3netCDF4's rule), or
Zarr store (``fragment_format="zarr"``, :class:`~.zarr.StoreWriter`): the
variable's sub-domain dimensions, the coordinate variables sliced to that
sub-domain, the variable's attributes (``_FillValue`` included) and the global
attributes, so that an aggregation could be rebuilt from the fragments alone
and any netCDF tool can read one on its own.

Each fragment is written so that it either appears whole or not at all: a
local file is written under a temporary name beside its final name and then
renamed; a remote object is built in node-local scratch space (``tempfile``)
and uploaded with one put, which object stores make visible atomically. A
Zarr store is a directory of many objects: locally it is written under a
temporary name and the directory renamed; remotely its objects are uploaded
under the store's prefix (any left by an interrupted upload removed first)
with the consolidated metadata last, so that a store without it is known
unfinished.

After a fragment is in place, a small JSON *marker* records what was written
(the write's token, size, the storage's version token and the CRC-32 of the
stored bytes, of each object of a store: :mod:`daskcfa.storage.fixity`). A
re-run of the same write finds the marker, checks the stored object still has
that size and version (a store: its total size and its consolidated
metadata's version), and skips the fragment: that is how an interrupted
``to_cfa`` resumes without rewriting finished fragments and without reading
them back.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, NamedTuple, Sequence

import netCDF4
import numpy as np

from .. import storage
from ..choices import FRAGMENT_FORMATS, ZARR_FRAGMENTS
from ..decode import Encoding
from ..errors import ArgumentError, BudgetError, CFAError, FragmentError, NotFoundError
from ..lazy import dask_array as da
from ..locks import NETCDF_LOCK
from ..storage.fixity import Fixity, entry, local_fixity, marker_fixity
from ..storage.lease import Lease
from .chunk_writer import ChunkWriter, variable_path, writes_chunks
from .zarr import CONSOLIDATED, StoreWriter, store_state

__all__ = [
    "FRAGMENT_FORMATS",
    "COMPRESSION_KEYS",
    "FragmentRecord",
    "SlicedVariable",
    "FragmentSpec",
    "FragmentTarget",
    "Slabs",
    "encode_values",
    "shared_chunks",
    "write_fragment",
]

#: ``createVariable`` keywords accepted in ``compression`` (netCDF-4 formats only).
COMPRESSION_KEYS = frozenset({
    "compression", "zlib", "complevel", "shuffle", "fletcher32", "chunksizes", "least_significant_digit",
    "significant_digits", "quantize_mode", "blosc_shuffle", "szip_coding", "szip_pixels_per_block",
})


class FragmentRecord(NamedTuple):
    """What one fragment task returns (small: it travels to the commit task)."""

    index: tuple[int, ...]
    uri: str  #: as stored in the aggregation file (relative to it, unless given absolute)
    nbytes: int
    #: size and CRC-32 of the stored bytes (a store: of each object), for fixity checks; None for a
    #: fragment resumed from the marker of a writer that recorded none
    fixity: Fixity | None
    resumed: bool = False  #: written by an earlier run, verified and kept


@dataclass(frozen=True)
class SlicedVariable:
    """A coordinate (or bounds, auxiliary coordinate) variable copied into every fragment,
    sliced along the dimensions it shares with the aggregated variable."""

    name: str
    dims: tuple[str, ...]
    dtype: np.dtype
    attrs: dict[str, Any]


@dataclass(frozen=True)
class FragmentSpec:
    """Everything shared by the fragments of one aggregated variable (no credentials)."""

    variable: str  #: the aggregated variable's path, for error messages
    identifier: str  #: the variable's name inside each fragment
    dims: tuple[str, ...]
    dtype: np.dtype  #: stored dtype; the values given to :func:`write_fragment` are already encoded
    attrs: dict[str, Any]
    global_attrs: dict[str, Any]
    file_format: str
    compression: dict[str, Any]
    aggregation: str  #: URL of the aggregation file, for error messages
    #: variables sliced into every fragment; their values come with each fragment
    sliced: tuple[SlicedVariable, ...] = ()
    #: sizes of dimensions of ``sliced`` variables that the aggregated variable does not have
    extra_dims: dict[str, int] = field(default_factory=dict)
    profile: storage.ProfileRef = storage.NO_PROFILE
    #: group of the fragment file holding the variable, its dimensions and sliced variables
    #: (S3netCDF4 puts a variable in a group at the same group path of each sub-array file)
    group: str = "/"
    #: the chunk shape of every fragment (:func:`shared_chunks`); None: each fragment's own
    chunks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class FragmentTarget:
    """Where one fragment goes and how a later run recognises it."""

    index: tuple[int, ...]
    shape: tuple[int, ...]
    uri: str  #: absolute URI the fragment is written to
    reference: str  #: the URI as the aggregation file stores it
    marker: str  #: absolute URI of the fragment's marker ("": none, for writes that never resume)
    token: str  #: identifies the fragment's content (the same call gives the same token)


class Slabs:
    """A fragment's stored values produced slab by slab (the split graph, for fragments larger than memory).

    Iterating yields ``(where, values)``: slices locating the slab in the
    fragment and its stored (encoded) values. Nothing is read before the
    fragment file is open, and one slab at a time is held.
    """

    def __iter__(self) -> Iterator[tuple[tuple[slice, ...], np.ndarray]]:
        raise NotImplementedError

    def recorded(self) -> None:
        """Called once the fragment is stored and its marker written: what fed it may go."""


def _string_problem(text: np.ndarray) -> str | None:
    """Why a value cannot be stored as a netCDF string (UTF-8 up to a NUL), if one cannot: refused
    before a fragment is written, not by netCDF4-python halfway (whose bytes that are not UTF-8 it
    even writes, unreadable). Fixed-width ``U`` keeps only the NULs before its last other character."""
    for s in text.reshape(-1).tolist():
        if isinstance(s, str):
            try:
                s = s.encode("utf-8")
            except UnicodeEncodeError:
                return f"a string value ({s[:20]!r}) holds a lone surrogate, which UTF-8 cannot encode"
        elif isinstance(s, bytes):
            try:
                s.decode("utf-8")
            except UnicodeDecodeError:
                return f"a string value ({s[:20]!r}) is bytes that are not UTF-8, which readers could not decode"
        else:
            return (f"a value {str(s)[:20]!r} of a string variable is of type {type(s).__name__}, not str (netCDF "
                    "strings have no missing value: use \"\")")
        if b"\x00" in s:
            return ("a string value holds a NUL character, where a netCDF string ends (writing would truncate "
                    "it): remove or replace the NULs first")
    return None


def encode_values(values: Any, attrs: dict[str, Any], dtype: np.dtype, variable: str | None = None) -> np.ndarray:
    """:func:`_encode`, its refusals naming ``variable`` (a task of a graph knows no more of its values)."""
    try:
        return _encode(values, attrs, dtype)
    except CFAError as exc:
        raise exc.located(variable=variable) from None


def _encode(values: Any, attrs: dict[str, Any], dtype: np.dtype) -> np.ndarray:
    """Data values as they are stored: packed, missing points set to the fill value, in ``dtype``.

    The inverse of :meth:`daskcfa.decode.Encoding.decode`, with netCDF4-python's
    packing rule (subtract ``add_offset``, divide by ``scale_factor``, round for
    integer types), so that values read by daskcfa (or netCDF4-python) and
    written back are stored bit for bit as they were. Masked points, and NaN
    where the stored type is an integer, become the fill value (``_FillValue``,
    else netCDF's default). Strings pass through unchanged; masked strings are
    refused, as netCDF has no missing value for them (writing would unmask them).
    """
    dtype = np.dtype(dtype)
    if dtype == np.dtype("S1"):  # characters have a fill value (NUL by default), as numbers have
        return np.ma.filled(values, Encoding.from_attrs(attrs, dtype).output_fill)
    if dtype.kind not in "biuf":
        if np.ma.getmask(values) is not np.ma.nomask and np.ma.getmask(values).any():
            raise FragmentError(f"{int(np.ma.getmask(values).sum()):,} string values are masked, which netCDF "
                                "cannot store (strings have no missing value): fill them first, e.g. with \"\"")
        values = np.asarray(values)
        problem = _string_problem(values) if values.dtype.kind in "OUS" else None
        if problem:
            raise FragmentError(problem)
        return values
    encoding = Encoding.from_attrs(attrs, dtype)
    data = np.ma.getdata(values)
    mask = np.ma.getmask(values)
    if encoding.is_packed:
        if encoding.add_offset is not None:
            data = data - encoding.add_offset
        if encoding.scale_factor is not None:
            data = data / encoding.scale_factor
        if encoding.stored_dtype.kind in "iu":
            data = np.around(data)
    if encoding.stored_dtype.kind in "iu" and data.dtype.kind == "f":
        nan = np.isnan(data)
        if nan.any():
            mask = nan if mask is np.ma.nomask else (mask | nan)
    if encoding.is_packed and encoding.stored_dtype.kind in "iu":
        _check_range(data, mask, encoding.stored_dtype)
        _check_not_missing(data, mask, encoding)
    if mask is not np.ma.nomask and mask.any():
        data = np.where(mask, _masked_as(encoding, attrs), data)
    with np.errstate(invalid="ignore"):
        out = np.asarray(data).astype(encoding.stored_dtype, copy=False)
    return out.view(dtype) if encoding.unsigned else out


def _masked_as(encoding: Encoding, attrs: dict[str, Any]) -> Any:
    """What a masked point is stored as: the _FillValue; without one, a ``missing_value`` (what
    netCDF4-python stores), else netCDF's default fill — except where netCDF4-python would read that
    as a value (an _Unsigned variable): refused, as it would unmask them."""
    if encoding.explicit_fill:
        return encoding.fill_value
    if encoding.missing_values:
        return encoding.missing_values[0]
    if encoding.unsigned or encoding.fill_value is None:
        unheld = (f" (a missing_value of {str(attrs['missing_value'])[:40]} is none: no value of its stored type "
                  f"{encoding.dtype}, never read as missing)") if "missing_value" in attrs else ""
        raise FragmentError(f"masked values of a variable without _FillValue or missing_value{unheld} cannot be "
                            "stored: netCDF4-python would read netCDF's default fill as a value (an _Unsigned "
                            "variable): set a _FillValue")
    return encoding.fill_value


def shared_chunks(spec: FragmentSpec, regular: Sequence[int]) -> FragmentSpec:
    """``spec`` with one chunk shape for every fragment: the one a full-size fragment (of shape
    ``regular``) gets — ``chunksizes`` if given (no larger than it), else netCDF-C's or
    zarr-python's choice for it.

    A shorter fragment (the last along a dimension that the fragment shape does not divide) then
    stores partial edge chunks of that shape rather than smaller chunks of its own, so that every
    fragment of the variable lies on one chunk grid, which a Zarr array over their chunks needs
    (:func:`daskcfa.to_references`). A full-size fragment is stored as before (contiguous where
    netCDF-C would store it so).
    """
    regular = tuple(int(n) for n in regular)
    if spec.file_format.startswith("NETCDF3") or not regular or min(regular) < 1 or spec.dtype.kind not in "biuf":
        return spec
    given = spec.compression.get("chunksizes")
    if given is not None:
        if len(given) != len(regular) or any(int(c) < 1 for c in given):
            raise ArgumentError(f"chunksizes {tuple(given)} do not fit a variable of {len(regular)} dimensions",
                                variable=spec.variable)
        chunks: tuple[int, ...] | None = tuple(min(int(c), n) for c, n in zip(given, regular))
    elif spec.file_format == ZARR_FRAGMENTS:
        chunks = _zarr_chunks(spec, regular)
    else:
        chunks = _netcdf_chunks(spec, regular)
    if chunks is None:  # netCDF-C stores a full-size fragment contiguous: a shorter one is one partial chunk
        return replace(spec, chunks=regular)
    return replace(spec, compression={**spec.compression, "chunksizes": chunks}, chunks=chunks)


def _netcdf_chunks(spec: FragmentSpec, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The chunk shape netCDF-C gives the variable in a fragment of ``shape`` (None: contiguous),
    asked of netCDF-C itself, in memory."""
    with NETCDF_LOCK:
        nc = netCDF4.Dataset("chunks.nc", "w", format=spec.file_format, diskless=True, persist=False)
        try:
            dims = [f"d{i}" for i in range(len(shape))]
            for dim, n in zip(dims, shape):
                nc.createDimension(dim, n)
            chunking = nc.createVariable("v", spec.dtype, dims, **spec.compression).chunking()
        except (ValueError, TypeError, RuntimeError, OSError) as exc:
            raise ArgumentError(f"compression {spec.compression!r} is refused by netCDF4-python/netCDF-C "
                                f"({type(exc).__name__}: {exc})", file=spec.aggregation, variable=spec.variable) from None
        finally:
            nc.close()
    return None if chunking == "contiguous" else tuple(int(c) for c in chunking)


def _zarr_chunks(spec: FragmentSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The chunk shape zarr-python gives an array of ``shape`` (``chunks="auto"``), asked of it, in memory."""
    import zarr

    array = zarr.create_array(zarr.storage.MemoryStore(), shape=shape, dtype=spec.dtype, chunks="auto", zarr_format=2)
    return tuple(int(c) for c in array.chunks)


def _chunking(spec: FragmentSpec, shape: tuple[int, ...]) -> tuple[dict[str, Any], frozenset[str]]:
    """A netCDF-4 fragment's ``createVariable`` keywords and the dimensions it defines unlimited.

    Neither netCDF-C nor HDF5 accepts a chunk longer than a fixed dimension, so a fragment
    shorter than the shared chunk shape (:func:`shared_chunks`) defines those dimensions
    unlimited (its sizes are those of the values written). The classic model allows one
    unlimited dimension: a fragment short along more keeps chunks no larger than itself.
    """
    chunks = spec.chunks
    short = [d for d, (n, c) in enumerate(zip(shape, chunks or ())) if n < c]
    if not short:
        return spec.compression, frozenset()
    if spec.file_format == "NETCDF4_CLASSIC" and len(short) > 1:
        return {**spec.compression, "chunksizes": tuple(max(1, min(c, n)) for c, n in zip(chunks, shape))}, \
            frozenset()
    return {**spec.compression, "chunksizes": chunks}, frozenset(spec.dims[d] for d in short)


def _check_range(packed: np.ndarray, mask: Any, dtype: np.dtype) -> None:
    """Refuse packed values ``dtype`` cannot hold (the cast would wrap them into garbage)."""
    held = np.asarray(packed)[~np.ma.getmaskarray(np.ma.MaskedArray(packed, mask=mask))]
    info = np.iinfo(dtype)
    if held.size and (held.min() < info.min or held.max() > info.max):
        raise ArgumentError(f"packed values from {held.min()} to {held.max()} are outside the range of {dtype} "
                            "(scale_factor and add_offset cannot bring them into it)")


def _check_not_missing(packed: np.ndarray, mask: Any, encoding: Encoding) -> None:
    """Refuse values whose packed form reads back as missing (the _FillValue, a missing_value, outside
    the valid range): a valid value that rounds to the fill would otherwise be lost without a word."""
    with np.errstate(invalid="ignore"):  # (masked points may hold NaN)
        stored = np.asarray(packed).astype(encoding.stored_dtype)
    missing = encoding.missing_mask(stored)
    if missing is None:
        return
    lost = missing & ~np.ma.getmaskarray(np.ma.MaskedArray(stored, mask=mask))
    if lost.any():
        first = np.asarray(stored)[lost].reshape(-1)[0]
        raise ArgumentError(f"{int(lost.sum()):,} values pack to stored values read back as missing (the first "
                            f"packs to {first}: the _FillValue, a missing_value or outside the valid range); "
                            "mask them, or choose scale_factor, add_offset or _FillValue so that they do not")


def write_fragment(spec: FragmentSpec, target: FragmentTarget, values: Any, sliced: Sequence[np.ndarray],
                   semaphore: Any = None, lease: Lease | None = None) -> FragmentRecord:
    """Write one fragment unless an identical one is already stored; return its record.

    ``values`` are the fragment's stored values: one array, or nested lists of
    the dask chunks that tile it (assembled here, so aligned chunks need no
    rechunk task), or :class:`Slabs` written one after the other. ``sliced`` holds the values of ``spec.sliced`` for this
    fragment. ``semaphore`` (a ``distributed.Semaphore``) bounds concurrent
    uploads across a cluster. ``lease`` (the write's lease on its target) is
    checked before anything is written: a writer that lost it stops. Any
    failure is raised as a :class:`~daskcfa.errors.CFAError` naming the fragment.
    """
    where = {"file": target.uri, "variable": spec.variable, "fragment": target.index}
    try:
        done = _verified(spec, target) if target.marker else None
        if done is not None:
            return done
        if lease is not None:
            lease.confirm()
        if isinstance(values, Slabs):
            data: Any = values
        else:
            data = np.asarray(da.core.concatenate3(values) if isinstance(values, list) else values, dtype=spec.dtype)
        if storage.is_local(target.uri):
            fixity = _write_local(spec, target, data, sliced)
        else:
            fixity = _write_remote(spec, target, data, sliced, semaphore)
        record = FragmentRecord(target.index, target.reference, fixity.nbytes, fixity)
        if target.marker:
            _, version = _stored(spec, target.uri)
            marker = {"token": target.token, **entry(target.reference, fixity), "version": version}
            storage.put_bytes(target.marker, json.dumps(marker).encode(), spec.profile)
        if isinstance(data, Slabs):
            data.recorded()
        return record
    except CFAError as exc:
        raise exc.located(**where)
    except Exception as exc:
        # netCDF-C reports a full disk as "HDF error" or even "Permission denied": say how much room is left
        free = storage.free_space(target.uri)
        room = f"; {free:,} bytes free on its filesystem" if free is not None else ""
        raise FragmentError(f"cannot write fragment ({type(exc).__name__}: {exc}{room})", **where) from exc


def _verified(spec: FragmentSpec, target: FragmentTarget) -> FragmentRecord | None:
    """The record of this very fragment if an earlier run stored it and it is unchanged since."""
    try:
        marker = storage.read_json(target.marker, spec.profile)
        if marker.get("token") != target.token:
            return None
        nbytes, version = _stored(spec, target.uri)
    except (NotFoundError, ValueError, BudgetError, AttributeError):  # (a planted marker: rewritten)
        return None
    if nbytes != marker.get("nbytes") or version != marker.get("version"):
        return None
    return FragmentRecord(target.index, target.reference, nbytes, marker_fixity(marker), resumed=True)


def _stored(spec: FragmentSpec, uri: str) -> tuple[int, str]:
    """The stored fragment's size and version (NotFoundError when absent or, a store, unfinished)."""
    if spec.file_format == ZARR_FRAGMENTS:
        return store_state(uri, spec.profile)
    return storage.stat(uri, spec.profile)


def _write_local(spec: FragmentSpec, target: FragmentTarget, data: np.ndarray | Slabs,
                 sliced: Sequence[np.ndarray]) -> Fixity:
    """netCDF-C (or zarr-python) writes a temporary file (directory) beside the final one, which
    is then renamed into place; its checksum is taken before (the bytes still in the page cache)."""
    final = storage.local_path(target.uri)
    os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
    partial = storage.temporary_name(final)
    try:
        _write_file(partial, spec, target, data, sliced)
        fixity = local_fixity(partial)
        if spec.file_format == ZARR_FRAGMENTS:
            storage.remove_tree(final)  # (a finished store whose marker was never written: a rename needs room)
        storage.commit(partial, final, spec.profile)
    except BaseException:
        if os.path.isdir(partial):
            shutil.rmtree(partial, ignore_errors=True)
        elif storage.exists(partial):
            storage.delete(partial)
        raise
    return fixity


def _write_file(path: str, spec: FragmentSpec, target: FragmentTarget, data: np.ndarray | Slabs,
                sliced: Sequence[np.ndarray]) -> None:
    """Write the fragment file at the local ``path``; slabs are read between writes, outside the lock."""
    if spec.file_format == ZARR_FRAGMENTS:
        _write_store(path, spec, target, data, sliced)
        return
    with NETCDF_LOCK:
        nc = netCDF4.Dataset(path, "w", format=spec.file_format)
    direct = None
    try:
        slabs = isinstance(data, Slabs)
        with NETCDF_LOCK:
            var = _fill(nc, spec, target, sliced)
            if writes_chunks(var):  # compressed on every core, outside the lock (see .chunk_writer)
                direct = variable_path(var)
            elif not slabs:
                _assign(var, data)
        if slabs and direct is None:
            for where, values in data:
                with NETCDF_LOCK:
                    var[where] = values
    finally:
        with NETCDF_LOCK:
            nc.close()
    if direct is not None:
        with ChunkWriter(path, direct) as writer:
            for where, values in data if isinstance(data, Slabs) else [((), data)]:
                writer.write(where, values)


def _write_store(path: str, spec: FragmentSpec, target: FragmentTarget, data: np.ndarray | Slabs,
                 sliced: Sequence[np.ndarray]) -> None:
    """Write the fragment as a Zarr store at the local ``path``, its consolidated metadata last."""
    store = StoreWriter(path, spec.global_attrs)
    for var, values in zip(spec.sliced, sliced):
        values = np.asarray(values)
        store.array(var.name, var.dims, values.shape, var.dtype, var.attrs, {})[...] = values
    array = store.array(spec.identifier, spec.dims, target.shape, spec.dtype, spec.attrs, spec.compression)
    for where, values in data if isinstance(data, Slabs) else [((), data)]:
        array[where or ...] = values
    store.finish()


def _write_remote(spec: FragmentSpec, target: FragmentTarget, data: np.ndarray | Slabs,
                  sliced: Sequence[np.ndarray], semaphore: Any) -> Fixity:
    """Build the file in node-local scratch space, then upload it (streamed: memory stays one slab).

    Never in netCDF-C's memory: an in-memory netCDF-4 image has a root group
    without link creation order, which netCDF-C refuses to open for writing.
    """
    if spec.file_format == ZARR_FRAGMENTS:
        return _upload_store(spec, target, data, sliced, semaphore)
    handle, scratch = tempfile.mkstemp(suffix=".nc", prefix="daskcfa-fragment-")
    os.close(handle)
    try:
        _write_file(scratch, spec, target, data, sliced)
        fixity = local_fixity(scratch)
        with semaphore if semaphore is not None else nullcontext():
            storage.put_file(target.uri, scratch, spec.profile)
        return fixity
    finally:
        os.unlink(scratch)


def _upload_store(spec: FragmentSpec, target: FragmentTarget, data: np.ndarray | Slabs,
                  sliced: Sequence[np.ndarray], semaphore: Any) -> Fixity:
    """Build the store in node-local scratch space, then upload its objects under the store's
    prefix: whatever an interrupted upload left there removed first, the consolidated metadata last."""
    scratch = tempfile.mkdtemp(prefix="daskcfa-fragment-", suffix=".zarr")
    try:
        _write_store(scratch, spec, target, data, sliced)
        fixity = local_fixity(scratch)
        names = [name for name, _, _ in fixity.objects]
        base = target.uri.rstrip("/")
        with semaphore if semaphore is not None else nullcontext():
            storage.remove_tree(base + "/", spec.profile)
            first = [n for n in names if n != CONSOLIDATED]
            storage.put_files([(os.path.join(scratch, n), f"{base}/{n}") for n in first], spec.profile)
            storage.put_file(f"{base}/{CONSOLIDATED}", os.path.join(scratch, CONSOLIDATED), spec.profile)
        return fixity
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fill(nc: netCDF4.Dataset, spec: FragmentSpec, target: FragmentTarget,
          sliced: Sequence[np.ndarray]) -> netCDF4.Variable:
    """Define the fragment's contents and write all but the aggregated variable's values (caller
    holds the netCDF lock). Returns that variable."""
    nc.setncatts(spec.global_attrs)
    owner = nc
    for name in filter(None, spec.group.split("/")):
        owner = owner.createGroup(name)
    compression, unlimited = _chunking(spec, target.shape)
    for dim, size in zip(spec.dims, target.shape):
        owner.createDimension(dim, None if dim in unlimited else size)
    for dim, size in spec.extra_dims.items():
        owner.createDimension(dim, size)
    for var, values in zip(spec.sliced, sliced):
        _variable(owner, var.name, var.dims, var.dtype, var.attrs, np.asarray(values), {})
    return _variable(owner, spec.identifier, spec.dims, spec.dtype, spec.attrs, None, compression)


def _variable(nc: netCDF4.Dataset | netCDF4.Group, name: str, dims: tuple[str, ...], dtype: np.dtype,
              attrs: dict[str, Any], values: np.ndarray | None, compression: dict[str, Any]) -> netCDF4.Variable:
    attrs = dict(attrs)
    fill = attrs.pop("_FillValue", None)
    text = dtype.kind in "OU"
    var = nc.createVariable(name, str if text else dtype, dims, fill_value=fill, **compression)
    var.setncatts(attrs)
    var.set_auto_maskandscale(False)
    if values is not None:
        _assign(var, values)
    return var


def _assign(var: netCDF4.Variable, values: Any) -> None:
    """Write all of ``var`` (caller holds the netCDF lock)."""
    if var.dimensions:
        var[...] = values
    else:
        var.assignValue(values)

