"""The public entry points: ``from_cfa`` and ``open_cfa``."""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any, Iterable, Mapping, Sequence

import dask
from .lazy import dask_array as da
from dask.delayed import Delayed
import netCDF4

from . import config, storage
from .netcdf4 import Dataset
from .arguments import nearest
from .choices import DEFAULT_FORMAT, DEFAULT_FRAGMENT_FORMAT, DEFAULT_URIS
from .errors import ArgumentError, CFAError, CFAFormatError, VariableNotFoundError
from .formats import aggregated_variables, dialect_of, parse_variable
from .formats.netcdf import find_variable
from . import inputs
from .formats.encode import common_format
from .index_writer import index
from .graph.write import write_graph
from .write.request import is_xarray
from .write.spec import DEFAULT_FRAGMENT_NAME
from .graph.plan import plan_fragments
from .fragments.chunk_index import indexed
from .graph.read import to_dask
from .model import AggregatedVariable
from .storage import history
from .storage.history import Change
from .storage.access import Access, open_aggregation
from .storage.publish import UPDATE_MODES, check_mode
from .write.commit import check_chunk_index, run_write
from .write.target import WriteTarget

__all__ = ["from_cfa", "open_cfa", "read_aggregation", "to_cfa", "plan_fragments"]


def _select(ds: netCDF4.Dataset, url: str, variable: str | None) -> AggregatedVariable:
    if variable is None:
        found = aggregated_variables(ds, url)
        if len(found) == 1:
            return next(iter(found.values()))
        if not found:
            raise VariableNotFoundError("the file holds no aggregated variable", file=url)
        raise VariableNotFoundError(
            f"the file holds {len(found)} aggregated variables; choose one with variable=: {', '.join(sorted(found))}",
            file=url,
        )
    var = find_variable(ds, variable if variable.startswith("/") else "/" + variable)
    if var is None or dialect_of(var) is None:
        found = sorted(aggregated_variables(ds, url))
        what = "is not an aggregated variable" if var is not None else "does not exist"
        hint = nearest(variable.lstrip("/"), [n.lstrip("/") for n in found])
        raise VariableNotFoundError(f"variable {variable!r} {what}{hint}; aggregated variables: "
                                    f"{', '.join(found) or 'none'}", file=url)
    return parse_variable(var, url)


def read_aggregation(url: str, variable: str | None = None, *, storage_options: Mapping[str, Any] | None = None,
                     access: Access | None = None, contents: bytes | None = None) -> AggregatedVariable:
    """Parse one aggregated variable of the file at ``url`` into the model (no fragment I/O);
    ``contents``: the bytes of an earlier version of the file (:func:`earlier`)."""
    if variable is not None and not isinstance(variable, str):
        raise ArgumentError(f"variable is a variable's name (a string), not {type(variable).__name__}")
    if access is None:
        url, access = open_aggregation(url, storage_options)
    else:
        url = storage.normalise(url)
    with storage.netcdf_file(url, profile=access.profile, whole=True, contents=contents) as ds:
        try:
            return _select(ds, url, variable)
        except CFAError:
            raise
        except (KeyError, IndexError, ValueError, TypeError, RuntimeError) as exc:
            raise CFAFormatError(f"malformed aggregation file ({type(exc).__name__}: {exc})", file=url,
                                 variable=variable) from exc


