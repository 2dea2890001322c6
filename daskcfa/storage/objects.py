"""Objects wherever they live, through fsspec: exists, stat, read, put, list, delete.

Local paths and ``file://``, ``s3://`` (s3fs), ``http(s)://`` (byte ranges)
and OPeNDAP endpoints all go through these functions, so that readers and
writers never care where a file is. Credentials are resolved here, in the
process doing the I/O, from a :class:`~daskcfa.storage.profiles.ProfileRef`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import io
import json
import os
import queue
import re
import shutil
import stat as stat_module
import threading
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, Sequence

import dask.config
from dask.utils import parse_bytes

from ..errors import BudgetError, CFAError, CFAFormatError, NotFoundError, StorageError, UnsafeURIError, redact
from ..lazy import fsspec, fsspec_asyn, yarl
from ..limits import JSON_EXPANSION, max_json_bytes, max_memory
from .blocks import Blocks
from .deadline import async_body_deadline
from .timed import (READ_BLOCK, bound_blocks, bounded, http_get, http_ranges, is_http, of_their_lengths, on_loop,
                    protocols_of, within_deadline)
from .per_process import PerProcess
from .direct import FETCH_THREADS, client_for, declared_length, get_whole
from .lean import get_signed, lean_for
from .identity import local_token, remote_token
from .local import local_path, local_stat, open_local, pread
from .policy import LocationPolicy
from .profiles import ProfileRef, resolve_options
from .s3nc import s3nc_config
from .retry import Refused, precondition_failed, refusals, translated, with_retries
from .uri import is_local, is_opendap, normalise, opendap_url, scheme_of

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = [
    "NO_PROFILE", "memory_label", "filesystem", "config_bytes", "exists", "size", "read_json",
    "stat", "version", "part_size", "read_bytes", "read_whole", "fetch_soon", "netcdf_memory", "read_ranges",
    "read_ranges_unchanged", "fetch_range_soon",
    "BLOCKS_CACHED", "block_size", "open_file", "probe_opendap", "put_bytes", "put_file", "put_stream",
    "GLOB_CHARS", "glob", "is_directory", "remove_tree", "listdir", "delete", "read_stream",
]

NO_PROFILE = ProfileRef(None)
def memory_label(uri: str) -> str:
    """A harmless name for a netCDF dataset opened from bytes in memory.

    netCDF-C inspects the name even with ``memory=``: an ``s3://`` or
    ``http://`` name makes it try its own (byte-range/NCZarr) remote access,
    i.e. fetch the object a second time or fail. Only the last path segment,
    reduced to safe characters, is kept.
    """
    name = uri.split("#", 1)[0].split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return "memory-" + (re.sub(r"[^A-Za-z0-9._-]", "_", name) or "dataset")


#: The DAP2 responses netCDF-C asks an endpoint for first (its data come as ``.dods``).
_DAP_RESPONSES = (".dds", ".das")
#: HTTP statuses that redirect a request.
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True)
class _CheckedHops:
    """aiohttp client middleware: a redirect is followed only where ``policy``
    allows, each hop checked before it is requested.

    (The requests themselves are not judged again: their URIs were checked as
    written, and aiohttp's spelling of them may differ, e.g. ``H:80`` -> ``h``.)
    """

    policy: LocationPolicy
    #: OPeNDAP probes: the scheme the fragment names its endpoint with; a
    #: redirect of ``http://h/x.nc.dds`` is judged by the endpoint it leads to
    #: (``dap2://h/x.nc``)
    dap_scheme: str | None = None

    async def __call__(self, request: Any, handler: Any) -> Any:
        response = await handler(request)
        if response.status not in _REDIRECTS:
            return response
        location = response.headers.get("Location")
        try:
            target = str(request.url.join(yarl.URL(location))) if location else None
        except ValueError:
            return response  # (aiohttp refuses to follow it, with its own error)
        error: CFAError | None = None
        if target is None:  # aiohttp would hand the redirect's own body on as the object
            error = StorageError(f"HTTP {response.status} redirect without a location")
        else:
            if self.dap_scheme is not None:
                head = target.split("?", 1)[0]
                head = next((head[:-len(s)] for s in _DAP_RESPONSES if head.endswith(s)), head)
                target = self.dap_scheme + head[head.index("://"):]
            try:
                self.policy.check_redirect(target)
            except UnsafeURIError as exc:
                error = exc
        if error is not None:
            response.release()
            raise Refused(error)
        return response


def filesystem(uri: str, profile: ProfileRef = NO_PROFILE, *,
               policy: LocationPolicy | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem for ``uri`` (credentials resolved here) and the path within it.

    With a ``policy`` (reads on behalf of an aggregation file), HTTP redirects
    are followed only where the policy allows: every hop is checked before it
    is requested.
    """
    return _filesystem(uri, profile, None if policy is None else _CheckedHops(policy))


def _filesystem(uri: str, profile: ProfileRef, hops: _CheckedHops | None) -> tuple[AbstractFileSystem, str]:
    if is_local(uri):
        return fsspec.filesystem("file"), local_path(uri)
    target, options = resolve_options(uri, profile)
    protocol = scheme_of(target)
    if protocol == "s3":
        options.setdefault("use_listings_cache", False)
        _single_attempts(options)
        _unredirected(options)
    if hops is not None and protocol in ("http", "https"):
        client = dict(options.get("client_kwargs") or {})
        client["middlewares"] = (*client.get("middlewares", ()), hops)
        options["client_kwargs"] = client
    try:
        fs = fsspec.filesystem(protocol, **options)
    except (ValueError, ImportError, TypeError) as exc:
        raise StorageError(f"cannot use storage scheme {protocol!r}: {redact(str(exc))}", file=uri) from None
    if protocol == "s3":
        fs.retries = 1  # s3fs's attempts per call (a class attribute, no option; see _single_attempts)
    path = target if protocol in ("http", "https") else fs._strip_protocol(target)
    return fs, path


def _unredirected(options: dict[str, Any]) -> None:
    """s3fs's requests through an HTTP session that follows no redirect (:mod:`.s3_http`), unless the
    user gave their own session class."""
    from .s3_http import UnredirectedSession

    config = dict(options.get("config_kwargs") or {})
    config.setdefault("http_session_cls", UnredirectedSession)
    options["config_kwargs"] = config


def _single_attempts(options: dict[str, Any]) -> None:
    """botocore (and s3fs, :func:`_filesystem`) make one attempt per call: :func:`~.retry.with_retries` is the one retry
    layer (retries on retries made an unreachable endpoint silent for half a minute). Options the
    user gave win."""
    config = dict(options.get("config_kwargs") or {})
    # (botocore's "max_attempts" counts retries, "total_max_attempts" the first attempt too)
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    options["config_kwargs"] = config


def config_bytes(key: str, default: int) -> int:
    """A byte size from dask config: an int, or a string such as ``"16MiB"``."""
    value = dask.config.get(key, default)
    return int(parse_bytes(value)) if isinstance(value, str) else int(value)


def exists(uri: str, profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy | None = None) -> bool:
    if is_local(uri):
        return os.path.exists(local_path(uri))
    if is_opendap(uri):
        return True  # only opening tells; a missing endpoint fails with a clear error then
    fs, path = filesystem(uri, profile, policy=policy)
    if on_loop(fs):
        return bool(with_retries(uri, bounded, fs, uri, 0, lambda: fs._exists(path)))
    return bool(with_retries(uri, fs.exists, path))


def size(uri: str, profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy | None = None) -> int:
    return stat(uri, profile, policy=policy)[0]


def stat(uri: str, profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy | None = None,
         objects_only: bool = False) -> tuple[int, str]:
    """An object's size and a token that changes when the object is replaced
    (:mod:`.identity`), in one request. A local file must be a regular file.

    ``objects_only``: an S3 key that is no object is not found, and not looked for as a directory
    (s3fs's ``info`` lists the prefix after a 404: a second round trip on every miss, such as
    the look for a chunk index beside an aggregation that has none)."""
    if is_local(uri):
        info = local_stat(uri)
        return info.st_size, local_token(info)
    fs, path = filesystem(uri, profile, policy=policy)
    if objects_only and _streams(fs):
        info = with_retries(uri, _head, fs, path, uri)
    elif on_loop(fs):  # (a HEAD whose headers never end: within a deadline too)
        info = with_retries(uri, bounded, fs, uri, 0, lambda: fs._info(path))
    else:
        info = with_retries(uri, fs.info, path)
    return int(info["size"]), remote_token(info)


def _head(fs: Any, path: str, uri: str) -> dict[str, Any]:
    """s3fs's ``info`` of the object at ``path`` (a bucket's own: as ``info`` says), by one HEAD."""
    bucket, key, version = fs.split_path(path)
    if not key:
        return bounded(fs, uri, 0, lambda: fs._info(path))
    out = bounded(fs, uri, 0, lambda: fs._call_s3("head_object", fs.kwargs, Bucket=bucket, Key=key,
                                                  **({"VersionId": version} if version else {})))
    size = out.get("ContentLength")
    if type(size) is not int or size < 0:  # (a server's answer: none, or not a length, is no object's size)
        raise StorageError(f"the server gave no valid length for the object ({size!r:.40})", file=uri)
    return {"ETag": out.get("ETag", ""), "LastModified": out.get("LastModified", ""), "size": size,
            "name": f"{bucket}/{key}", "type": "file", "VersionId": out.get("VersionId")}


def tree_size(uri: str, profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy | None = None) -> int:
    """The bytes of every object under a directory or prefix (a Zarr store); NotFoundError when
    it holds none. Locally, only regular files count (a link to a device is not followed)."""
    return sum(tree_sizes(uri, profile, policy=policy).values())


def tree_sizes(uri: str, profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy | None = None) -> dict[str, int]:
    """Every object under a directory or prefix, by its ``/``-separated name below it, and its size;
    NotFoundError when it holds none. Locally, only regular files (a link to a device is not followed)."""
    if is_local(uri):
        root = local_path(uri)
        if not os.path.isdir(root):
            raise NotFoundError("not found", file=uri)
        sizes = {}
        with translated(uri):
            for directory, _, names in os.walk(root):
                for name in names:
                    info = os.lstat(os.path.join(directory, name))
                    if stat_module.S_ISREG(info.st_mode):
                        sizes[os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/")] = info.st_size
        return sizes
    fs, path = filesystem(uri, profile, policy=policy)
    base = path.rstrip("/") + "/"
    found = with_retries(uri, fs.find, base, detail=True)
    if not found:
        raise NotFoundError("not found", file=uri)
    return {name[len(base):] if name.startswith(base) else name: int(info.get("size") or 0)
            for name, info in found.items()}


def version(uri: str, profile: ProfileRef = NO_PROFILE) -> tuple[int, str] | None:
    """What identifies this version of an object across processes (:func:`stat`), for resume
    tokens; None when it cannot be told (OPeNDAP, unreachable)."""
    if is_opendap(uri):
        return None
    try:
        return stat(uri, profile)
    except CFAError:
        return None


def part_size() -> int:
    """Bytes per part when a large object is fetched as concurrent ranged GETs."""
    return max(1, config_bytes("daskcfa.storage.part-size", 16 << 20))


def read_bytes(uri: str, profile: ProfileRef = NO_PROFILE, *, known_size: int | None = None,
               policy: LocationPolicy | None = None, max_bytes: int | None = None) -> bytes:
    """A whole object's bytes, in one buffer (see :func:`read_whole`)."""
    return read_whole(uri, profile, known_size=known_size, policy=policy, max_bytes=max_bytes).tobytes()


def read_json(uri: str, profile: ProfileRef = NO_PROFILE, *, known_size: int | None = None,
              policy: LocationPolicy | None = None) -> Any:
    """A JSON document, parsed: one daskcfa keeps beside the data (a manifest, a list of retired
    fragments, a marker) or a reference set. Anyone who can write there can plant one, so it is read only up to
    :func:`~daskcfa.limits.max_json_bytes` (a larger one: :class:`BudgetError`, without reading it;
    a local file that grows meanwhile is read no further) and not JSON is a :class:`CFAFormatError`.
    ``known_size``: the object's size, if the caller has it (no second request for it); ``policy``:
    see :func:`filesystem`."""
    bound = max_json_bytes()
    if is_local(uri):
        with open_local(uri) as f, translated(uri):
            data = f.read(bound + 1)
        nbytes = len(data)
    else:
        nbytes, data = size(uri, profile, policy=policy) if known_size is None else known_size, b""
        try:  # (bounded again at the GET: the object may have grown since, or the server lie)
            data = b"" if nbytes > bound else read_whole(uri, profile, known_size=nbytes, policy=policy,
                                                         max_bytes=bound).tobytes()
        except BudgetError:  # (refused before its body: the error below, naming the setting)
            nbytes = bound + 1
    if nbytes > bound:
        raise BudgetError(f"a JSON document larger than daskcfa reads ({bound:,} bytes: dask config "
                          f"'daskcfa.limits.max-memory' / {JSON_EXPANSION})", file=uri)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # (UnicodeError and JSONDecodeError are ValueErrors)
        raise CFAFormatError(f"not JSON ({type(exc).__name__})", file=uri) from None


def read_whole(uri: str, profile: ProfileRef = NO_PROFILE, *, known_size: int | None = None,
               size_hint: int | None = None, policy: LocationPolicy | None = None,
               max_bytes: int | None = None) -> Blocks:
    """A whole object in memory: one GET, or -- when ``known_size`` says it is
    large -- concurrent ranged GETs of :func:`part_size` bytes. ``size_hint``
    is about how large the object is expected to be: an S3 object is received
    in this thread (:func:`_blocking_get`), a large one into one buffer. An S3 object
    longer than ``max_bytes`` is refused before its body is read; an HTTP one, once
    that many bytes of it are read (:class:`BudgetError`). An HTTP(S) object of neither a ``known_size``
    nor a ``max_bytes`` is held to ``daskcfa.limits.max-memory`` (:func:`_unsized`).
    ``policy``: see :func:`filesystem`."""
    if is_local(uri):
        with open_local(uri) as f, translated(uri):
            return Blocks([f.read()])
    fs, path = filesystem(uri, profile, policy=policy)
    if known_size is None and max_bytes is None and is_http(fs):
        return _unsized(uri, lambda bound: read_whole(uri, profile, size_hint=size_hint, policy=policy,
                                                      max_bytes=bound))
    if known_size is None or known_size <= 2 * part_size() or s3nc_config().transfer(uri).multipart_download is False:
        if is_http(fs):
            return Blocks([with_retries(uri, fsspec_asyn.sync, fs.loop, http_get, fs, path, uri, known_size, max_bytes)])
        if not _streams(fs):
            return Blocks([with_retries(uri, fs.cat_file, path, **_one_get(fs))])
        blocking = _blocking_get(fs, known_size or size_hint or 0)
        if blocking is not None:
            return Blocks([with_retries(uri, blocking, fs, path, uri, max_bytes)])
        return with_retries(uri, fsspec_asyn.sync, fs.loop, _get_whole, fs, path, uri, max_bytes)
    part = part_size()
    starts = list(range(0, known_size, part))
    return Blocks(read_ranges(uri, [(s, min(part, known_size - s)) for s in starts], profile, policy=policy))


def _unsized(uri: str, read: Callable[[int], Blocks]) -> Blocks:
    """``read(max_bytes)`` of an HTTP(S) object whose caller knows no size for it and sets no bound of its
    own (an aggregation file, a file to append to: each held in memory whole): at most
    ``daskcfa.limits.max-memory``, the most one aggregation file's instructions may take. (An S3 body is
    received against the length S3 declares for the object, which nothing inflates; it keeps no bound, as
    a user's own large file on S3 read whole did before.)
    Else an HTTP body of no declared length, or one aiohttp inflates (a deflate bomb), grew without bound."""
    bound = max_memory()
    try:
        return read(bound)
    except BudgetError:
        raise BudgetError(f"an object larger than daskcfa reads whole ({bound:,} bytes: dask config "
                          "'daskcfa.limits.max-memory')", file=uri) from None


def fetch_soon(uri: str, profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy | None = None,
               size_hint: int = 0, max_bytes: int | None = None) -> concurrent.futures.Future | None:
    """Start fetching a whole remote object in the background, without waiting: the future's
    result is its bytes, as :class:`Blocks` (as :func:`read_whole` reads them; an S3 object in a
    read-ahead thread, or on fsspec's event loop with settings only s3fs follows). None when the object's
    filesystem has no event loop to run it on (local files)."""
    if is_local(uri) or is_opendap(uri):
        return None
    fs, path = filesystem(uri, profile, policy=policy)
    if not getattr(fs, "async_impl", False) or getattr(fs, "loop", None) is None:
        return None
    blocking = _blocking_get(fs, size_hint) if _streams(fs) else None
    if blocking is not None:
        return _FETCHERS.get().submit(lambda: Blocks([blocking(fs, path, uri, max_bytes)]))
    return asyncio.run_coroutine_threadsafe(_get_whole(fs, path, uri, max_bytes), fs.loop)


#: Objects expected to be at least this large are received in the calling thread even where the lean GET
#: (:mod:`.lean`) does not apply: through the blocking client (:mod:`.direct`); smaller ones then on the event loop.
_DIRECT_FROM = 1 << 20


def _streams(fs: Any) -> bool:
    """Whether ``fs`` is S3's (whole objects are then received by daskcfa's own GET, checked
    as :mod:`.transfer` says, rather than with ``cat_file``)."""
    return "s3" in protocols_of(fs)


def _blocking_get(fs: Any, expected: int) -> Callable[..., bytes] | None:
    """``(fs, path, uri, max_bytes) -> bytes``: the GET of a whole S3 object of about ``expected`` bytes
    in the calling thread -- signed and sent without the SDK (:mod:`.lean`) where that reaches what the
    client reaches, whatever the object's size (the SDK's request machinery cost 1.2 ms of CPU a 10 MB
    GET more: docs/performance.md), else a large one through the blocking client (:mod:`.direct`) -- or
    None: a small object with settings the lean GET leaves to s3fs, or settings only s3fs follows (it is
    then received on fsspec's event loop, where many are in flight at once)."""
    lean = lean_for(fs)
    if lean is not None:
        return functools.partial(get_signed, lean)
    if expected < _DIRECT_FROM:
        return None
    client = client_for(fs)
    return None if client is None else functools.partial(get_whole, client)


class _Fetchers:
    """Daemon threads running fetches ahead of their reads. (Not a ``ThreadPoolExecutor``: the
    interpreter joins its threads at exit, so a process done with its work waited for every GET
    fetched ahead, a stalled one for its whole read timeout, as fsspec's daemon loop thread never made it.)"""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        for k in range(FETCH_THREADS):
            threading.Thread(target=self._work, name=f"daskcfa-fetch-{k}", daemon=True).start()

    def submit(self, fetch: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, fetch))
        return future

    def _work(self) -> None:
        while True:
            future, fetch = self._queue.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fetch())
                except BaseException as exc:  # (the reader that takes the future meets it)
                    future.set_exception(exc)


