"""Deterministic generator of CF-1.13 aggregation datasets for the benchmarks.

A dataset is one directory holding

* ``frag/tas_NNNNN.nc``: self-describing netCDF-4 fragment files (dimensions
  ``time``, ``lat``, ``lon``, their coordinate variables, the float32 variable
  ``tas`` with its attributes, global attributes), one per fragment along
  ``time`` (the fragments tile only the time axis);
* ``aggregation.nc``: the CF-1.13 aggregation file (scalar ``tas`` with
  ``aggregated_dimensions`` / ``aggregated_data = "map: ... uris: ...
  identifiers: ..."``, relative URIs, full coordinate variables,
  ``Conventions = "CF-1.13"``) that both cfdm >= 1.13 and cfapyx read;
* ``params.json``: the parameters (regeneration is skipped when they match)
  plus the fragment list;
* ``truth.npz``: the ground truth: the float64 mean over (lat, lon) of every
  time step, accumulated while writing;
* ``reductions.npz``: the ground truth of the whole-array reductions and the
  monthly climatology (:func:`reduction_truth`), computed from :func:`values`
  on first use.

A dataset "with missing values" (``missing`` > 0) has ``tas:_FillValue =
1e20`` and that value written at a pseudo-random fraction of the elements
(:func:`is_missing`, also a pure function of the indices); its truth is
computed on numpy masked arrays masked as netCDF4-python masks the stored
values (``== _FillValue``).

Values are ``value(t, y, x)`` (see :func:`values`), a pure function of the
*global* time index and the grid indices, so any point or time series can be
recomputed exactly in numpy. It is a smooth field plus quantised
pseudo-random noise, so zlib compresses it only moderately, like real data.

Usage::

    python -m benchmarks.generate --scenario read-zlib [--quick] [--datadir DIR]
    python -m benchmarks.generate --nfrag 100 --frag-shape 10,512,512 --zlib \
        --chunks 1,512,512 [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

GENERATOR_VERSION = 1
FILL_VALUE = np.float32(1e20)  #: ``tas:_FillValue`` of the datasets with missing values
TIME_UNITS = "days since 2000-01-01"  #: of the ``time`` coordinate, whose values are 0, 1, 2, ...
DEFAULT_DATADIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
VARNAME = "tas"
AGG_NAME = "aggregation.nc"
FRAG_DIR = "frag"


@dataclass(frozen=True)
class TimeTiles:
    """``nfrag`` float32 fragments of ``frag_shape`` tiling the time axis."""

    nfrag: int
    frag_shape: tuple[int, int, int]  # (time, lat, lon) of one fragment

    @property
    def shape(self) -> tuple[int, int, int]:
        nt, ny, nx = self.frag_shape
        return (self.nfrag * nt, ny, nx)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * 4


@dataclass(frozen=True)
class DatasetSpec(TimeTiles):
    """What to generate. Fragments tile the time axis only."""

    zlib: bool = False
    complevel: int = 1
    chunks: tuple[int, int, int] | None = None  # HDF5 chunk shape; None = contiguous
    shuffle: bool = False
    name: str | None = None
    file_format: str = "NETCDF4"  #: of the fragment files (the aggregation file is always netCDF-4)
    missing: float = 0.0  #: fraction of the elements written as ``_FillValue`` (:func:`is_missing`)
    #: masked data as users have it (:data:`MASKINGS`): "land", a fixed land mask of ``_FillValue`` in
    #: every time step; "valid", the same land as ``missing_value`` plus a ``valid_range`` that
    #: scattered spikes fall outside; "" none of these
    masking: str = ""

    @property
    def dirname(self) -> str:
        if self.name:
            return self.name
        shape = "x".join(map(str, self.frag_shape))
        comp = f"zlib{self.complevel}" if self.zlib else "raw"
        if self.shuffle:
            comp += "s"
        chunks = "contig" if self.chunks is None else "c" + "x".join(map(str, self.chunks))
        fmt = "" if self.file_format == "NETCDF4" else "_" + self.file_format.lower()
        miss = f"_miss{self.missing * 100:g}" if self.missing else ""
        miss += f"_{self.masking}{LAND_FRACTION * 100:g}" if self.masking else ""
        return f"n{self.nfrag}_f{shape}_{comp}_{chunks}{fmt}{miss}"

    def params(self) -> dict:
        d = asdict(self)
        d["frag_shape"] = list(self.frag_shape)
        d["chunks"] = None if self.chunks is None else list(self.chunks)
        d["shape"] = list(self.shape)
        d["generator_version"] = GENERATOR_VERSION
        # (datasets generated before these fields existed stay valid)
        if self.file_format == "NETCDF4":
            del d["file_format"]
        if self.missing:
            d["fill_value"] = float(FILL_VALUE)
        else:
            del d["missing"]
        if self.masking:
            d.update(MASKINGS[self.masking])
        else:
            del d["masking"]
        return d


# Datasets per scenario: (full size, --quick size).
SCENARIO_DATA: dict[str, tuple[DatasetSpec, DatasetSpec]] = {
    "open-1k": (
        DatasetSpec(1000, (1, 18, 36)),
        DatasetSpec(50, (1, 18, 36)),
    ),
    "open-10k": (
        DatasetSpec(10000, (1, 18, 36)),
        DatasetSpec(200, (1, 18, 36)),
    ),
    "read-uncompressed": (
        DatasetSpec(100, (10, 512, 512)),
        DatasetSpec(10, (4, 64, 64)),
    ),
    "read-zlib": (
        DatasetSpec(100, (10, 512, 512), zlib=True, chunks=(1, 512, 512)),
        DatasetSpec(10, (4, 64, 64), zlib=True, chunks=(1, 64, 64)),
    ),
    "timeseries": (
        DatasetSpec(1000, (1, 180, 360), zlib=True, chunks=(1, 180, 360)),
        DatasetSpec(50, (1, 18, 36), zlib=True, chunks=(1, 18, 36)),
    ),
    "read-netcdf3": (
        DatasetSpec(5000, (1, 18, 36), file_format="NETCDF3_CLASSIC"),
        DatasetSpec(200, (1, 18, 36), file_format="NETCDF3_CLASSIC"),
    ),
}

#: The whole-array reductions (how each tool computes them: ``benchmarks.tools``).
#: ``mean`` is ``x.mean(dtype="f8")``; ``mean32`` is ``x.mean()``, accumulated in
#: float32 as numpy does for float32 data; ``climatology`` is xarray's
#: ``groupby("time.month").mean()``.
REDUCTIONS = ("mean", "mean32", "sum", "std", "max", "climatology")
MISSING_FRACTION = 0.05  #: of the "-missing" datasets


def _reduction_data() -> dict[str, tuple[str, tuple[DatasetSpec, DatasetSpec]]]:
    """``"<op>-<compression>[-missing]"`` -> (op, its data): the read scenarios' datasets (with
    missing values: the same, 5% of the elements written as ``_FillValue``)."""
    out = {}
    for op in REDUCTIONS:
        for comp in ("uncompressed", "zlib"):
            full, small = SCENARIO_DATA[f"read-{comp}"]
            out[f"{op}-{comp}"] = (op, (full, small))
            out[f"{op}-{comp}-missing"] = (op, (replace(full, missing=MISSING_FRACTION),
                                                replace(small, missing=MISSING_FRACTION)))
    return out


def _masked_data() -> dict[str, tuple[str, tuple[DatasetSpec, DatasetSpec]]]:
    """``"<op>-uncompressed-<land|valid>"`` -> (op, its data): masked data as users have it (issue #31),
    uncompressed, so that the masking is not hidden behind inflating."""
    full, small = SCENARIO_DATA["read-uncompressed"]
    return {f"{op}-uncompressed-{m}": (op, (replace(full, masking=m), replace(small, masking=m)))
            for op in ("mean", "std", "max") for m in MASKINGS}


#: The attributes of each masking of :class:`DatasetSpec` (in ``params.json`` too; ``fill_value`` is
#: ``_FillValue``); every one is masked as netCDF4-python masks it (:func:`netcdf4_masked`)
MASKINGS = {
    "land": {"fill_value": float(FILL_VALUE)},
    "valid": {"missing_value": -999.0, "valid_range": [200.0, 320.0]},
}
LAND_FRACTION = 0.3  #: of the grid points, land in every time step (:func:`is_land`)
SPIKE_FRACTION = 0.005  #: of the "valid" data's elements: spikes of :data:`SPIKE` beyond the valid range
SPIKE = np.float32(1000.0)

#: Time-series scenarios read at another point than the grid centre: (y, x) as fractions of the grid
#: (``timeseries-quarter``: (45, 100) on 180 x 360, a quarter of the way into each chunk, as issue #31 ran it)
POINT_AT = {"timeseries-quarter": (1 / 4, 100 / 360)}
SCENARIO_DATA["timeseries-quarter"] = SCENARIO_DATA["timeseries"]

_REDUCTION_DATA = _reduction_data()
_REDUCTION_DATA.update(_masked_data())
SCENARIO_DATA.update({name: specs for name, (_, specs) in _REDUCTION_DATA.items()})
#: scenario -> its reduction, local and (``s3-`` + the name) on S3
REDUCTION_SCENARIOS = {name: op for name, (op, _) in _REDUCTION_DATA.items()}
REDUCTION_SCENARIOS.update({f"s3-{name}": op for name, (op, _) in _REDUCTION_DATA.items()})


# A tiny dataset each tool reads once, in the measured process but before the
# clock starts, so that lazy imports / first-call costs are not timed.
WARMUP_SPEC = DatasetSpec(2, (2, 6, 8), zlib=True, chunks=(1, 6, 8), name="warmup")


# The S3 scenarios read the same datasets as their local counterparts, uploaded
# to a local S3 server by ``benchmarks.run`` (see ``benchmarks/s3.py``).
S3_SCENARIOS = {
    "s3-read-uncompressed": "read-uncompressed",
    "s3-read-zlib": "read-zlib",
    "s3-timeseries": "timeseries",
    "s3-timeseries-quarter": "timeseries-quarter",
}
S3_SCENARIOS.update({s: s[3:] for s in REDUCTION_SCENARIOS if s.startswith("s3-")})


def at_scenario_point(ds: "Dataset", scenario: str) -> "Dataset":
    """``ds`` with the point the scenario reads its time series at (:data:`POINT_AT`)."""
    at = POINT_AT.get(S3_SCENARIOS.get(scenario, scenario))
    if at is None:
        return ds
    return replace(ds, at=(int(at[0] * ds.shape[1]), int(at[1] * ds.shape[2])))


def spec_for(scenario: str, quick: bool = False) -> DatasetSpec:
    full, small = SCENARIO_DATA[S3_SCENARIOS.get(scenario, scenario)]
    return small if quick else full


# ----------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------
def _mix(h: np.ndarray) -> np.ndarray:
    """A cheap integer hash (uint64 arithmetic wraps silently)."""
    h = h ^ (h >> np.uint64(29))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(32))
    return h


def values(t, y, x, ny: int, nx: int) -> np.ndarray:
    """The float32 value at global time index ``t`` and grid indices ``y, x``.

    Arguments broadcast like numpy arrays (use ``np.ix_`` for blocks). The
    result is bit-for-bit reproducible, so ground truth for any point or
    time series is this function itself.
    """
    t = np.asarray(t, dtype=np.int64)
    y = np.asarray(y, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64)
    lat = np.deg2rad(-90.0 + (y + 0.5) * (180.0 / ny))
    lon = np.deg2rad((x + 0.5) * (360.0 / nx))
    smooth = 250.0 + 0.01 * t + 30.0 * np.cos(lat) + 5.0 * np.sin(2.0 * lon) * np.cos(lat)
    h = _mix(
        t.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        + y.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
        + x.astype(np.uint64) * np.uint64(0x165667B19E3779F9)
    )
    noise = ((h & np.uint64(1023)).astype(np.float64) - 511.5) / 256.0  # +-2 K, 1/256 steps
    return (smooth + noise).astype(np.float32)


def is_missing(t, y, x, fraction: float) -> np.ndarray:
    """Whether the element at ``(t, y, x)`` is written as ``_FillValue`` (about ``fraction`` of
    them, scattered; a hash independent of the noise's). Broadcasts like :func:`values`."""
    h = _mix(
        np.asarray(t, dtype=np.int64).astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)
        + np.asarray(y, dtype=np.int64).astype(np.uint64) * np.uint64(0xA0761D6478BD642F)
        + np.asarray(x, dtype=np.int64).astype(np.uint64) * np.uint64(0xE7037ED1A0B428DB)
    )
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53 < fraction


def is_land(ny: int, nx: int) -> np.ndarray:
    """A fixed land mask of the (lat, lon) grid: :data:`LAND_FRACTION` of the points, in blobs
    (continents) rather than scattered, the same in every time step."""
    lat = np.deg2rad(-90.0 + (np.arange(ny) + 0.5) * (180.0 / ny))[:, None]
    lon = np.deg2rad((np.arange(nx) + 0.5) * (360.0 / nx))[None, :]
    h = np.sin(2.0 * lon + 1.0) * np.cos(3.0 * lat) + 0.6 * np.sin(5.0 * lon) * np.sin(2.0 * lat + 0.5)
    return h > np.quantile(h, 1.0 - LAND_FRACTION)


def stored(t0: int, t1: int, ny: int, nx: int, missing: float = 0.0, masking: str = "") -> np.ndarray:
    """Time steps ``t0:t1`` as written to the files (missing elements = :data:`FILL_VALUE`; with a
    ``masking``, land = its fill or missing value, and for "valid" spikes beyond the valid range)."""
    idx = np.ix_(np.arange(t0, t1), np.arange(ny), np.arange(nx))
    data = values(*idx, ny=ny, nx=nx)
    if missing:
        data[np.broadcast_to(is_missing(*idx, missing), data.shape)] = FILL_VALUE
    if masking == "valid":
        data[np.broadcast_to(is_missing(*idx, SPIKE_FRACTION), data.shape)] = SPIKE
    if masking:
        attrs = MASKINGS[masking]
        data[:, is_land(ny, nx)] = np.float32(attrs.get("fill_value", attrs.get("missing_value")))
    return data


def netcdf4_masked(data: np.ndarray, attrs: dict) -> np.ma.MaskedArray:
    """``data`` masked as netCDF4-python masks stored values: where equal to ``_FillValue``
    (``attrs["fill_value"]``) or ``missing_value``, or outside ``valid_range`` (``attrs``: a
    dataset's parameters)."""
    mask = np.zeros(data.shape, bool)
    for name in ("fill_value", "missing_value"):
        if attrs.get(name) is not None:
            mask |= data == np.float32(attrs[name])
    if attrs.get("valid_range") is not None:
        low, high = np.float32(attrs["valid_range"])
        mask |= (data < low) | (data > high)
    return np.ma.MaskedArray(data, mask=mask)


def month_of(days) -> np.ndarray:
    """The calendar month (1-12) of ``days`` since 2000-01-01 (standard calendar)."""
    d = np.datetime64("2000-01-01", "D") + np.asarray(days).astype("timedelta64[D]")
    return d.astype("datetime64[M]").astype(np.int64) % 12 + 1


def point(spec_or_shape) -> tuple[int, int]:
    """The (y, x) grid point of the time-series scenario: (90, 180) on a
    180 x 360 grid, the grid centre in general."""
    shape = spec_or_shape.shape if isinstance(spec_or_shape, DatasetSpec) else spec_or_shape
    return (shape[1] // 2, shape[2] // 2)


# ----------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------
def _coords(spec: DatasetSpec):
    nt, ny, nx = spec.shape
    lat = -90.0 + (np.arange(ny) + 0.5) * (180.0 / ny)
    lon = (np.arange(nx) + 0.5) * (360.0 / nx)
    time_ = np.arange(nt, dtype=np.float64)
    return time_, lat, lon


def _write_coords(nc, time_, lat, lon):
    tv = nc.createVariable("time", "f8", ("time",))
    tv.standard_name = "time"
    tv.units = TIME_UNITS
    tv.calendar = "standard"
    tv.axis = "T"
    tv[:] = time_
    yv = nc.createVariable("lat", "f8", ("lat",))
    yv.standard_name = "latitude"
    yv.units = "degrees_north"
    yv.axis = "Y"
    yv[:] = lat
    xv = nc.createVariable("lon", "f8", ("lon",))
    xv.standard_name = "longitude"
    xv.units = "degrees_east"
    xv.axis = "X"
    xv[:] = lon


def _tas_attrs(v):
    v.standard_name = "air_temperature"
    v.long_name = "Near-surface air temperature"
    v.units = "K"


def _masking_attrs(v, spec: DatasetSpec) -> None:
    """``missing_value`` and ``valid_range`` of a "valid" masking (float32, the variable's type)."""
    attrs = MASKINGS.get(spec.masking, {})
    if "missing_value" in attrs:
        v.missing_value = np.float32(attrs["missing_value"])
    if "valid_range" in attrs:
        v.valid_range = np.array(attrs["valid_range"], np.float32)


def frag_relpath(i: int) -> str:
    return f"{FRAG_DIR}/{VARNAME}_{i:05d}.nc"


def _write_fragment(path: str, spec: DatasetSpec, i: int, coords) -> np.ndarray:
    """Write fragment ``i``; return the float64 spatial mean of each time step."""
    import netCDF4

    time_, lat, lon = coords
    nt, ny, nx = spec.frag_shape
    t0 = i * nt
    data = stored(t0, t0 + nt, ny, nx, spec.missing, spec.masking)
    with netCDF4.Dataset(path, "w", format=spec.file_format) as nc:
        nc.Conventions = "CF-1.13"
        nc.title = f"daskcfa benchmark fragment {i}"
        nc.createDimension("time", nt)
        nc.createDimension("lat", ny)
        nc.createDimension("lon", nx)
        _write_coords(nc, time_[t0 : t0 + nt], lat, lon)
        kw = {} if spec.file_format.startswith("NETCDF3") else {"contiguous": not spec.zlib}
        if spec.zlib:
            kw.update(zlib=True, complevel=spec.complevel, shuffle=spec.shuffle)
        if spec.chunks is not None:
            kw.update(chunksizes=spec.chunks, contiguous=False)
        fill = FILL_VALUE if spec.missing or "fill_value" in MASKINGS.get(spec.masking, {}) else False
        v = nc.createVariable(VARNAME, "f4", ("time", "lat", "lon"), fill_value=fill, **kw)
        _tas_attrs(v)
        _masking_attrs(v, spec)
        v.set_auto_mask(False)
        v[...] = data
    masked = netcdf4_masked(data, spec.params())
    return np.ma.filled(masked.astype(np.float64).mean(axis=(1, 2)), np.nan)


def _write_aggregation(path: str, spec: DatasetSpec, coords) -> None:
    """The CF-1.13 aggregation file (section 2.8)."""
    import netCDF4

    time_, lat, lon = coords
    nt, ny, nx = spec.shape
    nf = spec.nfrag
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        # cfdm decides from Conventions (needs >= CF-1.12); cfapyx reads the
        # global Conventions attribute unconditionally (AttributeError without).
        nc.Conventions = "CF-1.13"
        nc.title = "daskcfa benchmark aggregation"
        nc.createDimension("time", nt)
        nc.createDimension("lat", ny)
        nc.createDimension("lon", nx)
        nc.createDimension("f_time", nf)
        nc.createDimension("f_lat", 1)
        nc.createDimension("f_lon", 1)
        nc.createDimension("i", 3)
        nc.createDimension("j", nf)
        _write_coords(nc, time_, lat, lon)
        # (the aggregation variable's _FillValue describes the aggregated data, as cfdm writes it)
        fill = FILL_VALUE if spec.missing or "fill_value" in MASKINGS.get(spec.masking, {}) else None
        v = nc.createVariable(VARNAME, "f4", (), fill_value=fill)
        _tas_attrs(v)
        _masking_attrs(v, spec)
        v.aggregated_dimensions = "time lat lon"
        # Single blanks: cfapyx splits on " " only.
        v.aggregated_data = (
            "map: fragment_map uris: fragment_uris identifiers: fragment_identifiers"
        )
        # map padded with the netCDF default fill and no _FillValue (as cfdm
        # writes it); netCDF4-python masks the default fill, which cfapyx needs.
        m = nc.createVariable("fragment_map", "i4", ("i", "j"))
        fill = netCDF4.default_fillvals["i4"]
        mp = np.full((3, nf), fill, dtype=np.int32)
        mp[0, :] = spec.frag_shape[0]
        mp[1, 0] = ny
        mp[2, 0] = nx
        m[...] = mp
        u = nc.createVariable("fragment_uris", str, ("f_time", "f_lat", "f_lon"))
        uris = np.array([frag_relpath(i) for i in range(nf)], dtype=object)
        u[...] = uris.reshape(nf, 1, 1)
        ident = nc.createVariable("fragment_identifiers", str, ())
        ident[...] = np.array(VARNAME, dtype=object)


def dataset_dir(spec: DatasetSpec, datadir: str = DEFAULT_DATADIR) -> str:
    return os.path.join(os.path.abspath(datadir), spec.dirname)


def ensure(spec: DatasetSpec, datadir: str = DEFAULT_DATADIR, force: bool = False,
           verbose: bool = True) -> str:
    """Generate ``spec`` under ``datadir`` unless already present; return its directory."""
    out = dataset_dir(spec, datadir)
    pfile = os.path.join(out, "params.json")
    want = spec.params()
    if not force and os.path.exists(pfile):
        with open(pfile) as f:
            have = json.load(f)
        if {k: have.get(k) for k in want} == want and have.get("complete"):
            return out
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, FRAG_DIR))
    t0 = time.perf_counter()
    if verbose:
        print(f"generating {out} ({spec.nfrag} fragments, {spec.nbytes / 1e9:.3f} GB) ...",
              file=sys.stderr, flush=True)
    coords = _coords(spec)
    means = np.empty(spec.shape[0], dtype=np.float64)
    nt = spec.frag_shape[0]
    for i in range(spec.nfrag):
        means[i * nt:(i + 1) * nt] = _write_fragment(
            os.path.join(out, frag_relpath(i)), spec, i, coords)
    _write_aggregation(os.path.join(out, AGG_NAME), spec, coords)
    np.savez(os.path.join(out, "truth.npz"), spatial_mean=means)
    frag_bytes = sum(os.path.getsize(os.path.join(out, frag_relpath(i)))
                     for i in range(spec.nfrag))
    params = dict(want, complete=True, fragments=[frag_relpath(i) for i in range(spec.nfrag)],
                  aggregation=AGG_NAME, variable=VARNAME, fragment_bytes=frag_bytes,
                  generate_seconds=round(time.perf_counter() - t0, 2))
    with open(pfile, "w") as f:
        json.dump(params, f)
    if verbose:
        print(f"  done in {params['generate_seconds']} s; fragment files {frag_bytes / 1e9:.3f} GB "
              f"(data {spec.nbytes / 1e9:.3f} GB)", file=sys.stderr, flush=True)
    return out


