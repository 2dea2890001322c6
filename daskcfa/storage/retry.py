"""Storage failures as daskcfa errors naming the URI, after bounded retries.

Every storage call of the package runs inside :func:`translated` (or
:func:`with_retries`): client libraries raise their own types (botocore,
aiohttp, fsspec), and a caller must see one :class:`~daskcfa.errors.StorageError`
family, never a secret.
"""

from __future__ import annotations

import binascii
import errno
import random
import time
from contextlib import contextmanager
from typing import Any, Iterator

from .. import config
from ..errors import CFAError, NotFoundError, StorageError, redact
from ..logs import logger

__all__ = ["Refused", "translated", "refusals", "http_status", "precondition_failed", "with_retries",
           "TRANSIENT_STATUSES"]

_TRANSIENT = (ConnectionError, TimeoutError)
#: HTTP statuses tried again (after a backoff): a server restarting, overloaded or behind a failing proxy
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
log = logger(__name__)


class Refused(Exception):
    """Carries a refusal out of aiohttp, which would turn an ``OSError`` (as
    :class:`UnsafeURIError` is) into a connection error, and so a retry."""

    def __init__(self, error: CFAError) -> None:
        super().__init__(str(error))
        self.error = error


def _retries() -> int:
    return int(config.number("daskcfa.storage.retries"))


def _deadline() -> float:
    """Seconds after which no further attempt starts (``daskcfa.storage.retry-deadline``)."""
    return config.number("daskcfa.storage.retry-deadline")


def _backoff(attempt: int) -> float:
    """The wait after failed attempt ``attempt`` (0-based): exponential, capped, with jitter
    (concurrent tasks that failed together do not all come back at once)."""
    return min(2.0, 0.2 * 2**attempt) * random.uniform(0.75, 1.25)


@contextmanager
def translated(uri: str) -> Iterator[None]:
    """Turn storage exceptions into daskcfa errors naming the URI (secrets removed)."""
    try:
        with refusals(uri):  # (fsspec reports some failures as "not found": look behind them first)
            yield
    except CFAError:
        raise
    except FileNotFoundError as exc:
        status = http_status(exc)
        if status in (401, 403):  # fsspec's HTTP filesystem reports a refusal as "not found"
            raise StorageError(f"access denied (HTTP {status})", file=uri) from None
        if status is not None and status != 404 and status != 410:
            raise StorageError(f"storage error (HTTP {status})", file=uri) from None
        raise NotFoundError("not found", file=uri) from None
    except PermissionError as exc:
        raise StorageError(f"access denied ({_describe(exc)})", file=uri) from None
    except (OSError, *_TRANSIENT) as exc:  # (a nested tuple here is a TypeError)
        raise StorageError(f"storage error ({_describe(exc)})", file=uri) from None
    except RecursionError:  # (botocore's S3 region redirector, when every answer redirects again naming no region)
        raise StorageError("the server's redirects did not end", file=uri) from None
    except binascii.Error:  # (botocore decodes the checksum a server sends only at the body's end)
        raise StorageError("the server sent a value that is not base64 (a checksum)", file=uri) from None
    except ValueError as exc:  # (botocore's parser meeting a header it cannot read: a length, a date, a count)
        if not _from_parser(exc):
            raise
        raise StorageError(f"the server's answer could not be parsed ({_describe(exc)})", file=uri) from None
    except Exception as exc:  # client libraries raise their own types (botocore, aiohttp)
        if type(exc).__module__.split(".")[0] in ("botocore", "aiohttp", "aiobotocore", "s3fs", "fsspec"):
            status = http_status(exc)
            if status in (401, 403):
                raise StorageError(f"access denied (HTTP {status})", file=uri) from None
            if status in (404, 410):
                raise NotFoundError("not found", file=uri) from None
            raise StorageError(f"storage error ({_describe(exc)})", file=uri) from None
        raise


@contextmanager
def refusals(uri: str) -> Iterator[None]:
    """Raise the daskcfa error of a refused redirect (or redirect without a
    location) behind any exception, naming ``uri``."""
    try:
        yield
    except Exception as exc:
        refusal = next((e.error for e in _chain(exc) if isinstance(e, Refused)), None)
        if refusal is None:
            raise
        raise refusal.located(file=uri) from None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions behind it (causes, contexts), at most 8."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return
        yield current
        current = current.__cause__ or current.__context__


def http_status(exc: BaseException) -> int | None:
    """The HTTP error status of the response behind ``exc`` (its cause chain), if any: aiohttp's
    ``status``, or the status of a botocore ``ClientError``'s response."""
    for current in _chain(exc):
        status = getattr(current, "status", None)
        response = getattr(current, "response", None)
        if not isinstance(status, int) and isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int) and 400 <= status <= 599:
            return status
    return None


def _from_parser(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while botocore (or aiobotocore) parsed a response."""
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_globals.get("__name__") in ("botocore.parsers", "aiobotocore.parsers"):
            return True
        frame = frame.tb_next
    return False


def _describe(exc: BaseException) -> str:
    return redact(f"{type(exc).__name__}: {exc}")[:300]


_TRANSIENT_NAMES = {
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ClientConnectorError", "ServerDisconnectedError", "ClientOSError", "ClientPayloadError",
    "ResponseStreamingError", "IncompleteReadError",  # (botocore: a body cut short, as aiohttp's ClientPayloadError)
}


#: What s3fs makes of S3's "InternalError" (500) and "SlowDown"/"ServiceUnavailable" (503): try again.
_RETRY_ERRNOS = {getattr(errno, "EREMOTEIO", errno.EIO), errno.EBUSY}


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, _TRANSIENT) or any(t.__name__ in _TRANSIENT_NAMES for t in type(exc).__mro__):
        return True
    if isinstance(exc, OSError) and exc.errno in _RETRY_ERRNOS:
        return True
    return http_status(exc) in TRANSIENT_STATUSES


def precondition_failed(exc: BaseException) -> bool:
    """Whether an S3 request was refused because its condition (``If-Match``,
    ``If-None-Match``) did not hold: an answer, not a fault to retry."""
    for current in _chain(exc):
        response = getattr(current, "response", None)
        if isinstance(response, dict) and (response.get("Error", {}).get("Code") == "PreconditionFailed" or
                                           response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412):
            return True
    return False


def with_retries(uri: str, operation: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``operation`` with bounded retries for transient faults, errors translated.

    The one retry layer of daskcfa's storage: the filesystems it makes do not
    retry themselves (:mod:`.objects`). At most ``daskcfa.storage.retries``
    retries, none started after ``daskcfa.storage.retry-deadline`` seconds;
    each failed attempt is logged at WARNING (URI redacted).
    """
    attempts = _retries() + 1
    give_up_at = time.monotonic() + _deadline()
    with translated(uri):
        for attempt in range(attempts):
            try:
                return operation(*args, **kwargs)
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                wait = _backoff(attempt)
                last = attempt == attempts - 1 or time.monotonic() + wait >= give_up_at
                log.warning("storage attempt %d of %d on %s failed (%s); %s", attempt + 1, attempts, redact(uri),
                            _describe(exc), "giving up" if last else f"retrying in {wait:.1f} s")
                if last:
                    raise
            time.sleep(wait)
    raise AssertionError("unreachable")