def from_cfa(
    url: str,
    variable: str | None = None,
    *,
    chunks: Any = "fragments",
    mask: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    allowed_locations: Iterable[str] | None = None,
    missing: str = "raise",
    chunk_index: bool | str | None = None,
    version: str | datetime | None = None,
) -> da.Array:
    """Open an aggregated variable of a CFA-netCDF file as a dask array.

    Only the aggregation file is read now; fragments are read when computed,
    and only the parts a computation needs. ``chunks="fragments"`` gives one
    chunk per fragment (a fragment that is a reference set: one per chunk of
    its own Zarr chunk grid, whole multiples beyond 100,000 chunks); a byte size such as ``"256MiB"`` (or ``"auto"``)
    merges neighbouring fragments up to that size; any other value is passed
    to dask. ``mask`` returns masked arrays like netCDF4-python (``False``:
    fill values stay in the data). ``storage_options`` are fsspec/s3fs options
    (flat, or keyed by protocol); they never enter the task graph.
    ``allowed_locations`` replaces the safe-URI policy's default (see
    :mod:`daskcfa.storage.policy`; ``"default"`` stands for the default rule).
    ``missing="fill"`` reads a fragment that is absent or unreadable (file
    missing, not netCDF, truncated or corrupt, wrong shape or type) as missing
    data, with a :class:`~daskcfa.CFAWarning` naming it (on ``distributed``
    the warning is issued on the worker); the default ``"raise"`` raises the
    fragment's :class:`~daskcfa.FragmentError`. Storage outages, refused
    credentials, unconvertible units and unsafe URIs always raise.

    ``chunk_index``: with the chunk index that :func:`daskcfa.index` writes
    beside the aggregation file, HDF5 fragments are read by byte range with no
    HDF5 metadata (a point is one ranged read per fragment); a fragment changed
    since it was indexed is read without it, with a :class:`~daskcfa.CFAWarning`.
    ``"auto"`` uses the index when there is one (an unusable one is left out
    with a warning), True requires it, False ignores it; None takes dask config
    ``daskcfa.io.chunk-index`` (default ``"auto"``).

    ``version``: read an earlier version of the dataset (see :func:`daskcfa.history`): its id, or
    a time (a datetime, naive meaning UTC, or an ISO 8601 string): the version current then. Its
    fragments must still be kept (``daskcfa.write.keep-versions``); an unknown or pruned version
    is a :class:`~daskcfa.VersionNotFoundError`. The chunk index, which describes the current
    version, is not used.
    """
    url, access = open_aggregation(url, storage_options, allowed_locations, missing)
    contents = earlier(url, version, access.profile)
    aggregation = read_aggregation(url, variable, access=access, contents=contents)
    access = indexed(url, access, False if contents is not None else chunk_index)
    return to_dask(aggregation, chunks=chunks, mask=mask, access=access, batched=True)


def open_cfa(url: str, *, storage_options: Mapping[str, Any] | None = None,
             allowed_locations: Iterable[str] | None = None, missing: str = "raise",
             chunk_index: bool | str | None = None, version: str | datetime | None = None) -> Dataset:
    """Open a whole aggregation file: dimensions, groups, attributes and every variable.

    ``storage_options``, ``allowed_locations`` and ``missing`` (``"raise"`` or
    ``"fill"``: absent or unreadable fragments read as missing data, with a
    :class:`~daskcfa.CFAWarning`) and ``chunk_index`` apply to every aggregated
    variable, as in :func:`from_cfa`; so does ``version`` (an earlier version of the dataset).
    """
    url, access = open_aggregation(url, storage_options, allowed_locations, missing)
    contents = earlier(url, version, access.profile)
    return Dataset.open(url, access=access, chunk_index=False if contents is not None else chunk_index,
                        contents=contents)


def earlier(url: str, version: str | datetime | None, profile: storage.ProfileRef) -> bytes | None:
    """The aggregation file of the ``version`` of ``url`` that ``from_cfa``/``open_cfa`` read (None: the current)."""
    if version is None:
        return None
    found = history.find(url, version, history.chain(url, profile))
    return history.payload(url, found, profile)