# ----------------------------------------------------------------------------
# Reading back what was generated
# ----------------------------------------------------------------------------
@dataclass
class Dataset:
    """A generated dataset as seen by the tools and the checks."""

    dir: str
    params: dict = field(repr=False)
    at: tuple[int, int] | None = field(default=None, repr=False)  #: the time series' point (None: the centre)

    @classmethod
    def load(cls, path: str) -> "Dataset":
        with open(os.path.join(path, "params.json")) as f:
            return cls(os.path.abspath(path), json.load(f))

    @property
    def agg(self) -> str:
        return os.path.join(self.dir, self.params["aggregation"])

    @property
    def fragments(self) -> list[str]:
        return [os.path.join(self.dir, p) for p in self.params["fragments"]]

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.params["shape"])

    @property
    def frag_shape(self) -> tuple[int, int, int]:
        return tuple(self.params["frag_shape"])

    @property
    def nfrag(self) -> int:
        return self.params["nfrag"]

    @property
    def point(self) -> tuple[int, int]:
        return self.at or point(self.shape)

    def spatial_mean(self) -> np.ndarray:
        return np.load(os.path.join(self.dir, "truth.npz"))["spatial_mean"]

    def timeseries(self) -> np.ndarray:
        nt, ny, nx = self.shape
        py, px = self.point
        return values(np.arange(nt), py, px, ny=ny, nx=nx)

    def value(self, t: int, y: int, x: int) -> float:
        return float(values(t, y, x, ny=self.shape[1], nx=self.shape[2]))

    @property
    def fill_value(self) -> float | None:
        """``tas:_FillValue`` (None: the variable has none, and no element is missing)."""
        return self.params.get("fill_value")

    def reductions(self) -> dict:
        """The ground truth of the reductions (:func:`reduction_truth`), computed once and kept
        in ``reductions.npz``."""
        path = os.path.join(self.dir, "reductions.npz")
        if not os.path.exists(path):
            tmp = path + ".tmp.npz"
            np.savez(tmp, **reduction_truth(self))
            os.replace(tmp, path)
        with np.load(path) as f:
            return {k: f[k] for k in f.files}


