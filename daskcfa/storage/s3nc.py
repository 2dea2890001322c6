"""S3netCDF4's configuration file (``~/.s3nc.json`` / ``$S3_NC_CONFIG``): host
aliases, the transfer settings of each host's backend, the cache directory and
resource allocation, read as S3netCDF4 reads it.

Its own module because URIs (:mod:`.uri`: an alias is part of an S3 URI's
root), the location policy, credentials (:mod:`.profiles`) and the fragment
file manager (resource allocation) all ask for it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

from ..config import parse_size
from ..errors import CFAWarning, StorageError, redact
from .identity import local_token

__all__ = ["S3ncConfig", "Transfer", "s3nc_config", "cache_location"]

#: 5 GiB, S3's largest single PUT: the part size that uploads an object in one request.
SINGLE_PUT = 5 << 30


@dataclass(frozen=True)
class Transfer:
    """A host's transfer settings, from the ``backends`` entry of the backend it names (None: not set).

    ``part_size`` (``maximum_part_size``) is the s3fs block size and the part
    size of multipart uploads; ``max_parts`` (``maximum_parts``) the parts of one
    upload sent at once; ``enable_multipart_upload=false`` puts every object in one
    request, ``enable_multipart_download=false`` fetches every whole object in one GET;
    the timeouts (seconds) go to botocore.
    """

    part_size: int | None = None
    max_parts: int | None = None
    multipart_upload: bool | None = None
    multipart_download: bool | None = None
    connect_timeout: float | None = None
    read_timeout: float | None = None

    def options(self) -> dict[str, Any]:
        """The s3fs options these settings give."""
        options: dict[str, Any] = {}
        if self.part_size is not None:
            options["default_block_size"] = self.part_size
        if self.max_parts is not None:
            options["max_concurrency"] = self.max_parts
        botocore = {k: getattr(self, k) for k in ("connect_timeout", "read_timeout") if getattr(self, k) is not None}
        if botocore:
            options["config_kwargs"] = botocore
        return options

    @property
    def upload_part_size(self) -> int | None:
        """Bytes per part of a multipart upload (None: s3fs's default)."""
        return SINGLE_PUT if self.multipart_upload is False else self.part_size


@dataclass(frozen=True)
class S3ncConfig:
    """S3netCDF4's configuration file: host aliases, their transfer settings, the cache
    directory and resource allocation.

    ``hosts`` maps each alias to its entry; an entry that cannot be used (no
    ``url``, a template placeholder left unfilled) maps to the reason instead,
    raised only when a URI uses that alias.
    """

    hosts: Mapping[str, Mapping[str, Any] | str]
    resources: Mapping[str, Any]
    path: str = ""
    transfers: Mapping[str, Transfer] = field(default_factory=dict)  #: by alias
    cache: str | None = None  #: ``cache_location``, a directory

    def transfer(self, uri: str) -> Transfer:
        """The transfer settings of the host an alias URI names (all unset for other URIs)."""
        alias = uri[len("s3://"):].partition("/")[0] if uri.startswith("s3://") else ""
        return self.transfers.get(alias, _NO_TRANSFER)

    def rewrite(self, uri: str) -> tuple[str, dict[str, Any]]:
        """``s3://<alias>/<bucket>/<key>`` -> (``s3://<bucket>/<key>``, options for that host)."""
        if not uri.startswith("s3://") or not self.hosts:
            return uri, {}
        alias, _, rest = uri[len("s3://"):].partition("/")
        host = self.hosts.get(alias)
        if host is None:
            return uri, {}
        if isinstance(host, str):
            raise StorageError(f"S3netCDF4 alias {alias!r} cannot be used: {host} in {self.path!r}", file=uri)
        options: dict[str, Any] = {"client_kwargs": {"endpoint_url": host["url"]}}
        credentials = host.get("credentials", {})
        if "accessKey" in credentials:
            options["key"] = credentials["accessKey"]
        if "secretKey" in credentials:
            options["secret"] = credentials["secretKey"]
        return "s3://" + rest, {**options, **self.transfer(uri).options()}

    def endpoint(self, uri: str) -> tuple[str, str] | None:
        """(endpoint URL, ``s3://<bucket>/<key>``) of an alias URI; None when ``uri`` uses no usable alias."""
        alias, _, rest = uri[len("s3://"):].partition("/") if uri.startswith("s3://") else ("", "", "")
        host = self.hosts.get(alias) if alias else None
        if host is None or isinstance(host, str):
            return None
        return str(host["url"]), "s3://" + rest


_NO_TRANSFER = Transfer()
_NO_S3NC = S3ncConfig({}, {})


def cache_location() -> str | None:
    """S3netCDF4's ``cache_location``: the directory for read results too large for memory
    (None: not configured, or not a usable directory name)."""
    return s3nc_config().cache


def _config_path() -> str:
    return os.environ.get("S3_NC_CONFIG") or _default_config_path(os.environ.get("HOME"))


@lru_cache(maxsize=4)
def _default_config_path(home: str | None) -> str:
    """``~/.s3nc.json`` (expanded once per home: the path is asked for at every fragment opened)."""
    return os.path.join(os.path.expanduser("~"), ".s3nc.json")


#: The configuration file is looked at again at most this often (every URI
#: normalised asks for it, thousands of times in a read of many fragments).
_S3NC_RECHECK_SECONDS = 1.0
_s3nc_checked: dict[str, tuple[float, str | None]] = {}


def s3nc_config() -> S3ncConfig:
    path = _config_path()
    now = time.monotonic()
    checked = _s3nc_checked.get(path)
    if checked is None or now - checked[0] > _S3NC_RECHECK_SECONDS:
        try:
            stamp: str | None = local_token(os.stat(path))
        except OSError:
            stamp = None
        checked = _s3nc_checked[path] = (now, stamp)
    if checked[1] is None:
        return _NO_S3NC
    return _load_s3nc(path, checked[1])


#: A configuration file larger than this is not read (a handful of hosts take a few kB).
_S3NC_MAX_BYTES = 1 << 20
#: What daskcfa takes from the file; anything else is named in a warning (never ignored silently).
_S3NC_KEYS = {"version", "hosts", "resource_allocation", "backends", "cache_location"}
_S3NC_HOST_KEYS = {"alias", "url", "credentials", "api", "backend"}
#: The backend a host uses when it names none (S3netCDF4's default).
_DEFAULT_BACKEND = "s3aioFileObject"
_S3NC_RESOURCE_KEYS = {"memory", "filehandles"}


@lru_cache(maxsize=4)
def _load_s3nc(path: str, stamp: str) -> S3ncConfig:
    """The file, as far as it can be used; one warning lists whatever cannot be (once per version)."""
    problems: list[str] = []
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device would block or never end
            raise ValueError("it is not a regular file")
        with open(path, "rb") as f:
            raw = f.read(_S3NC_MAX_BYTES + 1)
        if len(raw) > _S3NC_MAX_BYTES:
            raise ValueError(f"it is larger than {_S3NC_MAX_BYTES:,} bytes")
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("it does not hold a JSON object")
    except (OSError, ValueError, RecursionError) as exc:
        _warn_s3nc(path, [f"it cannot be read ({exc}); it is ignored"])
        return _NO_S3NC
    problems += _unhonoured("", data, _S3NC_KEYS)
    hosts: dict[str, Mapping[str, Any] | str] = {}
    entries = data.get("hosts") or {}
    for key, host in entries.items() if isinstance(entries, dict) else ():
        alias, reason = _host(key, host)
        hosts[alias] = reason or host
        if reason:
            problems.append(f"host {key!r}: {reason}")
        else:
            problems += _unhonoured(f"hosts.{key}.", host, _S3NC_HOST_KEYS)
            if str(host.get("api", "S3v4")) != "S3v4":
                problems.append(f"host {key!r} asks for api {host['api']!r}; daskcfa speaks S3v4")
    if not isinstance(entries, dict):
        problems.append("'hosts' is not a JSON object")
    resources: dict[str, Any] = {}
    allocation = data.get("resource_allocation") or {}
    if isinstance(allocation, dict):
        problems += _unhonoured("resource_allocation.", allocation, _S3NC_RESOURCE_KEYS)
        for key, parse in (("memory", parse_size), ("filehandles", _count)):
            if key in allocation:
                try:
                    resources[key] = parse(allocation[key])
                except ValueError as exc:
                    problems.append(f"resource_allocation.{key}: {exc}; the default is used")
    else:
        problems.append("'resource_allocation' is not a JSON object")
    backends = _backends(data.get("backends") or {}, problems)
    transfers = {alias: backends[str(host.get("backend", _DEFAULT_BACKEND))] for alias, host in hosts.items()
                 if not isinstance(host, str) and str(host.get("backend", _DEFAULT_BACKEND)) in backends}
    cache = _cache(data["cache_location"], problems) if "cache_location" in data else None
    if problems:
        _warn_s3nc(path, problems)
    return S3ncConfig(hosts, resources, path, transfers, cache)


#: ``backends.<name>`` keys -> (Transfer field, parser).
_BACKEND_KEYS = {
    "maximum_part_size": ("part_size", lambda v: _positive(parse_size(v))),
    "maximum_parts": ("max_parts", lambda v: _count(v)),
    "enable_multipart_upload": ("multipart_upload", lambda v: _switch(v)),
    "enable_multipart_download": ("multipart_download", lambda v: _switch(v)),
    "connect_timeout": ("connect_timeout", lambda v: _seconds(v)),
    "read_timeout": ("read_timeout", lambda v: _seconds(v)),
}


def _backends(entries: Any, problems: list[str]) -> dict[str, Transfer]:
    """Each backend's transfer settings; what cannot be used goes to ``problems``."""
    if not isinstance(entries, dict):
        problems.append("'backends' is not a JSON object")
        return {}
    found = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            problems.append(f"backends.{name} is not a JSON object")
            continue
        problems += _unhonoured(f"backends.{name}.", entry, set(_BACKEND_KEYS))
        settings = {}
        for key, (attribute, parse) in _BACKEND_KEYS.items():
            if key in entry:
                try:
                    settings[attribute] = parse(entry[key])
                except ValueError as exc:
                    problems.append(f"backends.{name}.{key}: {exc}; the default is used")
        found[str(name)] = Transfer(**settings)
    return found


def _cache(value: Any, problems: list[str]) -> str | None:
    if not isinstance(value, str) or not value.strip() or "{" in value:
        problems.append(f"cache_location {value!r} is not a directory name (a template left unfilled?)")
        return None
    return os.path.expanduser(value)


def _positive(value: int) -> int:
    if value < 1:
        raise ValueError(f"{value!r} is not a positive size")
    return value


def _switch(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{value!r} is not a positive number of seconds")
    return float(value)


def _host(key: Any, host: Any) -> tuple[str, str | None]:
    """The alias a ``hosts`` entry defines, and why it cannot be used (None: it can)."""
    if not isinstance(host, dict):
        return str(key).removeprefix("s3://"), "not a JSON object"
    alias = str(host.get("alias") or str(key).removeprefix("s3://"))
    url = host.get("url")
    if not isinstance(url, str) or not re.match(r"^https?://[^/{}\s]+", url, re.IGNORECASE):
        return alias, f"'url' {redact(repr(url))} is not an http(s) URL (a template left unfilled?)"
    credentials = host.get("credentials", {})
    if not isinstance(credentials, dict) or not all(isinstance(v, str) for v in credentials.values()):
        return alias, "'credentials' should map accessKey and secretKey to strings"
    return alias, None


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r} is not a positive whole number")
    return value


def _unhonoured(prefix: str, entry: Mapping[str, Any], known: set[str]) -> list[str]:
    extra = sorted(str(k) for k in entry if k not in known)
    return [f"daskcfa does not use {', '.join(prefix + k for k in extra)}"] if extra else []


def _warn_s3nc(path: str, problems: list[str]) -> None:
    warnings.warn(f"S3netCDF4 configuration {path!r}: {'; '.join(problems)}", CFAWarning, stacklevel=2)
