"""Checks of arguments that name things in the data: dimensions, variables, groups.

A misspelt name must not be ignored (``fragment_shape={"tim": 100}`` once
wrote a single 722 MiB fragment): every such argument is checked against the
names the data has, and the error names the valid ones and the nearest
(:mod:`difflib`).
"""

from __future__ import annotations

import difflib
import functools
import inspect
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
        _check_s3_names(protocol, options)


def _check_s3_names(protocol: str, options: Mapping[str, Any]) -> None:
    """Option names s3fs, botocore's ``Config`` or its client do not take (aiobotocore refuses them only
    at the first request, with a bare ``TypeError``), and nested options that are not mappings."""
    top, nested = _s3_option_names()
    check_names(f"storage_options for {protocol}://", [k for k in options if k not in S3FS_SPELLINGS], top,
                "option")
    for name, valid in nested.items():
        inner = options.get(name)
        if inner is None:
            continue
        if not isinstance(inner, Mapping):
            raise ArgumentError(f"storage_options for {protocol}:// {name} is a mapping, not a {type(inner).__name__}")
        if valid is not None:  # (s3_additional_kwargs: any request parameter)
            check_names(f"storage_options for {protocol}:// {name}", inner, valid, "option")


@functools.cache
def _s3_option_names() -> tuple[list[str], dict[str, list[str] | None]]:
    """The names s3fs takes (with fsspec's listing-cache options and aiobotocore's session ones it hands
    on), and those of its nested mappings (``None``: any name), read from the installed libraries' signatures."""
    import aiobotocore.config
    import aiobotocore.session
    import botocore.session
    import s3fs

    def named(function: Any) -> list[str]:
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return [p.name for p in inspect.signature(function).parameters.values() if p.kind in kinds and p.name != "self"]

    top = named(s3fs.S3FileSystem.__init__) + named(aiobotocore.session.AioSession.__init__) + [
        "use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"]
    config = named(aiobotocore.config.AioConfig.__init__) + sorted(aiobotocore.config.AioConfig.OPTION_DEFAULTS)
    client = [n for n in named(botocore.session.Session.create_client) if n != "service_name"]
    return top, {"config_kwargs": config, "client_kwargs": client, "s3_additional_kwargs": None}
