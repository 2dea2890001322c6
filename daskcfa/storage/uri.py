"""One URI convention for every storage: parsing, joining and normalising.

Fragment references in aggregation files are absolute URIs (``file:///``,
``s3://``, ``https://``), plain absolute paths (what older tools wrote), or
relative references resolved against the location of the aggregation file —
never against the working directory. A Zarr store's URI may end in netCDF-C's
storage mode (``f.zarr#mode=nczarr,file``): the suffix is kept apart, unquoted,
through every operation here.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
from urllib.parse import quote, unquote, urlsplit

from ..choices import URI_STYLES
from ..errors import ArgumentError
from .s3nc import s3nc_config

__all__ = ["scheme_of", "is_local", "to_local_path", "resolve", "normalise", "absolute", "URI_STYLES",
           "check_uri_style", "split_mode", "is_opendap", "opendap_url"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: a ``file`` URI (the scheme in any case): ``file:///p``, ``file://localhost/p`` or RFC 8089's ``file:/p``
_FILE_URI = re.compile(r"^file:/", re.IGNORECASE)
#: netCDF-C's URL fragment naming a Zarr storage mode: ``#mode=nczarr,file``, ``#mode=zarr,s3``, ...
_MODE = re.compile(r"#mode=[^#]*$")


def split_mode(uri: str) -> tuple[str, str]:
    """``(location, suffix)``: a URI without netCDF-C's ``#mode=...`` suffix, and that suffix ("" if none)."""
    match = _MODE.search(uri)
    return (uri[:match.start()], match.group(0)) if match else (uri, "")


def scheme_of(uri: str) -> str:
    """``"file"`` for local paths and ``file://`` URIs, else the URI scheme (lower case)."""
    match = _SCHEME.match(uri)
    return match.group(1).lower() if match else "file"


def is_local(uri: str) -> bool:
    return scheme_of(uri) == "file"


def to_local_path(uri: str) -> str:
    """The filesystem path of a local URI (``file:///a%20b.nc`` -> ``/a b.nc``; also ``file:/a%20b.nc``,
    the form Java's ``File.toURI`` writes, and ``FILE://``: schemes are case-insensitive)."""
    if _FILE_URI.match(uri):
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise ArgumentError(f"file URI with a remote host is not supported: {uri!r}")
        return unquote(parts.path)
    return uri


def normalise(uri: str) -> str:
    """A canonical absolute form: local paths made absolute, ``.``/``..`` folded."""
    uri, mode = split_mode(uri)
    if mode:
        return normalise(uri) + mode
    if is_local(uri):
        return os.path.normpath(os.path.abspath(to_local_path(uri)))
    match = _SCHEME.match(uri)
    assert match is not None
    rest = uri[match.end():]
    authority, slash, path = rest.partition("/")
    if match.group(1).lower() == "s3" and slash and _is_s3nc_alias(authority):
        # s3://<alias>/<bucket>/<key>: the bucket is part of the root (``..`` stops there)
        bucket, slash, path = path.partition("/")
        authority = f"{authority}/{bucket}"
    path = posixpath.normpath("/" + path) if slash else "/"
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    trailing = "/" if uri.endswith("/") and path != "/" else ""
    return f"{match.group(1).lower()}://{authority}{path}{trailing}"


def absolute(uri: str) -> str:
    """``uri`` as an absolute URI, the same from any working directory (``file://`` for local files)."""
    uri, mode = split_mode(uri)
    return ("file://" + quote(normalise(uri)) if is_local(uri) else uri) + mode


def check_uri_style(uris: str) -> str:
    """``uris`` if it is one of :data:`URI_STYLES`; ValueError otherwise."""
    if uris not in URI_STYLES:
        raise ArgumentError(f"uris must be one of {', '.join(map(repr, URI_STYLES))}, not {uris!r}")
    return uris


def _is_s3nc_alias(authority: str) -> bool:
    try:
        return authority in s3nc_config().hosts
    except Exception:  # an unreadable configuration is reported where it is used
        return False


def resolve(reference: str, base: str) -> str:
    """Resolve a fragment reference found in the aggregation file at ``base``."""
    if is_local(reference) and is_local(base) and os.path.isabs(to_local_path(base)):
        return _resolved_locally(reference, base)  # (pure: no working directory, no S3 alias involved)
    return _resolve(reference, base)


@functools.lru_cache(maxsize=16384)
def _resolved_locally(reference: str, base: str) -> str:
    """:func:`resolve` for a local reference in a file at an absolute local ``base``, remembered: a
    read resolves every fragment it touches, and a walk touches thousands (each read of an archive
    of more fragments than are remembered would miss every one: 4,096 missed all of 5,000)."""
    return _resolve(reference, base)


@functools.lru_cache(maxsize=64)
def _absolute_directory(base: str) -> str:
    """The directory of the local aggregation file at the absolute ``base`` (remembered: each
    fragment's reference is resolved against it, and it never depends on the working directory)."""
    return os.path.dirname(normalise(base))


def _resolve(reference: str, base: str) -> str:
    reference = reference.strip()
    if _SCHEME.match(reference) or (is_local(reference) and os.path.isabs(to_local_path(reference))):
        return normalise(reference)
    if is_local(base):
        absolute = os.path.isabs(to_local_path(base))
        directory = _absolute_directory(base) if absolute else os.path.dirname(normalise(base))
        return normalise(os.path.join(directory, unquote(reference)))
    head, _, _ = base.rpartition("/")
    return normalise(f"{head}/{reference}")


#: OPeNDAP's URL schemes (netCDF-C's and others' spellings) -> the HTTP scheme under each
_DAP_SCHEMES = {"dap2": "http", "dap4": "http", "opendap": "http", "dap2s": "https", "dap4s": "https"}


def is_opendap(uri: str) -> bool:
    """OPeNDAP endpoints are named explicitly: ``dap2://``/``dap4://``/``opendap://``
    URLs, or an ``http(s)`` URL carrying netCDF-C's ``#mode=dap2``/``#dap4`` marker."""
    return scheme_of(uri) in _DAP_SCHEMES or "#mode=dap" in uri or uri.endswith("#dap4") or uri.endswith("#dap2")


def opendap_url(uri: str) -> str:
    """The http(s) URL netCDF-C's DAP client understands."""
    scheme = scheme_of(uri)
    if scheme in _DAP_SCHEMES:
        return _DAP_SCHEMES[scheme] + uri[len(scheme):]
    return uri
