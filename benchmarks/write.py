"""Writer scenarios: daskcfa.to_cfa against a raw netCDF4 loop, xarray and s3fs.

    python -m benchmarks.run --scenario write-local --scenario write-s3 [--quick]
    python -m benchmarks.write TOOL SCENARIO [--quick] [--workdir DIR]   # one run by hand

Scenarios (the data: :func:`values`, a cheap deterministic function of the
global time index and the grid indices, generated on the fly inside the clock
by every tool, so generation costs the same everywhere):

* ``write-local``: write (1000, 512, 512) float32 = 1.05 GB as 100 fragments
  (10, 512, 512), uncompressed netCDF-4 (contiguous), with the coordinate
  variables, to local disk (the page cache: no tool calls fsync).
* ``write-s3``: the same, to the run's local S3 server (SeaweedFS on
  127.0.0.1; :mod:`benchmarks.s3`), under a fresh prefix per run.

Every measured run is a fresh process (this module's ``main``): imports and
set-up (a distributed cluster, the prebuilt bytes of ``raw-s3-pipe``) happen
before the clock, then one untimed warm-up write of a tiny array to a
separate location, then the timed write to a fresh location. After the clock
the written data are checked (untimed) and deleted: daskcfa's output is read
back with ``daskcfa.from_cfa`` (shape, one dask chunk per fragment, the
number of fragment files, and several whole time steps compared bit for bit
with :func:`values`, plus their means); the raw loops' and xarray's output by
file count and sizes (and, on disk, one fragment's values). The result is one
JSON line prefixed with ``@@RESULT@@``, as in :mod:`benchmarks.tools`.

Peak memory: ``maxrss_mb`` is the peak RSS of the measured process (for
``raw-s3-pipe`` it includes the prebuilt bytes); the ``daskcfa-distributed``
tools also report each worker process's peak RSS (``VmHWM`` from
``/proc/<pid>/status``, the kernel's high-water mark over the worker's life,
which the tiny warm-up cannot raise much) and the largest sum of the
workers' RSS sampled every 50 ms during the timed write (psutil, from the
client process, so the workers are not disturbed).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass

import numpy as np

from benchmarks.measure import TABLE_HEADER, cannot_row, repeated_runs, runs_note

from benchmarks import s3 as s3mod
from benchmarks.netcdf4_script import (COORD_ATTRS, DIMS, VAR_ATTRS, VARNAME, coordinate_values, values,
                                       write_dataset)
from benchmarks.generate import TimeTiles
from daskcfa_testing.memory import peak_rss

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
#: Local output of the write-local runs and the staging of raw-s3-pipe (git-ignored).
DEFAULT_WORKDIR = os.path.join(HERE, "data", "write-out")
NEUTRAL_CWD = "/"



@dataclass(frozen=True)
class WriteSpec(TimeTiles):
    @property
    def frag_nbytes(self) -> int:
        return int(np.prod(self.frag_shape)) * 4

    def check_times(self) -> list[int]:
        """Time steps compared bit for bit after a write: both ends, both sides of
        the first fragment boundary, and a few in between."""
        nt, ft = self.shape[0], self.frag_shape[0]
        ts = {0, ft - 1, ft, nt // 3, nt // 2 + 1, nt - ft, nt - 1}
        return sorted(t for t in ts if 0 <= t < nt)


SPECS = {False: WriteSpec(100, (10, 512, 512)), True: WriteSpec(10, (4, 64, 64))}
WARM_SPEC = WriteSpec(2, (2, 6, 8))

#: The netCDF4-python-style scenarios: the same data written through a ``Dataset`` by
#: :func:`benchmarks.netcdf4_script.write_dataset`, one time step or one sub-array per assignment
DATASET_ASSIGNMENT = {"dataset-steps-s3": "steps", "dataset-subarrays-s3": "subarrays",
                      "dataset-steps-local": "steps"}
SCENARIOS = ("write-local", "write-s3", *DATASET_ASSIGNMENT)
S3_SCENARIOS = ("write-s3", "dataset-steps-s3", "dataset-subarrays-s3")
_DATASET_S3_TOOLS = ["raw-s3-pipe", "daskcfa", "daskcfa-cf113", "s3netcdf4"]
TOOL_ORDER = {
    "write-local": ["raw-write-loop", "daskcfa", "daskcfa-distributed", "xarray-save-mfdataset"],
    "write-s3": ["raw-s3-pipe", "daskcfa", "daskcfa-distributed", "s3netcdf4"],
    "dataset-steps-s3": _DATASET_S3_TOOLS,
    "dataset-subarrays-s3": _DATASET_S3_TOOLS,
    "dataset-steps-local": ["raw-write-loop", "daskcfa", "daskcfa-cf113", "s3netcdf4"],
}
RAW_LIMIT = {s: "raw-s3-pipe" if s in S3_SCENARIOS else "raw-write-loop" for s in SCENARIOS}
TOOL_LABEL = {
    "raw-write-loop": "raw: serial netCDF4 loop writing the fragment files",
    "raw-s3-pipe": "raw: parallel s3fs pipe of the prebuilt fragment bytes",
    "daskcfa": "daskcfa.to_cfa (threads)",
    "daskcfa-distributed": "daskcfa.to_cfa (distributed LocalCluster 2x1)",
    "xarray-save-mfdataset": "xarray.save_mfdataset (one Dataset per fragment)",
    "s3netcdf4": "S3netCDF4",
}
#: labels in the ``dataset-*`` scenarios
DATASET_LABEL = {
    "daskcfa": "daskcfa.netcdf4.Dataset, format CFA4 (CFA-0.5)",
    "daskcfa-cf113": "daskcfa.netcdf4.Dataset, format CF-1.13",
    "s3netcdf4": "S3netCDF4 2.1rc1 s3Dataset, format CFA4 (CFA-0.5), fixed-size time",
}


# ----------------------------------------------------------------------------
# The data
# ----------------------------------------------------------------------------
def _block(ny, nx, block_info=None):
    (t0, t1), _, _ = block_info[None]["array-location"]
    return values(t0, t1, ny, nx)


def dask_values(spec: WriteSpec):
    """The data as a lazy dask array, one chunk per fragment (generated where computed)."""
    import dask.array as da

    nt, ny, nx = spec.shape
    ft = spec.frag_shape[0]
    return da.map_blocks(_block, ny, nx, chunks=((ft,) * spec.nfrag, (ny,), (nx,)),
                         dtype=np.float32, meta=np.empty((0, 0, 0), np.float32),
                         name=f"values-{nt}-{ny}-{nx}-{ft}")


def coords(spec: WriteSpec) -> dict:
    """name -> (values, attrs) of the three coordinate variables (float64)."""
    return {k: (v, COORD_ATTRS[k]) for k, v in coordinate_values(spec.shape).items()}


def fill_value():
    import netCDF4

    return np.float32(netCDF4.default_fillvals["f4"])


def raw_name(i: int) -> str:
    return f"{VARNAME}_{i:05d}.nc"


def write_raw_fragment(path: str, spec: WriteSpec, i: int, crd: dict) -> None:
    """One self-describing fragment file written with plain netCDF4-python: the
    same contents as daskcfa's (dimensions, coordinate variables sliced to the
    fragment, ``tas`` float32 contiguous with the same attributes and
    ``_FillValue``, netCDF's default fill mode)."""
    import netCDF4

    ft, ny, nx = spec.frag_shape
    t0 = i * ft
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        for d, n in zip(DIMS, spec.frag_shape):
            nc.createDimension(d, n)
        for name in DIMS:
            vals, attrs = crd[name]
            v = nc.createVariable(name, "f8", (name,))
            v.setncatts(attrs)
            v[:] = vals[t0:t0 + ft] if name == "time" else vals
        v = nc.createVariable(VARNAME, "f4", DIMS, fill_value=fill_value())
        v.setncatts(VAR_ATTRS)
        v[...] = values(t0, t0 + ft, ny, nx)


