"""The CRC-32 daskcfa takes of whole S3 objects (storage/transfer.py): which server checksums it
takes as the CRC-32 of an object's bytes. (Its check of real transfers, through a proxy that
changes bytes: tests/storage/test_remote_read.py::test_s3_bytes_changed_in_transfer_are_refused.)"""

from __future__ import annotations

import base64

import pytest

from daskcfa.storage import transfer

CRC = base64.b64encode(bytes.fromhex("0a1b2c3d")).decode()


def test_a_full_object_crc32_is_taken():
    assert transfer.expected_crc32({"ChecksumCRC32": CRC}) == bytes.fromhex("0a1b2c3d")
    assert transfer.expected_crc32({"ChecksumCRC32": CRC, "ChecksumType": "FULL_OBJECT"}) == bytes.fromhex("0a1b2c3d")


@pytest.mark.parametrize("response", [
    {},  # no checksum sent: nothing to check (as botocore)
    {"ChecksumSHA256": "x"},  # another algorithm: botocore's check is kept
    {"ChecksumCRC32": CRC + "-3"},  # a multipart object's composite checksum is not its bytes' CRC-32
    {"ChecksumCRC32": CRC, "ChecksumType": "COMPOSITE"},
    {"ChecksumCRC32": "not base64!"},  # malformed: left to botocore's check, which reports it
    {"ChecksumCRC32": base64.b64encode(b"12345").decode()},  # not 4 bytes
])
def test_anything_else_is_left_to_botocore(response):
    assert transfer.expected_crc32(response) is None