def to_cfa(
    data: Any,
    url: str,
    *,
    variable: str | None = None,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    coords: Mapping[str, Any] | None = None,
    fragment_shape: Sequence[int] | Mapping[str, int] | None = None,
    max_fragment_size: int | str | None = None,
    format: str | None = None,
    fragment_format: str = DEFAULT_FRAGMENT_FORMAT,
    compression: str | Mapping[str, Any] | None = None,
    fragment_name: str = DEFAULT_FRAGMENT_NAME,
    storage_options: Mapping[str, Any] | None = None,
    mode: str = "w-",
    compute: bool = True,
    region: Mapping[str, slice] | None = None,
    append_dim: str | None = None,
    max_concurrent_uploads: int | None = None,
    keep_previous: float = 0.0,
    uris: str = DEFAULT_URIS,
    chunk_index: bool = False,
) -> str | Delayed:
    """Write an array or a dataset as a CFA-netCDF aggregation (fragment files plus an aggregation file),
    or grow or update one.

    Every fragment is written by its own task, where the data are (no data
    pass through the client); the aggregation file is put in place by a final
    task once every fragment succeeded, so a failed write never leaves an
    aggregation file pointing at missing fragments. Re-running the same call
    resumes it: fragments already stored, and unchanged since (their size and
    storage version match the marker written with them), are not rewritten.
    "The same call" means the same data (the same dask graph: numpy data and
    dask's own tokens are deterministic) and the same settings.

    Parameters
    ----------
    data
        A dask or numpy (masked) array of the values as they should read back
        (then ``variable`` and ``dims`` are required; ``attrs`` and ``coords``
        are optional); or a :class:`daskcfa.Dataset` from :func:`open_cfa`
        (every aggregated variable is re-fragmented, ordinary variables are
        copied: a converter between dialects and locations); or an xarray
        ``Dataset``/``DataArray`` (encoded by xarray's CF encoder, honouring
        each variable's ``encoding``: ``dtype``, ``_FillValue``, packing, time
        units; data variables with dimensions are aggregated, coordinates
        become ordinary variables).
    url
        Where the aggregation file goes: a local path or ``file://``,
        ``s3://``... URL. Fragments go beside it (see ``fragment_name``).
    variable, dims, attrs, coords
        For arrays: the variable's name, its dimension names, its attributes
        (a ``_FillValue`` is added if no fill value is given, so every tool
        sees masked points as missing; packing attributes are refused: write
        an xarray object to store packed values) and 1-D coordinates by
        dimension name: values, or ``(values, attrs)``. Coordinates are stored
        in the aggregation file and, sliced, in every fragment; their ``axis``
        attributes guide the fragment plan. With ``mode="r+"``, ``variable``
        chooses the variable to update.
    fragment_shape, max_fragment_size
        The fragment plan, from :func:`plan_fragments`: an exact fragment
        shape (a size per dimension, or a mapping dimension -> size), else
        fragments of at most ``max_fragment_size`` bytes (default 50 MB) split
        the balanced S3netCDF4 way. Dask chunks not aligned with the plan are
        rechunked to it; chunks finer than the fragments but aligned are kept.
        With neither given, a :class:`daskcfa.Dataset` (an aggregation:
        ``to_cfa(open_cfa(src), out, format="CFA-0.4")`` converts it) keeps
        each variable's own fragment grid.
    format
        The aggregation dialect: ``"CF-1.13"`` (default for new files),
        ``"CFA-0.6.2"``, ``"CFA-0.5"`` or ``"CFA-0.4"``; ``r+`` and ``a``
        keep the file's own dialect unless it is given. Checked with the
        whole aggregation before any fragment is written.
    fragment_format, compression
        netCDF format of the fragments (``"NETCDF4"``, ``"NETCDF4_CLASSIC"``,
        ``"NETCDF3_CLASSIC"``, ``"NETCDF3_64BIT_OFFSET"``,
        ``"NETCDF3_64BIT_DATA"``) and their compression: ``None``, a
        netCDF4-python compression name such as ``"zlib"`` (its defaults), or
        ``createVariable`` keywords such as ``{"zlib": True, "complevel": 1,
        "shuffle": True}`` (netCDF-4 formats only). ``"zarr"`` writes each
        fragment as a Zarr v2 store readable by xarray and netCDF-C's NCZarr
        (CF-1.13 only; numbers only; ``compression`` zlib with ``complevel``,
        ``shuffle``, ``chunksizes``), named ``….zarr``.
    fragment_name
        Template of the fragment URIs, relative to the aggregation file:
        ``{stem}`` is the aggregation file's name without extension, ``{var}``
        the variable's path with groups joined by dots, ``{index}`` the
        fragment index joined by dots (``0.1.0``). The default is
        S3netCDF4's layout: ``a7.nc`` -> ``a7/a7.tas.0.1.0.nc``. The
        aggregation file stores these relative references (see ``uris``).
    storage_options
        fsspec/s3fs options, flat or keyed by protocol. They never enter the
        task graph: tasks carry an opaque reference, resolved by each worker.
    mode
        ``"w-"`` (default) fails if the aggregation file exists, before
        anything is written. ``"w"`` overwrites it: the new fragments go to a
        new generation, the aggregation file is replaced in one step, then
        the fragments of the old aggregation that the new one does not
        reference are deleted (see ``keep_previous``).
        ``"r+"`` updates an existing aggregation: ``data`` (an array) are
        written to ``region`` of one of its variables, on its existing
        fragment grid. ``"a"`` grows one, as ``xarray.Dataset.to_zarr`` does:
        with ``append_dim``, ``data`` are appended along that dimension;
        without it, ``data`` are new variables (their names must not exist,
        their dimensions must have the file's sizes). On a target that does
        not exist, ``"a"`` creates it. Writers of one target are exclusive (a
        lease, see Notes): a second ``w-``/``w`` writer fails at once with a
        :class:`WriteConflictError` naming the holder; a second ``r+``/``a``
        writer waits for the first (dask config ``daskcfa.write.lease-wait``,
        default 600 s) and then updates what the first committed.
    compute
        ``False`` returns a :class:`dask.delayed.Delayed` that performs the
        write when computed, like :func:`dask.array.to_zarr`.
    region
        ``{dim: slice}``: ``data`` cover only this part of the aggregated
        array, and only the fragments there are written. Slices have step 1
        and lie within the dimension (negative bounds count from its end).
        With ``mode="r+"`` the full array is the existing aggregation's, and
        a fragment the region covers only partly is rewritten with its stored
        values outside the region (fill values kept as they were) and
        ``data`` inside. With ``"w"``/``"w-"`` slices must fall on fragment
        boundaries, each dimension in ``region`` takes its full size from
        ``coords``, and the fragments outside the region are recorded as
        missing (they read as fill values: sparse writes, as in S3netCDF4).
        Missing fragments need a dialect that can describe them
        (``CFA-0.6.2``, ``CFA-0.5``, ``CFA-0.4``; not CF-1.13). Only for
        arrays.
    append_dim
        With ``mode="a"``: the dimension to append ``data`` along. New
        fragments hold the new part only (the existing ones are referenced
        unchanged), with the existing fragments' shape (along ``append_dim``
        the first fragment's length, or ``fragment_shape``'s); the ordinary
        variables along it (coordinate, bounds) are extended in the
        aggregation file. Every variable along ``append_dim`` must be given
        (for an array: the ordinary ones in ``coords``, by name), with the
        file's dimensions, a dtype its variable can take and the same
        ``units``, ``calendar``, fill and packing attributes where given; new
        values are stored in the file's encoding. Variables without
        ``append_dim`` are kept as stored.
    max_concurrent_uploads
        With a ``distributed`` client: at most this many fragment uploads run
        at once across the cluster (a ``distributed.Semaphore``), to spare a
        shared object store. Local writes are not limited.
    keep_previous
        Seconds to keep the fragments that leave with this commit (those of
        versions beyond ``daskcfa.write.keep-versions``, see
        :func:`daskcfa.history`) for readers still reading them; the first
        write committed after that deletes them. Default 0: deleted before the
        call returns, and a reader still reading such a version then gets a
        :class:`MissingFragmentError` saying that the dataset was replaced.
        Every write is recorded as a version; the newest
        ``daskcfa.write.keep-versions`` (default 5) keep their fragments.
    uris
        ``"relative"`` (default): the aggregation file refers to its fragments
        relative to itself, so the archive can be moved as a whole.
        ``"absolute"``: absolute URIs (``file:///...``, ``s3://...``), for
        archives that older tools must read from anywhere: cfdm, CFAPyX and
        S3netCDF4 resolve relative references against their working
        directory, so they read relative ones only from the archive's
        directory.

    chunk_index
        ``True``: once the aggregation is committed, write its chunk index
        beside it (:func:`daskcfa.index`), so that reads need no HDF5
        metadata (a point series is one ranged read per fragment). Needs
        ``compute=True``.

    Returns
    -------
    str or Delayed
        The aggregation file's URL (normalised), or the delayed write.

    Notes
    -----
    Next to the fragments, ``<stem>/.daskcfa/`` holds one small marker per
    fragment written (what makes resuming possible without reading fragments
    back) and ``manifest.json``, written at commit, listing every fragment
    with its size and CRC-32 checksum (of each object, for a Zarr store),
    which ``daskcfa.verify_fixity`` (``daskcfa verify --fixity``) checks. Fragments go to a *generation* directory
    named after what they hold (``t.nc`` -> ``t/g-<16 hex>/t.tas.0.0.nc``), so
    a write never touches the fragments of the committed aggregation; a
    lease object ``.t.nc.lease`` beside the aggregation file keeps other
    writers out while the write runs (stale leases of killed writers are
    taken over). See :mod:`daskcfa.storage.lease`. Failures while writing a fragment raise a
    :class:`CFAError` naming the fragment; errors raised while computing the
    input data are the input's own.
    """
    config.check()
    check_mode(mode)
    check_chunk_index(chunk_index, compute)
    if append_dim is not None and mode != "a":
        raise ArgumentError(f"append_dim= appends to an existing aggregation: it needs mode='a', not {mode!r}")
    target = WriteTarget.open(url, storage_options, mode,
                              hint="use mode='w' to overwrite it, mode='r+' to update it or mode='a' to grow it")
    url, profile = target.url, target.profile
    if mode == "a" and not target.exists:
        mode = "w-"  # growing nothing: a new aggregation (a writer creating it meanwhile wins, and this one fails)
    if mode == "r+" and (isinstance(data, Dataset) or is_xarray(data)):
        raise ArgumentError("mode='r+' writes an array into an existing aggregation")
    # read, modify and write under one lease: concurrent updates queue up
    lease = target.lease(acquire=mode in UPDATE_MODES and compute)

    def write() -> Any:  # (under the lease: what it reads is what the commit finds unchanged)
        existing = version = None
        if mode in UPDATE_MODES:
            version = storage.stat(url, profile)  # before reading: a change after it is caught at commit
            existing = Dataset.open(url, access=target.access, chunk_index=None)
        request = inputs.write_request(data, mode, existing, url, version, variable=variable, dims=dims, attrs=attrs,
                                       coords=coords, region=region, append_dim=append_dim,
                                       fragment_shape=fragment_shape)
        dialect = format
        if dialect is None and existing is not None:
            dialect = common_format(request.model.aggregated + [s.existing for s in request.sources
                                                                if s.existing is not None], url, "update it")
        delayed = write_graph(
            request, url, fragment_shape=fragment_shape, max_fragment_size=max_fragment_size,
            format=dialect or DEFAULT_FORMAT, fragment_format=fragment_format, compression=compression,
            fragment_name=fragment_name, mode=mode, profile=profile,
            semaphore=_upload_semaphore(max_concurrent_uploads, url), lease=lease, hold=compute,
            keep_previous=keep_previous, uris=uris,
            change=Change.of("to_cfa", mode=mode, variable=variable, dims=dims, append_dim=append_dim,
                             region=region, format=dialect or DEFAULT_FORMAT, fragment_format=fragment_format,
                             fragment_name=fragment_name, uris=uris),
        )
        return delayed.compute() if compute else delayed

    if not compute:
        return write()
    return run_write(write, lease, partial(index, storage_options=storage_options) if chunk_index else None)


def _upload_semaphore(limit: int | None, url: str) -> Any:
    """A cluster-wide ``distributed.Semaphore`` bounding concurrent uploads (None: no bound)."""
    if limit is None:
        return None
    if int(limit) < 1:
        raise ArgumentError(f"max_concurrent_uploads must be at least 1, got {limit!r}")
    from distributed import Semaphore, default_client

    try:
        default_client()
    except ValueError:
        raise ArgumentError("max_concurrent_uploads needs a distributed client (other schedulers are already bounded "
                         "by their number of workers)") from None
    return Semaphore(max_leases=int(limit), name=f"daskcfa-uploads-{dask.base.tokenize(url)}")

