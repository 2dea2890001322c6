"""Local files: only regular files are ever opened for reading.

A FIFO would block netCDF-C (or any reader) for ever, and a device such as
``/dev/zero`` never ends; both are refused before and after opening. Files
of ``/proc`` and ``/sys`` are regular files of size 0 that read as the
kernel's views (``/proc/self/environ``: the reader's secrets): refused too,
as a reference set or a link in a Zarr store could serve their bytes as data.
"""

from __future__ import annotations

import functools
import io
import os

import numpy as np
from stat import S_ISBLK, S_ISCHR, S_ISDIR, S_ISFIFO, S_ISREG, S_ISSOCK

from ..errors import NotFoundError, StorageError
from .retry import translated
from .uri import is_local, to_local_path

__all__ = ["local_path", "real_location", "irregular", "local_stat", "open_local", "pread", "free_space"]


def local_path(uri: str) -> str:
    """The filesystem path of a local URI."""
    try:
        return to_local_path(uri)
    except ValueError as exc:
        raise StorageError(str(exc), file=uri) from None


def real_location(uri: str) -> str:
    """A local URI's path with every symbolic link on it followed (a remote URI as it is): two spellings of
    one local file -- through a linked directory -- compare equal."""
    return os.path.realpath(local_path(uri)) if is_local(uri) else uri


_IRREGULAR = ((S_ISDIR, "a directory"), (S_ISFIFO, "a FIFO"), (S_ISCHR, "a character device"),
              (S_ISBLK, "a block device"), (S_ISSOCK, "a socket"))


def irregular(mode: int) -> str | None:
    """What a local path is when it is not a regular file (``"a FIFO"``...), else None.

    Only regular files are ever opened for reading: opening a FIFO waits for a
    writer forever, and a device (``/dev/zero``) never ends.
    """
    if S_ISREG(mode):
        return None
    return next((what for test, what in _IRREGULAR if test(mode)), "a special file")


def _refuse_irregular(mode: int, uri: str) -> None:
    kind = irregular(mode)
    if kind is not None:
        raise StorageError(f"not a regular file ({kind}): only regular files are opened", file=uri)


@functools.cache
def _kernel_filesystems() -> frozenset[int]:
    """The devices of ``/proc`` and ``/sys``: their "regular files" are the kernel's views (a
    process's environment, its secrets included), not data."""
    devices = set()
    for root in ("/proc", "/proc/self", "/sys"):
        try:
            devices.add(os.stat(root).st_dev)
        except OSError:
            pass
    return frozenset(devices)


def local_stat(uri: str) -> os.stat_result:
    """``os.stat`` of a local file (links followed), refused unless it is a regular file of data."""
    path = local_path(uri)
    try:
        info = os.stat(path)  # (no context manager on the way that succeeds: a read stats every fragment)
    except FileNotFoundError:
        raise NotFoundError("file not found", file=uri) from None
    except OSError as exc:
        with translated(uri):
            raise exc
    _refuse_irregular(info.st_mode, uri)
    if info.st_dev in _kernel_filesystems():
        raise StorageError("a file of the kernel's /proc or /sys, not data: never read", file=uri)
    return info


def open_local(uri: str) -> io.BufferedReader:
    """A local regular file opened for reading.

    Checked before opening (a device is never opened) and again on the open
    file: a FIFO swapped in between is opened without blocking, then refused.
    """
    local_stat(uri)
    path = local_path(uri)
    with translated(uri):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _refuse_irregular(os.fstat(fd).st_mode, uri)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def pread(fd: int, offset: int, length: int, label: str) -> np.ndarray:
    """``length`` bytes at ``offset`` of an open file (a short file raises :class:`OSError`
    naming ``label``), in a fresh array: unlike a bytearray, not zeroed first."""
    buf = np.empty(length, np.uint8)
    view = memoryview(buf)
    done = 0
    while done < length:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise OSError(f"{label!r} ends before byte {offset + length} (truncated file?)")
        done += got
    return buf


def free_space(uri: str) -> int | None:
    """Bytes free for writing on the filesystem of a local URI (its nearest existing
    directory); None for remote URIs or when it cannot be told."""
    if not is_local(uri):
        return None
    path = os.path.dirname(local_path(uri))
    while path and not os.path.isdir(path):
        path = os.path.dirname(path)
    try:
        stats = os.statvfs(path or ".")
    except (OSError, ValueError):
        return None
    return stats.f_bavail * stats.f_frsize