#: Grid points whose climatology is checked (fractions of the grid), besides each month's mean
CLIMATOLOGY_PROBES = ((0.5, 0.5), (0.0, 0.0), (0.999, 0.999), (0.3, 0.7))


def reduction_truth(ds: Dataset) -> dict:
    """The whole-array count, sum, mean, std (ddof 0) and max, and the monthly climatology (the
    mean of each grid point over the time steps of each calendar month; NaN where none is valid),
    all in float64 from :func:`stored` masked as netCDF4-python masks it. The variance is
    combined from per-fragment counts, means and squared deviations (Chan et al.), so no sum of
    squares of the values is ever formed."""
    nt, ny, nx = ds.shape
    ft = ds.frag_shape[0]
    months = month_of(np.arange(nt))
    csum = np.zeros((12, ny, nx))
    ccount = np.zeros((12, ny, nx), dtype=np.int64)
    n, total, mean, m2, vmax = 0, 0.0, 0.0, 0.0, -np.inf
    for t0 in range(0, nt, ft):
        a = netcdf4_masked(stored(t0, t0 + ft, ny, nx, ds.params.get("missing", 0.0), ds.params.get("masking", "")),
                           ds.params).astype(np.float64)
        nb = int(a.count())
        sb = float(a.sum())
        mb = sb / nb
        m2b = float(((a - mb) ** 2).sum())
        delta = mb - mean
        m2 += m2b + delta * delta * n * nb / (n + nb)
        mean += delta * nb / (n + nb)
        n, total, vmax = n + nb, total + sb, max(vmax, float(a.max()))
        for m in np.unique(months[t0:t0 + ft]):
            sel = a[months[t0:t0 + ft] == m]
            csum[m - 1] += sel.filled(0.0).sum(axis=0)
            ccount[m - 1] += sel.count(axis=0)
    present = np.flatnonzero(ccount.any(axis=(1, 2)))
    with np.errstate(invalid="ignore", divide="ignore"):
        clim = csum[present] / ccount[present]
    return {"count": n, "sum": total, "mean": total / n, "std": np.sqrt(m2 / n), "max": vmax,
            "clim_months": present + 1, "climatology": clim}


