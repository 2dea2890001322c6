"""The public entry points: ``from_cfa`` and ``open_cfa``."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import dask.array as da
import netCDF4

from . import storage
from .dataset import Dataset
from .errors import CFAError, CFAFormatError, VariableNotFoundError
from .formats import aggregated_variables, dialect_of, parse_variable
from .formats._netcdf import find_variable
from .graph.read import to_dask
from .locks import HDF5_LOCK
from .model import AggregatedVariable
from .storage.access import Access

__all__ = ["from_cfa", "open_cfa", "read_aggregation"]


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
        names = ", ".join(sorted(aggregated_variables(ds, url))) or "none"
        what = "is not an aggregated variable" if var is not None else "does not exist"
        raise VariableNotFoundError(f"variable {variable!r} {what}; aggregated variables: {names}", file=url)
    return parse_variable(var, url)


def read_aggregation(url: str, variable: str | None = None, *, storage_options: Mapping[str, Any] | None = None,
                     access: Access | None = None) -> AggregatedVariable:
    """Parse one aggregated variable of the file at ``url`` into the model (no fragment I/O)."""
    url = storage.normalise(url)
    access = access or Access.for_aggregation(url, storage_options)
    ds = storage.open_netcdf(url, profile=access.profile)
    try:
        with HDF5_LOCK:
            return _select(ds, url, variable)
    except CFAError:
        raise
    except (KeyError, IndexError, ValueError, TypeError, RuntimeError) as exc:
        raise CFAFormatError(f"malformed aggregation file ({type(exc).__name__}: {exc})", file=url, variable=variable) from exc
    finally:
        with HDF5_LOCK:
            ds.close()


def from_cfa(
    url: str,
    variable: str | None = None,
    *,
    chunks: Any = "fragments",
    mask: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    allowed_locations: Iterable[str] | None = None,
) -> da.Array:
    """Open an aggregated variable of a CFA-netCDF file as a dask array.

    Only the aggregation file is read now; fragments are read when computed,
    and only the parts a computation needs. ``chunks="fragments"`` gives one
    chunk per fragment; a byte size such as ``"256MiB"`` (or ``"auto"``)
    merges neighbouring fragments up to that size; any other value is passed
    to dask. ``mask`` returns masked arrays like netCDF4-python (``False``:
    fill values stay in the data). ``storage_options`` are fsspec/s3fs options
    (flat, or keyed by protocol); they never enter the task graph.
    ``allowed_locations`` replaces the safe-URI policy's default (see
    :mod:`daskcfa.storage.policy`; ``"default"`` stands for the default rule).
    """
    url = storage.normalise(url)
    access = Access.for_aggregation(url, storage_options, allowed_locations)
    return to_dask(read_aggregation(url, variable, access=access), chunks=chunks, mask=mask, access=access)


def open_cfa(url: str, *, storage_options: Mapping[str, Any] | None = None,
             allowed_locations: Iterable[str] | None = None) -> Dataset:
    """Open a whole aggregation file: dimensions, groups, attributes and every variable."""
    url = storage.normalise(url)
    return Dataset.open(url, access=Access.for_aggregation(url, storage_options, allowed_locations))