#: this process's read-ahead threads for large S3 objects (a forked child makes its own)
_FETCHERS = PerProcess(_Fetchers)


async def _get_whole(fs: Any, path: str, uri: str, max_bytes: int | None = None) -> Blocks:
    """One GET of a whole (small) object on fsspec's event loop, in one block (S3: its checksum
    checked as the blocks arrive, :mod:`.transfer`; one longer than ``max_bytes`` refused)."""
    from .transfer import checked_body  # (here: it imports aiobotocore, which local reads never need)

    if is_http(fs):
        return Blocks([await http_get(fs, path, uri, None, max_bytes)])
    if not _streams(fs):
        return Blocks([await fs._cat_file(path, **_one_get(fs))])
    # As s3fs's own _cat_file does it, less its HEAD (see _one_get).
    bucket, key, version = fs.split_path(path)
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **({"VersionId": version} if version else {}))
    read = checked_body(response, uri)
    blocks = []
    try:
        length = declared_length(response, max_bytes, uri)
        async with async_body_deadline(length, fs.s3.meta.config.read_timeout, uri):
            while block := await read(READ_BLOCK):
                blocks.append(block)
    finally:
        response["Body"].close()
    return Blocks([b"".join(blocks)] if len(blocks) > 1 else blocks)


@functools.lru_cache(maxsize=None)
def _one_get_options(kind: type) -> tuple[tuple[str, Any], ...]:
    if "max_concurrency" in inspect.signature(getattr(kind, "_cat_file", kind.cat_file)).parameters:
        return (("max_concurrency", 1),)
    return ()


