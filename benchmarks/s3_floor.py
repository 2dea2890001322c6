"""The S3 variant of ``decode-floor``: the least any reader of the fragment objects needs here.

Four threads (the concurrency the S3 floor of issue #31 names) each take a fragment object
at a time: one plain botocore GET of the whole object (botocore checks the object's checksum,
as it does for every reader), then, with the data's byte locations looked up on the local
copies before the clock, a float64 sum of its values -- after an ISA-L inflate of each stored
chunk when the data are deflated. No dask, no masking, no other checks, no HDF5 at read time.
Whole-array ``mean`` of data without missing values, contiguous or deflate-only chunks.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.tools import CannotDo, S3Dataset, _array_result

#: GETs in flight (one per thread): the floor's stated concurrency
THREADS = 4


def _layout(path: str) -> tuple[list[tuple[int, int]], int, int]:
    """Where a fragment's values lie: ``(offset, stored size)`` per stored chunk (one range for a
    contiguous variable), the bytes of one decoded chunk, and the number of values."""
    import h5py

    with h5py.File(path, "r") as f:
        dsid = f["tas"].id
        plist = dsid.get_create_plist()
        if plist.get_layout() == h5py.h5d.CONTIGUOUS:
            nbytes = int(np.prod(dsid.shape)) * 4
            return [(dsid.get_offset(), nbytes)], nbytes, nbytes // 4
        infos = [dsid.get_chunk_info(i) for i in range(dsid.get_num_chunks())]
        return [(i.byte_offset, i.size) for i in infos], int(np.prod(plist.get_chunk())) * 4, int(np.prod(dsid.shape))


def s3_decode_floor(kind: str, ds: S3Dataset):
    """``(run, describe, teardown)`` of the S3 floor on ``ds`` (see the module's docstring)."""
    zlib = bool(ds.params.get("zlib"))
    if kind != "mean" or ds.params.get("missing") or ds.params.get("shuffle") or (zlib and not ds.params.get("chunks")):
        raise CannotDo("only the mean of contiguous or deflate-only chunked data without missing values")
    import botocore.session
    from isal import isal_zlib

    plan = [(url.split("/", 3)[3], _layout(path)) for url, path in zip(ds.fragment_urls, ds.fragments)]
    target = ds.s3
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=target.endpoint_url, aws_access_key_id=target.key, aws_secret_access_key=target.secret,
        region_name="us-east-1", config=botocore.config.Config(max_pool_connections=THREADS))
    client.head_bucket(Bucket=target.bucket)  # (connections and signing set up before the clock)

    def fragment(item) -> tuple[float, int]:
        key, (ranges, chunk_bytes, count) = item
        body = memoryview(client.get_object(Bucket=target.bucket, Key=key)["Body"].read())
        total = 0.0
        for offset, size in ranges:
            raw = body[offset:offset + size]
            values = isal_zlib.decompressobj().decompress(raw, chunk_bytes) if zlib else raw
            total += float(np.frombuffer(values, np.float32).sum(dtype="f8"))
        return total, count

    def run():
        with ThreadPoolExecutor(THREADS) as pool:
            parts = list(pool.map(fragment, plan))
        return np.float64(sum(t for t, _ in parts) / sum(n for _, n in parts))

    return run, lambda v, p: _array_result(kind, v), client.close
