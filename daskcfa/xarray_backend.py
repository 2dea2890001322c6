"""The xarray backend: ``xr.open_dataset(url, engine="daskcfa")``.

A thin shell over :func:`daskcfa.open_cfa`: every variable (aggregated or
not) becomes an xarray variable backed by a lazily indexed array, so
xarray's own lazy indexing reaches the fragments (a one-point time series
reads one HDF5 chunk per fragment). Values are handed over *stored* — the
variable's ``_FillValue``, packing and time units are decoded by xarray, as
for any netCDF file — except that an aggregated float variable that xarray
would only mask (no packing) is masked in the read, NaN where missing, with
the attributes and encoding xarray's own masking gives it: one comparison
with the fill value per chunk instead of a second one and a copy in xarray.
With ``chunks={}`` the dask chunks are the fragments.
Groups open with ``xr.open_datatree(url, engine="daskcfa")`` (or one group
with ``group="/grp"``).
"""

from __future__ import annotations

import warnings
from datetime import datetime
from typing import Any, Iterable, Mapping

import numpy as np
from xarray import Dataset as XrDataset
from xarray import DataTree
from xarray import Variable as XrVariable
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.core import indexing

from .api import open_cfa
from .dataset import OpenedDataset, FileVariableArray, Group, Variable
from .decode import Encoding, default_fill_value
from .arguments import check_names
from .errors import CFAError, CFAFormatError, VariableNotFoundError
from .graph.read import AggregatedArray
from .model import is_coordinate_variable
from . import xarray_accessor  # noqa: F401  (ds.cfa: registered whenever xarray loads its backends)

__all__ = ["DaskCFABackendEntrypoint", "open_dataset", "open_datatree"]


class _LazyArray(BackendArray):
    """Hands xarray's outer indexing (one vector at most) to a daskcfa array."""

    def __init__(self, array: Any) -> None:
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER_1VECTOR,
                                                  self._read)

    def _read(self, key: tuple) -> np.ndarray:
        return np.asarray(self.array[key])


def _variable(var: Variable, url: str, name: str, mask_and_scale: bool) -> XrVariable:
    attrs = dict(var.attrs)
    encoding: dict[str, Any] = {"source": url, "dtype": var.dtype}
    if var.aggregation is None:
        array = FileVariableArray(url, var.path, var.shape, var.dtype, mask=False, strings=False,
                                  profile=var.read_access.profile)  # (characters: xarray joins and decodes them)
        return XrVariable(var.dims, _lazy(array), attrs, encoding)
    # Missing fragments hold the fill value: declare it so that xarray masks them.
    if "_FillValue" not in attrs and var.dtype.kind in "iuf":
        attrs["_FillValue"] = default_fill_value(var.dtype)
    encoding["preferred_chunks"] = dict(zip(var.dims, var.aggregation.fragments.grid.sizes))
    stored = XrVariable(var.dims, _lazy(AggregatedArray(var.aggregation, decode=False, access=var.read_access)),
                        attrs, encoding)
    masked = _masked_in_read(stored, var, name) if mask_and_scale else None
    return stored if masked is None else masked


def _masked_in_read(stored: XrVariable, var: Variable, name: str) -> XrVariable | None:
    """``stored`` (an aggregated float variable) as xarray's CF masking leaves it -- its attributes
    and encoding from that masking itself --, its values masked as it masks them (NaN where stored
    values equal ``_FillValue`` or ``missing_value``) in the read instead, once per chunk. None
    where xarray's decoding does more (packing, ``_Unsigned``) or the fill values do not hold
    exactly in the variable's type (xarray then compares in another type)."""
    from xarray.coding.variables import CFMaskCoder

    if var.dtype.kind != "f" or any(a in stored.attrs for a in ("scale_factor", "add_offset", "_Unsigned")):
        return None
    # (on a copy: the coder moves the fill values out of the attributes it is given, and ``stored``
    # must keep them whenever the masking is left to xarray after all)
    trial = stored.copy(deep=False)
    with warnings.catch_warnings(record=True) as said:  # (xarray says them itself if it masks after all)
        warnings.simplefilter("always")
        masked = CFMaskCoder().decode(trial, name=name)
    fills = {k: masked.encoding[k] for k in ("_FillValue", "missing_value") if k in masked.encoding}
    values = [np.asarray(v) for value in fills.values() for v in np.ravel(value)]
    if masked is trial or masked.dtype != var.dtype or any(v.dtype.kind not in "biuf" for v in values):
        return None
    exact = {v.astype(var.dtype)[()] for v in values if not np.isnan(v)}
    if any(v.astype(var.dtype) != v for v in values if not np.isnan(v)):
        return None
    nan_where = Encoding.from_attrs(fills, var.dtype)
    if {v for v in (nan_where.fill_value, *nan_where.missing_values) if not np.isnan(v)} != exact:
        return None
    for warning in said:  # (what xarray's masking says of the variable, as when it masks it)
        warnings.warn(warning.message, warning.category, stacklevel=2)
    array = AggregatedArray(var.aggregation, decode=False, access=var.read_access, nan_where=nan_where)
    return XrVariable(masked.dims, _lazy(array), masked.attrs, masked.encoding)


