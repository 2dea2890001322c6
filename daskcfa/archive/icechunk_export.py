"""An aggregation as virtual chunk references in an Icechunk repository: :func:`to_icechunk`.

Icechunk (a transactional Zarr v3 store with commits, branches and time
travel) holds *virtual* chunks: references ``(url, offset, length)`` into
other files, which is what an aggregation's fragments are. The references
are daskcfa's own (:func:`~.references.build_references`, the one source
:func:`daskcfa.to_references` uses too: the same checks of chunk grids,
codecs, fill values and fragment encodings), translated from Zarr v2 to v3
here; ordinary variables (coordinates, bounds) are written as real data.

A variable the references cannot present exactly (per-fragment fill values
or packing, uneven fragments, strings, converted units) is refused, naming
the variable, fragments and reasons, or with ``fallback="copy"`` its values
are read through daskcfa (decoded as :func:`daskcfa.from_cfa` decodes them)
and written into the repository as real chunks: never a virtual array that
reads differently from the aggregation.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
from pathlib import PurePosixPath
from typing import Any, Iterable, Mapping, Sequence

import netCDF4
import numpy as np

from .. import storage
from ..choices import ICECHUNK_FALLBACKS
from ..errors import ArgumentError, CFAError, ReferencesError, WriteConflictError, redact
from ..formats.netcdf import INSTRUCTION_ATTRS
from ..model import AggregatedVariable
from ..storage import history
from ..storage.access import open_aggregation
from ..storage.profiles import resolve_options
from .references import References, build_references, json_attrs, xarray_fill_value, zarr_fill_value

__all__ = ["to_icechunk"]

#: attributes that describe stored (encoded) values: dropped from a variable copied as decoded values
_ENCODING_ATTRS = ("_FillValue", "missing_value", "scale_factor", "add_offset", "valid_min", "valid_max",
                   "valid_range", "_Unsigned")


def to_icechunk(url: str, repo_or_session: Any, variable: str | Sequence[str] | None = None, *,
                branch: str = "main", message: str | None = None, fallback: str = "raise",
                storage_options: Mapping[str, Any] | None = None,
                allowed_locations: Iterable[str] | None = None, versions: bool = False) -> str:
    """Write the aggregation at ``url`` into an Icechunk repository as virtual chunk references, and commit.

    ``repo_or_session``: an ``icechunk.Repository`` or the local directory
    of one (created if absent; a writable session of
    ``branch`` is made; virtual chunk containers it lacks for the fragments'
    locations are added to its configuration and saved: ``file://`` ones for
    local fragments, ``s3://bucket/`` ones with the endpoint and region of
    ``storage_options``, never credentials) or a writable
    ``icechunk.Session`` (whose repository must have those containers). One
    commit per call, its message naming the source (or ``message``); returns
    the snapshot id. Readers open the repository with
    ``authorize_virtual_chunk_access`` for those containers, then
    ``xarray.open_zarr(session.store)``: no daskcfa needed.

    Aggregated variables (or those named by ``variable``) become Zarr v3
    arrays whose chunks are the fragments' own HDF5 chunks (Zarr fragments'
    chunk objects); ordinary variables and attributes are written as data.
    A variable that cannot be presented exactly by reference raises
    :class:`~daskcfa.ReferencesError` naming it, its fragments and why
    (nothing is committed); ``fallback="copy"`` writes its values instead,
    read and decoded through daskcfa (masked elements as ``_FillValue``:
    NaN for floats), on the threaded scheduler of this process.

    ``versions=True``: one commit per kept version of the dataset
    (:func:`daskcfa.history`), oldest first, each message naming the version,
    its operation and time (a dataset with no history: its current state);
    returns the last snapshot id. It needs a repository (each commit is made
    in a session of its own), not a session.
    """
    ic = _icechunk()
    if fallback not in ICECHUNK_FALLBACKS:
        raise ArgumentError(f"fallback must be one of {', '.join(map(repr, ICECHUNK_FALLBACKS))}, got {fallback!r}")
    if not versions:
        return _commit(ic, url, repo_or_session, variable, branch, message, fallback, storage_options,
                       allowed_locations, None)
    if isinstance(repo_or_session, ic.Session):
        raise ArgumentError("versions=True makes one commit per version, each in a session of its own: "
                            "give the repository (or its directory), not a session")
    url, access = open_aggregation(url, storage_options, allowed_locations)
    kept = list(reversed(history.chain(url, access.profile))) or [None]
    repository = repo_or_session if isinstance(repo_or_session, ic.Repository) else _local_repository(
        ic, repo_or_session)
    snapshot = ""
    for version in kept:
        text = message if version is None else (
            (message + ": " if message else "") + f"daskcfa version {version.id} ({version.operation}, "
            f"{version.time.isoformat()}) of {redact(url)}")
        snapshot = _commit(ic, url, repository, variable, branch, text, fallback, storage_options,
                           allowed_locations, version)
    return snapshot


def _commit(ic: Any, url: str, repo_or_session: Any, variable: str | Sequence[str] | None, branch: str,
            message: str | None, fallback: str, storage_options: Mapping[str, Any] | None,
            allowed_locations: Iterable[str] | None, version: history.Version | None) -> str:
    """One export of ``url`` (its ``version``, or its current state) into a session, committed."""
    built = build_references(url, variable, storage_options, allowed_locations, inline=True, version=version)
    if built.refused and fallback == "raise":
        raise built.refusal("fallback='copy' writes their values into the repository as data; ")
    locations = {key: _location(value[0]) for key, value in built.references.items() if isinstance(value, tuple)}
    session = _writable_session(ic, repo_or_session, branch, sorted(set(locations.values())), built)
    store = session.store
    refused = [av for av in built.chosen if av.name in built.refused]
    try:
        _write_references(ic, store, built.references, locations)
        for av in refused:
            _copy_variable(store, url, av, storage_options, allowed_locations, version)
    except CFAError:
        raise
    except Exception as exc:  # (icechunk, zarr: whatever they raise on what they refuse)
        raise ReferencesError(redact(f"Icechunk refused the export: {type(exc).__name__}: {exc}")[:2000],
                              file=built.url) from None
    text = message or f"daskcfa.to_icechunk of {redact(built.url)}" + (
        f" ({len(refused)} variable(s) copied as data: {', '.join(av.name for av in refused)})" if refused else "")
    try:
        return str(session.commit(text))
    except ic.ConflictError as exc:
        raise WriteConflictError(f"branch {branch!r} of the Icechunk repository moved since the session began "
                                 f"(another commit): nothing was committed ({redact(str(exc))[:500]})",
                                 file=built.url) from None


def _icechunk() -> Any:
    try:
        import icechunk
        import zarr  # noqa: F401
    except ImportError as exc:
        raise ArgumentError(f"to_icechunk needs icechunk and zarr-python (pip install 'daskcfa[icechunk]'): {exc}"
                            ) from None
    return icechunk


# -- the repository's virtual chunk containers ----------------------------------------------------


def _location(uri: str) -> str:
    """A reference's target as Icechunk names it: a local path as a ``file://`` URL."""
    return PurePosixPath(storage.local_path(uri)).as_uri() if storage.is_local(uri) else uri


