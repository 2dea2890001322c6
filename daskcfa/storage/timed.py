"""Remote reads on fsspec's event loop, each within its deadline (:mod:`.deadline`).

aiohttp bounds an HTTP request by its own default, 5 minutes whatever its size,
so a server that never answered, trickled a body or sent one without end held a
worker's thread that long (fsspec's ``open`` and ``cat_file`` set no timeout of
their own). Here every HTTP(S) request daskcfa makes -- a HEAD, a whole object, its
byte ranges, the blocks a file object fetches for h5py -- and S3's ranged GETs and
file objects' blocks share the rule of S3's whole objects: the body at ``daskcfa.storage.min-throughput``
after one read timeout's grace (a body of no declared length: as it arrives).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Awaitable, Callable, Sequence

from ..errors import BudgetError, StorageError
from ..lazy import fsspec_asyn
from .deadline import async_body_deadline

__all__ = ["READ_BLOCK", "protocols_of", "is_http", "on_loop", "within_deadline", "bounded", "http_get", "http_ranges",
           "of_their_lengths", "bound_blocks"]

#: Most bytes taken from a response body on the event loop at a time (a read returns what has arrived).
READ_BLOCK = 16 << 20
#: A 206's ``Content-Range`` (RFC 9110 14.4): ``bytes FIRST-LAST/COMPLETE``, the complete length or ``*``.
_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d{1,20})-(\d{1,20})/(\d{1,20}|\*)\s*", re.IGNORECASE)


def protocols_of(fs: Any) -> tuple[str, ...]:
    """The protocols an fsspec filesystem names itself by (on its event loop, if it has one: else none)."""
    if getattr(fs, "loop", None) is None:
        return ()
    return tuple(fs.protocol) if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)


def is_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP(S) filesystem."""
    return "http" in protocols_of(fs)


def on_loop(fs: Any) -> bool:
    """Whether ``fs``'s requests can be bounded here: S3's (s3fs) and HTTP's, on fsspec's event loop."""
    return "s3" in protocols_of(fs) or is_http(fs)


async def _read_timeout(fs: Any) -> float | None:
    """The grace a body has before it must keep to the rate: the client's read timeout (botocore's
    for S3; for HTTP the aiohttp session's ``sock_read``, None by default: the deadline's own)."""
    client = await fs.set_session()
    meta = getattr(client, "meta", None)
    if meta is not None:
        return meta.config.read_timeout
    return getattr(getattr(client, "timeout", None), "sock_read", None)


async def within_deadline(fs: Any, uri: str, length: int | None, receive: Callable[[], Awaitable[Any]],
                          received: Callable[[], int] | None = None) -> Any:
    """``receive()``: requests for ``length`` bytes in all of object ``uri`` on fsspec's event loop, from
    their sending to their bodies' end within one deadline (``length`` None: ``received()`` so far)."""
    async with async_body_deadline(length, await _read_timeout(fs), uri, received):
        return await receive()


def bounded(fs: Any, uri: str, length: int, receive: Callable[[], Awaitable[Any]]) -> Any:
    """:func:`within_deadline`, waited for in this thread."""
    return fsspec_asyn.sync(fs.loop, within_deadline, fs, uri, length, receive)


async def http_get(fs: Any, path: str, uri: str, known_size: int | None, max_bytes: int | None) -> bytes:
    """One GET of a whole HTTP object within its deadline, its body read no further than ``max_bytes``
    and one byte (then a :class:`BudgetError`; fsspec's ``cat_file`` reads a body whole, whatever its
    length: the server's HEAD may have said less), else than ``known_size`` (its HEAD's) and one byte.
    A body of another length than ``known_size`` is cut short or not that object (a body without
    ``Content-Length`` ends where the connection does, and aiohttp inflates a compressed one): an error."""
    parts: list[bytes] = []
    limit = known_size if max_bytes is None else max_bytes
    await within_deadline(fs, uri, known_size, lambda: _get(fs, path, limit, parts), lambda: sum(map(len, parts)))
    got = sum(map(len, parts))
    if max_bytes is not None and got > max_bytes:
        raise BudgetError(f"the object is longer than the {max_bytes:,} bytes read of it", file=uri)
    if known_size is not None and got != known_size:
        import aiohttp  # (here: local reads never need it)

        more = " or more" if got > known_size else ""  # (aiohttp's error for a body cut short: retried)
        raise aiohttp.ClientPayloadError(f"the server sent {got:,} bytes{more} of the object's {known_size:,}")
    return b"".join(parts)


