"""Secret values kept out of every log record of the process.

botocore, aiobotocore, s3fs and aiohttp print request headers (session
tokens, ``Authorization``), canonical requests, signatures and credentials at
DEBUG level. Once daskcfa holds credentials in a process (registered storage
options, or options resolved for I/O), every log record created there has
those values, and any SigV4 signature, replaced by ``***`` before any handler
sees it. A record
factory, not a logger filter: filters on ``botocore`` do not apply to
records of ``botocore.auth`` or ``botocore.endpoint``, and handlers added
later (a worker's, a test's) would miss a handler filter.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from typing import Any, Callable, Iterable, Mapping

from ..errors import uri_secrets

__all__ = ["remember", "credential_values"]

#: Option names whose values are credentials (fsspec, s3fs, botocore, aiohttp).
CREDENTIAL_KEYS = frozenset({
    "key", "secret", "token", "password", "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
    "session_token", "access_key", "secret_key", "authorization", "x-amz-security-token", "sas_token",
    "account_key", "client_secret", "passwd",
})
#: Shorter values are not redacted (they would blank unrelated text).
_MIN_LENGTH = 6

#: A SigV4 signature (64 hex digits) after ``Signature=`` or ``Signature:`` (and white space)
_SIGNATURE = re.compile(r"(?i)(signature\s*[=:]\s*)[0-9a-f]{64}")
#: The values to redact, longest first (a token before its parts); replaced whole, never mutated.
_SECRETS: tuple[str, ...] = ()
_LOCK = threading.Lock()
_installed: Callable[..., logging.LogRecord] | None = None
_FORMATTER = logging.Formatter()


def credential_values(options: Any) -> set[str]:
    """Every credential value in nested storage options (also the parts of an ``Authorization`` header, and
    the login or signed query of a URL given as an option)."""
    found: set[str] = set()
    if isinstance(options, Mapping):
        for name, value in options.items():
            if isinstance(value, (Mapping, list, tuple)):
                found |= credential_values(value)
            elif str(name).lower() in CREDENTIAL_KEYS and value is not None:
                found |= _forms(str(value))
            elif isinstance(value, str) and "://" in value:  # (an ``endpoint_url`` or proxy holding a login)
                found |= uri_secrets(value)
    elif isinstance(getattr(options, "password", None), str):  # aiohttp.BasicAuth(login, password) in client_kwargs
        found.add(options.password)
    elif isinstance(options, (list, tuple)):
        for value in options:
            found |= credential_values(value)
    return {v for v in found if len(v) >= _MIN_LENGTH}


def _forms(value: str) -> set[str]:
    """``value``, and for an ``Authorization`` header its token and the password it encodes (not the
    user name: no secret, and blanking it would blank unrelated words)."""
    forms = {value}
    scheme, _, token = value.partition(" ")
    if token and scheme.lower() in ("basic", "bearer"):
        forms.add(token.strip())
        if scheme.lower() == "basic":
            try:
                password = base64.b64decode(token.strip(), validate=True).decode().partition(":")[2]
            except ValueError:
                return forms
            forms.add(password)
    return forms


def remember(options: Any, uri: str = "") -> None:
    """Redact the credentials in ``options`` (and those a ``uri`` holds: a signed query) from this
    process's log records from now on."""
    global _SECRETS
    values = credential_values(options) | {v for v in uri_secrets(uri) if len(v) >= _MIN_LENGTH}
    if values <= set(_SECRETS):
        return
    with _LOCK:
        _SECRETS = tuple(sorted(values | set(_SECRETS), key=len, reverse=True))
        _install()


def _install() -> None:
    global _installed
    if _installed is not None and logging.getLogRecordFactory() is _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return _redacted(previous(*args, **kwargs))

    _installed = factory
    logging.setLogRecordFactory(factory)


def _redacted(record: logging.LogRecord) -> logging.LogRecord:
    try:
        message = record.getMessage()
    except Exception:  # a record that cannot be formatted is left for its handler to report
        return record
    clean = _scrub(message, _SECRETS)
    if clean != message:
        record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[0] is not None:  # the traceback, as handlers' formatters would print it
        record.exc_text = _scrub(_FORMATTER.formatException(record.exc_info), _SECRETS)
    return record


def _scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
    # (a request's SigV4 signature, known to no one before it is made: botocore.auth logs it at DEBUG,
    # botocore.endpoint the ``Authorization`` header holding it)
    return _SIGNATURE.sub(r"\1***", text)
