"""Credentials and endpoints, resolved where the I/O happens.

Tasks never carry credentials. ``from_cfa(..., storage_options=...)`` files
the options in a process-wide registry under an opaque name and the graph
carries only a :class:`ProfileRef`. Worker processes learn the options from
the :class:`StorageProfiles` worker plugin (registered automatically on the
current ``distributed`` client), never from dask config (copied to workers,
dumped with the cluster state); nothing secret is ever part of a task, a
repr, a log line or an error message.

Options for one URI are merged from, lowest priority first:

1. fsspec/botocore defaults (AWS environment variables and config files);
2. dask config ``daskcfa.storage.options.<protocol>``;
3. the per-call ``storage_options`` — either flat (for the aggregation
   file's protocol; for S3 when the aggregation file is local or OPeNDAP)
   or keyed by protocol (``{"s3": {...}, "https": {...}}``);
4. named profiles in dask config ``daskcfa.storage.profiles.<name>`` whose
   ``match`` prefixes match the URI (longest prefix wins), so fragments on
   different endpoints get different credentials;
5. S3netCDF4 aliases from ``~/.s3nc.json`` / ``$S3_NC_CONFIG``: a URL
   ``s3://<alias>/<bucket>/<key>`` goes to that host with its credentials.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import os
import pickle
import re
import secrets
import stat
import threading
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

import dask.config

from ..arguments import check_storage_options

from ..errors import CFAWarning, StorageError, redact
from . import redaction
from .uri import scheme_of

__all__ = ["ProfileRef", "register", "split_url_credentials", "install", "encoded", "resolve_options",
           "S3ncConfig", "s3nc_config", "parse_size"]

_SALT = secrets.token_bytes(16)
_REGISTRY: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()
_SHARED: set[tuple[str, str | None, str]] = set()  # (client id, scheduler, profile name) already sent
_PROTOCOL_KEYS = {"s3", "s3a", "http", "https", "file", "gs", "gcs", "abfs", "az"}


@dataclass(frozen=True)
class ProfileRef:
    """An opaque reference to per-call storage options (safe to pickle and log)."""

    name: str | None = None

    def __repr__(self) -> str:
        return f"ProfileRef({self.name!r})"


def _canonical(options: Mapping[str, Any]) -> bytes:
    return json.dumps(options, sort_keys=True, default=repr).encode()


def register(storage_options: Mapping[str, Any] | None, *, protocol: str) -> ProfileRef:
    """File ``storage_options`` under an opaque name and share it with the current cluster."""
    if not storage_options:
        return ProfileRef(None)
    options = dict(storage_options)
    origins = {k: options.pop(k) for k in list(options) if _is_origin(k)}  # from split_url_credentials
    if not set(options) <= _PROTOCOL_KEYS or not options:
        options = {_flat_protocol(protocol): options} if options else {}
    options.update(origins)
    check_storage_options(options)
    name = "p-" + hmac.new(_SALT, _canonical(options), hashlib.sha256).hexdigest()[:20]
    redaction.remember(options)
    with _LOCK:
        _REGISTRY[name] = copy.deepcopy(options)
    # Never into dask config: it is copied to every worker process, written by
    # client.dump_cluster_state() and serialised for remote workers. Workers get
    # the options from a worker plugin, sent once to each client's cluster (also
    # when they were first registered before it connected; the scheduler hands
    # it to workers that join later), never as part of a task.
    _share_with_cluster({name: options})
    return ProfileRef(name)


def split_url_credentials(url: str, storage_options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """``https://user:pw@host/a.nc`` -> (``https://host/a.nc``, options sending that login to that origin only).

    The password then lives where other credentials do (the registry, behind
    a :class:`ProfileRef`), not in the URL that reprs, graphs and summaries
    show. Other schemes are left alone (netCDF-C reads a DAP URL's login itself).
    """
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or "@" not in parts.netloc:
        return url, None if storage_options is None else dict(storage_options)
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    login = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    options = dict(storage_options or {})
    options[f"{parts.scheme.lower()}://{host.lower()}/"] = {"headers": {"Authorization": f"Basic {login}"}}
    return urlunsplit(parts._replace(netloc=host)), options


def _is_origin(key: str) -> bool:
    return "://" in key


def _flat_protocol(protocol: str) -> str:
    """The protocol that flat (not keyed) ``storage_options`` are meant for.

    That of the aggregation file; but a local or OPeNDAP aggregation file
    takes no fsspec options, so there (as in cfdm and cf-python) flat options
    are the S3 options of its fragments.
    """
    if protocol == "file" or protocol in ("dap2", "dap4", "dap2s", "dap4s", "opendap"):
        return "s3"
    return protocol


_ENCODED = "__daskcfa_encoded_options__"


class _Encoded:
    """Storage options on their way to worker processes, not in clear text.

    ``distributed`` logs every message it receives at DEBUG level, and a
    worker plugin travels as one pickled message: plain options would put the
    secrets in those logs. Pickled, this object is the options masked with a
    keystream derived from a random nonce sent alongside. This is encoding,
    not encryption (the code to decode it is right here): it keeps secrets out
    of logs and dumps in readable form, nothing more. A cluster whose traffic
    must be protected needs TLS (``distributed.comm`` security settings).
    """

    __slots__ = ("options",)

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)

    def __reduce__(self) -> tuple:
        nonce = secrets.token_bytes(16)
        return (_decode, (nonce, _mask(pickle.dumps(self.options), nonce)))

    def __repr__(self) -> str:
        return "<encoded storage options>"


def _mask(data: bytes, nonce: bytes) -> bytes:
    pad = hashlib.shake_256(nonce).digest(len(data))
    return (int.from_bytes(data, "big") ^ int.from_bytes(pad, "big")).to_bytes(len(data), "big")


def _decode(nonce: bytes, masked: bytes) -> _Encoded:
    return _Encoded(pickle.loads(_mask(masked, nonce)))


def encoded(profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Profiles in the form to hand to :class:`daskcfa.StorageProfiles` (see :class:`_Encoded`)."""
    return {k: {_ENCODED: _Encoded(_plain(v))} for k, v in profiles.items()}


def _plain(options: Mapping[str, Any]) -> dict[str, Any]:
    value = options.get(_ENCODED) if isinstance(options, Mapping) else None
    if isinstance(value, _Encoded):
        return copy.deepcopy(value.options)
    return copy.deepcopy(dict(options))


def install(profiles: Mapping[str, Mapping[str, Any]]) -> None:
    """Make profiles known in this process (called by the worker plugin)."""
    plain = {k: _plain(v) for k, v in profiles.items()}
    redaction.remember(plain)
    with _LOCK:
        _REGISTRY.update(plain)


def _share_with_cluster(profiles: dict[str, dict[str, Any]]) -> None:
    try:
        from distributed import default_client
    except ImportError:  # pragma: no cover - distributed is a core dependency
        return
    try:
        client = default_client()
    except ValueError:
        return  # no cluster: the threaded scheduler shares this process's registry
    from ..plugins import StorageProfiles

    name = next(iter(profiles))
    shared = (client.id, getattr(client.scheduler, "address", None), name)
    with _LOCK:
        if shared in _SHARED:
            return
    client.register_plugin(StorageProfiles(encoded(profiles)), name=f"daskcfa-profiles-{name}")
    with _LOCK:
        _SHARED.add(shared)


def _per_call(ref: ProfileRef, protocol: str, uri: str) -> dict[str, Any]:
    if ref.name is None:
        return {}
    with _LOCK:
        options = _REGISTRY.get(ref.name)
    if options is None:
        raise StorageError(
            "the storage options given to daskcfa are not known in this process; with a distributed "
            "client created after from_cfa(), call from_cfa() again (it shares them with the current client), "
            "register them with client.register_plugin(daskcfa.StorageProfiles.from_options(...)) "
            "or use dask config profiles"
        )
    family = {"s3a": "s3", "https": "http"}
    found: dict[str, Any] = {}
    for key, value in options.items():
        if key == protocol or family.get(key, key) == family.get(protocol, protocol):
            found = dict(value)
            break
    for origin, value in options.items():  # a login taken out of a URL: for its own origin only
        if _is_origin(origin) and uri.lower().startswith(origin):
            found = _merge(found, value)
    return found


def _config_profile(uri: str) -> dict[str, Any]:
    profiles = dask.config.get("daskcfa.storage.profiles", {}) or {}
    best, best_len = None, -1
    for profile in profiles.values():
        matches = profile.get("match", ())
        for prefix in [matches] if isinstance(matches, str) else matches:
            if uri.startswith(prefix) and len(prefix) > best_len:
                best, best_len = profile, len(prefix)
    if best is None:
        return {}
    return {k: v for k, v in best.items() if k != "match"}


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_options(uri: str, ref: ProfileRef) -> tuple[str, dict[str, Any]]:
    """The URI to open (S3netCDF4 aliases rewritten) and the fsspec options for it."""
    protocol = scheme_of(uri)
    uri, alias_options = s3nc_config().rewrite(uri)
    options = dict(dask.config.get(f"daskcfa.storage.options.{protocol}", {}) or {})
    options = _merge(options, _per_call(ref, protocol, uri))
    options = _merge(options, _config_profile(uri))
    options = _merge(options, alias_options)
    redaction.remember(options)  # (also credentials from dask config and ~/.s3nc.json)
    return uri, options


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
