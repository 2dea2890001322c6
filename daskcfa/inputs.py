"""The write request of :func:`daskcfa.to_cfa`, made in one place: :func:`write_request`.

New data (an array, a :class:`daskcfa.Dataset`, an xarray object) become a
:class:`~daskcfa.write.request.WriteRequest` through the builders of
:mod:`daskcfa.write.request`, which need nothing of the read side. An update
of an existing aggregation needs it, so it is made here, in the API layer:
``mode="r+"`` (new values for a region of one variable, merged with the
stored values of the fragments it touches) and, through :mod:`daskcfa.append`,
``mode="a"`` (grown along ``append_dim``, or new variables added). Kept apart
from the graph builder, which only builds graphs from a request.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any, Mapping, Sequence

from .lazy import dask_array as da
import numpy as np

from . import append
from .dataset import OpenedDataset
from .errors import ArgumentError, VariableNotFoundError
from .fragments.write import encode_values
from .graph.read import to_dask
from .graph.write import region_bounds
from .write.request import (WriteRequest, WriteSource, as_array, dataset_model, is_xarray, request_from_array,
                            request_from_dataset, request_from_xarray, write_region)

__all__ = ["write_request", "request_for_update", "stored_values"]


def write_request(data: Any, mode: str, existing: OpenedDataset | None, url: str, version: tuple[int, str] | None, *,
                  variable: str | None = None, dims: Sequence[str] | None = None,
                  attrs: Mapping[str, Any] | None = None, coords: Mapping[str, Any] | None = None,
                  region: Mapping[str, slice] | None = None, append_dim: str | None = None,
                  fragment_shape: Any = None) -> WriteRequest:
    """What :func:`daskcfa.to_cfa` writes: ``data`` as a new aggregation (``existing`` None), or as an
    update (``mode="r+"`` or ``"a"``) of ``existing``, the aggregation read from ``url`` at ``version``."""
    if existing is None:
        return _new(data, variable, dims, attrs, coords, region)
    if mode == "r+":
        return request_for_update(existing, url, version, data, variable, region)
    _no_region(region, "mode='a'")
    if append_dim is not None:
        return append.request_for_append(existing, url, version, data, append_dim, variable=variable, dims=dims,
                                         attrs=attrs, coords=coords, fragment_shape=fragment_shape)
    return append.request_for_addition(existing, url, version, _new(data, variable, dims, attrs, coords, None))


def _new(data: Any, variable: str | None, dims: Sequence[str] | None, attrs: Mapping[str, Any] | None,
         coords: Mapping[str, Any] | None, region: Mapping[str, slice] | None) -> WriteRequest:
    """A write of ``data`` as a new aggregation (or new variables of one)."""
    if isinstance(data, OpenedDataset):
        _no_region(region, "a daskcfa.Dataset")
        return request_from_dataset(data)
    if is_xarray(data):
        _no_region(region, "an xarray object")
        return request_from_xarray(data, variable)
    return request_from_array(data, variable, dims, attrs, coords, region)


def _no_region(region: Mapping[str, slice] | None, what: str) -> None:
    if region:
        raise ArgumentError(f"region= is for writing arrays (new ones, or with mode='r+'), not {what}")


def request_for_update(existing: Any, url: str, version: tuple[int, str] | None, data: Any, variable: str | None,
                       region: Mapping[str, slice] | None) -> WriteRequest:
    """``mode="r+"``: the aggregation ``existing`` (a :class:`daskcfa.Dataset` read from ``url``
    when it had ``version``), with ``data`` going to ``region`` of one variable."""
    model, aggregated = dataset_model(existing)
    by_path = {v.path: v for v in aggregated}
    if variable is None:
        if len(by_path) != 1:
            raise VariableNotFoundError(f"choose the variable to update with variable=: {', '.join(sorted(by_path))}",
                                        file=url)
        variable = next(iter(by_path))
    path = variable if variable.startswith("/") else f"/{variable}"
    if path not in by_path:
        raise VariableNotFoundError(f"{variable!r} is not an aggregated variable of the file; aggregated variables: "
                                    f"{', '.join(sorted(by_path))}", file=url)
    target = by_path[path]
    model.aggregated = [v.aggregation for v in aggregated if v.path != path]
    source = WriteSource(path, as_array(data), tuple(target.dims), np.dtype(target.dtype), dict(target.attrs),
                         existing=target.aggregation, region=write_region(region, tuple(target.dims)))
    return WriteRequest(model, [_merged(source, target)], version)


def stored_values(var: Any) -> da.Array:
    """An aggregated variable of a :class:`daskcfa.Dataset` as stored: packed integers, fill and
    missing values, unique-valued and missing fragments as the values they stand for. What an
    update merges new values with, so that what it does not assign stays bit for bit."""
    return to_dask(var.aggregation, access=var.read_access, strings=False, decode=False)


def _merged(source: WriteSource, target: Any) -> WriteSource:
    """An update of a region that does not fall on fragment boundaries, as an update of the
    fragments it touches: their stored values, with the new values encoded in their place.

    Stored values, not decoded ones, pass through: a fill value, a packed integer or
    a missing fragment's fill is written back bit for bit as it was.
    """
    grid = source.existing.fragments.grid
    inner, outer = [], []
    for d, (dim, n) in enumerate(zip(source.dims, grid.shape)):
        a, b = region_bounds(source.region.get(dim, slice(None)), n, dim)
        inner.append((a, b))
        offsets = grid.offsets[d]
        outer.append((offsets[grid.fragment_at(d, a)], offsets[grid.fragment_at(d, b - 1) + 1]))
    shape = tuple(b - a for a, b in inner)
    if source.data.shape != shape:
        raise ArgumentError(f"{source.name}: the data have shape {source.data.shape}, the region to write has shape "
                            f"{shape}")
    if inner == outer:
        return source
    merged = stored_values(target)[tuple(slice(a, b) for a, b in outer)].copy()
    if not isinstance(source.data, da.Array):  # one chunk per fragment touched (dask sizes no strings itself)
        cuts = [[a, *(o for o in grid.offsets[d] if a < o < b), b] for d, (a, b) in enumerate(inner)]
        chunks = tuple(tuple(int(n) for n in np.diff(c)) for c in cuts)
        source = replace(source, data=da.from_array(source.data, chunks=chunks, asarray=False))
    new = source.data
    new = new.map_blocks(partial(encode_values, attrs=source.attrs, dtype=source.dtype, variable=source.name),
                         dtype=source.dtype, meta=np.empty((0,) * new.ndim, source.dtype))
    merged[tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(inner, outer))] = new
    region = {dim: slice(a, b) for dim, (a, b) in zip(source.dims, outer)}
    return replace(source, data=merged, encoded=True, region=region)
