"""The safe-URI policy: which locations an aggregation file may make us open.

An aggregation file is untrusted input: it must not be able to make a reader
open what its user did not mean to expose (``file:///etc/passwd`` named by an
aggregation on S3, or an object in somebody else's bucket). Defaults:

- an aggregation file on **remote** storage may reference remote objects in
  the same bucket (S3) or on the same host (HTTP/OPeNDAP) only;
- an aggregation file on **local** disk may reference local files anywhere
  and remote objects.

An S3netCDF4 alias URI (``s3://<alias>/<bucket>/...``) is the same location
as a plain ``s3://<bucket>/...`` URI when the alias's endpoint is the one the
plain URI reaches with the aggregation's storage options.

``allowed_locations`` replaces the default with an explicit list of location
prefixes; the entry ``"default"`` stands for the default rule, so
``["default", "s3://second-bucket/"]`` widens it and ``["/data/archive/"]``
confines reads to one tree (symbolic links are followed before checking).

The policy judges where bytes come from, not only the names in the file: an
HTTP redirect of a fragment is followed only to an allowed URL, every hop
checked before it is requested (``check_redirect``; OPeNDAP endpoints are
probed first, as netCDF-C follows redirects itself). The aggregation file
itself was named by the user: its redirects are followed, and its fragments
stay confined to the URL the user gave.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import unquote, urlsplit

import dask.config

from ..errors import UnsafeURIError, redact
from .profiles import ProfileRef, resolve_options
from .s3nc import s3nc_config
from .uri import is_local, normalise, scheme_of, to_local_path

__all__ = ["LocationPolicy"]

DEFAULT = "default"
#: Characters no fragment URI may hold, whatever the rule.
_CONTROL = re.compile(r"[\x00\r\n]")


def _origin(uri: str) -> str:
    """``s3://bucket/``, ``https://host:port/``: the unit a remote aggregation is confined to.

    With an S3netCDF4 alias (``s3://<alias>/<bucket>/<key>``) the unit is the
    bucket on that host, ``s3://<alias>/<bucket>/``, not the whole host.
    """
    scheme = scheme_of(uri)
    rest = uri.split("://", 1)[1]
    authority, _, path = rest.partition("/")
    if scheme == "s3" and authority in s3nc_config().hosts:
        return f"{scheme}://{authority}/{path.split('/', 1)[0]}/"
    return f"{scheme}://{authority}/"


def _endpoint(url: str) -> str:
    """An endpoint URL in one spelling: ``HTTP://Host:80/`` -> ``http://host``."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:  # not a port: compared as written
        return url.strip().lower().rstrip("/")
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + ("" if port in (None, default) else f":{port}")
    return f"{parts.scheme.lower()}://{netloc}{parts.path.rstrip('/')}"


def _remote_family(scheme: str) -> str:
    # An OPeNDAP endpoint is an http(s) URL; treat http/https/dap as one family.
    return "http" if scheme in ("http", "https", "dap2", "dap4") else scheme


@dataclass(frozen=True)
class LocationPolicy:
    """Decides whether a resolved fragment URI may be opened. Holds no secrets."""

    base: str
    allowed: tuple[str, ...] = (DEFAULT,)
    #: the aggregation's storage options (by reference): which endpoint a plain ``s3://`` URI reaches
    profile: ProfileRef = ProfileRef(None)

    @classmethod
    def for_aggregation(cls, base: str, allowed_locations: Iterable[str] | None = None,
                        profile: ProfileRef = ProfileRef(None)) -> "LocationPolicy":
        if allowed_locations is None:
            allowed_locations = dask.config.get("daskcfa.storage.allowed-locations", None) or (DEFAULT,)
        if isinstance(allowed_locations, str):
            allowed_locations = (allowed_locations,)
        prefixes = tuple(p if p == DEFAULT else _prefix(p) for p in allowed_locations)
        return cls(base=normalise(base), allowed=prefixes, profile=profile)

    def __dask_tokenize__(self) -> tuple:
        # What it allows, not its profile's name, which differs between processes: a write
        # resumed in a new process must plan the same generation.
        return (type(self).__name__, self.base, self.allowed)

    def check(self, uri: str) -> None:
        """Raise :class:`UnsafeURIError` unless ``uri`` is allowed."""
        if not self.allows(uri):
            raise UnsafeURIError(self._refusal(uri, "open"), file=self.base)

    def check_redirect(self, uri: str) -> None:
        """Raise :class:`UnsafeURIError` unless ``uri``, where an HTTP redirect
        leads, is allowed: bytes are read only from allowed places, not merely
        through allowed names. (The error names no file: its caller knows
        which URI was redirected.)"""
        if not self.allows(uri):
            raise UnsafeURIError(self._refusal(uri, "follow an HTTP redirect to"))

    def _refusal(self, uri: str, action: str) -> str:
        where = "local disk" if is_local(self.base) else _origin(self.base)
        shown = repr(redact(uri))
        if any(_CONTROL.search(f) for f in [uri, *_forms(uri)]):
            shown += " (it holds a NUL, CR or LF character, perhaps percent-encoded)"
        elif is_local(uri):
            real = os.path.realpath(to_local_path(uri))
            if real != normalise(uri):
                shown += f" (which resolves to {real!r})"
        return (f"refusing to {action} {shown}: an aggregation file on {where} may not reference it "
                "(widen with allowed_locations=[...] or dask config 'daskcfa.storage.allowed-locations')")

    def allows(self, uri: str) -> bool:
        # A remote URI must be allowed in every form a server might see it in:
        # percent-encoded dots or slashes (``%2e%2e``, ``..%2f``, even encoded
        # twice) are decoded by servers before they resolve dot segments.
        forms = _forms(uri)
        if any(_CONTROL.search(f) for f in [uri, *forms]):
            return False  # NUL cuts paths short in C libraries; CR/LF inject HTTP headers
        return any(all(self._default_allows(f) if p == DEFAULT else _under(f, p) for f in forms)
                   for p in self.allowed)

    def _default_allows(self, uri: str) -> bool:
        if is_local(self.base):
            return True
        if is_local(uri):
            return False
        same_family = _remote_family(scheme_of(uri)) == _remote_family(scheme_of(self.base))
        if same_family and _origin(uri).split("://", 1)[1] == _origin(self.base).split("://", 1)[1]:
            return True
        return scheme_of(uri) == scheme_of(self.base) == "s3" and self._same_bucket(uri)

    def _same_bucket(self, uri: str) -> bool:
        """Whether an S3netCDF4 alias URI and a plain one (either way round) name the same bucket
        on the same endpoint: an archive written through an alias, opened by its real URL."""
        config = s3nc_config()
        aliased = [config.endpoint(u) for u in (uri, self.base)]
        if aliased == [None, None]:
            return False
        places = []
        for u, alias in zip((uri, self.base), aliased):
            if alias is None:
                options = resolve_options(u, self.profile)[1]
                endpoint = (options.get("client_kwargs") or {}).get("endpoint_url") or options.get("endpoint_url")
                alias = (endpoint, u) if endpoint else None
            if alias is None:
                return False  # AWS's own endpoint, unknown here: never taken for an alias's
            places.append((_endpoint(alias[0]), _origin(alias[1])))
        return places[0] == places[1]


def _forms(uri: str) -> list[str]:
    """``uri`` normalised, plus (remote URIs) its percent-decoded variants, normalised."""
    uri = normalise(uri)
    if is_local(uri):
        return [uri]  # local paths were decoded and folded once, exactly as they are opened
    forms, current = [uri], uri
    for _ in range(3):
        decoded = unquote(current)
        if scheme_of(uri) in ("http", "https", "dap2", "dap4", "dap2s", "dap4s", "opendap"):
            decoded = decoded.replace("\\", "/")
        if decoded == current:
            break
        forms.append(normalise(decoded))
        current = decoded
    return forms


def _prefix(location: str) -> str:
    location = location.strip()
    if is_local(location):
        path = os.path.realpath(to_local_path(location))
        return path if path.endswith(os.sep) else path + os.sep
    return normalise(location)  # "s3://b/archive/": that prefix; "s3://b/x.nc": that object, or under it


def _under(uri: str, prefix: str) -> bool:
    if is_local(uri) != is_local(prefix):
        return False
    if is_local(uri):
        return os.path.realpath(to_local_path(uri)).startswith(prefix)
    if prefix.endswith("/"):
        return uri.startswith(prefix)  # (s3://b/archive, named like the prefix, is not in s3://b/archive/)
    return uri == prefix or uri.startswith(prefix + "/")
