"""The write graph behind :func:`daskcfa.to_cfa`: one task per fragment, then one commit.

What to write arrives as a :class:`~daskcfa.write.request.WriteRequest` (:mod:`daskcfa.inputs`
makes one of whatever ``to_cfa`` was given): the dialect-independent
:class:`~daskcfa.model.AggregationDataset` with its ordinary variables, plus
the lazily computed values of each variable to aggregate. Per variable,
:func:`~daskcfa.graph.plan.plan_fragments` chooses the fragment grid; the data are rechunked to it only when their dask
chunks are not aligned with it (:func:`~daskcfa.graph.plan.aligned_chunks`;
finer aligned chunks are assembled by the fragment task itself).

The graph holds one :func:`~daskcfa.fragments.write.write_fragment` task per
fragment, each returning a tiny :class:`~daskcfa.fragments.write.FragmentRecord`,
and one commit task (:mod:`daskcfa.write.commit`) depending on all of them. The aggregation file's bytes are
encoded here, on the client, before anything is written: the fragment URIs
are known in advance, so every rule of the chosen dialect is checked before
the first fragment is written, and the commit task only has to put the file in
place — once every fragment succeeded. A failed write therefore never leaves
an aggregation file, and re-running the same call resumes: fragments whose
markers show them stored and unchanged are not written again.
"""

from __future__ import annotations

import operator
import posixpath
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Mapping

from ..lazy import dask_array as da
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from .. import storage
from ..arguments import check_fragment_shape
from ..errors import ArgumentError
from ..formats.encode import absolute_reference
from ..fragments.write import FRAGMENT_FORMATS, FragmentSpec, FragmentTarget, encode_values, shared_chunks, write_fragment
from ..model import AggregatedVariable, AggregationDataset, FragmentGrid, is_coordinate_variable
from ..storage.uri import check_uri_style
from ..storage.publish import refuse_existing
from ..storage.lease import Lease, generation_name, in_generation, marker_of
from ..storage.history import Change
from ..write.commit import commit_aggregation, plan_commit
from ..write.request import FragmentSource, WriteRequest, WriteSource
from ..write.spec import (DEFAULT_FRAGMENT_NAME, check_apart, check_template, compression_keywords, dimension_size,
                          fragment_columns, fragment_name, fragment_spec, named_for, settle_unlimited)
from ..choices import DEFAULT_FORMAT, DEFAULT_FRAGMENT_FORMAT, DEFAULT_URIS, MAX_FRAGMENT_SIZE
from .plan import aligned_chunks, plan_fragments

__all__ = ["write_graph", "fragment_grid", "region_bounds"]


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
    uris: str = DEFAULT_URIS


# --------------------------------------------------------------------------
# The graph
# --------------------------------------------------------------------------


def write_graph(request: WriteRequest, url: str, *, fragment_shape: Any = None,
                max_fragment_size: int | str | None = None,
                format: str = DEFAULT_FORMAT, fragment_format: str = DEFAULT_FRAGMENT_FORMAT, compression: Any = None,
                fragment_name: str = DEFAULT_FRAGMENT_NAME, mode: str = "w-",
                profile: storage.ProfileRef = storage.NO_PROFILE, semaphore: Any = None, lease: Lease | None = None,
                hold: bool = False, keep_previous: float = 0.0, uris: str = DEFAULT_URIS,
                change: Change | None = None) -> Delayed:
    """The delayed write of ``request`` to the aggregation file at ``url`` (see :func:`daskcfa.to_cfa`),
    recorded as a version made by ``change``.

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
    fragment_name = named_for(fragment_name, fragment_format, format)
    options = _Options(fragment_shape, max_fragment_size, format, fragment_format,
                       compression_keywords(compression, fragment_format), fragment_name, mode, profile, semaphore,
                       check_uri_style(uris))
    check_template(fragment_name, len(request.sources))
    stem = posixpath.splitext(posixpath.basename(url.rstrip("/")))[0]
    check_apart(url, stem)
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
                         keep_previous=keep_previous, expected=request.version, change=change)
    if hold:
        lease.acquire()
    token = tokenize(commit.payload, [k for keys in record_keys for k in keys])
    name = f"cfa-commit-{stem}-{token}"
    layers[name] = (commit_aggregation, commit, record_keys, begin)
    graph = HighLevelGraph.from_collections(name, layers, dependencies=dependencies)
    return Delayed(name, graph)


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
    full = tuple(dimension_size(model, source.group, d) for d in source.dims)
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
    full = tuple(dimension_size(model, source.group, d) for d in source.dims)
    return plan_fragments(full, source.dtype, source.dims, fragment_shape=_shape_for(fragment_shape, source),
                          max_fragment_size=MAX_FRAGMENT_SIZE if max_fragment_size is None else max_fragment_size,
                          axes=_axes(model, source))


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
    encode = partial(encode_values, attrs=source.attrs, dtype=source.dtype, variable=source.name)
    return x.map_blocks(encode, dtype=source.dtype, meta=np.empty((0,) * x.ndim, source.dtype))


# --------------------------------------------------------------------------
# Planning helpers
# --------------------------------------------------------------------------


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


