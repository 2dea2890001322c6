"""The HTTP session of s3fs's S3 requests: it follows no redirect.

aiobotocore makes the aiohttp session its requests go through, and aiohttp
follows a ``Location`` (301, 302, 303, 307, 308) by default: an S3 endpoint --
or anyone between it and the reader -- answering a GET with a redirect to
another host got the request sent there, with its ``X-Amz-Security-Token``
(aiohttp drops only ``Authorization`` when the origin changes), and that host's
body taken as the object's. botocore's own HTTP client follows no ``Location``:
S3's region redirects are handled above it, by botocore, which signs again for
the region and keeps a configured endpoint. So does this session: the first
redirect of a request that aiohttp would follow (one naming a ``Location`` or a ``URI``) is an :class:`~daskcfa.errors.UnsafeURIError` (naming the
object read, through :func:`.retry.refusals`), before anything is sent to where it points.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiobotocore.httpsession import AIOHTTPSession

from ..errors import UnsafeURIError, redact
from .retry import Refused

__all__ = ["UnredirectedSession"]


async def _refuse(session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestRedirectParams) -> None:
    # (where aiohttp goes next: a ``Location``, or else an obsolete ``URI`` header, which it follows too)
    location = params.response.headers.get("Location") or params.response.headers.get("URI")
    if not location:  # (not followed: botocore reads it, as S3's redirects to another region)
        return
    raise Refused(UnsafeURIError(f"the S3 endpoint answered {params.response.status} with a redirect to "
                                 f"{redact(location)[:200]!r}: S3 requests follow no redirect"))


_REFUSING = aiohttp.TraceConfig()
_REFUSING.on_request_redirect.append(_refuse)
_REFUSING.freeze()


class UnredirectedSession(AIOHTTPSession):
    """aiobotocore's HTTP session, whose aiohttp sessions refuse every redirect (see the module's docstring)."""

    async def _get_session(self, proxy_url: Any) -> aiohttp.ClientSession:
        # (aiobotocore makes the aiohttp session here, and takes no trace configs: one is added to it)
        session = await super()._get_session(proxy_url)
        if _REFUSING not in session.trace_configs:
            session.trace_configs.append(_REFUSING)
        return session