def _one_get(fs: Any) -> dict[str, Any]:
    """Options that make ``cat_file`` fetch a whole object in one GET: s3fs
    otherwise asks for the object's size first (a HEAD before every GET) to
    split large objects into concurrent ranged GETs, which :func:`read_whole`
    does itself when it knows the size."""
    return dict(_one_get_options(type(fs)))


def netcdf_memory(data: bytes) -> bytes:
    """Bytes netCDF-C can open from memory: it fails on some small netCDF-3
    files whose header fills the buffer, unless zero bytes follow the data."""
    return bytes(data) + bytes(4096) if bytes(data[:3]) == b"CDF" else data


def read_ranges(uri: str, ranges: Sequence[tuple[int, int]], profile: ProfileRef = NO_PROFILE, *,
                policy: LocationPolicy | None = None) -> list[bytes]:
    """Several ``(offset, length)`` byte ranges of one object, fetched concurrently."""
    if not ranges:
        return []
    fs, path = filesystem(uri, profile, policy=policy)
    starts = [int(o) for o, _ in ranges]
    ends = [int(o) + int(n) for o, n in ranges]

    def fetch() -> list[bytes]:
        if on_loop(fs):  # (HTTP's by :func:`.timed.http_ranges`: fsspec's reads each body whole)
            parts = bounded(fs, uri, sum(ends) - sum(starts), lambda: http_ranges(fs, path, ranges) if is_http(fs)
                            else fs._cat_ranges([path] * len(ranges), starts, ends, on_error="raise"))
        else:
            parts = list(fs.cat_ranges([path] * len(ranges), starts, ends, on_error="raise"))
        for part in parts:  # some filesystems hand failures back in the list
            if isinstance(part, BaseException):
                raise part
        return of_their_lengths(uri, ranges, parts)

    return with_retries(uri, fetch)


