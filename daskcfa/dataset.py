"""A whole aggregation file, shaped like netCDF4-python's ``Dataset``.

Aggregated variables read through the fragment graph; ordinary variables
(coordinates, bounds, small data) read lazily from the aggregation file
itself. Instruction variables and the dimensions only they use are hidden:
users see the dataset the aggregation describes, not how it is stored.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import dask
from .lazy import dask_array as da
import netCDF4
import numpy as np

from . import storage
from .decode import Encoding, joined_dtype, text_encoding
from .arguments import nearest
from .errors import ArgumentError, CFAError, CFAFormatError, IndexingError, VariableNotFoundError, redact
from .formats import aggregated_variables, walk
from .formats.netcdf import OPEN_HINT_ATTR, data_dtype, find_dimension, group_path
from .fragments.chunk_index import indexed
from .fragments.manager import Budget
from .graph.read import to_dask
from .model import AggregatedVariable, Fragments
from .netcdf4_read import ReadDataset, ReadGroup, ReadVariable
from .storage.access import Access

__all__ = ["OpenedDataset", "Group", "Variable", "Dimension", "ordinary_values", "select_aggregated"]


@dataclass(frozen=True)
class Dimension:
    name: str
    size: int
    unlimited: bool = False

    def __len__(self) -> int:
        return self.size

    def isunlimited(self) -> bool:
        return self.unlimited


class FileVariableArray:
    """Lazily indexed ordinary variable of the aggregation file (reopened per read,
    so that dask arrays over it can be pickled to other processes)."""

    def __init__(self, url: str, path: str, shape: tuple[int, ...], dtype: np.dtype, *, mask: bool = True,
                 profile: storage.ProfileRef = storage.NO_PROFILE, strings: bool = True, scale: bool = True) -> None:
        self.url, self.path, self.shape, self.dtype, self.mask, self.profile = url, path, shape, dtype, mask, profile
        self.scale = scale
        self.strings = strings  # False: characters, even with _Encoding
        self.ndim = len(shape)

    def __dask_tokenize__(self) -> tuple:
        # the file's version, not the profile's name (it differs between processes: resuming must not)
        return (type(self).__name__, self.url, storage.version(self.url, self.profile), self.path, self.mask,
                self.scale, self.strings)

    def __getitem__(self, key: Any) -> np.ndarray:
        with storage.netcdf_file(self.url, profile=self.profile, whole=self.dtype.kind == "O") as ds:
            return self.read(ds, key)

    def read(self, ds: netCDF4.Dataset, key: Any = Ellipsis) -> np.ndarray:
        """``key`` of the variable, from its file ``ds`` already open (under the lock)."""
        var = ds[self.path]
        var.set_auto_mask(self.mask)
        var.set_auto_scale(self.scale)
        var.set_auto_chartostring(self.strings)
        data = var.getValue() if var.ndim == 0 and key in ((), Ellipsis) else var[key]
        return np.ma.asarray(data) if self.mask and np.ndim(data) else data


class _AttributeAccessors:
    """netCDF4-python's attribute accessors over an ``attrs`` dict."""

    attrs: dict[str, Any]
    path: str

    def ncattrs(self) -> list[str]:
        return list(self.attrs)

    def getncattr(self, name: str) -> Any:
        try:
            return self.attrs[name]
        except KeyError:
            raise AttributeError(f"{self.path!r} has no attribute {name!r}") from None

    def __getattr__(self, name: str) -> Any:
        """netCDF attributes as Python attributes (``ds.author``, ``var.units``), as netCDF4-python.

        Names the object itself defines (``name``, ``dims``, ``shape``...)
        come first; ``attrs`` / :meth:`getncattr` reach every attribute.
        """
        attrs = self.__dict__.get("attrs")  # (absent while unpickling)
        if attrs is None or name.startswith("__") or name not in attrs:
            raise AttributeError(f"{type(self).__name__} {self.__dict__.get('path', '')!r} has no attribute "
                                 f"{name!r}{nearest(name, attrs or ())}")
        return attrs[name]