def _lazy(array: Any) -> indexing.LazilyIndexedArray:
    return indexing.LazilyIndexedArray(_LazyArray(array))


def _group(ds: OpenedDataset, group: str | None) -> Group:
    """The group at ``group`` ("/grp/sub" or "grp/sub"; None or "/" for the root)."""
    if group in (None, "", "/"):
        return ds
    node = ds[group]
    if not isinstance(node, Group):
        raise VariableNotFoundError(f"group {group!r} is a variable, not a group", file=ds.url)
    return node


def _to_xarray(ds: OpenedDataset, node: Group, drop_variables: Iterable[str] | None,
               mask_and_scale: bool | Mapping[str, bool] = True) -> XrDataset:
    dropped = {drop_variables} if isinstance(drop_variables, str) else set(drop_variables or ())
    variables = {name: _variable(var, ds.url, name, _item(mask_and_scale, name))
                 for name, var in node.variables.items() if name not in dropped}
    out = XrDataset(variables, attrs=dict(node.attrs))
    return out.set_coords([n for n in variables
                           if n in node.dimensions and is_coordinate_variable(n, variables[n].dims)])


def _item(option: bool | Mapping[str, bool], name: str) -> bool:
    """A decoding option for variable ``name`` (xarray's options may map names to values)."""
    return bool(option.get(name, True)) if isinstance(option, Mapping) else bool(option)


# xarray's CF decoding options, passed through to ``xarray.conventions.decode_cf``
# (declared so that ``decode_cf=False`` reaches them).
_DECODERS = ("mask_and_scale", "decode_times", "concat_characters", "decode_coords", "use_cftime",
             "decode_timedelta")


class DaskCFABackendEntrypoint(BackendEntrypoint):
    """``engine="daskcfa"``: CFA-netCDF aggregations in every dialect, on any storage."""

    description = "Open CFA-netCDF aggregations (CF-1.13, CFA-0.4 to 0.6, NCA) with daskcfa"
    url = "https://github.com/daskcfa/daskcfa"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "group", "storage_options",
                               "allowed_locations", "missing", "version", *_DECODERS)
    supports_groups = True

    def open_dataset(self, filename_or_obj: Any, *, drop_variables: str | Iterable[str] | None = None,
                     group: str | None = None, storage_options: Mapping[str, Any] | None = None,
                     allowed_locations: Iterable[str] | None = None, missing: str = "raise",
                     version: str | datetime | None = None, **decoders: Any) -> XrDataset:
        from xarray.conventions import decode_cf

        _check_keywords(decoders, decode_cf)
        ds = open_cfa(str(filename_or_obj), storage_options=storage_options, allowed_locations=allowed_locations,
                      missing=missing, version=version)
        return _decoded(_to_xarray(ds, _group(ds, group), drop_variables, decoders.get("mask_and_scale", True)),
                        ds.url, decoders)

    def open_groups_as_dict(self, filename_or_obj: Any, *, drop_variables: str | Iterable[str] | None = None,
                            group: str | None = None, storage_options: Mapping[str, Any] | None = None,
                            allowed_locations: Iterable[str] | None = None, missing: str = "raise",
                            version: str | datetime | None = None, **decoders: Any) -> dict[str, XrDataset]:
        """Every group under ``group`` (default: the root), by path relative to it: "/", "/grp", ..."""
        from xarray.conventions import decode_cf

        _check_keywords(decoders, decode_cf)
        ds = open_cfa(str(filename_or_obj), storage_options=storage_options, allowed_locations=allowed_locations,
                      missing=missing, version=version)
        top = _group(ds, group)
        masking = decoders.get("mask_and_scale", True)
        return {_relative(node.path, top.path): _decoded(_to_xarray(ds, node, drop_variables, masking), ds.url, decoders)
                for node in top.walk()}

    def open_datatree(self, filename_or_obj: Any, **kwargs: Any) -> DataTree:
        return DataTree.from_dict(self.open_groups_as_dict(filename_or_obj, **kwargs))

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        # Aggregation files are ordinary netCDF files, and xarray (2026.9) asks its netCDF engines first
        # (``netcdf_engine_order``): netcdf4 claims every local netCDF/HDF5 file and every remote URL, so no
        # answer here would be consulted for them. Ask for engine="daskcfa".
        return False