def read_ranges_unchanged(uri: str, ranges: Sequence[tuple[int, int]], expected: tuple[int, str],
                          profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy | None = None
                          ) -> list[Any] | None:
    """Byte ranges of an object only while it is still the version ``expected`` (the size and
    token :func:`stat` gave); None when it changed, and then nothing of it is returned.

    No request is spent on the check where it can ride along: on S3 each range is one GET
    with ``If-Match`` (no HEAD); a local file is checked on its open descriptor (``fstat``),
    so a file replaced between the check and the reads is never read. Elsewhere: a stat,
    then the ranges.
    """
    size, token = expected
    if is_local(uri):
        with open_local(uri) as file:
            info = os.fstat(file.fileno())
            if (info.st_size, local_token(info)) != (size, token):
                return None
            with translated(uri):
                return [pread(file.fileno(), int(o), int(n), redact(uri)) for o, n in ranges]
    fs, path = filesystem(uri, profile, policy=policy)
    if not (_streams(fs) and token.startswith('"')):  # (If-Match needs the ETag)
        return read_ranges(uri, ranges, profile, policy=policy) if stat(uri, profile, policy=policy) == expected \
            else None

    async def every() -> list[bytes]:
        return list(await asyncio.gather(*(_get_range_if_match(fs, path, token, int(o), int(n)) for o, n in ranges)))

    def fetch() -> list[bytes] | None:
        try:
            parts = bounded(fs, uri, sum(int(n) for _, n in ranges), every)
        except Exception as exc:
            if precondition_failed(exc):
                return None
            raise
        return of_their_lengths(uri, ranges, parts)

    return with_retries(uri, fetch) if ranges else []


