"""netCDF-4's conventions over HDF5, read with h5py's low-level API or from the metadata
:mod:`.hdf5_meta` parsed: which datasets are variables, their dimension names (dimension
scales), the attributes netCDF-C hides, attribute values as netCDF4-python reports them,
and the numeric types a direct read supports.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Mapping

import numpy as np

from ..lazy import h5py
from .hdf5_meta import FLOAT_SIZES, INTEGER_SIZES, AttributeMeta, DatasetMeta, HDF5Meta, NotMine

__all__ = ["DirectReadUnsupported", "NetCDFAttributes", "NON_COORD_PREFIX", "ParsedAttributes", "open_dataset",
           "attribute_names", "is_dimension_only", "check_dtype", "check_dimensions", "dimension_names",
           "parsed_variable"]

#: netCDF-C renames a variable whose name clashes with an unrelated dimension.
NON_COORD_PREFIX = "_nc4_non_coord_"
#: ``NAME`` of a dimension scale that is a netCDF dimension but not a variable.
_DIMENSION_ONLY = b"This is a netCDF dimension but not a netCDF variable"

#: Attributes that netCDF-C keeps for itself and netCDF4-python never reports.
_HIDDEN_ATTRS = frozenset(
    {
        "CLASS",
        "NAME",
        "DIMENSION_LIST",
        "REFERENCE_LIST",
        "_Netcdf4Dimid",
        "_Netcdf4Coordinates",
        "_nc3_strict",
        "_NCProperties",
        "_IsNetcdf4",
        "_SuperblockVersion",
        "_Codecs",
    }
)


class DirectReadUnsupported(Exception):
    """Raised when a variable cannot be read directly; the caller falls back to netCDF4."""


def open_dataset(fid: h5py.h5f.FileID, path: str) -> h5py.h5d.DatasetID | None:
    """The dataset at ``path``, or None when nothing (or something else) is there."""
    try:
        obj = h5py.h5o.open(fid, path.encode())
    except (KeyError, ValueError):  # no such link, or a path through a non-group
        return None
    return obj if isinstance(obj, h5py.h5d.DatasetID) else None


def attribute_names(dsid: h5py.h5d.DatasetID) -> frozenset[str]:
    """Every attribute name of a dataset, netCDF-C's own included: one call, which answers
    what asking for each (a dimension scale's, the attributes decoding may use) would."""
    names: set[str] = set()
    h5py.h5a.iterate(dsid, lambda raw: names.add(raw.decode("utf-8", errors="replace")))
    return frozenset(names)


def is_dimension_only(dsid: h5py.h5d.DatasetID, names: frozenset[str]) -> bool:
    """Whether a dataset with attributes ``names`` is a netCDF dimension but not a variable."""
    if "NAME" not in names:
        return False
    return _names_dimension_only(_read_attr(h5py.h5a.open(dsid, b"NAME")))


def _names_dimension_only(name: Any) -> bool:
    """Whether a dimension scale's ``NAME`` says it is a netCDF dimension but not a variable."""
    return isinstance(name, bytes) and name.startswith(_DIMENSION_ONLY)


def check_dtype(dsid: h5py.h5d.DatasetID, where: str) -> np.dtype:
    """The numpy dtype of a plain numeric dataset; anything else is unsupported."""
    stored = dsid.get_type()
    plain = _plain(stored)
    if plain is not None:
        return plain[0]
    dtype = stored.dtype
    if dtype.kind in "iuf" and h5py.check_enum_dtype(dtype) is None:
        # the bytes on disk must be exactly this numpy type (no odd precision or
        # padding); the byte order of one-byte types is moot (netCDF-C sets it)
        if stored.equal(_native_type(dtype, stored.get_order() if dtype.itemsize == 1 else None)):
            return dtype
    raise DirectReadUnsupported(f"data type {dtype} is not supported ({where})")


def _plain(tid: h5py.h5t.TypeID) -> tuple[np.dtype, h5py.h5t.TypeID] | None:
    """The numpy dtype of an HDF5 type that is exactly one of the common integer and float types,
    and that type made once (None: another type). Told by class, size, sign and byte order, then
    found equal by HDF5: h5py's dtype of a type, and its type of a dtype, cost several times more."""
    kind = tid.get_class()
    if kind != h5py.h5t.INTEGER and kind != h5py.h5t.FLOAT:  # (enumerations are a class of their own)
        return None
    plain = _plain_type(kind, tid.get_size(), tid.get_sign() if kind == h5py.h5t.INTEGER else None, tid.get_order())
    return plain if plain is not None and tid.equal(plain[1]) else None


@functools.lru_cache(maxsize=64)
def _plain_type(kind: int, size: int, sign: int | None, order: int) -> tuple[np.dtype, h5py.h5t.TypeID] | None:
    """The numpy dtype and HDF5 type of an integer (``sign`` given) or float ``kind`` of HDF5's of
    ``size`` bytes in byte ``order`` (None: not one of the common ones)."""
    if size not in (INTEGER_SIZES if sign is not None else FLOAT_SIZES) or (
            size > 1 and order not in (h5py.h5t.ORDER_LE, h5py.h5t.ORDER_BE)):
        return None
    letter = "f" if sign is None else "i" if sign == h5py.h5t.SGN_2 else "u"
    dtype = np.dtype(f"{'>' if order == h5py.h5t.ORDER_BE else '<'}{letter}{size}")
    return dtype, _native_type(dtype, order if size == 1 else None)


@functools.lru_cache(maxsize=64)
def _native_type(dtype: np.dtype, order: int | None) -> h5py.h5t.TypeID:
    """HDF5's type for numeric ``dtype`` (in byte ``order`` if given), made once per process."""
    expected = h5py.h5t.py_create(dtype).copy()
    if order is not None:
        expected.set_order(order)
    return expected


def check_dimensions(dsid: h5py.h5d.DatasetID, rank: int, names: frozenset[str], where: str) -> None:
    """The cheap part of :func:`dimension_names`'s checks, done when a variable of ``rank``
    dimensions and attributes ``names`` is opened (told: asking HDF5 again costs more than the checks)."""
    if rank == 0:
        return
    if "CLASS" in names and _is_scale(dsid, where):
        if rank > 1:
            raise DirectReadUnsupported(f"multi-dimensional coordinate variables are not supported ({where})")
    elif "DIMENSION_LIST" not in names:
        raise DirectReadUnsupported(f"a dimension has no dimension scale ({where})")


def dimension_names(dsid: h5py.h5d.DatasetID, names: frozenset[str], where: str) -> tuple[str, ...]:
    """netCDF dimension names, from the dimension scales attached to dataset ``dsid`` (attribute
    ``names``: :func:`attribute_names`). Read with the low-level API: h5py's ``Dataset`` and its
    ``attrs`` cost twice as much, paid for every fragment whose shape has two equal sizes."""
    ndim = dsid.rank
    if ndim == 0:
        return ()
    if "CLASS" in names and _is_scale(dsid, where):
        # A coordinate variable is its own dimension scale; netCDF-C records the
        # other dimensions of a multi-dimensional one only by dimension id.
        if ndim == 1:
            return (h5py.h5i.get_name(dsid).decode().rpartition("/")[2],)
        raise DirectReadUnsupported(f"multi-dimensional coordinate variables are not supported ({where})")
    scales = _dimension_list(dsid, where) if "DIMENSION_LIST" in names else None  # object references, a list per axis
    if scales is None or len(scales) != ndim or not all(len(refs) for refs in scales):
        raise DirectReadUnsupported(f"a dimension has no dimension scale ({where})")
    found = []
    for refs in scales:
        path = h5py.h5r.get_name(refs[0], dsid).decode()  # 3x faster than dataset.dims
        found.append(_dimension_name(path.rpartition("/")[2]))
    return tuple(found)


#: The ``CLASS`` of a dimension scale, as HDF5 writes it (a 16-byte NUL-terminated string).
_SCALE_CLASS = b"DIMENSION_SCALE"


def _is_scale(dsid: h5py.h5d.DatasetID, where: str) -> bool:
    """Whether ``dsid`` (which has a ``CLASS`` attribute) is a dimension scale, told as HDF5's
    ``H5DSis_scale`` tells it: a 16-byte NUL-terminated string whose text is a prefix of
    :data:`_SCALE_CLASS`. Not that function: HDF5 2.0's frees its buffer twice when such a string
    holds anything else, aborting the process, and a hostile file must not kill the reader.
    Raises ValueError where HDF5 would read past its buffer (not one value)."""
    aid = h5py.h5a.open(dsid, b"CLASS")
    tid = aid.get_type()
    if (not isinstance(tid, h5py.h5t.TypeStringID) or tid.is_variable_str()
            or tid.get_strpad() != h5py.h5t.STR_NULLTERM or tid.get_size() != len(_SCALE_CLASS) + 1):
        return False
    space = aid.get_space()
    if space.get_simple_extent_type() == h5py.h5s.NULL or space.get_simple_extent_npoints() != 1:
        raise ValueError(f"its CLASS attribute is not one string ({where})")
    raw = np.empty((), f"S{tid.get_size()}")
    aid.read(raw, mtype=tid)
    text = raw.tobytes().partition(b"\0")[0]
    return _SCALE_CLASS.startswith(text[:len(_SCALE_CLASS)])


def _dimension_name(link: str) -> str:
    """The netCDF dimension a dimension scale linked as ``link`` stands for."""
    return link.removeprefix(NON_COORD_PREFIX)


@functools.cache
def _reference_lists() -> np.dtype:
    """numpy's type of a ``DIMENSION_LIST``: a variable-length list of object references per axis
    (h5py's types: made when h5py reads a file, not when this module is imported)."""
    return h5py.vlen_dtype(h5py.ref_dtype)


def _dimension_list(dsid: h5py.h5d.DatasetID, where: str) -> np.ndarray:
    """The ``DIMENSION_LIST`` attribute's lists of references. Raises ValueError when it is not a
    one-dimensional list of object references: a damaged file, not one for netCDF-C to try (it
    crashed the process on such a file, seen once)."""
    aid = h5py.h5a.open(dsid, b"DIMENSION_LIST")
    tid, space = aid.get_type(), aid.get_space()
    if (tid.get_class() != h5py.h5t.VLEN or not tid.get_super().equal(h5py.h5t.STD_REF_OBJ)
            or space.get_simple_extent_type() != h5py.h5s.SIMPLE or len(space.shape) != 1):
        raise ValueError(f"its DIMENSION_LIST attribute is not a list of dimension scale references ({where})")
    lists = np.empty(space.shape, _reference_lists())
    aid.read(lists, mtype=h5py.h5t.py_create(_reference_lists()))
    return lists


class _Attributes(Mapping[str, Any]):
    """Attribute values, each read (:meth:`_value`) on first use and remembered."""

    _values: dict[str, Any]

    def _value(self, name: str) -> Any:
        raise NotImplementedError

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            pass
        if name not in self:
            raise KeyError(name)
        value = self._values[name] = self._value(name)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        # (decoding asks for attributes most variables lack: no exception raised for each)
        return self[name] if name in self else default


class NetCDFAttributes(_Attributes):
    """A variable's attributes as netCDF4-python reports them (see its ``_get_att``).

    Each value is read on first use: decoding needs a few of them, and reading
    every attribute of every fragment would cost more than finding its chunk.
    An attribute of a type netCDF4-python reads but this reader does not raises
    :class:`DirectReadUnsupported` when read.
    """

    def __init__(self, dsid: h5py.h5d.DatasetID, where: str, names: frozenset[str] | None = None) -> None:
        # ``names``: :func:`attribute_names`, when the caller has them
        self._dsid = dsid
        self._where = where
        self._values: dict[str, Any] = {}
        self._names: list[str] | None = None
        self._present: frozenset[str] | None = None if names is None else names - _HIDDEN_ATTRS

    def _value(self, name: str) -> Any:
        return _netcdf_attr(h5py.h5a.open(self._dsid, name.encode()), name, self._where)

    def __contains__(self, name: object) -> bool:
        if self._present is None:  # every name in one call: decoding asks for ten, most absent
            self._present = attribute_names(self._dsid) - _HIDDEN_ATTRS
        return name in self._present

    def __iter__(self) -> Iterator[str]:
        if self._names is None:
            tracked = self._dsid.get_create_plist().get_attr_creation_order() & h5py.h5p.CRT_ORDER_TRACKED
            order = h5py.h5.INDEX_CRT_ORDER if tracked else h5py.h5.INDEX_NAME
            names: list[str] = []
            h5py.h5a.iterate(self._dsid, lambda name: names.append(name.decode("utf-8", errors="replace")),
                             index_type=order)
            self._names = [name for name in names if name not in _HIDDEN_ATTRS]
        return iter(self._names)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _netcdf_attr(aid: h5py.h5a.AttrID, name: str, where: str) -> Any:
    # (the type and dataspace asked for once: each h5py call costs microseconds, and every
    # fragment's units are read)
    tid = aid.get_type()
    space = aid.get_space()
    if isinstance(tid, h5py.h5t.TypeStringID):
        if space.get_simple_extent_type() == h5py.h5s.NULL:
            return ""
        if tid.is_variable_str():
            return _strings(np.ravel(_read_attr(aid, tid, space)))
        # NC_CHAR: read the bytes as stored, NULs and all, as netCDF-C does
        raw = np.empty(space.shape, f"S{tid.get_size()}")
        aid.read(raw, mtype=tid)
        return _text(raw.tobytes())
    if isinstance(tid, (h5py.h5t.TypeIntegerID, h5py.h5t.TypeFloatID)):  # not enums
        plain = _plain(tid)
        if plain is None and isinstance(tid, h5py.h5t.TypeFloatID) and tid.get_size() not in FLOAT_SIZES:
            # (16- and 128-bit floats: netCDF-C has no such type and shows no such attribute)
            raise DirectReadUnsupported(f"attribute {name!r} is a {8 * tid.get_size()}-bit float ({where})")
        native = (tid.dtype if plain is None else plain[0]).newbyteorder("=")
        if space.shape is None:  # an HDF5 null dataspace
            return np.empty(0, native)
        return _numbers(_read_attr(aid, tid, space, plain), native)
    raise DirectReadUnsupported(f"attribute {name!r} has an unsupported type ({where})")


def _strings(values: Any) -> str | list[str]:
    """Variable-length strings as netCDF4-python shows them: one string, or a list."""
    strings = [_text(s) for s in values]
    return strings[0] if len(strings) == 1 else strings


def _numbers(values: Any, native: np.dtype) -> Any:
    """Numbers as netCDF4-python shows them: one number, or a flat array."""
    values = np.asarray(values, native).ravel()
    return values[0] if values.size == 1 else values


def _read_attr(aid: h5py.h5a.AttrID, tid: h5py.h5t.TypeID | None = None, space: h5py.h5s.SpaceID | None = None,
               plain: tuple[np.dtype, h5py.h5t.TypeID] | None = None) -> Any:
    """An attribute's value as numpy (variable-length strings as ``bytes`` objects); its type,
    dataspace and :func:`_plain` type when the caller has them."""
    shape = (aid.get_space() if space is None else space).shape
    if plain is None:
        dtype = (aid.get_type() if tid is None else tid).dtype
        plain = dtype, h5py.h5t.py_create(dtype)
    dtype, mtype = plain
    value = np.zeros(shape if shape is not None else (), dtype)
    aid.read(value, mtype=mtype)
    return value[()] if shape == () else value


def _text(value: str | bytes) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value.replace("\x00", "")


# -- from parsed metadata (:mod:`.hdf5_meta`) ----------------------------------------------------


class ParsedAttributes(_Attributes):
    """:class:`NetCDFAttributes` from parsed metadata (each value converted on first use)."""

    def __init__(self, attributes: Mapping[str, AttributeMeta], where: str) -> None:
        self._attributes = attributes
        self._where = where
        self._values: dict[str, Any] = {}
        self._names = [name for name in attributes if name not in _HIDDEN_ATTRS]

    def _value(self, name: str) -> Any:
        return _parsed_value(self._attributes[name], name, self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._attributes and name not in _HIDDEN_ATTRS

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _parsed_value(attr: AttributeMeta, name: str, where: str) -> Any:
    """An attribute's value as netCDF4-python shows it (the rules of :func:`_netcdf_attr`)."""
    if attr.kind == "null-string":
        return ""
    if attr.kind == "vstrings":
        return _strings(attr.value)
    if attr.kind == "string":
        return _text(attr.value)
    if attr.kind == "number":
        return _numbers(attr.value, attr.value.dtype.newbyteorder("="))
    if attr.kind == "null-number":
        return np.empty(0, attr.value.newbyteorder("="))
    raise DirectReadUnsupported(f"attribute {name!r} has an unsupported type ({where})")


def parsed_variable(meta: HDF5Meta, group: str, base: str) -> tuple[DatasetMeta, tuple[str, ...]] | None:
    """The netCDF variable ``base`` of ``group`` (``"/"``, ``"/g/"``) and its dimension names, as the
    h5py path finds them (None: no such variable). Raises :class:`NotMine` wherever the h5py path
    would refuse, fail or might answer otherwise."""
    dataset = meta.dataset(group + base)
    if dataset is not None and "NAME" in dataset.attributes:
        name = dataset.attributes["NAME"]
        if name.kind != "string" or name.shape != ():
            raise NotMine("a NAME attribute of another type")
        if _names_dimension_only(bytes(np.bytes_(name.value))):
            dataset = meta.dataset(group + NON_COORD_PREFIX + base)
    if dataset is None:
        return None
    ndim = len(dataset.shape)
    if ndim == 0:
        return dataset, ()
    scale = dataset.attributes.get("CLASS")
    if scale is not None:  # (told as HDF5's H5DSis_scale tells it when the value is exactly what it writes)
        if (scale.kind, scale.shape, scale.string_type) != ("string", (), (len(_SCALE_CLASS) + 1, 0, 0)) or (
                scale.value != _SCALE_CLASS + b"\0"):
            raise NotMine("a CLASS attribute other than a dimension scale's")
        if ndim > 1:
            raise NotMine("a multi-dimensional coordinate variable")
        return dataset, (dataset.link,)
    refs = dataset.attributes.get("DIMENSION_LIST")
    if refs is None or refs.kind != "references" or refs.shape != (ndim,) or not all(refs.value):
        raise NotMine("no usable DIMENSION_LIST")
    # HDF5 names an object by a path to it: one path only when it has one link, found in the groups
    # from the variable's to the root (netCDF's dimension scoping)
    groups = [meta.group_links(group)]
    parts = [p for p in group.split("/") if p]
    groups += [meta.group_links("/" + "/".join(parts[:i]) + "/") for i in range(len(parts) - 1, -1, -1)]
    dims = []
    for lists in refs.value:
        matches = [name for links in groups for name, target in links.items() if target == lists[0]]
        if len(matches) != 1 or meta.reference_count(lists[0]) != 1:
            raise NotMine("a dimension scale not found once")
        try:
            dims.append(_dimension_name(matches[0].decode()))
        except UnicodeDecodeError:
            raise NotMine("a dimension scale's name is not UTF-8") from None
    return dataset, tuple(dims)
