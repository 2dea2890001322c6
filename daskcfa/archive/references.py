"""An aggregation as an fsspec reference set: :func:`to_references`.

A reference set (the format kerchunk writes and fsspec's ``ReferenceFileSystem``
reads) presents a Zarr store whose chunks are byte ranges of other files. An
aggregated variable becomes one Zarr (v2) array whose chunks are its
fragments' own HDF5 chunks (or a netCDF-3 fragment's contiguous values, or a
Zarr fragment's chunk objects: :mod:`.zarr_layout`), so
that any Zarr reader (xarray, zarr-python) reads the aggregation without
daskcfa; the ordinary variables of the aggregation file (coordinates, bounds)
and every attribute come along, their values inline.

This is only possible where the fragments fit one Zarr array: the same
stored type, chunk shape and filters (HDF5 filters become numcodecs codecs;
a Zarr fragment's codecs are kept),
fragments on one regular chunk grid, values stored as the aggregation
means them (no fragment-level packing, units conversion, transposition), one
set of missing values. Where that fails the export is refused, naming each
fragment and why: a reference set that reads differently from the
aggregation would be a silently wrong copy.

Building references reads each fragment's metadata only (its chunk index),
one dask task per batch of fragments on the current scheduler; tasks carry an
opaque storage profile, never credentials. Fragment URIs in the output are
absolute (resolved against the aggregation file's location), as fsspec
resolves no relative target; credentials are never written (give them to the
reader: ``remote_options``).
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import struct
import tempfile
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .. import storage
from ..choices import REFERENCE_FORMATS
from ..dataset import OpenedDataset, Variable, select_aggregated
from ..decode import Encoding
from ..errors import ArgumentError, CFAError, NotFoundError, ReferencesError, TargetExistsError, redact
from ..formats.netcdf import INSTRUCTION_ATTRS
from ..fragments.canonical import Target, allowed_uris, units_conversion
from ..fragments.codecs import BLOSC, BZIP2, ZSTD
from ..fragments.files import open_fragment
from ..fragments.hdf5_filters import DEFLATE, FLETCHER32, SHUFFLE
from ..fragments.layout import StoredLayout
from ..fragments.zarr import is_reference_set, is_zarr
from ..graph.batches import in_batches
from ..model import AggregatedVariable, FragmentRef
from ..storage import history
from ..storage.access import Access, open_aggregation
from ..storage.publish import WHOLE_FILE_MODES
from ..write.target import WriteTarget
from .zarr_layout import ZarrLayout, zarr_layout

__all__ = ["to_references", "build_references", "References", "scan_fragments", "json_attrs",
           "zarr_fill_value", "xarray_fill_value"]
#: At most this many problems are listed in a refusal (all are counted).
_LISTED = 10
#: What a library below may raise on a damaged or unexpected file.
_LIBRARY_ERRORS = (OSError, ValueError, RuntimeError, KeyError, IndexError, TypeError)


@dataclass(frozen=True)
class _Scanned:
    """What one fragment's metadata says (a task's result): where its bytes are, or why they cannot serve."""

    index: tuple[int, ...]
    uri: str = ""
    layout: StoredLayout | None = None
    encoding: Encoding | None = None
    problem: str | None = None
    #: a Zarr store's chunk objects and codecs (``layout`` is then ``zarr.layout``)
    zarr: ZarrLayout | None = None

    @property
    def missing(self) -> bool:
        return not self.uri and self.problem is None


def to_references(
    url: str,
    variable: str | Sequence[str] | None = None,
    *,
    output: str | None = None,
    format: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    allowed_locations: Iterable[str] | None = None,
    mode: str = "w-",
    record_size: int = 10_000,
    inline: bool = True,
) -> dict[str, Any] | str:
    """Export the aggregation at ``url`` as an fsspec reference set over its fragments' bytes.

    Each aggregated variable (or those named by ``variable``) becomes a Zarr
    v2 array whose chunks are references to its fragments' HDF5 chunks (or a
    Zarr fragment's chunk objects); the
    ordinary variables and all attributes of the aggregation file are
    inlined. Any Zarr reader opens it with fsspec's reference filesystem,
    without daskcfa::

        xarray.open_dataset("reference://", engine="zarr", backend_kwargs={
            "storage_options": {"fo": refs, "remote_protocol": "s3", "remote_options": {...}},
            "consolidated": False})

    ``output=None`` returns the references (JSON form: a dict). Otherwise they
    are written to ``output`` (a path or URL; ``mode="w-"`` refuses one that
    exists, ``"w"`` replaces it) in ``format``: ``"json"`` (version 1, each
    fragment URI once, in ``templates``) or ``"parquet"`` (fsspec's Parquet
    directory, ``record_size`` references per file, for large archives: needs
    pandas, fastparquet and kerchunk); by default Parquet when ``output`` ends
    in ``.parq``/``.parquet``. Returns the output's URL then.

    ``inline=False`` presents the ordinary variables (coordinates, bounds) by
    reference too, as chunks of the aggregation file's own bytes, and writes
    each reference's URI out in full (no ``templates``), every codec as a
    filter and each fill value also as ``_FillValue``, so that tools that
    ingest references only (VirtualiZarr, Icechunk) take the whole set; a
    variable whose bytes cannot be referenced exactly (strings, a scalar, a
    filter without a numcodecs codec, chunks never written, a netCDF-3
    aggregation file's record variables) stays inline.

    Fragment URIs are written absolute. A variable that cannot be presented
    exactly raises :class:`~daskcfa.ReferencesError` naming its fragments
    and the reasons.
    """
    fmt = _format(format, output)
    written = None if output is None else WriteTarget.open(output, storage_options, mode, modes=WHOLE_FILE_MODES,
                                                           stem=False)
    if int(record_size) < 1:
        raise ArgumentError(f"record_size must be at least 1, got {record_size!r}")
    built = build_references(url, variable, storage_options, allowed_locations, inline=bool(inline))
    if built.refused:
        raise built.refusal()
    if written is not None and storage.real_location(written.url) == storage.real_location(built.url):
        raise ArgumentError("output is the aggregation file itself, which writing the references would replace: "
                            "choose another output", file=built.url)
    references = built.references if inline else _ingestible(built.references)
    if written is None:
        if fmt == "parquet":
            raise ArgumentError("format='parquet' writes a directory: give output=")
        return _as_json(references, templated=bool(inline))
    if fmt == "json":
        storage.put_atomic(written.url, json.dumps(_as_json(references, templated=bool(inline))).encode(),
                           written.profile)
    else:
        _put_parquet(references, written.url, written.access, record_size)
    return written.url


@dataclass(frozen=True)
class References:
    """An aggregation's references (key -> JSON text, inline bytes or ``(uri, offset, size)``), and
    the aggregated variables that cannot be presented by reference, with why (by fragment)."""

    url: str
    access: Access
    references: dict[str, Any]
    refused: dict[str, list[tuple[tuple[int, ...], str, str]]]
    chosen: tuple[AggregatedVariable, ...]

    def refusal(self, remedy: str = "") -> ReferencesError:
        """The error naming every refused variable, fragment and reason (and ``remedy``, the caller's own)."""
        return _refusal(self.refused, [av.name for av in self.chosen], self.url, remedy)


def build_references(url: str, variable: str | Sequence[str] | None = None,
                     storage_options: Mapping[str, Any] | None = None,
                     allowed_locations: Iterable[str] | None = None, *, inline: bool = True,
                     version: history.Version | None = None) -> References:
    """The references of the aggregation at ``url`` (every exporter's one source: :func:`to_references`,
    :func:`daskcfa.to_icechunk`), or of its earlier ``version``; the variables that cannot be presented
    are listed, not raised."""
    if version is not None and not inline:
        raise ArgumentError("an earlier version's coordinates are exported inline: its aggregation file is a "
                            "stored copy, not the file the references would name")
    url, access = open_aggregation(url, storage_options, allowed_locations)
    contents = None if version is None else history.payload(url, version, access.profile)
    dataset = OpenedDataset.open(url, access=access, contents=contents)
    names = [variable] if isinstance(variable, str) else variable
    chosen = select_aggregated(dataset, None if names is None else list(names), url)
    references = _metadata(dataset, url, access, inline)
    arrays, refused = _aggregated(chosen, url, access)
    references.update(arrays)
    return References(url, access, references, refused, tuple(chosen))


def _format(format: str | None, output: str | None) -> str:
    if format is None:
        parquet = output is not None and output.rstrip("/").endswith((".parq", ".parquet"))
        return "parquet" if parquet else "json"
    if format not in REFERENCE_FORMATS:
        raise ArgumentError(f"format must be one of {', '.join(map(repr, REFERENCE_FORMATS))}, got {format!r}")
    return format


# -- the references, as one mapping: key -> JSON text, inline bytes, or (uri, offset, size) ------


def _metadata(dataset: OpenedDataset, url: str, access: Access, inline: bool = True) -> dict[str, Any]:
    """Every group's ``.zgroup``/``.zattrs`` and every ordinary variable, its values inline (``inline=False``:
    by reference to the aggregation file's bytes where that is exact)."""
    refs: dict[str, Any] = {}
    plain: list[Variable] = []
    for group in dataset.walk():
        prefix = _prefix(group.path)
        refs[prefix + ".zgroup"] = json.dumps({"zarr_format": 2})
        refs[prefix + ".zattrs"] = _dumps(json_attrs(group.attrs))
        plain += [v for v in group.variables.values() if not v.is_aggregated]
    if not inline:
        referenced = {var.path: _referenced_variable(url, var, access) for var in plain}
        refs.update({k: v for each in referenced.values() if each for k, v in each.items()})
        plain = [var for var in plain if not referenced[var.path]]
    if plain:
        with storage.netcdf_file(url, profile=access.profile, whole=True) as nc:
            for var in plain:
                refs.update(_plain_variable(nc[var.path], var))
    return refs


def _prefix(path: str) -> str:
    path = path.strip("/")
    return path + "/" if path else ""


def _plain_variable(nc: Any, var: Variable) -> dict[str, Any]:
    """An ordinary variable as a Zarr array of one inline chunk, its values as stored."""
    nc.set_auto_maskandscale(False)
    nc.set_auto_chartostring(False)
    values = np.asarray(nc.getValue() if nc.ndim == 0 else nc[...])
    if values.dtype.kind in "OU":  # vlen strings: fixed-width UCS-4 (Zarr v2's "<U")
        values = values.astype(str)
    refs = _plain_metadata(var, values.shape, values.shape, values.dtype, (), None)
    if values.size:
        refs[f"{var.path.strip('/')}/{_chunk_key((0,) * values.ndim)}"] = np.ascontiguousarray(values).tobytes()
    return refs


def _plain_metadata(var: Variable, shape: Sequence[int], chunks: Sequence[int], dtype: np.dtype,
                    filters: Sequence[dict], compressor: dict | None) -> dict[str, Any]:
    """The ``.zarray`` and ``.zattrs`` of an ordinary variable (its ``_FillValue`` as Zarr's fill value)."""
    attrs = dict(var.attrs)
    fill = attrs.pop("_FillValue", None)
    fill = None if fill is None or dtype.kind not in "biuf" else np.asarray(fill).astype(dtype)[()]
    key = var.path.strip("/")
    return {f"{key}/.zarray": _dumps(_zarray(shape, chunks, dtype, filters, compressor, fill)),
            f"{key}/.zattrs": _dumps({**json_attrs(attrs), "_ARRAY_DIMENSIONS": _dimension_names(var.dims)})}


def _referenced_variable(url: str, var: Variable, access: Access) -> dict[str, Any] | None:
    """An ordinary variable as references to its chunks in the aggregation file ``url`` itself; None
    when they cannot be exact (then it is inlined)."""
    if not var.dims or np.dtype(var.dtype).kind not in "biuf" or 0 in var.shape:
        return None
    try:
        with open_fragment(url, [var.path.strip("/")], profile=access.profile, policy=access.policy,
                           fraction=1e-12) as opened:
            layout = opened.storage_layout()
    except (CFAError, *_LIBRARY_ERRORS):
        return None
    if layout is None or layout.shape != tuple(var.shape) or layout.filter_masks.any():
        return None
    size = np.array([max(c, 1) for c in layout.chunks], np.int64)
    if len(layout.sizes) != math.prod(math.ceil(n / c) for n, c in zip(layout.shape, size.tolist())):
        return None  # (a chunk never written reads as the fill value, which Zarr's need not be)
    problems: list[str] = []
    filters, compressor = _pipeline(_Scanned((), url, layout), lambda _, why: problems.append(why))
    if problems:
        return None
    refs = _plain_metadata(var, layout.shape, layout.chunks, layout.dtype, filters, compressor)
    for row, offset, nbytes in zip(layout.starts // size, layout.byte_offsets, layout.sizes):
        refs[f"{var.path.strip('/')}/{_chunk_key(row.tolist())}"] = (url, int(offset), int(nbytes))
    return refs


def _zarray(shape: Sequence[int], chunks: Sequence[int], dtype: np.dtype, filters: Sequence[dict],
            compressor: dict | None, fill: Any) -> dict[str, Any]:
    return {"zarr_format": 2, "shape": [int(n) for n in shape], "chunks": [max(int(c), 1) for c in chunks],
            "dtype": dtype.str, "compressor": compressor, "filters": list(filters) or None,
            "fill_value": _json_fill(fill), "order": "C", "dimension_separator": "."}


def _dimension_names(dims: Sequence[str]) -> list[str]:
    """xarray's ``_ARRAY_DIMENSIONS``: names, not paths (Zarr has no dimension scoping)."""
    return [d.rsplit("/", 1)[-1] for d in dims]


def _chunk_key(index: Sequence[int]) -> str:
    return ".".join(map(str, index)) if len(index) else "0"


# -- aggregated variables -------------------------------------------------------------------------


def _aggregated(chosen: list[AggregatedVariable], url: str, access: Access
                ) -> tuple[dict[str, Any], dict[str, list[tuple[tuple[int, ...], str, str]]]]:
    """The arrays of the aggregated variables, from their fragments' metadata read in parallel, and
    the problems of those that cannot be presented (by variable)."""
    scanned = in_batches(chosen, url, access, scan_fragments, "references")
    refs: dict[str, Any] = {}
    refused: dict[str, list[tuple[tuple[int, ...], str, str]]] = {}
    for av in chosen:
        problems: list[tuple[tuple[int, ...], str, str]] = []
        array = _array(av, scanned[av.name], problems)
        if problems:
            refused[av.name] = problems
        else:
            refs.update(array)
    return refs, refused


def scan_fragments(refs: Sequence[FragmentRef], target: Target) -> list[_Scanned]:
    """Read the metadata of fragments of one variable (a task of :func:`to_references`)."""
    return [_scan(ref, target) for ref in refs]


def _scan(ref: FragmentRef, target: Target) -> _Scanned:
    if ref.is_missing:
        return _Scanned(ref.index)
    if not ref.uris:
        return _Scanned(ref.index, problem="given by its unique value: no bytes to reference")
    if (ref.axes is not None and tuple(ref.axes) != tuple(range(len(ref.shape)))) or any(ref.reversed or ()) \
            or ref.part is not None:
        return _Scanned(ref.index, problem="stored transposed, reversed or as part of its file variable")
    where = {"file": target.source, "variable": target.variable, "fragment": ref.index}
    try:
        candidates = allowed_uris(ref.uris, target.source, target.policy, where)
    except CFAError as exc:
        return _Scanned(ref.index, problem=exc.reason)
    itemsize = np.dtype(target.dtype).itemsize
    for position, uri in enumerate(candidates):  # the first alternative found, as reads take
        if is_reference_set(uri):
            return _Scanned(ref.index, uri, problem="a reference set: its chunks are references to other files "
                                                    "already (kerchunk's MultiZarrToZarr combines reference sets)")
        names = ref.at_alternative(position).variable_names(target.default_identifier)
        try:  # (a tiny fraction: metadata only; a small object comes in one GET)
            with open_fragment(uri, names, profile=target.profile, policy=target.policy, fraction=1e-12,
                               expected_nbytes=math.prod(ref.shape) * itemsize) as var:
                layout = var.storage_layout()
                attrs = {k: var.attrs[k] for k in list(var.attrs)}
                encoding = Encoding.from_attrs(attrs, var.dtype, no_fill=var.no_fill)
                converted = units_conversion(attrs, ref, target) is not None
            zarr = zarr_layout(uri, names, target.profile, policy=target.policy) if is_zarr(uri) else None
            layout = zarr.layout if zarr is not None else layout
        except NotFoundError:
            continue
        except CFAError as exc:
            return _Scanned(ref.index, uri, problem=exc.reason)
        except _LIBRARY_ERRORS as exc:
            return _Scanned(ref.index, uri, problem=redact(f"{type(exc).__name__}: {exc}")[:300])
        if layout is None:
            return _Scanned(ref.index, uri, problem="its storage cannot be located (a type, filter or layout "
                                                    "only netCDF-C reads)")
        if converted:
            return _Scanned(ref.index, uri, problem=f"its units {attrs.get('units', ref.units)!r} are converted to "
                                                    f"the aggregation's {target.units!r}")
        if layout.shape != tuple(ref.shape):
            return _Scanned(ref.index, uri, problem=f"stored with shape {layout.shape}, its place in the aggregation "
                                                    f"has shape {tuple(ref.shape)} (size-1 dimensions dropped)")
        return _Scanned(ref.index, uri, layout, encoding, zarr=zarr)
    return _Scanned(ref.index, problem="fragment file not found")


def _array(av: AggregatedVariable, scanned: list[_Scanned], problems: list) -> dict[str, Any]:
    """The Zarr array of one aggregated variable, or problems (appended to ``problems``)."""
    def refuse(s: _Scanned, reason: str) -> None:
        problems.append((s.index, s.uri, reason))

    for s in scanned:
        if s.problem is not None:
            refuse(s, s.problem)
    stored = [s for s in scanned if s.layout is not None]
    grid = av.fragments.grid
    aggregation = Encoding.from_attrs(av.attrs, av.dtype)
    # the chunk shape most fragments have is the array's (the odd ones are named)
    usual = Counter(s.layout.chunks for s in stored).most_common(1)
    first = next((s for s in stored if s.layout.chunks == usual[0][0]), None) if usual else None
    chunks = first.layout.chunks if first else grid.fragment_shape(next(grid.indices(), ()))
    filters, compressor = _pipeline(first, refuse) if first else ((), None)
    for s in stored:
        layout = s.layout
        if layout.dtype.newbyteorder("=") != np.dtype(av.dtype).newbyteorder("="):
            refuse(s, f"stored as {layout.dtype}, the aggregation holds {np.dtype(av.dtype)}: values are converted")
        elif layout.dtype != first.layout.dtype:
            refuse(s, f"stored as {layout.dtype.str}, fragment {first.index} as {first.layout.dtype.str}")
        if layout.chunks != chunks:
            refuse(s, f"{_kind(s)} chunks of {layout.chunks}, fragment {first.index} has {chunks} (a Zarr array "
                      "has one regular chunk grid)")
        if _signature(s) != _signature(first):
            refuse(s, f"filters {_names(s)}, fragment {first.index} has {_names(first)}")
        skipped = np.flatnonzero(layout.filter_masks)
        if skipped.size:
            refuse(s, f"{skipped.size} chunk(s) stored without some of the variable's filters (the first at "
                      f"{tuple(layout.starts[skipped[0]])}): one array has one pipeline")
        _check_encoding(s, aggregation, refuse)
    masked = _missing_values(stored, aggregation, refuse)
    fill = _fill(aggregation, masked, av.dtype)
    for s in scanned:
        _check_grid(s, grid, chunks, refuse)
        if s.missing and fill is None:
            refuse(s, "a missing fragment, and the aggregation has no fill value to read it as")
    for s in stored:
        _check_unwritten(s, aggregation, fill, refuse)
    if problems:
        return {}
    key = av.name.strip("/")
    dtype = first.layout.dtype if first else np.dtype(av.dtype)
    attrs = {k: v for k, v in av.attrs.items() if k not in INSTRUCTION_ATTRS and k not in ("_FillValue",
                                                                                              "missing_value")}
    others = [v for v in masked if fill is None or _bytes(v, dtype) != _bytes(fill, dtype)]
    if others:
        attrs["missing_value"] = np.array(others, dtype) if len(others) > 1 else np.asarray(others[0], dtype)
    refs: dict[str, Any] = {
        f"{key}/.zarray": _dumps(_zarray(av.shape, chunks, dtype, filters, compressor, None if fill is None else
                                         np.frombuffer(_bytes(fill, dtype), dtype.newbyteorder("="))[0])),
        f"{key}/.zattrs": _dumps({**json_attrs(attrs), "_ARRAY_DIMENSIONS": _dimension_names(av.dims)}),
    }
    size = np.array([max(c, 1) for c in chunks], np.int64)
    for s in stored:
        start = np.array([off[i] for off, i in zip(grid.offsets, s.index)], np.int64)
        layout = s.layout
        objects = s.zarr.objects if s.zarr is not None else [s.uri] * len(layout.sizes)
        for row, uri, offset, nbytes in zip((layout.starts + start) // size if len(size) else layout.starts,
                                            objects, layout.byte_offsets, layout.sizes):
            refs[f"{key}/{_chunk_key(row.tolist())}"] = (uri, int(offset), int(nbytes))
    return refs


#: HDF5 filter id -> the numcodecs codec (its configuration) that decodes what the filter wrote
def _codec(code: int, values: tuple[int, ...], itemsize: int) -> dict[str, Any] | None:
    if code == DEFLATE:
        return {"id": "zlib", "level": int(values[0]) if values else 1}
    if code == SHUFFLE:
        return {"id": "shuffle", "elementsize": int(values[0]) if values else itemsize}
    if code == FLETCHER32:
        return {"id": "fletcher32"}
    if code == ZSTD:
        return {"id": "zstd", "level": int(values[0]) if values else 0}
    if code == BZIP2:
        return {"id": "bz2", "level": int(values[0]) if values else 9}
    if code == BLOSC:  # (decoding reads the compressor and shuffle from each chunk's header)
        return {"id": "blosc", "cname": "lz4", "clevel": int(values[4]) if len(values) > 4 else 5,
                "shuffle": int(values[5]) if len(values) > 5 else 1, "blocksize": 0}
    return None


def _pipeline(s: _Scanned, refuse: Any) -> tuple[tuple[dict[str, Any], ...], dict[str, Any] | None]:
    """The Zarr array's filters and compressor: a Zarr fragment's own, or its HDF5 filters as codecs."""
    if s.zarr is not None:
        return s.zarr.filters, s.zarr.compressor
    codecs = []
    for code, values in s.layout.filters:
        codec = _codec(code, values, s.layout.dtype.itemsize)
        if codec is None:
            refuse(s, f"HDF5 filter {code} has no numcodecs codec")
        else:
            codecs.append(codec)
    return tuple(codecs[:-1]), codecs[-1] if codecs else None


def _kind(s: _Scanned) -> str:
    return "Zarr" if s.zarr is not None else "HDF5"


#: codec settings that decoding does not depend on (a compression level)
_ENCODING_ONLY = ("level", "clevel")


def _signature(s: _Scanned) -> tuple:
    """What decoding a chunk depends on: the filters in order (and shuffle's element size), or a
    Zarr store's codecs but their compression levels."""
    if s.zarr is not None:
        codecs = [*s.zarr.filters, *([s.zarr.compressor] if s.zarr.compressor else [])]
        return ("zarr",) + tuple(tuple(sorted((k, json.dumps(v)) for k, v in c.items() if k not in _ENCODING_ONLY))
                                 for c in codecs)
    return ("hdf5",) + tuple((code, values[:1] if code == SHUFFLE else ()) for code, values in s.layout.filters)


def _names(s: _Scanned) -> str:
    if s.zarr is not None:
        codecs = [*s.zarr.filters, *([s.zarr.compressor] if s.zarr.compressor else [])]
        return "Zarr [" + ", ".join(str(c.get("id")) for c in codecs) + "]"
    layout = s.layout
    codecs = [_codec(code, values, layout.dtype.itemsize) for code, values in layout.filters]
    return "[" + ", ".join(c["id"] if c else str(code) for c, (code, _) in zip(codecs, layout.filters)) + "]"


def _check_encoding(s: _Scanned, aggregation: Encoding, refuse: Any) -> None:
    encoding = s.encoding
    if encoding.is_packed:
        refuse(s, "packed (scale_factor/add_offset) in the fragment: its values are unpacked before they "
                  "enter the aggregation")
    if (encoding.valid_min, encoding.valid_max) != (aggregation.valid_min, aggregation.valid_max):
        refuse(s, f"valid range {encoding.valid_min}..{encoding.valid_max} of its own (the aggregation's: "
                  f"{aggregation.valid_min}..{aggregation.valid_max})")
    if encoding.unsigned != aggregation.unsigned:
        refuse(s, "_Unsigned differs from the aggregation's")


def _masked(encoding: Encoding) -> list[Any]:
    """The values ``encoding`` reads as missing (its valid range aside), in its stored type."""
    values = list(encoding.missing_values)
    if encoding.fill_value is not None and (encoding.explicit_fill or not encoding.unsigned):
        values.append(encoding.fill_value)
    return values


def _bytes(value: Any, dtype: np.dtype) -> bytes:
    """A value's identity in ``dtype`` (NaN equal to NaN, -0.0 apart from 0.0; signed and unsigned views alike)."""
    return np.asarray(value).astype(np.dtype(dtype).newbyteorder("="), copy=False).tobytes()


def _missing_values(stored: list[_Scanned], aggregation: Encoding, refuse: Any) -> list[Any]:
    """The values the array reads as missing: the aggregation's and those every fragment adds
    (which must be the same for all: an array has one set)."""
    dtype = aggregation.stored_dtype
    own = {_bytes(v, dtype): v for v in _masked(aggregation)}
    adds = {}
    for s in stored:
        adds[s.index] = {k: v for v in _masked(s.encoding) if (k := _bytes(v, dtype)) not in own}
    common = Counter(frozenset(a) for a in adds.values()).most_common(1)
    usual = common[0][0] if common else frozenset()
    example = next((i for i, a in adds.items() if frozenset(a) == usual), None)
    for s in stored:
        if frozenset(adds[s.index]) != usual:
            refuse(s, f"missing values {_shown(adds[s.index])} of its own where fragment {example} has "
                      f"{_shown(adds[example])}: one array has one set of missing values")
    return list(own.values()) + (list(adds[example].values()) if example is not None else [])


def _shown(values: Mapping[bytes, Any]) -> str:
    return "{" + ", ".join(map(str, values.values())) + "}" if values else "none"


def _fill(aggregation: Encoding, masked: list[Any], dtype: np.dtype) -> Any:
    """The Zarr fill value: the aggregation's own when it masks it, else another missing value."""
    if aggregation.fill_value is not None and (aggregation.explicit_fill or not aggregation.unsigned):
        return aggregation.fill_value
    return masked[0] if masked else None


def _check_grid(s: _Scanned, grid: Any, chunks: tuple[int, ...], refuse: Any) -> None:
    """A fragment must start on the chunk grid and hold whole chunks (the last one along a
    dimension may end inside one: Zarr and HDF5 both store an edge chunk whole)."""
    for d, (offsets, i, n, c) in enumerate(zip(grid.offsets, s.index, grid.fragment_shape(s.index), chunks)):
        last = i == len(offsets) - 2
        if c and (offsets[i] % c or (n % c and not last)):
            refuse(s, f"along dimension {d} it spans [{offsets[i]}, {offsets[i] + n}), off the regular grid of "
                      f"chunks of {c}")
            return


def _check_unwritten(s: _Scanned, aggregation: Encoding, fill: Any, refuse: Any) -> None:
    """Chunks never written read as the fragment's HDF5 fill value; the array's absent chunks
    read as its fill value: both must be missing data."""
    layout = s.layout
    expected = math.prod(-(-n // c) if c else 0 for n, c in zip(layout.shape, layout.chunks))
    if len(layout.sizes) >= expected:
        return
    value = np.asarray(layout.fill_value if layout.fill_value is not None else 0).astype(layout.dtype)
    native = value.astype(value.dtype.newbyteorder("="))
    mask = s.encoding.missing_mask(s.encoding.as_stored(native.reshape(1)))
    also = aggregation.missing_mask(aggregation.as_stored(native.reshape(1)))
    if fill is None or not ((mask is not None and mask.any()) or (also is not None and also.any())):
        refuse(s, f"{expected - len(layout.sizes)} chunk(s) never written, which read as {value[()]}: not "
                  "missing data")


def _refusal(refused: Mapping[str, list], chosen: list[str], url: str, remedy: str = "") -> ReferencesError:
    lines = []
    for name, problems in refused.items():
        by_fragment: dict[tuple[int, ...], tuple[str, list[str]]] = {}
        for index, uri, reason in sorted(problems):
            by_fragment.setdefault(index, (uri, []))[1].append(reason)
        listed = "; ".join(f"fragment {index} ({redact(uri) or 'no file'}): {', '.join(reasons)}"
                           for index, (uri, reasons) in list(by_fragment.items())[:_LISTED])
        more = f"; and {len(by_fragment) - _LISTED} more" if len(by_fragment) > _LISTED else ""
        lines.append(f"variable {name!r}, {len(by_fragment)} fragment(s): {listed}{more}")
    fine = [n for n in chosen if n not in refused]
    offer = (f"variable={[n.lstrip('/') for n in fine]!r} exports the variables that can be; " if fine else "")
    first_name, first = next(iter(refused.items()))
    return ReferencesError(
        "the aggregation cannot be presented exactly as references: " + " | ".join(lines) + ". Possible: "
        + offer + remedy + "daskcfa.refragment() rewrites the fragments with one storage layout (a fragment shape "
        "that divides the array's shape; compression the same for all), after which references can be built",
        file=url, variable=first_name, fragment=min(first)[0])


# -- writing --------------------------------------------------------------------------------------


def _ingestible(references: Mapping[str, Any]) -> dict[str, Any]:
    """The references as tools that ingest them into Zarr v3 read them: every ``.zarray``'s compressor
    moved to the end of its filters (the same decoding: VirtualiZarr 2.5's kerchunk parser reads codecs
    from ``filters`` only), and its fill value also as ``_FillValue`` in ``.zattrs`` (where xarray looks
    for a Zarr v3 array's missing value; a Zarr v2 reader takes the array's fill value first)."""
    out = dict(references)
    for key, value in references.items():
        if key.rsplit("/", 1)[-1] != ".zarray":
            continue
        zarray = json.loads(value)
        if zarray.get("compressor"):
            zarray["filters"] = [*(zarray.get("filters") or []), zarray["compressor"]]
            zarray["compressor"] = None
            out[key] = _dumps(zarray)
        dtype = np.dtype(zarray["dtype"])
        fill = zarr_fill_value(zarray.get("fill_value"), dtype)
        attrs_key = key[:-len(".zarray")] + ".zattrs"
        if fill is not None and attrs_key in references:
            out[attrs_key] = _dumps({**json.loads(references[attrs_key]), "_FillValue": xarray_fill_value(fill, dtype)})
    return out


def zarr_fill_value(value: Any, dtype: np.dtype) -> Any:
    """A Zarr v2 ``fill_value`` (as :func:`_json_fill` spells it) of a number type, in ``dtype``; else None."""
    if value is None or dtype.kind not in "biuf":
        return None
    named = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
    return np.asarray(named.get(value, value)).astype(dtype.newbyteorder("="))[()]


def xarray_fill_value(value: Any, dtype: np.dtype) -> Any:
    """``_FillValue`` as xarray writes it in a Zarr v3 array's attributes (a float's 8 bytes in base64)."""
    if dtype.kind == "f":
        return base64.standard_b64encode(struct.pack("<d", float(value))).decode()
    if dtype.kind == "b":
        return bool(value)
    return int(value)


def _as_json(references: Mapping[str, Any], templated: bool = True) -> dict[str, Any]:
    """fsspec's version 1: each fragment URI once, in ``templates`` (or, ``templated=False``, written out
    in every reference: VirtualiZarr 2.5's kerchunk parser expands no template)."""
    templates: dict[str, str] = {}
    names: dict[str, str] = {}
    refs: dict[str, Any] = {}
    for key, value in references.items():
        if isinstance(value, tuple):
            uri, offset, size = value
            if not templated:
                refs[key] = [uri, offset, size]
                continue
            name = names.get(uri)
            if name is None:
                name = names[uri] = f"u{len(names)}"
                templates[name] = uri
            refs[key] = ["{{" + name + "}}", offset, size]
        elif isinstance(value, bytes):
            refs[key] = "base64:" + base64.b64encode(value).decode()
        else:
            refs[key] = value
    return {"version": 1, "templates": templates, "refs": refs}


def _put_parquet(references: Mapping[str, Any], output: str, access: Access, record_size: int) -> None:
    """fsspec's Parquet reference set, built in a local temporary directory, then moved or uploaded."""
    try:
        import fsspec
        from fsspec.implementations.reference import LazyReferenceMapper
        import kerchunk.df  # noqa: F401  (fsspec's writer stores inline values with it)
        import pandas  # noqa: F401
    except ImportError as exc:
        raise ArgumentError(f"format='parquet' needs pandas, fastparquet and kerchunk installed ({exc})") from None
    scratch = tempfile.mkdtemp(prefix="daskcfa-refs-")
    try:
        root = os.path.join(scratch, "refs.parq")
        mapper = LazyReferenceMapper.create(root, fs=fsspec.filesystem("file"), record_size=record_size)
        for key, value in sorted(references.items(), key=lambda kv: not _is_metadata(kv[0])):
            mapper[key] = list(value) if isinstance(value, tuple) else value
        mapper.flush()
        if storage.is_local(output):
            target = storage.local_path(output)
            if os.path.lexists(target):
                _check_replaceable(target, output)
                shutil.rmtree(target)
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            shutil.move(root, target)
        else:
            for folder, _, files in os.walk(root):
                for name in files:
                    relative = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                    storage.put_file(output.rstrip("/") + "/" + relative, os.path.join(folder, name), access.profile)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_replaceable(target: str, output: str) -> None:
    """``mode="w"`` replaces a Parquet reference set, never anything else: an output given by mistake (the
    archive's directory, its fragments' directory, the aggregation file, a parent of them) was deleted
    whole. A reference set is a directory (not a link) whose ``.zmetadata`` records a ``record_size``."""
    try:
        metadata = None if os.path.islink(target) or not os.path.isdir(target) else \
            storage.read_json(os.path.join(target, ".zmetadata"))
    except CFAError:
        metadata = None
    if not (isinstance(metadata, dict) and "record_size" in metadata):
        raise TargetExistsError("exists and is not a Parquet reference set (a directory whose .zmetadata records "
                                "a record_size), which mode='w' would replace: not replaced; remove it yourself "
                                "or choose another output", file=output)


def _is_metadata(key: str) -> bool:
    return key.rsplit("/", 1)[-1].startswith(".z")


# -- JSON -----------------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def json_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): _json_value(v) for k, v in attrs.items()}


def _json_value(value: Any) -> Any:
    """An attribute value as JSON (NaN and infinities as Python's json writes them, which Zarr reads)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (np.ndarray, np.generic)):
        value = np.asarray(value)
        if value.dtype.kind == "S":
            value = np.char.decode(value, "utf-8", "replace")
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def _json_fill(value: Any) -> Any:
    """A Zarr v2 ``fill_value``: NaN and infinities spelled as Zarr spells them."""
    if value is None:
        return None
    value = np.asarray(value)
    if value.dtype.kind == "f":
        number = float(value)
        if math.isnan(number):
            return "NaN"
        if math.isinf(number):
            return "Infinity" if number > 0 else "-Infinity"
        return number
    if value.dtype.kind in "SU":
        return base64.standard_b64encode(np.asarray(value).tobytes()).decode() if value.dtype.kind == "S" else str(value)
    return value.item()
