"""Whole S3 objects by one signed GET, without an SDK's request machinery.

A point series reads a thousand objects of a few hundred KB: through s3fs each
GET cost about 3.3 ms of CPU (aiobotocore's parameter validation, event hooks,
serialisation, response parsing, aiohttp), through a blocking botocore client
2 ms, and signed here with botocore's own signer (``S3SigV4Auth``) and sent
through botocore's own HTTP session (``URLLib3Session``: its TLS verification
and CA bundle, timeouts, connection pool; no redirect followed, no retry) 1 ms.
Large objects come this way too (a 10 MB fragment's GET, received into one
buffer either way, cost 1.2 ms of CPU less than through the blocking client).

This is the success path only: an answer other than a plain 200 with the
whole body -- an error, a redirect (a region's included), a part (206), a
checksum other than CRC-32 -- is sent again through the blocking botocore
client (:func:`.direct.get_whole`), so that error mapping, region redirects
and retries keep one home; but a server error the retry layer tries again
(:data:`.retry.TRANSIENT_STATUSES`) is its to try again, after its backoff: sent
again at once, it doubled the requests to a server answering "slow down". A
200 is held to the same rules there: its declared length
(:func:`.direct.declared_length`: none, or a part, is refused; one over the
budget is refused before the body), the whole body, its CRC-32 (:mod:`.transfer`).

Taken only where it reaches what the client reaches: a configured endpoint
(where the object's URL is botocore's own, from a presigned URL of the
bucket, so path or virtual-host addressing is botocore's choice), signature
version 4 or anonymous, no proxy (configured or in the environment), no client
certificate or keep-alive option, credentials botocore resolves (frozen for
each request, so refreshed ones are used); elsewhere (AWS's own endpoints,
with their region redirects, among them) s3fs reads small objects on fsspec's
event loop, as before. Credentials travel in headers only (``Authorization``,
``X-Amz-Security-Token``), never in a URL.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..errors import StorageError
from .deadline import body_deadline, shut_connection_of
from .direct import client_for, client_settings, declared_length, get_whole, profile_session
from .retry import TRANSIENT_STATUSES
from .transfer import check_crc32, expected_crc32

__all__ = ["LeanGets", "lean_for", "get_signed"]

_CRC32 = "x-amz-checksum-crc32"
#: buckets whose object URLs a filesystem's lean GETs keep
_MAX_BUCKETS = 1024
_LOCK = threading.Lock()
#: filesystem -> (the process that made it, its lean GETs or None)
_LEAN: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()


@dataclass
class LeanGets:
    """What a signed GET of ``fs``'s objects needs: botocore's HTTP session, the credentials, the
    signing region, and the blocking client every other answer goes to."""

    client: Any
    http: Any
    credentials: Any | None = field(repr=False)  # (None: anonymous)
    region: str
    checksums: bool
    #: bucket -> the URL of its objects up to the key (botocore's addressing), or "" where not known
    _prefixes: dict[str, str] = field(default_factory=dict)

    def prefix(self, bucket: str) -> str:
        """The URL of ``bucket``'s objects before the key, as botocore addresses them ("" if unclear)."""
        known = self._prefixes.get(bucket)
        if known is None:
            url = self.client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
            head = url.split("?", 1)[0]
            if len(self._prefixes) >= _MAX_BUCKETS:  # (an aggregation naming a bucket a fragment: bounded)
                self._prefixes.clear()
            known = self._prefixes[bucket] = head[:-1] if head.endswith("/k") else ""
        return known


def lean_for(fs: Any) -> LeanGets | None:
    """The lean GETs of ``fs``'s objects, made once per filesystem and process; None where they would
    not reach what botocore reaches (see the module's docstring)."""
    with _LOCK:
        made = _LEAN.get(fs)
        if made is None or made[0] != os.getpid():
            made = _LEAN[fs] = (os.getpid(), _make(fs))
        return made[1]


def _make(fs: Any) -> LeanGets | None:
    import botocore
    import botocore.config
    from botocore.credentials import Credentials
    from botocore.httpsession import URLLib3Session

    settings = client_settings(fs)
    if settings is None:
        return None
    options, arguments = settings
    endpoint = arguments.get("endpoint_url")
    # (judged on the settings given before a client is made for them, then on the client's, with its profile's)
    if not endpoint or not _reachable(botocore.config.Config(**options), endpoint):
        return None
    client = client_for(fs)
    if client is None or not _reachable(client.meta.config, endpoint):
        return None
    meta = client.meta.config
    session = profile_session(fs.kwargs.get("profile"))
    credentials = None
    if meta.signature_version is not botocore.UNSIGNED:
        if "aws_access_key_id" in arguments:
            credentials = Credentials(arguments["aws_access_key_id"], arguments.get("aws_secret_access_key"),
                                      arguments.get("aws_session_token"))
        else:
            credentials = session.get_credentials()
        if credentials is None:
            return None  # (botocore's own error, through the client)
    # TLS verification as botocore settles it: the argument, the profile's ca_bundle, REQUESTS_CA_BUNDLE, its default
    verify = arguments.get("verify")
    if verify is None:
        verify = session.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE", True)
    http = URLLib3Session(verify=verify, timeout=(meta.connect_timeout, meta.read_timeout),
                          max_pool_connections=meta.max_pool_connections)
    return LeanGets(client, http, credentials, client.meta.region_name or "us-east-1",
                    meta.response_checksum_validation != "when_required")