class Variable(ReadVariable, _AttributeAccessors):
    """One variable, aggregated or not, like ``netCDF4.Variable``.

    ``dtype`` is the stored dtype (as netCDF4-python reports it); ``data``
    is a dask array of decoded values (masked, unpacked).
    """

    def __init__(self, name: str, path: str, dims: tuple[str, ...], shape: tuple[int, ...], dtype: np.dtype,
                 attrs: dict[str, Any], *, aggregation: AggregatedVariable | None = None, url: str = "",
                 access: Access | None = None) -> None:
        self.name, self.path, self.dims, self.shape, self.dtype = name, path, dims, shape, dtype
        self.attrs = attrs
        self.aggregation = aggregation
        self._url = url
        self._access = access or Access.default(url)
        self._data: da.Array | None = None

    @property
    def read_access(self) -> Access:
        """How this variable's files are read (profile, policy, missing fragments): readers
        built over the variable (the xarray backend, refragment) read as it does."""
        return self._access

    @property
    def dimensions(self) -> tuple[str, ...]:
        return self.dims

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def fragments(self) -> Fragments | None:
        """The fragment grid of an aggregated variable (``None`` for ordinary ones)."""
        return None if self.aggregation is None else self.aggregation.fragments

    @property
    def is_aggregated(self) -> bool:
        return self.aggregation is not None

    @property
    def data(self) -> da.Array:
        """Decoded values; a char variable with ``_Encoding`` as strings (netCDF4-python's rule)."""
        if self._data is None:
            self._data = self._dask(strings=True)
        return self._data

    @property
    def characters(self) -> da.Array:
        """:attr:`data`, but a char variable with ``_Encoding`` as its characters (its own
        shape): what a writer stores to keep the variable as it was."""
        return self._dask(strings=False)

    def _dask(self, *, strings: bool) -> da.Array:
        if self.aggregation is not None:
            return to_dask(self.aggregation, access=self._access, strings=strings, mask=self.auto_mask,
                           decode=self.auto_scale or not self._packed)
        shape, dtype = self.shape, _decoded_dtype(self) if self.auto_scale else self.dtype
        try:
            text = text_encoding(self.attrs, self.dtype, self.ndim) if strings else None
        except ValueError as exc:
            raise CFAFormatError(str(exc), file=self._url, variable=self.path) from None
        if text:  # netCDF4-python joins the string length: strings, one dimension fewer
            shape, dtype = shape[:-1], joined_dtype(text, shape[-1])
        array = FileVariableArray(self._url, self.path, shape, dtype, profile=self._access.profile, strings=strings,
                                  mask=self.auto_mask, scale=self.auto_scale)
        meta = np.empty((0,) * len(shape), dtype=dtype)
        meta = np.ma.MaskedArray(meta) if self.auto_mask else meta
        return da.from_array(array, chunks=shape or (), asarray=False, meta=meta,
                             name=f"cfa-file-{self.name}-{da.core.tokenize(array)}")

    def __getattr__(self, name: str) -> Any:
        attrs = self.__dict__.get("attrs", {})
        if name in attrs:
            return attrs[name]
        raise AttributeError(name)

    @property
    def _packed(self) -> bool:
        return self.dtype.kind in "biuf" and Encoding.from_attrs(self.attrs, self.dtype).is_packed

    def __getitem__(self, key: Any) -> np.ndarray:
        self.check_open()
        if self.auto_mask and not self.auto_scale and self._packed:
            raise ArgumentError("masking without unpacking is not supported: set_auto_maskandscale(False) "
                                "reads the stored values", file=self._url or None, variable=self.path)
        from .graph.masked import plain_masked  # (with dask.array's dispatch: not for metadata-only work)

        try:
            selected = orthogonal(self.data, key)
        except CFAError as exc:
            raise exc.located(file=self._url or None, variable=self.path)
        return plain_masked(_result(selected))

    def getValue(self) -> Any:
        """netCDF4-python's way to read a scalar variable."""
        return self[...]

    def __setitem__(self, key: Any, values: Any) -> None:
        raise ArgumentError(f"{self.path} was opened for reading: open the dataset with mode 'a' or 'r+' "
                            "(daskcfa.Dataset(url, 'a')) to write to it", file=self._url or None)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:
        kind = f"aggregated, {len(self.fragments)} fragments in a {self.fragments.shape} grid" if self.fragments else "ordinary"
        dims = ", ".join(f"{d}: {n}" for d, n in zip(self.dims, self.shape))
        return f"<daskcfa.Variable {self.path} ({dims}) {self.dtype} [{kind}]>"


