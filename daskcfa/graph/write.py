"""The write graph behind :func:`daskcfa.to_cfa`: one task per fragment, then one commit.

What to write arrives as a :class:`WriteRequest` (:mod:`daskcfa.inputs`
makes one of whatever ``to_cfa`` was given): the dialect-independent
:class:`~daskcfa.model.AggregationDataset` with its ordinary variables, plus
the lazily computed values of each variable to aggregate. Per variable,
:func:`~daskcfa.graph.plan.plan_fragments` chooses the fragment grid; the data are rechunked to it only when their dask
chunks are not aligned with it (:func:`~daskcfa.graph.plan.aligned_chunks`;
finer aligned chunks are assembled by the fragment task itself).

The graph holds one :func:`~daskcfa.fragments.write.write_fragment` task per
fragment, each returning a tiny :class:`~daskcfa.fragments.write.FragmentRecord`,
and one commit task depending on all of them. The aggregation file's bytes are
encoded here, on the client, before anything is written: the fragment URIs
are known in advance, so every rule of the chosen dialect is checked before
the first fragment is written, and the commit task only has to put the file in
place — once every fragment succeeded. A failed write therefore never leaves
an aggregation file, and re-running the same call resumes: fragments whose
markers show them stored and unchanged are not written again.
"""

from __future__ import annotations

import json
import operator
import posixpath
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Mapping

from ..lazy import dask_array as da
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from .. import storage
from ..arguments import check_fragment_shape
from ..decode import PACKING_ATTRS, STORAGE_ATTRS, Encoding, default_fill_value
from ..errors import ArgumentError, CFAError, CFAFormatError, NotFoundError, WriteConflictError
from ..formats import aggregated_variables
from ..formats.encode import absolute_reference, encode_aggregation, fragment_conventions
from ..choices import ZARR_FRAGMENTS
from ..fragments.zarr import check_zarr_compression
from ..fragments.write import (
    COMPRESSION_KEYS,
    FRAGMENT_FORMATS,
    FragmentRecord,
    FragmentSpec,
    FragmentTarget,
    SlicedVariable,
    encode_values,
    shared_chunks,
    write_fragment,
)
from ..model import (AggregatedVariable, AggregationDataset, Dimension, FragmentGrid, Fragments, PlainVariable,
                     is_coordinate_variable)
from ..storage.uri import check_uri_style
from ..storage.publish import UPDATE_MODES, put_aggregation, refuse_existing
from ..storage.lease import (Lease, generation_name, generation_of, in_generation, marker_of, own_generations, retire,
                             schedule)
from ..choices import MAX_FRAGMENT_SIZE
from .plan import aligned_chunks, plan_fragments

__all__ = [
    "WriteRequest",
    "WriteSource",
    "FragmentSource",
    "fragment_grid",
    "write_graph",
    "commit_aggregation",
    "plan_commit",
    "fragment_spec",
    "compression_keywords",
    "settle_unlimited",
    "fragment_name",
    "region_bounds",
    "fragment_columns",
]


#: Fragments' names: S3netCDF4's layout (``.zarr`` instead of ``.nc`` for Zarr fragments).
DEFAULT_FRAGMENT_NAME = "{stem}/{stem}.{var}.{index}.nc"


class FragmentSource:
    """Data that produce each fragment's values themselves, instead of dask chunks.

    The split graph (:mod:`daskcfa.graph.split`) reads each target fragment's
    region straight from the source, slab by slab. It is a dask collection
    (its graph holds any tasks the fragment tasks depend on) whose
    :meth:`fragment_values` gives the ``values`` argument of one fragment task.
    """

    name: str  #: identifies the data (part of the fragments' resume tokens)

    def fragment_values(self, grid: FragmentGrid, index: tuple[int, ...]) -> Any:
        raise NotImplementedError


@dataclass
class WriteSource:
    """One variable to aggregate."""

    name: str  #: path, e.g. ``"/tas"``
    #: dask or numpy array of the values (decoded, or stored when ``encoded``), or a FragmentSource
    data: Any
    dims: tuple[str, ...]
    dtype: np.dtype  #: stored dtype
    attrs: dict[str, Any]
    encoded: bool = False  #: ``data`` already holds stored values (xarray encodes its own)
    #: r+: the variable as the existing aggregation file describes it
    existing: AggregatedVariable | None = None
    region: dict[str, slice] = field(default_factory=dict)
    #: this variable's ``createVariable`` compression keywords (None: the write's ``compression``)
    compression: dict[str, Any] | None = None
    #: the fragment grid of the aggregation the data come from: kept unless a fragment plan is asked for
    grid: FragmentGrid | None = None

    @property
    def group(self) -> str:
        return posixpath.dirname(self.name) or "/"

    @property
    def basename(self) -> str:
        return posixpath.basename(self.name)


