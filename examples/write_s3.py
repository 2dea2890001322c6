"""Write a dataset to S3 in parallel with ``daskcfa.to_cfa``, then read it back.

What it shows:
1. a dask array computed on the workers of a ``distributed.LocalCluster``
   (the sample temperature field, generated chunk by chunk where it is
   needed) written as a CF-1.13 aggregation on S3: one task per fragment
   builds a netCDF file in memory and uploads it from its worker, no data
   pass through this process; ``max_concurrent_uploads`` bounds the uploads
   in flight across the cluster; the aggregation file is put in place last,
   only once every fragment is stored;
2. credentials given once, as ``storage_options``: workers receive them
   through a worker plugin, never in the task graph;
3. the objects written, and the aggregation read back with
   ``daskcfa.from_cfa`` and compared with the values written.

Run: ``python examples/write_s3.py`` starts a throw-away local S3 server
(SeaweedFS, from the ``test`` extra) and writes there. On a real object
store::

    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\
    python examples/write_s3.py s3://bucket/archive/tas.nca --endpoint-url https://s3.example

(``--key``/``--secret``/``--endpoint-url`` override ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and ``AWS_ENDPOINT_URL``). The bucket is created
if it does not exist.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import s3fs
from distributed import Client, LocalCluster

import daskcfa
import sample


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """s3fs options from the arguments, else the standard AWS environment variables (else s3fs's own chain)."""
    options: dict[str, Any] = {}
    key = args.key or os.environ.get("AWS_ACCESS_KEY_ID")
    secret = args.secret or os.environ.get("AWS_SECRET_ACCESS_KEY")
    endpoint = args.endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    if key and secret:
        options.update(key=key, secret=secret)
    if endpoint:
        options["client_kwargs"] = {"endpoint_url": endpoint}
    return options


@contextlib.contextmanager
def local_s3() -> Iterator[tuple[str, dict[str, Any]]]:
    """A throw-away local S3 server with an empty bucket: (URL to write, storage options)."""
    # The repository's test-support package (not installed with daskcfa) sits beside examples/.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from daskcfa_testing.servers import S3Server

    with S3Server() as server:
        print(f"started a local S3 server at {server.endpoint_url}")
        yield f"s3://{server.new_bucket('example')}/archive/tas.nca", server.storage_options


def write_and_read(url: str, options: dict[str, Any], workers: int, uploads: int) -> None:
    fs = s3fs.S3FileSystem(**{**options, "use_listings_cache": False})
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    with LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster):
        t0 = time.perf_counter()
        data = sample.lazy()
        written = daskcfa.to_cfa(data, url, variable=sample.VARIABLE, dims=sample.DIMS, attrs=sample.ATTRS,
                                 coords=sample.coords(), fragment_shape=sample.FRAGMENT_SHAPE,
                                 compression="zlib", storage_options=options, max_concurrent_uploads=uploads)
        print(f"wrote {written} ({data.nbytes / 1e6:.1f} MB as {data.npartitions} fragments) in "
              f"{time.perf_counter() - t0:.1f} s with {workers} workers, at most {uploads} uploads at once")

        prefix = url.removeprefix("s3://").rsplit("/", 1)[0]
        objects = sorted(path for path in fs.find(prefix) if path.endswith(".nc") or path.endswith(".nca"))
        print(f"{len(objects)} objects: {objects[0]} ... {objects[-1]}")

        t0 = time.perf_counter()
        x = daskcfa.from_cfa(url, storage_options=options)
        back = x.compute()
        print(f"read back {x.shape} {x.dtype} in {x.npartitions} chunks in {time.perf_counter() - t0:.1f} s")
        np.testing.assert_array_equal(np.ma.getdata(back), data.compute())
        assert not np.ma.getmaskarray(back).any()
        print("read back: equal to the values written")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="s3://bucket/path/name.nca (default: a throw-away local S3 server)")
    parser.add_argument("--endpoint-url", help="S3 endpoint (default: $AWS_ENDPOINT_URL, else AWS)")
    parser.add_argument("--key", help="access key id (default: $AWS_ACCESS_KEY_ID)")
    parser.add_argument("--secret", help="secret access key (default: $AWS_SECRET_ACCESS_KEY)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--max-concurrent-uploads", type=int, default=4, help="uploads in flight (default 4)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url, options = (args.url, storage_options(args)) if args.url else stack.enter_context(local_s3())
        write_and_read(url, options, args.workers, args.max_concurrent_uploads)


if __name__ == "__main__":
    main()
