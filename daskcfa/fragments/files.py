"""Open one variable of one fragment file with the best engine and strategy.

Engines, chosen from a file's first bytes (or, for a Zarr store, from its URI:
:mod:`.zarr`): HDF5-based files (netCDF-4) are
read *directly* — h5py locates the chunks, and the bytes are read and
decompressed outside the HDF5 lock, so threads decode in parallel. netCDF-3
files are read directly too (:mod:`.netcdf3`: header parsed, values read with
pread). Everything else (filters, types or variables the direct readers do not
handle, OPeNDAP) goes through netCDF4-python under the lock.

Strategies for remote objects, chosen per read: when most of a fragment is
wanted, one GET (concurrent ranged GETs for large objects) brings the whole
object into memory; when a small part of a large fragment is wanted, only
the byte ranges of the HDF5 chunks holding it are fetched (plus the
metadata, through a block cache).
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import threading
import zlib
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

import dask.config

from .. import storage
from ..errors import CFAError, ConfigError, FragmentReadError, NotFoundError, StorageError, redact
from ..logs import logger
from ..storage.policy import LocationPolicy
from ..storage.profiles import ProfileRef
from . import readahead
from .chunk_index import IndexedVariable, IndexEntry
from .layout import StoredLayout
from .manager import manager
from .netcdf import NetCDF4File
from .netcdf3 import SIGNATURES as NETCDF3_SIGNATURES, NetCDF3File, open_netcdf3
from .zarr import ZarrFile, is_zarr

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_READS = itertools.count()  #: distinct keys for handles that are never shared
NETCDF3_SIGNATURE = b"CDF"
log = logger(__name__)


def _engine() -> str:
    engine = dask.config.get("daskcfa.io.engine", "auto")
    if engine not in ("auto", "netcdf4", "direct"):
        raise ConfigError(f"daskcfa.io.engine must be 'auto', 'netcdf4' or 'direct', not {engine!r}")
    return engine


class _Variable:
    """A fragment variable whose direct reads fall back to netCDF4 when needed."""

    def __init__(self, var: Any, name: str, fallback: Any, label: str = "") -> None:
        self._var = var
        self._name = name
        self._label = label
        self._fallback = fallback  # () -> the same file opened with netCDF4
        self.name, self.shape, self.dtype, self.no_fill = var.name, var.shape, var.dtype, var.no_fill
        # (no reference back to this object: a cycle would keep every fragment read until the cyclic
        # collector runs, whose full passes over a large process cost more than the reads)
        self.attrs = var.attrs if fallback is None else _Attributes(var.attrs, functools.partial(
            _fallback_attrs, fallback, name))

    @property
    def layout(self) -> tuple[tuple[int, ...] | None, bool]:
        """The chunk shape (None: contiguous, or not told by the engine) and whether chunks are filtered."""
        return getattr(self._var, "chunks", None), bool(getattr(self._var, "compressed", False))

    def storage_layout(self) -> StoredLayout | None:
        """Where the variable's bytes lie in its file (None: its engine cannot tell, as
        netCDF4-python and zarr-python cannot)."""
        method = getattr(self._var, "storage_layout", None)
        return None if method is None else method()

    def _falling_back(self, exc: Exception, what: str) -> Any:
        log.debug("fragment %s, variable %r: the direct reader cannot read its %s (%s); netCDF4 reads it",
                  redact(self._label), self._name, what, exc)
        return self._fallback().variable(self._name)

    @property
    def dims(self) -> tuple[str, ...]:
        try:
            return tuple(self._var.dims)
        except Exception as exc:
            if self._fallback is not None and _unsupported(exc):
                return tuple(self._falling_back(exc, "dimensions").dims)
            raise

    def read(self, key: tuple) -> Any:
        try:
            return _budgeted_read(self._var, self._name, key)
        except CFAError:
            raise
        except Exception as exc:
            if self._fallback is not None and _unsupported(exc):
                return _budgeted_read(self._falling_back(exc, "values"), self._name, key)
            if isinstance(exc, (OSError, RuntimeError, ValueError, IndexError, zlib.error)):
                raise FragmentReadError(f"cannot read variable {self._name!r}: {exc}") from None
            raise


def _budgeted_read(var: Any, name: str, key: tuple) -> Any:
    """``var.read(key)`` with the chunk being decoded counted against the memory budget:
    a chunk larger than the budget is refused before it is inflated (a 1 MB file can hold
    a chunk of gigabytes of zeros). A variable read without decoding chunks (contiguous, netCDF-3)
    has nothing to count."""
    if not var.chunk_nbytes:
        return var.read(key)
    with manager().reserve(var.chunk_nbytes, what=f"a chunk of variable {name!r}", wait=False):
        return var.read(key)


def _fallback_attrs(fallback: Callable[[], Any], name: str) -> Mapping[str, Any]:
    return fallback().variable(name).attrs


class _Attributes(Mapping[str, Any]):
    """The direct reader's (lazily read) attributes, falling back to netCDF4 for a value it cannot read:
    an attribute netCDF4 does not show either (of a type netCDF-C does not know) is absent."""

    def __init__(self, direct: Mapping[str, Any], fallback: Callable[[], Mapping[str, Any]]) -> None:
        self._direct = direct
        self._fallback = fallback

    def __getitem__(self, name: str) -> Any:
        try:
            return self._direct[name]
        except KeyError:  # (absent: the common case, as ``get`` asks for every attribute decoding may use)
            raise
        except Exception as exc:
            if _unsupported(exc):
                return self._fallback()[name]
            raise

    def __contains__(self, name: object) -> bool:
        if name not in self._direct:
            return False
        try:  # (decoding reads what it finds here: the value is remembered)
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def get(self, name: str, default: Any = None) -> Any:
        # (decoding asks for attributes most fragments lack: no exception raised for each)
        return self[name] if name in self else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._direct)

    def __len__(self) -> int:
        return len(self._direct)


def _unsupported(exc: Exception) -> bool:
    from .hdf5 import DirectReadUnsupported

    return isinstance(exc, DirectReadUnsupported)


class FragmentFile:
    """An open fragment file: its engines and everything closing it releases.

    netCDF-4 files are read through the direct HDF5 reader; a variable it
    cannot read falls back to netCDF4-python, opened on first need. The direct
    handle is closed then, unless a variable already uses it; if so both stay
    open, and the second is counted by the file manager (``second``).
    """

    def __init__(self, label: str, *, direct: Any = None, netcdf4: Any = None,
                 second: Callable[[], None] | None = None, how: str = "") -> None:
        self.label = label
        if log.isEnabledFor(logging.DEBUG):  # (redacting costs more than opening a small fragment's variable)
            log.debug("opened fragment %s (%s; engine: %s)", redact(label), how or "as a file", _engine_name(direct))
        self._stack = ExitStack()
        self._direct = direct  # an HDF5File, or None
        self._netcdf4_opener = netcdf4  # () -> NetCDF4File; None: the direct reader only (a Zarr store)
        self._second = second  # counts the netCDF4 handle opened beside the direct one with the file manager
        self._netcdf4: NetCDF4File | None = None
        self._variables: dict[str, _Variable] = {}
        self._lock = threading.Lock()
        self._direct_used = False  # a variable read through the direct handle was handed out
        if direct is not None:
            self._stack.callback(direct.close)

    def _nc(self) -> NetCDF4File:
        with self._lock:
            if self._netcdf4 is None:
                if self._netcdf4_opener is None:
                    raise FragmentReadError("a Zarr store is read by zarr-python only")
                if self._direct is not None and not self._direct_used:
                    self._direct.close()  # (closing twice, at the end, is harmless)
                    self._direct = None
                if self._direct is not None and self._second is not None:
                    self._second()
                log.debug("opening fragment %s with netCDF4-python", redact(self.label))
                self._netcdf4 = _opened(self._netcdf4_opener, self.label)
                self._stack.callback(self._netcdf4.close)
            return self._netcdf4

    def variable(self, name: str) -> _Variable:
        var = self._variables.get(name)
        if var is None:
            var = self._variables[name] = self._open_variable(name)
        return var

    def first_variable(self, names: Sequence[str]) -> _Variable:
        """The first of ``names`` the file holds (an error names them all when none is there)."""
        for name in names:
            try:
                return self.variable(name)
            except _NoSuchVariable:
                continue
        shown = " or ".join(map(repr, names))
        raise FragmentReadError(f"variable {shown} not found in the fragment file")

    def _open_variable(self, name: str) -> _Variable:
        if self._direct is not None:
            from .hdf5 import DirectReadUnsupported

            try:
                with self._lock:
                    direct = self._direct.variable(name) if self._direct is not None else None
                    self._direct_used |= direct is not None
                if direct is not None:
                    return _Variable(direct, name, lambda: self._nc(), self.label)
            except KeyError:
                raise _NoSuchVariable(f"variable {name!r} not found in the fragment file") from None
            except (DirectReadUnsupported, OSError, RuntimeError) as exc:
                # (nothing else reads it, or the direct reader's verdict on a damaged file: its own error)
                if self._netcdf4_opener is None or isinstance(exc, FragmentReadError):
                    raise
                log.debug("fragment %s, variable %r: the direct reader cannot open it (%s); netCDF4 reads it",
                          redact(self.label), name, exc)
        try:
            return _Variable(self._nc().variable(name), name, None, self.label)
        except (KeyError, IndexError):
            raise _NoSuchVariable(f"variable {name!r} not found in the fragment file") from None

    def close(self) -> None:
        self._variables.clear()  # (each refers back to this file, for its fallback)
        self._stack.close()


class _NoSuchVariable(FragmentReadError):
    """The fragment file has no variable of that name."""


def _opened(opener: Any, label: str) -> NetCDF4File:
    try:
        return opener()
    except FileNotFoundError:
        raise NotFoundError("not found", file=label) from None
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise NotFoundError("not found", file=label) from None
        raise FragmentReadError(f"not a readable netCDF file ({exc.strerror or exc})") from None


def _hdf5(source: Any, **kwargs: Any) -> Any:
    """An HDF5File for the direct reader, or None when it cannot open ``source``."""
    from .hdf5 import DirectReadUnsupported, HDF5File

    try:
        return HDF5File(source, **kwargs)
    except (OSError, DirectReadUnsupported) as exc:
        log.debug("the direct HDF5 reader cannot open %s (%s); netCDF4 reads it",
                  redact(str(kwargs.get("label") or source)), exc)
        return None


def _engine_name(direct: Any) -> str:
    """What reads a fragment file first: the direct reader's kind, or netCDF4-python."""
    if direct is None:
        return "netCDF4-python"
    return {"HDF5File": "direct HDF5", "NetCDF3File": "direct netCDF-3", "ZarrFile": "zarr-python"}.get(
        type(direct).__name__, type(direct).__name__)


