"""Small helpers over netCDF4-python objects shared by the dialect parsers.

They read instruction variables into plain numpy columns and resolve names
the way CF asks (group search), raising :class:`CFAFormatError` with the
file and variable named.
"""

from __future__ import annotations

import math
import os
import warnings
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import netCDF4
import numpy as np

from ..lazy import h5py
from ..decode import Encoding, chars_to_strings
from ..errors import CFAFormatError, CFAWarning, redact
from ..model import FragmentGrid
from ..limits import STRING_BYTES, charge, check_array_size, check_fragment_count, remaining

#: Longest string an instruction variable may hold (URIs are far shorter).
MAX_STRING_LENGTH = 1 << 16
#: Most vlen strings read at once; the file size when it cannot be told (a remote file in memory).
_VLEN_PIECE = 1 << 16
_UNKNOWN_FILE_BYTES = 1 << 20

#: Attributes that carry aggregation instructions, never data attributes.
INSTRUCTION_ATTRS = frozenset(
    {
        "aggregated_dimensions",
        "aggregated_data",
        "cf_role",
        "cfa_dimensions",
        "cf_dimensions",
        "cfa_array",
        "cfa_group",
        "nca_dimensions",
        "nca_array",
    }
)

#: The global attribute daskcfa writes into aggregation files for whoever opens one with a netCDF tool
#: (ncdump, xarray's netCDF engines), which shows the instructions, not the aggregated data. It says
#: something of the file, not of the data: readers leave it out of the dataset's attributes.
OPEN_HINT_ATTR = "daskcfa_how_to_open"
OPEN_HINT = ("this file aggregates fragment files (CFA): for the aggregated variables open it with "
             "daskcfa.from_cfa(url) or xarray.open_dataset(url, engine='daskcfa')")


def group_path(group: netCDF4.Group) -> str:
    path = group.path
    return path if path.endswith("/") else path + "/"


def variable_path(var: netCDF4.Variable) -> str:
    return group_path(var.group()) + var.name


def source_of(group: netCDF4.Group) -> str:
    while group.parent is not None:
        group = group.parent
    return group.filepath()


def root_of(group: netCDF4.Group) -> netCDF4.Group:
    while group.parent is not None:
        group = group.parent
    return group


def find_group(group: netCDF4.Group, path: str) -> netCDF4.Group | None:
    """Resolve a group path relative to ``group`` (or absolute)."""
    if path.startswith("/"):
        group, path = root_of(group), path[1:]
    for part in filter(None, path.split("/")):
        if part == "..":
            group = group.parent
        elif part == ".":
            continue
        else:
            group = group.groups.get(part)
        if group is None:
            return None
    return group


def _find(group: netCDF4.Group, name: str, table: str) -> Any:
    if "/" in name:
        head, _, base = name.rpartition("/")
        owner = find_group(group, head or "/")
        return None if owner is None else getattr(owner, table).get(base)
    while group is not None:
        if name in getattr(group, table):
            return getattr(group, table)[name]
        group = group.parent
    return None


def find_variable(group: netCDF4.Group, name: str) -> netCDF4.Variable | None:
    """Find ``name`` by CF group search: absolute path, relative path, or a bare
    name looked up in ``group`` and then in each ancestor group."""
    return _find(group, name, "variables")


def find_dimension(group: netCDF4.Group, name: str) -> netCDF4.Dimension | None:
    """Find dimension ``name`` in ``group`` or its ancestors (netCDF scoping)."""
    return _find(group, name, "dimensions")


def require_variable(group: netCDF4.Group, name: str, *, variable: str, role: str) -> netCDF4.Variable:
    var = find_variable(group, name)
    if var is None:
        raise _missing(group, f"{role} variable {name!r} named by the aggregation instructions", variable)
    return var


def _missing(group: netCDF4.Group, what: str, variable: str) -> CFAFormatError:
    return CFAFormatError(f"{what} does not exist", file=source_of(group), variable=variable)


def _where(var: netCDF4.Variable, owner: str | None) -> dict[str, str]:
    return {"file": source_of(var.group()), "variable": owner or variable_path(var)}