@dataclass
class WriteRequest:
    """What to write: the aggregation file's contents minus fragments, and the sources."""

    model: AggregationDataset
    sources: list[WriteSource]
    #: r+: the existing aggregation file's (size, version) when it was read; the commit checks it is unchanged
    version: tuple[int, str] | None = None


@dataclass(frozen=True)
class _Options:
    fragment_shape: Any
    max_fragment_size: int | str | None
    format: str
    fragment_format: str
    compression: dict[str, Any]
    fragment_name: str
    mode: str
    profile: storage.ProfileRef
    semaphore: Any
    uris: str = "relative"


@dataclass(frozen=True)
class _Commit:
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


def _check_classic(name: str, dtype: np.dtype, file_format: str) -> None:
    """The classic data model (netCDF-3 but CDF-5, and NETCDF4_CLASSIC) has no unsigned, 64-bit or string types;
    Zarr fragments hold numbers only (what their reader reads)."""
    if file_format == ZARR_FRAGMENTS and dtype.kind not in "biuf":
        raise ArgumentError(f"{name!r} has dtype {dtype}; Zarr fragments hold numbers only (use NETCDF4 fragments)")
    if file_format in ("NETCDF4", ZARR_FRAGMENTS):
        return
    if dtype.kind in "OU" or (dtype.kind == "S" and dtype.itemsize > 1):
        raise ArgumentError(f"{name!r} holds strings, which only NETCDF4 fragments store (vlen strings)")
    if file_format == "NETCDF3_64BIT_DATA":
        return
    if dtype.str[1:] not in ("i1", "i2", "i4", "f4", "f8", "S1"):
        raise ArgumentError(f"{name!r} has dtype {dtype}, which {file_format} fragments cannot hold "
                        "(use NETCDF4 or NETCDF3_64BIT_DATA, or cast the data)")


# --------------------------------------------------------------------------
# The graph
# --------------------------------------------------------------------------


def write_graph(request: WriteRequest, url: str, *, fragment_shape: Any = None,
                max_fragment_size: int | str | None = None,
                format: str = "CF-1.13", fragment_format: str = "NETCDF4", compression: Any = None,
                fragment_name: str = DEFAULT_FRAGMENT_NAME, mode: str = "w-",
                profile: storage.ProfileRef = storage.NO_PROFILE, semaphore: Any = None, lease: Lease | None = None,
                hold: bool = False, keep_previous: float = 0.0, uris: str = "relative") -> Delayed:
    """The delayed write of ``request`` to the aggregation file at ``url`` (see :func:`daskcfa.to_cfa`).

    Its first task takes ``lease`` (a new one if None) on the target, every
    fragment task checks it still holds it, and the commit releases it; the
    fragments go to the write's own generation (:mod:`daskcfa.storage.lease`).
    With ``hold`` the lease is taken now, by the caller, who computes the write
    and releases the lease whatever happens: a failed computation raises while
    its other tasks may still run, and a first task taking the lease only then
    would leave it held by nobody (the first task then only checks it).
    """
    if fragment_format not in FRAGMENT_FORMATS:
        raise ArgumentError(f"unknown fragment format {fragment_format!r}; choose one of {', '.join(FRAGMENT_FORMATS)}")
    if not request.sources:
        raise ArgumentError("nothing to aggregate: no variable with dimensions and a numeric dtype")
    if keep_previous < 0:
        raise ArgumentError(f"keep_previous must be a number of seconds >= 0, got {keep_previous!r}")
    check_fragment_shape(fragment_shape, [d for s in request.sources for d in s.dims], file=url)
    fragment_name = _named_for(fragment_name, fragment_format, format)
    options = _Options(fragment_shape, max_fragment_size, format, fragment_format,
                       compression_keywords(compression, fragment_format), fragment_name, mode, profile, semaphore,
                       check_uri_style(uris))
    _check_template(fragment_name, len(request.sources))
    stem = posixpath.splitext(posixpath.basename(url.rstrip("/")))[0]
    _check_apart(url, stem)
    settle_unlimited(request.model)

    planned = [_plan_variable(source, request.model, url, options) for source in request.sources]
    generation = generation_name(tokenize([p.token for p in planned]))
    lease = replace(lease or Lease.new(url, profile), generation=generation, profile=profile)
    begin = f"cfa-begin-{stem}-{generation}"
    layers: dict[Any, Any] = {begin: (_begin, lease, mode, hold)}
    dependencies = []
    record_keys = []
    references: set[str] = set()
    for source, plan in zip(request.sources, planned):
        aggregated, keys = _variable_layer(source, plan, url, stem, options, generation, begin, layers, references)
        request.model.aggregated.append(aggregated)
        record_keys.append(keys)
        dependencies.append(plan.data)
    commit = plan_commit(request.model, url, format=format, fragment_format=fragment_format, generation=generation,
                         variables=[s.name for s in request.sources], mode=mode, profile=profile,
                         keep_previous=keep_previous, expected=request.version)
    if hold:
        lease.acquire()
    token = tokenize(commit.payload, [k for keys in record_keys for k in keys])
    name = f"cfa-commit-{stem}-{token}"
    layers[name] = (commit_aggregation, commit, record_keys, begin)
    graph = HighLevelGraph.from_collections(name, layers, dependencies=dependencies)
    return Delayed(name, graph)