def _container_prefix(location: str) -> str:
    """The container a location needs: its directory (``file://``), its bucket (``s3://``) or its origin."""
    scheme, _, rest = location.partition("://")
    if scheme == "file":
        return f"file://{posixpath.dirname(rest)}/"
    return f"{scheme}://{rest.split('/', 1)[0]}/"


def _writable_session(ic: Any, repo_or_session: Any, branch: str, locations: list[str], built: References) -> Any:
    """A writable session whose repository has a container for every location (added to a Repository's
    saved configuration when missing)."""
    if isinstance(repo_or_session, ic.Session):
        if repo_or_session.read_only:
            raise ArgumentError("the Icechunk session is read-only: give a writable session (or the Repository)")
        missing = _missing_containers(repo_or_session.config, locations)
        if missing:
            raise ArgumentError(
                f"the Icechunk repository has no virtual chunk container for {', '.join(map(redact, missing))}: "
                "give the Repository (to_icechunk adds them) or add them to its configuration "
                "(RepositoryConfig.set_virtual_chunk_container, then Repository.save_config)")
        return repo_or_session
    if isinstance(repo_or_session, (str, PurePosixPath)) or hasattr(repo_or_session, "__fspath__"):
        repo_or_session = _local_repository(ic, repo_or_session)
    if not isinstance(repo_or_session, ic.Repository):
        raise ArgumentError(f"repo_or_session must be an icechunk Repository or Session, got "
                            f"{type(repo_or_session).__name__}")
    repo = repo_or_session
    saved = ic.Repository.fetch_config(repo.storage)
    config = repo.config if saved is None else saved
    missing = _missing_containers(config, locations)
    if missing:
        for prefix in missing:
            config.set_virtual_chunk_container(ic.VirtualChunkContainer(prefix, _object_store(ic, prefix, built)))
        # opened anew: a Repository object older than the saved configuration (an earlier export's) cannot save
        repo = ic.Repository.open(repo.storage, config=config) if saved is not None else repo.reopen(config=config)
        repo.save_config()
    return repo.writable_session(branch)