def _reachable(config: Any, endpoint: str) -> bool:
    """Whether a lean GET reaches what a client of ``config`` reaches at ``endpoint``, and the client makes
    one attempt per call (daskcfa's setting: where the user asked botocore for retries, the count they
    gave holds, which a first lean attempt before the client's would exceed)."""
    import botocore
    from botocore.utils import get_environ_proxies

    retries = config.retries or {}
    one_attempt = retries.get("total_max_attempts") == 1 or retries.get("max_attempts") == 0
    return one_attempt and not (
        config.proxies or get_environ_proxies(endpoint) or config.client_cert or config.tcp_keepalive
        or set(config.s3 or {}) - {"addressing_style"}
        or config.signature_version not in (None, "s3v4", botocore.UNSIGNED))


def get_signed(lean: LeanGets, fs: Any, path: str, uri: str, max_bytes: int | None = None) -> bytes:
    """The whole object at ``path``: one lean GET, or -- for any answer but a plain 200 -- the blocking
    client's (see the module's docstring). One longer than ``max_bytes`` is refused before its body."""
    bucket, key, version = fs.split_path(path)
    # (no key: the bucket's URL, whose GET is a listing; the client refuses it, as botocore validates a key)
    prefix = "" if version or not key else lean.prefix(bucket)
    data = _get(lean, prefix, key, uri, max_bytes) if prefix else None
    return get_whole(lean.client, fs, path, uri, max_bytes) if data is None else data


def _get(lean: LeanGets, prefix: str, key: str, uri: str, max_bytes: int | None) -> bytes | None:
    """A plain 200's whole body, checked; None for any other answer (its body left unread)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.exceptions import ClientError, IncompleteReadError, ReadTimeoutError, ResponseStreamingError
    from botocore.utils import percent_encode
    from urllib3.exceptions import HTTPError, ReadTimeoutError as Urllib3ReadTimeout

    request = AWSRequest(method="GET", url=prefix + percent_encode(key, safe="/~"),
                         headers={"x-amz-checksum-mode": "ENABLED"} if lean.checksums else {})
    if lean.credentials is not None:
        S3SigV4Auth(lean.credentials.get_frozen_credentials(), "s3", lean.region).add_auth(request)
    prepared = request.prepare()
    prepared.stream_output = True  # (the body is read below, into one buffer)
    response = lean.http.send(prepared).raw  # (botocore's exceptions for connection faults: retried by the caller)
    whole = False
    try:
        headers = {k.lower(): v for k, v in response.headers.items()}
        sums = {k for k in headers if k.startswith("x-amz-checksum-") and k != "x-amz-checksum-type"}
        expected = expected_crc32({"ChecksumCRC32": headers.get(_CRC32),
                                   "ChecksumType": headers.get("x-amz-checksum-type", "FULL_OBJECT")})
        if response.status in TRANSIENT_STATUSES:  # (tried again by the caller, after its backoff: sent again
            # at once through the client, an overloaded server had two requests an attempt)
            raise ClientError({"Error": {"Code": str(response.status), "Message": response.reason or ""},
                               "ResponseMetadata": {"HTTPStatusCode": response.status}}, "GetObject")
        if response.status != 200 or (sums and (sums != {_CRC32} or expected is None)):
            return None
        length = headers.get("content-length", "")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = declared_length({"ContentRange": headers.get("content-range"),
                                  # (ASCII digits only: str.isdigit takes "²", which int() refuses)
                                  "ContentLength": int(length) if length.isascii() and length.isdigit()
                                  and not chunked else None},
                                 max_bytes, uri)
        try:
            with body_deadline(length, lean.client.meta.config.read_timeout, uri, shut_connection_of(response)):
                data = response.read(length) if length else b""
                beyond = response.read(1)
        except Urllib3ReadTimeout as exc:  # (as botocore's StreamingBody reports them: transient, retried)
            raise ReadTimeoutError(endpoint_url=urllib.parse.quote(uri, safe=":/"), error=exc) from None
        except HTTPError as exc:  # (a body cut short)
            raise ResponseStreamingError(error=exc) from None
        if len(data) < length:  # (as botocore reports it: transient, retried)
            raise IncompleteReadError(actual_bytes=len(data), expected_bytes=length)
        if beyond or len(data) != length:
            raise StorageError(f"the object's body is not the {length:,} bytes the server declared", file=uri)
        whole = True
        if expected is not None:
            check_crc32(data, expected, uri)
        return data
    finally:
        if not whole:
            response.close()  # (a connection with a body left unread is not reused)
        response.release_conn()
