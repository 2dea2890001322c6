"""Open one variable of one fragment file with the best engine and strategy.

Engines: HDF5-based files (netCDF-4) are read *directly* — h5py locates the
chunks, and the bytes are read and decompressed outside the HDF5 lock, so
threads decode in parallel. Everything else (netCDF-3, filters or types the
direct reader does not handle, OPeNDAP) goes through netCDF4-python under the
lock.

Strategies for remote objects, chosen per read: when most of a fragment is
wanted, one GET (concurrent ranged GETs for large objects) brings the whole
object into memory; when a small part of a large fragment is wanted, only
the byte ranges of the HDF5 chunks holding it are fetched (plus the
metadata, through a block cache).
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
import zlib
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Mapping

import dask.config

from .. import storage
from ..errors import CFAError, FragmentReadError, NotFoundError
from ..storage.profiles import ProfileRef
from . import readahead
from .manager import manager
from .netcdf import NetCDF4File

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_READS = itertools.count()  #: distinct keys for handles that are never shared
NETCDF3_SIGNATURE = b"CDF"


def _engine() -> str:
    engine = dask.config.get("daskcfa.io.engine", "auto")
    if engine not in ("auto", "netcdf4", "direct"):
        raise ValueError(f"daskcfa.io.engine must be 'auto', 'netcdf4' or 'direct', not {engine!r}")
    return engine


class _Variable:
    """A fragment variable whose direct reads fall back to netCDF4 when needed."""

    def __init__(self, var: Any, name: str, fallback: Any) -> None:
        self._var = var
        self._name = name
        self._fallback = fallback  # () -> the same file opened with netCDF4
        self.name, self.shape, self.dtype, self.no_fill = var.name, var.shape, var.dtype, var.no_fill
        self.attrs = var.attrs if fallback is None else _Attributes(var.attrs, self._fallback_attrs)

    def _fallback_attrs(self) -> Mapping[str, Any]:
        return self._fallback().variable(self._name).attrs

    @property
    def dims(self) -> tuple[str, ...]:
        try:
            return tuple(self._var.dims)
        except Exception as exc:
            if self._fallback is not None and _unsupported(exc):
                return tuple(self._fallback().variable(self._name).dims)
            raise

    def read(self, key: tuple) -> Any:
        try:
            return self._var.read(key)
        except CFAError:
            raise
        except Exception as exc:
            if self._fallback is not None and _unsupported(exc):
                return self._fallback().variable(self._name).read(key)
            if isinstance(exc, (OSError, RuntimeError, ValueError, IndexError, zlib.error)):
                raise FragmentReadError(f"cannot read variable {self._name!r}: {exc}") from None
            raise


class _Attributes(Mapping[str, Any]):
    """The direct reader's (lazily read) attributes, falling back to netCDF4 for a value it cannot read."""

    def __init__(self, direct: Mapping[str, Any], fallback: Callable[[], Mapping[str, Any]]) -> None:
        self._direct = direct
        self._fallback = fallback

    def __getitem__(self, name: str) -> Any:
        try:
            return self._direct[name]
        except Exception as exc:
            if _unsupported(exc):
                return self._fallback()[name]
            raise

    def __contains__(self, name: object) -> bool:
        return name in self._direct

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
    cannot read falls back to netCDF4-python, opened on first need.
    """

    def __init__(self, label: str, *, direct: Any = None, netcdf4: Any = None) -> None:
        self.label = label
        self._stack = ExitStack()
        self._direct = direct  # an HDF5File, or None
        self._netcdf4_opener = netcdf4  # () -> NetCDF4File
        self._netcdf4: NetCDF4File | None = None
        self._variables: dict[str, _Variable] = {}
        self._lock = threading.Lock()
        if direct is not None:
            self._stack.callback(direct.close)

    def _nc(self) -> NetCDF4File:
        with self._lock:
            if self._netcdf4 is None:
                self._netcdf4 = _opened(self._netcdf4_opener, self.label)
                self._stack.callback(self._netcdf4.close)
            return self._netcdf4

    def variable(self, name: str) -> _Variable:
        var = self._variables.get(name)
        if var is None:
            var = self._variables[name] = self._open_variable(name)
        return var

    def _open_variable(self, name: str) -> _Variable:
        if self._direct is not None:
            from .hdf5 import DirectReadUnsupported

            try:
                return _Variable(self._direct.variable(name), name, lambda: self._nc())
            except KeyError:
                raise FragmentReadError(f"variable {name!r} not found in the fragment file") from None
            except (DirectReadUnsupported, OSError, RuntimeError):
                pass
        try:
            return _Variable(self._nc().variable(name), name, None)
        except (KeyError, IndexError):
            raise FragmentReadError(f"variable {name!r} not found in the fragment file") from None

    def close(self) -> None:
        self._stack.close()


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
    except (OSError, DirectReadUnsupported):
        return None


@contextmanager
def open_fragment(uri: str, name: str, *, profile: ProfileRef = storage.NO_PROFILE,
                  fraction: float = 1.0, expected_nbytes: int = 0) -> Iterator[_Variable]:
    """Variable ``name`` of fragment ``uri``, ready to read raw values.

    The file comes from this process's fragment file manager: cached handles
    are reused, and opening respects the file and memory budgets. ``fraction``
    is the share of the fragment's elements the caller wants and
    ``expected_nbytes`` the size of its data; they decide between fetching a
    whole remote object and fetching byte ranges. Raises
    :class:`NotFoundError` when the file does not exist.
    """
    if storage.is_local(uri):
        path = storage.local_path(uri)
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            raise NotFoundError("not found", file=uri) from None
        except OSError as exc:
            raise FragmentReadError(f"cannot open ({exc.strerror or exc})") from None
        key: tuple = ("file", path, stat.st_mtime_ns, stat.st_size, _engine())
        handle = manager().open(key, lambda: _open_local(path), files=1, label=uri)
    elif storage.is_opendap(uri):
        url = storage.opendap_url(uri)
        handle = manager().open(("dap", url), lambda: FragmentFile(url, netcdf4=lambda: NetCDF4File(url)),
                                files=1, label=uri)
    else:
        handle = _remote_handle(uri, profile, fraction, expected_nbytes)
    with handle as (file, _):
        yield file.variable(name)


def _open_local(path: str) -> FragmentFile:
    # h5py refuses anything that is not HDF5 (netCDF-3, say): netCDF4-python reads those.
    direct = _hdf5(path) if _engine() != "netcdf4" else None
    return FragmentFile(path, direct=direct, netcdf4=lambda: NetCDF4File(path))


def small_object_size() -> int:
    """Remote objects up to this size are always fetched whole (``daskcfa.io.small-object``)."""
    return storage.config_bytes("daskcfa.io.small-object", 4 << 20)


def _whole_object_wanted(fraction: float, nbytes: int) -> bool:
    threshold = float(dask.config.get("daskcfa.io.whole-fragment-fraction", 0.5))
    return fraction >= threshold or nbytes <= small_object_size()


def _remote_handle(uri: str, profile: ProfileRef, fraction: float, expected_nbytes: int) -> Any:
    # Requests per read: when the whole object is wanted (most of it, or a
    # small object), one GET -- concurrent ranged GETs when large -- and the
    # bytes are released after the read (an object may be replaced at any
    # time, and checking would cost a request). For a small part of a large
    # HDF5 object: the size and version (HEAD), metadata blocks (which also
    # show the signature) and the chunks' byte ranges; that handle is cached
    # by version, so a later read of the same object costs the HEAD and the
    # chunks only. A handle opened with some credentials serves only them.
    mgr = manager()
    whole = _engine() == "netcdf4" or _whole_object_wanted(fraction, expected_nbytes)
    if whole and expected_nbytes <= 2 * storage.part_size():
        return mgr.open(("remote-whole", uri, profile.name, next(_READS)),
                        lambda: _open_whole(uri, profile, None, expected_nbytes), nbytes=expected_nbytes, label=uri,
                        keep=False)
    nbytes, version = storage.stat(uri, profile)
    if whole or _whole_object_wanted(fraction, nbytes):  # (the object may be smaller than its data)
        return mgr.open(("remote-whole", uri, profile.name, next(_READS)),
                        lambda: _open_whole(uri, profile, nbytes, nbytes), nbytes=nbytes, label=uri, keep=False)
    cache = storage.block_size() * storage.BLOCKS_CACHED
    return mgr.open(("remote", uri, profile.name, nbytes, version), lambda: _open_ranged(uri, profile, nbytes),
                    nbytes=cache, label=uri)


def _open_ranged(uri: str, profile: ProfileRef, nbytes: int) -> FragmentFile:
    fileobj = storage.open_file(uri, profile, known_size=nbytes)
    label = storage.memory_label(uri)
    if _head_of(fileobj) != HDF5_SIGNATURE:
        fileobj.close()
        return _open_whole(uri, profile, nbytes, nbytes)
    direct = _hdf5(fileobj, read_ranges=lambda ranges: storage.read_ranges(uri, ranges, profile), label=uri)
    file = FragmentFile(uri, direct=direct,
                        netcdf4=lambda: NetCDF4File(label, memory=storage.read_bytes(uri, profile)))
    file._stack.callback(fileobj.close)
    return file


def _open_whole(uri: str, profile: ProfileRef, nbytes: int | None, size_hint: int) -> FragmentFile:
    data = readahead.take(uri, profile)
    if data is None:
        data = storage.read_whole(uri, profile, known_size=nbytes, size_hint=size_hint)
    head = bytes(data.read(0, 8))
    label = storage.memory_label(uri)
    if not (head.startswith(NETCDF3_SIGNATURE) or head == HDF5_SIGNATURE):
        raise FragmentReadError("not a netCDF file (unknown signature)")
    direct = None
    if _engine() != "netcdf4" and head == HDF5_SIGNATURE:
        direct = _hdf5(data, label=uri)
    return FragmentFile(uri, direct=direct, netcdf4=lambda: NetCDF4File(label, memory=data.tobytes()))


def _head_of(fileobj: Any) -> bytes:
    """The first bytes of a remote file object (b"" when they cannot be read: the
    whole-object read that follows then reports the storage error properly)."""
    try:
        head = fileobj.read(8)
        fileobj.seek(0)
        return bytes(head)
    except Exception:
        return b""