def _local_repository(ic: Any, path: Any) -> Any:
    """The Icechunk repository in the local directory ``path``, created when the directory does not exist (or
    is empty); anything else there is an :class:`ArgumentError`, never touched."""
    path = storage.to_local_path(str(path)) if storage.is_local(str(path)) else None
    if path is None:
        raise ArgumentError("an Icechunk repository given by name must be a local directory (give an "
                            "icechunk.Repository for one on object storage)")
    if os.path.lexists(path) and not os.path.isdir(path):  # (Icechunk panics: a BaseException, not an error)
        raise ArgumentError("an Icechunk repository is a directory, and this is not one", file=path)
    try:
        return ic.Repository.open_or_create(ic.local_filesystem_storage(path))
    except ic.IcechunkError as exc:  # (a directory holding other files: Icechunk's "clean prefixes")
        said = next((line.strip(" x|") for line in str(exc).splitlines() if line.strip(" x|")), "")
        raise ArgumentError(f"no Icechunk repository in this directory, and none can be created there ({said})",
                            file=path) from None


def _missing_containers(config: Any, locations: list[str]) -> list[str]:
    prefixes = list((config.virtual_chunk_containers or {}) if config is not None else {})
    return sorted({_container_prefix(loc) for loc in locations if not any(loc.startswith(p) for p in prefixes)})


def _object_store(ic: Any, prefix: str, built: References) -> Any:
    """The store configuration of a new container: no credentials (readers authorise containers themselves)."""
    scheme = prefix.partition("://")[0]
    if scheme == "file":
        return ic.local_filesystem_store(prefix[len("file://"):])
    if scheme == "s3":
        options = resolve_options(prefix, built.access.profile)[1]
        endpoint = (options.get("client_kwargs") or {}).get("endpoint_url") or options.get("endpoint_url")
        region = (options.get("client_kwargs") or {}).get("region_name") or options.get("region_name") or (
            "us-east-1" if endpoint else None)  # (an S3-compatible server's: Icechunk needs one)
        plain_http = bool(endpoint and endpoint.startswith("http://"))
        return ic.s3_store(region=region, endpoint_url=endpoint, allow_http=plain_http, s3_compatible=bool(endpoint),
                           force_path_style=bool(endpoint))
    if scheme in ("http", "https"):
        return ic.http_store()
    raise ReferencesError(f"fragments at {redact(prefix)}: Icechunk has no virtual chunk container for "
                          f"{scheme!r} locations", file=built.url)


# -- Zarr v2 references -> Zarr v3 arrays -----------------------------------------------------------


def _write_references(ic: Any, store: Any, references: Mapping[str, Any], locations: Mapping[str, str]) -> None:
    """Groups, arrays, inline chunks as data and every other chunk as a virtual reference."""
    import zarr

    for key in sorted(k for k in references if k.rsplit("/", 1)[-1] == ".zgroup"):
        path = key.rpartition("/")[0]
        attrs = json.loads(references.get(_sibling(key, ".zattrs"), "{}"))
        zarr.open_group(store, path=path, mode="a", zarr_format=3).attrs.update(attrs)
    chunks_of: dict[str, list[tuple[str, Any]]] = {}
    for key, value in references.items():
        path, _, name = key.rpartition("/")
        if not name.startswith(".z"):
            chunks_of.setdefault(path, []).append((name, value))
    for key in sorted(k for k in references if k.rsplit("/", 1)[-1] == ".zarray"):
        path = key.rpartition("/")[0]
        zarray = json.loads(references[key])
        attrs = json.loads(references.get(_sibling(key, ".zattrs"), "{}"))
        _write_array(ic, store, path, zarray, attrs, chunks_of.get(path, []), locations)


def _sibling(key: str, name: str) -> str:
    return key.rpartition("/")[0] + "/" + name if "/" in key else name