# ----------------------------------------------------------------------------
# Where a run writes
# ----------------------------------------------------------------------------
class Location:
    """A fresh, empty place to write: a local directory or an S3 prefix."""

    def __init__(self, workdir: str, target: s3mod.Target | None, tag: str):
        self.target = target
        name = f"{tag}-{uuid.uuid4().hex[:10]}"
        if target is None:
            self.root = os.path.join(workdir, name)
            os.makedirs(self.root)
        else:
            self.root = f"{target.bucket}/write/{name}"

    @property
    def storage_options(self) -> dict | None:
        return self.target.storage_options if self.target else None

    def url(self, rel: str) -> str:
        return f"s3://{self.root}/{rel}" if self.target else os.path.join(self.root, rel)

    def filesystem(self):
        return self.target.filesystem() if self.target else None

    def listing(self) -> dict[str, int]:
        """relative name -> size of every file/object written."""
        if self.target is None:
            out = {}
            for d, _, files in os.walk(self.root):
                for f in files:
                    p = os.path.join(d, f)
                    out[os.path.relpath(p, self.root)] = os.path.getsize(p)
            return out
        fs = self.filesystem()
        fs.invalidate_cache()
        found = fs.find(self.root, detail=True)
        return {k[len(self.root) + 1:]: int(v["size"]) for k, v in found.items()}

    def remove(self) -> None:
        if self.target is None:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            fs = self.filesystem()
            try:
                fs.rm(self.root, recursive=True)
            except FileNotFoundError:
                pass
            fs.invalidate_cache()


# ----------------------------------------------------------------------------
# Checks (untimed)
# ----------------------------------------------------------------------------
def _size_check(spec: WriteSpec, frags: dict[str, int]) -> tuple[bool, str]:
    if len(frags) != spec.nfrag:
        return False, f"{len(frags)} fragment files, want {spec.nfrag}"
    lo, hi = min(frags.values()), max(frags.values())
    # contiguous uncompressed: the data plus header, coordinates, attributes (and, in
    # daskcfa's S3 objects, the unused tail of netCDF-C's in-memory image); a fragment
    # missing data or holding it twice falls outside these bounds
    if lo < spec.frag_nbytes or hi > spec.frag_nbytes + (1 << 20):
        return False, f"fragment sizes {lo}-{hi} B for {spec.frag_nbytes} B of data"
    return True, f"{len(frags)} files of {lo / 1e6:.4g}" + (f"-{hi / 1e6:.4g}" if hi != lo else "") + " MB"


def _compare_fragment_file(path: str, spec: WriteSpec, i: int) -> tuple[bool, str]:
    import netCDF4

    ft, ny, nx = spec.frag_shape
    with netCDF4.Dataset(path) as nc:
        v = nc.variables[VARNAME]
        v.set_auto_maskandscale(False)
        got = v[...]
        tvals = nc.variables["time"][:]
    want = values(i * ft, (i + 1) * ft, ny, nx)
    if got.dtype != np.float32 or got.shape != want.shape or not np.array_equal(got, want):
        return False, f"fragment {i}: values differ"
    if not np.array_equal(tvals, np.arange(i * ft, (i + 1) * ft, dtype=np.float64)):
        return False, f"fragment {i}: time coordinate differs"
    return True, ""