def _decoded(obj: XrDataset, url: str, decoders: Mapping[str, Any]) -> XrDataset:
    """xarray's CF decoding of ``obj``: attributes it cannot decode (time units, a packing of many values)
    are hostile input of the aggregation file, a :class:`CFAFormatError` naming it (and, in xarray's
    words, the variable), not xarray's bare error."""
    from xarray.conventions import decode_cf

    try:
        decoded = decode_cf(obj, **decoders)
    except CFAError:
        raise
    except ValueError as exc:  # (a TypeError may be the caller's own decoding argument: left as it is)
        said = " ".join(getattr(exc, "__notes__", ())[:1]).split(" with value")[0]
        raise CFAFormatError(f"xarray cannot decode it: {type(exc).__name__}: {exc} {said}".strip(), file=url) \
            from None
    _check_lazy_decoding(obj, url, decoders)
    return decoded


def _check_lazy_decoding(obj: XrDataset, url: str, decoders: Mapping[str, Any]) -> None:
    """What xarray decodes lazily, in arrays above the backend's (packing, character encodings), tried
    on one stored zero of each variable (an ``_Encoding`` also on a byte: no codec is looked up for the
    empty text): a ``scale_factor`` of text, an ``_Encoding`` on numbers or naming no text codec was a
    bare error at load (as with engine="netcdf4"), after the open had said nothing. Times are left
    out: xarray decodes them at open, from the stored values (a zero may be out of a calendar's range)."""
    from xarray.conventions import decode_cf_variable

    lazy = {k: decoders[k] for k in ("concat_characters", "mask_and_scale", "use_cftime") if k in decoders}
    for name, variable in obj.variables.items():
        stored = XrVariable(variable.dims, np.zeros((1,) * variable.ndim, variable.dtype), variable.attrs,
                            variable.encoding)
        try:
            with warnings.catch_warnings():  # (xarray's decoding has said them once already)
                warnings.simplefilter("ignore")
                decode_cf_variable(name, stored, decode_times=False, decode_timedelta=False, **lazy).values
                if "_Encoding" in variable.attrs and lazy.get("concat_characters", True):
                    _look_up_text_codec(variable.attrs["_Encoding"])
        except Exception as exc:  # (whatever xarray's coders raise on this attribute: hostile input)
            raise CFAFormatError(f"xarray cannot decode variable {name!r}: {type(exc).__name__}: {exc}",
                                 file=url) from None


def _look_up_text_codec(name: Any) -> None:
    """Raise as ``bytes.decode`` does for a ``name`` that is no text codec (a stored zero is the empty text,
    for which no codec is looked up)."""
    try:
        b"\0".decode(name, "ignore")
    except UnicodeError:  # (a text codec, which refused the byte or the handler: idna takes only "strict")
        pass


def _check_keywords(decoders: Mapping[str, Any], decode_cf: Any) -> None:
    """A keyword neither the engine nor xarray's CF decoding takes is refused before anything is
    opened, naming the keyword and the valid ones (not the internal function it would reach)."""
    import inspect

    engine = inspect.signature(DaskCFABackendEntrypoint.open_dataset).parameters
    decoding = [n for n in inspect.signature(decode_cf).parameters if n not in ("obj", "drop_variables")]
    valid = [n for n, p in engine.items() if p.kind is p.KEYWORD_ONLY] + decoding
    check_names("xarray.open_dataset(engine='daskcfa')", decoders, valid, what="keyword")


def _relative(path: str, top: str) -> str:
    return path if top == "/" else "/" + path[len(top):].strip("/")


def open_dataset(url: str, *, chunks: Any = None, **kwargs: Any) -> XrDataset:
    """``xarray.open_dataset(url, engine="daskcfa", ...)``; ``chunks={}`` gives one dask chunk per fragment."""
    import xarray

    return xarray.open_dataset(url, engine=DaskCFABackendEntrypoint, chunks=chunks, **kwargs)


def open_datatree(url: str, *, chunks: Any = None, **kwargs: Any) -> DataTree:
    """``xarray.open_datatree(url, engine="daskcfa", ...)``: every group; ``chunks={}`` as for :func:`open_dataset`."""
    import xarray

    return xarray.open_datatree(url, engine=DaskCFABackendEntrypoint, chunks=chunks, **kwargs)
