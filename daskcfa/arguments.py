"""Checks of arguments that name things in the data: dimensions, variables, groups.

A misspelt name must not be ignored (``fragment_shape={"tim": 100}`` once
wrote a single 722 MiB fragment): every such argument is checked against the
names the data has, and the error names the valid ones and the nearest
(:mod:`difflib`).
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping

from .errors import ArgumentError

__all__ = ["nearest", "check_names", "check_fragment_shape", "check_storage_options"]

#: Options users give s3fs under other libraries' names (boto3, the AWS CLI, other tools) -> s3fs's spelling.
S3FS_SPELLINGS = {
    "anonymous": "anon", "anonymous_access": "anon", "no_sign_request": "anon",
    "access_key": "key", "access_key_id": "key", "aws_access_key_id": "key",
    "secret_key": "secret", "secret_access_key": "secret", "aws_secret_access_key": "secret",
    "session_token": "token", "aws_session_token": "token",
    "region": "client_kwargs={'region_name': ...}", "region_name": "client_kwargs={'region_name': ...}",
}


def nearest(name: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid name closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_names(argument: str, given: Iterable[str], valid: Iterable[str], what: str = "dimension", *,
                file: str | None = None) -> None:
    """Raise :class:`~daskcfa.errors.ArgumentError` if ``given`` holds names not in ``valid``."""
    valid = list(dict.fromkeys(valid))
    unknown = [n for n in given if n not in valid]
    if not unknown:
        return
    listed = ", ".join(map(str, valid)) or "none"
    names = ", ".join(f"{n!r}{nearest(n, valid)}" for n in unknown)
    plural = "s" if len(unknown) > 1 else ""
    raise ArgumentError(f"{argument} names unknown {what}{plural} {names}; {what}s: {listed}", file=file)


def check_fragment_shape(fragment_shape: Any, dims: Iterable[str], *, file: str | None = None) -> None:
    """A ``fragment_shape`` mapping may only name dimensions of the variables written."""
    if isinstance(fragment_shape, Mapping):
        check_names("fragment_shape", fragment_shape, dims, file=file)


#: s3fs's credential options
_S3_CREDENTIALS = ("key", "secret", "token")


def check_storage_options(options_by_protocol: Mapping[str, Any]) -> None:
    """Storage options s3fs would only refuse at the first request, with a bare ``TypeError``, refused now.

    ``options_by_protocol`` is keyed by protocol (``{"s3": {...}}``), as the
    storage profiles hold them. The message names s3fs's spelling
    (``anonymous`` -> ``anon``) and never quotes a value (it may be a secret).
    A protocol's options that are not a mapping (``{"s3": "key=...,secret=..."}``), and credentials
    that are not strings, are refused too (each was a bare ``ValueError``/``TypeError`` at the first
    request, from daskcfa's profiles and botocore's signer).
    """
    for protocol, options in options_by_protocol.items():
        if not isinstance(options, Mapping):
            raise ArgumentError(f"storage_options for {protocol}:// are a mapping of fsspec's options, not a "
                                f"{type(options).__name__}")
    for protocol in ("s3", "s3a"):
        options = options_by_protocol.get(protocol)
        if not isinstance(options, Mapping):
            continue
        wrong = [k for k in options if k in S3FS_SPELLINGS]
        if wrong:
            fixes = "; ".join(f"{k!r} -> {S3FS_SPELLINGS[k]}" for k in wrong)
            raise ArgumentError(f"storage_options for {protocol}:// use s3fs's names: {fixes}")
        typed = [k for k in _S3_CREDENTIALS if options.get(k) is not None and not isinstance(options[k], str)]
        if typed:
            raise ArgumentError(f"storage_options for {protocol}:// {', '.join(map(repr, typed))}: a credential is "
                                "a string")