@contextmanager
def open_fragment(uri: str, name: str | Sequence[str], *, profile: ProfileRef = storage.NO_PROFILE,
                  policy: LocationPolicy | None = None, fraction: float = 1.0,
                  expected_nbytes: int = 0) -> Iterator[_Variable]:
    """Variable ``name`` of fragment ``uri`` (the first of several names found), ready to read raw values.

    The file comes from this process's fragment file manager: cached handles
    are reused, and opening respects the file and memory budgets. ``fraction``
    is the share of the fragment's elements the caller wants and
    ``expected_nbytes`` the size of its data; they decide between fetching a
    whole remote object and fetching byte ranges. ``policy`` (the URI itself
    was checked by the caller) decides where HTTP redirects may lead. Raises
    :class:`NotFoundError` when the file does not exist; only regular local
    files are opened.
    """
    if is_zarr(uri):  # (a store is a directory or a prefix: never one object)
        key = ("zarr", uri, next(_READS))  # (opened afresh by each read: a store has no version to check)
        handle = manager().open(key, lambda: _open_zarr(uri, profile, policy), files=1, label=uri, keep=False)
    elif storage.is_local(uri):
        path = storage.local_path(uri)
        try:
            stat = storage.local_stat(uri)
        except NotFoundError:
            raise
        except StorageError as exc:  # not a regular file, or not reachable: a fact about the fragment
            raise FragmentReadError(exc.reason) from None
        engine = _engine()
        key: tuple = ("file", path, storage.local_token(stat), engine)  # (a replaced file: another key)
        handle = manager().open(key, lambda: _open_local(path, lambda: manager().grow(key, files=1), engine),
                                files=1, label=uri, family=("file", path))
    elif storage.is_opendap(uri):
        handle = manager().open(("dap", storage.opendap_url(uri), policy), lambda: _open_dap(uri, profile, policy),
                                files=1, label=uri)
    else:
        handle = _remote_handle(uri, profile, policy, fraction, expected_nbytes)
    with handle as (file, _):
        yield file.first_variable([name] if isinstance(name, str) else name)