#: Dialects whose reference writer (S3netCDF4) puts a variable in a group at the same group
#: path of each fragment file; readers of the others expect it at the root.
_S3NETCDF4_FORMATS = ("CFA-0.5", "CFA-0.4")


def plan_commit(model: AggregationDataset, url: str, *, format: str, fragment_format: str, generation: str,
                variables: list[str], mode: str, profile: storage.ProfileRef, keep_previous: float = 0.0,
                expected: tuple[int, str] | None = None, file_format: str = "NETCDF4") -> _Commit:
    """What :func:`commit_aggregation` puts in place: the aggregation file of ``model`` (its fragments
    complete), encoded now, which checks every rule of ``format``, and its manifest's description.
    ``variables`` are the paths of the aggregated variables whose fragment records the commit gets."""
    payload = encode_aggregation(model, format=format, file_format=file_format)
    root = posixpath.join(posixpath.splitext(posixpath.basename(url.rstrip("/")))[0], ".daskcfa")
    return _Commit(
        url=url, payload=payload, mode=mode, profile=profile,
        manifest=storage.manifest_uri(url),
        header={"aggregation": posixpath.basename(url), "format": format, "fragment_format": fragment_format,
                "generation": generation},
        variables=tuple(variables),
        retired=storage.resolve(posixpath.join(root, "retired.json"), url), keep_previous=float(keep_previous),
        expected=expected,
        references=frozenset(storage.resolve(u, url) for av in model.aggregated for u in av.fragments.locations()),
    )


def _begin(lease: Lease, mode: str, held: bool) -> Lease:
    """The write's first task: take the lease (or, ``held`` by the caller, check it is still ours);
    ``w-`` refuses a target that exists by now."""
    if held:
        lease.confirm(force=True)
    else:
        lease.acquire()
    try:
        refuse_existing(lease.target, mode, lease.profile)
    except FileExistsError:
        lease.release()
        raise
    return lease


@dataclass
class _Planned:
    """One variable's plan: its grid, the region written, its values and what the fragments hold."""

    grid: FragmentGrid
    start: tuple[int, ...]
    positions: list
    data: Any  #: dask array aligned with the fragments, or a FragmentSource
    sliced: list
    spec: FragmentSpec
    dtype: np.dtype
    attrs: dict[str, Any]
    token: str  #: what the fragments will hold (their resume tokens derive from it)


def _plan_variable(source: WriteSource, model: AggregationDataset, url: str, options: _Options) -> _Planned:
    full = tuple(_dimension_size(model, source.group, d) for d in source.dims)
    grid = fragment_grid(source, model, options.fragment_shape, options.max_fragment_size)
    start, stop = _bounds(source, full, grid)
    positions = [grid.fragments_between(d, a, b) for d, (a, b) in enumerate(zip(start, stop))]
    sub_sizes = tuple(tuple(grid.sizes[d][i] for i in r) for d, r in enumerate(positions))
    x = source.data if isinstance(source.data, FragmentSource) else _aligned(source, sub_sizes)

    spec, sliced, dtype, attrs = fragment_spec(source, model, url, format=options.format,
                                               fragment_format=options.fragment_format,
                                               compression=options.compression, profile=options.profile)
    spec = shared_chunks(spec, [max(sizes, default=0) for sizes in grid.sizes])  # (a full-size fragment's shape)
    # What the fragments will hold; not the profile, whose name differs between processes (resuming must not).
    token = tokenize(x.name, grid.sizes, start, replace(spec, profile=storage.NO_PROFILE),
                     [values for _, values in sliced], options.fragment_name)
    return _Planned(grid, start, positions, x, sliced, spec, dtype, attrs, token)


