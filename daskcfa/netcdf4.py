"""netCDF4-python's ``Dataset``, writing and reading aggregations: S3netCDF4's API, in daskcfa.

Code written for S3netCDF4 moves by changing one import::

    from daskcfa.netcdf4 import Dataset   # was: from S3netCDF4._s3netCDF4 import s3Dataset as Dataset

``Dataset(url, "w", format="CFA4")`` then ``createDimension``,
``createVariable(..., subarray_shape=... | max_subarray_size=...)``,
attributes, ``var[index] = values`` and ``close()``, on local disk or S3.

How a write works (:class:`AggregationWriter`): each aggregated variable has
a fragment grid planned when it is created (along an unlimited dimension the
grid grows as the dimension does). An assignment lands in per-fragment
buffers, encoded as stored (packed, masked elements as the fill value); a
fragment whose every element has been assigned is written (and
uploaded) at once, by a pool of threads, into the write's own *generation*
(:mod:`daskcfa.storage.lease`), so nothing a reader can see changes. Buffers
are bounded (``buffer_size``): past it, the fullest incomplete fragment is
written as it is and read back when it is assigned again. ``close()`` writes
what is left (elements never assigned are missing values, or, with
``mode="a"``, what the previous aggregation stores there, bit for bit, as
``to_cfa(mode="r+")`` merges an update) and then commits the
aggregation file atomically under the write lease, with the commit of
:func:`daskcfa.to_cfa`. A process killed before ``close()`` leaves the
previous aggregation (or none) in place.

Plain netCDF formats (``"NETCDF4"``...) are written by netCDF4-python itself,
into a temporary file that ``close()`` moves into place (locally) or uploads
(S3): :class:`PlainWriter` hands every call to that ``netCDF4.Dataset``.

Reading (``mode="r"``) is :func:`daskcfa.open_cfa`: aggregated and ordinary
variables, ``var[index]`` giving numpy (masked like netCDF4-python), fragments
read concurrently; a result larger than ``daskcfa.io.cache-memory`` goes to a
``numpy.memmap`` in the cache directory (S3netCDF4's ``cache_location``).
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import shutil
import tempfile
import uuid
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

import dask
from .lazy import dask_array as da
import netCDF4
import numpy as np
from dask.utils import parse_bytes

from . import config, dataset, storage
from .choices import MAX_FRAGMENT_SIZE
from .decode import Encoding
from .errors import ArgumentError, CFAError, CFAWarning, FragmentError, NotFoundError, TargetExistsError, redact
from .fragments.write import FragmentRecord, FragmentTarget, encode_values, shared_chunks, write_fragment
from .index_writer import index as write_chunk_index
from .formats import aggregated_variables
from .formats.encode import common_format
from .limits import max_elements
from .graph.plan import plan_fragments
from .graph.write import (DEFAULT_FRAGMENT_NAME, WriteSource, commit_aggregation,
                          fragment_columns, fragment_name, fragment_spec, plan_commit, settle_unlimited)
from .inputs import stored_values
from .model import AggregatedVariable, AggregationDataset, Dimension, FragmentGrid, Fragments, PlainVariable
from .locks import NETCDF_LOCK
from .storage.access import open_aggregation
from .storage.lease import Lease, generation_name, in_generation

__all__ = ["Dataset", "AggregationWriter", "PlainWriter", "Dimension", "AGGREGATION_FORMATS", "PLAIN_FORMATS"]

#: ``format=`` -> (dialect, aggregation file format, fragment format); ``"CFA4"`` and ``"CFA3"`` are S3netCDF4's
AGGREGATION_FORMATS = {
    "CF-1.13": ("CF-1.13", "NETCDF4", "NETCDF4"),
    "CFA-0.6.2": ("CFA-0.6.2", "NETCDF4", "NETCDF4"),
    "CFA4": ("CFA-0.5", "NETCDF4", "NETCDF4"),
    "CFA3": ("CFA-0.4", "NETCDF3_CLASSIC", "NETCDF3_CLASSIC"),
}
PLAIN_FORMATS = ("NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA")
#: dialects that can record a fragment as missing (never written: it reads as missing values)
_SPARSE_DIALECTS = ("CFA-0.6.2", "CFA-0.5", "CFA-0.4")
_MODES = ("r", "w", "x", "a", "r+")
#: netCDF4-python's ``Dataset`` options that have no meaning here, with the value that means "not used"
_INERT_OPTIONS = {"diskless": False, "persist": False, "keepweakref": False, "memory": None, "encoding": None,
                  "parallel": False, "comm": None, "info": None}


def _formats(format: str | None, cfa_version: str | None) -> tuple[str, str, str] | None:
    """(dialect, aggregation file format, fragment format) of an aggregation, None for a plain file."""
    format = "CF-1.13" if format in (None, "DEFAULT") else str(format)
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


def _existing_format(url: str, storage_options: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """``(format, cfa_version)`` that keep an existing dataset as it is written (updates, ``mode="a"``):
    a plain file stays plain, an aggregation keeps its dialect and its aggregation file's format."""
    url, access = open_aggregation(url, storage_options)
    try:
        with storage.netcdf_file(url, profile=access.profile) as nc:
            file_format = nc.data_model
            found = aggregated_variables(nc, url)
    except NotFoundError:
        return None, None  # (the writer says there is nothing to update)
    if not found:
        return file_format, None
    dialect = common_format(list(found.values()), url, "update it")
    if dialect == "CFA-0.4":
        return ("CFA3" if file_format.startswith("NETCDF3") else "CFA4"), "0.4"
    return ("CFA4", "0.5") if dialect == "CFA-0.5" else (dialect, None)


def _warn_default_format() -> None:
    """A new dataset without ``format=``: a migrating script would change dialect silently
    (docs/guide/migration.md)."""
    warnings.warn("daskcfa.Dataset(url, 'w') without format= writes a CF-1.13 aggregation, where S3netCDF4 "
                  "writes CFA-0.5 (format='CFA4') and netCDF4-python a plain netCDF-4 file (format='NETCDF4'): "
                  "pass format= to choose (format='CF-1.13' keeps this default)", CFAWarning, stacklevel=3)


class Dataset(dataset.Dataset):
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
    """

    def __new__(cls, url: str | os.PathLike | None = None, mode: str = "r", clobber: bool = True,
                format: str | None = None, *, cfa_version: str | None = None,
                storage_options: Mapping[str, Any] | None = None, allowed_locations: Iterable[str] | None = None,
                missing: str = "raise", **options: Any) -> Any:
        if url is None:  # (built field by field: Dataset.open, unpickling)
            return super().__new__(cls)
        if mode not in _MODES:
            raise ArgumentError(f"mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")
        if mode in ("a", "r+") and format is None:
            format, cfa_version = _existing_format(os.fspath(url), storage_options)
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
        return AggregationWriter.create(url, mode, clobber, kinds, storage_options, **options)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Everything happens in ``__new__`` (which may return a writer)."""


# --------------------------------------------------------------------------
# Plain netCDF files: netCDF4-python into a temporary file, moved or uploaded at close()
# --------------------------------------------------------------------------


#: S3netCDF4's ``createVariable`` keywords, which mean nothing in a plain netCDF file (it ignores them too)
_FRAGMENT_KEYWORDS = ("subarray_shape", "max_subarray_size", "aggregate")