@contextmanager
def open_indexed(uri: str, entry: IndexEntry, *, profile: ProfileRef = storage.NO_PROFILE,
                 policy: LocationPolicy | None = None) -> Iterator[_Variable]:
    """The fragment variable its chunk ``entry`` describes, read by byte range without
    opening the file as HDF5 (reads raise :class:`IndexedFragmentChanged` if ``uri`` is
    no longer the object indexed); as :func:`open_fragment` hands it out."""
    var = IndexedVariable(uri, entry, profile, policy)
    yield _Variable(var, var.name, None, uri)


def _open_zarr(uri: str, profile: ProfileRef, policy: LocationPolicy | None) -> FragmentFile:
    return FragmentFile(uri, direct=ZarrFile(uri, profile, policy=policy), how="Zarr store")


def _open_dap(uri: str, profile: ProfileRef, policy: LocationPolicy | None) -> FragmentFile:
    if policy is not None:
        storage.probe_opendap(uri, profile, policy=policy)
    url = storage.opendap_url(uri)
    return FragmentFile(url, netcdf4=lambda: NetCDF4File(url), how="OPeNDAP")


def _open_local(path: str, second: Callable[[], None], engine: str) -> FragmentFile:
    # The engine follows the file's first bytes: netCDF-3 is read directly, and h5py
    # (whose refusal of a non-HDF5 file costs more than reading a small one) only
    # tries the rest; what neither reads goes to netCDF4-python (``engine``: the
    # configured one, which is part of the handle's key).
    direct = None
    if engine != "netcdf4":
        direct = open_netcdf3(path) or _hdf5(path)
    return FragmentFile(path, direct=direct, netcdf4=lambda: NetCDF4File(path), second=second, how="local file")