def fragment_spec(source: WriteSource, model: AggregationDataset, url: str, *, format: str, fragment_format: str,
                  compression: dict[str, Any], profile: storage.ProfileRef
                  ) -> tuple[FragmentSpec, list[tuple[SlicedVariable, np.ndarray]], np.dtype, dict[str, Any]]:
    """What every fragment of ``source`` shares (its :class:`FragmentSpec`), the ordinary variables
    sliced into each with their values, and the aggregation variable's dtype and attributes."""
    sliced, extra_dims = _sliced_variables(model, source)
    for name, dt in [(source.name, source.dtype), *((v.name, v.dtype) for v, _ in sliced)]:
        _check_classic(name, dt, fragment_format)
    dtype, attrs, fragment_attrs = _encodings(source)
    global_attrs = {**model.attrs, "Conventions": fragment_conventions(model.attrs.get("Conventions"))}
    spec = FragmentSpec(
        variable=source.name, identifier=source.basename, dims=source.dims, dtype=source.dtype, attrs=fragment_attrs,
        global_attrs=global_attrs, file_format=fragment_format,
        compression=compression if source.compression is None else compression_keywords(source.compression, fragment_format),
        aggregation=url, sliced=tuple(s for s, _ in sliced), extra_dims=extra_dims, profile=profile,
        group=source.group if format in _S3NETCDF4_FORMATS else "/",
    )
    return spec, sliced, dtype, attrs


def _variable_layer(source: WriteSource, plan: _Planned, url: str, stem: str, options: _Options, generation: str,
                    begin: str, layers: dict, references: set[str]) -> tuple[AggregatedVariable, list]:
    """Add one variable's fragment tasks to ``layers``; its model entry and task keys."""
    grid, start, x, spec, var_token = plan.grid, plan.start, plan.data, plan.spec, plan.token
    write_name = f"cfa-write-{source.basename}-{var_token}"
    slice_name = f"cfa-slice-{source.basename}-{var_token}"
    chunk_offsets = [np.cumsum((0,) + c) for c in x.chunks] if isinstance(x, da.Array) else []
    written = {}
    keys = []
    for n, local in enumerate(np.ndindex(*[len(p) for p in plan.positions])):
        index = tuple(int(p[i]) for p, i in zip(plan.positions, local))
        reference = in_generation(
            fragment_name(options.fragment_name, stem=stem, variable=source.name, index=index), generation)
        if reference in references:
            raise ArgumentError(f"fragment_name {options.fragment_name!r} gives two fragments the name {reference!r}")
        references.add(reference)
        uri = storage.resolve(reference, url)
        written[index] = absolute_reference(uri, options.format) if options.uris == "absolute" else reference
        frag_slices = grid.fragment_slices(index)
        target = FragmentTarget(
            index=index, shape=grid.fragment_shape(index), uri=uri, reference=written[index], marker=marker_of(uri),
            token=tokenize(var_token, index, reference),
        )
        if isinstance(x, FragmentSource):
            fragment_data = x.fragment_values(grid, index)
        else:
            fragment_data = _chunk_keys(x, chunk_offsets,
                                        [slice(s.start - a, s.stop - a) for s, a in zip(frag_slices, start)])
        slice_keys = []
        for k, (var, values) in enumerate(plan.sliced):
            where = tuple(frag_slices[source.dims.index(d)] if d in source.dims else slice(None) for d in var.dims)
            key = (slice_name, k, *(_fragment_position(grid, source.dims, d, s) for d, s in zip(var.dims, where)))
            if key not in layers:
                layers[key] = np.array(values[where])
            slice_keys.append(key)
        key = (write_name, n)
        layers[key] = (write_fragment, spec, target, fragment_data, slice_keys, options.semaphore, begin)
        keys.append(key)
    aggregated = AggregatedVariable(
        name=source.name, dims=source.dims, dtype=plan.dtype, attrs=plan.attrs,
        fragments=fragment_columns(source, grid, written), dialect=options.format, source=url,
    )
    return aggregated, keys