def climatology_summary(months, clim) -> dict:
    """What a climatology (months, array (month, lat, lon), NaN or masked where undefined) is
    checked by: its months, each month's mean over the grid and its values at
    :data:`CLIMATOLOGY_PROBES` (float64; JSON-sized)."""
    a = np.ma.filled(np.ma.asarray(clim).astype(np.float64), np.nan)
    _, ny, nx = a.shape
    pts = [(int(fy * ny), int(fx * nx)) for fy, fx in CLIMATOLOGY_PROBES]
    return {"months": [int(m) for m in np.asarray(months).ravel()], "shape": list(a.shape),
            "month_mean": np.nanmean(a, axis=(1, 2)).tolist(),
            "points": [a[:, y, x].tolist() for y, x in pts], "undefined": int(np.isnan(a).sum())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datadir", default=DEFAULT_DATADIR)
    p.add_argument("--scenario", action="append",
                   help=f"generate the data of a scenario ({', '.join([*SCENARIO_DATA, *S3_SCENARIOS])}, all)")
    p.add_argument("--warmup", action="store_true",
                   help="the tiny dataset benchmarks.tools runs first (--warm=DATADIR/warmup)")
    p.add_argument("--quick", action="store_true", help="small sizes")
    p.add_argument("--nfrag", type=int)
    p.add_argument("--frag-shape", help="e.g. 10,512,512")
    p.add_argument("--zlib", action="store_true")
    p.add_argument("--complevel", type=int, default=1)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--chunks", help="HDF5 chunk shape, e.g. 1,512,512 (default contiguous)")
    p.add_argument("--name", help="directory name (default derived from the parameters)")
    p.add_argument("--force", action="store_true", help="regenerate even if present")
    a = p.parse_args(argv)
    specs = [WARMUP_SPEC] if a.warmup else []
    if a.scenario:
        names = list(SCENARIO_DATA) if "all" in a.scenario else a.scenario
        for n in names:
            if n not in SCENARIO_DATA and n not in S3_SCENARIOS:
                p.error(f"unknown scenario {n!r}")
        specs += [spec_for(s, a.quick) for s in names]
    if a.nfrag:
        if not a.frag_shape:
            p.error("--nfrag needs --frag-shape")
        specs.append(DatasetSpec(
            a.nfrag, tuple(int(v) for v in a.frag_shape.split(",")), zlib=a.zlib,
            complevel=a.complevel, shuffle=a.shuffle,
            chunks=tuple(int(v) for v in a.chunks.split(",")) if a.chunks else None,
            name=a.name))
    if not specs:
        p.error("nothing to generate: give --scenario, --warmup or --nfrag/--frag-shape")
    for s in specs:
        print(ensure(s, a.datadir, force=a.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
