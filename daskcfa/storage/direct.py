"""Whole S3 objects received by a blocking GET in the thread that needs them.

Every request s3fs makes runs on fsspec's one event loop thread, shared by the
whole process: receiving a body there (aiohttp's parser, its stream buffers,
the pieces joined or kept) cost about 1 s of CPU per GB on that one thread,
while the threads that decode waited for it. Here a large object is received
as the floor of issue #31 receives it: one GET through a plain botocore client
(urllib3) in the dask thread that needs the object (or a read-ahead thread),
the socket read straight into one buffer of the length the server declared,
the GIL released while it waits.

The client is made from the settings of the s3fs filesystem the same URI and
storage profile give (:func:`.objects.filesystem`: credentials resolved in
this process, S3netCDF4 aliases, one attempt per call), so it reaches the same
endpoint with the same region, addressing style, ``verify`` and timeouts; one
per filesystem and process (botocore clients are thread-safe). Settings only
s3fs follows (region caching, extra request arguments, aiobotocore-only
options) give no client: such objects are read through s3fs. Errors are
translated and retried by the caller (:func:`.retry.with_retries`). Where the
lean GET reaches what this client reaches, objects of any size are sent by
:mod:`.lean` (the same receiving, less the SDK's request machinery), whose every
answer but a plain 200 comes here; large objects it does not reach come here first.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Mapping

from ..errors import BudgetError, StorageError
from .transfer import whole_body

__all__ = ["client_for", "client_settings", "profile_session", "get_whole", "declared_length"]

#: Threads fetching objects ahead of their reads (:func:`.objects.fetch_soon`), per process.
FETCH_THREADS = 8
#: What ``create_client`` takes besides the service name and its config.
_CLIENT_ARGUMENTS = frozenset({"region_name", "api_version", "use_ssl", "verify", "endpoint_url", "aws_access_key_id",
                               "aws_secret_access_key", "aws_session_token", "aws_account_id"})
_CREDENTIALS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
_LOCK = threading.Lock()
#: filesystem -> (the process that made it, its client or None)
_CLIENTS: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()


def client_for(fs: Any) -> Any | None:
    """The botocore S3 client with ``fs``'s settings, made once per filesystem and process; None
    when ``fs`` is set up in a way only s3fs follows."""
    with _LOCK:  # (made under the lock: botocore sessions are not thread-safe)
        made = _CLIENTS.get(fs)
        if made is None or made[0] != os.getpid():
            made = _CLIENTS[fs] = (os.getpid(), _make_client(fs))
        return made[1]


def client_settings(fs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The botocore ``Config`` options and ``create_client`` arguments that reach what ``fs`` reaches
    (endpoint, region, addressing style, credentials, ``verify``, timeouts); None when ``fs`` is set up
    in a way only s3fs follows."""
    import botocore
    import botocore.config

    from .s3_http import UnredirectedSession

    if fs.cache_regions or fs.s3_additional_kwargs or fs.req_kw or set(fs.kwargs) - {"profile"}:
        return None
    config = {"connect_timeout": fs.connect_timeout, "read_timeout": fs.read_timeout,
              # (a connection for each thread that may read at once: dask's, and the read-ahead's)
              "max_pool_connections": (os.cpu_count() or 1) + FETCH_THREADS, **fs.config_kwargs}
    if config.get("http_session_cls") is UnredirectedSession:  # (s3fs's session; botocore's follows no redirect either)
        del config["http_session_cls"]
    arguments = {"aws_access_key_id": fs.key, "aws_secret_access_key": fs.secret, "aws_session_token": fs.token,
                 "endpoint_url": fs.endpoint_url, "use_ssl": fs.use_ssl}
    arguments = {**{k: v for k, v in arguments.items() if v is not None}, **fs.client_kwargs}
    if not (set(config) <= set(botocore.config.Config.OPTION_DEFAULTS) and set(arguments) <= _CLIENT_ARGUMENTS):
        return None
    if fs.anon:
        arguments = {k: v for k, v in arguments.items() if k not in _CREDENTIALS}
        config["signature_version"] = botocore.UNSIGNED
    return config, arguments


def _make_client(fs: Any) -> Any | None:
    import botocore.config

    settings = client_settings(fs)
    if settings is None:
        return None
    config, arguments = settings
    session = profile_session(fs.kwargs.get("profile"))
    theirs = getattr(fs, "session", None)  # (s3fs's own botocore session, once it has connected)
    if theirs is not None:
        # the service models s3fs has parsed already (same profile, so the same data path): parsing
        # them again took 0.1 s of CPU, the first time in each process
        session.register_component("data_loader", theirs.get_component("data_loader"))
    return session.create_client("s3", config=botocore.config.Config(**config), **arguments)


def profile_session(profile: str | None) -> Any:
    """A botocore session for an AWS profile, made for each filesystem: a session resolves credentials
    once and keeps them, so one kept for the process signed a later filesystem's requests with an earlier
    environment's credentials (found by a fresh-clone run: a read given none succeeded)."""
    import botocore.session

    return botocore.session.Session(profile=profile)


def get_whole(client: Any, fs: Any, path: str, uri: str, max_bytes: int | None = None) -> bytes:
    """One GET of the whole object at ``path``, received in this thread (see the module's docstring).
    An object longer than ``max_bytes`` is refused before its body is read (:class:`BudgetError`)."""
    bucket, key, version = fs.split_path(path)
    response = client.get_object(Bucket=bucket, Key=key, **({"VersionId": version} if version else {}))
    try:
        declared_length(response, max_bytes, uri)
        return whole_body(response, uri, client.meta.config.read_timeout)
    finally:
        response["Body"].close()


def declared_length(response: Mapping[str, Any], max_bytes: int | None, uri: str) -> int:
    """The length a response to a whole GET declares for its body, refused (:class:`BudgetError`) when
    longer than ``max_bytes``: before the body is read. A part of the object (HTTP 206) is refused, and so
    is a body of no declared length (chunked): nothing would bound it."""
    if response.get("ContentRange"):
        raise StorageError("the server answered with a part of the object (HTTP 206), not the whole", file=uri)
    length = response.get("ContentLength")
    if not isinstance(length, int) or length < 0:
        raise StorageError("the server did not declare the object's length", file=uri)
    if max_bytes is not None and length > max_bytes:
        raise BudgetError(f"the object is {length:,} bytes, more than the {max_bytes:,} bytes this read may hold "
                          "in memory (daskcfa.budget.memory)", file=uri)
    return length