def fragment_grid(source: WriteSource, model: AggregationDataset, fragment_shape: Any,
                  max_fragment_size: int | str | None) -> FragmentGrid:
    """The fragment grid ``source`` is written on: the existing one (``r+``), the source
    aggregation's when no plan is asked for (a conversion to another dialect keeps the
    fragments), else the plan (``max_fragment_size`` None: :data:`MAX_FRAGMENT_SIZE`)."""
    if source.existing is not None:
        return source.existing.fragments.grid
    if source.grid is not None and fragment_shape is None and max_fragment_size is None:
        return source.grid
    full = tuple(_dimension_size(model, source.group, d) for d in source.dims)
    return plan_fragments(full, source.dtype, source.dims, fragment_shape=_shape_for(fragment_shape, source),
                          max_fragment_size=MAX_FRAGMENT_SIZE if max_fragment_size is None else max_fragment_size,
                          axes=_axes(model, source))


def _encodings(source: WriteSource) -> tuple[np.dtype, dict[str, Any], dict[str, Any]]:
    """The aggregation variable's dtype and attributes, and the fragments' attributes.

    A reader unpacks every fragment *before* aggregating (the canonical form
    of CF aggregation), then applies the aggregation variable's own packing.
    So packed values are written as packed fragments that carry the packing
    attributes (self-describing), and the aggregation variable describes the
    unpacked data: the unpacked dtype, without the attributes of the packed
    storage. An existing aggregation (``r+``) keeps its own description: its
    packing stays on the aggregation variable and new fragments hold the
    stored values without it, as its other fragments do.
    """
    encoding = Encoding.from_attrs(source.attrs, source.dtype)
    if not encoding.is_packed:
        return source.dtype, source.attrs, source.attrs
    if source.existing is not None:
        return source.dtype, source.attrs, {k: v for k, v in source.attrs.items() if k not in PACKING_ATTRS}
    # The fragments' fill value, in the unpacked type, as the aggregation's _FillValue: CFAPyX
    # leaves that very number at the points the fragments mark missing (it fills its masked
    # reads with the fragment's fill value), and masks them only when the aggregation says so.
    attrs = {k: v for k, v in source.attrs.items() if k not in STORAGE_ATTRS}
    fill = encoding.fill_value if encoding.fill_value is not None else default_fill_value(encoding.stored_dtype)
    attrs["_FillValue"] = np.asarray(fill).astype(encoding.decoded_dtype)[()]
    return encoding.decoded_dtype, attrs, source.attrs


def _aligned(source: WriteSource, sizes: tuple[tuple[int, ...], ...]) -> da.Array:
    """The stored values as a dask array whose chunks are aligned with the fragments.

    Unaligned chunks are rechunked to the fragments; aligned ones are kept
    (a fragment task assembles the chunks it covers). Values not yet
    encoded are packed and filled chunk by chunk (a blockwise step that dask
    fuses into the tasks producing the chunks).
    """
    x = source.data
    shape = tuple(sum(row) for row in sizes)
    if x.shape != shape:
        raise ArgumentError(f"{source.name}: the data have shape {x.shape}, the region to write has shape {shape}")
    if not isinstance(x, da.Array):
        x = da.from_array(x, chunks=sizes, asarray=False)
    elif not aligned_chunks(FragmentGrid(sizes), x.chunks):
        x = x.rechunk(sizes)
    if source.encoded:
        return x.astype(source.dtype, copy=False)
    encode = partial(encode_values, attrs=source.attrs, dtype=source.dtype)
    return x.map_blocks(encode, dtype=source.dtype, meta=np.empty((0,) * x.ndim, source.dtype))