def check_size(var: netCDF4.Variable, *, owner: str | None = None) -> None:
    """Charge what reading a whole instruction variable allocates, from its declared shape,
    before reading it (vlen strings, whose declared shape says nothing of their length, are
    charged piece by piece as :func:`read_values` reads them)."""
    shape = tuple(int(n) for n in var.shape)
    where = _where(var, owner)
    if var.dtype == str:
        return
    dtype = np.dtype(var.dtype)
    if dtype.kind == "S" and shape:  # char array: last dim is the length
        if shape[-1] > MAX_STRING_LENGTH:
            raise CFAFormatError(f"variable {var.name!r} holds strings of {shape[-1]:,} characters", **where)
        # the characters, their unicode copy (4 bytes each) and one str object per string
        per_value = 5 * shape[-1] + STRING_BYTES
        shape = shape[:-1]
    else:  # the values, an int64 copy and a mask
        per_value = dtype.itemsize + 9
    count = math.prod(shape)
    charge(count * per_value, f"instruction variable {var.name!r} of shape {tuple(var.shape)} ({count:,} values)",
           **where)


def read_values(var: netCDF4.Variable, *, owner: str | None = None) -> Any:
    """All of a variable's values (netCDF4's masking on), after charging their memory."""
    if var.dtype == str:
        return _read_vlen(var, owner)
    check_size(var, owner=owner)
    return var[...]


def read_raw(var: netCDF4.Variable, *, owner: str | None = None) -> Any:
    """All of a variable's values, without netCDF4's automatic masking/scaling."""
    var.set_auto_maskandscale(False)
    try:
        return read_values(var, owner=owner)
    finally:
        var.set_auto_maskandscale(True)


