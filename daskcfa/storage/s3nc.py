"""S3netCDF4's configuration file (``~/.s3nc.json`` / ``$S3_NC_CONFIG``): host
aliases and resource allocation, read as S3netCDF4 reads it.

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
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ..errors import CFAWarning, StorageError, redact

__all__ = ["S3ncConfig", "s3nc_config", "parse_size"]


@dataclass(frozen=True)
class S3ncConfig:
    """S3netCDF4's configuration file: host aliases and resource allocation.

    ``hosts`` maps each alias to its entry; an entry that cannot be used (no
    ``url``, a template placeholder left unfilled) maps to the reason instead,
    raised only when a URI uses that alias.
    """

    hosts: Mapping[str, Mapping[str, Any] | str]
    resources: Mapping[str, Any]
    path: str = ""

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
        return "s3://" + rest, options

    def endpoint(self, uri: str) -> tuple[str, str] | None:
        """(endpoint URL, ``s3://<bucket>/<key>``) of an alias URI; None when ``uri`` uses no usable alias."""
        alias, _, rest = uri[len("s3://"):].partition("/") if uri.startswith("s3://") else ("", "", "")
        host = self.hosts.get(alias) if alias else None
        if host is None or isinstance(host, str):
            return None
        return str(host["url"]), "s3://" + rest


_NO_S3NC = S3ncConfig({}, {})


def _config_path() -> str:
    return os.environ.get("S3_NC_CONFIG") or os.path.join(os.path.expanduser("~"), ".s3nc.json")


#: The configuration file is looked at again at most this often (every URI
#: normalised asks for it, thousands of times in a read of many fragments).
_S3NC_RECHECK_SECONDS = 1.0
_s3nc_checked: dict[str, tuple[float, int | None]] = {}


def s3nc_config() -> S3ncConfig:
    path = _config_path()
    now = time.monotonic()
    checked = _s3nc_checked.get(path)
    if checked is None or now - checked[0] > _S3NC_RECHECK_SECONDS:
        try:
            stamp: int | None = os.stat(path).st_mtime_ns
        except OSError:
            stamp = None
        checked = _s3nc_checked[path] = (now, stamp)
    if checked[1] is None:
        return _NO_S3NC
    return _load_s3nc(path, checked[1])


#: A configuration file larger than this is not read (a handful of hosts take a few kB).
_S3NC_MAX_BYTES = 1 << 20
#: What daskcfa takes from the file; anything else is named in a warning (never ignored silently).
_S3NC_KEYS = {"version", "hosts", "resource_allocation"}
_S3NC_HOST_KEYS = {"alias", "url", "credentials", "api"}
_S3NC_RESOURCE_KEYS = {"memory", "filehandles"}
#: S3netCDF4's size suffixes: decimal units, up to yottabytes.
_SIZE_UNITS = {"": 1, "B": 1, **{f"{p}B": 1000 ** (i + 1) for i, p in enumerate("KMGTPEZY")}}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes in an S3netCDF4 size: a number, or one suffixed ``B``, ``kB``, ``MB`` ... ``YB`` (decimal)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    unit = match.group(2).upper() if match else None
    if unit not in _SIZE_UNITS:
        raise ValueError(f"{value!r} is not a size (a number with B, kB, MB, GB, TB, PB, EB, ZB or YB)")
    number = match.group(1)
    whole, _, fraction = number.partition(".")
    return (int(whole or 0) * 10 ** len(fraction) + int(fraction or 0)) * _SIZE_UNITS[unit] // 10 ** len(fraction)


@lru_cache(maxsize=4)
def _load_s3nc(path: str, stamp: int) -> S3ncConfig:
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
    if problems:
        _warn_s3nc(path, problems)
    return S3ncConfig(hosts, resources, path)


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