def fragment_columns(source: WriteSource, grid: FragmentGrid, written: dict[tuple[int, ...], str]) -> Fragments:
    """The variable's fragment columns: the fragments written now, and (r+) the others as they were
    (``source.existing`` on ``grid``: references, identifiers, unique values)."""
    existing = source.existing.fragments if source.existing is not None else None
    width = existing.uris.shape[-1] if existing is not None and existing.uris is not None else 1
    uris = np.full(grid.grid_shape + (width,), "", dtype=object)
    ids = np.full(grid.grid_shape, source.basename, dtype=object)
    values = None
    if existing is not None:
        if existing.uris is not None:
            uris[...] = np.where(existing.uris == None, "", existing.uris)  # noqa: E711 (element-wise)
        if existing.identifiers is not None:
            names = np.asarray(existing.identifiers, dtype=object)
            if names.ndim == grid.ndim + 1:  # one per alternative URI (CFA-0.6.2)
                ids = np.full(grid.grid_shape + names.shape[-1:], source.basename, dtype=object)
            ids[...] = np.broadcast_to(names, ids.shape)
        if existing.unique_values is not None:
            values = np.ma.array(existing.unique_values, copy=True)
    for index, reference in written.items():
        uris[index] = ""
        uris[index + (0,)] = reference
        ids[index] = source.basename
        if values is not None:
            values[index] = np.ma.masked
    if len(set(ids.ravel().tolist())) == 1:
        ids = np.array(ids.ravel()[0], dtype=object)
    # how the kept fragments lie in their files (NCA): kept, so that a dialect which cannot say so refuses them
    lying = {}
    for name in ("axes", "reversed", "parts"):
        column = getattr(existing, name) if existing is not None else None
        if column is not None:
            column = lying[name] = np.array(column, dtype=object)
            for index in written:
                column[index] = None
    return Fragments(grid, uris=uris, identifiers=ids, unique_values=values, **lying)


def commit_aggregation(commit: _Commit, records: list[list[FragmentRecord]], lease: Lease) -> str:
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
        earlier = _read_manifest(commit)
        previous = _previous_fragments(commit, earlier)
        listed = schedule(previous, commit.references, commit.url, commit.retired, commit.profile,
                          commit.keep_previous)
        generations = own_generations(earlier, previous, commit.references, listed, commit.url,
                                      commit.header["generation"])
        storage.remove_stale_temporaries([commit.url, *new], commit.profile)
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
                entries[".".join(map(str, rec.index))] = {"uri": rec.uri, "nbytes": rec.nbytes, "md5": rec.checksum}
        manifest = {**commit.header, "generations": generations, "fragments": fragments}
        storage.put_atomic(commit.manifest, json.dumps(manifest, indent=1).encode(), commit.profile)
        retire(commit.references, commit.url, commit.retired, commit.profile, generations)
    finally:
        lease.release()
    return commit.url


def _read_manifest(commit: _Commit) -> dict[str, Any]:
    """The manifest of the previous write, its malformed parts left out (it lies beside the data,
    and anyone who can write there can plant one: never a bare error, never trusted further
    than :func:`daskcfa.storage.lease.own_generations` checks)."""
    try:
        manifest = json.loads(storage.read_bytes(commit.manifest, commit.profile))
    except (NotFoundError, ValueError, RecursionError):
        manifest = {}
    if not isinstance(manifest, dict):
        manifest = {}
    fragments = manifest.get("fragments")
    manifest["fragments"] = {
        variable: {i: e for i, e in entries.items() if isinstance(e, dict) and isinstance(e.get("uri"), str)}
        for variable, entries in (fragments.items() if isinstance(fragments, dict) else ())
        if isinstance(entries, dict)}
    return manifest


def _previous_fragments(commit: _Commit, manifest: dict[str, Any]) -> set[str]:
    """Fragments the aggregation file about to be replaced references that a daskcfa writer
    made (in a generation directory, or listed in its manifest): what the commit may retire."""
    if commit.mode == "w-" or not storage.exists(commit.url, commit.profile):
        return set()
    listed = {storage.resolve(e["uri"], commit.url) for entries in manifest["fragments"].values()
              for e in entries.values()}
    try:
        with storage.netcdf_file(commit.url, profile=commit.profile) as ds:
            found = aggregated_variables(ds, commit.url)
        uris = {storage.resolve(u, commit.url) for v in found.values() for u in v.fragments.locations()}
    except (CFAError, ValueError):
        return set()  # not an aggregation we can read: nothing of it is touched
    return {u for u in uris if generation_of(u) is not None or u in listed}


# --------------------------------------------------------------------------
# Planning helpers
# --------------------------------------------------------------------------


def fragment_name(template: str, *, stem: str, variable: str, index: tuple[int, ...]) -> str:
    """A fragment's URI reference from the ``fragment_name`` template.

    ``{var}`` is the variable's path with group names joined by dots
    (``/grp/tas`` -> ``grp.tas``, so S3netCDF4's layout puts the group after
    the stem); ``{index}`` is the fragment index joined by dots (``0`` for
    scalar data).
    """
    var = ".".join(part for part in variable.split("/") if part)
    return template.format(stem=stem, var=var, index=".".join(map(str, index)) or "0")


