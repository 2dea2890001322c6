"""Incomplete multipart uploads under a prefix aborted (``storage.uploads``), on the real S3 server."""

from __future__ import annotations

from daskcfa.storage import register
from daskcfa.storage.uploads import abort_uploads


def test_the_uploads_under_a_directory_are_aborted_and_none_beside_it(s3_server, tmp_path):
    bucket, client = s3_server.new_bucket(), s3_server.client()
    keys = ["t/g-0/a.nc", "t/g-0/a.nc", "t/g-0/sub/b.nc", "t/g-0x/c.nc", "t/g-1/d.nc"]
    for key in keys:
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)
        client.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"p" * 1024)
    profile = register(s3_server.storage_options, protocol="s3")

    assert abort_uploads(f"s3://{bucket}/t/g-0/", profile) == 3  # (an object's two uploads, one deeper)
    left = sorted(u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))
    assert left == ["t/g-0x/c.nc", "t/g-1/d.nc"]  # (a name beginning alike is not under the directory)
    assert abort_uploads(f"s3://{bucket}/t/g-0/", profile) == 0
    assert abort_uploads(f"s3://{bucket}/t/g-1", profile) == 0  # (not a directory: nothing)
    assert abort_uploads(str(tmp_path) + "/", profile) == 0  # (local: none to abort)
