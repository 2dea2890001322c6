"""Scan existing netCDF files (and Zarr stores, reference sets) and plan an aggregation over them (nothing is written).

The I/O half, kept apart from the planner (:mod:`.aggregation_plan`) like a
plan from its execution: the files are found (:mod:`.sources`); a **metadata
scan** (parallel, one dask task per file, any scheduler) opens each file and
returns a small :class:`~.aggregation_plan.FileInfo` -- dimensions, variables
(dims, dtype, attributes), global attributes and the values of the
coordinate variables and their bounds (a Zarr store or reference set is read
through :class:`~daskcfa.fragments.zarr.ZarrFile`, by the fragment reader's
rules); the planner lays the files out; a
second, smaller pass reads the ordinary variables the planner asks for (only
when there are some), and digests them in every other file to prove they agree.

Problems are reported as :class:`~daskcfa.errors.AggregationError` naming the
files involved. Credentials never enter a task: tasks carry an opaque
:class:`~daskcfa.storage.ProfileRef`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

import dask
import numpy as np

from .. import storage
from ..errors import AggregationError, CFAError, FragmentReadError, redact
from ..fragments.zarr import ZarrFile, is_zarr, netcdf_attributes
from ..model import BOUNDS_ATTRS, AggregationDataset, is_coordinate_variable
from .aggregation_plan import FILES_NAMED, FileInfo, PlainReads, Planner, VariableInfo, digest
from .sources import expand_sources, sources_profile

__all__ = ["scan", "scan_files", "read_plain", "plan_aggregation"]


def scan(sources: str | Sequence[str], *, concat_dims: Sequence[str] | None = None,
         variables: Sequence[str] | None = None, storage_options: Mapping[str, Any] | None = None,
         scheduler: Any = None) -> AggregationDataset:
    """The aggregation of existing netCDF files, in memory (nothing is written).

    ``sources`` is a file URL, a Zarr store or reference set (one source), a
    directory or prefix (its netCDF files and Zarr stores), a glob
    (``"data/tas_*.nc"``, ``"s3://bucket/cmip/*.nc"``) or a list of these.
    ``concat_dims`` names the dimensions to concatenate along (default: those
    whose coordinate values differ between files); ``variables`` restricts the
    data variables (their coordinates come along). The files' metadata are
    read in parallel with dask (``scheduler`` as for ``dask.compute``; default:
    the current one, a ``distributed`` client included).

    Fragment URIs in the result are absolute (normalised); each aggregated
    variable's ``source`` is the earliest file. Raises
    :class:`~daskcfa.errors.AggregationError` naming the files when they
    cannot be aggregated.
    """
    profile = sources_profile(sources, storage_options)
    files = expand_sources(sources, profile)
    infos = scan_files(files, profile, scheduler=scheduler)
    return plan_aggregation(infos, concat_dims=concat_dims, variables=variables, profile=profile,
                            scheduler=scheduler)


def plan_aggregation(infos: Sequence[FileInfo], *, concat_dims: Sequence[str] | None = None,
                     variables: Sequence[str] | None = None,
                     positions: Mapping[str, Mapping[str, int]] | None = None,
                     profile: storage.ProfileRef = storage.NO_PROFILE, scheduler: Any = None
                     ) -> AggregationDataset:
    """The aggregation of the scanned files (see :func:`scan`).

    ``positions`` (file URI -> {dimension: index}) orders the files along
    those dimensions instead of their coordinates: the writer's fragment
    names carry them, which is how :func:`daskcfa.rebuild` orders fragments
    that have no coordinate variables.
    """
    planner = Planner(list(infos), concat_dims, variables, positions or {})
    reads = planner.plain_reads()
    return planner.model(reads, read_plain(reads, profile, scheduler))


def scan_files(files: Sequence[str], profile: storage.ProfileRef = storage.NO_PROFILE, *,
               scheduler: Any = None) -> list[FileInfo]:
    """Every file's :class:`FileInfo`, read in parallel; unreadable files are reported together."""
    tasks = [dask.delayed(_scan_one, pure=True)(uri, profile, dask_key_name=f"cfa-scan-{dask.base.tokenize(uri, profile)}")
             for uri in files]
    results = dask.compute(*tasks, scheduler=scheduler)
    failed = [(uri, r) for uri, r in zip(files, results) if isinstance(r, str)]
    if failed:
        lines = "; ".join(f"{redact(uri)}: {why}" for uri, why in failed[:FILES_NAMED])
        more = f"; and {len(failed) - FILES_NAMED} more" if len(failed) > FILES_NAMED else ""
        raise AggregationError(f"{len(failed)} of {len(files)} files cannot be read: {lines}{more}",
                               file=failed[0][0])
    return list(results)


def _scan_one(uri: str, profile: storage.ProfileRef) -> FileInfo | str:
    """One file's metadata and coordinate values, or why it cannot be read."""
    return _in_file(uri, profile, "metadata", lambda ds: _describe(ds, uri))


