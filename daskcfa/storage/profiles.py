"""Credentials and endpoints, resolved where the I/O happens.

Tasks never carry credentials. ``from_cfa(..., storage_options=...)`` files
the options in a process-wide registry under an opaque name and the graph
carries only a :class:`ProfileRef`. Worker processes learn the options from
the :class:`StorageProfiles` worker plugin, never from dask config (copied to
workers, dumped with the cluster state); nothing secret is ever part of a
task, a repr, a log line or an error message. The plugin is registered on the
current ``distributed`` client, and on every client the process makes later
(distributed's client preload, :func:`dask_setup`: dask config then names this
module, nothing more), so a cluster may be started after ``from_cfa``.

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

import functools
import inspect
import sys
import base64
import re
import copy
import hashlib
import hmac
import json
import pickle
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import dask.config

from ..arguments import check_storage_options
from ..errors import ArgumentError, StorageError
from . import redaction
from .s3nc import s3nc_config
from .uri import scheme_of

__all__ = ["ProfileRef", "register", "split_url_credentials", "take_login", "with_profile", "install", "encoded",
           "resolve_options", "StorageProfiles", "dask_setup"]

_SALT = secrets.token_bytes(16)
_REGISTRY: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()
_SHARED: set[tuple[str, str | None, str]] = set()  # (client id, scheduler, profile name) already sent
_OWN: set[str] = set()  # the profiles registered in this process (not installed by the plugin): shared with clients
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
        _OWN.add(name)
    # Never into dask config: it is copied to every worker process, written by
    # client.dump_cluster_state() and serialised for remote workers. Workers get
    # the options from a worker plugin, sent once to each client's cluster (also
    # when they were first registered before it connected; the scheduler hands
    # it to workers that join later), never as part of a task.
    _preload_clients()
    _share_with_cluster({name: options})
    return ProfileRef(name)


def split_url_credentials(url: str, storage_options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """``https://user:pw@host/a.nc`` -> (``https://host/a.nc``, options sending that login to that origin only).

    The password then lives where other credentials do (the registry, behind
    a :class:`ProfileRef`), not in the URL that reprs, graphs and summaries
    show. Other schemes are left alone (netCDF-C reads a DAP URL's login itself).
    """
    url, login = take_login(url)
    _check_host(url)
    if not login:
        return url, None if storage_options is None else dict(storage_options)
    return url, {**(storage_options or {}), **login}


def take_login(url: str) -> tuple[str, dict[str, Any]]:
    """An HTTP(S) URL without its ``user:pw@``, and the options sending that login to its
    origin (scheme, host, port) only: ``{"https://host/": {"headers": ...}}`` (empty: none).

    :class:`ArgumentError`, not showing the URL, when its authority holds no valid port but an ``@`` follows
    (a password holding ``/``, ``?`` or ``#`` not percent-encoded): no reader can use such a URL, and
    neither redaction nor a URL parser can tell where its password ends; and for an S3 URI holding a
    ``user:password@`` (no S3 reader takes a login there: it would reach the SDK's messages as a bucket name)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # (an unclosed ``[``: the parser's own message, the URL not shown)
        raise ArgumentError(f"not a valid URL ({exc}); the URL is not shown, it may hold a password") from None
    if parts.scheme.lower() in ("s3", "s3a") and "@" in parts.netloc:
        raise ArgumentError("an S3 URI holding a login ('user:password@' before the bucket): S3 credentials go in "
                            "storage_options or a profile; the URI is not shown, it holds a secret")
    if parts.scheme.lower() not in ("http", "https"):
        return url, {}
    if "@" not in parts.netloc:
        if "@" in url and not _has_valid_port(parts):
            raise ArgumentError("an HTTP URL whose login holds '/', '?' or '#' not percent-encoded "
                             "(%2F, %3F, %23): the URL is not shown, it holds a password")
        return url, {}
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    login = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    origin = f"{parts.scheme.lower()}://{host.lower()}/"
    return urlunsplit(parts._replace(netloc=host)), {origin: {"headers": {"Authorization": f"Basic {login}"}}}


def _check_host(url: str) -> None:
    """Refuse an HTTP(S) URL (without a login) naming no host, or a port out of range: aiohttp's and urllib's
    bare errors otherwise (a prefix of ``relocate``, ``http://``, is no such URL: not checked here)."""
    parts = urlsplit(url)
    if parts.scheme.lower() in ("http", "https") and (not parts.hostname or not _has_valid_port(parts)
                                                     or not _bracket_closes_host(parts.netloc)):
        raise ArgumentError("an HTTP URL naming no host, or a port out of range 0-65535", file=url)


def _bracket_closes_host(netloc: str) -> bool:
    """An IPv6 host's ``]`` followed by nothing or ``:port`` (Python's parser takes ``[::1]x``, which
    aiohttp's refuses with a bare ValueError)."""
    host = netloc.rpartition("@")[2]
    return not host.startswith("[") or re.fullmatch(r"\[[^\]]*\](:\d*)?", host) is not None


def _has_valid_port(parts: SplitResult) -> bool:
    try:
        parts.port
    except ValueError:
        return False
    return True


def with_profile(ref: ProfileRef, extra: ProfileRef) -> ProfileRef:
    """The profile holding ``ref``'s options and ``extra``'s (per-origin logins), registered."""
    if extra.name is None or extra == ref:
        return ref
    with _LOCK:
        options = copy.deepcopy(_REGISTRY.get(ref.name, {})) if ref.name else {}
        added = copy.deepcopy(_REGISTRY.get(extra.name, {}))
    if (ref.name is not None and not options) or not added:
        return ref  # (unknown in this process: resolving it raises, as it would have)
    return register(_merge(options, added), protocol="http")


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
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return  # (not imported: there is no client to share with; later clients run dask_setup)
    try:
        client = distributed.default_client()
    except ValueError:
        return  # no cluster: the threaded scheduler shares this process's registry
    for name, options in profiles.items():
        shared = _unshared(client, name)
        if shared is not None:
            client.register_plugin(_plugin(name, options), name=f"daskcfa-profiles-{name}")
            with _LOCK:
                _SHARED.add(shared)


def _unshared(client: Any, name: str) -> tuple[str, str | None, str] | None:
    """What records profile ``name`` as sent to ``client``'s cluster, unless it was."""
    shared = (client.id, getattr(client.scheduler, "address", None), name)
    with _LOCK:
        return None if shared in _SHARED else shared


def _plugin(name: str, options: Mapping[str, Any]) -> Any:
    return _storage_profiles()(encoded({name: options}))


def _preload_clients() -> None:
    """Have every ``distributed`` client this process makes from now on run :func:`dask_setup`
    (dask config ``distributed.client.preload``, which then holds this module's name only)."""
    preload = dask.config.get("distributed.client.preload", None) or []
    preload = [preload] if isinstance(preload, str) else list(preload)
    if __name__ in preload:
        return
    update: dict[str, Any] = {"distributed.client.preload": [*preload, __name__]}
    argv = dask.config.get("distributed.client.preload-argv", None) or []
    if argv and not isinstance(argv[0], str):  # (one list of arguments per preload)
        update["distributed.client.preload-argv"] = [*argv, []]
    dask.config.set(update)


async def dask_setup(client: Any) -> None:
    """distributed's client preload hook (:func:`_preload_clients`): the storage profiles
    registered in this process are shared with the cluster of a client made after them."""
    with _LOCK:
        profiles = {name: _REGISTRY[name] for name in _OWN}
    for name, options in profiles.items():
        shared = _unshared(client, name)
        if shared is None:
            continue
        sent = client.register_plugin(_plugin(name, options), name=f"daskcfa-profiles-{name}")
        if inspect.isawaitable(sent):  # (on the client's event loop, as preloads run)
            await sent
        with _LOCK:
            _SHARED.add(shared)


def _per_call(ref: ProfileRef, protocol: str, uri: str) -> dict[str, Any]:
    if ref.name is None:
        return {}
    with _LOCK:
        options = _REGISTRY.get(ref.name)
    if options is None:
        raise StorageError(
            "the storage options given to daskcfa are not known in this process: a distributed client "
            "made after from_cfa() shares them with its workers unless dask config "
            "'distributed.client.preload' was reset since; call from_cfa() again (it shares them with the "
            "current client), register them with "
            "client.register_plugin(daskcfa.StorageProfiles.from_options(...)) or use dask config profiles"
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


@functools.cache
def _storage_profiles() -> type:
    """The worker plugin class, defined when first asked for: distributed is imported only then."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class StorageProfiles(WorkerPlugin):
        """Installs storage options on every worker (also on workers that join later),
        so that tasks can refer to them by name instead of carrying credentials."""

        idempotent = True

        def __init__(self, profiles_by_name: Mapping[str, Mapping[str, Any]]) -> None:
            self._profiles = {k: dict(v) for k, v in profiles_by_name.items()}

        @classmethod
        def from_options(cls, storage_options: Mapping[str, Any], *, protocol: str = "s3") -> "StorageProfiles":
            """The plugin for options given to ``from_cfa(..., storage_options=...)``."""
            ref = register(storage_options, protocol=protocol)
            return cls(encoded({ref.name: _REGISTRY[ref.name]})) if ref.name else cls({})

        def setup(self, worker: Any) -> None:
            install(self._profiles)

        def __repr__(self) -> str:
            return f"StorageProfiles({sorted(self._profiles)})"

    StorageProfiles.__module__, StorageProfiles.__qualname__ = __name__, "StorageProfiles"  # (pickled by name)
    return StorageProfiles


def __getattr__(name: str) -> Any:
    if name == "StorageProfiles":  # (the worker plugin: see _storage_profiles)
        return _storage_profiles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
