"""The lead's late fixes of session 18 attacked (attack18b): a dead writer's uploads aborted, a Dataset
writer's generation recorded when it stored something, staged pieces read back. Real servers only."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from daskcfa import CFAError
from daskcfa.graph.split import _load
from daskcfa.storage import register
from daskcfa.storage.lease import Lease
from daskcfa.storage.uploads import abort_uploads

GEN = "g-0123456789abcdef"


def _upload(client, bucket: str, key: str) -> None:
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"p" * 1024)


def _uploads(client, bucket: str) -> list[str]:
    return sorted(u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))


def test_a_dataset_writer_that_stored_only_an_incomplete_upload_has_its_generation_recorded(s3_server):
    """A writer whose only trace is a large fragment's upload cut short (no object yet): ``exists`` says its
    generation holds nothing, yet the parts it sent are stored (and billed) until aborted."""
    bucket, client = s3_server.new_bucket(), s3_server.client()
    profile = register(s3_server.storage_options, protocol="s3")
    lease = Lease.new(f"s3://{bucket}/t.nc", profile, GEN).acquire()
    _upload(client, bucket, f"t/{GEN}/t.tas.0.nc")
    lease.abandon()
    record = json.loads(client.get_object(Bucket=bucket, Key="t/.daskcfa/abandoned.json")["Body"].read())
    assert GEN in json.dumps(record["abandoned"])


@pytest.mark.parametrize("name", ["é t%20x+y.nc", "a%2Fb.nc", "sp ace/ü.nc"])
def test_uploads_of_awkward_names_are_aborted_and_none_beside_them(s3_server, name):
    bucket, client = s3_server.new_bucket(), s3_server.client()
    _upload(client, bucket, f"t/{GEN}/{name}")
    _upload(client, bucket, f"t/{GEN}x/{name}")
    profile = register(s3_server.storage_options, protocol="s3")
    assert abort_uploads(f"s3://{bucket}/t/{GEN}/", profile) == 1
    assert _uploads(client, bucket) == [f"t/{GEN}x/{name}"]


def test_uploads_listed_over_several_pages_are_all_aborted(s3_server):
    bucket, client = s3_server.new_bucket(), s3_server.client()
    for i in range(7):
        _upload(client, bucket, f"t/{GEN}/{i}.nc")
    page = client.list_multipart_uploads(Bucket=bucket, MaxUploads=3)
    print("page", {k: v for k, v in page.items() if k != "ResponseMetadata"})
    profile = register(s3_server.storage_options, protocol="s3")
    assert abort_uploads(f"s3://{bucket}/t/{GEN}/", profile) == 7
    assert _uploads(client, bucket) == []


def _npy(values: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, values, allow_pickle=False)
    return f.getvalue()


@pytest.mark.parametrize("tamper", ["dtype", "truncated", "garbage", "object", "fortran"])
def test_a_tampered_staged_piece_is_refused_with_a_daskcfa_error(tmp_path, tamper):
    shape, dtype = (3, 4), np.dtype("i2")
    good = np.arange(12, dtype=dtype).reshape(shape)
    data = {"dtype": _npy(good.astype("f8") + 0.5), "truncated": _npy(good)[:-5], "garbage": b"\x93NUMPY" + b"x" * 50,
            "object": _npy(good)[:10] + b"{'descr': '|O', 'fortran_order': False, 'shape': (3, 4), }".ljust(118)
            + b"\n",
            "fortran": _npy(np.asfortranarray(good))}[tamper]
    path = tmp_path / "piece.npy"
    path.write_bytes(data)
    if tamper == "fortran":
        assert np.array_equal(_load(str(path), None, shape, dtype), good)
        return
    with pytest.raises(CFAError, match="piece"):
        _load(str(path), None, shape, dtype)



def test_more_uploads_than_a_listing_page_are_all_aborted(s3_server, monkeypatch):
    """SeaweedFS names no ``NextKeyMarker`` on a truncated page (only the upload id's): abort_uploads
    stopped after the first page, leaving the rest. (Pages of 4 here, as of 1,000 in use: SeaweedFS
    truncates at ``MaxUploads`` alike; found with its default pages of 10,000 and 10,003 uploads.)"""
    monkeypatch.setattr("daskcfa.storage.uploads.PAGE", 4)
    bucket, client = s3_server.new_bucket(), s3_server.client()
    many = 4 * 3 + 3
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: client.create_multipart_upload(Bucket=bucket, Key=f"t/{GEN}/{i:05}.nc"), range(many)))
    profile = register(s3_server.storage_options, protocol="s3")
    assert abort_uploads(f"s3://{bucket}/t/{GEN}/", profile) == many
    assert _uploads(client, bucket) == []


def _lying_server(body: bytes, declared: int):
    """An HTTP server whose HEAD declares ``declared`` bytes and whose ranged GETs answer from ``body``."""
    from remote_helpers import scripted_server

    def answer(request: str) -> bytes:
        if request.startswith("HEAD"):
            return f"HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\nAccept-Ranges: bytes\r\n\r\n".encode()
        ranged = [line for line in request.split("\r\n") if line.lower().startswith("range: bytes=")]
        a, _, b = ranged[0].split("=", 1)[1].partition("-") if ranged else ("0", "", "")
        start, stop = int(a), min(len(body), int(b) + 1 if b else len(body))
        part = body[start:stop]
        return (f"HTTP/1.1 206 Partial Content\r\nContent-Length: {len(part)}\r\n"
                f"Content-Range: bytes {start}-{stop - 1}/{len(body)}\r\n\r\n").encode() + part
    return scripted_server(answer)


@pytest.mark.parametrize("blocks, extra", [(1, 0), (1, 1), (2, -1)])
@pytest.mark.parametrize("lie", [0, 7])
def test_an_http_file_read_in_blocks_at_and_past_a_block_s_end(blocks, extra, lie):
    """A file of exactly a block, a block and one byte, two blocks less one: read whole, as the server has
    it; a HEAD declaring more than the body (``lie``): refused as a body ended early, never short bytes."""
    from daskcfa import storage

    body = bytes(range(256)) * ((blocks * storage.block_size() + extra) // 256 + 1)
    body = body[:blocks * storage.block_size() + extra]
    url, listener = _lying_server(body, len(body) + lie)
    try:
        f = storage.open_file(url, storage.register({}, protocol="http"))
        with f:
            if lie:
                with pytest.raises(CFAError):
                    f.seek(len(body) - 1)
                    f.read()
            else:
                f.seek(len(body) - 1)
                assert f.read() == body[-1:]
                f.seek(0)
                assert f.read() == body
    finally:
        listener.close()