def _in_file(uri: str, profile: storage.ProfileRef, what: str, read: Callable[[Any], Any]) -> Any:
    """``read(dataset)`` (a netCDF4 dataset under the netCDF lock, or a Zarr store's :class:`ZarrFile`),
    or why the file cannot be read (a string)."""
    opened = False
    try:
        with _opened(uri, profile) as ds:
            opened = True
            try:
                return read(ds)
            except (OSError, RuntimeError, ValueError, LookupError, TypeError) as exc:  # (LookupError: an
                # _Encoding naming no text codec, which netCDF4-python decodes characters with)
                return f"cannot read its {what} ({type(exc).__name__}: {redact(str(exc))[:200]})"
    except CFAError as exc:
        if opened and not isinstance(exc, FragmentReadError):
            raise
        return exc.reason  # it cannot be opened, or a variable of it cannot be read


@contextmanager
def _opened(uri: str, profile: storage.ProfileRef) -> Iterator[Any]:
    if is_zarr(uri):
        yield ZarrFile(uri, profile)  # (named by the caller: no location policy, as for a file)
    else:
        with storage.netcdf_file(uri, profile=profile) as ds:
            yield ds


def _describe(ds: Any, uri: str) -> FileInfo:
    if isinstance(ds, ZarrFile):
        return _describe_zarr(ds, uri)
    variables = {}
    for name, var in ds.variables.items():
        dtype = np.dtype(object) if var.dtype is str else np.dtype(var.dtype)
        variables[name] = VariableInfo(name, tuple(var.dimensions), tuple(var.shape), dtype,
                                       {k: var.getncattr(k) for k in var.ncattrs()})
    info = FileInfo(uri=uri, attrs={k: ds.getncattr(k) for k in ds.ncattrs()},
                    dims={name: len(dim) for name, dim in ds.dimensions.items()}, variables=variables,
                    groups=tuple(ds.groups))
    for name in _coordinate_names(variables):
        info.values[name] = _raw(ds, name)
    return info


def _describe_zarr(store: ZarrFile, uri: str) -> FileInfo:
    """A Zarr store as a netCDF file: its arrays' dimension names, CF attributes and fill values
    as the fragment reader (and xarray) reads them; dimensions from the arrays' shapes."""
    variables: dict[str, VariableInfo] = {}
    dims: dict[str, int] = {}
    for name in store.names():
        var = store.variable(name, text=True)
        variables[name] = VariableInfo(name, var.dims, var.shape, var.dtype, netcdf_attributes(var.attrs))
        for dim, size in zip(var.dims, var.shape):
            if dims.setdefault(dim, size) != size:
                raise ValueError(f"dimension {dim!r} has size {dims[dim]} in one array and {size} in {name!r}")
    info = FileInfo(uri=uri, attrs=store.attrs, dims=dims, variables=variables, groups=store.groups())
    for name in _coordinate_names(variables):
        info.values[name] = _raw(store, name)
    return info


def _coordinate_names(variables: Mapping[str, VariableInfo]) -> list[str]:
    """Coordinate variables (1-D, named after their dimension) and the variables bounding them."""
    names = [n for n, v in variables.items() if is_coordinate_variable(n, v.dims)]
    for name in list(names):
        for key in BOUNDS_ATTRS:
            bounds = variables[name].attrs.get(key)
            if isinstance(bounds, str) and bounds in variables and bounds not in names \
                    and variables[bounds].dims[:1] == (name,):
                names.append(bounds)
    return names


def _raw(ds: Any, name: str) -> np.ndarray:
    """Stored values of variable ``name``, exactly (no masking, no unpacking)."""
    if isinstance(ds, ZarrFile):
        return ds.variable(name, text=True).values()
    var = ds.variables[name]
    var.set_auto_maskandscale(False)
    values = var[...]
    return np.asarray(values)


def _read_plain(uri: str, profile: storage.ProfileRef, wanted: tuple[str, ...], digested: tuple[str, ...]
                ) -> tuple[dict[str, np.ndarray], dict[str, str]] | str:
    """Stored values of ``wanted`` and digests of ``digested`` variables of one file."""
    return _in_file(uri, profile, "variables", lambda ds: (
        {name: _raw(ds, name) for name in wanted},
        {name: digest(_raw(ds, name)) for name in digested},
    ))


def read_plain(reads: PlainReads, profile: storage.ProfileRef, scheduler: Any = None
               ) -> list[tuple[dict[str, np.ndarray], dict[str, str]] | str]:
    """Execute the planner's :class:`~.aggregation_plan.PlainReads`: per file, values and digests
    (or why the file cannot be read), one dask task per file."""
    tasks = [dask.delayed(_read_plain, pure=True)(uri, profile, wanted, digested)
             for uri, wanted, digested in reads.files]
    return list(dask.compute(*tasks, scheduler=scheduler))