def check_files(spec: WriteSpec, loc: Location, expect_sizes: dict | None = None) -> dict:
    """Fragment files: count and sizes; on disk also the last fragment's values."""
    listing = loc.listing()
    frags = {k: v for k, v in listing.items() if k.endswith(".nc")}
    ok, detail = _size_check(spec, frags)
    if ok and expect_sizes is not None:
        if frags != expect_sizes:
            bad = sum(1 for k, v in expect_sizes.items() if frags.get(k) != v)
            ok, detail = False, f"{bad} objects missing or of the wrong size"
        else:
            detail += ", sizes = the prebuilt bytes"
    if ok and loc.target is None:
        last = spec.nfrag - 1
        ok2, why = _compare_fragment_file(loc.url(raw_name(last)), spec, last)
        if not ok2:
            ok, detail = False, why
        else:
            detail += f"; fragment {last} values exact"
    return {"ok": ok, "detail": detail, "fragment_files": len(frags),
            "fragment_bytes": sum(frags.values())}


def check_daskcfa(spec: WriteSpec, loc: Location, url: str, storage_options: bool = True) -> dict:
    """Read back with daskcfa.from_cfa: shape, chunks, fragment count, values, means
    (``storage_options=False``: an S3netCDF4 alias URL, read through ``$S3_NC_CONFIG``)."""
    import daskcfa

    listing = loc.listing()
    agg = os.path.relpath(url, loc.root) if loc.target is None else url.split(loc.root + "/", 1)[1]
    frags = {k: v for k, v in listing.items() if k.endswith(".nc")}
    out = {"ok": False, "fragment_files": len(frags), "fragment_bytes": sum(frags.values()),
           "objects": len(listing)}
    if agg not in listing:
        out["detail"] = f"no aggregation file {agg}"
        return out
    ok, detail = _size_check(spec, frags)
    if not ok:
        out["detail"] = detail
        return out
    kw = {"storage_options": loc.storage_options} if loc.target and storage_options else {}
    x = daskcfa.from_cfa(url, VARNAME, **kw)
    if tuple(x.shape) != spec.shape or x.dtype != np.float32:
        out["detail"] = f"read back {x.shape} {x.dtype}, want {spec.shape} float32"
        return out
    if x.numblocks[0] != spec.nfrag:
        out["detail"] = f"read back {x.numblocks[0]} chunks along time, want {spec.nfrag}"
        return out
    ts = spec.check_times()
    got = np.asarray(np.ma.filled(x[ts].compute(scheduler="threads"), np.nan))
    _, ny, nx = spec.shape
    want = np.concatenate([values(t, t + 1, ny, nx) for t in ts])
    means_got = got.astype(np.float64).mean(axis=(1, 2))
    means_want = want.astype(np.float64).mean(axis=(1, 2))
    err = float(np.max(np.abs(means_got - means_want)))
    if not np.array_equal(got, want):
        bad = [t for t, g, w in zip(ts, got, want) if not np.array_equal(g, w)]
        out["detail"] = f"time steps {bad} differ (max mean error {err:.3g} K)"
        return out
    out["ok"] = True
    out["detail"] = (f"{detail}; read back with from_cfa: {len(ts)} time steps exact "
                     f"(means {means_got.min():.4f}-{means_got.max():.4f} K)")
    return out


# ----------------------------------------------------------------------------
# Tools. Each is a class: __init__ (untimed set-up), prepare(spec, loc)
# (untimed), run(spec, loc) (timed), check(spec, loc) (untimed), close().
# ----------------------------------------------------------------------------
class CannotDo(Exception):
    """The tool cannot do this task (reason in the message)."""


class RawWriteLoop:
    """Serial netCDF4-python loop: generate a fragment's values, write its file."""

    def __init__(self, scenario, target):
        if scenario in S3_SCENARIOS:
            raise CannotDo("not applicable (local disk only)")
        import netCDF4  # noqa: F401

    def prepare(self, spec, loc):
        pass

    def run(self, spec, loc):
        crd = coords(spec)
        for i in range(spec.nfrag):
            write_raw_fragment(loc.url(raw_name(i)), spec, i, crd)

    def check(self, spec, loc):
        return check_files(spec, loc)

    def close(self):
        pass


class RawS3Pipe:
    """s3fs ``pipe`` of a dict {object: bytes} (concurrent PUTs, s3fs's default
    batching) of the 100 fragment files' bytes, built before the clock with
    the raw loop's writer (to a temporary directory, then read into memory)."""

    def __init__(self, scenario, target):
        if scenario not in S3_SCENARIOS:
            raise CannotDo("not applicable (S3 only)")
        import s3fs  # noqa: F401

        self.target = target
        self.payload: dict[str, bytes] = {}

    def prepare(self, spec, loc):
        crd = coords(spec)
        tmp = tempfile.mkdtemp(prefix="daskcfa-bench-pipe-", dir=_WORKDIR[0])
        try:
            self.payload = {}
            for i in range(spec.nfrag):
                p = os.path.join(tmp, raw_name(i))
                write_raw_fragment(p, spec, i, crd)
                with open(p, "rb") as f:
                    self.payload[raw_name(i)] = f.read()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def run(self, spec, loc):
        fs = self.target.filesystem()  # fsspec's instance cache: the warm-up's instance
        fs.pipe({f"{loc.root}/{k}": v for k, v in self.payload.items()})

    def check(self, spec, loc):
        sizes = {k: len(v) for k, v in self.payload.items()}
        self.payload = {}
        return check_files(spec, loc, expect_sizes=sizes)

    def close(self):
        pass