class _PlainGroup:
    """A group of a plain netCDF file: netCDF4-python's, taking S3netCDF4's keywords too."""

    def __init__(self, nc: Any) -> None:
        object.__setattr__(self, "_nc", nc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_nc"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._nc, name, value)  # (netCDF4-python's rules; this object's own fields are set in __dict__)

    def __getitem__(self, path: str) -> Any:
        return self._nc[path]

    def createVariable(self, varname: str, datatype: Any, dimensions: Any = (), **options: Any) -> Any:
        for name in _FRAGMENT_KEYWORDS:
            options.pop(name, None)
        with NETCDF_LOCK:
            return self._nc.createVariable(varname, datatype, dimensions, **options)

    def createGroup(self, groupname: str) -> "_PlainGroup":
        with NETCDF_LOCK:
            return _PlainGroup(self._nc.createGroup(groupname))


class PlainWriter(_PlainGroup):
    """A plain netCDF file written by netCDF4-python itself (every call is handed to it).

    The file is built under a temporary name beside its target (locally) or in
    scratch space (remote), and put in place at :meth:`close` in one step: a
    writer killed before ``close()`` leaves the previous file (or none).
    """

    def __init__(self, url: str, mode: str, clobber: bool, format: str,
                 storage_options: Mapping[str, Any] | None, **options: Any) -> None:
        url = storage.normalise(url)
        profile = storage.register(storage_options, protocol=storage.scheme_of(url))
        exists = storage.exists(url, profile)
        if mode == "w" and exists and not clobber:
            raise TargetExistsError("the file exists (clobber=False)", file=url)
        if mode in ("a", "r+") and not exists:
            raise NotFoundError(f"mode={mode!r} updates a file, and there is none", file=url)
        local = storage.is_local(url)
        if local:
            final = storage.local_path(url)
            os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
            scratch = storage.temporary_name(final)
        else:
            handle, scratch = tempfile.mkstemp(suffix=".nc", prefix="daskcfa-dataset-")
            os.close(handle)
        if mode in ("a", "r+"):
            if local:
                shutil.copyfile(storage.local_path(url), scratch)
            else:
                with open(scratch, "wb") as f:
                    f.write(storage.read_bytes(url, profile))
        with NETCDF_LOCK:
            nc = netCDF4.Dataset(scratch, "a" if mode in ("a", "r+") else "w", format=format, **options)
        super().__init__(nc)
        self.__dict__.update(_url=url, _profile=profile, _scratch=scratch, _closed=False)

    def close(self) -> None:
        """Close the file and put it in place (upload it, for remote targets)."""
        self._end(commit=True)

    def _end(self, *, commit: bool) -> None:
        if self._closed:
            return
        self.__dict__["_closed"] = True
        try:
            with NETCDF_LOCK:
                self._nc.close()
            if not commit:
                return
            if storage.is_local(self._url):
                storage.commit(self._scratch, storage.local_path(self._url), self._profile)
            else:
                storage.put_file(self._url, self._scratch, self._profile)
        finally:
            if os.path.exists(self._scratch):
                os.unlink(self._scratch)

    def __enter__(self) -> "PlainWriter":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        """An exception inside the ``with`` block abandons the write: the previous file stays."""
        self._end(commit=kind is None)

    def __repr__(self) -> str:
        return f"<daskcfa.netcdf4.PlainWriter {redact(self._url)} ({self._nc.data_model})>"


# --------------------------------------------------------------------------
# Aggregations: buffered fragments, written as they complete, committed at close()
# --------------------------------------------------------------------------


def _end_writing(lease: Lease, pool: ThreadPoolExecutor) -> None:
    """Stop a writer's threads and give its lease back (at close, or when it is dropped unclosed)."""
    pool.shutdown(wait=True, cancel_futures=True)
    lease.release()


def _check_elements(what: str, shape: Sequence[int], url: str) -> None:
    """Refuse a size beyond ``daskcfa.limits.max-elements`` when it is defined, not later as a bare
    OverflowError or MemoryError while its fragments are planned."""
    elements = math.prod(int(n) for n in shape)
    if elements > max_elements():
        raise ArgumentError(f"{what}: {elements:,} elements is more than {max_elements():,} (raise dask config "
                            "'daskcfa.limits.max-elements' if this is genuine)", file=url)


class GrowingDimension:
    """A dimension of a dataset being written (an unlimited one grows as data are assigned)."""

    def __init__(self, name: str, size: int | None) -> None:
        self.name = name
        self.unlimited = size is None
        self.size = 0 if size is None else int(size)

    def __len__(self) -> int:
        return self.size

    def isunlimited(self) -> bool:
        return self.unlimited

    def __repr__(self) -> str:
        kind = "unlimited, " if self.unlimited else ""
        return f"<daskcfa.netcdf4.Dimension {self.name!r} ({kind}size {self.size})>"


_NETCDF_NAME = re.compile(r"[\w\x80-\U0010ffff][^/\x00-\x1f\x7f]*(?<!\s)")
#: names netCDF4-python reserves (setting one raises AttributeError); every other name is a netCDF attribute
_RESERVED = frozenset({"name", "path", "dimensions", "variables", "groups", "parent", "dtype", "ndim"})


class _NetCDFAttributes:
    """netCDF4-python's attribute rules: ``obj.units = "K"`` sets a netCDF attribute, as ``setncattr`` does."""

    attrs: dict[str, Any]
    _writer: "AggregationWriter"

    def __setattr__(self, name: str, value: Any) -> None:
        if "_writer" not in self.__dict__:  # (being built: the object's own fields)
            object.__setattr__(self, name, value)
        elif name in _RESERVED:
            raise AttributeError(f"{name!r} cannot be set (netCDF4-python reserves it); setncattr({name!r}, ...) "
                                 "sets a netCDF attribute of that name")
        else:  # (url, _writer, ...: as netCDF4-python, a netCDF attribute; never this object's own fields)
            self.setncattr(name, value)

    def __delattr__(self, name: str) -> None:
        self.delncattr(name)

    def setncattr(self, name: str, value: Any) -> None:
        self._writer.check_open()
        self.attrs[name] = self._attribute(name, value)

    def _attribute(self, name: str, value: Any) -> Any:
        """The value stored for attribute ``name`` (or a refusal)."""
        return value

    def setncatts(self, attdict: Mapping[str, Any]) -> None:
        for name, value in attdict.items():
            self.setncattr(name, value)

    def delncattr(self, name: str) -> None:
        self._writer.check_open()
        self.attrs.pop(name)


class _Definitions(_NetCDFAttributes):
    """netCDF4-python's defining calls, shared by the dataset and its groups."""

    path: str
    dimensions: dict[str, Any]
    variables: dict[str, Any]
    groups: dict[str, Any]
    _writer: "AggregationWriter"

    def createDimension(self, dimname: str, size: int | None = None) -> GrowingDimension:
        self._writer.check_open()
        _check_name(dimname, self.dimensions, "dimension", self.path)
        if size is not None and (not isinstance(size, (int, np.integer)) or size < 0):
            raise ArgumentError(f"dimension {dimname!r}: size must be an integer >= 0 or None (unlimited), "
                                f"got {size!r}")
        _check_elements(f"dimension {dimname!r}", [size or 0], self._writer.url)
        dim = GrowingDimension(dimname, size)
        self.dimensions[dimname] = dim
        return dim

    def createGroup(self, groupname: str) -> "WritableGroup":
        self._writer.check_open()
        existing = self.groups.get(groupname)
        if existing is not None:  # (netCDF4-python returns the group that exists)
            return existing
        _check_name(groupname, self.variables, "group", self.path)
        group = WritableGroup(groupname, posixpath.join(self.path, groupname), self, self._writer)
        self.groups[groupname] = group
        return group

    def createVariable(self, varname: str, datatype: Any, dimensions: str | Sequence[str] = (), *,
                       fill_value: Any = None, subarray_shape: Any = None, max_subarray_size: int | str | None = None,
                       aggregate: bool | None = None, zlib: bool = False, complevel: int = 4, shuffle: bool = True,
                       fletcher32: bool = False, contiguous: bool = False, chunksizes: Sequence[int] | None = None,
                       endian: str = "native", least_significant_digit: int | None = None,
                       compression: str | None = None, **compression_options: Any) -> "WritableVariable":
        """Define a variable, as netCDF4-python does, plus S3netCDF4's fragment options.

        A variable with dimensions that is not a coordinate variable (named as
        its one dimension) and holds numbers is *aggregated*: stored in
        fragments of ``subarray_shape`` (a size per dimension) or of at most
        ``max_subarray_size`` bytes (default 50 MB; along an unlimited
        dimension, fragments span the other dimensions whole when a step fits
        and grow along it). ``aggregate=False`` keeps a variable in the
        aggregation file; ``aggregate=True`` insists.
        """
        self._writer.check_open()
        _check_name(varname, self.variables, "variable", self.path)
        if isinstance(dimensions, str):
            dimensions = (dimensions,)
        dims = tuple(dimensions)
        found = [self._find_dimension(d) for d in dims]
        dtype = _datatype(datatype, varname)
        if endian not in ("native", "little", "big"):
            raise ArgumentError(f"endian must be 'native', 'little' or 'big', got {endian!r}")
        attrs: dict[str, Any] = {}
        if fill_value is not None and fill_value is not False:
            attrs["_FillValue"] = np.array(fill_value, dtype=dtype)[()] if dtype.kind in "biuf" else fill_value
        if least_significant_digit is not None:
            attrs["least_significant_digit"] = least_significant_digit
        coordinate = len(dims) == 1 and dims[0] == varname
        aggregable = bool(dims) and not coordinate and dtype.kind in "biuf"
        if aggregate and not aggregable:
            raise ArgumentError(f"{varname!r} cannot be aggregated: only variables with dimensions that hold numbers "
                                "and are not coordinate variables are")
        aggregated = aggregable if aggregate is None else aggregate
        keywords = dict(compression_options)
        if zlib or compression:
            keywords.update(compression=compression or "zlib", complevel=complevel, shuffle=shuffle)
        if fletcher32:
            keywords["fletcher32"] = True
        if chunksizes is not None and not contiguous:
            keywords["chunksizes"] = tuple(int(c) for c in chunksizes)
        _check_elements(f"variable {varname!r}", [len(d) for d in found], self._writer.url)
        var = WritableVariable(varname, posixpath.join(self.path, varname), dims, found, dtype, attrs, self._writer,
                               aggregated=aggregated, compression=keywords,
                               fragment_shape=subarray_shape, max_fragment_size=max_subarray_size)
        self.variables[varname] = var
        return var

    def _find_dimension(self, name: str) -> GrowingDimension:
        node: Any = self
        while node is not None:
            if name in node.dimensions:
                return node.dimensions[name]
            node = node.parent
        raise ArgumentError(f"dimension {name!r} is not defined in group {self.path!r} or above")


def _check_name(name: str, taken: Mapping[str, Any], what: str, group: str) -> None:
    """netCDF's name rules (netCDF-C refuses the others only when the file is written, at close())."""
    if not isinstance(name, str) or not _NETCDF_NAME.fullmatch(name):
        raise ArgumentError(f"{what} name {name!r} is not a netCDF name (a letter, digit, '_' or non-ASCII "
                            "character first; no '/' nor control characters; no trailing space)")
    if name in taken:
        raise ArgumentError(f"{what} {name!r} already exists in group {group!r}")


def _datatype(datatype: Any, name: str) -> np.dtype:
    if datatype is str:
        return np.dtype(object)
    try:
        dtype = np.dtype(datatype)
    except TypeError:
        raise ArgumentError(f"{name!r}: datatype {datatype!r} is not a numpy or netCDF type") from None
    if dtype.kind == "U":
        return np.dtype(object)
    if dtype.kind not in "iufSO" or (dtype.kind == "S" and dtype.itemsize != 1) or dtype.itemsize > 8:
        raise ArgumentError(f"{name!r}: netCDF cannot store dtype {dtype}")
    return dtype.newbyteorder("=")


class WritableGroup(_Definitions, dataset.Group):
    """A group of a dataset being written."""

    def __init__(self, name: str, path: str, parent: Any, writer: "AggregationWriter") -> None:
        dataset.Group.__init__(self, name=name, path=path, parent=parent)
        object.__setattr__(self, "_writer", writer)


class _Buffer:
    """One fragment's assigned values, before it is written: values, which are masked, which assigned.
    (An aggregated variable's buffers hold stored values, encoded as they are assigned, so that what
    an update merges them with, or reads back, never goes through a decode and encode again.)"""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.values = np.zeros(shape, dtype)
        self.masked = np.zeros(shape, bool)
        self.assigned = np.zeros(shape, bool)
        self.count = 0  #: elements assigned

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.masked.nbytes + self.assigned.nbytes

    @property
    def fullness(self) -> float:
        return self.count / self.assigned.size if self.assigned.size else 1.0

    def put(self, where: tuple, values: np.ndarray) -> None:
        self.values[where] = np.ma.getdata(values)
        self.masked[where] = np.ma.getmaskarray(values)
        self.count += int(self.assigned[where].size - np.count_nonzero(self.assigned[where]))
        self.assigned[where] = True

    def mark(self, assigned: np.ndarray | bool) -> None:
        """Say which elements are assigned (all of them: ``True``)."""
        self.assigned[...] = assigned
        self.count = int(np.count_nonzero(self.assigned))

    def complete(self) -> bool:
        return self.count == self.assigned.size

    def array(self, shape: tuple[int, ...], underneath: Any = None) -> np.ma.MaskedArray:
        """The values over ``shape`` (a fragment cut short at the end of an unlimited dimension):
        what was not assigned comes from ``underneath`` (the fragment as stored), else is missing."""
        cut = tuple(slice(0, n) for n in shape)
        values, masked, assigned = self.values[cut], self.masked[cut], self.assigned[cut]
        if underneath is None:
            return np.ma.MaskedArray(values, mask=masked | ~assigned)
        under = np.ma.asarray(underneath)
        return np.ma.MaskedArray(np.where(assigned, values, np.ma.getdata(under)),
                                 mask=np.where(assigned, masked, np.ma.getmaskarray(under)))


#: attributes that say how assigned values are stored
_PACKING = ("scale_factor", "add_offset", "_Unsigned")


class WritableVariable(_NetCDFAttributes, dataset.Variable):
    """A variable of a dataset being written: ``var[index] = values``, netCDF4-python's rules.

    Indices: integers (negative count from the end), slices, integer and
    boolean sequences (one per dimension, orthogonal as in netCDF4-python),
    ``Ellipsis``; an index past the end of an unlimited dimension grows it.
    Values: numpy (masked: missing), dask (computed one fragment at a time),
    or anything numpy converts, broadcast to the selection.
    """

    def __init__(self, name: str, path: str, dims: tuple[str, ...], dimensions: list[GrowingDimension],
                 dtype: np.dtype, attrs: dict[str, Any], writer: "AggregationWriter", *, aggregated: bool,
                 compression: dict[str, Any], fragment_shape: Any, max_fragment_size: int | str | None,
                 layout: "_FragmentLayout | None" = None) -> None:
        """``layout``: the fragments' layout when it is given (an aggregation updated), else planned."""
        d = self.__dict__
        d.update(name=name, path=path, dims=dims, dtype=dtype, attrs=attrs, aggregation=None, _writer=writer,
                 _dimensions=dimensions, _aggregated=aggregated, _compression=compression, _data=None,
                 _url=writer.url, _access=None)
        if aggregated and layout is None:
            layout = _FragmentLayout.plan(self, fragment_shape, max_fragment_size)
        d["_layout"] = layout if aggregated else None
        d["_plain"] = None if aggregated else _Buffer((0,) * len(dims), dtype)
        d["_buffers"] = {}  # fragment index -> _Buffer
        #: fragments written (read back when assigned again): index -> packed bits of the elements assigned
        #: when written incomplete (the buffer budget), None when complete
        d["_stored"] = {}
        d["_previous"] = None  # mode="a": the variable as the previous aggregation holds it
        if not aggregated:
            self._plain_to(self.shape)

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return tuple(d.size for d in self._dimensions)

    @property
    def is_aggregated(self) -> bool:
        return self._aggregated

    @property
    def fragments(self) -> None:  # type: ignore[override]
        return None

    def _attribute(self, name: str, value: Any) -> Any:
        if name == "_FillValue":
            if self._assigned_any():
                raise ArgumentError(f"{self.path}: _FillValue cannot change once values are assigned (give it to "
                                    "createVariable(fill_value=...), as netCDF4-python asks)")
            value = np.array(value, dtype=self.dtype)[()] if self.dtype.kind in "iuf" else value
        elif name in _PACKING and self._assigned_any():
            raise ArgumentError(f"{self.path}: {name} cannot change once values are assigned (netCDF4-python would "
                                "read the values stored so far with it, daskcfa would pack them with it: set it "
                                "before assigning)")
        return value

    def _assigned_any(self) -> bool:
        if self._plain is not None:
            return bool(self._plain.assigned.any())
        return bool(self._buffers or self._stored or self._previous is not None)

    def set_auto_maskandscale(self, value: bool) -> None:
        if not value:
            raise ArgumentError("daskcfa always masks and scales (as netCDF4-python does by default)")

    set_auto_mask = set_auto_scale = set_auto_maskandscale

    def __getitem__(self, key: Any) -> np.ndarray:
        if self._aggregated:
            raise ArgumentError(f"{self.path} is aggregated: read it after close(), by opening the dataset again "
                                "(its fragments are not all written yet)", file=self._writer.url)
        selection, _, drop = _selection(key, self.shape, [False] * len(self.shape), None)
        values = self._plain.array(self.shape)[np.ix_(*selection)] if selection else self._plain.array(())
        return values.reshape([len(s) for i, s in enumerate(selection) if i not in drop])

    def __setitem__(self, key: Any, values: Any) -> None:
        writer = self._writer
        writer.check_open()
        unlimited = [d.unlimited for d in self._dimensions]
        value_shape = np.shape(values) if not isinstance(values, da.Array) else values.shape
        selection, grown, drop = _selection(key, self.shape, unlimited, value_shape)
        target = tuple(len(s) for i, s in enumerate(selection) if i not in drop)
        values = _conform(_storable(values, self.value_dtype, self.path), target, tuple(len(s) for s in selection),
                          self.path)
        _check_elements(f"variable {self.path!r}", [max(d.size, n) for d, n in zip(self._dimensions, grown)],
                        writer.url)
        for dim, size in zip(self._dimensions, grown):
            if size > dim.size:
                dim.size = size
        if not self._aggregated:
            self._plain_to(self.shape)  # (also after packing attributes were set)
            if selection:
                self._plain.put(np.ix_(*selection), _as_numpy(values))
            else:
                self._plain.put((), _as_numpy(values))
            return
        writer.assign(self, selection, values)

    def assignValue(self, value: Any) -> None:
        """netCDF4-python's way to set a scalar variable."""
        self[...] = value

    def getValue(self) -> Any:
        return self[...]

    @property
    def value_dtype(self) -> np.dtype:
        """The dtype of the values assigned (unpacked: netCDF4-python's rule)."""
        return Encoding.from_attrs(self.attrs, self.dtype).decoded_dtype if self.dtype.kind in "iuf" else self.dtype

    def _plain_to(self, shape: tuple[int, ...]) -> None:
        """Grow the in-file buffer of an ordinary variable to ``shape`` (in the dtype values now have)."""
        old = self._plain
        capacity = old.values.shape
        if all(n <= c for n, c in zip(shape, capacity)) and old.values.dtype == self.value_dtype:
            return
        new = _Buffer(tuple(c if n <= c else max(n, 2 * c) for n, c in zip(shape, capacity)), self.value_dtype)
        cut = tuple(slice(0, n) for n in old.values.shape)
        new.values[cut], new.masked[cut], new.assigned[cut] = old.values, old.masked, old.assigned
        object.__setattr__(self, "_plain", new)

    def __repr__(self) -> str:
        kind = "aggregated" if self._aggregated else "ordinary"
        dims = ", ".join(f"{d}: {n}" for d, n in zip(self.dims, self.shape))
        return f"<daskcfa.netcdf4.WritableVariable {self.path} ({dims}) {self.dtype} [{kind}, being written]>"


def _run(at: np.ndarray) -> slice | np.ndarray:
    """Positions as a slice when they are consecutive (numpy's basic indexing: no copy of an index)."""
    if len(at) and at[-1] - at[0] == len(at) - 1 and (len(at) == 1 or (np.diff(at) == 1).all()):
        return slice(int(at[0]), int(at[-1]) + 1)
    return at


def _orthogonal(positions: tuple[np.ndarray, ...]) -> tuple:
    """An index selecting ``positions`` along each dimension orthogonally (netCDF4-python's rule)."""
    runs = tuple(_run(at) for at in positions)
    return runs if sum(not isinstance(r, slice) for r in runs) <= 1 else np.ix_(*positions)


def _take(values: Any, positions: tuple[np.ndarray, ...]) -> Any:
    """``values`` at ``positions`` along each dimension (orthogonally), numpy or dask: runs of consecutive
    positions as slices, taken one dimension at a time (dask takes one index array per step)."""
    for d, at in enumerate(positions):
        where = _run(at)
        if not (isinstance(where, slice) and where == slice(0, values.shape[d])):
            values = values[(slice(None),) * d + (where,)]
    return values


def _storable(values: Any, dtype: np.dtype, path: str) -> Any:
    """Values for an (unpacked) integer variable: NaN is missing, and what ``dtype`` cannot hold is refused
    (numpy's cast would wrap it, as netCDF4-python lets it: 300 into int8 is 44). Dask values are checked
    as they are computed, one fragment at a time."""
    if dtype.kind not in "iu" or isinstance(values, da.Array):
        return values
    values = np.ma.asarray(values) if np.ma.isMaskedArray(values) else np.asarray(values)
    if values.size == 0 or values.dtype.kind not in "iuf" or np.can_cast(values.dtype, dtype):
        return values
    data, mask = np.ma.getdata(values), np.ma.getmaskarray(values)
    if data.dtype.kind == "f":
        nan = np.isnan(data)
        if nan.any():
            mask, data = mask | nan, np.where(nan, 0, data)
            values = np.ma.MaskedArray(data, mask=mask)
        data = np.trunc(data)  # (netCDF4-python's cast truncates: 2.7 is 2)
    held = data[~mask]
    info = np.iinfo(dtype)
    if held.size and (held.min() < info.min or held.max() > info.max):
        raise ArgumentError(f"values from {held.min()} to {held.max()} are outside the range of {dtype}, which "
                            "would wrap them (mask them, or choose a wider type)", variable=path)
    return values


def _as_numpy(values: Any) -> np.ndarray:
    if isinstance(values, da.Array):
        values = values.compute()
    return np.ma.asarray(values) if np.ma.isMaskedArray(values) else np.asarray(values)


def _conform(values: Any, target: tuple[int, ...], full: tuple[int, ...], path: str) -> Any:
    """``values`` shaped as the selection (with its integer-indexed dimensions kept, size 1), netCDF4-python's
    leniency included: values with the selection's size but extra or missing size-1 dimensions."""
    if not isinstance(values, da.Array):
        values = np.ma.asarray(values) if np.ma.isMaskedArray(values) else np.asarray(values)
    shape = values.shape
    try:
        if shape != target and int(np.prod(shape)) == int(np.prod(target)) and \
                [n for n in shape if n != 1] == [n for n in target if n != 1]:
            values = values.reshape(target)
        elif shape != target:
            values = (da.broadcast_to if isinstance(values, da.Array) else _broadcast)(values, target)
    except ValueError:
        raise ArgumentError(f"{path}: cannot assign values of shape {shape} to a selection of shape {target}") from None
    return values.reshape(full)


def _broadcast(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if np.ma.isMaskedArray(values):
        return np.ma.MaskedArray(np.broadcast_to(values.data, shape), mask=np.broadcast_to(np.ma.getmaskarray(values),
                                                                                            shape))
    return np.broadcast_to(values, shape)


def _selection(key: Any, shape: tuple[int, ...], unlimited: Sequence[bool], value_shape: tuple[int, ...] | None
               ) -> tuple[list[np.ndarray], list[int], set[int]]:
    """netCDF4-python's index rules: the positions selected along each dimension, each dimension's
    size after the assignment (unlimited ones grow), and the dimensions indexed by an integer."""
    key = key if isinstance(key, tuple) else (key,)
    if not shape and len(key) == 1:
        key = ()  # (a scalar variable takes any one index, as in netCDF4-python: v[:] = 5)
    if sum(k is Ellipsis for k in key) > 1:
        raise ArgumentError("an index can only have a single ellipsis ('...')")
    if Ellipsis in [k for k in key if not isinstance(k, np.ndarray)]:
        at = next(i for i, k in enumerate(key) if k is Ellipsis and not isinstance(k, np.ndarray))
        key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1:]
    if len(key) > len(shape):
        raise ArgumentError(f"too many indices ({len(key)}) for {len(shape)} dimensions")
    key = key + (slice(None),) * (len(shape) - len(key))
    selection, grown, drop = [], [], set()
    vdims = list(value_shape) if value_shape is not None else []
    kept = [i for i, k in enumerate(key) if not dataset.integer_index(k)]
    for d, (k, n, grows) in enumerate(zip(key, shape, unlimited)):
        if dataset.integer_index(k):
            i = int(k)
            if i < 0:
                i += n
            if i < 0 or (i >= n and not grows):
                raise ArgumentError(f"index {int(k)} is out of bounds for a dimension of size {n}")
            positions = np.array([i])
            drop.add(d)
        elif isinstance(k, slice):
            stop = k.stop
            if grows and stop is None and (k.step or 1) > 0 and value_shape is not None and len(vdims) == len(kept):
                start = 0 if k.start is None else (k.start + n if k.start < 0 else k.start)
                stop = max(n, start + vdims[kept.index(d)] * (k.step or 1) - ((k.step or 1) - 1))
            limit = max(n, stop) if grows and stop is not None and stop >= 0 else n
            positions = np.arange(*slice(k.start, stop, k.step).indices(limit))
        else:
            array = np.asarray(k)
            if array.dtype == bool:
                if array.ndim != 1 or (len(array) != n and not grows):
                    raise ArgumentError(f"a boolean index must be 1-D and as long as its dimension ({n})")
                positions = np.flatnonzero(array)
            elif array.dtype.kind in "iu" and array.ndim <= 1:
                positions = np.where(array < 0, array + n, array).astype(np.int64).reshape(-1)
                if (positions < 0).any() or (not grows and (positions >= n).any()):
                    raise ArgumentError(f"an index in {k!r} is out of bounds for a dimension of size {n}")
            else:
                raise ArgumentError(f"unsupported index {k!r}: integers, slices, 1-D integer or boolean sequences, "
                                    "and '...' (as netCDF4-python)")
        selection.append(positions)
        grown.append(max(n, int(positions.max()) + 1) if len(positions) else n)
    return selection, grown, drop


class _FragmentLayout:
    """Where an aggregated variable's fragments lie: offsets per dimension, and along an unlimited
    dimension a fragment length that repeats past the known offsets as the dimension grows."""

    def __init__(self, offsets: list[list[int]], steps: list[int | None]) -> None:
        self.offsets = offsets  # known fragment boundaries per dimension (start 0, end the last boundary)
        self.steps = steps  # unlimited dimensions: the length of each further fragment

    @classmethod
    def plan(cls, var: WritableVariable, fragment_shape: Any, max_fragment_size: int | str | None) -> "_FragmentLayout":
        unlimited = [d.unlimited for d in var._dimensions]
        size = max_fragment_size if max_fragment_size is not None else MAX_FRAGMENT_SIZE
        if fragment_shape is not None:
            wanted = [int(n) for n in np.asarray(fragment_shape).reshape(-1)]
            if len(wanted) != len(var.dims) or min(wanted, default=1) < 1:
                raise ArgumentError(f"{var.path}: subarray_shape {list(wanted)} must give a size >= 1 for each of "
                                    f"its {len(var.dims)} dimensions")
        elif any(unlimited):
            fixed = [1 if u else d.size for u, d in zip(unlimited, var._dimensions)]
            step = plan_fragments(fixed, var.dtype, var.dims, max_fragment_size=size)
            wanted = [max(row) if row else 1 for row in step.sizes]
            per_step = int(np.prod(wanted, dtype=np.int64)) * var.dtype.itemsize
            first = unlimited.index(True)
            wanted[first] = max(1, parse_bytes(size) // max(per_step, 1)) if isinstance(size, str) else \
                max(1, int(size) // max(per_step, 1))
        else:
            grid = plan_fragments(var.shape, var.dtype, var.dims, max_fragment_size=size)
            return cls([list(o) for o in grid.offsets], [None] * len(var.dims))
        offsets, steps = [], []
        for n, u, d in zip(wanted, unlimited, var._dimensions):
            if u:
                offsets.append([0])
                steps.append(n)
            else:
                offsets.append(list(range(0, d.size, n)) + [d.size] if d.size else [0, 0])
                steps.append(None)
        return cls(offsets, steps)

    def count(self, d: int, size: int) -> int:
        """Fragments along dimension ``d`` when it has ``size`` elements."""
        known = len(self.offsets[d]) - 1
        step = self.steps[d]
        end = self.offsets[d][-1]
        if step is None or size <= end:
            return max(known, 1) if size or known else 1
        return known + -(-(size - end) // step)

    def span(self, d: int, i: int) -> tuple[int, int]:
        """Start and end (its capacity: may lie past an unlimited dimension's size) of fragment ``i``."""
        known = len(self.offsets[d]) - 1
        if i < known:
            return self.offsets[d][i], self.offsets[d][i + 1]
        start = self.offsets[d][-1] + (i - known) * self.steps[d]
        return start, start + self.steps[d]

    def which(self, d: int, positions: np.ndarray) -> np.ndarray:
        """The fragment along dimension ``d`` of each position."""
        bounds = np.asarray(self.offsets[d])
        inside = np.searchsorted(bounds, positions, side="right") - 1
        if self.steps[d] is None:
            return np.minimum(inside, len(bounds) - 2)
        past = positions >= bounds[-1]
        return np.where(past, len(bounds) - 1 + (positions - bounds[-1]) // self.steps[d], inside)

    def grid(self, shape: tuple[int, ...]) -> FragmentGrid:
        """The fragment grid of the variable at ``shape``: the last fragment along an unlimited dimension cut short."""
        sizes = []
        for d, n in enumerate(shape):
            row = []
            for i in range(self.count(d, n)):
                a, b = self.span(d, i)
                row.append(max(0, min(b, n) - a))
            sizes.append(tuple(row))
        return FragmentGrid(tuple(sizes))


class AggregationWriter(_Definitions, Dataset):
    """An aggregation being written (or updated): what ``Dataset(url, "w", format="CF-1.13")`` returns.

    Options beyond netCDF4-python's: ``buffer_size`` (bytes of incomplete
    fragments held before the fullest is written as it is; default
    ``daskcfa.write.buffer-memory``), ``fragment_name`` and ``uris`` (as in
    :func:`daskcfa.to_cfa`), ``max_concurrent_uploads`` (fragment writes in
    flight, default 4 remote, 2 local), ``keep_previous`` (seconds the
    replaced fragments of an update are kept), ``chunk_index`` (``True``: the
    chunk index written beside the aggregation after the commit, as
    :func:`daskcfa.index` writes it).
    """

    @classmethod
    def create(cls, url: str, mode: str, clobber: bool, kinds: tuple[str, str, str],
               storage_options: Mapping[str, Any] | None, *, buffer_size: int | str | None = None,
               fragment_name: str = DEFAULT_FRAGMENT_NAME, uris: str = "relative",
               max_concurrent_uploads: int | None = None, keep_previous: float = 0.0,
               chunk_index: bool = False) -> "AggregationWriter":
        config.check()
        self = object.__new__(cls)
        d = self.__dict__
        url = storage.normalise(url)
        profile = storage.register(storage_options, protocol=storage.scheme_of(url))
        dataset.Group.__init__(self, name="/", path="/")
        d.update(url=url, _writer=self, _mode=mode, _profile=profile, _closed=False, _failed=None,
                 _dialect=kinds[0], _file_format=kinds[1], _fragment_format=kinds[2], _template=fragment_name,
                 _uris=uris, _keep_previous=float(keep_previous), _records={}, _inflight={}, _sizes={}, _expected=None)
        d["_budget"] = config.size("daskcfa.write.buffer-memory", buffer_size, "buffer_size")
        d["_stem"] = posixpath.splitext(posixpath.basename(url.rstrip("/")))[0]
        d["_index_options"] = dict(storage_options or {}) if chunk_index else None  # (never shown: no repr has it)
        exists = storage.exists(url, profile)
        if mode == "w" and exists and not clobber:
            raise TargetExistsError("the aggregation exists (clobber=False, or mode 'x')", file=url)
        if mode in ("a", "r+") and not exists:
            raise NotFoundError(f"mode={mode!r} updates an aggregation, and there is none", file=url)
        lease = Lease.new(url, profile, generation_name(uuid.uuid4().hex))
        lease.acquire(wait=float(dask.config.get("daskcfa.write.lease-wait")) if mode in ("a", "r+") else 0.0)
        workers = max_concurrent_uploads or (2 if storage.is_local(url) else 4)
        d["_lease"] = lease
        d["_pool"] = ThreadPoolExecutor(max_workers=int(workers), thread_name_prefix="daskcfa-dataset")
        # at close(), when abandoned, and when dropped unclosed: the threads stop, the lease goes
        d["_end"] = weakref.finalize(self, _end_writing, lease, d["_pool"])
        try:
            if mode in ("a", "r+"):
                d["_expected"] = storage.stat(url, profile)
                self._load(Dataset.open(url, access=open_aggregation(url, storage_options)[1]))
        except BaseException:
            self._end()
            raise
        return self

    @property
    def parent(self) -> None:
        return None

    @parent.setter
    def parent(self, value: Any) -> None:  # (the Group initialiser sets it)
        pass

    @property
    def data_model(self) -> str:
        return self._file_format

    @property
    def file_format(self) -> str:
        return self._file_format

    def check_open(self) -> None:
        if self._closed:
            raise ArgumentError("the dataset is closed", file=self.url)
        if self._failed is not None:
            raise self._failed

    # -- assignments -----------------------------------------------------------------------------

    def assign(self, var: WritableVariable, selection: list[np.ndarray], values: Any) -> None:
        """Put ``values`` (shaped as ``selection``) into the fragments they touch; write those now complete."""
        self._lease.confirm()
        layout = var._layout
        per_dim = []
        for d, positions in enumerate(selection):
            owners = layout.which(d, positions)
            groups = []
            for i in np.unique(owners):
                at = np.flatnonzero(owners == i)
                start, _ = layout.span(d, int(i))
                groups.append((int(i), positions[at] - start, at))
            per_dim.append(groups)
        for combo in (np.ndindex(*[len(g) for g in per_dim]) if per_dim else [()]):
            parts = [per_dim[d][c] for d, c in enumerate(combo)]
            index = tuple(p[0] for p in parts)
            local = tuple(p[1] for p in parts)
            source = tuple(p[2] for p in parts)
            piece = _as_numpy(_take(values, source))
            if isinstance(values, da.Array):
                piece = _storable(piece, var.value_dtype, var.path)
            buffer = self._buffer(var, index)
            buffer.put(_orthogonal(local), self._encoded(var, index, piece))
            if buffer.complete():
                self._write(var, index, buffer.values)
        self._within_budget()

    def _encoded(self, var: WritableVariable, index: tuple[int, ...], values: Any) -> np.ndarray:
        """``values`` as the variable stores them (packed, masked elements as the fill value). What
        cannot be stored fails the write, as a fragment that cannot be written does."""
        try:
            return encode_values(values, var.attrs, var.dtype)
        except CFAError as exc:
            self.__dict__["_failed"] = exc.located(file=self.url, variable=var.path, fragment=index)
            raise self._failed from None

    def _missing(self, var: WritableVariable, index: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
        """Stored values of ``shape`` all missing: the variable's fill value."""
        return self._encoded(var, index, np.ma.masked_all(shape, var.value_dtype))

    def _capacity(self, var: WritableVariable, index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(b - a for a, b in (var._layout.span(d, i) for d, i in enumerate(index)))

    def _buffer(self, var: WritableVariable, index: tuple[int, ...]) -> _Buffer:
        buffer = var._buffers.get(index)
        if buffer is None:
            buffer = var._buffers[index] = _Buffer(self._capacity(var, index), var.dtype)
            if index in var._stored:  # written earlier: what was assigned then is in the file
                bits = var._stored.pop(index)
                stored = self._read_back(var, index)
                cut = tuple(slice(0, n) for n in stored.shape)
                buffer.put(cut, stored)
                shape = buffer.assigned.shape
                buffer.mark(True if bits is None else
                            np.unpackbits(bits, count=int(np.prod(shape))).astype(bool).reshape(shape))
        return buffer

    def _within_budget(self) -> None:
        """Write the fullest incomplete fragments, as they are, while the buffers exceed the budget."""
        buffers = [(var, index, b) for var in self._aggregated() for index, b in var._buffers.items()]
        total = sum(b.nbytes for *_, b in buffers)
        if total <= self._budget:
            return
        for var, index, buffer in sorted(buffers, key=lambda t: -t[2].fullness):
            if total <= self._budget:
                break
            total -= buffer.nbytes
            self._write(var, index, self._merged(var, index, buffer, buffer.values.shape), buffer.assigned)

    def _write(self, var: WritableVariable, index: tuple[int, ...], values: np.ndarray,
               assigned: np.ndarray | None = None) -> None:
        """Hand one fragment's stored values to the writing threads (after any earlier write of it
        finished); ``assigned``: the elements assigned when it is written incomplete."""
        var._buffers.pop(index, None)
        var._stored[index] = None if assigned is None else np.packbits(assigned)
        earlier = self._inflight.pop((var.path, index), None)
        if earlier is not None:
            self._collect((var.path, index), earlier)
        nbytes = values.nbytes
        self._bound_inflight(nbytes)
        spec, sliced = self._spec(var, index, values.shape)  # (here: the ordinary variables change in this thread)
        future = self._pool.submit(self._write_now, var, index, values, spec, sliced)
        self._inflight[(var.path, index)] = future
        self._sizes[(var.path, index)] = nbytes

    def _bound_inflight(self, nbytes: int) -> None:
        """Values handed to the writing threads count against a budget of their own (as large as the
        buffers'): wait for the oldest writes until ``nbytes`` more fit."""
        while self._inflight and sum(self._sizes.values()) + nbytes > self._budget:
            oldest = next(iter(self._inflight))
            self._collect(oldest, self._inflight.pop(oldest))

    def _collect(self, key: tuple[str, tuple[int, ...]], future: Future) -> None:
        self._sizes.pop(key, None)
        self._records[key] = future.result()

    def _write_now(self, var: WritableVariable, index: tuple[int, ...], values: np.ndarray, spec: Any,
                   sliced: list) -> FragmentRecord:
        try:
            reference = in_generation(fragment_name(self._template, stem=self._stem, variable=var.path, index=index),
                                      self._lease.generation)
            uri = storage.resolve(reference, self.url)
            stored = reference if self._uris == "relative" else uri
            # no marker: a Dataset write never resumes (a killed one is abandoned), and the marker would cost
            # a GET and a PUT per fragment
            target = FragmentTarget(index=index, shape=values.shape, uri=uri, reference=stored, marker="",
                                    token=uuid.uuid4().hex)
            return write_fragment(spec, target, values, sliced, lease=self._lease)
        except BaseException as exc:
            self.__dict__["_failed"] = exc.located(variable=var.path, fragment=index) if isinstance(exc, CFAError) \
                else FragmentError(
                f"cannot write fragment ({type(exc).__name__}: {exc})", file=self.url, variable=var.path,
                fragment=index)
            raise self._failed from exc

    def _spec(self, var: WritableVariable, index: tuple[int, ...], shape: tuple[int, ...]) -> tuple[Any, list]:
        """The fragment's description, with the coordinates known over its whole extent sliced into it."""
        where = tuple(slice(var._layout.span(d, i)[0], var._layout.span(d, i)[0] + n)
                      for d, (i, n) in enumerate(zip(index, shape)))
        model = AggregationDataset(attrs=dict(self.attrs))
        for group in self.walk():
            for name, dim in group.dimensions.items():
                model.dimensions.append(Dimension(posixpath.join(group.path, name), dim.size))
            for other in group.variables.values():
                if other._aggregated:
                    continue
                other._plain_to(other.shape)  # (its dimensions may have grown since it was assigned)
                if not _known_over(other, var, where):
                    continue
                model.variables.append(PlainVariable(other.path, other.dims, other.dtype, dict(other.attrs),
                                                     other._plain.array(other.shape)))
        spec, sliced, _, _ = fragment_spec(self._source(var, var._compression or None), model, self.url,
                                           format=self._dialect, fragment_format=self._fragment_format,
                                           compression={}, profile=self._profile)
        spec = shared_chunks(spec, [stop - start for start, stop in (var._layout.span(d, 0) for d in range(len(var.dims)))])
        values = []
        for plain, full in sliced:
            cut = tuple(where[var.dims.index(d)] if d in var.dims else slice(None) for d in plain.dims)
            values.append(encode_values(np.ma.asarray(full)[cut], plain.attrs, plain.dtype))
        return spec, values

    @staticmethod
    def _source(var: WritableVariable, compression: dict[str, Any] | None = None) -> WriteSource:
        """The variable as the write graph describes its fragments. An updated one keeps the previous
        aggregation's description (as ``to_cfa(mode="r+")`` does): its packing stays on the aggregation
        variable, whose fragments it has not rewritten hold their values packed without it."""
        previous = var._previous
        return WriteSource(var.path, None, var.dims, var.dtype, dict(var.attrs), compression=compression,
                           existing=None if previous is None else previous["variable"].aggregation)

    def _read_back(self, var: WritableVariable, index: tuple[int, ...]) -> np.ndarray:
        """A fragment this write stored incomplete, as stored."""
        key = (var.path, index)
        if key in self._inflight:
            self._collect(key, self._inflight.pop(key))
        record = self._records.pop(key)
        group = "/" if self._dialect not in ("CFA-0.5", "CFA-0.4") else posixpath.dirname(var.path)
        with storage.netcdf_file(storage.resolve(record.uri, self.url), profile=self._profile) as nc:
            owner = nc if group in ("", "/") else nc[group.strip("/")]
            stored = owner.variables[var.name]
            stored.set_auto_maskandscale(False)
            return np.asarray(stored[...])

    def _aggregated(self) -> list[WritableVariable]:
        return [v for g in self.walk() for v in g.variables.values() if v._aggregated]

    # -- close: the rest written, then the commit ----------------------------------------------------

    def close(self) -> None:
        """Write the incomplete fragments (elements never assigned: missing, or with ``mode="a"``
        what the dataset held), then put the aggregation file in place atomically."""
        if self._closed:
            return
        try:
            self.check_open()
            for var in self._aggregated():
                self._finish(var)
            for key, future in list(self._inflight.items()):
                self._collect(key, future)
            self._inflight.clear()
            self._commit()
        finally:
            self._abandon()

    def _abandon(self) -> None:
        """Stop writing: nothing more is committed, the lease goes (what was written is never referenced)."""
        self.__dict__["_closed"] = True
        self._end()

    def __exit__(self, kind: Any, *exc: Any) -> None:
        """An exception inside the ``with`` block abandons the write: the previous dataset (or none) stays."""
        if kind is None:
            self.close()
        else:
            self._abandon()

    def _finish(self, var: WritableVariable) -> None:
        grid = var._layout.grid(var.shape)
        never = []
        for index in grid.indices():
            shape = grid.fragment_shape(index)
            buffer = var._buffers.get(index)
            if buffer is None and index in var._stored:
                if tuple(self._capacity(var, index)) == shape:
                    continue  # stored as it should be
                buffer = self._buffer(var, index)
            elif buffer is None and self._kept(var, index, shape):
                continue
            elif buffer is None and var._previous is not None and index in var._previous["kept"]:
                buffer = _Buffer(self._capacity(var, index), var.dtype)  # grown: rewritten, merged
            elif buffer is None:
                never.append(index)
                continue
            self._write(var, index, self._merged(var, index, buffer, shape))
        for index in self._fill_needed(grid, never):
            self._write(var, index, self._missing(var, index, grid.fragment_shape(index)))

    def _fill_needed(self, grid: FragmentGrid, never: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Of the fragments nothing was assigned to, those written full of missing values.

        CF-1.13 has no missing fragments: all of them. CFA-0.6.2 records them
        as missing: none. CFA-0.5 and CFA-0.4 list the fragments present, from
        which readers recover the grid: enough to cover every fragment position
        along every dimension.
        """
        if self._dialect not in _SPARSE_DIALECTS:
            return never
        if self._dialect == "CFA-0.6.2":
            return []
        missing = set(never)
        covered = [set() for _ in grid.grid_shape]
        for index in grid.indices():
            if index not in missing:
                for d, i in enumerate(index):
                    covered[d].add(i)
        needed = []
        diagonal = [tuple(min(k, n - 1) for n in grid.grid_shape) for k in range(max(grid.grid_shape, default=0))]
        for index in [*diagonal, *never]:  # (the diagonal first: each of its fragments covers a new row and column)
            if index in missing and any(i not in covered[d] for d, i in enumerate(index)):
                needed.append(index)
                for d, i in enumerate(index):
                    covered[d].add(i)
        return needed

    def _kept(self, var: WritableVariable, index: tuple[int, ...], shape: tuple[int, ...]) -> bool:
        """mode="a": a fragment of the previous aggregation nothing was assigned to, whose extent is
        unchanged (referenced as it is)."""
        previous = var._previous
        return previous is not None and index in previous["kept"] and \
            previous["variable"].fragments.grid.fragment_shape(index) == shape

    def _merged(self, var: WritableVariable, index: tuple[int, ...], buffer: _Buffer,
                shape: tuple[int, ...]) -> np.ndarray:
        """A fragment's stored values: those assigned, and elsewhere what the previous aggregation
        stores there, bit for bit (as ``to_cfa(mode="r+")`` merges), or missing values."""
        cut = tuple(slice(0, n) for n in shape)
        previous = var._previous
        if buffer.complete():
            return buffer.values[cut]
        if previous is None or index not in previous["kept"]:
            return np.ma.getdata(buffer.array(shape, self._missing(var, index, shape)))
        slices = tuple(slice(a, a + n) for a, n in
                       ((var._layout.span(d, i)[0], n) for d, (i, n) in enumerate(zip(index, shape))))
        inside = tuple(slice(s.start, min(s.stop, n)) for s, n in zip(slices, previous["variable"].shape))
        held = tuple(slice(0, s.stop - s.start) for s in inside)
        underneath = np.empty(shape, var.dtype) if held == cut else self._missing(var, index, shape)
        underneath[held] = np.ma.getdata(previous["stored"][inside].compute())
        return np.ma.getdata(buffer.array(shape, underneath))

    def _commit(self) -> None:
        model = AggregationDataset(attrs=dict(self.attrs))
        records: list[list[FragmentRecord]] = []
        paths = []
        for group in self.walk():
            if group is not self:
                model.group_attrs[group.path] = dict(group.attrs)
            for name, dim in group.dimensions.items():
                model.dimensions.append(Dimension(posixpath.join(group.path, name), dim.size, dim.unlimited))
            for var in group.variables.values():
                if not var._aggregated:
                    var._plain_to(var.shape)
                    values = var._plain.array(var.shape)
                    if var.dtype.kind in "OU":  # strings never assigned are empty (netCDF has no missing string)
                        values = values.filled("")
                    model.variables.append(PlainVariable(var.path, var.dims, var.dtype, dict(var.attrs),
                                                         encode_values(values, var.attrs, var.dtype)))
        for var in self._aggregated():
            written = {index: rec for (path, index), rec in self._records.items() if path == var.path}
            _, _, dtype, attrs = fragment_spec(self._source(var), model, self.url, format=self._dialect,
                                               fragment_format=self._fragment_format, compression={},
                                               profile=self._profile)
            model.aggregated.append(AggregatedVariable(
                name=var.path, dims=var.dims, dtype=dtype, attrs=attrs, dialect=self._dialect, source=self.url,
                fragments=self._fragments(var, {i: r.uri for i, r in written.items()})))
            records.append(list(written.values()))
            paths.append(var.path)
        settle_unlimited(model)
        mode = {"a": "r+", "r+": "r+"}.get(self._mode, "w" if storage.exists(self.url, self._profile) else "w-")
        commit = plan_commit(model, self.url, format=self._dialect, fragment_format=self._fragment_format,
                             file_format=self._file_format, generation=self._lease.generation, variables=paths,
                             mode=mode, profile=self._profile, keep_previous=self._keep_previous,
                             expected=self._expected)
        commit_aggregation(commit, records, self._lease)
        if self._index_options is not None:
            write_chunk_index(self.url, storage_options=self._index_options)

    def _fragments(self, var: WritableVariable, written: dict[tuple[int, ...], str]) -> Fragments:
        """The fragment columns: those written now, those of the previous aggregation kept (as
        ``to_cfa(mode="r+")`` keeps them, unique values too), the rest missing."""
        grid = var._layout.grid(var.shape)
        previous = var._previous
        existing = None
        if previous is not None:  # the previous fragments on the grid grown since
            old = previous["variable"].aggregation
            frags = old.fragments
            for axis, (n, m) in enumerate(zip(frags.grid.grid_shape, grid.grid_shape)):
                if m > n:
                    frags = frags.grown(axis, grid.sizes[axis][n:])
            existing = replace(old, fragments=replace(frags, grid=grid))
        return fragment_columns(WriteSource(var.path, None, var.dims, var.dtype, {}, existing=existing), grid,
                                written)

    # -- mode="a": the aggregation as it is --------------------------------------------------------

    def _load(self, ds: dataset.Dataset) -> None:
        """Take over the dataset ``ds`` read: its structure, ordinary values and fragments."""
        nodes: dict[str, Any] = {"/": self}
        self.attrs.update(ds.attrs)
        for group in ds.walk():
            node = nodes[group.path] if group.path in nodes else None
            if node is None:
                parent = nodes[posixpath.dirname(group.path.rstrip("/")) or "/"]
                node = parent.createGroup(group.name)
                node.attrs.update(group.attrs)
                nodes[group.path] = node
            for name, dim in group.dimensions.items():
                made = node.createDimension(name, None if dim.unlimited else dim.size)
                made.size = dim.size
            for name, old in group.variables.items():
                self._load_variable(node, old)

    def _load_variable(self, node: Any, old: dataset.Variable) -> None:
        dims = tuple(old.dims)
        found = [node._find_dimension(d) for d in dims]
        attrs = dict(old.attrs)
        if not old.is_aggregated:
            var = WritableVariable(old.name, old.path, dims, found, np.dtype(old.dtype), attrs, self,
                                   aggregated=False, compression={}, fragment_shape=None, max_fragment_size=None)
            node.variables[old.name] = var
            values = old.characters.compute() if np.dtype(old.dtype).kind == "S" else old.data.compute()
            var._plain.put(tuple(slice(0, n) for n in var.shape), np.ma.asarray(values))
            return
        grid = old.fragments.grid
        offsets, steps = [list(o) for o in grid.offsets], []
        for i, row in enumerate(grid.sizes):
            step = max(row) if found[i].unlimited and row and max(row) else None
            if step is not None and len(row) and row[-1] < step:
                offsets[i].pop()  # the last fragment along an unlimited dimension grows to the others' length
            steps.append(step)
        var = WritableVariable(old.name, old.path, dims, found, np.dtype(old.dtype), attrs, self, aggregated=True,
                               compression={}, fragment_shape=None, max_fragment_size=None,
                               layout=_FragmentLayout(offsets, steps))
        var.__dict__["_previous"] = {"variable": old, "kept": set(grid.indices()), "stored": stored_values(old)}
        node.variables[old.name] = var


def _known_over(plain: WritableVariable, var: WritableVariable, where: tuple[slice, ...]) -> bool:
    """Whether every value of the ordinary variable ``plain`` that a fragment of ``var`` at ``where`` carries
    has been assigned (coordinates assigned after the data are in the aggregation file only)."""
    shape = plain.shape
    cut = []
    for d, n in zip(plain.dims, shape):
        if d in var.dims:
            s = where[var.dims.index(d)]
            if s.stop > n:
                return False
            cut.append(s)
        else:
            cut.append(slice(0, n))
    return bool(plain._plain.assigned[tuple(cut)].all())
