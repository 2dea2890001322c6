"""The S3 side of the benchmarks: a local S3 server, uploads, and its byte counters.

:mod:`benchmarks.run` starts one real SeaweedFS S3 server
(:class:`daskcfa_testing.servers.S3Server`, on 127.0.0.1 with free ports and
a random admin key) for the whole run, creates one bucket, and uploads each
generated dataset needed by an ``s3-*`` scenario once (untimed) to
``s3://<bucket>/<dataset directory name>/`` (``aggregation.nc`` and
``frag/*.nc``, the same bytes as on disk). The measured tool processes learn
the endpoint, the credentials, the bucket and the server's Prometheus
metrics address from the environment variable :data:`ENV` (never from the
command line, and never written into results).

Bytes transferred are read from the server's own counters
(``SeaweedFS_s3_bucket_traffic_sent_bytes_total`` and
``SeaweedFS_s3_request_total`` for the bucket) before and after the timed
part of a run: exact, per bucket, and unaffected by other processes on the
machine (only one measured process runs at a time).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass

from benchmarks import generate

ENV = "DASKCFA_BENCH_S3"

_METRIC_RE = re.compile(r"^(SeaweedFS_s3_[a-z_]+)\{([^}]*)\}\s+(\S+)$")
_LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


# ----------------------------------------------------------------------------
# In the measured process
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """Where the uploaded datasets are, as seen by a tool process."""

    endpoint_url: str
    key: str
    secret: str
    bucket: str
    metrics_url: str | None = None

    @classmethod
    def from_env(cls) -> "Target | None":
        raw = os.environ.get(ENV)
        return cls(**json.loads(raw)) if raw else None

    def to_env(self) -> dict:
        return {ENV: json.dumps(asdict(self))}

    @property
    def storage_options(self) -> dict:
        """Options for ``s3fs.S3FileSystem`` / fsspec ``storage_options``."""
        return {"key": self.key, "secret": self.secret,
                "client_kwargs": {"endpoint_url": self.endpoint_url},
                "use_listings_cache": False}

    def prefix(self, dataset_dir: str) -> str:
        """``bucket/<dataset directory name>`` (no scheme)."""
        return f"{self.bucket}/{os.path.basename(os.path.abspath(dataset_dir))}"

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options)

    def traffic(self) -> dict | None:
        """The server's counters for the bucket: bytes sent, requests by type."""
        if not self.metrics_url:
            return None
        try:
            return scrape(self.metrics_url, self.bucket)
        except OSError:
            return None  # no numbers rather than a failed run


def scrape(metrics_url: str, bucket: str) -> dict:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = {"bytes_sent": 0, "bytes_received": 0, "requests": {}}
    for line in text.splitlines():
        m = _METRIC_RE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), dict(_LABEL_RE.findall(m.group(2))), m.group(3)
        if labels.get("bucket") != bucket:
            continue
        if name == "SeaweedFS_s3_bucket_traffic_sent_bytes_total":
            out["bytes_sent"] = int(float(value))
        elif name == "SeaweedFS_s3_bucket_traffic_received_bytes_total":
            out["bytes_received"] = int(float(value))
        elif name == "SeaweedFS_s3_request_total":
            key = labels.get("type", "?")
            out["requests"][key] = out["requests"].get(key, 0) + int(float(value))
    return out


def traffic_delta(before: dict | None, after: dict | None) -> dict | None:
    if not before or not after:
        return None
    req = {k: v - before["requests"].get(k, 0) for k, v in after["requests"].items()}
    req = {k: v for k, v in req.items() if v}
    return {"bytes": after["bytes_sent"] - before["bytes_sent"],
            "requests": sum(req.values()), "by_type": req}


# ----------------------------------------------------------------------------
# In benchmarks.run
# ----------------------------------------------------------------------------
class Stage:
    """One S3 server + bucket for a whole benchmark run; uploads each dataset once."""

    def __init__(self):
        self.server = None
        self.target: Target | None = None
        self._uploaded: dict[str, dict] = {}

    def __enter__(self) -> "Stage":
        from daskcfa_testing.servers import S3Server, free_ports

        mport, = free_ports(1)
        t0 = time.perf_counter()
        self.server = S3Server(extra_args=(f"-metricsPort={mport}", "-metricsIp=127.0.0.1"))
        self.server.start()
        bucket = self.server.new_bucket("bench")
        self.target = Target(self.server.endpoint_url, self.server.key, self.server.secret,
                             bucket, f"http://127.0.0.1:{mport}/metrics")
        print(f"S3 server (SeaweedFS, pid {self.server.pid}) up in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc):
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def secrets(self) -> list[str]:
        """Strings that must never appear in anything written."""
        return [self.target.secret, self.target.key] if self.target else []

    def env(self) -> dict:
        return self.target.to_env()

    def upload(self, dataset_dir: str) -> dict:
        """Upload the aggregation file and fragments of a dataset (once per run)."""
        dataset_dir = os.path.abspath(dataset_dir)
        if dataset_dir in self._uploaded:
            return self._uploaded[dataset_dir]
        ds = generate.Dataset.load(dataset_dir)
        rel = [ds.params["aggregation"]] + list(ds.params["fragments"])
        local = [os.path.join(dataset_dir, r) for r in rel]
        prefix = self.target.prefix(dataset_dir)
        remote = [f"{prefix}/{r}" for r in rel]
        fs = self.target.filesystem()
        t0 = time.perf_counter()
        fs.put(local, remote)
        seconds = time.perf_counter() - t0
        # Check what arrived: every object, with the size of its local file.
        have = {k: v["size"] for k, v in fs.find(prefix, detail=True).items()}
        bad = [r for r, lp in zip(remote, local) if have.get(r) != os.path.getsize(lp)]
        if bad:
            raise RuntimeError(f"upload to S3 incomplete: {len(bad)} objects missing or "
                               f"of the wrong size, e.g. {bad[0]}")
        nbytes = sum(os.path.getsize(p) for p in local)
        info = {"objects": len(rel), "bytes": nbytes, "seconds": round(seconds, 2)}
        print(f"uploaded {os.path.basename(dataset_dir)}: {len(rel)} objects, "
              f"{nbytes / 1e6:.1f} MB in {seconds:.1f} s", file=sys.stderr, flush=True)
        self._uploaded[dataset_dir] = info
        return info


def point_chunk_bytes(ds: generate.Dataset) -> dict | None:
    """Stored (compressed) bytes of the HDF5 chunks that hold ``x[:, py, px]``,
    summed over the fragments (h5py ``get_chunk_info_by_coord`` on the local
    copies): the least a chunk-aware reader must fetch for the time series."""
    import h5py

    py, px = ds.point
    total = nchunks = 0
    for path in ds.fragments:
        with h5py.File(path, "r") as f:
            d = f[generate.VARNAME]
            if d.chunks is None:  # contiguous: the point itself is the minimum
                total += d.shape[0] * d.dtype.itemsize
                continue
            ct, cy, cx = d.chunks
            for t0 in range(0, d.shape[0], ct):
                info = d.id.get_chunk_info_by_coord((t0, py // cy * cy, px // cx * cx))
                total += info.size
                nchunks += 1
    return {"bytes": total, "chunks": nchunks}