def _write_array(ic: Any, store: Any, path: str, zarray: Mapping[str, Any], attrs: dict[str, Any],
                 chunks: list[tuple[str, Any]], locations: Mapping[str, str]) -> None:
    import zarr

    dtype = np.dtype(zarray["dtype"])
    shape = tuple(zarray["shape"])
    dims = attrs.pop("_ARRAY_DIMENSIONS", None)
    fill = zarr_fill_value(zarray.get("fill_value"), dtype)
    if fill is not None:  # (xarray reads a Zarr v3 array's missing value from _FillValue, as it writes it)
        attrs["_FillValue"] = xarray_fill_value(fill, dtype)
    inline = [(name, value) for name, value in chunks if isinstance(value, bytes)]
    if inline:  # an ordinary variable: one chunk of its values, as stored
        values = np.frombuffer(inline[0][1], dtype).reshape(shape) if shape else np.frombuffer(inline[0][1], dtype)[0]
        data = np.asarray(values)
        if data.dtype.kind == "U":
            data = data.astype(object)
        array = zarr.create_array(store, name=path, shape=shape, chunks=shape or None, dtype=str if
                                  data.dtype.kind == "O" else dtype.newbyteorder("="),
                                  fill_value=None if data.dtype.kind == "O" else fill, compressors=None,
                                  attributes=attrs, dimension_names=dims, zarr_format=3, overwrite=True)
        array[...] = data
        return
    codecs = [*(zarray.get("filters") or []), *([zarray["compressor"]] if zarray.get("compressor") else [])]
    endian = "big" if dtype.byteorder == ">" else "little"
    zarr.create_array(store, name=path, shape=shape, chunks=tuple(zarray["chunks"]), dtype=dtype.newbyteorder("="),
                      serializer=zarr.codecs.BytesCodec(endian=endian), filters=None,
                      compressors=[_v3_codec(c) for c in codecs], fill_value=0 if fill is None else fill,
                      attributes=attrs, dimension_names=dims, zarr_format=3, overwrite=True)
    specs = [ic.VirtualChunkSpec(index=[int(i) for i in name.split(".")] if shape else [],
                                 location=locations[f"{path}/{name}"], offset=int(value[1]), length=int(value[2]))
             for name, value in chunks]
    failed = store.set_virtual_refs(path, specs, validate_containers=True)
    if failed:
        raise ReferencesError(f"Icechunk refused {len(failed)} chunk reference(s) of {path!r} (the first at "
                              f"{failed[0]})")


def _v3_codec(config: Mapping[str, Any]) -> Any:
    """A numcodecs codec of a Zarr v2 array as the Zarr v3 codec zarr-python decodes it with (``numcodecs.*``)."""
    import zarr.codecs.numcodecs as v3

    known = {"zlib": v3.Zlib, "gzip": v3.GZip, "shuffle": v3.Shuffle, "fletcher32": v3.Fletcher32, "zstd": v3.Zstd,
             "bz2": v3.BZ2, "blosc": v3.Blosc, "lz4": v3.LZ4, "lzma": v3.LZMA, "delta": v3.Delta}
    settings = {k: v for k, v in config.items() if k != "id"}
    if config.get("id") not in known:
        raise ReferencesError(f"codec {config.get('id')!r} has no Zarr v3 form here")
    return known[config["id"]](**settings)


# -- a variable copied as data ----------------------------------------------------------------------


def _copy_variable(store: Any, url: str, av: AggregatedVariable, storage_options: Mapping[str, Any] | None,
                   allowed_locations: Iterable[str] | None, version: history.Version | None) -> None:
    """The variable's values as :func:`daskcfa.from_cfa` reads them, written chunk by chunk (the threaded
    scheduler: the session is this process's) on a regular grid of its first dask chunk's shape."""
    import zarr

    from ..api import from_cfa
    from ..lazy import dask_array as da

    array = from_cfa(url, av.name, storage_options=storage_options, allowed_locations=allowed_locations,
                     version=None if version is None else version.id)
    regular = tuple(max(c[0], 1) if c else 1 for c in array.chunks)
    array = array.rechunk(regular)
    text = array.dtype.kind in "OUS"
    attrs = {k: v for k, v in av.attrs.items() if k not in INSTRUCTION_ATTRS and k not in _ENCODING_ATTRS}
    attrs = json_attrs(attrs)
    if text:
        fill: Any = ""
    else:
        fill = np.nan if array.dtype.kind == "f" else np.asarray(
            av.attrs.get("_FillValue", netCDF4.default_fillvals.get(array.dtype.str[1:], 0))).astype(array.dtype)[()]
        attrs["_FillValue"] = xarray_fill_value(fill, array.dtype)
    target = zarr.create_array(store, name=av.name.strip("/"), shape=array.shape, chunks=regular or None,
                               dtype=str if text else array.dtype, fill_value=None if text else fill,
                               attributes=attrs, dimension_names=[d.rsplit("/", 1)[-1] for d in av.dims],
                               zarr_format=3, overwrite=True)
    filled = array.map_blocks(_filled, fill, av.name, url, dtype=object if text else array.dtype,
                              meta=np.empty((0,) * array.ndim, object if text else array.dtype))
    da.store(filled, target, lock=False, compute=True, scheduler="threads")


def _filled(block: Any, fill: Any, name: str, url: str) -> np.ndarray:
    """A block's masked elements as ``fill``; a value equal to ``fill`` that is not masked would read
    as missing: refused."""
    mask = np.ma.getmaskarray(block)
    values = np.ma.getdata(block)
    if values.dtype.kind in "US":
        values = values.astype(object)
    clash = (values == fill) & ~mask if not (isinstance(fill, float) and math.isnan(fill)) else np.zeros_like(mask)
    if values.dtype.kind != "O" and clash.any():
        raise ReferencesError(f"a value equal to the fill value {fill} is not missing: it would read as missing",
                              file=url, variable=name)
    out = np.array(values, copy=True)
    out[mask] = fill
    return out