class DaskCFA:
    """``daskcfa.to_cfa(dask array, url, ...)``, default (threaded) scheduler."""

    distributed = False

    def __init__(self, scenario, target):
        try:
            import daskcfa
        except Exception as e:  # noqa: BLE001
            raise CannotDo(f"ImportError: {e}") from None
        if getattr(daskcfa, "to_cfa", None) is None:
            raise CannotDo("daskcfa has no to_cfa")
        self.daskcfa = daskcfa
        os.chdir(NEUTRAL_CWD)  # nothing may depend on the working directory
        self.client = self.cluster = None
        self.worker_pids: dict[str, int] = {}

    def prepare(self, spec, loc):
        pass

    def _url(self, loc):
        return loc.url("tas.nca")

    @staticmethod
    def _options(loc):
        return {"storage_options": loc.storage_options} if loc.target else {}

    def run(self, spec, loc):
        return self.daskcfa.to_cfa(
            dask_values(spec), self._url(loc), variable=VARNAME, dims=DIMS, attrs=VAR_ATTRS,
            coords=coords(spec), fragment_shape=spec.frag_shape, **self._options(loc))

    def check(self, spec, loc):
        return check_daskcfa(spec, loc, self._url(loc))

    def close(self):
        pass


class DaskCFADistributed(DaskCFA):
    """The same on a ``LocalCluster(n_workers=2, threads_per_worker=1,
    processes=True)``; the client is created (and daskcfa imported on the
    workers) before the clock; ``max_concurrent_uploads`` unset."""

    distributed = True

    def __init__(self, scenario, target):
        super().__init__(scenario, target)
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                    dashboard_address=None)
        self.client = Client(self.cluster)
        self.client.run(lambda: __import__("daskcfa") and None)
        self.worker_pids = self.client.run(os.getpid)

    def close(self):
        self.client.close()
        self.cluster.close()


class XarraySaveMfdataset:
    """``xr.save_mfdataset([ds.isel(time=fragment i) ...], paths)`` of an xarray
    Dataset over the same dask array and coordinates (one file per fragment,
    netCDF4 engine, default threaded scheduler); encodings set so the files
    match the raw loop's (``_FillValue`` of ``tas`` = netCDF's default, none
    on the coordinates: xarray would add NaN)."""

    def __init__(self, scenario, target):
        if scenario != "write-local":
            raise CannotDo("not applicable (local disk only)")
        import xarray  # noqa: F401

        os.chdir(NEUTRAL_CWD)

    def prepare(self, spec, loc):
        pass

    def run(self, spec, loc):
        import xarray as xr

        crd = coords(spec)
        ds = xr.Dataset(
            {VARNAME: (DIMS, dask_values(spec), VAR_ATTRS)},
            coords={k: (k, v, dict(a)) for k, (v, a) in crd.items()})
        enc = {VARNAME: {"_FillValue": fill_value(), "dtype": "float32"}}
        enc.update({k: {"_FillValue": None} for k in DIMS})
        ft = spec.frag_shape[0]
        parts, paths = [], []
        for i in range(spec.nfrag):
            part = ds.isel(time=slice(i * ft, (i + 1) * ft))
            for k, e in enc.items():
                part[k].encoding.update(e)
            parts.append(part)
            paths.append(loc.url(raw_name(i)))
        xr.save_mfdataset(parts, paths, format="NETCDF4", engine="netcdf4")

    def check(self, spec, loc):
        return check_files(spec, loc)

    def close(self):
        pass


class S3netCDF4Tool:
    def __init__(self, scenario, target):
        try:
            import S3netCDF4  # noqa: F401
        except ImportError:
            raise CannotDo("broken on PyPI: the S3netCDF4 2.1rc1 sdist lacks its .pyx files, so "
                           "it does not build; not installed") from None
        raise CannotDo("S3netCDF4 is installed but no tool is written for it")


class DatasetScript(DaskCFA):
    """:func:`benchmarks.netcdf4_script.write_dataset` with ``daskcfa.netcdf4.Dataset`` (format CFA4,
    CFA-0.5: S3netCDF4's), default options (``buffer_size`` 512 MiB, 4 concurrent uploads on S3)."""

    format, cfa_version = "CFA4", "0.5"

    def __init__(self, scenario, target):
        super().__init__(scenario, target)
        from daskcfa.netcdf4 import Dataset

        self.Dataset = Dataset
        self.assignment = DATASET_ASSIGNMENT[scenario]

    def run(self, spec, loc):
        write_dataset(self.Dataset, self._url(loc), spec.shape, spec.frag_shape, self.assignment, self.format,
                      self.cfa_version, **self._options(loc))


class DatasetScriptCF113(DatasetScript):
    """The same with ``format="CF-1.13"`` (daskcfa's default for new aggregations)."""

    format, cfa_version = "CF-1.13", None


#: S3netCDF4's venv (``ci/s3nc-venv`` makes it) and the driver it runs
S3NC_PYTHON = os.path.join(REPO, ".venv-s3nc", "bin", "python")
S3NC_PEER = os.path.join(HERE, "s3netcdf4_peer.py")
S3NC_ALIAS = "bench"


