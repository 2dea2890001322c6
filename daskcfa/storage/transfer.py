"""The integrity of whole S3 objects as they arrive: their CRC-32, checked by daskcfa with ISA-L.

botocore checks the ``x-amz-checksum-crc32`` of every GET response itself,
with zlib's CRC-32 (about 0.4 GB/s here), holding the GIL: on a 0.76 GB read
that was about 1.8 s of CPU, one core, while the downloads and the decoding
waited. A whole object's body read through :func:`checked_body` (on fsspec's
event loop) or :func:`whole_body` (a blocking GET, :mod:`.direct`) skips
botocore's update of its check and takes the CRC-32 of the same bytes with
ISA-L instead (about 25x faster), then compares it with the checksum the
server sent. A difference is a :class:`~daskcfa.errors.StorageError` naming
the object, as botocore's ``FlexibleChecksumError`` became before. Nothing is
checked less: bodies botocore checks by another algorithm (or through another
HTTP client) keep botocore's check; the length is still checked by botocore
at the end.
"""

from __future__ import annotations

import base64
import binascii
import functools
from typing import Any, Awaitable, Callable, Mapping

from isal.isal_zlib import crc32

from ..errors import StorageError
from .deadline import body_deadline, shut_connection_of

__all__ = ["checked_body", "whole_body", "expected_crc32", "check_crc32"]


class _Crc32:
    """The CRC-32 of a body's bytes as they come, checked against the server's at its end."""

    def __init__(self, expected: bytes, uri: str) -> None:
        self._expected = int.from_bytes(expected, "big")
        self._uri = uri
        self._crc = 0

    def update(self, block: Any) -> None:
        self._crc = crc32(block, self._crc)

    def check(self) -> None:
        if self._crc != self._expected:
            raise StorageError(f"the object's bytes arrived changed: CRC-32 {self._crc:08x}, "
                               f"the server's {self._expected:08x}", file=self._uri)


class _Crc32Body:
    """Reads of a response body (aiobotocore) whose CRC-32 daskcfa checks (at the end of the body)."""

    def __init__(self, read: Callable[[int], Awaitable[bytes]], crc: _Crc32) -> None:
        self._read = read
        self._crc = crc

    async def read(self, amt: int) -> bytes:
        block = await self._read(amt)
        if block:
            self._crc.update(block)
        else:
            self._crc.check()
        return block


def expected_crc32(response: Mapping[str, Any]) -> bytes | None:
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
    """``read(amt)`` of an aiobotocore GET response's body (each an ``await``; ``b""`` at its end): the
    CRC-32 checked by daskcfa where botocore would check it, else the body's own read (and its checks)."""
    from aiobotocore.httpchecksum import AioStreamingChecksumBody  # (here: blocking reads never need aiobotocore)
    from aiobotocore.response import AioStreamingBody

    body = response["Body"]
    expected = expected_crc32(response)
    if expected is None or not isinstance(body, AioStreamingChecksumBody):
        return body.read
    # (the body's read less botocore's check)
    return _Crc32Body(functools.partial(AioStreamingBody.read, body), _Crc32(expected, uri)).read


def whole_body(response: Mapping[str, Any], uri: str, read_timeout: float | None) -> bytes:
    """The whole body of a botocore (blocking) GET response, received into one buffer of the length
    the server declared (``http.client`` reads the socket straight into it: no joins, no second
    copy), its CRC-32 checked by daskcfa where botocore would check it. The caller has checked that
    length (``ContentLength``); a body shorter than it is botocore's error, as is a failed check of
    another algorithm (both at the body's end, which is read here). Received within its deadline
    (:mod:`.deadline`; ``read_timeout``: the client's)."""
    from botocore.httpchecksum import StreamingChecksumBody
    from botocore.response import StreamingBody

    body = response["Body"]
    length = int(response["ContentLength"])
    expected = expected_crc32(response)
    ours = expected is not None and isinstance(body, StreamingChecksumBody)
    read = functools.partial(StreamingBody.read, body) if ours else body.read  # (the body's read less botocore's check)
    with body_deadline(length, read_timeout, uri, shut_connection_of(getattr(body, "_raw_stream", None))):
        data = read(length) if length else b""
        beyond = read(1)
    if beyond or len(data) != length:  # (the end: botocore checks the length there, and raises when short)
        raise StorageError(f"the object's body is not the {length:,} bytes the server declared", file=uri)
    if ours:
        check_crc32(data, expected, uri)
    return data


def check_crc32(data: Any, expected: bytes, uri: str) -> None:
    """Raise :class:`StorageError` unless ``data``'s CRC-32 is ``expected`` (4 bytes, as :func:`expected_crc32`)."""
    crc = _Crc32(expected, uri)
    crc.update(data)
    crc.check()