def _check_template(template: str, nvariables: int) -> None:
    try:
        fragment_name(template, stem="s", variable="v", index=(0,))
    except (KeyError, IndexError, ValueError) as exc:
        raise ArgumentError(f"fragment_name {template!r} may only use {{stem}}, {{var}} and {{index}} ({exc})") from None
    if "{index}" not in template or (nvariables > 1 and "{var}" not in template):
        raise ArgumentError(f"fragment_name {template!r} must contain {{index}} (and {{var}} for several variables), "
                         "so that every fragment gets its own name")


def _named_for(template: str, fragment_format: str, format: str) -> str:
    """The fragment name template for ``fragment_format``: Zarr stores end in ``.zarr`` (how
    readers know them), in CF-1.13 aggregations (which name fragments by URI alone)."""
    if fragment_format != ZARR_FRAGMENTS:
        return template
    if format != "CF-1.13":
        raise ArgumentError(f"Zarr fragments are written for CF-1.13 aggregations, not {format} (whose readers "
                            "expect netCDF fragments)")
    if template == DEFAULT_FRAGMENT_NAME:
        return template[: -len(".nc")] + ".zarr"
    if not template.endswith(".zarr"):
        raise ArgumentError(f"fragment_name {template!r} must end in '.zarr' for Zarr fragments (how readers "
                            "recognise a store)")
    return template


def _check_apart(url: str, stem: str) -> None:
    """Refuse, before anything is written, an aggregation file named as its fragments' directory
    (``to_cfa(x, "myarchive")``: fragments and write markers would go to ``myarchive/``, where the file must go)."""
    name = posixpath.basename(url.rstrip("/"))
    if name == stem:
        raise ArgumentError(f"the aggregation file {name!r} would share its name with its fragments' directory "
                            f"{name + '/'!r}; give it a suffix, such as {name + '.nc'!r}", file=url)


def compression_keywords(compression: Any, fragment_format: str) -> dict[str, Any]:
    """``createVariable`` keywords: ``None``, ``"zlib"`` (netCDF4's defaults), or a dict of them."""
    if compression is None:
        return {}
    if isinstance(compression, str):
        compression = {"compression": compression}
    if not isinstance(compression, Mapping):
        raise ArgumentError(f"compression must be None, a name such as 'zlib', or a dict, got {compression!r}")
    unknown = sorted(set(compression) - COMPRESSION_KEYS)
    if unknown:
        raise ArgumentError(f"unknown compression settings {unknown}; known: {', '.join(sorted(COMPRESSION_KEYS))}")
    if fragment_format.startswith("NETCDF3"):
        raise ArgumentError(f"{fragment_format} fragments cannot be compressed (use NETCDF4 or NETCDF4_CLASSIC)")
    if fragment_format == ZARR_FRAGMENTS:
        return check_zarr_compression(compression)
    return dict(compression)


def settle_unlimited(model: AggregationDataset) -> None:
    """A dimension stays unlimited only if an ordinary variable spans it: aggregated
    variables are scalars in the aggregation file, so nothing else would give it a length."""

    def spanned(dim: Dimension) -> bool:
        group, name = posixpath.split(dim.name)
        inside = group.rstrip("/") + "/"
        return any(name in v.dims and (posixpath.dirname(v.name).rstrip("/") + "/").startswith(inside)
                   for v in model.variables)

    model.dimensions = [replace(d, unlimited=d.unlimited and spanned(d)) for d in model.dimensions]


def _dimension_size(model: AggregationDataset, group: str, name: str) -> int:
    """The size of dimension ``name`` as seen from ``group``; an error when none is visible there."""
    size = model.dimension_size(group, name)
    if size is None:
        raise CFAFormatError(f"dimension {name!r} is not defined in group {group!r} or above")
    return size


def _axes(model: AggregationDataset, source: WriteSource) -> dict[str, str]:
    """Axis classes from the ``axis`` attributes of the variable's coordinate variables."""
    axes = {}
    for dim in source.dims:
        coord = model.find_variable(source.group, dim)
        if coord is not None and is_coordinate_variable(dim, coord.dims) and "axis" in coord.attrs:
            axes[dim] = str(coord.attrs["axis"])
    return axes