def small_object_size() -> int:
    """Remote objects up to this size are always fetched whole (``daskcfa.io.small-object``)."""
    return storage.config_bytes("daskcfa.io.small-object", 4 << 20)


def whole_object_wanted(fraction: float, nbytes: int) -> bool:
    """Whether a remote fragment of ``nbytes``, of which ``fraction`` is wanted, is fetched whole."""
    threshold = float(dask.config.get("daskcfa.io.whole-fragment-fraction", 0.5))
    return fraction >= threshold or nbytes <= small_object_size()


def _remote_handle(uri: str, profile: ProfileRef, policy: LocationPolicy | None, fraction: float,
                   expected_nbytes: int) -> Any:
    # Requests per read: when the whole object is wanted (most of it, or a
    # small object), one GET -- concurrent ranged GETs when large -- and the
    # bytes are released after the read (an object may be replaced at any
    # time, and checking would cost a request). For a small part of a large
    # HDF5 object: the size and version (HEAD), metadata blocks (which also
    # show the signature) and the chunks' byte ranges; that handle is cached
    # by version, so a later read of the same object costs the HEAD and the
    # chunks only. A handle opened with some credentials (or policy) serves only them.
    # A netCDF4 handle opened beside the direct one holds its own copy of the object: counted too.
    mgr = manager()
    whole = _engine() == "netcdf4" or whole_object_wanted(fraction, expected_nbytes)
    whole_key = ("remote-whole", uri, profile.name, next(_READS))
    if whole and expected_nbytes <= 2 * storage.part_size():
        return mgr.open(whole_key,
                        lambda: _open_whole(uri, profile, policy, None, expected_nbytes, _grower(whole_key)),
                        nbytes=expected_nbytes, label=uri, keep=False)
    nbytes, version = storage.stat(uri, profile, policy=policy)
    if whole or whole_object_wanted(fraction, nbytes):  # (the object may be smaller than its data)
        return mgr.open(whole_key, lambda: _open_whole(uri, profile, policy, nbytes, nbytes, _grower(whole_key)),
                        nbytes=nbytes, label=uri, keep=False)
    cache = storage.block_size() * storage.BLOCKS_CACHED
    key = ("remote", uri, profile.name, policy, nbytes, version)
    return mgr.open(key, lambda: _open_ranged(uri, profile, policy, nbytes, _grower(key)), nbytes=cache, label=uri)


