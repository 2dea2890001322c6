"""The integrity of whole S3 objects as they arrive: their CRC-32, checked by daskcfa with ISA-L.

botocore checks the ``x-amz-checksum-crc32`` of every GET response itself,
with zlib's CRC-32 (about 0.4 GB/s here) on the event loop thread that every
transfer of the process shares, holding the GIL: on a 0.76 GB read that was
about 1.8 s of CPU, one core, while the downloads and the decoding waited.
A whole object's body read through :func:`checked_body` skips botocore's
update of its check and takes the CRC-32 of the same bytes with ISA-L
instead (about 25x faster), block by block as they come, then compares it
with the checksum the server sent. A difference is a
:class:`~daskcfa.errors.StorageError` naming the object, as botocore's
``FlexibleChecksumError`` became before. Nothing is checked less: bodies
botocore checks by another algorithm (or through another HTTP client) keep
botocore's check; the length is still checked by botocore at the end.
"""

from __future__ import annotations

import base64
import binascii
import functools
from typing import Any, Awaitable, Callable, Mapping

from aiobotocore.httpchecksum import AioStreamingChecksumBody
from aiobotocore.response import AioStreamingBody
from isal.isal_zlib import crc32

from ..errors import StorageError

__all__ = ["checked_body"]


class _Crc32Body:
    """Reads of a response body whose CRC-32 daskcfa checks (at the end of the body)."""

    def __init__(self, body: AioStreamingChecksumBody, expected: bytes, uri: str) -> None:
        self._read = functools.partial(AioStreamingBody.read, body)  # (the body's read less botocore's check)
        self._expected = int.from_bytes(expected, "big")
        self._uri = uri
        self._crc = 0

    async def read(self, amt: int) -> bytes:
        block = await self._read(amt)
        if block:
            self._crc = crc32(block, self._crc)
        elif self._crc != self._expected:
            raise StorageError(f"the object's bytes arrived changed: CRC-32 {self._crc:08x}, "
                               f"the server's {self._expected:08x}", file=self._uri)
        return block


def _expected_crc32(response: Mapping[str, Any]) -> bytes | None:
    """The whole object's CRC-32 the server sent (4 bytes), if it sent one: a multipart
    object's composite checksum (``COMPOSITE``, written ``<base64>-<parts>``, not base64) is
    not the CRC-32 of its bytes."""
    value = response.get("ChecksumCRC32")
    if not isinstance(value, str) or response.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        return None
    try:
        decoded = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None  # (botocore's check, kept, reports it)
    return decoded if len(decoded) == 4 else None


def checked_body(response: Mapping[str, Any], uri: str) -> Callable[[int], Awaitable[bytes]]:
    """``read(amt)`` of a GET response's body (each an ``await``; ``b""`` at its end): the CRC-32
    checked by daskcfa where botocore would check it, else the body's own read (and its checks)."""
    body = response["Body"]
    expected = _expected_crc32(response)
    if expected is None or not isinstance(body, AioStreamingChecksumBody):
        return body.read
    return _Crc32Body(body, expected, uri).read