def _read_vlen(var: netCDF4.Variable, owner: str | None) -> np.ndarray:
    """A vlen string variable, its characters charged before they are read.

    N declared strings may all point at one long string stored once (a
    compressed bomb). Their lengths are stored beside the pointers, so they
    are summed from the stored bytes first (:func:`stored_string_bytes`) and
    the whole variable is read at once when that fits. When they cannot be
    told (a file in memory, unusual storage), the variable is read in pieces
    holding only as many strings as the memory left could hold if each were
    as long as the whole file (HDF5 stores vlen data unfiltered: no string is
    longer), each piece charged as read: much slower, but bounded.
    """
    where = _where(var, owner)
    shape = tuple(int(n) for n in var.shape)
    count = math.prod(shape)
    charge(count * STRING_BYTES, f"instruction variable {var.name!r} of shape {shape} ({count:,} values)", **where)
    path = source_of(var.group())
    total = stored_string_bytes(path, variable_path(var)) if os.path.isfile(path) else None
    # netCDF-C's copy of the characters, netCDF4-python's bytes and its strs exist at once: 3 x
    if total is not None:
        charge(3 * total, f"the {total:,} characters of variable {var.name!r}", **where)
        out = np.empty(shape, dtype=object)
        out[...] = var[...] if shape else var.getValue()
        _check_lengths(var, out, where)
        return out
    longest = _UNKNOWN_FILE_BYTES if not os.path.isfile(path) else os.path.getsize(path)
    out = np.empty(shape, dtype=object)
    per_piece = max(1, min(_VLEN_PIECE, remaining() // (3 * longest + STRING_BYTES)))
    if shape:  # the leading dimensions one index at a time, dimension ``axis`` in steps, the rest whole
        axis = next(d for d in range(len(shape)) if math.prod(shape[d + 1:]) <= per_piece)
        step = max(1, per_piece // math.prod(shape[axis + 1:]))
        keys: Iterable[tuple] = (lead + (slice(start, start + step),)
                                 for lead in np.ndindex(*shape[:axis]) for start in range(0, shape[axis], step))
    else:
        keys = [()]
    for key in keys:
        piece = np.asarray(var[key] if key else var.getValue(), dtype=object)
        charge(_check_lengths(var, piece, where), f"the strings of variable {var.name!r}", **where)
        out[key] = piece
    return out


def _check_lengths(var: netCDF4.Variable, strings: np.ndarray, where: dict[str, str]) -> int:
    """The characters in ``strings``; a string longer than any URI could be is refused."""
    lengths = [len(v) if isinstance(v, (str, bytes)) else 0 for v in strings.reshape(-1)]
    if max(lengths, default=0) > MAX_STRING_LENGTH:
        raise CFAFormatError(f"variable {var.name!r} holds a string of {max(lengths):,} characters", **where)
    return sum(lengths)


def stored_string_bytes(path: str, name: str) -> int | None:
    """The characters a vlen string dataset's elements hold, from the lengths stored beside
    their heap pointers (no string is read); None when that storage is not understood.

    Each element is stored as a 4-byte length, then the heap collection's
    address and the object's index; chunks may be deflated and shuffled.
    """
    try:
        with h5py.File(path, "r") as f:
            dataset = f[name]
            if not isinstance(dataset, h5py.Dataset) or h5py.check_string_dtype(dataset.dtype) is None:
                return None
            item = 8 + f.id.get_create_plist().get_sizes()[0]
            dcpl = dataset.id.get_create_plist()
            filters = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
            if set(filters) - {h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE}:
                return None
            layout = dcpl.get_layout()
            if layout == h5py.h5d.CONTIGUOUS:
                offset = dataset.id.get_offset()
                if offset is None:
                    return 0
                with open(path, "rb") as raw:
                    raw.seek(offset)
                    stored = [raw.read(item * dataset.size)]
            elif layout == h5py.h5d.CHUNKED:
                chunk_bytes = item * math.prod(dataset.chunks)
                stored = []
                for i in range(dataset.id.get_num_chunks()):
                    mask, raw = dataset.id.read_direct_chunk(dataset.id.get_chunk_info(i).chunk_offset)
                    for j in reversed(range(len(filters))):
                        if mask >> j & 1:
                            continue
                        if filters[j] == h5py.h5z.FILTER_DEFLATE:
                            raw = zlib.decompressobj().decompress(raw, chunk_bytes)
                        else:
                            raw = np.frombuffer(raw, np.uint8).reshape(item, -1).T.tobytes()
                    if len(raw) != chunk_bytes:
                        return None
                    stored.append(raw)
            else:
                return None
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, zlib.error):
        return None
    return sum(int(np.ndarray((len(raw) // item,), "<u4", raw, 0, (item,)).sum(dtype=np.int64)) for raw in stored)


def read_strings(var: netCDF4.Variable, *, owner: str | None = None) -> np.ndarray:
    """A string variable as an object array of ``str`` (``""`` where missing).

    Handles vlen ``string`` variables and ``char`` arrays whose last dimension
    is the string length (always so in netCDF-3 files).
    """
    raw = read_raw(var, owner=owner)
    if var.dtype == str or (isinstance(raw, np.ndarray) and raw.dtype == object):
        out = np.empty(np.shape(raw), dtype=object)
        out[...] = raw
        flat = out.reshape(-1)
        for i, v in enumerate(flat):
            flat[i] = "" if v is None else (v.decode("utf-8") if isinstance(v, bytes) else str(v))
        return out
    raw = np.asarray(raw)
    if raw.dtype.kind in "SU" and raw.dtype.itemsize > 1 or raw.ndim == 0:
        chars = raw
    else:  # char array: join the trailing dimension
        if raw.dtype.kind not in "SU":
            raise CFAFormatError(
                f"variable {var.name!r} should hold strings but has dtype {raw.dtype}",
                file=source_of(var.group()),
                variable=owner or variable_path(var),
            )
        chars = netCDF4.chartostring(raw, encoding="utf-8") if raw.ndim else raw
    out = np.empty(np.shape(chars), dtype=object)
    flat_in = np.asarray(chars).reshape(-1)
    flat = out.reshape(-1)
    for i, v in enumerate(flat_in):
        flat[i] = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)).rstrip("\x00").strip()
    return out


def data_dtype(var: netCDF4.Variable) -> np.dtype:
    """The dtype of a variable's data as netCDF4-python returns them: vlen strings
    are ``object`` (whole ``str``, never a fixed width), ``char`` stays ``S1``."""
    return np.dtype(object) if var.dtype is str else np.dtype(var.dtype)


def read_unique_values(var: netCDF4.Variable, *, owner: str | None = None) -> np.ma.MaskedArray:
    """A data-valued instruction variable (``unique_values``), masked where missing.

    Numbers are masked as netCDF4-python masks them. Strings (vlen, or ``char``
    with the string length last) become whole ``str``; a string equal to the
    variable's ``_FillValue``/``missing_value``, else to netCDF's default
    string fill ``""``, is missing.
    """
    if var.dtype is not str and np.dtype(var.dtype).kind != "S":
        return np.ma.asarray(read_values(var, owner=owner))
    raw = read_raw(var, owner=owner)
    if var.dtype is str:
        strings = np.empty(np.shape(raw), dtype=object)
        strings[...] = raw
        strings[strings == None] = ""  # noqa: E711 (element-wise)
    else:
        strings = chars_to_strings(raw)
    attrs = var.ncattrs()
    missing = {str(var.getncattr(a)) for a in ("_FillValue", "missing_value")
               if a in attrs and isinstance(var.getncattr(a), str)} or {""}
    return np.ma.MaskedArray(strings, mask=np.isin(strings, list(missing)))


def read_integers(var: netCDF4.Variable, *, owner: str | None = None) -> np.ma.MaskedArray:
    """An integer instruction variable as int64, masked where values are missing.

    Missing values follow netCDF4-python (``_FillValue``, ``missing_value``,
    the valid range, else the type's default fill); packing attributes are
    not applied (sizes and indices are never packed). Unsigned values beyond
    int64 are malformed, not wrapped into negative ones.
    """
    where = {"file": source_of(var.group()), "variable": owner or variable_path(var)}
    if var.dtype == str or np.dtype(var.dtype).kind not in "iu":
        raise CFAFormatError(f"variable {var.name!r} must be of integer type, not {var.dtype}", **where)
    raw = np.asarray(read_raw(var, owner=owner))
    raw = raw.astype(raw.dtype.newbyteorder("="), copy=False)  # (viewed as unsigned below)
    encoding = Encoding.from_attrs({k: var.getncattr(k) for k in var.ncattrs()}, raw.dtype)
    raw = raw.view(encoding.stored_dtype)
    mask = encoding.missing_mask(raw)
    mask = np.zeros(raw.shape, bool) if mask is None else mask
    if raw.dtype == np.uint64 and (~mask & (raw > np.iinfo(np.int64).max)).any():
        value = raw[~mask & (raw > np.iinfo(np.int64).max)][0]
        raise CFAFormatError(f"variable {var.name!r} holds {value}, beyond the 64-bit integer range", **where)
    return np.ma.MaskedArray(raw.astype(np.int64), mask=mask)


def data_attributes(var: netCDF4.Variable) -> dict[str, Any]:
    """The attributes that describe the aggregated data (instructions removed)."""
    return {k: var.getncattr(k) for k in var.ncattrs() if k not in INSTRUCTION_ATTRS}


def split_words(text: Any) -> list[str]:
    return str(text).split()


def dimension_sizes(group: netCDF4.Group, names: Iterable[str], *, variable: str) -> list[int]:
    """The sizes of the aggregated dimensions, refused if they describe an absurd array."""
    names = list(names)
    sizes = []
    for name in names:
        dim = find_dimension(group, name)
        if dim is None:
            raise _missing(group, f"aggregated dimension {name!r}", variable)
        sizes.append(len(dim))
    check_array_size(names, sizes, file=source_of(group), variable=variable)
    return sizes


def legacy_dimensions(var: netCDF4.Variable, attrs: Sequence[str]) -> list[str]:
    """Aggregated dimension names from the first of ``attrs`` present (none: scalar data)."""
    for attr in attrs:
        if attr in var.ncattrs():
            return split_words(var.getncattr(attr))
    return []


# --------------------------------------------------------------------------
# Partition matrices (CFA-0.5, CFA-0.4, NCA). These dialects list partitions
# with their locations rather than giving fragment sizes, and sparse files
# omit the partitions never written: the grid must be recovered and checked.
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Where:
    """The aggregation file and variable being parsed, named by every error and warning."""

    file: str
    variable: str

    def error(self, message: str, fragment: Sequence[int] | None = None) -> CFAFormatError:
        return CFAFormatError(message, file=self.file, variable=self.variable, fragment=fragment)

    def warn(self, message: str) -> None:
        warnings.warn(f"{message} (file {redact(self.file)!r}, variable {self.variable!r})", CFAWarning, stacklevel=3)


def matrix_layout(
    pm_dims: Sequence[str], pm_shape: Sequence[int], dims: Sequence[str], where: Where
) -> tuple[list[int], tuple[int, ...]]:
    """Where the partition matrix's axes sit among the aggregated dimensions, and the grid shape.

    The matrix may span a subset of the dimensions, in any order; the others
    have one fragment. Absurd shapes are refused before anything is allocated.
    """
    if len(pm_dims) != len(pm_shape):
        raise where.error(f"pmshape {list(pm_shape)} does not match pmdimensions {list(pm_dims)}")
    axes = []
    for name in pm_dims:
        if name not in dims:
            raise where.error(f"partition matrix dimension {name!r} is not an aggregated dimension {list(dims)}")
        if dims.index(name) in axes:
            raise where.error(f"partition matrix dimension {name!r} is listed twice")
        axes.append(dims.index(name))
    grid_shape = [1] * len(dims)
    for axis, n in zip(axes, pm_shape):
        if n < 0:
            raise where.error(f"pmshape {list(pm_shape)} has a negative entry")
        grid_shape[axis] = int(n)
    check_fragment_count(grid_shape, file=where.file, variable=where.variable)
    return axes, tuple(grid_shape)


def flat_positions(index: np.ndarray, grid_shape: Sequence[int]) -> np.ndarray:
    """Row-major positions in the grid of the rows of ``index`` (also right for scalar grids)."""
    strides = [math.prod(grid_shape[d + 1 :]) for d in range(len(grid_shape))]
    return index.astype(np.int64) @ np.asarray(strides, dtype=np.int64).reshape(-1)


def scatter(grid_shape: Sequence[int], index: np.ndarray, values: Sequence[Any], fill: Any) -> np.ndarray:
    """A grid-shaped object column with ``values[p]`` at ``index[p]`` and ``fill`` elsewhere."""
    column = np.full(tuple(grid_shape), fill, dtype=object)
    cells = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # element-wise, so that tuples stay whole
        cells[i] = value
    column.reshape(-1)[flat_positions(index, grid_shape)] = cells
    return column


def with_base(base: str | None, file: str) -> str:
    """A fragment file name with the dialect's ``base`` prefix (none or ``""``: unchanged)."""
    return f"{base.rstrip('/')}/{file}" if base else file


def is_netcdf_format(fmt: Any) -> bool:
    """Whether a fragment ``format`` names netCDF (S3netCDF4 writes data models such as NETCDF4)."""
    name = fmt.strip().lower() if isinstance(fmt, str) else None
    return name is not None and (name in ("", "nc") or name.startswith("netcdf"))


def location_stops(
    start: np.ndarray, end: np.ndarray, counts: np.ndarray, index: np.ndarray, *, inclusive: bool, where: Where
) -> np.ndarray:
    """End-exclusive stops of partition locations, whichever end convention the file follows.

    Each dialect documents inclusive or exclusive ends, but S3netCDF4 has
    written both into the same dialect; the element count each partition
    records (``counts``, negative where unknown) settles it. A partition whose
    count fits neither convention is a CFAFormatError.
    """
    checked = np.flatnonzero(counts >= 0)
    extent = end[checked] - start[checked]
    exclusive_ok = np.prod(extent, axis=1) == counts[checked]
    inclusive_ok = np.prod(extent + 1, axis=1) == counts[checked]
    documented, other = (inclusive_ok, exclusive_ok) if inclusive else (exclusive_ok, inclusive_ok)
    if not documented.all():
        if not other.all():
            row = checked[np.argmin(documented)]
            location = np.stack([start[row], end[row]], axis=-1).tolist()
            raise where.error(
                f"partition location {location} does not fit the shape recorded for the partition",
                fragment=index[row],
            )
        inclusive = not inclusive
        where.warn(
            f"partition locations end {'inclusively' if inclusive else 'exclusively'}, against the "
            "dialect's rule; following the partition shapes recorded beside them"
        )
    return end + 1 if inclusive else end.copy()


def partition_grid(
    dims: Sequence[str],
    sizes: Sequence[int],
    grid_shape: Sequence[int],
    index: np.ndarray,
    start: np.ndarray,
    stop: np.ndarray,
    known: np.ndarray,
    where: Where,
) -> FragmentGrid:
    """The fragment grid described by partition locations, filling in what sparse files omit.

    Row ``p`` is one partition: its grid ``index`` and its location ``[start,
    stop)``, in aggregated dimension order; ``known[p]`` is False where the
    file gives no location (a partition never written). Each dimension's
    fragment sizes come from any located partition in the same slab; slabs
    without one share the remaining length evenly, rounded as S3netCDF4 splits.
    """
    index = index.astype(np.int64)
    outside = np.flatnonzero(((index < 0) | (index >= np.asarray(grid_shape, dtype=np.int64))).any(axis=1))
    if outside.size:
        raise where.error(
            f"partition index {index[outside[0]].tolist()} is outside the partition matrix {tuple(grid_shape)}",
            fragment=index[outside[0]],
        )
    flat = flat_positions(index, grid_shape)
    order = np.argsort(flat, kind="stable")
    repeated = order[1:][flat[order[1:]] == flat[order[:-1]]]
    if repeated.size:
        row = repeated[0]
        raise where.error(f"partition {index[row].tolist()} is listed more than once", fragment=index[row])
    rows = np.flatnonzero(known)
    upper = np.asarray(sizes, dtype=np.int64)
    for bad, problem in (
        ((start[rows] < 0) | (stop[rows] > upper), f"lies outside the array of shape {tuple(sizes)}"),
        (stop[rows] < start[rows], "ends before it starts"),
    ):
        bad_rows = rows[bad.any(axis=1)]
        if bad_rows.size:
            row = bad_rows[0]
            raise where.error(f"partition location {_pairs(start[row], stop[row])} {problem}", fragment=index[row])
    return FragmentGrid.from_sizes(
        _slab_sizes(name, int(sizes[d]), int(grid_shape[d]), index[rows], d, start[rows, d], stop[rows, d], where)
        for d, name in enumerate(dims)
    )


def _slab_sizes(
    name: str, size: int, n: int, index: np.ndarray, d: int, start: np.ndarray, stop: np.ndarray, where: Where
) -> np.ndarray:
    """Fragment sizes along dimension ``d`` from its located partitions (see partition_grid)."""
    slabs, first = np.unique(index[:, d], return_index=True)
    lo, hi = start[first], stop[first]
    mine = np.searchsorted(slabs, index[:, d])
    differ = np.flatnonzero((start != lo[mine]) | (stop != hi[mine]))
    if differ.size:
        row = differ[0]
        raise where.error(
            f"partition spans [{start[row]}, {stop[row]}) along {name!r} but partition "
            f"{index[first[mine[row]]].tolist()} in the same slab spans [{lo[mine[row]]}, {hi[mine[row]]})",
            fragment=index[row],
        )
    # Slab j runs from bounds[j] to bounds[j + 1]; a bound is known from the
    # start of slab j or the end of slab j - 1, and both must then agree.
    begins = np.full(n + 1, -1, dtype=np.int64)
    ends = np.full(n + 1, -1, dtype=np.int64)
    begins[n], ends[0] = size, 0
    begins[slabs], ends[slabs + 1] = lo, hi
    clash = np.flatnonzero((begins >= 0) & (ends >= 0) & (begins != ends))
    if clash.size:
        j = int(clash[0])
        culprit = index[first[np.searchsorted(slabs, min(j, n - 1))]] if slabs.size else None
        if j == n:
            message = f"the partitions along {name!r} end at {ends[n]} but the dimension has size {size}"
        elif j == 0:
            message = f"the first partitions along {name!r} start at {begins[0]}, not 0"
        else:
            message = (
                f"partitions along {name!r} overlap or leave a gap: slab {j - 1} ends at {ends[j]} "
                f"but slab {j} starts at {begins[j]}"
            )
        raise where.error(message, fragment=culprit)
    bounds = np.where(begins >= 0, begins, ends)
    fixed = np.flatnonzero(bounds >= 0)
    gaps = np.diff(fixed) > 1
    for a, c in zip(fixed[:-1][gaps], fixed[1:][gaps]):
        steps = np.arange(1, c - a, dtype=np.int64)
        bounds[a + 1 : c] = bounds[a] + (2 * steps * (bounds[c] - bounds[a]) + (c - a)) // (2 * (c - a))
    sizes = np.diff(bounds)
    if (sizes < 0).any():
        j = int(np.argmax(sizes < 0))
        raise where.error(f"partitions along {name!r} are out of order around slab {j}: they overlap")
    return sizes


def _pairs(start: np.ndarray, stop: np.ndarray) -> str:
    return "[" + ", ".join(f"[{a}, {b})" for a, b in zip(start.tolist(), stop.tolist())) + "]"