#: ``(bytes) -> a callable counting them with the file manager``, given to a handle's opener.
Grower = Callable[[int], Callable[[], None]]


def _grower(key: tuple) -> Grower:
    """For a handle's opener: ``(bytes) -> count them with the file manager``."""
    return lambda nbytes: lambda: manager().grow(key, nbytes=nbytes)


def _open_ranged(uri: str, profile: ProfileRef, policy: LocationPolicy | None, nbytes: int,
                 grower: Grower) -> FragmentFile:
    fileobj = storage.open_file(uri, profile, known_size=nbytes, policy=policy)
    label = storage.memory_label(uri)
    if _head_of(fileobj) != HDF5_SIGNATURE:
        fileobj.close()
        return _open_whole(uri, profile, policy, nbytes, nbytes, grower)
    direct = _hdf5(fileobj, read_ranges=lambda ranges: storage.read_ranges(uri, ranges, profile, policy=policy),
                   label=uri)
    file = FragmentFile(uri, direct=direct, second=grower(nbytes), how=f"byte ranges of {nbytes} bytes",
                        netcdf4=lambda: NetCDF4File(label, memory=storage.read_bytes(
                            uri, profile, known_size=nbytes, policy=policy)))  # (its size: reserved by ``second``)
    file._stack.callback(fileobj.close)
    return file


def _open_whole(uri: str, profile: ProfileRef, policy: LocationPolicy | None, nbytes: int | None,
                size_hint: int, grower: Grower) -> FragmentFile:
    # ``size_hint``: the bytes reserved for the object; one longer than the memory budget is refused
    # before its body is received, and what it holds beyond the reservation is counted
    data = readahead.take(uri, profile, policy)
    if data is None:
        data = storage.read_whole(uri, profile, known_size=nbytes, size_hint=size_hint, policy=policy,
                                  max_bytes=manager().budget.memory)
    if len(data) > size_hint:
        grower(len(data) - size_hint)()
    head = bytes(data.read(0, 8))
    label = storage.memory_label(uri)
    if not (head.startswith(NETCDF3_SIGNATURE) or head == HDF5_SIGNATURE):
        raise FragmentReadError("not a netCDF file (unknown signature)")
    direct = None
    if _engine() != "netcdf4" and head == HDF5_SIGNATURE:
        direct = _hdf5(data, label=uri)
    elif _engine() != "netcdf4" and head[:4] in NETCDF3_SIGNATURES:
        direct = NetCDF3File(data=data)
    return FragmentFile(uri, direct=direct, netcdf4=lambda: NetCDF4File(label, memory=data.tobytes()),
                        second=grower(len(data)), how=f"whole object of {len(data)} bytes")


def _head_of(fileobj: Any) -> bytes:
    """The first bytes of a remote file object (b"" when they cannot be read: the
    whole-object read that follows then reports the storage error properly)."""
    try:
        head = fileobj.read(8)
        fileobj.seek(0)
        return bytes(head)
    except Exception:
        return b""