async def _get_range_if_match(fs: Any, path: str, token: str, offset: int, length: int) -> bytes:
    """One ranged GET of the S3 object version whose ETag is ``token`` (else the server refuses: 412)."""
    bucket, key, _ = fs.split_path(path)
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, IfMatch=token,
                                 Range=f"bytes={offset}-{offset + length - 1}")
    body = response["Body"]
    try:
        return await body.read()
    finally:
        body.close()


def fetch_range_soon(uri: str, offset: int, length: int, expected: tuple[int, str], profile: ProfileRef = NO_PROFILE,
                     *, policy: LocationPolicy | None = None) -> concurrent.futures.Future | None:
    """Start fetching one byte range of an object in the background (on fsspec's event loop),
    as :func:`read_ranges_unchanged` would: one GET with ``If-Match``, so the future fails
    (a 412 refusal) unless the object is still the version ``expected``. None where that
    check cannot ride along on the GET (local files, stores without ETags): read it then."""
    if is_local(uri) or is_opendap(uri) or not expected[1].startswith('"'):
        return None
    fs, path = filesystem(uri, profile, policy=policy)
    if not _streams(fs):
        return None
    return asyncio.run_coroutine_threadsafe(
        within_deadline(fs, uri, int(length),
                        lambda: _get_range_if_match(fs, path, expected[1], int(offset), int(length))), fs.loop)


