"""One measured run of one tool on one scenario, in a fresh process.

    python -m benchmarks.tools TOOL SCENARIO DATASET_DIR [--no-probe] [--warm=DIR]

Imports and other set-up happen before the clock starts (with ``--warm=DIR``
the tool first runs once on the tiny dataset DIR, so that lazy imports and
first-call costs inside the tool are not timed); the clock covers
opening the dataset, building the lazy array and (for the read scenarios)
computing the answer. The answer is summarised after the clock stops and
printed, with the time, as one JSON line prefixed with ``@@RESULT@@``; the
caller (:mod:`benchmarks.run`) checks it against the ground truth.

Scenario kinds:

* ``open``: open the aggregation and build the lazy (dask) array;
  the result is its shape, dtype and chunking, plus one probe value read
  after the clock stops (``--no-probe`` skips it).
* ``read``: read everything and compute the mean over (lat, lon) of every
  time step (a full read + mean; the per-time means also catch misplaced
  fragments, which a plain mean would not).
* ``timeseries``: ``x[:, py, px]`` with (py, px) the grid centre.
* ``mean``: the whole-array mean accumulated in float64 (``x.mean(dtype="f8")``),
  with each tool's default masking (the README's example operation).
* ``mean32``, ``sum``, ``std``, ``max``: ``x.mean()``, ``x.sum()``, ``x.std()``,
  ``x.max()`` (accumulated in float32, as numpy does for float32 data), with each
  tool's default masking; the scenario names say the data
  (``<op>-<uncompressed|zlib>[-missing]``; ``-missing``: 5% of the elements are
  ``_FillValue``).
* ``climatology``: xarray's ``groupby("time.month").mean()`` of the variable
  (tools without xarray cannot do it).

The ``s3-*`` scenarios do the same on the same datasets uploaded to a local
S3 server; the server (endpoint, credentials, bucket, metrics address) comes
from the environment variable ``DASKCFA_BENCH_S3`` set by
:mod:`benchmarks.run` (see :mod:`benchmarks.s3`), and the bytes the server
sent during the timed part are part of the result.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import sys
import time
import traceback

from dataclasses import dataclass, field

import numpy as np

from benchmarks import s3 as s3mod
from benchmarks.measure import cpu_seconds
from benchmarks.generate import REDUCTION_SCENARIOS, S3_SCENARIOS, Dataset, at_scenario_point, climatology_summary

SCENARIO_KIND = {
    "open-1k": "open",
    "open-10k": "open",
    "read-uncompressed": "read",
    "read-zlib": "read",
    "timeseries": "timeseries",
    "read-netcdf3": "read",
    "s3-read-uncompressed": "read",
    "s3-read-zlib": "read",
    "s3-timeseries": "timeseries",
    "timeseries-quarter": "timeseries",
    "s3-timeseries-quarter": "timeseries",
    **REDUCTION_SCENARIOS,
}

#: The whole-array reductions, on a dask array or an xarray DataArray alike (each tool's
#: default masking; xarray skips NaN)
REDUCE = {
    "mean": lambda x: x.mean(dtype="f8"),
    "mean32": lambda x: x.mean(),
    "sum": lambda x: x.sum(),
    "std": lambda x: x.std(),
    "max": lambda x: x.max(),
}
CLIMATOLOGY = "climatology"

NEUTRAL_CWD = "/"  # tools that must not depend on the working directory run here


class CannotDo(Exception):
    """The tool cannot do this task (reason in the message)."""


@dataclass
class S3Dataset(Dataset):
    """A generated dataset as uploaded to the run's S3 server: the local copy
    (parameters, ground truth) plus where its objects are."""

    s3: s3mod.Target = field(default=None, repr=False)

    @classmethod
    def on(cls, ds: Dataset, target: s3mod.Target) -> "S3Dataset":
        return cls(ds.dir, ds.params, at=ds.at, s3=target)

    @property
    def agg_url(self) -> str:
        return f"s3://{self.s3.prefix(self.dir)}/{self.params['aggregation']}"

    @property
    def fragment_urls(self) -> list[str]:
        return [f"s3://{self.s3.prefix(self.dir)}/{p}" for p in self.params["fragments"]]

    @property
    def storage_options(self) -> dict:
        return self.s3.storage_options

    def filesystem(self):
        """An s3fs filesystem (fsspec's instance cache applies, as for any user)."""
        return self.s3.filesystem()


def _on_s3(ds) -> S3Dataset | None:
    return ds if isinstance(ds, S3Dataset) else None


# ----------------------------------------------------------------------------
# Shared operations on a dask array / xarray DataArray
# ----------------------------------------------------------------------------
def _find_dask(obj):
    import dask.array as da

    return obj if isinstance(obj, da.Array) else None


def _chunks_info(x, ds: Dataset) -> dict:
    """Shape/dtype/chunking of a lazy array (dask or anything with .shape/.dtype)."""
    info = {"shape": list(x.shape), "dtype": str(x.dtype)}
    chunks = getattr(x, "chunks", None)
    if chunks is not None:
        info["numblocks"] = [len(c) for c in chunks]
        want = (tuple([ds.frag_shape[0]] * ds.nfrag), (ds.shape[1],), (ds.shape[2],))
        info["fragment_chunks"] = tuple(tuple(c) for c in chunks) == want
        try:
            info["graph_tasks"] = len(x.__dask_graph__())
        except Exception:  # noqa: BLE001
            pass
    return info


def _probe_index(ds: Dataset) -> tuple[int, int, int]:
    return (ds.shape[0] - 1, 1, 2)


def _dask_op(kind: str, ds: Dataset, x, **compute_kw):
    if kind == "open":
        return x
    if kind == "read":
        return x.mean(axis=(1, 2)).compute(**compute_kw)
    if kind in REDUCE:
        return REDUCE[kind](x).compute(**compute_kw)
    if kind == CLIMATOLOGY:
        raise CannotDo("no grouping by month: a dask array has no time coordinate")
    py, px = ds.point
    return x[:, py, px].compute(**compute_kw)


def _dask_describe(kind, ds, value, probe):
    if kind == "open":
        info = _chunks_info(value, ds)
        if probe:
            info["probe"] = float(np.asarray(value[_probe_index(ds)].compute()))
        return info
    return _array_result(kind, value)


def _array_result(kind, value) -> dict:
    if kind in REDUCE:
        return {"value": float(value), "dtype": str(np.asarray(value).dtype)}
    if kind == CLIMATOLOGY:
        months, clim = value
        return climatology_summary(months, clim) | {"dtype": str(np.asarray(clim).dtype)}
    a = np.asarray(value)
    key = "spatial_mean" if kind == "read" else "series"
    return {key: a.astype(np.float64).ravel().tolist(), "dtype": str(a.dtype)}


def _xr_op(kind, ds, da_, **compute_kw):
    if kind == "open":
        return da_
    if kind == "read":
        return da_.mean(dim=("lat", "lon")).values
    if kind in REDUCE:
        return REDUCE[kind](da_).compute(**compute_kw).values
    if kind == CLIMATOLOGY:
        clim = da_.groupby("time.month").mean().compute(**compute_kw)
        return clim["month"].values, clim.values
    py, px = ds.point
    return da_.isel(lat=py, lon=px).values


def _xr_describe(kind, ds, value, probe):
    if kind == "open":
        data = value.data if hasattr(value, "data") else value
        info = _chunks_info(data if _find_dask(data) is not None else value, ds)
        if probe:
            t, y, x = _probe_index(ds)
            info["probe"] = float(np.asarray(value[t, y, x]))
        return info
    return _array_result(kind, value)


# ----------------------------------------------------------------------------
# Tools. Each: setup(kind, ds) -> (run, describe, teardown)
#   run() is timed and returns a value; describe(value, probe) -> dict.
# ----------------------------------------------------------------------------
def tool_daskcfa(kind, ds, scheduler=None, chunks="fragments"):
    try:
        import daskcfa
    except Exception as e:  # noqa: BLE001
        raise CannotDo(f"ImportError: {e}") from None
    from_cfa = getattr(daskcfa, "from_cfa", None)
    if from_cfa is None:
        raise CannotDo("ImportError: daskcfa has no from_cfa")
    os.chdir(NEUTRAL_CWD)  # relative URIs must resolve against the file, not the cwd
    kw = {} if scheduler is None else {"scheduler": scheduler}
    s3 = _on_s3(ds)
    url = s3.agg_url if s3 else ds.agg
    open_kw = {"storage_options": s3.storage_options} if s3 else {}

    def run():
        if kind == CLIMATOLOGY:  # through daskcfa's xarray backend, one dask chunk per fragment
            xds = xr.open_dataset(url, engine="daskcfa", chunks={}, **open_kw)
            return _xr_op(kind, ds, xds["tas"], **kw)
        x = from_cfa(url, "tas", chunks=chunks, **open_kw)
        return _dask_op(kind, ds, x, **kw)

    if kind == CLIMATOLOGY:
        if chunks != "fragments":
            raise CannotDo("the xarray backend's chunks are the fragments")
        import xarray as xr
    return run, lambda v, p: _dask_describe(kind, ds, v, p), None


def tool_daskcfa_processes(kind, ds):
    if kind == "open":
        raise CannotDo("not applicable (no compute in open scenarios)")
    return tool_daskcfa(kind, ds, scheduler="processes")


def tool_daskcfa_distributed(kind, ds):
    if kind == "open":
        raise CannotDo("not applicable (no compute in open scenarios)")
    run, describe, _ = tool_daskcfa(kind, ds)
    from distributed import Client, LocalCluster

    # Cluster start-up and worker imports happen before the clock starts.
    if "cluster" not in _DISTRIBUTED:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
        client.run(lambda: __import__("daskcfa") and None)
        _DISTRIBUTED.update(cluster=cluster, client=client)

    def teardown():
        _DISTRIBUTED.pop("client").close()
        _DISTRIBUTED.pop("cluster").close()

    return run, describe, teardown


_DISTRIBUTED: dict = {}


def tool_cfdm(kind, ds):
    if kind == CLIMATOLOGY:
        raise CannotDo("no grouped reductions in cfdm (cf-python's Field.collapse(..., "
                       "group=cf.M()) has them)")
    import cfdm

    s3 = _on_s3(ds)
    if s3:
        # Never the local copy: a relative URI resolved against the working
        # directory must not find the files on disk.
        os.chdir(NEUTRAL_CWD)
        # cfdm's documented S3 form is s3://<authority>/<bucket>/<key>: it
        # always strips the first component as the endpoint (with plain
        # s3://<bucket>/<key> it looks for "<key>" on the local disk).
        host = s3.s3.endpoint_url.split("://", 1)[1]
        url = s3.agg_url.replace("s3://", f"s3://{host}/", 1)
        read_kw = {"storage_options": s3.storage_options}
    else:
        # cfdm resolves relative fragment URIs against the working directory.
        os.chdir(ds.dir)
        url, read_kw = ds.agg, {}

    def run():
        fields = cfdm.read(url, **read_kw)
        sel = [f for f in fields if f.nc_get_variable(None) == "tas"]
        if not sel:
            raise CannotDo(f"no field 'tas' among {fields}")
        x = sel[0].data.to_dask_array()
        return _dask_op(kind, ds, x)

    return run, lambda v, p: _dask_describe(kind, ds, v, p), None


def _cfapyx_fragment_array(da_):
    """The dask array cfapyx builds from its fragments (internals; built on access)."""
    from cfapyx.wrappers import FragmentArrayWrapper

    a = da_.variable._data
    for _ in range(10):
        if isinstance(a, FragmentArrayWrapper):
            return a.__array__()
        a = getattr(a, "array", None)
        if a is None:
            break
    return None


def tool_cfapyx(kind, ds):
    if _on_s3(ds):
        raise CannotDo("no S3 support: open_dataset fetches an s3:// name with a plain "
                       "requests.get(), with no way to give an endpoint or credentials")
    import xarray as xr
    import cfapyx  # noqa: F401  (registers the "CFA" engine)

    # cfapyx resolves relative fragment URIs against the working directory.
    os.chdir(ds.dir)

    def run():
        xds = xr.open_dataset(ds.agg, engine="CFA")
        tas = xds["tas"]
        if kind == "open":
            # cfapyx builds its per-fragment dask array only when the variable
            # is indexed; build it here so that "open" means the same thing
            # as for the other tools.
            x = _cfapyx_fragment_array(tas)
            return (tas, x)
        return _xr_op(kind, ds, tas)

    def describe(value, probe):
        if kind != "open":
            return _array_result(kind, value)
        tas, x = value
        info = _chunks_info(x if x is not None else tas, ds)
        if x is None:
            info["note"] = "fragment dask array not found; timed open_dataset only"
        if probe:
            t, y, xx = _probe_index(ds)
            info["probe"] = float(np.asarray(tas[t, y, xx].values))
        return info

    return run, describe, None


MFDATASET_KW = dict(
    combine="by_coords",
    chunks={"time": -1, "lat": -1, "lon": -1},  # one dask chunk per file
    # xarray's documented fast path for many files:
    data_vars="minimal", coords="minimal", compat="override",
    parallel=False,  # parallel=True segfaults with the netCDF4 engine here
)


def tool_xarray_mfdataset(kind, ds):
    import xarray as xr

    os.chdir(NEUTRAL_CWD)
    s3 = _on_s3(ds)
    files = ds.fragments

    def run():
        if s3:
            # xarray's documented way for S3: s3fs file objects + h5netcdf.
            fs = s3.filesystem()
            objs = [fs.open(u, "rb") for u in s3.fragment_urls]
            xds = xr.open_mfdataset(objs, engine="h5netcdf", **MFDATASET_KW)
        else:
            xds = xr.open_mfdataset(files, **MFDATASET_KW)
        return _xr_op(kind, ds, xds["tas"])

    return run, lambda v, p: _xr_describe(kind, ds, v, p), None


def tool_raw_agg(kind, ds):
    """Open baseline: read the aggregation file's instruction variables with netCDF4."""
    if kind != "open":
        raise CannotDo("not applicable (open scenarios only)")
    import netCDF4

    def run():
        with netCDF4.Dataset(ds.agg) as nc:
            v = nc.variables["tas"]
            dims = v.getncattr("aggregated_dimensions").split()
            words = v.getncattr("aggregated_data").split()
            terms = dict(zip((w.rstrip(":") for w in words[0::2]), words[1::2]))
            fmap = np.ma.filled(nc.variables[terms["map"]][...], 0)
            uris = nc.variables[terms["uris"]][...]
            ident = nc.variables[terms["identifiers"]][...]
        return dims, fmap, uris, ident

    def describe(value, probe):
        dims, fmap, uris, ident = value
        sizes = [[int(s) for s in row if s > 0] for row in fmap]
        return {"shape": [sum(r) for r in sizes], "dtype": "float32",
                "numblocks": [len(r) for r in sizes], "n_uris": int(np.size(uris))}

    return run, describe, None


def _raw_values(nc, kind, point):
    """What a raw loop takes from one open fragment: the mean of each time step
    (read scenarios), the point (time series), as stored, or a reduction's part."""
    v = nc.variables["tas"]
    v.set_auto_maskandscale(False)
    if kind in REDUCE or kind == CLIMATOLOGY:
        return _raw_part(kind, nc, v)
    return v[...].mean(axis=(1, 2)) if kind == "read" else v[:, point[0], point[1]]


def _raw_valid(a, attrs):
    """Where stored values ``a`` are not masked as netCDF4-python masks them with the datasets'
    attributes (``_FillValue``, ``missing_value``, ``valid_range``; None: nothing is masked)."""
    test = None
    for name in ("_FillValue", "missing_value"):
        if name in attrs:
            test = (a == attrs[name]) if test is None else test | (a == attrs[name])
    if "valid_range" in attrs:
        low, high = attrs["valid_range"]
        test = ((a < low) | (a > high)) if test is None else test | (a < low) | (a > high)
    return None if test is None else ~test


def _raw_part(kind, nc, v):
    """One fragment's part of a reduction, from its stored values masked as netCDF4-python
    masks them (:func:`_raw_valid`), with no masked array made: ``(count, sum)`` (summed in float32, as numpy sums float32, for ``mean32`` and
    ``sum``), ``(count, mean, sum of squared deviations)`` for ``std``, the maximum, or
    ``{month: (sums, counts)}`` of each grid point."""
    a = v[...]
    valid = _raw_valid(a, {k: v.getncattr(k) for k in v.ncattrs()})
    if kind == "max":
        return a.max() if valid is None else a.max(where=valid, initial=-np.inf)
    zeroed = a if valid is None else np.where(valid, a, a.dtype.type(0))
    if kind == CLIMATOLOGY:
        from netCDF4 import num2date

        tv = nc.variables["time"]
        dates = num2date(tv[:], tv.units, getattr(tv, "calendar", "standard"))
        months = np.array([d.month for d in dates])
        out = {}
        for m in np.unique(months):
            sel = months == m
            out[int(m)] = (zeroed[sel].sum(axis=0, dtype="f8"),
                           sel.sum() if valid is None else valid[sel].sum(axis=0))
        return out
    n = a.size if valid is None else int(np.count_nonzero(valid))
    if kind == "std":  # (Chan et al.'s parts: a sum of squares of the values would lose digits)
        mu = zeroed.sum(dtype="f8") / n
        dev = np.square(zeroed - np.float32(mu))
        if valid is not None:
            dev[~valid] = 0
        return (n, mu, float(dev.sum()))
    return (n, float(zeroed.sum(dtype="f8" if kind == "mean" else None)))


def _raw_result(kind, parts):
    """What a raw loop returns from its fragments' parts (a reduction's parts combined exactly,
    in float64; the result in float32 where numpy's would be)."""
    if kind in ("mean", "mean32", "sum"):
        count = sum(p[0] for p in parts)
        total = math.fsum(p[1] for p in parts)
        return total / count if kind == "mean" else np.float32(total / count if kind == "mean32" else total)
    if kind == "max":
        return max(parts)
    if kind == "std":
        n, mean, m2 = parts[0]
        for nb, mb, m2b in parts[1:]:
            delta = mb - mean
            m2 += m2b + delta * delta * n * nb / (n + nb)
            mean += delta * nb / (n + nb)
            n += nb
        return np.float32(np.sqrt(m2 / n))
    if kind == CLIMATOLOGY:
        acc = {}
        for part in parts:
            for m, (s, c) in part.items():
                if m in acc:
                    acc[m][0][...] += s
                    acc[m][1] = acc[m][1] + c
                else:
                    acc[m] = [s, c]
        months = sorted(acc)
        with np.errstate(invalid="ignore", divide="ignore"):
            return months, np.stack([(acc[m][0] / acc[m][1]).astype(np.float32) for m in months])
    return np.concatenate(parts)


def tool_raw_loop(kind, ds):
    """Serial netCDF4-python loop over the fragment files (the raw limit)."""
    if kind == "open":
        raise CannotDo("not applicable (see raw-agg)")
    import netCDF4

    files = ds.fragments

    def run():
        out = []
        for path in files:
            with netCDF4.Dataset(path) as nc:
                out.append(_raw_values(nc, kind, ds.point))
        return _raw_result(kind, out)

    return run, lambda v, p: _array_result(kind, v), None


def tool_raw_bytes(kind, ds):
    """os.read of every fragment file's bytes (page cache warm): I/O context."""
    if kind == "open":
        raise CannotDo("not applicable")
    files = ds.fragments
    size = max(os.path.getsize(f) for f in files)
    buf = bytearray(size)

    def run():
        total = 0
        mv = memoryview(buf)
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                while True:
                    n = os.readv(fd, [mv])
                    total += n
                    if n < len(mv):
                        break
            finally:
                os.close(fd)
        return total

    return run, lambda v, p: {"bytes": int(v)}, None


def tool_dask_floor(kind, ds, masked=False):
    """dask alone on an array of the same chunks with no I/O (``da.zeros``): the cost of
    scheduling one task per fragment, below which no reader of one chunk per fragment can go.
    ``masked``: the same zeros as numpy masked arrays (``da.ma.masked_array``, nothing masked),
    the chunk type netCDF4-python gives and daskcfa's chunks are: what masked chunks cost dask."""
    if kind == "open":
        raise CannotDo("not applicable")
    if kind == CLIMATOLOGY:
        raise CannotDo("not applicable (no time coordinate)")
    import dask.array as da

    def run():
        x = da.zeros(ds.shape, chunks=tuple(ds.frag_shape), dtype="f4")
        return _dask_op(kind, ds, da.ma.masked_array(x) if masked else x)

    return run, lambda v, p: {"context": "no I/O"}, None


def tool_dask_memory(kind, ds):
    """dask alone over the very chunks daskcfa's read gives (numpy arrays, or daskcfa's masked chunks
    where it masks), read and decoded before the clock: the same reduction over the same chunks and
    chunk type with no I/O and no decoding. What dask's own work costs, below which no reader of one
    chunk per fragment that returns netCDF4-python's masked arrays can go."""
    if kind in ("open", CLIMATOLOGY) or _on_s3(ds):
        raise CannotDo("not applicable (local reductions, reads and time series only)")
    import dask
    import dask.array as da

    from daskcfa import from_cfa

    os.chdir(NEUTRAL_CWD)
    source = from_cfa(ds.agg, "tas")
    keys = list(dask.core.flatten(source.__dask_keys__()))
    # (the getter tasks' own outputs: dask's ``compute`` would hand back copies joined into one array)
    chunks = dict(zip(keys, dask.get(dict(source.__dask_graph__()), keys)))

    def run():
        name = f"memory-{source.name}"
        x = da.Array({(name, *key[1:]): chunk for key, chunk in chunks.items()}, name, source.chunks, meta=source)
        return _dask_op(kind, ds, x)

    return run, lambda v, p: _dask_describe(kind, ds, v, p), None


def tool_decode_floor(kind, ds):
    """The least any reader of these fragments needs on this machine: both cores each read
    a fragment's stored bytes with ``os.pread`` (straight into the array: contiguous data), inflate
    deflated chunks with ISA-L (the fastest inflate measured here) and reduce in float64 -- no dask,
    no checks of any kind, the HDF5 chunk locations looked up before the clock. No masking, except
    on data masked as users have it (``*-land``, ``*-valid``): there the same test netCDF4-python
    makes (``_FillValue``, ``missing_value``, ``valid_range``) in numpy, then the reduction of the
    values it keeps. Whole-array ``mean`` (also ``std`` and ``max`` of masked data), of deflate-only
    chunked or contiguous uncompressed data (context: what a reader that did nothing else would take)."""
    if _on_s3(ds):  # the S3 variant: GETs instead of pread (benchmarks/s3_floor.py)
        from benchmarks.s3_floor import s3_decode_floor

        return s3_decode_floor(kind, ds)
    masked = bool(ds.params.get("masking"))
    if ds.params.get("missing") or ds.params.get("shuffle") or kind not in (("mean", "std", "max") if masked else ("mean",)):
        raise CannotDo("only the mean of data without scattered missing values (std, max too of masked data), "
                       "deflate-only or uncompressed")
    from concurrent.futures import ThreadPoolExecutor

    import h5py
    from isal import isal_zlib

    plan = []
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)  # (as daskcfa opens them: both may run in one process)
    for path in ds.fragments:
        fid = h5py.h5f.open(path.encode(), h5py.h5f.ACC_RDONLY, fapl)  # (closed, strongly, when dropped)
        dsid = h5py.h5d.open(fid, b"tas")
        if ds.params.get("zlib"):
            infos = [dsid.get_chunk_info(i) for i in range(dsid.get_num_chunks())]
            chunk_bytes = int(np.prod(dsid.get_create_plist().get_chunk())) * 4
            plan.append((path, [(i.byte_offset, i.size) for i in infos], chunk_bytes, True))
        else:
            plan.append((path, [(dsid.get_offset(), dsid.get_storage_size())], dsid.get_storage_size(), False))
    fill, missing, valid = (ds.params.get(k) for k in ("fill_value", "missing_value", "valid_range"))

    def kept(values):
        """The values netCDF4-python would not mask."""
        if not masked:
            return values
        test = np.zeros(values.shape, bool)
        for v in (fill, missing):
            if v is not None:
                test |= values == np.float32(v)
        if valid is not None:
            test |= (values < np.float32(valid[0])) | (values > np.float32(valid[1]))
        return values[~test]

    def fragment(item):
        path, chunks, nbytes, deflated = item
        out = np.empty((len(chunks), nbytes // 4), np.float32)
        fd = os.open(path, os.O_RDONLY)
        try:
            for row, (offset, size) in zip(out, chunks):
                if deflated:
                    row[:] = np.frombuffer(isal_zlib.decompressobj().decompress(os.pread(fd, size, offset), nbytes),
                                           np.float32)
                elif os.preadv(fd, [row], offset) != size:
                    raise OSError(f"{path}: short read")
        finally:
            os.close(fd)
        x = kept(out.reshape(-1))
        if kind == "max":
            return x.max(), x.size, 0.0
        total = x.sum(dtype="f8")
        if kind == "mean":
            return total, x.size, 0.0
        d = x - np.float64(total / x.size)
        return total, x.size, float(np.einsum("i,i->", d, d))

    def run():
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            parts = list(pool.map(fragment, plan))
        if kind == "max":
            return max(m for m, _, _ in parts)
        n = sum(c for _, c, _ in parts)
        mean = sum(t for t, _, _ in parts) / n
        if kind == "mean":
            return np.float64(mean)
        # (Chan et al.: each fragment's squared deviations from its own mean, combined)
        m2 = sum(q + c * (t / c - mean) ** 2 for t, c, q in parts)
        return np.float64(np.sqrt(m2 / n))

    return run, lambda v, p: _array_result(kind, v), None


def tool_raw_s3_cat(kind, ds):
    """Parallel download of every fragment object (s3fs ``cat`` of the list:
    concurrent GETs): the download limit of the S3 scenarios."""
    s3 = _on_s3(ds)
    if s3 is None:
        raise CannotDo("not applicable (S3 scenarios only)")
    urls = s3.fragment_urls

    def run():
        data = s3.filesystem().cat(urls)
        return sum(len(b) for b in data.values())

    return run, lambda v, p: {"bytes": int(v)}, None


def tool_raw_s3_serial(kind, ds, one_get=False):
    """Serial loop: download a fragment object whole (``cat_file``), open the
    bytes with ``netCDF4.Dataset(memory=...)``, read, next fragment. With
    ``one_get``, ``cat_file(..., max_concurrency=1)``: s3fs (2025+) otherwise
    sends a HEAD before each GET, which a user who knows may avoid."""
    s3 = _on_s3(ds)
    if s3 is None:
        raise CannotDo("not applicable (S3 scenarios only)")
    import netCDF4

    urls = s3.fragment_urls

    def run():
        fs = s3.filesystem()
        out = []
        for url in urls:
            buf = fs.cat_file(url, **({"max_concurrency": 1} if one_get else {}))
            with netCDF4.Dataset("fragment.nc", memory=buf) as nc:
                out.append(_raw_values(nc, kind, ds.point))
        return _raw_result(kind, out)

    return run, lambda v, p: _array_result(kind, v), None


def tool_raw_s3_parallel(kind, ds):
    """Download every fragment object at once (s3fs ``cat`` of the list: concurrent GETs), then
    decode them one by one from memory (``netCDF4.Dataset(memory=...)``): the limit of
    ``s3-timeseries*`` (issue #31), stronger than the serial loop on a server near the client."""
    s3 = _on_s3(ds)
    if s3 is None or kind == "open":
        raise CannotDo("not applicable (S3 read scenarios only)")
    import netCDF4

    urls = s3.fragment_urls

    def run():
        objects = s3.filesystem().cat(urls)
        out = []
        for url in urls:
            with netCDF4.Dataset("fragment.nc", memory=objects[url.removeprefix("s3://")]) as nc:
                out.append(_raw_values(nc, kind, ds.point))
        return _raw_result(kind, out)

    return run, lambda v, p: _array_result(kind, v), None


def tool_daskcfa_indexed(kind, ds):
    """daskcfa with the chunk index (``daskcfa.index``), written before the clock beside a copy of
    the aggregation file in a temporary directory (the fragments linked, not copied; the shared
    dataset directory is left as it is); ``from_cfa(..., chunk_index=True)``."""
    if _on_s3(ds) or kind == "open":
        raise CannotDo("not applicable (local read scenarios only)")
    import atexit
    import shutil
    import tempfile

    import daskcfa

    work = tempfile.mkdtemp(prefix="daskcfa-bench-indexed-")
    atexit.register(shutil.rmtree, work, True)
    shutil.copy(ds.agg, work)
    os.symlink(os.path.join(ds.dir, "frag"), os.path.join(work, "frag"))
    url = os.path.join(work, os.path.basename(ds.agg))
    daskcfa.index(url)
    os.chdir(NEUTRAL_CWD)

    def run():
        return _dask_op(kind, ds, daskcfa.from_cfa(url, "tas", chunk_index=True))

    return run, lambda v, p: _dask_describe(kind, ds, v, p), None


TOOLS = {
    "raw-agg": tool_raw_agg,
    "raw-loop": tool_raw_loop,
    "raw-bytes": tool_raw_bytes,
    "dask-floor": tool_dask_floor,
    "dask-floor-masked": lambda kind, ds: tool_dask_floor(kind, ds, masked=True),
    "dask-memory": tool_dask_memory,
    "decode-floor": tool_decode_floor,
    "daskcfa": tool_daskcfa,
    "daskcfa-processes": tool_daskcfa_processes,
    "daskcfa-distributed": tool_daskcfa_distributed,
    # neighbouring fragments merged into chunks of up to 256 MiB (README: many small fragments)
    "daskcfa-merged": lambda kind, ds: tool_daskcfa(kind, ds, chunks="256MiB"),
    "cfdm": tool_cfdm,
    "cfapyx": tool_cfapyx,
    "xarray-mfdataset": tool_xarray_mfdataset,
    "raw-s3-cat": tool_raw_s3_cat,
    "raw-s3-serial": tool_raw_s3_serial,
    "raw-s3-serial-one-get": lambda kind, ds: tool_raw_s3_serial(kind, ds, one_get=True),
    "raw-s3-parallel": tool_raw_s3_parallel,
    "daskcfa-indexed": tool_daskcfa_indexed,
}

S3_TOOLS = ("raw-s3-cat", "raw-s3-serial", "raw-s3-serial-one-get", "raw-s3-parallel", "daskcfa", "daskcfa-distributed",
            "cfdm", "cfapyx", "xarray-mfdataset", "decode-floor")


def applicable(tool: str, scenario: str) -> bool:
    kind = SCENARIO_KIND[scenario]
    if scenario in S3_SCENARIOS:
        return tool in S3_TOOLS
    if tool in ("raw-s3-cat", "raw-s3-serial", "raw-s3-serial-one-get", "raw-s3-parallel"):
        return False
    if kind == "open":
        return tool not in ("raw-loop", "raw-bytes", "daskcfa-processes", "daskcfa-distributed")
    return tool != "raw-agg"


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    return f"{type(e).__name__}: {first}"[:300]


def _warm_up(tool: str, kind: str, warm_dir: str | None, target=None) -> None:
    """Run the tool once on a tiny, unrelated dataset, so that lazy imports and
    other first-call costs inside the tool fall outside the clock (on S3, the
    tiny dataset's uploaded copy). A warm-up dataset that is not there is an error (see :func:`main`)."""
    if not warm_dir:
        return
    wds = Dataset.load(warm_dir)
    if target is not None:
        wds = S3Dataset.on(wds, target)
    run, _, _ = TOOLS[tool](kind, wds)
    run()


def measure(tool: str, scenario: str, dataset_dir: str, probe: bool = True,
            warm_dir: str | None = None) -> dict:
    kind = SCENARIO_KIND[scenario]
    ds = at_scenario_point(Dataset.load(dataset_dir), scenario)
    out = {"tool": tool, "scenario": scenario, "dataset": ds.dir}
    target = None
    if scenario in S3_SCENARIOS:
        target = s3mod.Target.from_env()
        if target is None:
            return out | {"status": "cannot", "reason": f"no S3 server given (${s3mod.ENV}; "
                          "run S3 scenarios through benchmarks.run)"}
        ds = S3Dataset.on(ds, target)
        out["url"] = ds.agg_url
    t0 = time.perf_counter()
    try:
        _warm_up(tool, kind, warm_dir, target)
    except CannotDo:
        pass  # reported by the real run below
    except Exception as e:  # noqa: BLE001
        out["warmup_error"] = _short(e)
    try:
        run, describe, teardown = TOOLS[tool](kind, ds)
    except CannotDo as e:
        return out | {"status": "cannot", "reason": str(e)}
    except Exception as e:  # noqa: BLE001
        return out | {"status": "cannot", "reason": "setup: " + _short(e),
                      "traceback": traceback.format_exc()[-2000:]}
    out["setup_seconds"] = time.perf_counter() - t0
    try:
        before = target.traffic() if target else None
        client = _DISTRIBUTED.get("client")  # (daskcfa-distributed: its workers' CPU too)
        gc.collect()  # the garbage of imports and set-up collected before the clock, not in the run
        if client is not None:
            client.run(gc.collect)  # (and in the workers' processes, which imported and warmed up too)
        t1, cpu1 = time.perf_counter(), cpu_seconds(client)
        value = run()
        out["seconds"] = time.perf_counter() - t1
        out["cpu_seconds"] = cpu_seconds(client) - cpu1  # (a loaded machine inflates it less than wall time)
        if target:
            time.sleep(0.2)  # let the server finish accounting the last responses
            out["s3_traffic"] = s3mod.traffic_delta(before, target.traffic())
        out["result"] = describe(value, probe)
        out["status"] = "ok"
    except CannotDo as e:
        out |= {"status": "cannot", "reason": str(e)}
    except Exception as e:  # noqa: BLE001
        out |= {"status": "cannot", "reason": _short(e),
                "traceback": traceback.format_exc()[-2000:]}
    finally:
        if teardown is not None:
            try:
                teardown()
            except Exception:  # noqa: BLE001
                pass
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    probe = "--no-probe" not in argv
    argv = [a for a in argv if a != "--no-probe"]
    warm_dir = None
    for a in list(argv):
        if a.startswith("--warm="):
            warm_dir = a.split("=", 1)[1]
            argv.remove(a)
    if len(argv) != 3 or argv[0] not in TOOLS or argv[1] not in SCENARIO_KIND:
        print(__doc__, file=sys.stderr)
        print(f"tools: {', '.join(TOOLS)}; scenarios: {', '.join(SCENARIO_KIND)}",
              file=sys.stderr)
        return 2
    if warm_dir is not None and not os.path.exists(os.path.join(warm_dir, "params.json")):
        # (measured without its warm-up, a tool's first run pays its lazy imports: 3x the CPU, measured)
        print(f"no warm-up dataset at {warm_dir}: `python -m benchmarks.generate --warmup --datadir DIR` makes "
              "DIR/warmup; or leave out --warm", file=sys.stderr)
        return 2
    res = measure(argv[0], argv[1], argv[2], probe=probe, warm_dir=warm_dir)
    sys.stdout.flush()
    print("@@RESULT@@ " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