def ordinary_values(var: Variable, ds: netCDF4.Dataset) -> np.ndarray:
    """An ordinary variable's values (masked, unpacked; a char variable's characters) read from its
    aggregation file ``ds``, open already (under the lock): a writer taking a dataset over reads the
    file once, not once more per variable."""
    array = FileVariableArray(var._url, var.path, var.shape, var.dtype, profile=var._access.profile, strings=False)
    return array.read(ds)


def orthogonal(x: da.Array, key: Any) -> da.Array:
    """``x[key]`` by netCDF4-python's index rules: integer and boolean sequences select along their own
    dimension each (orthogonally: numpy's rule pairs them, and dask refuses two), a 0-d integer array is
    an integer, and a scalar takes any one index."""
    try:
        return _orthogonal(x, key if isinstance(key, tuple) else (key,))
    except CFAError:
        raise
    except IndexError as exc:  # (dask's, as numpy's)
        raise IndexingError(str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"unusable index: {exc}") from None


def _orthogonal(x: da.Array, key: tuple) -> da.Array:
    if x.ndim == 0:
        if len(key) > 1:
            raise ArgumentError(f"too many indices ({len(key)}) for a scalar variable")
        return x
    key = tuple(int(k) if isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu" else k for k in key)
    sequences = [i for i, k in enumerate(key) if not _basic(k)]
    if len(sequences) <= 1:
        return x[key]
    out = x[tuple(slice(None) if i in sequences else k for i, k in enumerate(key))]
    consumed = sum(k is not None and k is not Ellipsis for k in key)
    axis, axes = 0, {}
    for i, k in enumerate(key):
        if k is Ellipsis:
            axis += x.ndim - consumed
        elif not integer_index(k):
            axes[i] = axis
            axis += 1
    for i in sequences:
        out = out[(slice(None),) * axes[i] + (np.asarray(key[i]),)]
    return out


def _basic(k: Any) -> bool:
    return k is None or k is Ellipsis or isinstance(k, slice) or integer_index(k)


def integer_index(k: Any) -> bool:
    """Whether ``k`` indexes by an integer (dropping its dimension); ``True`` and ``False`` do not."""
    return isinstance(k, (int, np.integer)) and not isinstance(k, bool)


def _result(x: da.Array) -> np.ndarray:
    """``x`` computed: in memory, or, when it is larger than the process's memory budget and a cache
    directory is configured (dask config ``daskcfa.io.cache-location``, else S3netCDF4's
    ``cache_location``), as ``numpy.memmap`` files there (S3netCDF4's behaviour for big reads).

    The files are unlinked as soon as they are mapped: the memory map keeps them while the result
    lives, and nothing is left behind.
    """
    directory = dask.config.get("daskcfa.io.cache-location", None) or storage.cache_location()
    if directory is None or x.dtype.kind not in "biufc" or x.nbytes <= Budget.from_config().memory:
        return x.compute()
    os.makedirs(directory, exist_ok=True)
    values, mask = (_memory_map(directory, x.shape, dtype) for dtype in (x.dtype, np.dtype(bool)))
    da.store([x.map_blocks(np.ma.getdata, dtype=x.dtype), x.map_blocks(np.ma.getmaskarray, dtype=bool)],
             [values, mask], lock=False)
    return np.ma.MaskedArray(values, mask=mask, copy=False) if mask.any() else values


def _memory_map(directory: str, shape: tuple[int, ...], dtype: np.dtype) -> np.memmap:
    handle, path = tempfile.mkstemp(prefix="daskcfa-read-", suffix=".dat", dir=directory)
    os.close(handle)
    try:
        return np.memmap(path, dtype=dtype, mode="w+", shape=shape)
    finally:
        os.unlink(path)


def _decoded_dtype(var: Variable) -> np.dtype:
    if var.dtype.kind not in "biuf":
        return var.dtype
    return Encoding.from_attrs(var.attrs, var.dtype).decoded_dtype


@dataclass
class Group(ReadGroup, _AttributeAccessors):
    """A group: dimensions, variables, sub-groups and attributes."""

    name: str
    path: str
    attrs: dict[str, Any] = field(default_factory=dict)
    dimensions: dict[str, Dimension] = field(default_factory=dict)
    variables: dict[str, Variable] = field(default_factory=dict)
    groups: dict[str, "Group"] = field(default_factory=dict)
    parent: "Group | None" = field(default=None, repr=False)

    def __getitem__(self, path: str) -> "Variable | Group":
        node: Any = self
        parts = [p for p in path.split("/") if p]
        if path.startswith("/"):
            while node.parent is not None:
                node = node.parent
        for i, part in enumerate(parts):
            if i == len(parts) - 1 and part in node.variables:
                return node.variables[part]
            if part not in node.groups:
                names = [*node.variables, *node.groups] if i == len(parts) - 1 else list(node.groups)
                what = "variable or group" if i == len(parts) - 1 else "group"
                raise VariableNotFoundError(
                    f"{path!r} does not exist: group {node.path!r} has no {what} {part!r}{nearest(part, names)}; "
                    f"its {what.replace('variable or group', 'variables and group')}s: {', '.join(names) or 'none'}",
                    file=self._root().url or None)
            node = node.groups[part]
        return node

    def _root(self) -> Any:
        node: Any = self
        while node.parent is not None:
            node = node.parent
        return node

    def __contains__(self, path: str) -> bool:
        try:
            self[path]
        except KeyError:
            return False
        return True

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise ArgumentError("the dataset was opened for reading: open it with mode 'w', 'a' or 'r+' "
                            "(daskcfa.Dataset(url, 'a')) to change it", file=self._root().url or None)

    createDimension = createVariable = createGroup = setncattr = setncatts = delncattr = _read_only

    @property
    def aggregated_variables(self) -> dict[str, Variable]:
        """Aggregated variables of this group and all sub-groups, by path."""
        found = {v.path: v for v in self.variables.values() if v.is_aggregated}
        for group in self.groups.values():
            found.update(group.aggregated_variables)
        return found

    def walk(self) -> Iterator["Group"]:
        yield self
        for group in self.groups.values():
            yield from group.walk()


class OpenedDataset(ReadDataset, Group):
    """An opened aggregation file: its tree of groups, dimensions, variables and attributes, read
    lazily. What ``daskcfa.Dataset(url)`` and :func:`daskcfa.open_cfa` give is one (the public
    ``daskcfa.Dataset``, :class:`daskcfa.netcdf4.Dataset`, adds netCDF4-python's constructor and
    its modes); the operations over an aggregation open one directly."""

    url: str = ""

    @classmethod
    def open(cls, url: str, *, access: Access, chunk_index: bool | str | None = False,
             contents: bytes | None = None) -> "OpenedDataset":
        """The dataset of the aggregation file at ``url``; its variables read with ``access`` and,
        as ``chunk_index`` asks (see :func:`daskcfa.from_cfa`), the chunk index beside the file.
        ``contents``: the bytes of an earlier version of the file, its references still relative to ``url``."""
        with storage.netcdf_file(url, profile=access.profile, whole=True, contents=contents) as ds:
            root = cls.from_netcdf(ds, url, access)
        if chunk_index is not False and root.aggregated_variables:  # (once the file is read, outside the lock)
            access = indexed(url, access, chunk_index)
            for group in root.walk():
                for var in group.variables.values():
                    var._access = access
        return root

    @classmethod
    def from_netcdf(cls, ds: netCDF4.Dataset, url: str, access: Access) -> "OpenedDataset":
        """The dataset of the aggregation file ``ds`` at ``url``, open already (under the lock)."""
        try:
            return _build(cls, ds, url, access)
        except CFAError:
            raise
        except (KeyError, IndexError, ValueError, TypeError, RuntimeError) as exc:
            raise CFAFormatError(f"malformed aggregation file ({type(exc).__name__}: {exc})", file=url) from exc

    def __enter__(self) -> "OpenedDataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        lines = [f"<daskcfa.Dataset {redact(self.url)}>"]
        for group in self.walk():
            for var in group.variables.values():
                lines.append(f"  {var!r}")
        return "\n".join(lines)


def select_aggregated(ds: OpenedDataset, variables: Sequence[str] | None, url: str) -> list[AggregatedVariable]:
    """The aggregated variables of ``ds`` named in ``variables`` (``tas`` or ``/grp/tas``; None: all): the
    one reading of the ``variables`` argument of the operations over fragments (index, verify, references)."""
    found = {path: var.aggregation for path, var in ds.aggregated_variables.items()}
    if variables is None:
        return list(found.values())
    chosen = []
    for name in variables:
        path = name if name.startswith("/") else f"/{name}"
        if path not in found:
            raise VariableNotFoundError(f"{name!r} is not an aggregated variable; aggregated variables: "
                                        f"{', '.join(sorted(found)) or 'none'}", file=url)
        chosen.append(found[path])
    return chosen


def _attrs(obj: Any) -> dict[str, Any]:
    return {k: obj.getncattr(k) for k in obj.ncattrs()}


def _build(cls: type, ds: netCDF4.Dataset, url: str, access: Access) -> OpenedDataset:
    aggregated = aggregated_variables(ds, url)
    hidden: set[str] = set()
    for agg in aggregated.values():
        hidden |= set(agg.extra.get("instructions", ()))
    hidden_groups = {h.rstrip("/") for h in hidden}
    used_dims: set[int] = set()
    groups: dict[str, Group] = {}
    root: OpenedDataset | None = None
    for nc_group in walk(ds):
        path = group_path(nc_group)
        if any(path.rstrip("/") == h or path.startswith(h + "/") for h in hidden_groups if h):
            continue
        parent = groups.get(group_path(nc_group.parent)) if nc_group.parent is not None else None
        if parent is None and nc_group.parent is not None:
            continue
        if parent is None:
            group = cls.__new__(cls)  # (daskcfa.netcdf4.Dataset's constructor opens files: build field by field)
            attrs = _attrs(nc_group)
            attrs.pop(OPEN_HINT_ATTR, None)  # (of the file, not of the data: never copied on)
            Group.__init__(group, name="/", path="/", attrs=attrs)
        else:
            group = Group(name=nc_group.name, path=path.rstrip("/"), attrs=_attrs(nc_group), parent=parent)
        if parent is None:
            root = group
            group.url, group.file_format, group.data_model = url, ds.file_format, ds.data_model
        else:
            parent.groups[nc_group.name] = group
        groups[path] = group
        for var in nc_group.variables.values():
            var_path = path + var.name
            if var_path in hidden:
                continue
            agg = aggregated.get(var_path)
            if agg is not None:
                dims, shape, attrs = agg.dims, agg.shape, dict(agg.attrs)
                for name in dims:
                    used_dims.add(id(find_dimension(nc_group, name)))
            else:
                dims, shape, attrs = tuple(var.dimensions), tuple(var.shape), _attrs(var)
                used_dims.update(id(d) for d in var.get_dims())
            group.variables[var.name] = Variable(var.name, var_path, dims, shape, data_dtype(var), attrs,
                                                 aggregation=agg, url=url, access=access)
            if agg is None:
                group.variables[var.name].stored = (var.chunking(), var.filters())
    for path, group in groups.items():
        nc_group = ds if path == "/" else ds[path.rstrip("/")]
        for name, dim in nc_group.dimensions.items():
            if id(dim) in used_dims or not _only_instructions(nc_group, dim, hidden):
                group.dimensions[name] = Dimension(name, len(dim), dim.isunlimited())
    assert root is not None
    return root


def _only_instructions(group: netCDF4.Group, dim: Any, hidden: set[str]) -> bool:
    """Whether ``dim`` is used by instruction variables and by nothing else."""
    users = [group_path(v.group()) + v.name for g in walk(group) for v in g.variables.values() if dim in v.get_dims()]
    return bool(users) and all(u in hidden for u in users)