def _shape_for(fragment_shape: Any, source: WriteSource) -> Any:
    """The caller's fragment shape for this variable (a mapping keeps only its dimensions)."""
    if isinstance(fragment_shape, Mapping):
        return {d: n for d, n in fragment_shape.items() if d in source.dims}
    return fragment_shape


def _bounds(source: WriteSource, full: tuple[int, ...], grid: FragmentGrid) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Start and stop of the region written, checked to fall on fragment boundaries."""
    start, stop = [], []
    for d, (dim, n) in enumerate(zip(source.dims, full)):
        a, b = region_bounds(source.region.get(dim, slice(None)), n, dim)
        bounds = grid.offsets[d]
        if a not in bounds or b not in bounds:
            raise ArgumentError(f"region[{dim!r}] = {a}:{b} does not fall on fragment boundaries of {source.name} "
                             f"along {dim!r} ({', '.join(map(str, bounds))})")
        start.append(a)
        stop.append(b)
    return tuple(start), tuple(stop)


def region_bounds(where: slice, size: int, dim: str) -> tuple[int, int]:
    """Start and stop of a region slice along a dimension of ``size``: numpy's negative
    indices are counted from the end, but a bound beyond the dimension or an empty
    region is refused (numpy would clip it, and the data would land elsewhere)."""
    bounds = []
    for bound, default in ((where.start, 0), (where.stop, size)):
        bound = default if bound is None else operator.index(bound)
        if not -size <= bound <= size:
            raise ArgumentError(f"region[{dim!r}] = {where.start}:{where.stop} reaches beyond the dimension's "
                                f"size {size}")
        bounds.append(bound + size if bound < 0 else bound)
    if bounds[1] <= bounds[0]:
        raise ArgumentError(f"region[{dim!r}] = {where.start}:{where.stop} is empty (the dimension has size {size})")
    return bounds[0], bounds[1]


def _chunk_keys(x: da.Array, chunk_offsets: list[np.ndarray], slices: list[slice]) -> Any:
    """Key of the one chunk holding a fragment, or nested lists of the chunks tiling it."""
    ranges = [range(int(np.searchsorted(off, s.start)), int(np.searchsorted(off, s.stop)))
              for off, s in zip(chunk_offsets, slices)]
    if all(len(r) == 1 for r in ranges):
        return (x.name, *(r[0] for r in ranges))

    def nest(prefix: tuple[int, ...], depth: int) -> Any:
        if depth == len(ranges):
            return (x.name, *prefix)
        return [nest(prefix + (i,), depth + 1) for i in ranges[depth]]

    return nest((), 0)


def _fragment_position(grid: FragmentGrid, dims: tuple[str, ...], dim: str, where: slice) -> int:
    """Which fragment along ``dim`` a slice belongs to (-1: the whole dimension)."""
    if dim not in dims or where == slice(None):
        return -1
    return grid.fragment_at(dims.index(dim), where.start)


def _sliced_variables(model: AggregationDataset, source: WriteSource) -> tuple[list, dict[str, int]]:
    """The ordinary variables every fragment carries, sliced to its sub-domain.

    Coordinate variables of the variable's dimensions, the variables named by
    its ``coordinates`` attribute, and the ``bounds`` of those. Dimensions they
    have beyond the variable's (e.g. a bounds dimension) are copied whole.
    """
    wanted = list(source.dims) + str(source.attrs.get("coordinates", "")).split()
    chosen: dict[str, PlainVariable] = {}
    for name in wanted:
        var = model.find_variable(source.group, name)
        if var is None or var.name in chosen or posixpath.basename(var.name) == source.basename:
            continue
        chosen[var.name] = var
        bounds = var.attrs.get("bounds")
        bvar = model.find_variable(source.group, str(bounds)) if bounds is not None else None
        if bvar is not None:
            chosen.setdefault(bvar.name, bvar)
    sliced, extra, seen = [], {}, set()
    for var in chosen.values():
        base = posixpath.basename(var.name)
        if base in seen:
            continue
        seen.add(base)
        for dim in var.dims:
            if dim not in source.dims:
                extra[dim] = _dimension_size(model, posixpath.dirname(var.name) or "/", dim)
        values = np.ma.filled(var.data) if np.ma.isMaskedArray(var.data) else np.asarray(var.data)
        sliced.append((SlicedVariable(base, tuple(var.dims), np.dtype(var.dtype), dict(var.attrs)), values))
    return sliced, extra
