"""Write aggregation datasets of every dialect from numpy ground truth.

Test helper only. Given a ground-truth array (plain or masked), its dimension
names and a fragment map (the fragment sizes along every dimension), the
``build_*`` functions write the fragment files with netCDF4-python and the
aggregation file exactly as described in ``/work/shared/formats.md``, and
return a :class:`Built` holding the paths and the array that a correct reader
must return.

The expected array is computed here with numpy alone: when a fragment stores
the data lossily (packing, a cast to an integer dtype, other units) the
builder encodes the truth the way a writer would and decodes it again with
numpy, so the expected values are exactly what the fragment files mean.

Every dialect shares :func:`_layout`, which cuts the truth into fragments,
writes the fragment files and records, per fragment, its URI(s), identifier
and (for in-file / unique-valued / missing fragments) what the aggregation
file itself must carry. The dialect functions only write the aggregation
file's instructions.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import netCDF4
import numpy as np

__all__ = [
    "DIALECTS",
    "Frag",
    "Built",
    "build",
    "build_cf113",
    "build_cfdm_interim",
    "build_cfapyx_interim",
    "build_cfa06",
    "build_cfa05",
    "build_cfa04",
    "build_nca",
    "make_truth",
    "write_netcdf",
    "write_fragment_file",
    "assert_matches",
    "DEFAULT_FILL",
]

DIALECTS = ("CF-1.13", "cfdm-interim", "cfapyx-interim", "CFA-0.6", "CFA-0.5", "CFA-0.4", "NCA")

# Units pairs the builder can convert between: (aggregation units, fragment
# units) -> (to_fragment, to_aggregation). Plain numpy arithmetic.
UNIT_CONVERSIONS: dict[tuple[str, str], tuple[Callable, Callable]] = {
    ("K", "degC"): (lambda x: x - 273.15, lambda y: y + 273.15),
    ("degC", "K"): (lambda x: x + 273.15, lambda y: y - 273.15),
    ("m", "km"): (lambda x: x / 1000.0, lambda y: y * 1000.0),
    ("Pa", "hPa"): (lambda x: x / 100.0, lambda y: y * 100.0),
    # 1999-12-01 is 31 days before 2000-01-01 (standard calendar).
    ("days since 1999-12-01", "hours since 2000-01-01"): (
        lambda x: (x - 31.0) * 24.0,
        lambda y: y / 24.0 + 31.0,
    ),
}


def DEFAULT_FILL(dtype) -> Any:
    """netCDF default fill value for a numpy dtype."""
    dtype = np.dtype(dtype)
    return np.array(netCDF4.default_fillvals[dtype.str[1:]], dtype=dtype)[()]


# --------------------------------------------------------------------------
# Per-fragment options
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Frag:
    """How one fragment is stored. The defaults store an exact copy of the truth."""

    units: str | None = None  # fragment units (values converted from the aggregation's)
    raw_units: bool = False  # write ``units`` but do not convert (synonyms, bad-units tests)
    no_units: bool = False  # the fragment variable has no units attribute
    dtype: str | None = None  # storage dtype in the fragment file
    scale_factor: float | None = None  # the fragment's own packing
    add_offset: float | None = None
    # how masked points are stored: _FillValue | missing_value | valid_range |
    # valid_min | valid_max | nan (NaN _FillValue) | both (_FillValue and missing_value)
    missing: str = "_FillValue"
    fill_value: Any = None  # value stored at masked points (default: a distinctive one)
    drop_size1: bool = False  # omit the fragment's size-1 dimensions from its file
    rename_dims: bool = False  # fragment dimension names unlike the aggregation's
    absent: bool = False  # wholly missing fragment (CFA-0.4/0.5/0.6, NCA)
    in_file: bool = False  # CFA-0.6: data is a variable inside the aggregation file
    identifier: str | None = None  # variable name in the fragment file ("/g/v" -> in group g)
    format: str = "NETCDF4"  # fragment file format
    write_file: bool = True  # False: referenced but never created
    transpose: tuple[int, ...] | None = None  # NCA: fragment axis order (positions of aggregated dims)
    reverse: tuple[bool, ...] | None = None  # NCA: per aggregated dim, stored reversed
    storage: Mapping | None = None  # HDF5 storage options for createVariable (zlib, chunksizes, ...)


# --------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------
@dataclass
class Built:
    dialect: str
    path: Path  # the aggregation file
    variable: str  # what to pass to from_cfa ("tas" or "/grp/tas")
    expected: np.ma.MaskedArray  # what a correct reader returns (mask=True)
    dims: tuple[str, ...]
    sizes: tuple[tuple[int, ...], ...]  # the fragment map rows
    fill_value: Any  # what mask=False must put at masked points
    fragment_files: dict[tuple[int, ...], Path] = field(default_factory=dict)
    fragment_uris: dict[tuple[int, ...], list[str]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # instruction variable names used

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.sizes)

    @property
    def chunks(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(r) for r in self.sizes)

    @property
    def filled(self) -> np.ndarray:
        return np.ma.filled(self.expected, self.fill_value)


# --------------------------------------------------------------------------
# Ground truth helpers
# --------------------------------------------------------------------------
def generation_dir(fragments: Path) -> Path:
    """The one write generation (``g-<hex>``) under a writer's fragment directory (``t/`` of ``t.nc``)."""
    found = sorted(Path(fragments).glob("g-*"))
    assert len(found) == 1, f"expected one generation under {fragments}, found {found}"
    return found[0]


def make_truth(shape, dtype="f4", *, seed=0, masked=0.0, lo=200.0, hi=320.0) -> np.ma.MaskedArray:
    """Random ground truth, optionally with a fraction of masked points."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        data = rng.uniform(lo, hi, size=shape).astype(dtype)
    else:
        data = rng.integers(int(lo), int(hi), size=shape).astype(dtype)
    mask = rng.random(size=shape) < masked if masked else np.zeros(shape, bool)
    return np.ma.MaskedArray(data, mask=mask)


def assert_matches(actual, expected, *, rtol=1e-6, atol=0.0, check_mask=True) -> None:
    """Compare a reader's answer to the expected (masked) array.

    Masks must agree (when ``check_mask``); unmasked values must agree (exactly
    for integers, to ``rtol`` for floats); shapes must be equal.
    """
    expected = np.ma.asarray(expected)
    assert np.shape(actual) == expected.shape, (np.shape(actual), expected.shape)
    a_mask = np.ma.getmaskarray(actual)
    e_mask = np.ma.getmaskarray(expected)
    if check_mask:
        np.testing.assert_array_equal(a_mask, e_mask, err_msg="masks differ")
    keep = ~e_mask
    a_val = np.asarray(np.ma.getdata(actual))[keep]
    e_val = np.asarray(np.ma.getdata(expected))[keep]
    if e_val.dtype.kind in "iub" and np.asarray(a_val).dtype.kind in "iub":
        np.testing.assert_array_equal(a_val, e_val)
    else:
        np.testing.assert_allclose(
            np.asarray(a_val, dtype="f8"), np.asarray(e_val, dtype="f8"), rtol=rtol, atol=atol
        )


_EDIT_SCRIPT = """
import sys, netCDF4
for path in sys.argv[1:]:
    for step in ("first", "second"):  # add, then change what the first edit added
        with netCDF4.Dataset(path, "a") as nc:
            nc.setncattr("comment", f"edited {step}")
            nc.setncattr(f"added_{step}", 1)