async def http_ranges(fs: Any, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """``(offset, length)`` byte ranges of an HTTP object, each body read no further than its length
    and one byte (fsspec's ``cat_ranges`` reads each whole: a server ignoring ``Range``, or a compressed
    body inflating, would bring the whole object into memory for each range)."""
    async def one(offset: int, length: int) -> bytes:
        parts: list[bytes] = []
        if length > 0:
            await _get(fs, path, length, parts, {"Range": f"bytes={offset}-{offset + length - 1}"}, offset)
        return b"".join(parts)

    return list(await asyncio.gather(*(one(int(o), int(n)) for o, n in ranges)))


async def _get(fs: Any, path: str, limit: int | None, parts: list[bytes],
               headers: dict[str, str] | None = None, offset: int | None = None) -> int:
    """A GET of ``path`` by ``fs``'s session (its options, its redirect checks), the body added to
    ``parts`` as it arrives, no further than ``limit`` and one byte (None: all of it). ``offset``: the
    first of the ``limit`` bytes asked for by a ``Range`` (a 206 must say it holds those). Returns the status."""
    options = dict(fs.kwargs)
    if headers:
        options["headers"] = {**options.get("headers", {}), **headers}
    got = 0
    session = await fs.set_session()
    async with session.get(fs.encode_url(path), **options) as response:
        fs._raise_not_found_for_status(response, path)
        if offset is not None and limit is not None and response.status == 206:
            _check_range(response.headers.get("Content-Range"), offset, limit, path)
        while limit is None or got <= limit:
            part = await response.content.read(READ_BLOCK if limit is None else min(READ_BLOCK, limit + 1 - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
    return response.status


def _check_range(said: str | None, offset: int, length: int, path: str) -> None:
    """A 206 answering bytes ``offset`` to ``offset + length - 1`` must say it holds them: one naming
    other bytes of the right length is indistinguishable from them by their length alone (a 200, the
    whole object, is refused by its length: :func:`.objects.read_ranges`). A range cut short at the
    object's end names fewer bytes: its length is the error. The complete length is not compared
    (servers echo the range asked for beside it: the bytes are still those asked for)."""
    found = _CONTENT_RANGE.fullmatch(said or "")
    last = offset + length - 1
    if found is None or int(found[1]) != offset or not offset <= int(found[2]) <= last:
        what = "no Content-Range" if said is None else f"Content-Range {said[:100]!r}"
        raise StorageError(f"the server answered a request for bytes {offset:,} to {last:,} with a 206 holding "
                           f"{what}: not the bytes asked for", file=path)


async def _http_block(fs: Any, url: str, uri: str, start: int, end: int, size: int | None) -> bytes:
    """Bytes ``start`` to ``end`` of an HTTP file object (h5py's blocks) as :func:`http_ranges` reads a
    range: fsspec's ``async_fetch_range`` took a 206 whatever its ``Content-Range`` named and read its
    body whole. A block past the file's ``size`` (its HEAD's; fsspec's block cache asks whole blocks)
    ends there. A 200 (a server ignoring ``Range``) at the file's start: its first bytes, as fsspec took them."""
    stop = end if size is None else min(end, size)
    if stop <= start:
        return b""
    parts: list[bytes] = []
    status = await _get(fs, url, stop - start, parts, {"Range": f"bytes={start}-{stop - 1}"}, start)
    data = b"".join(parts)
    return of_their_lengths(uri, [(start, stop - start)], [data[:stop - start] if status == 200 and start == 0 else data])[0]


def of_their_lengths(uri: str, ranges: Sequence[tuple[int, int]], parts: list[bytes]) -> list[bytes]:
    """``parts``, each of its range's length, else a StorageError (a server ignoring ``Range`` answers 200
    with the whole object; a body without ``Content-Length`` ends with its connection)."""
    for (offset, length), part in zip(ranges, parts):
        if len(part) != int(length):
            why = (" or more bytes (a server that ignores byte ranges answers with the whole object)"
                   if len(part) > int(length) else " bytes (the body ended early)")  # (:func:`http_ranges`
            raise StorageError(f"the server answered a request for bytes {int(offset):,} to "  # reads no further)
                               f"{int(offset) + int(length) - 1:,} with {len(part):,}{why}", file=uri)
    return parts


def bound_blocks(fs: Any, uri: str, file: Any) -> Any:
    """``file`` (fsspec's HTTP or s3fs's file object, just opened) fetching each block within its deadline
    (its cache calls ``fetcher``: else fsspec's blocking fetch, which no deadline reaches)."""
    if is_http(fs) and hasattr(file, "async_fetch_range"):
        def block(start: int, end: int) -> Awaitable[bytes]:
            return _http_block(fs, file.url, uri, start, end, getattr(file, "size", None))
    elif "s3" in protocols_of(fs) and hasattr(file, "version_id") and not getattr(fs, "local_expiry_check", True):
        # (as s3fs's own fetch: one ranged GET; not where s3fs checks each block's ETag itself)
        def block(start: int, end: int) -> Awaitable[bytes]:
            return fs._cat_file(file.path, version_id=file.version_id, start=start, end=end)
    else:
        return file
    file.cache.fetcher = lambda start, end: b"" if end <= start else bounded(fs, uri, end - start,
                                                                             lambda: block(start, end))
    return file