#: Metadata blocks a remote file object keeps (memory = this x :func:`block_size`).
BLOCKS_CACHED = 8


def block_size() -> int:
    """Bytes per metadata block fetched for h5py (dask config ``daskcfa.storage.block-size``)."""
    return config_bytes("daskcfa.storage.block-size", 256 << 10)


def open_file(uri: str, profile: ProfileRef = NO_PROFILE, *, known_size: int | None = None,
              policy: LocationPolicy | None = None) -> io.IOBase:
    """A read-only file object (remote ones cache blocks: for h5py's metadata reads).

    ``known_size`` (when the caller has just asked) saves asking again.
    """
    if is_local(uri):
        return open_local(uri)
    fs, path = filesystem(uri, profile, policy=policy)
    if known_size is None and is_http(fs):  # (fsspec's open would ask for it without a deadline)
        known_size = size(uri, profile, policy=policy)
    options: dict[str, Any] = {"block_size": block_size(),
                               "cache_type": "blockcache", "cache_options": {"maxblocks": BLOCKS_CACHED}}
    if known_size is not None:
        options["size"] = int(known_size)
    return _RemoteFile(uri, bound_blocks(fs, uri, with_retries(uri, lambda: fs.open(path, "rb", **options))))


class _RemoteFile(io.RawIOBase):
    """A remote file object whose refused redirects surface as daskcfa errors
    naming its URI, also when h5py reads through it."""

    def __init__(self, uri: str, file: Any) -> None:
        super().__init__()
        self._uri = uri
        self._file = file

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with refusals(self._uri):  # (a failed read does not move the position: it can be retried)
            data = with_retries(self._uri, self._file.read, len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


def read_stream(uri: str, profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy | None = None,
                block: int = 8 << 20) -> Iterator[bytes]:
    """A whole object's bytes in blocks of at most ``block`` bytes, read one after the other: memory
    stays one block whatever the object's size (checksums of stored fragments)."""
    if is_local(uri):
        f: Any = open_local(uri)
    else:
        fs, path = filesystem(uri, profile, policy=policy)
        known = {"size": size(uri, profile, policy=policy)} if is_http(fs) else {}  # (as open_file)
        f = bound_blocks(fs, uri, with_retries(uri, lambda: fs.open(path, "rb", block_size=block, cache_type="none",
                                                                     **known)))
    expected, got = getattr(f, "size", None), 0  # (a remote file object's, from its HEAD)
    with f, translated(uri):
        while chunk := f.read(block):
            got += len(chunk)
            yield chunk
    if expected is not None and got != expected:  # (a block answered short ends the stream early)
        raise StorageError(f"the server sent {got:,} bytes of the object's {int(expected):,}", file=uri)


def probe_opendap(uri: str, profile: ProfileRef = NO_PROFILE, *, policy: LocationPolicy) -> None:
    """Raise :class:`UnsafeURIError` if the OPeNDAP endpoint ``uri`` redirects
    its DDS or DAS where ``policy`` does not allow.

    netCDF-C's DAP client follows every redirect itself (nothing turns that
    off), so the responses it asks for first are asked for here, through the
    client that checks every hop. Any other failure is left for netCDF-C to
    report. A server that redirects only later requests is not caught.
    """
    endpoint = opendap_url(uri).split("#", 1)[0]
    head, query = endpoint.split("?", 1) if "?" in endpoint else (endpoint, "")
    hops = _CheckedHops(policy, dap_scheme=scheme_of(uri))
    for suffix in _DAP_RESPONSES:
        probe = head + suffix + (f"?{query}" if query else "")
        fs, path = _filesystem(probe, profile, hops)
        try:
            with translated(uri):
                bounded(fs, uri, 0, lambda: fs._exists(path))  # (a probe that never ends: within a deadline too)
        except UnsafeURIError:
            raise
        except Exception:
            continue


def put_bytes(uri: str, data: bytes, profile: ProfileRef = NO_PROFILE) -> None:
    if is_local(uri):
        put_stream(uri, lambda f: f.write(data), profile)
        return
    fs, path = filesystem(uri, profile)
    with_retries(uri, fs.pipe_file, path, data, **_upload_options(uri))


def _upload_options(uri: str) -> dict[str, Any]:
    """``chunksize`` of s3fs's uploads, where S3netCDF4's settings for the host give one."""
    part = s3nc_config().transfer(uri).upload_part_size
    return {} if part is None else {"chunksize": part}


def put_file(uri: str, local: str, profile: ProfileRef = NO_PROFILE) -> None:
    """Upload the local file ``local`` as the object ``uri`` (streamed: large files need not fit in memory)."""
    fs, path = filesystem(uri, profile)
    with_retries(uri, fs.put_file, local, path, **_upload_options(uri))


def put_files(pairs: Sequence[tuple[str, str]], profile: ProfileRef = NO_PROFILE) -> None:
    """Upload local files as objects, ``(local path, URI)`` pairs on one storage, concurrently
    (fsspec's batches: a Zarr store's many chunks)."""
    if not pairs:
        return
    fs, _ = filesystem(pairs[0][1], profile)
    paths = [filesystem(uri, profile)[1] for _, uri in pairs]
    with_retries(pairs[0][1], fs.put, [local for local, _ in pairs], paths)


def listdir(uri: str, profile: ProfileRef = NO_PROFILE) -> list[str]:
    """Every object under a prefix (recursively), as URIs."""
    fs, path = filesystem(uri, profile)
    found = with_retries(uri, fs.find, path)
    if is_local(uri):
        return sorted(found)
    scheme = scheme_of(uri)
    return sorted(f"{scheme}://{p}" if "://" not in p else p for p in found)


def put_stream(uri: str, write: Callable[[IO[bytes]], None], profile: ProfileRef = NO_PROFILE) -> None:
    """Write an object through ``write(file)``: straight into a local file (no second
    copy in memory), else into a buffer put in one request."""
    if is_local(uri):
        path = local_path(uri)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with translated(uri):
            # never through a link planted at the name (it would overwrite whatever it names: a
            # marker of a predictable fragment name, say), nor waiting for a FIFO's reader
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o666)
            with os.fdopen(fd, "wb") as f:
                write(f)
        return
    buffer = io.BytesIO()
    write(buffer)
    put_bytes(uri, buffer.getvalue(), profile)