"""


def assert_editable_by_netcdf_c(*paths) -> None:
    """In a fresh process, netCDF-C opens every file for writing (``ncatted``-style edits:
    add a global attribute, then change it); the edits persist."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _EDIT_SCRIPT, *map(str, paths)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    for path in paths:
        with netCDF4.Dataset(path) as nc:
            assert (nc.comment, nc.added_first, nc.added_second) == ("edited second", 1, 1), path


# --------------------------------------------------------------------------
# Low-level netCDF writing
# --------------------------------------------------------------------------
def _group(ds: netCDF4.Dataset, path: str) -> netCDF4.Dataset:
    """The group at ``path`` (``"/a/b"`` or ``"a/b"``), created when absent."""
    g = ds
    for part in [p for p in path.split("/") if p]:
        g = g.groups[part] if part in g.groups else g.createGroup(part)
    return g


def _ensure_dim(g, name: str, size: int | None) -> None:
    if name not in g.dimensions:
        g.createDimension(name, size)


def write_strings(g, name: str, dims: Sequence[str], values, *, style: str = "vlen", attrs=None):
    """Write a string variable as vlen ``string`` or as a ``char`` array.

    ``values`` is anything numpy turns into an array of str with the shape of
    ``dims``. Char arrays get a trailing dimension ``<name>_strlen``.
    """
    arr = np.asarray(values, dtype=object)
    if style == "vlen":
        v = g.createVariable(name, str, tuple(dims))
        if arr.ndim == 0:
            v[0] = str(arr[()])
        else:
            v[...] = arr
    elif style == "char":
        flat = [str(s).encode("utf-8") for s in arr.ravel()]
        n = max([1] + [len(s) for s in flat])
        strlen = f"{name}_strlen"
        _ensure_dim(g, strlen, n)
        v = g.createVariable(name, "S1", tuple(dims) + (strlen,))
        fixed = np.array(flat, dtype=f"S{n}").reshape(arr.shape)
        v[...] = netCDF4.stringtochar(fixed)
    else:
        raise ValueError(style)
    for k, val in (attrs or {}).items():
        v.setncattr(k, val)
    return v


def write_netcdf(path, *, dims=None, variables=None, attrs=None, fmt="NETCDF4", groups=None):
    """Write a netCDF file from plain descriptions (used to craft malformed files).

    ``variables``: name -> dict(dtype=..., dims=(...), data=..., attrs={...},
    fill_value=...). ``dtype`` may be ``"vlen"`` or ``"char"`` for strings.
    ``groups``: group path -> dict(dims=..., variables=..., attrs=...).
    Data is written raw (no automatic masking or scaling).
    """
    ds = netCDF4.Dataset(str(path), "w", format=fmt)
    try:
        _fill_group(ds, dims or {}, variables or {}, attrs or {})
        for gpath, spec in (groups or {}).items():
            _fill_group(_group(ds, gpath), spec.get("dims", {}), spec.get("variables", {}), spec.get("attrs", {}))
    finally:
        ds.close()
    return Path(path)


def _fill_group(g, dims, variables, attrs):
    for name, size in dims.items():
        _ensure_dim(g, name, size)
    for name, spec in variables.items():
        dtype = spec.get("dtype", "f4")
        vdims = tuple(spec.get("dims", ()))
        vattrs = dict(spec.get("attrs", {}))
        if dtype in ("vlen", "char"):
            if spec.get("data") is None:  # declared, never written
                v = g.createVariable(name, str if dtype == "vlen" else "S1", vdims)
                for k, val in vattrs.items():
                    v.setncattr(k, val)
            else:
                write_strings(g, name, vdims, spec["data"], style=dtype, attrs=vattrs)
            continue
        v = g.createVariable(name, dtype, vdims, fill_value=spec.get("fill_value", None))
        v.set_auto_maskandscale(False)
        for k, val in vattrs.items():
            v.setncattr(k, val)
        if "data" in spec:
            data = np.asarray(spec["data"], dtype=v.dtype)
            if data.ndim == 0 and vdims == ():
                v.assignValue(data)
            else:
                v[...] = data
    for k, val in attrs.items():
        g.setncattr(k, val)


# --------------------------------------------------------------------------
# Fragment encoding and writing (shared by all dialects)
# --------------------------------------------------------------------------
def _distinct_fill(dtype) -> Any:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return dtype.type(-9999.0)
    if dtype.kind == "i":
        return dtype.type(np.iinfo(dtype).min + 7)
    if dtype.kind == "u":
        return dtype.type(np.iinfo(dtype).max - 7)
    raise TypeError(dtype)


