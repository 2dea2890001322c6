"""Re-fragment netCDF files or a CFA dataset into a new CFA dataset with another fragment layout.

:func:`refragment` turns, say, one file per time slice into spatial tiles
(cheap time series) or the reverse, in parallel on any dask scheduler, with
every task under ``max_mem``. This module brings every kind of source to one
form -- the aggregation model of what to write (dimensions, attributes,
ordinary variables copied into the aggregation file) plus, per variable to
re-fragment, the aggregated variable to read -- and plans each variable with
:func:`~daskcfa.graph.split_plan.plan_split`. Writing is the writer's own
graph (:func:`daskcfa.graph.write.write_graph`: markers, resume, atomic
commit), fed by :class:`~daskcfa.graph.split.SplitSource`.

Sources: a CFA aggregation file (any dialect), one plain netCDF file (each
variable with dimensions that is not a coordinate is re-fragmented; the file
is its single fragment), several files (a list, a glob, a directory or
prefix: combined first with :func:`daskcfa.archive.scan.scan`) or an open
:class:`daskcfa.Dataset`.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping, Sequence

import dask
import numpy as np
from dask.delayed import Delayed, delayed
from dask.utils import format_bytes, parse_bytes

from .. import config, storage
from ..arguments import check_fragment_shape
from ..choices import (DEFAULT_FORMAT, DEFAULT_FRAGMENT_FORMAT, DEFAULT_URIS, MAX_FRAGMENT_SIZE, MAX_MEM,
                       ZARR_FRAGMENTS)
from ..dataset import OpenedDataset
from ..errors import ArgumentError, CFAError, ConfigError, FragmentReadError, NotFoundError, VariableNotFoundError
from ..fragments.files import open_fragment
from ..fragments.stored import first_stored
from ..fragments.zarr import is_zarr
from ..graph.read import AggregatedArray
from ..graph.split import SplitSource, remove_staging, staging_root
from ..graph.split_plan import STRATEGIES, SourceLayout, VariablePlan, plan_split
from ..graph.write import fragment_grid, write_graph
from ..write.request import WriteRequest, WriteSource, dataset_model
from ..storage.history import Change
from ..storage.publish import WHOLE_FILE_MODES
from ..write.commit import check_chunk_index, run_write
from ..write.target import WriteTarget
from ..model import AggregatedVariable, AggregationDataset, Fragments, FragmentGrid, is_coordinate_variable
from ..storage.access import Access
from ..storage.policy import LocationPolicy
from ..index_writer import index

__all__ = ["refragment", "split", "plan_refragment", "RefragmentPlan", "OutputEstimate"]

#: CF attributes naming variables that describe others (they are copied, never re-fragmented).
_REFERENCING = ("coordinates", "bounds", "climatology", "ancillary_variables", "cell_measures", "grid_mapping")


@dataclass
class RefragmentPlan:
    """What :func:`refragment` will do: per variable its target fragments, stages, tasks,
    peak memory per task and read amplification. ``str()`` is a readable report."""

    source: str
    max_mem: int
    variables: dict[str, VariablePlan]
    copied: list[str] = field(default_factory=list)  #: ordinary variables copied into the aggregation file
    outputs: dict[str, "OutputEstimate"] = field(default_factory=dict)  #: per variable: the new fragments

    @property
    def output_bytes(self) -> int:
        """Estimated bytes of all new fragments (see :class:`OutputEstimate`)."""
        return sum(o.nbytes for o in self.outputs.values())

    @property
    def peak_memory(self) -> int:
        """The largest estimated memory of any task."""
        return max((p.peak_memory for p in self.variables.values()), default=0)

    @property
    def tasks(self) -> int:
        return sum(p.tasks for p in self.variables.values())

    @property
    def amplification(self) -> dict[str, float]:
        """Read amplification per variable (bytes decoded from the source / bytes needed)."""
        return {name: p.amplification for name, p in self.variables.items()}

    def __str__(self) -> str:
        lines = [f"re-fragment {self.source} with max_mem={format_bytes(self.max_mem)}: "
                 f"{len(self.variables)} variable(s), {self.tasks} tasks, peak task memory "
                 f"{format_bytes(self.peak_memory)}"]
        lines += [str(p) for p in self.variables.values()]
        lines += [f"output {name}: {o}" for name, o in self.outputs.items()]
        if self.outputs:
            lines.append(f"estimated output size: {format_bytes(self.output_bytes)}")
        if self.copied:
            lines.append(f"copied into the aggregation file: {', '.join(self.copied)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class OutputEstimate:
    """The new fragments of one variable: their compression and estimated size.

    ``compression`` holds the ``createVariable`` keywords the fragments are
    written with; ``origin`` says where they come from (``"source"``: as the
    source's first stored fragment, the default; ``"given"``; ``"none"``).
    With the source's compression the size is the data's in-memory size times
    the source's stored/in-memory ratio (measured on that fragment file);
    with a compression the source does not use, the ratio is unknown and the
    in-memory size is given as the estimate (an upper bound, about).
    """

    fragments: int
    raw_bytes: int  #: the data's size in memory
    nbytes: int  #: estimated size of the fragment files
    compression: dict[str, Any]
    origin: str

    def __str__(self) -> str:
        if not self.compression:
            how = "uncompressed" + (" (as the source)" if self.origin == "source" else "")
        else:
            how = ", ".join(f"{k}={v}" for k, v in self.compression.items())
            how = f"{how} ({'as the source' if self.origin == 'source' else 'as given'})"
        size = format_bytes(self.nbytes)
        if self.compression and self.nbytes != self.raw_bytes:
            size = f"about {size} ({format_bytes(self.raw_bytes)} in memory)"
        elif self.compression:
            size = f"{size} in memory (compressed size unknown)"
        return f"{self.fragments} new fragments, {how}, {size}"


@dataclass
class _Refragmented:
    """One variable to re-fragment: what to write (``source``), what to read, and its plan."""

    source: WriteSource
    aggregation: AggregatedVariable
    access: Access
    plan: VariablePlan | None = None


def plan_refragment(source: Any, *, variables: Sequence[str] | None = None,
                    fragment_shape: Sequence[int] | Mapping[str, int] | None = None,
                    max_fragment_size: int | str = MAX_FRAGMENT_SIZE, max_mem: int | str = MAX_MEM,
                    format: str = DEFAULT_FORMAT, fragment_format: str = DEFAULT_FRAGMENT_FORMAT,
                    compression: str | Mapping[str, Any] | None = None,
                    storage_options: Mapping[str, Any] | None = None) -> RefragmentPlan:
    """Plan :func:`refragment` without writing anything (reads only metadata).

    The plan also gives each variable's new fragments: their compression
    (``fragment_format`` and ``compression`` decide it, as for
    :func:`refragment`) and estimated size. ``format`` does not change the
    plan; it is accepted so that a plan and its refragment take the same
    keywords.
    """
    del format
    return _prepare(source, variables, fragment_shape, max_fragment_size, max_mem, storage_options,
                    compression, fragment_format)[0]


def refragment(source: Any, target: str, *, variables: Sequence[str] | None = None,
               fragment_shape: Sequence[int] | Mapping[str, int] | None = None,
               max_fragment_size: int | str = MAX_FRAGMENT_SIZE, max_mem: int | str = MAX_MEM,
               format: str = DEFAULT_FORMAT, fragment_format: str = DEFAULT_FRAGMENT_FORMAT,
               compression: str | Mapping[str, Any] | None = None,
               storage_options: Mapping[str, Any] | None = None, mode: str = "w-", compute: bool = True,
               uris: str = DEFAULT_URIS, chunk_index: bool = False) -> str | Delayed:
    """Copy ``source`` into a new CFA dataset at ``target`` with a new fragment layout.

    Parameters
    ----------
    source
        A CFA aggregation file URL (any dialect), one netCDF file URL or Zarr
        store (its variables with dimensions, coordinates and bounds aside, are
        re-fragmented), several netCDF files or Zarr stores (a list of URLs, a glob, a
        directory or prefix: combined with :func:`daskcfa.archive.scan.scan`),
        or a :class:`daskcfa.Dataset`.
    target
        The new aggregation file (local path or URL); fragments go beside it,
        named as :func:`daskcfa.to_cfa` names them.
    variables
        The data variables to re-fragment (default: all). Coordinates and
        other ordinary variables are always copied into the aggregation file.
    fragment_shape, max_fragment_size, format, fragment_format, uris
        As for :func:`daskcfa.to_cfa`: the target fragment layout (e.g.
        ``{"time": 1000, "lat": 128, "lon": 128}`` for spatial tiles), the
        aggregation dialect, the fragment files' format, and whether fragment
        URIs are stored relative to the aggregation file or absolute.
    compression
        ``None`` (default): each variable compressed as the source (its first
        stored fragment: codec, level, shuffle, checksum); ``"none"`` (or
        ``{}``): uncompressed; otherwise as for :func:`daskcfa.to_cfa` (a
        name such as ``"zlib"`` or ``createVariable`` keywords). netCDF-3
        fragment formats are never compressed; Zarr fragments
        (``fragment_format="zarr"``) take zlib (a source compressed otherwise:
        zlib at level 4, with its shuffle).
    max_mem
        Most memory one task may use (bytes, or a string such as
        ``"256MiB"``). Fragments larger than that are written slab by slab;
        when direct reads would decode compressed source chunks many times,
        reads are consolidated through an intermediate store (see
        :mod:`daskcfa.graph.split_plan`). Raises
        :class:`~daskcfa.errors.BudgetError` before anything is written when
        no task can fit. Give each worker a ``memory_limit`` above it.
    storage_options
        fsspec/s3fs options for the source and the target (flat, or keyed by
        protocol); they never enter the task graph.
    mode
        ``"w-"`` (default) refuses an existing target; ``"w"`` overwrites it.
        Re-running an interrupted call resumes it: finished fragments (and
        staged blocks) are not written again.
    compute
        ``False`` returns a :class:`dask.delayed.Delayed` doing the work.
    chunk_index
        ``True``: write the new aggregation's chunk index beside it once it is
        committed (:func:`daskcfa.index`). Needs ``compute=True``.

    Returns the target aggregation file's URL (or the delayed). The
    aggregation file is written last, atomically, once every fragment is
    stored. The intermediate store of a staged plan lives beside the
    fragments (``<stem>/.daskcfa/staging/``; dask config
    ``daskcfa.refragment.staging`` moves it, e.g. to fast node-local disk on a
    single-node cluster) and is removed after the commit. Dask config
    ``daskcfa.refragment.strategy`` (``auto``, ``direct``, ``staged``)
    overrides the planner's choice.
    """
    check_chunk_index(chunk_index, compute)
    written = WriteTarget.open(target, storage_options, mode, modes=WHOLE_FILE_MODES)
    url, profile = written.url, written.profile
    plan, model, chosen = _prepare(source, variables, fragment_shape, max_fragment_size, max_mem, storage_options,
                                   compression, fragment_format)
    root = staging_root(url, dask.config.get("daskcfa.refragment.staging", None))
    staged = []
    for var in chosen:
        assert var.plan is not None
        array = AggregatedArray(var.aggregation, access=var.access, strings=False)
        var.source.data = SplitSource(var.plan, array, var.source.attrs, var.source.dtype, root, profile)
        if var.plan.strategy == "staged":
            staged.append(var.source.data.staging)
    request = WriteRequest(model, [v.source for v in chosen])
    lease = written.lease()

    def write() -> Any:
        result = write_graph(request, url, fragment_shape=fragment_shape, max_fragment_size=max_fragment_size,
                             format=format, fragment_format=fragment_format, mode=mode,
                             profile=profile, lease=lease, hold=compute, uris=uris,
                             change=Change.of("refragment", source=source, mode=mode,
                                              variables=variables, format=format, fragment_format=fragment_format,
                                              max_fragment_size=max_fragment_size))
        if staged:
            result = delayed(remove_staging, pure=True)(result, staged, profile)
        return result.compute() if compute else result

    if not compute:
        return write()
    return run_write(write, lease, partial(index, storage_options=storage_options) if chunk_index else None)


#: The command line's name for :func:`refragment` (``daskcfa split``), as an alias.
split = refragment


# --------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------


def _prepare(source: Any, variables: Sequence[str] | None, fragment_shape: Any, max_fragment_size: int | str,
             max_mem: int | str, storage_options: Mapping[str, Any] | None, compression: Any = None,
             fragment_format: str = DEFAULT_FRAGMENT_FORMAT
             ) -> tuple[RefragmentPlan, AggregationDataset, list[_Refragmented]]:
    """The model to write, the variables to re-fragment, each planned."""
    config.check()
    budget = parse_bytes(max_mem) if isinstance(max_mem, str) else int(max_mem)
    strategy = dask.config.get("daskcfa.refragment.strategy", "auto")
    if strategy not in STRATEGIES:
        raise ConfigError(f"dask config daskcfa.refragment.strategy must be one of {', '.join(STRATEGIES)}, "
                         f"got {strategy!r}")
    model, found, description = _open_source(source, variables, storage_options)
    chosen = _select(found, variables, description)
    check_fragment_shape(fragment_shape, [d for v in chosen for d in v.source.dims], file=description)
    for var in chosen:
        target = fragment_grid(var.source, model, fragment_shape, max_fragment_size)
        dtype = AggregatedArray(var.aggregation, access=var.access, strings=False).dtype
        # (staged pieces are .npy files, which hold no Python objects without pickle: strings go direct)
        var.plan = plan_split(var.source.name, _layout(var.aggregation, var.access), target, dtype.itemsize, budget,
                              strategy="direct" if dtype.kind == "O" and strategy == "auto" else strategy)
    outputs = {}
    for var in chosen:
        assert var.plan is not None
        outputs[var.source.name] = _output(var, compression, fragment_format)
        var.source.compression = outputs[var.source.name].compression
    plan = RefragmentPlan(description, budget, {v.source.name: v.plan for v in chosen if v.plan is not None},
                          copied=[v.name for v in model.variables], outputs=outputs)
    return plan, model, chosen


def _open_source(source: Any, variables: Sequence[str] | None, storage_options: Mapping[str, Any] | None
                 ) -> tuple[AggregationDataset, list[_Refragmented], str]:
    if isinstance(source, OpenedDataset):
        return (*_from_dataset(source), source.url)
    if isinstance(source, (list, tuple)) or _is_pattern(source):
        return (*_from_files(source, variables, storage_options), _describe(source))
    if not isinstance(source, str):
        raise ArgumentError(f"source must be a URL, a list of URLs, a glob or a daskcfa.Dataset, not "
                        f"{type(source).__name__}")
    from ..api import open_cfa

    url = storage.normalise(source)
    if is_zarr(url) or (not storage.is_opendap(url) and storage.is_directory(url)):  # (a store: scanned as a file)
        return (*_from_files(url, variables, storage_options), url)
    ds = open_cfa(url, storage_options=storage_options)
    if not ds.aggregated_variables:  # a plain netCDF file: it is the one fragment of each data variable
        for var in _data_variables(ds):
            var.aggregation = _single_file(var, url)
    return (*_from_dataset(ds), url)


def _from_dataset(ds: OpenedDataset) -> tuple[AggregationDataset, list[_Refragmented]]:
    model, aggregated = dataset_model(ds)
    found = [_Refragmented(WriteSource(v.path, None, tuple(v.dims), np.dtype(v.dtype), dict(v.attrs)), v.aggregation,
                       v.read_access) for v in aggregated]
    return model, found


def _from_files(sources: Any, variables: Sequence[str] | None,
                storage_options: Mapping[str, Any] | None) -> tuple[AggregationDataset, list[_Refragmented]]:
    from .scan import scan

    model = scan(sources, variables=variables, storage_options=storage_options)
    aggregated, model.aggregated = model.aggregated, []
    found = []
    for av in aggregated:
        # The files were named by the caller: each may be read, wherever it is.
        places = sorted({posixpath.dirname(u) + "/" for u in av.fragments.locations()})
        policy = LocationPolicy.for_aggregation(av.source, ["default", *places])
        access = Access(storage.register(storage_options, protocol=storage.scheme_of(av.source)), policy)
        found.append(_Refragmented(WriteSource(av.name, None, av.dims, np.dtype(av.dtype), dict(av.attrs)), av, access))
    return model, found


def _select(found: list[_Refragmented], variables: Sequence[str] | None, description: str) -> list[_Refragmented]:
    if not found:
        raise VariableNotFoundError("nothing to re-fragment: the source has no data variable with dimensions",
                                    file=description)
    if variables is None:
        return found
    by_path = {v.source.name: v for v in found}
    wanted = [n if n.startswith("/") else f"/{n}" for n in variables]
    unknown = [n for n in wanted if n not in by_path]
    if unknown:
        raise VariableNotFoundError(f"variables {unknown} are not data variables of the source; data variables: "
                                    f"{', '.join(sorted(by_path))}", file=description)
    return [by_path[n] for n in wanted]


def _data_variables(ds: OpenedDataset) -> list[Any]:
    """The variables of a plain file to re-fragment: numeric, with dimensions, not describing others."""
    referenced: set[str] = set()
    for group in ds.walk():
        for var in group.variables.values():
            for key in _REFERENCING:
                value = var.attrs.get(key)
                if isinstance(value, str):
                    referenced.update(w for w in value.replace(":", " ").split())
    found = []
    for group in ds.walk():
        for var in group.variables.values():
            coordinate = is_coordinate_variable(var.name, var.dims)
            if var.ndim and var.dtype.kind in "biuf" and not coordinate and var.name not in referenced:
                found.append(var)
    return found


def _single_file(var: Any, url: str) -> AggregatedVariable:
    """``var`` of a plain file as an aggregation with one fragment: the file itself.

    The aggregation describes the values as the read path delivers them
    (the file's own packing and missing values applied, in canonical form):
    the unpacked dtype, without storage attributes but the fill value.
    """
    from ..decode import STORAGE_ATTRS, Encoding

    encoding = Encoding.from_attrs(var.attrs, var.dtype)
    attrs = {k: v for k, v in var.attrs.items() if k not in STORAGE_ATTRS}
    if encoding.is_packed or encoding.unsigned:
        dtype = np.dtype(encoding.decoded_dtype)
    else:
        dtype = np.dtype(var.dtype)
        if "_FillValue" in var.attrs:
            attrs["_FillValue"] = var.attrs["_FillValue"]
    grid = FragmentGrid(tuple((n,) for n in var.shape))
    uris = np.full(grid.grid_shape, url, dtype=object)
    fragments = Fragments(grid, uris=uris, identifiers=np.array(var.path, dtype=object))
    return AggregatedVariable(name=var.path, dims=tuple(var.dims), dtype=dtype, attrs=attrs, fragments=fragments,
                              dialect="netCDF", source=url)


def _layout(aggregation: AggregatedVariable, access: Access) -> SourceLayout:
    """The source's fragment grid and the storage chunks of its first stored fragment.

    Only that fragment's metadata are read (an HDF5 header, through the
    fragment file manager): the chunks decide read amplification, and
    fragments of one variable are nearly always written alike. Anything that
    cannot be told cheaply (netCDF-3, transposed fragments) counts as
    contiguous storage, read exactly.
    """
    grid = aggregation.fragments.grid
    ref = next((r for r in aggregation.fragments if r.uris), None)
    if ref is None or ref.axes is not None:
        return SourceLayout(grid)
    uri = storage.resolve(ref.uris[0], aggregation.source)
    access = access.with_logins(aggregation.logins)  # (as every reader of the fragments sends them)
    try:
        access.policy.check(uri)
        with open_fragment(uri, ref.variable_names(aggregation.basename), profile=access.profile,
                           policy=access.policy, fraction=0.0, expected_nbytes=1 << 62) as var:
            chunks, compressed = var.layout
            dims = tuple(var.dims)
    except CFAError as exc:
        if isinstance(exc, (NotFoundError, FragmentReadError)):
            return SourceLayout(grid)  # reading will report the fragment properly
        raise
    if chunks is None:
        return SourceLayout(grid)
    by_dim = dict(zip(dims, chunks))
    if not set(by_dim) <= set(aggregation.dims):
        return SourceLayout(grid)
    shape = tuple(int(by_dim.get(d, 1)) for d in aggregation.dims)  # dimensions a fragment omits have size 1
    return SourceLayout(grid, shape, compressed=compressed)


def _output(var: _Refragmented, compression: Any, fragment_format: str) -> OutputEstimate:
    """The compression of ``var``'s new fragments and their estimated size."""
    assert var.plan is not None
    raw = int(np.prod(var.plan.shape, dtype=np.int64)) * int(np.dtype(var.source.dtype).itemsize)
    fragments = var.plan.target.nfragments
    if fragment_format.startswith("NETCDF3"):
        return OutputEstimate(fragments, raw, raw, {}, "none")
    if compression is None:
        keywords, ratio = _source_compression(var.aggregation, var.access)
        if fragment_format == ZARR_FRAGMENTS and keywords:  # (Zarr fragments take zlib: the source's level and shuffle)
            level = keywords.get("complevel", 4) if keywords.get("compression") == "zlib" else 4
            keywords = {"compression": "zlib", "complevel": level, "shuffle": bool(keywords.get("shuffle"))}
        return OutputEstimate(fragments, raw, raw if ratio is None else int(raw * ratio), keywords, "source")
    if compression is False or compression == "none" or (isinstance(compression, Mapping) and not compression):
        return OutputEstimate(fragments, raw, raw, {}, "none")
    keywords = {"compression": compression} if isinstance(compression, str) else dict(compression)
    return OutputEstimate(fragments, raw, raw, keywords, "given")


def _source_compression(aggregation: AggregatedVariable, access: Access) -> tuple[dict[str, Any], float | None]:
    """The ``createVariable`` compression keywords of the first stored fragment, and its stored/in-memory ratio.

    ``({}, None)`` when that fragment cannot be opened (reading reports it
    properly) or holds no compressed variable.
    """
    stored = first_stored(aggregation, access)
    if stored is None:
        return {}, None
    keywords = _create_keywords(stored.filters)
    ratio = min(1.0, stored.nbytes / stored.held) if keywords and stored.held else None
    return keywords, ratio


def _create_keywords(filters: Mapping[str, Any]) -> dict[str, Any]:
    """netCDF4-python's ``Variable.filters()`` as ``createVariable`` keywords (empty: not compressed)."""
    out: dict[str, Any] = {}
    for codec in ("zlib", "zstd", "bzip2"):
        if filters.get(codec):
            out["compression"] = codec
            out["complevel"] = int(filters.get("complevel") or 4)
    if filters.get("blosc"):
        blosc = filters["blosc"]
        out.update(compression=blosc["compressor"], complevel=int(filters.get("complevel") or 4),
                   blosc_shuffle=int(blosc.get("shuffle", 1)))
    if filters.get("szip"):
        szip = filters["szip"]
        out.update(compression="szip", szip_coding=szip["coding"], szip_pixels_per_block=szip["pixels_per_block"])
    if out:
        out["shuffle"] = bool(filters.get("shuffle"))  # (createVariable would shuffle by default)
        if filters.get("fletcher32"):
            out["fletcher32"] = True
    return out


def _is_pattern(source: Any) -> bool:
    return isinstance(source, str) and any(c in source for c in "*?[")


def _describe(sources: Any) -> str:
    if isinstance(sources, str):
        return sources
    sources = list(sources)
    return sources[0] if len(sources) == 1 else f"{sources[0]} and {len(sources) - 1} more files"