#: What makes a URI a glob pattern.
GLOB_CHARS = re.compile(r"[*?\[]")


def glob(pattern: str, profile: ProfileRef = NO_PROFILE, *, directories: bool = False) -> list[str]:
    """Files matching a glob, as URIs, sorted: fsspec's glob for every scheme (``*`` within
    a path segment, ``**`` across them). Hidden files and directories (``.name``: writers'
    temporaries and markers) match only a pattern that names them, as in a shell.
    ``directories``: directories (prefixes) matching it too, as URIs ending in ``/``."""
    fs, path = filesystem(normalise(pattern) if is_local(pattern) else pattern, profile)
    found = with_retries(pattern, fs.glob, path, detail=True)
    head = GLOB_CHARS.split(path, 1)[0].rpartition("/")[0]
    hidden_asked = "/." in path[len(head):]
    kinds = ("file", "directory") if directories else ("file",)
    files = [p.rstrip("/") + ("/" if info.get("type") == "directory" else "") for p, info in found.items()
             if info.get("type") in kinds
             and (hidden_asked or not any(part.startswith(".") for part in p[len(head):].split("/")))]
    if is_local(pattern):
        return sorted(normalise(p) + ("/" if p.endswith("/") else "") for p in files)
    scheme = scheme_of(pattern)
    return sorted(p if "://" in p else f"{scheme}://{p}" for p in files)


