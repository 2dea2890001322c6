"""``Dataset(url, mode, format=...)``: netCDF4-python's constructor (and S3netCDF4's ``s3Dataset``),
which reads or hands the dataset to the writer its mode and format call for."""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterable, Mapping

from .. import dataset
from ..choices import DEFAULT_FORMAT
from ..errors import ArgumentError, CFAWarning
from ..storage.access import open_aggregation
from .aggregation import AggregationWriter
from .existing import read_existing
from .plain import PLAIN_FORMATS, PlainWriter

__all__ = ["AGGREGATION_FORMATS", "Dataset"]

#: ``format=`` -> (dialect, aggregation file format, fragment format); ``"CFA4"`` and ``"CFA3"`` are S3netCDF4's
AGGREGATION_FORMATS = {
    "CF-1.13": ("CF-1.13", "NETCDF4", "NETCDF4"),
    "CFA-0.6.2": ("CFA-0.6.2", "NETCDF4", "NETCDF4"),
    "CFA4": ("CFA-0.5", "NETCDF4", "NETCDF4"),
    "CFA3": ("CFA-0.4", "NETCDF3_CLASSIC", "NETCDF3_CLASSIC"),
}
_MODES = ("r", "w", "x", "a", "r+")
#: netCDF4-python's ``Dataset`` options that have no meaning here, with the value that means "not used"
_INERT_OPTIONS = {"diskless": False, "persist": False, "keepweakref": False, "memory": None, "encoding": None,
                  "parallel": False, "comm": None, "info": None}


def _formats(format: str | None, cfa_version: str | None) -> tuple[str, str, str] | None:
    """(dialect, aggregation file format, fragment format) of an aggregation, None for a plain file."""
    format = DEFAULT_FORMAT if format in (None, "DEFAULT") else str(format)
    if format in PLAIN_FORMATS:
        return None  # (S3netCDF4 takes and ignores a cfa_version here too)
    if format not in AGGREGATION_FORMATS:
        raise ArgumentError(f"unknown format {format!r}; choose one of "
                            f"{', '.join([*AGGREGATION_FORMATS, *PLAIN_FORMATS])}")
    dialect, file_format, fragment_format = AGGREGATION_FORMATS[format]
    if cfa_version is not None:
        version = str(cfa_version)
        if format == "CFA4" and version in ("0.4", "0.5"):
            dialect = f"CFA-{version}"
        elif not (format == "CFA3" and version == "0.4"):
            raise ArgumentError(f"cfa_version={cfa_version!r} does not go with format={format!r}: CFA4 takes "
                                "'0.5' (default) or '0.4', CFA3 takes '0.4'; CF-1.13 and CFA-0.6.2 take none")
    return dialect, file_format, fragment_format


def _warn_default_format() -> None:
    """A new dataset without ``format=``: a migrating script would change dialect silently
    (docs/guide/migration.md)."""
    warnings.warn("daskcfa.Dataset(url, 'w') without format= writes a CF-1.13 aggregation, where S3netCDF4 "
                  "writes CFA-0.5 (format='CFA4') and netCDF4-python a plain netCDF-4 file (format='NETCDF4'): "
                  "pass format= to choose (format='CF-1.13' keeps this default)", CFAWarning, stacklevel=3)


class Dataset(dataset.OpenedDataset):
    """A netCDF dataset, netCDF4-python style: ``Dataset(url, mode="r", format=...)``.

    ``mode``: ``"r"`` reads (an aggregation or a plain netCDF file, as
    :func:`daskcfa.open_cfa`); ``"w"`` creates, replacing what is there
    (``clobber=False`` or ``"x"``: fails if it exists); ``"a"`` and ``"r+"``
    update an existing dataset. ``format``: ``"CF-1.13"`` (default for new
    aggregations), ``"CFA-0.6.2"``, S3netCDF4's ``"CFA4"`` (CFA-0.5, or
    CFA-0.4 with ``cfa_version="0.4"``) and ``"CFA3"`` (CFA-0.4 in a netCDF-3
    aggregation file), or a plain netCDF format (``"NETCDF4"``,
    ``"NETCDF4_CLASSIC"``, ``"NETCDF3_CLASSIC"``, ``"NETCDF3_64BIT_OFFSET"``,
    ``"NETCDF3_64BIT_DATA"``). See :class:`AggregationWriter` for the writing
    options (``buffer_size``, ``fragment_name``, ``uris``...).

    ``"r"`` gives a ``Dataset``, the class of every dataset read (as
    :func:`daskcfa.open_cfa` gives). The other modes give a writer, named for
    what it writes, as Python's ``open()`` gives a reader or a writer: an
    :class:`AggregationWriter` (a :class:`daskcfa.Group`: the root of the
    tree defined so far) or, for the plain formats, a :class:`PlainWriter`
    (netCDF4-python's own ``Dataset`` behind it). Neither is a ``Dataset``:
    neither reads its aggregated variables before ``close()``.
    """

    def __new__(cls, url: str | os.PathLike | None = None, mode: str = "r", clobber: bool = True,
                format: str | None = None, *, cfa_version: str | None = None,
                storage_options: Mapping[str, Any] | None = None, allowed_locations: Iterable[str] | None = None,
                missing: str = "raise", **options: Any) -> Any:
        if url is None:  # (built field by field: Dataset.open, unpickling)
            return super().__new__(cls)
        if mode not in _MODES:
            raise ArgumentError(f"mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")
        existing = None
        if mode in ("a", "r+") and format not in PLAIN_FORMATS:  # (read once, here: the writer takes it over)
            existing = read_existing(*open_aggregation(os.fspath(url), storage_options), plain_too=format is not None)
            if format is None:
                format, cfa_version = existing.format() if existing is not None else (None, None)
        elif mode in ("w", "x") and format is None:
            _warn_default_format()
        kinds = None if mode == "r" else _formats(format, cfa_version)
        if kinds is not None:  # S3netCDF4 takes these for aggregations; the aggregation is always written at close
            options.pop("diskless", None)
            options.pop("persist", None)
        for name, inert in _INERT_OPTIONS.items():
            if options.get(name, inert) != inert:
                raise ArgumentError(f"{name}={options[name]!r} is a netCDF4-python option daskcfa does not support")
            options.pop(name, None)
        url = os.fspath(url)
        if mode == "r":
            if options:
                raise ArgumentError(f"unknown options for reading: {', '.join(sorted(options))}")
            url, access = open_aggregation(url, storage_options, allowed_locations, missing)
            return cls.open(url, access=access, chunk_index=None)  # (as open_cfa: the index when there is one)
        if mode == "x":
            mode, clobber = "w", False
        if kinds is None:
            return PlainWriter(url, mode, clobber, str(format), storage_options, **options)
        return AggregationWriter.create(url, mode, clobber, kinds, storage_options, existing=existing, **options)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Everything happens in ``__new__`` (which returns a writer for the other modes)."""