class S3netCDF4Dataset:
    """The same script with S3netCDF4's ``s3Dataset`` (format CFA4, CFA-0.5), in its own venv: one
    :mod:`benchmarks.s3netcdf4_peer` process per measured process, started before the clock, does the
    warm-up and the timed write (the clock covers one request line there and its answer back).

    Its configuration (a private temporary file, ``$S3_NC_CONFIG``): the host alias ``s3://bench``
    for the run's server with the serial ``s3FileObject`` backend (its default asynchronous backend
    silently uploads nothing here), ``resource_allocation.memory`` 512 MB (daskcfa's default buffer
    budget). ``time`` has its final size from the start: S3netCDF4 cannot create an unlimited
    dimension in a CFA file (``createDimension("time", None)``: TypeError). Its output is read back
    by daskcfa through the same alias."""

    def __init__(self, scenario, target):
        if not os.path.exists(S3NC_PYTHON):
            raise CannotDo("S3netCDF4 is broken on PyPI (its 2.1rc1 sdist lacks its .pyx files) and its venv "
                           "is absent: make it with ci/s3nc-venv (needs ../shared/peers/S3netCDF4-*.whl)")
        self.assignment = DATASET_ASSIGNMENT[scenario]
        self.peer_maxrss_mb = None
        self.tmp = tempfile.mkdtemp(prefix="daskcfa-bench-s3nc-")
        config = os.path.join(self.tmp, "s3nc.json")
        hosts = {}
        if target is not None:
            hosts[f"s3://{S3NC_ALIAS}"] = {
                "alias": S3NC_ALIAS, "url": target.endpoint_url, "api": "S3v4", "backend": "s3FileObject",
                "credentials": {"accessKey": target.key, "secretKey": target.secret}}
        backend = {"maximum_part_size": "50MB", "maximum_parts": 8, "enable_multipart_download": False,
                   "enable_multipart_upload": False, "connect_timeout": 30.0, "read_timeout": 60.0}
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"version": "9", "hosts": hosts, "backends": {"s3FileObject": backend},
                       "cache_location": self.tmp,
                       "resource_allocation": {"memory": "512MB", "filehandles": 20}}, f)
        os.environ["S3_NC_CONFIG"] = config  # (daskcfa reads S3netCDF4's aliases from it: the check)
        self.stderr = open(os.path.join(self.tmp, "stderr"), "w+")
        self.proc = subprocess.Popen([S3NC_PYTHON, S3NC_PEER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, cwd=self.tmp)
        ready = self.proc.stdout.readline()
        if not ready.startswith("{"):
            raise CannotDo(f"S3netCDF4 did not start: {self._stderr_tail()}")
        os.chdir(NEUTRAL_CWD)

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        lines = [x for x in self.stderr.read().strip().splitlines() if x.strip()]
        return lines[-1][:300] if lines else "(no message)"

    def prepare(self, spec, loc):
        pass

    def _url(self, loc):
        return f"s3://{S3NC_ALIAS}/{loc.root}/tas.nca" if loc.target else loc.url("tas.nca")

    def run(self, spec, loc):
        request = {"url": self._url(loc), "shape": list(spec.shape), "frag_shape": list(spec.frag_shape),
                   "assignment": self.assignment, "format": "CFA4", "cfa_version": "0.5", "unlimited": False}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise CannotDo(f"S3netCDF4 crashed (exit code {self.proc.wait()}): {self._stderr_tail()}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise CannotDo(f"S3netCDF4: {answer['error']}")
        self.peer_maxrss_mb = answer["maxrss_mb"]

    def check(self, spec, loc):
        return check_daskcfa(spec, loc, self._url(loc), storage_options=False)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        finally:
            self.stderr.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


TOOLS = {
    "raw-write-loop": RawWriteLoop,
    "raw-s3-pipe": RawS3Pipe,
    "daskcfa": DaskCFA,
    "daskcfa-distributed": DaskCFADistributed,
    "xarray-save-mfdataset": XarraySaveMfdataset,
    "s3netcdf4": S3netCDF4Tool,
}
#: the tools of the ``dataset-*`` scenarios that differ from those of ``write-*``
DATASET_TOOLS = {"daskcfa": DatasetScript, "daskcfa-cf113": DatasetScriptCF113, "s3netcdf4": S3netCDF4Dataset}
TOOL_NAMES = tuple(dict.fromkeys([*TOOLS, *DATASET_TOOLS]))


def tool_class(tool: str, scenario: str):
    if scenario in DATASET_ASSIGNMENT and tool in DATASET_TOOLS:
        return DATASET_TOOLS[tool]
    if tool not in TOOLS:
        return _not_here(tool, scenario)
    return TOOLS[tool]


def _not_here(tool: str, scenario: str):
    def refuse(*_):
        raise CannotDo(f"{tool} runs in the dataset-* scenarios only, not {scenario}")
    return refuse


def tool_label(tool: str, scenario: str) -> str:
    if scenario in DATASET_ASSIGNMENT and tool in DATASET_LABEL:
        return DATASET_LABEL[tool]
    return TOOL_LABEL.get(tool, tool)

_WORKDIR = [DEFAULT_WORKDIR]


# ----------------------------------------------------------------------------
# Memory of the distributed workers
# ----------------------------------------------------------------------------
class WorkerMemory:
    """Samples the workers' RSS (psutil, every ``interval`` s) from this process."""

    def __init__(self, pids: dict[str, int], interval: float = 0.05):
        import psutil

        self.procs = {a: psutil.Process(p) for a, p in pids.items()}
        self.pids = pids
        self.interval = interval
        self.peak_sum = 0
        self.peak = {a: 0 for a in pids}
        self.before = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _rss(self) -> dict[str, int]:
        out = {}
        for a, p in self.procs.items():
            try:
                out[a] = p.memory_info().rss
            except Exception:  # noqa: BLE001
                out[a] = 0
        return out

    def _loop(self):
        while not self._stop.is_set():
            rss = self._rss()
            self.peak_sum = max(self.peak_sum, sum(rss.values()))
            for a, v in rss.items():
                self.peak[a] = max(self.peak[a], v)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        mb = 1 / 1e6
        return {
            "before_mb": [round(v * mb) for v in self.before.values()],
            "sampled_peak_mb": [round(v * mb) for v in self.peak.values()],
            "sampled_peak_sum_mb": round(self.peak_sum * mb),
            "hwm_mb": [round((peak_rss(p) or 0) * mb) for p in self.pids.values()],
        }


# ----------------------------------------------------------------------------
# One measured run (in the tool process)
# ----------------------------------------------------------------------------
def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def _traffic(target) -> dict | None:
    if target is None or not target.metrics_url:
        return None
    try:
        return s3mod.scrape(target.metrics_url, target.bucket)
    except OSError:
        return None


def _traffic_delta(before, after) -> dict | None:
    if not before or not after:
        return None
    req = {k: v - before["requests"].get(k, 0) for k, v in after["requests"].items()}
    req = {k: v for k, v in req.items() if v}
    return {"received": after["bytes_received"] - before["bytes_received"],
            "sent": after["bytes_sent"] - before["bytes_sent"],
            "requests": sum(req.values()), "by_type": req}


def measure(tool: str, scenario: str, quick: bool, workdir: str) -> dict:
    _WORKDIR[0] = workdir
    os.makedirs(workdir, exist_ok=True)
    spec = SPECS[quick]
    out = {"tool": tool, "scenario": scenario, "quick": quick}
    target = None
    if scenario in S3_SCENARIOS:
        target = s3mod.Target.from_env()
        if target is None:
            return out | {"status": "cannot", "reason": f"no S3 server given (${s3mod.ENV}; "
                          f"run {scenario} through benchmarks.run)"}
    t0 = time.perf_counter()
    try:
        impl = tool_class(tool, scenario)(scenario, target)
    except CannotDo as e:
        return out | {"status": "cannot", "reason": str(e)}
    except Exception as e:  # noqa: BLE001
        return out | {"status": "cannot", "reason": "setup: " + _short(e),
                      "traceback": traceback.format_exc()[-3000:]}
    loc = None
    try:
        # Untimed warm-up: a tiny write (imports, first-call costs, s3fs instance).
        try:
            wloc = Location(workdir, target, f"warm-{tool}")
            try:
                impl.prepare(WARM_SPEC, wloc)
                impl.run(WARM_SPEC, wloc)
                w = impl.check(WARM_SPEC, wloc)
                if not w["ok"]:
                    out["warmup_error"] = "check: " + w["detail"]
            finally:
                wloc.remove()
        except Exception as e:  # noqa: BLE001
            out["warmup_error"] = _short(e)
        loc = Location(workdir, target, tool)
        impl.prepare(spec, loc)
        out["setup_seconds"] = time.perf_counter() - t0
        mem = WorkerMemory(impl.worker_pids) if getattr(impl, "worker_pids", None) else None
        before = _traffic(target)
        if mem:
            mem.__enter__()
        try:
            t1 = time.perf_counter()
            impl.run(spec, loc)
            out["seconds"] = time.perf_counter() - t1
        finally:
            if mem:
                mem.__exit__()
        if target:
            time.sleep(0.2)  # let the server finish accounting
            out["s3_traffic"] = _traffic_delta(before, _traffic(target))
        if mem:
            out["worker_memory"] = mem.summary()
        if getattr(impl, "peer_maxrss_mb", None) is not None:
            out["peer_maxrss_mb"] = impl.peer_maxrss_mb
        out["result"] = impl.check(spec, loc)
        out["status"] = "ok"
    except CannotDo as e:
        out |= {"status": "cannot", "reason": str(e)}
    except Exception as e:  # noqa: BLE001
        out |= {"status": "cannot", "reason": _short(e),
                "traceback": traceback.format_exc()[-3000:]}
    finally:
        if loc is not None:
            try:
                loc.remove()
            except Exception:  # noqa: BLE001
                pass
        try:
            impl.close()
        except Exception:  # noqa: BLE001
            pass
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="One measured write run (see benchmarks.write).")
    p.add_argument("tool", choices=list(TOOL_NAMES))
    p.add_argument("scenario", choices=list(SCENARIOS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workdir", default=DEFAULT_WORKDIR)
    a = p.parse_args(argv)
    res = measure(a.tool, a.scenario, a.quick, os.path.abspath(a.workdir))
    sys.stdout.flush()
    print("@@RESULT@@ " + json.dumps(res), flush=True)
    return 0


# ----------------------------------------------------------------------------
# The scenario (in benchmarks.run)
# ----------------------------------------------------------------------------
def describe(scenario: str, spec: WriteSpec) -> str:
    where = ("to the local S3 server (SeaweedFS, loopback), a fresh prefix per run"
             if scenario in S3_SCENARIOS else "to local disk (page cache; no tool calls fsync)")
    how = DATASET_ASSIGNMENT.get(scenario)
    if how is not None:
        per = (f"one time step ({spec.shape[1]}, {spec.shape[2]}) per assignment, {spec.shape[0]} assignments, "
               "along an unlimited time dimension" if how == "steps" else
               f"one sub-array {spec.frag_shape} per assignment, {spec.nfrag} assignments")
        return (f"write {spec.shape} float32 = {spec.nbytes / 1e9:.3f} GB through a netCDF4-python-style "
                f"Dataset (benchmarks/netcdf4_script.py), {per}, sub-arrays {spec.frag_shape}, "
                f"uncompressed, with coordinate variables, {where}; values generated on the fly inside the clock")
    return (f"write {spec.shape} float32 = {spec.nbytes / 1e9:.3f} GB as {spec.nfrag} fragments "
            f"{spec.frag_shape}, uncompressed netCDF-4 (contiguous) with coordinate variables, "
            f"{where}; values generated on the fly inside the clock")


#: The environment variable naming another daskcfa source tree to measure (see :mod:`benchmarks.compare`).
DASKCFA_ROOT = "DASKCFA_BENCH_ROOT"


def run_once(tool, scenario, quick, workdir, timeout, raw_log, secrets, extra_env=None):
    cmd = [sys.executable, "-m", "benchmarks.write", tool, scenario, f"--workdir={workdir}"]
    root = os.environ.get(DASKCFA_ROOT)
    if root:  # that tree's daskcfa package, this harness
        cmd[1:3] = ["-c", f"import runpy, sys; sys.path.insert(0, {root!r}); "
                          "runpy.run_module('benchmarks.write', run_name='__main__', alter_sys=True)"]
    if quick:
        cmd.append("--quick")
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.update(extra_env or {})
    try:
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        _log(raw_log, tool, "timeout", e.stderr, secrets)
        return {"status": "cannot", "reason": f"timeout after {timeout:.0f} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("@@RESULT@@ "):
            res = json.loads(line[len("@@RESULT@@ "):])
            if res.get("status") != "ok" or not res.get("result", {}).get("ok"):
                _log(raw_log, tool, res.get("reason") or res.get("result", {}).get("detail"),
                     (res.get("traceback") or "") + p.stderr, secrets)
            return res
    sig = f"signal {-p.returncode}" if p.returncode < 0 else f"exit code {p.returncode}"
    _log(raw_log, tool, f"crashed ({sig})", p.stdout[-3000:] + p.stderr, secrets)
    return {"status": "cannot", "reason": f"crashed ({sig})"}


def _log(raw_log, tool, what, text, secrets):
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text, what = text or "", str(what)
    for s in secrets:
        text, what = text.replace(s, "<redacted>"), what.replace(s, "<redacted>")
    with open(raw_log, "a") as f:
        f.write(f"===== {time.strftime('%H:%M:%S')} {tool}: {what}\n{text[-8000:]}\n")


def _fmt_s(t):
    return f"{t:.3g}"


def _mem_note(wm: dict) -> str:
    return (f"worker peak RSS {'/'.join(map(str, wm['hwm_mb']))} MB (VmHWM; "
            f"{'/'.join(map(str, wm['before_mb']))} MB before the write; largest sampled sum "
            f"{wm['sampled_peak_sum_mb']} MB)")


def render_table(scenario, spec, out) -> str:
    limit = RAW_LIMIT[scenario]
    raw = out.get(limit, {})
    lines = list(TABLE_HEADER)
    for tool, rec in out.items():
        label = rec["label"]
        if rec["status"] == "cannot":
            lines.append(cannot_row(label, rec["reason"]))
            continue
        notes = list(rec.get("notes", []))
        notes.append(runs_note(rec["times"], _fmt_s, " s"))
        fb = rec.get("fragment_bytes")
        if fb:
            notes.append(f"{fb / 1e9:.3f} GB of fragment files, {fb / rec['median'] / 1e6:.0f} MB/s")
        tr = rec.get("s3_traffic")
        if tr:
            note = f"server received {tr['received'] / 1e6:.4g} MB in {tr['requests']} requests"
            if fb:
                note += f" ({tr['received'] / fb:.3g}x the fragments)"
            by = ", ".join(f"{k} {v}" for k, v in sorted(tr["by_type"].items()))
            notes.append(note + (f" [{by}]" if by else ""))
        if rec.get("worker_memory"):
            notes.append(_mem_note(rec["worker_memory"]))
        rss = f"RSS {rec['maxrss_mb']:.0f} MB"
        if tool == "raw-s3-pipe":
            rss += " (holds the prebuilt bytes)"
        elif rec.get("peer_maxrss_mb"):
            rss = f"RSS {rec['peer_maxrss_mb']:.0f} MB (the S3netCDF4 process)"
        elif tool == "daskcfa-distributed":
            rss += " (client process)"
        notes.append(rss)
        xr_ = rec.get("x_raw_limit")
        dr = rec.get("daskcfa_over_tool")
        answer = rec["check"] if rec["status"] == "ok" else f"**wrong answer**: {rec['check']}"
        lines.append(
            f"| {label} | {_fmt_s(rec['median'])} | {f'{xr_:.2f}x' if xr_ else '-'} | "
            f"{f'{dr:.3g}' if dr and tool != 'daskcfa' else '-'} | {answer} | "
            f"{'; '.join(notes)} |")
    raw_desc = (f"raw limit = {raw.get('label', limit)}: {_fmt_s(raw['median'])} s"
                if raw.get("status") == "ok" else "raw limit: n/a")
    return (f"{raw_desc}. `x raw limit` = tool time / raw limit (lower is better); "
            f"`daskcfa / tool` = daskcfa (threads) time / tool time (< 1: daskcfa faster). "
            f"Data {spec.nbytes / 1e9:.3f} GB.\n\n" + "\n".join(lines) + "\n")


def run_scenario(scenario: str, args, stage=None, machine: dict | None = None) -> dict:
    spec = SPECS[bool(args.quick)]
    suffix = ".quick" if args.quick else ""
    os.makedirs(RESULTS, exist_ok=True)
    raw_log = os.path.join(RESULTS, f"{scenario}{suffix}.raw")
    if os.path.exists(raw_log):
        os.unlink(raw_log)
    workdir = DEFAULT_WORKDIR
    shutil.rmtree(workdir, ignore_errors=True)  # leftovers of killed runs
    tools = [t for t in TOOL_ORDER[scenario] if not args.tools_given or t in args.tools]
    budget = args.budget
    secrets = stage.secrets if stage is not None else []
    extra_env = stage.env() if (scenario in S3_SCENARIOS and stage is not None) else None
    print(f"\n### {scenario}\n\n{describe(scenario, spec)}\n", flush=True)
    t_scen = time.perf_counter()

    def once(tool):
        return run_once(tool, scenario, args.quick, workdir, args.timeout, raw_log, secrets,
                        extra_env)

    out = {}
    for tool in tools:
        t_tool = time.perf_counter()
        rec = {"label": tool_label(tool, scenario)}
        warm, runs, reason = repeated_runs(lambda: once(tool), args.repeats, budget)
        if reason is not None:
            rec.update(status="cannot", reason=reason)
        else:
            checks = [r["result"] for r in [warm] + runs]
            bad = next((c for c in checks if not c["ok"]), None)
            times = [r["seconds"] for r in runs]
            rec.update(
                status="ok" if bad is None else "wrong",
                check=(bad or checks[-1])["detail"], notes=[], times=times,
                warmup_seconds=warm["seconds"], median=statistics.median(times),
                setup_seconds=statistics.median(r.get("setup_seconds", 0) for r in runs),
                maxrss_mb=max(r.get("maxrss_mb", 0) for r in runs),
                fragment_bytes=runs[-1]["result"].get("fragment_bytes"),
            )
            if all(r.get("peer_maxrss_mb") for r in runs):
                rec["peer_maxrss_mb"] = max(r["peer_maxrss_mb"] for r in runs)
            for r in runs:
                if r.get("warmup_error"):
                    rec["notes"].append("warm-up write failed: " + r["warmup_error"])
                    break
            tr = [r.get("s3_traffic") for r in runs]
            if all(tr):
                rec["s3_traffic"] = {
                    "received": int(statistics.median(t["received"] for t in tr)),
                    "sent": int(statistics.median(t["sent"] for t in tr)),
                    "requests": int(statistics.median(t["requests"] for t in tr)),
                    "by_type": tr[-1]["by_type"], "runs": tr}
            wm = [r.get("worker_memory") for r in runs]
            if all(wm):
                rec["worker_memory"] = {
                    "hwm_mb": [max(w["hwm_mb"][i] for w in wm) for i in range(len(wm[0]["hwm_mb"]))],
                    "before_mb": wm[-1]["before_mb"],
                    "sampled_peak_sum_mb": max(w["sampled_peak_sum_mb"] for w in wm),
                    "runs": wm}
        rec["wall_seconds"] = time.perf_counter() - t_tool
        out[tool] = rec
        status = (f"{rec['median']:.3f} s" if rec["status"] == "ok" else
                  f"WRONG ANSWER {rec['check']}" if rec["status"] == "wrong" else
                  f"cannot do this ({rec['reason']})")
        print(f"  {tool:22s} {status}  [{rec['wall_seconds']:.1f} s wall]", file=sys.stderr,
              flush=True)
    raw = out.get(RAW_LIMIT[scenario], {})
    raw_t = raw.get("median") if raw.get("status") == "ok" else None
    dc = out.get("daskcfa", {})
    dc_t = dc.get("median") if dc.get("status") == "ok" else None
    for rec in out.values():
        if rec.get("status") in ("ok", "wrong"):
            rec["x_raw_limit"] = rec["median"] / raw_t if raw_t else None
            rec["daskcfa_over_tool"] = dc_t / rec["median"] if dc_t else None
    table = render_table(scenario, spec, out)
    print(table, flush=True)
    doc = {
        "scenario": scenario, "kind": "write", "quick": bool(args.quick),
        "description": describe(scenario, spec),
        "spec": {"nfrag": spec.nfrag, "frag_shape": list(spec.frag_shape),
                 "shape": list(spec.shape), "nbytes": spec.nbytes},
        "raw_limit": RAW_LIMIT[scenario], "repeats": args.repeats, "budget": budget,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine,
        "wall_seconds": time.perf_counter() - t_scen, "tools": out, "table": table,
    }
    with open(os.path.join(RESULTS, f"{scenario}{suffix}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    shutil.rmtree(workdir, ignore_errors=True)
    return doc


if __name__ == "__main__":
    # Run through the importable module, so that the functions shipped to
    # distributed workers (``_block``) pickle by reference, not from __main__.
    from benchmarks.write import main as _main

    sys.exit(_main())