def is_directory(uri: str) -> bool:
    """A local directory, or a remote prefix (object stores have no directories: written with a trailing slash)."""
    if is_local(uri):
        return os.path.isdir(local_path(uri))
    return uri.endswith("/")


def remove_tree(uri: str, profile: ProfileRef = NO_PROFILE) -> None:
    """Delete a directory (or every object under a prefix) and all it holds; nothing there is no error.
    A local directory's parent goes too once it is empty (a shared parent of several such trees)."""
    if is_local(uri):
        path = local_path(uri)
        shutil.rmtree(path, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass  # not empty: another tree still uses it
        return
    fs, path = filesystem(uri, profile)
    if with_retries(uri, fs.exists, path):
        with_retries(uri, fs.rm, path, recursive=True)


def delete(uri: str, profile: ProfileRef = NO_PROFILE) -> None:
    fs, path = filesystem(uri, profile)
    with_retries(uri, fs.rm_file, path)


def delete_all(uri: str, profile: ProfileRef = NO_PROFILE) -> None:
    """Delete the object at ``uri``, or the directory (prefix) there with every object under
    it: a fragment that is a Zarr store; nothing there is no error."""
    if is_local(uri):
        path = local_path(uri)
        with translated(uri):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        return
    fs, path = filesystem(uri, profile)
    found = with_retries(uri, fs.find, path.rstrip("/"), withdirs=False)
    if found:
        with_retries(uri, fs.rm, found)