def _cast(values: np.ndarray, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    values = np.asarray(values)
    if dtype.kind in "iu" and values.dtype.kind == "f":
        values = np.round(values)
    return values.astype(dtype)


def encode_fragment(block: np.ma.MaskedArray, agg_units: str | None, agg_dtype, spec: Frag):
    """Encode canonical fragment data as a writer would store it.

    Returns ``(stored, attrs, decoded)``: the raw array to write, the
    variable's attributes (units, packing, missing-value attributes) and the
    canonical values (masked, aggregated dtype) that the stored data mean.
    """
    block = np.ma.asarray(block)
    mask = np.ma.getmaskarray(block)
    attrs: dict[str, Any] = {}
    values = np.ma.getdata(block).astype("f8") if block.dtype.kind in "fiu" else np.ma.getdata(block)
    back = None
    units = agg_units
    if spec.units is not None and spec.units != agg_units:
        units = spec.units
        if not spec.raw_units:
            fwd, back = UNIT_CONVERSIONS[(agg_units, spec.units)]
            values = fwd(values)
    if units is not None and not spec.no_units:
        attrs["units"] = units

    store_dtype = np.dtype(spec.dtype or (agg_dtype if spec.scale_factor is None else "i2"))
    sf = 1.0 if spec.scale_factor is None else spec.scale_factor
    off = 0.0 if spec.add_offset is None else spec.add_offset
    packed = spec.scale_factor is not None or spec.add_offset is not None
    if packed:
        stored = _cast((values - off) / sf, store_dtype)
        decoded = stored.astype("f8") * sf + off
        if spec.scale_factor is not None:
            attrs["scale_factor"] = np.float64(sf)
        if spec.add_offset is not None:
            attrs["add_offset"] = np.float64(off)
    else:
        stored = _cast(values, store_dtype)
        decoded = stored.astype("f8") if stored.dtype.kind in "fiu" else stored
    if back is not None:
        decoded = back(decoded)
    decoded = _cast(decoded, agg_dtype)

    fill_mask = mask
    if mask.any():
        fill = spec.fill_value if spec.fill_value is not None else _distinct_fill(store_dtype)
        fill = store_dtype.type(fill)
        if spec.missing == "_FillValue":
            attrs["_FillValue"] = fill
        elif spec.missing == "missing_value":
            attrs["missing_value"] = fill
        elif spec.missing in ("valid_range", "valid_min", "valid_max"):
            good = stored[~mask]
            lo = good.min() if good.size else store_dtype.type(0)
            hi = good.max() if good.size else store_dtype.type(1)
            if store_dtype.kind == "f":
                above, below = hi + abs(hi) + 1, lo - abs(lo) - 1
                top, bottom = np.inf, -np.inf
            else:  # plain ints: no overflow while choosing
                above, below = int(hi) + 1, int(lo) - 1
                top, bottom = np.iinfo(store_dtype).max, np.iinfo(store_dtype).min
            if spec.missing == "valid_range":
                attrs["valid_range"] = np.array([lo, hi], dtype=store_dtype)
                fill = above if above <= top else below
            elif spec.missing == "valid_min":
                assert below >= bottom, "no room below the data for a missing value"
                attrs["valid_min"] = store_dtype.type(lo)
                fill = below
            else:
                assert above <= top, "no room above the data for a missing value"
                attrs["valid_max"] = store_dtype.type(hi)
                fill = above
            fill = store_dtype.type(fill)
        elif spec.missing == "nan":  # float NaN as the _FillValue
            assert store_dtype.kind == "f"
            fill = store_dtype.type(np.nan)
            attrs["_FillValue"] = fill
        elif spec.missing == "both":  # _FillValue and a different missing_value, each used
            other = store_dtype.type(fill - 1) if store_dtype.kind != "u" else store_dtype.type(fill + 1)
            attrs["_FillValue"] = fill
            attrs["missing_value"] = other
            alternate = (np.arange(stored.size).reshape(stored.shape) % 2).astype(bool)
            stored = np.where(mask & alternate, other, stored)
            fill_mask = mask & ~alternate  # the rest get the _FillValue below
        else:
            raise ValueError(spec.missing)
        stored = np.where(fill_mask, fill, stored).astype(store_dtype)
    return stored, attrs, np.ma.MaskedArray(decoded, mask=mask)


def write_fragment_file(path: Path, name: str, dims: Sequence[str], stored: np.ndarray, attrs: Mapping,
                        *, fmt: str = "NETCDF4", global_attrs: Mapping | None = None,
                        storage: Mapping | None = None) -> Path:
    """Write one fragment file holding one variable (``name`` may be ``/grp/var``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = netCDF4.Dataset(str(path), "w", format=fmt)
    try:
        gpath, _, vname = name.rpartition("/")
        g = _group(ds, gpath) if gpath else ds
        for d, n in zip(dims, stored.shape):
            _ensure_dim(g, d, n)
        fill = attrs.get("_FillValue")
        endian = {">": "big", "<": "little"}.get(stored.dtype.byteorder, "native")
        v = g.createVariable(vname, stored.dtype, tuple(dims), fill_value=fill if fill is not None else False,
                             endian=endian, **(storage or {}))
        v.set_auto_maskandscale(False)
        for k, val in attrs.items():
            if k != "_FillValue":
                v.setncattr(k, val)
        if stored.ndim == 0:
            v.assignValue(stored)
        else:
            v[...] = stored
        for k, val in (global_attrs or {}).items():
            ds.setncattr(k, val)
    finally:
        ds.close()
    return path


# --------------------------------------------------------------------------
# Layout: cut the truth into fragments, write the fragment files
# --------------------------------------------------------------------------
@dataclass
class _Fragment:
    index: tuple[int, ...]
    spec: Frag
    shape: tuple[int, ...]
    uris: list[str]  # as written in the aggregation file (first = preferred)
    identifier: str
    path: Path | None  # fragment file on disk (None: in-file / absent / unique)
    value: Any = None  # unique value (unique-valued aggregations)
    stored: np.ndarray | None = None  # for in-file fragments
    stored_dims: tuple[str, ...] = ()
    attrs: dict = field(default_factory=dict)


@dataclass
class _Layout:
    directory: Path
    agg_path: Path
    name: str
    dims: tuple[str, ...]
    sizes: tuple[tuple[int, ...], ...]
    canonical: np.ma.MaskedArray  # aggregated data before the aggregation's own packing
    agg_dtype: np.dtype
    fragments: dict[tuple[int, ...], _Fragment]
    expected: np.ma.MaskedArray
    agg_attrs: dict

    @property
    def grid_shape(self):
        return tuple(len(r) for r in self.sizes)

    def column(self, getter, dtype=object) -> np.ndarray:
        out = np.empty(self.grid_shape, dtype=dtype)
        for idx, f in self.fragments.items():
            out[idx] = getter(f)
        return out


def _uri_for(path: Path, agg_dir: Path, style: str) -> str:
    if style == "relative":
        return os.path.relpath(path, agg_dir)
    if style == "absolute":
        return str(path.resolve())
    if style == "file":
        return path.resolve().as_uri()
    raise ValueError(style)


def _layout(
    directory,
    truth,
    dims: Sequence[str],
    sizes: Sequence[Sequence[int]],
    *,
    name: str = "tas",
    units: str | None = "K",
    dtype=None,
    fill_value=None,
    agg_scale_factor: float | None = None,
    agg_add_offset: float | None = None,
    attrs: Mapping | None = None,
    frags: Mapping | Callable | None = None,
    uri_style: str = "relative",
    agg_name: str = "aggregation.nc",
    fragment_dir: str = "fragments",
    unique: bool = False,
    fragment_global_attrs: Mapping | None = None,
    fragment_group: str | None = None,
) -> _Layout:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    agg_path = directory / agg_name
    agg_path.parent.mkdir(parents=True, exist_ok=True)
    frag_dir = directory / fragment_dir
    truth = np.ma.asarray(truth)
    dims = tuple(dims)
    sizes = tuple(tuple(int(s) for s in row) for row in sizes)
    assert truth.ndim == len(dims) == len(sizes), "truth, dims and sizes disagree"
    assert tuple(sum(r) for r in sizes) == truth.shape, "map rows must sum to the shape"

    agg_packed = agg_scale_factor is not None or agg_add_offset is not None
    sf = 1.0 if agg_scale_factor is None else agg_scale_factor
    off = 0.0 if agg_add_offset is None else agg_add_offset
    if agg_packed:
        agg_dtype = np.dtype(dtype or "i2")
        canonical = np.ma.MaskedArray(_cast((np.ma.getdata(truth).astype("f8") - off) / sf, agg_dtype),
                                      mask=np.ma.getmaskarray(truth))
    else:
        agg_dtype = np.dtype(dtype or truth.dtype)
        canonical = np.ma.MaskedArray(_cast(np.ma.getdata(truth), agg_dtype), mask=np.ma.getmaskarray(truth))

    agg_attrs = dict(attrs or {})
    if units is not None:
        agg_attrs.setdefault("units", units)
    if agg_scale_factor is not None:
        agg_attrs["scale_factor"] = np.float64(agg_scale_factor)
    if agg_add_offset is not None:
        agg_attrs["add_offset"] = np.float64(agg_add_offset)
    if fill_value is not None:
        agg_attrs["_FillValue"] = agg_dtype.type(fill_value)

    def spec_of(idx) -> Frag:
        if frags is None:
            return Frag()
        if callable(frags):
            return frags(idx) or Frag()
        return frags.get(idx, Frag())

    offsets = [np.concatenate([[0], np.cumsum(r)]) for r in sizes]
    canon_expected = np.ma.MaskedArray(np.ma.getdata(canonical).copy(), mask=np.ma.getmaskarray(canonical).copy())
    stem = Path(agg_name).stem
    fragments = {}
    for idx in itertools.product(*(range(len(r)) for r in sizes)):
        spec = spec_of(idx)
        sl = tuple(slice(int(o[i]), int(o[i + 1])) for o, i in zip(offsets, idx))
        shape = tuple(r[i] for r, i in zip(sizes, idx))
        block = canonical[sl]
        ident = spec.identifier or name
        vname = name.rpartition("/")[2]
        fname = f"{stem}.{vname}." + ".".join(str(i) for i in idx) + ".nc" if idx else f"{stem}.{vname}.nc"
        fpath = frag_dir / fname
        frag = _Fragment(index=idx, spec=spec, shape=shape, uris=[], identifier=ident, path=None)
        if unique:
            bmask = np.ma.getmaskarray(block)
            if bmask.all():
                frag.value = np.ma.masked
            else:
                vals = np.unique(np.ma.getdata(block)[~bmask])
                assert vals.size == 1 and not bmask.any(), f"fragment {idx} is not unique-valued"
                frag.value = vals[0]
        elif spec.absent:
            canon_expected[sl] = np.ma.masked
        else:
            stored, fattrs, decoded = encode_fragment(block, units, agg_dtype, spec)
            canon_expected[sl] = decoded
            fdims = [f"d{k}" if spec.rename_dims else d for k, d in enumerate(dims)]
            keep = [k for k, n in enumerate(shape) if not (spec.drop_size1 and n == 1)]
            stored_k = stored.reshape(tuple(shape[k] for k in keep))
            fdims = [fdims[k] for k in keep]
            if spec.reverse is not None:
                flips = tuple(pos for pos, k in enumerate(keep) if spec.reverse[k])
                stored_k = np.flip(stored_k, axis=flips) if flips else stored_k
            if spec.transpose is not None:
                stored_k = np.transpose(stored_k, spec.transpose)
                fdims = [fdims[p] for p in spec.transpose]
            if spec.in_file:
                frag.stored, frag.attrs = stored_k, fattrs
                frag.stored_dims = tuple(fdims)
            else:
                frag.path = fpath
                frag.uris = [_uri_for(fpath, agg_path.parent, uri_style)]
                if spec.write_file:
                    # (S3netCDF4 puts a grouped variable at its group path, ``ident`` staying bare)
                    at = f"{fragment_group.rstrip('/')}/{ident}" if fragment_group else ident
                    write_fragment_file(fpath, at, fdims, stored_k, fattrs, fmt=spec.format,
                                        global_attrs=fragment_global_attrs, storage=spec.storage)
        fragments[idx] = frag

    if agg_packed:
        expected = np.ma.MaskedArray(np.ma.getdata(canon_expected).astype("f8") * sf + off,
                                     mask=np.ma.getmaskarray(canon_expected))
    else:
        expected = canon_expected
    return _Layout(directory, agg_path, name, dims, sizes, canonical, agg_dtype, fragments, expected, agg_attrs)


def _built(dialect: str, lay: _Layout, variable: str, names: dict) -> Built:
    fill = lay.agg_attrs.get("_FillValue", DEFAULT_FILL(lay.agg_dtype))
    return Built(
        dialect=dialect,
        path=lay.agg_path,
        variable=variable,
        expected=lay.expected,
        dims=lay.dims,
        sizes=lay.sizes,
        fill_value=fill,
        fragment_files={i: f.path for i, f in lay.fragments.items() if f.path is not None},
        fragment_uris={i: list(f.uris) for i, f in lay.fragments.items()},
        names=names,
    )


# --------------------------------------------------------------------------
# Aggregation-file pieces shared by the dialects
# --------------------------------------------------------------------------
def _open_agg(lay: _Layout, fmt: str, append: bool) -> netCDF4.Dataset:
    if append:
        return netCDF4.Dataset(str(lay.agg_path), "a")
    return netCDF4.Dataset(str(lay.agg_path), "w", format=fmt)


def _write_dims_and_coords(g, lay: _Layout, coords: bool) -> None:
    for d, row in zip(lay.dims, lay.sizes):
        _ensure_dim(g, d, sum(row))
        if coords and d not in g.variables:
            c = g.createVariable(d, "f8", (d,))
            c[:] = np.arange(sum(row), dtype="f8") * 1.5 + 10.0
            c.setncattr("long_name", f"{d} coordinate")


def _write_agg_var(g, lay: _Layout, vname: str, attrs: Mapping) -> netCDF4.Variable:
    fill = lay.agg_attrs.get("_FillValue")
    v = g.createVariable(vname, lay.agg_dtype, (), fill_value=fill if fill is not None else False)
    v.set_auto_maskandscale(False)
    for k, val in {**lay.agg_attrs, **attrs}.items():
        if k != "_FillValue":
            v.setncattr(k, val)
    return v


def _map_array(sizes, pad) -> np.ndarray:
    if not sizes:
        return np.array(1)
    width = max(len(r) for r in sizes)
    m = np.full((len(sizes), width), pad, dtype="i8")
    for d, row in enumerate(sizes):
        m[d, : len(row)] = row
    return m


def _write_map(g, lay: _Layout, name: str, rows_dim: str, cols_dim: str, *, dtype="i4", pad="default"):
    """Write the map (CF ``map`` / CFA-0.6 ``location`` / CFAPyX ``shape``)."""
    if pad == "default":
        padv = netCDF4.default_fillvals[np.dtype(dtype).str[1:]]
        fill = False
    elif pad == "negative":  # (0 is a size, not padding)
        padv, fill = -1, False
    elif pad == "fillvalue":  # positive: padding only because it is the _FillValue
        padv, fill = 99, 99
    elif pad == "missing_value":
        padv, fill = 77, False
    else:
        raise ValueError(pad)
    m = _map_array(lay.sizes, padv).astype(dtype)
    if m.ndim == 0:
        v = g.createVariable(name, dtype, (), fill_value=fill)
        v.set_auto_maskandscale(False)
        v.assignValue(m)
        return v
    _ensure_dim(g, rows_dim, m.shape[0])
    _ensure_dim(g, cols_dim, m.shape[1])
    v = g.createVariable(name, dtype, (rows_dim, cols_dim), fill_value=fill)
    v.set_auto_maskandscale(False)
    if pad == "missing_value":
        v.missing_value = np.array(padv, dtype=dtype)
    v[...] = m
    return v


def _grid_dims(g, lay: _Layout, prefix: str) -> tuple[str, ...]:
    names = tuple(f"{prefix}{d}" for d in lay.dims)
    for n, k in zip(names, lay.grid_shape):
        _ensure_dim(g, n, k)
    return names


def _identifiers(lay: _Layout, per_fragment: bool | None):
    ids = lay.column(lambda f: f.identifier)
    if per_fragment is None:
        per_fragment = len(set(ids.ravel().tolist())) > 1
    if per_fragment:
        return ids, True
    return np.array(ids.ravel()[0], dtype=object), False


def _write_unique_values(g, lay: _Layout, name: str, grid_dims, fill=None):
    if fill is None:
        fill = lay.agg_attrs.get("_FillValue", DEFAULT_FILL(lay.agg_dtype))
    vals = np.empty(lay.grid_shape, dtype=lay.agg_dtype)
    for idx, f in lay.fragments.items():
        vals[idx] = fill if f.value is np.ma.masked else f.value
    v = g.createVariable(name, lay.agg_dtype, grid_dims, fill_value=lay.agg_dtype.type(fill))
    v.set_auto_maskandscale(False)
    if vals.ndim == 0:
        v.assignValue(vals)
    else:
        v[...] = vals
    return v


def _aggregated_data(pairs: Sequence[tuple[str, str]], multiline: bool) -> str:
    if multiline:
        return "\n".join(f"  {k}:\t{v}" for k, v in pairs) + "\n"
    return " ".join(f"{k}: {v}" for k, v in pairs)


def _finish_unique_expected(lay: _Layout, agg_packed_sf_off=None):
    """For unique-valued aggregations the expected array is the canonical one."""
    canon = lay.canonical
    sf = float(lay.agg_attrs.get("scale_factor", 1.0))
    off = float(lay.agg_attrs.get("add_offset", 0.0))
    if "scale_factor" in lay.agg_attrs or "add_offset" in lay.agg_attrs:
        lay.expected = np.ma.MaskedArray(np.ma.getdata(canon).astype("f8") * sf + off,
                                         mask=np.ma.getmaskarray(canon))
    else:
        lay.expected = canon


# --------------------------------------------------------------------------
# CF-1.13 and the two interim dialects (same structure, different keywords)
# --------------------------------------------------------------------------
_KEYWORDS = {
    # dialect: (map, uris, identifiers, unique, conventions)
    "CF-1.13": ("map", "uris", "identifiers", "unique_values", "CF-1.13"),
    "cfdm-interim": ("map", "location", "variable", "unique_value", "CF-1.12"),
    "cfapyx-interim": ("shape", "location", "address", "value", "CF-1.12"),
}


def _build_cf_like(
    dialect: str,
    directory,
    truth,
    dims,
    sizes,
    *,
    name: str = "tas",
    fmt: str = "NETCDF4",
    strings: str | None = None,
    identifiers: str | None = None,  # "scalar" | "per-fragment" | None (auto)
    group: str | None = None,
    dims_in_group: bool = False,
    multiline: bool = False,
    map_dtype: str = "i4",
    map_pad: str = "default",
    coords: bool = True,
    append: bool = False,
    unique: bool = False,
    unique_fill=None,  # _FillValue of the unique_values variable (default: the aggregation's)
    global_attrs: Mapping | None = None,
    mutate: Callable | None = None,
    **layout_kw,
) -> Built:
    kmap, kuris, kids, kuniq, conventions = _KEYWORDS[dialect]
    lay = _layout(directory, truth, dims, sizes, name=name, unique=unique, **layout_kw)
    if unique:
        _finish_unique_expected(lay)
    strings = strings or ("char" if fmt.startswith("NETCDF3") else "vlen")
    suffix = f"_{name}" if append else ""
    ds = _open_agg(lay, fmt, append)
    try:
        if not append:
            ds.setncattr("Conventions", conventions)
        for k, val in (global_attrs or {}).items():
            ds.setncattr(k, val)
        g = _group(ds, group) if group else ds
        _write_dims_and_coords(g if dims_in_group else ds, lay, coords)
        names = {}
        # The map in the variable's group (plain name), the URIs in the root
        # group (absolute name), the identifiers by full path: all three
        # CF group-search forms get exercised when a group is used.
        names["map"] = f"fragment_map{suffix}"
        _write_map(g, lay, names["map"], f"i{suffix}", f"j{suffix}", dtype=map_dtype, pad=map_pad)
        ref_map = names["map"]
        pairs = [(kmap, ref_map)]
        if unique:
            grid_dims = _grid_dims(g, lay, f"f{suffix}_")
            names["unique_values"] = f"fragment_unique_values{suffix}"
            _write_unique_values(g, lay, names["unique_values"], grid_dims, unique_fill)
            pairs.append((kuniq, names["unique_values"]))
        else:
            root_grid = _grid_dims(ds, lay, f"f{suffix}_")
            names["uris"] = f"fragment_uris{suffix}"
            uris = lay.column(lambda f: f.uris[0])
            write_strings(ds, names["uris"], root_grid, uris, style=strings)
            ids, per = _identifiers(lay, None if identifiers is None else identifiers == "per-fragment")
            names["identifiers"] = f"fragment_identifiers{suffix}"
            gi = g if group else ds
            if per:
                write_strings(gi, names["identifiers"], _grid_dims(gi, lay, f"f{suffix}_"), ids, style=strings)
            else:
                write_strings(gi, names["identifiers"], (), ids, style=strings)
            ref_uris = f"/{names['uris']}" if group else names["uris"]
            ref_ids = f"/{group.strip('/')}/{names['identifiers']}" if group else names["identifiers"]
            pairs += [(kuris, ref_uris), (kids, ref_ids)]
        if multiline:
            pairs = pairs[::-1]  # any order is allowed
        vname = name.rpartition("/")[2]
        _write_agg_var(g, lay, vname, {
            "aggregated_dimensions": " ".join(lay.dims),
            "aggregated_data": _aggregated_data(pairs, multiline),
        })
        if mutate is not None:
            mutate(ds, g, names)
    finally:
        ds.close()
    variable = f"/{group.strip('/')}/{name}" if group else name
    return _built(dialect, lay, variable, names)


def build_cf113(directory, truth, dims, sizes, **kw) -> Built:
    """CF-1.13 aggregation (``map uris identifiers`` or ``map unique_values``)."""
    return _build_cf_like("CF-1.13", directory, truth, dims, sizes, **kw)


def build_cfdm_interim(directory, truth, dims, sizes, **kw) -> Built:
    """cfdm 1.12.0-1.12.1 interim dialect (``map location variable [unique_value]``)."""
    return _build_cf_like("cfdm-interim", directory, truth, dims, sizes, **kw)


def build_cfapyx_interim(directory, truth, dims, sizes, **kw) -> Built:
    """Older CFAPyX interim dialect (``shape location address [value]``)."""
    return _build_cf_like("cfapyx-interim", directory, truth, dims, sizes, **kw)


# --------------------------------------------------------------------------
# CFA-0.6.2
# --------------------------------------------------------------------------
def build_cfa06(
    directory,
    truth,
    dims,
    sizes,
    *,
    name: str = "tas",
    fmt: str = "NETCDF4",
    strings: str | None = None,
    alternatives: bool = False,
    substitutions: bool = False,
    per_fragment_format: bool = False,
    address: str | None = None,  # "scalar" | "per-fragment" | None (auto)
    extra_terms: Mapping[str, Any] | None = None,  # e.g. {"tracking_id": values over the grid}
    keyword_case: str = "lower",  # "lower" | "mixed"
    coords: bool = True,
    mutate: Callable | None = None,
    **layout_kw,
) -> Built:
    """CFA-0.6.2 as written by cf-python 3.15-3.16 (``location file format address``)."""
    lay = _layout(directory, truth, dims, sizes, name=name, **layout_kw)
    strings = strings or ("char" if fmt.startswith("NETCDF3") else "vlen")
    ds = _open_agg(lay, fmt, False)
    try:
        ds.setncattr("Conventions", "CF-1.11 CFA-0.6.2")
        _write_dims_and_coords(ds, lay, coords)
        names = {"location": "cfa_location", "file": "cfa_file", "format": "cfa_format", "address": "cfa_address"}
        if lay.dims:
            _write_map(ds, lay, names["location"], "cfa_ndim", "cfa_nmax", dtype="i4")
        else:  # scalar data: a 1-D [1]
            _ensure_dim(ds, "cfa_ndim", 1)
            loc = ds.createVariable(names["location"], "i4", ("cfa_ndim",))
            loc[:] = [1]
        grid = _grid_dims(ds, lay, "f_")

        any_missing = any(f.spec.absent or f.spec.in_file for f in lay.fragments.values())
        # file: grid (+ alternatives). Missing fragments and in-file ones: "".
        if alternatives:
            width = 2
            files = np.empty(lay.grid_shape + (width,), dtype=object)
            for idx, f in lay.fragments.items():
                if not f.uris:
                    files[idx] = ["", ""]
                elif sum(idx) % 2 == 0:  # first alternative does not exist
                    bogus = str(lay.directory / "nowhere" / f"gone{'_'.join(map(str, idx))}.nc")
                    files[idx] = [bogus, f.uris[0]]
                    f.uris = [bogus, f.uris[0]]
                else:  # only one alternative, padded
                    files[idx] = [f.uris[0], ""]
            _ensure_dim(ds, "f_alt", width)
            file_dims = grid + ("f_alt",)
        else:
            files = lay.column(lambda f: f.uris[0] if f.uris else "")
            file_dims = grid
        file_attrs = {}
        if substitutions:
            base = (lay.directory / "fragments").resolve().as_uri() + "/"
            file_attrs["substitutions"] = f"${{BASE}}: {base} ${{UNUSED}}: s3://nobucket/"

            def sub(u):
                full = u if "://" in u or u.startswith("/") or not u else (lay.directory / u).resolve().as_uri()
                if full and full.startswith(base):
                    return "${BASE}" + full[len(base):]
                return u

            files = np.array([sub(u) for u in files.ravel()], dtype=object).reshape(files.shape)
        write_strings(ds, names["file"], file_dims, files, style=strings, attrs=file_attrs)

        if per_fragment_format:
            fmts = lay.column(lambda f: "nc" if f.uris else "")
            write_strings(ds, names["format"], grid, fmts, style=strings)
        else:
            write_strings(ds, names["format"], (), "nc", style=strings)

        # address: variable name in the fragment, the in-file variable name,
        # or "" for wholly missing fragments.
        for idx, f in lay.fragments.items():
            if f.spec.in_file:
                f.identifier = f"{lay.name}_fragment_" + "_".join(map(str, idx))
                fdims = []
                for k, (d, n) in enumerate(zip(f.stored_dims, f.stored.shape)):
                    dn = f"{f.identifier}_{d}"
                    _ensure_dim(ds, dn, n)
                    fdims.append(dn)
                fill = f.attrs.get("_FillValue")
                v = ds.createVariable(f.identifier, f.stored.dtype, tuple(fdims),
                                      fill_value=fill if fill is not None else False)
                v.set_auto_maskandscale(False)
                for k2, val in f.attrs.items():
                    if k2 != "_FillValue":
                        v.setncattr(k2, val)
                if f.stored.ndim:
                    v[...] = f.stored
                else:
                    v.assignValue(f.stored)
        addresses = lay.column(lambda f: "" if f.spec.absent else f.identifier)
        per = address == "per-fragment" or (address is None and (any_missing or len(set(addresses.ravel().tolist())) > 1))
        if per:
            write_strings(ds, names["address"], grid, addresses, style=strings)
        else:
            write_strings(ds, names["address"], (), addresses.ravel()[0], style=strings)

        keys = ["location", "file", "format", "address"]
        shown = {k: (k.capitalize() if keyword_case == "mixed" and i % 2 == 0 else
                     (k.upper() if keyword_case == "mixed" else k)) for i, k in enumerate(keys)}
        pairs = [(shown[k], names[k]) for k in keys]
        for term, values in (extra_terms or {}).items():
            vn = f"cfa_{term}"
            write_strings(ds, vn, grid, values, style=strings)
            pairs.append((term, vn))
            names[term] = vn
        _write_agg_var(ds, lay, lay.name, {
            "aggregated_dimensions": " ".join(lay.dims),
            "aggregated_data": " ".join(f"{k}: {v}" for k, v in pairs),
        })
        if mutate is not None:
            mutate(ds, ds, names)
    finally:
        ds.close()
    return _built("CFA-0.6", lay, name, names)


# --------------------------------------------------------------------------
# CFA-0.5 (S3netCDF4 v2)
# --------------------------------------------------------------------------
def build_cfa05(directory, truth, dims, sizes, *, name: str = "tas", coords: bool = True, fmt: str = "NETCDF4",
                mutate: Callable | None = None, group: str | None = None, **layout_kw) -> Built:
    """CFA-0.5: a ``cfa_<var>`` group holding the partition matrix (end-exclusive locations).

    ``group``: the variable (its dimensions and coordinates) in that group, and
    in each fragment file at the same group path while ``ncvar`` stays bare,
    as S3netCDF4 writes it.
    """
    assert fmt == "NETCDF4", "CFA-0.5 needs netCDF-4 groups"
    layout_kw.setdefault("agg_name", "aggregation.nca")
    lay = _layout(directory, truth, dims, sizes, name=name, fragment_group=group, **layout_kw)
    ds = _open_agg(lay, "NETCDF4", False)
    try:
        ds.setncattr("Conventions", "CF-1.7 CFA-0.5")
        owner = _group(ds, group) if group else ds
        _write_dims_and_coords(owner, lay, coords)
        gname = f"cfa_{name}"
        _write_agg_var(owner, lay, name, {"cf_role": "cfa_variable", "cfa_dimensions": " ".join(lay.dims),
                                          "cfa_group": gname})
        g = owner.createGroup(gname)
        nd = len(lay.dims)
        for d, k in zip(lay.dims, lay.grid_shape):
            g.createDimension(d, k)
        g.createDimension("ndimensions", nd)
        g.createDimension("bounds", 2)
        pm = g.createVariable("pmshape", "i4", ("ndimensions",))
        pm[:] = np.array(lay.grid_shape, dtype="i4")
        write_strings(g, "pmdimensions", (), ", ".join(lay.dims), style="vlen")
        gd = tuple(lay.dims)
        fill = netCDF4.default_fillvals["i4"]
        index = np.full(lay.grid_shape + (nd,), fill, dtype="i4")
        location = np.full(lay.grid_shape + (nd, 2), fill, dtype="i4")
        shape = np.full(lay.grid_shape + (nd,), fill, dtype="i4")
        ncvar = np.full(lay.grid_shape, "", dtype=object)
        files = np.full(lay.grid_shape, "", dtype=object)
        formats = np.full(lay.grid_shape, "", dtype=object)
        offsets = [np.concatenate([[0], np.cumsum(r)]) for r in lay.sizes]
        for idx, f in lay.fragments.items():
            if f.spec.absent:
                continue
            index[idx] = idx
            location[idx] = [[offsets[d][i], offsets[d][i + 1]] for d, i in enumerate(idx)]
            shape[idx] = f.shape
            ncvar[idx] = f.identifier
            files[idx] = f.uris[0]
            formats[idx] = "NETCDF4"
        for vn, data, vd in (("index", index, gd + ("ndimensions",)),
                             ("location", location, gd + ("ndimensions", "bounds")),
                             ("shape", shape, gd + ("ndimensions",))):
            v = g.createVariable(vn, "i4", vd)
            v.set_auto_maskandscale(False)
            v[...] = data
        write_strings(g, "ncvar", gd, ncvar)
        write_strings(g, "file", gd, files)
        write_strings(g, "format", gd, formats)
        if mutate is not None:
            mutate(ds, g, {"group": gname})
    finally:
        ds.close()
    return _built("CFA-0.5", lay, f"/{group.strip('/')}/{name}" if group else name, {"group": gname})


# --------------------------------------------------------------------------
# CFA-0.4 and NCA (JSON in an attribute)
# --------------------------------------------------------------------------
def _partitions(lay: _Layout, inclusive: bool, base: str | None):
    offsets = [np.concatenate([[0], np.cumsum(r)]) for r in lay.sizes]
    parts = []
    for idx, f in lay.fragments.items():
        if f.spec.absent:
            continue
        loc = [[int(offsets[d][i]), int(offsets[d][i + 1]) - (1 if inclusive else 0)] for d, i in enumerate(idx)]
        uri = f.uris[0]
        if base is not None:
            assert uri.startswith(base), (uri, base)
            uri = uri[len(base):]
        parts.append((idx, loc, uri, f))
    return parts


def build_cfa04(directory, truth, dims, sizes, *, name: str = "tas", fmt: str = "NETCDF4",
                dims_attr: str = "cfa_dimensions", base: bool = False, coords: bool = True,
                json_override: str | None = None, mutate: Callable | None = None, group: str | None = None,
                **layout_kw) -> Built:
    """CFA-0.4: ``cfa_array`` JSON, inclusive location ends, absent partitions = missing
    (``group``: as for :func:`build_cfa05`)."""
    layout_kw.setdefault("agg_name", "aggregation.nca")
    if base:
        layout_kw["uri_style"] = "absolute"
    lay = _layout(directory, truth, dims, sizes, name=name, fragment_group=group, **layout_kw)
    base_s = str((lay.directory / "fragments").resolve()) + "/" if base else None
    doc: dict[str, Any] = {
        "pmshape": list(lay.grid_shape),
        "pmdimensions": list(lay.dims),
        "Partitions": [
            {"index": list(idx), "location": loc,
             "subarray": {"ncvar": f.identifier, "file": uri, "format": "NETCDF4", "shape": list(f.shape)}}
            for idx, loc, uri, f in _partitions(lay, inclusive=True, base=base_s)
        ],
    }
    if base_s is not None:
        doc["base"] = base_s
    ds = _open_agg(lay, fmt, False)
    try:
        ds.setncattr("Conventions", "CF-1.7 CFA-0.4")
        owner = _group(ds, group) if group else ds
        _write_dims_and_coords(owner, lay, coords)
        _write_agg_var(owner, lay, name, {"cf_role": "cfa_variable", dims_attr: " ".join(lay.dims),
                                          "cfa_array": json_override if json_override is not None else json.dumps(doc)})
        if mutate is not None:
            mutate(ds, ds, {})
    finally:
        ds.close()
    return _built("CFA-0.4", lay, f"/{group.strip('/')}/{name}" if group else name, {})


def build_nca(directory, truth, dims, sizes, *, name: str = "tas", fmt: str = "NETCDF4", coords: bool = True,
              mutate: Callable | None = None, **layout_kw) -> Built:
    """NCA 0.1-0.2: ``nca_array`` JSON with [start, stop) locations.

    Partitions whose fragment has ``transpose``/``reverse`` set list their own
    ``dimensions`` (fragment axis order) and ``directions`` (dim -> True when
    stored in the aggregated direction, False when reversed).
    """
    layout_kw.setdefault("agg_name", "aggregation.nca")
    lay = _layout(directory, truth, dims, sizes, name=name, **layout_kw)
    parts = []
    for idx, loc, uri, f in _partitions(lay, inclusive=False, base=None):
        order = list(range(len(lay.dims))) if f.spec.transpose is None else list(f.spec.transpose)
        stored_shape = [f.shape[k] for k in order]
        p: dict[str, Any] = {
            "index": list(idx),
            "location": loc,
            "data": {"file": uri, "ncvar": f.identifier, "shape": stored_shape,
                     "dtype": str(np.dtype(f.spec.dtype or lay.agg_dtype))},
        }
        if f.spec.transpose is not None:
            p["dimensions"] = [lay.dims[k] for k in order]
        if f.spec.reverse is not None:
            p["directions"] = {d: (not r) for d, r in zip(lay.dims, f.spec.reverse)}
        if f.spec.units is not None:
            p["units"] = f.spec.units
        parts.append(p)
    doc = {"pdimensions": list(lay.dims), "pshape": list(lay.grid_shape), "Partitions": parts}
    ds = _open_agg(lay, fmt, False)
    try:
        ds.setncattr("Conventions", "CF-1.5 NCA")
        _write_dims_and_coords(ds, lay, coords)
        _write_agg_var(ds, lay, name, {"cf_role": "nca_variable", "nca_dimensions": " ".join(lay.dims),
                                       "nca_array": json.dumps(doc)})
        if mutate is not None:
            mutate(ds, ds, {})
    finally:
        ds.close()
    return _built("NCA", lay, name, {})


_BUILDERS = {
    "CF-1.13": build_cf113,
    "cfdm-interim": build_cfdm_interim,
    "cfapyx-interim": build_cfapyx_interim,
    "CFA-0.6": build_cfa06,
    "CFA-0.5": build_cfa05,
    "CFA-0.4": build_cfa04,
    "NCA": build_nca,
}


def build(dialect: str, directory, truth, dims, sizes, **kw) -> Built:
    """Write an aggregation dataset of ``dialect`` (one of :data:`DIALECTS`)."""
    return _BUILDERS[dialect](directory, truth, dims, sizes, **kw)


def build_nca_virtual(directory, truth, *, cf_role: bool = True) -> Built:
    """NCA as the convention's examples write it (Python-style quotes), over ``truth`` of shape
    (6, 4, 5) with dims time, lat, lon, a 2 x 1 x 2 partition matrix:

    * (0, 0, 0) and (1, 0, 0): virtual partitions of one file variable ``big`` of
      shape (8, 4, 5) (``part``: a range; an index list out of order and a
      decreasing range), the other elements of ``big`` holding decoys;
    * (0, 0, 1): a file variable with an extra leading size-1 dimension ``height``
      (``dimensions`` and ``directions``) in its own units (degC);
    * (1, 0, 1): a private variable of the NCA file itself (no ``file``), stored
      with ``lat`` reversed (``directions``).

    ``cf_role=False`` leaves out ``cf_role``: ``nca_dimensions``/``nca_array`` alone mark it.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    t = np.ma.filled(np.ma.asarray(truth), np.float32(0)).astype("f4")
    assert t.shape == (6, 4, 5)
    big = np.full((8, 4, 5), 9999.0, dtype="f4")
    big[2:5, :, 0:3] = t[0:3, :, 0:3]  # part [(2, 4, 1), (0, 3, 1), (0, 2, 1)]
    big[[7, 5, 6], :, 0:3] = t[3:6, ::-1, 0:3]  # part [[7, 5, 6], (3, 0, -1), (0, 2, 1)]
    write_fragment_file(directory / "sub" / "big.nc", "big", ("t", "y", "x"), big, {"units": "K"})
    extra = (t[0:3, :, 3:5] - 273.15)[np.newaxis]
    write_fragment_file(directory / "sub" / "high.nc", "tas", ("height", "time", "lat", "lon"), extra.astype("f4"),
                        {"units": "degC"})
    partitions = [
        {"index": [0, 0], "location": [[0, 3], [0, 4], [0, 3]], "part": "[(2, 4, 1), (0, 3, 1), (0, 2, 1)]",
         "data": {"file": "sub/big.nc", "ncvar": "big", "shape": [8, 4, 5], "dtype": "float"}},
        {"index": [1, 0], "location": [[3, 6], [0, 4], [0, 3]], "part": "[[7, 5, 6], (3, 0, -1), (0, 2, 1)]",
         "data": {"file": "sub/big.nc", "ncvar": "big", "shape": [8, 4, 5], "dtype": "float"}},
        {"index": [0, 1], "location": [[0, 3], [0, 4], [3, 5]], "units": "degC",
         "dimensions": ["height", "time", "lat", "lon"], "directions": {"height": True},
         "data": {"file": "sub/high.nc", "ncvar": "tas", "shape": [1, 3, 4, 2], "dtype": "float"}},
        {"index": [1, 1], "location": [[3, 6], [0, 4], [3, 5]], "directions": {"lat": False},
         "data": {"ncvar": "tas_p11", "shape": [3, 4, 2], "dtype": "float"}},
    ]
    array = {"pmdimensions": ["time", "lon"], "pmshape": [2, 2], "base": "", "Partitions": partitions}
    path = directory / "virtual.nca"
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.5 NCA"
        for name, size in zip(("time", "lat", "lon"), t.shape):
            ds.createDimension(name, size)
        for name, size in zip(("p11_time", "p11_lat", "p11_lon"), (3, 4, 2)):
            ds.createDimension(name, size)
        private = ds.createVariable("tas_p11", "f4", ("p11_time", "p11_lat", "p11_lon"))
        private.cf_role = "nca_private"
        private[...] = t[3:6, ::-1, 3:5]
        var = ds.createVariable("tas", "f4")
        var.units = "K"
        if cf_role:
            var.cf_role = "nca_variable"
        var.nca_dimensions = "time lat lon"
        var.nca_array = str(array)  # Python style: single quotes, as in the convention's examples
    return Built(dialect="NCA", path=path, variable="tas", expected=np.ma.asarray(t), dims=("time", "lat", "lon"),
                 sizes=((3, 3), (4,), (3, 2)), fill_value=None)
