"""What every fragment of a variable shares, and what the fragments are called.

The :class:`~daskcfa.fragments.write.FragmentSpec` of a variable (its
encoding, the ordinary variables sliced into each fragment, the fragment
file format's limits), the names fragments get from the ``fragment_name``
template, and the fragment columns of the aggregation variable once they
are written. Shared by the write graph (:mod:`daskcfa.graph.write`) and
``daskcfa.Dataset``'s aggregation writer, which builds no graph.
"""

from __future__ import annotations

import posixpath
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from .. import storage
from ..choices import ZARR_FRAGMENTS
from ..decode import PACKING_ATTRS, STORAGE_ATTRS, Encoding, default_fill_value
from ..errors import ArgumentError, CFAFormatError
from ..formats.capabilities import can, dialects_that, listed
from ..formats.encode import fragment_conventions
from ..fragments.write import COMPRESSION_KEYS, FragmentSpec, SlicedVariable
from ..fragments.zarr import check_zarr_compression
from ..model import AggregationDataset, Dimension, FragmentGrid, Fragments, PlainVariable
from .request import WriteSource

__all__ = ["DEFAULT_FRAGMENT_NAME", "check_fragment_dtype", "fragment_spec", "fragment_name", "check_template", "named_for", "check_apart",
           "compression_keywords", "settle_unlimited", "fragment_columns", "dimension_size"]


#: Fragments' names: S3netCDF4's layout (``.zarr`` instead of ``.nc`` for Zarr fragments).
DEFAULT_FRAGMENT_NAME = "{stem}/{stem}.{var}.{index}.nc"


def check_fragment_dtype(name: str, dtype: np.dtype, file_format: str) -> None:
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


def fragment_spec(source: WriteSource, model: AggregationDataset, url: str, *, format: str, fragment_format: str,
                  compression: dict[str, Any], profile: storage.ProfileRef
                  ) -> tuple[FragmentSpec, list[tuple[SlicedVariable, np.ndarray]], np.dtype, dict[str, Any]]:
    """What every fragment of ``source`` shares (its :class:`FragmentSpec`), the ordinary variables
    sliced into each with their values, and the aggregation variable's dtype and attributes."""
    sliced, extra_dims = _sliced_variables(model, source)
    for name, dt in [(source.name, source.dtype), *((v.name, v.dtype) for v, _ in sliced)]:
        check_fragment_dtype(name, dt, fragment_format)
    dtype, attrs, fragment_attrs = _encodings(source)
    global_attrs = {**model.attrs, "Conventions": fragment_conventions(model.attrs.get("Conventions"))}
    spec = FragmentSpec(
        variable=source.name, identifier=source.basename, dims=source.dims, dtype=source.dtype, attrs=fragment_attrs,
        global_attrs=global_attrs, file_format=fragment_format,
        compression=compression if source.compression is None else compression_keywords(source.compression, fragment_format),
        aggregation=url, sliced=tuple(s for s, _ in sliced), extra_dims=extra_dims, profile=profile,
        group=source.group if can(format, "s3netcdf4") else "/",  # (readers of the others expect the root)
    )
    return spec, sliced, dtype, attrs


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
                extra[dim] = dimension_size(model, posixpath.dirname(var.name) or "/", dim)
        values = np.ma.filled(var.data) if np.ma.isMaskedArray(var.data) else np.asarray(var.data)
        sliced.append((SlicedVariable(base, tuple(var.dims), np.dtype(var.dtype), dict(var.attrs)), values))
    return sliced, extra


def dimension_size(model: AggregationDataset, group: str, name: str) -> int:
    """The size of dimension ``name`` as seen from ``group``; an error when none is visible there."""
    size = model.dimension_size(group, name)
    if size is None:
        raise CFAFormatError(f"dimension {name!r} is not defined in group {group!r} or above")
    return size


def fragment_name(template: str, *, stem: str, variable: str, index: tuple[int, ...]) -> str:
    """A fragment's URI reference from the ``fragment_name`` template.

    ``{var}`` is the variable's path with group names joined by dots
    (``/grp/tas`` -> ``grp.tas``, so S3netCDF4's layout puts the group after
    the stem); ``{index}`` is the fragment index joined by dots (``0`` for
    scalar data).
    """
    var = ".".join(part for part in variable.split("/") if part)
    return template.format(stem=stem, var=var, index=".".join(map(str, index)) or "0")


def check_template(template: str, nvariables: int) -> None:
    try:
        fragment_name(template, stem="s", variable="v", index=(0,))
    except (KeyError, IndexError, ValueError) as exc:
        raise ArgumentError(f"fragment_name {template!r} may only use {{stem}}, {{var}} and {{index}} ({exc})") from None
    if "{index}" not in template or (nvariables > 1 and "{var}" not in template):
        raise ArgumentError(f"fragment_name {template!r} must contain {{index}} (and {{var}} for several variables), "
                         "so that every fragment gets its own name")


def named_for(template: str, fragment_format: str, format: str) -> str:
    """The fragment name template for ``fragment_format``: Zarr stores end in ``.zarr`` (how
    readers know them), in CF-1.13 aggregations (which name fragments by URI alone)."""
    if fragment_format != ZARR_FRAGMENTS:
        return template
    if not can(format, "zarr_fragments"):
        raise ArgumentError(f"Zarr fragments are written for {listed(dialects_that('zarr_fragments'))} "
                            f"aggregations, not {format} (whose readers expect netCDF fragments)")
    if template == DEFAULT_FRAGMENT_NAME:
        return template[: -len(".nc")] + ".zarr"
    if not template.endswith(".zarr"):
        raise ArgumentError(f"fragment_name {template!r} must end in '.zarr' for Zarr fragments (how readers "
                            "recognise a store)")
    return template


def check_apart(url: str, stem: str) -> None:
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
