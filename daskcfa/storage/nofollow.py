"""Local deletions that no symbolic link leads astray: what retirement deletes (:mod:`.lease`).

Each walks down from a base directory by directory descriptors opened with
``O_NOFOLLOW``, so that no link on the way -- even one swapped in meanwhile --
leads the deletion outside the directory it was meant for; a link found is
never followed, and at most removed itself.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Callable

__all__ = ["delete_below", "delete_directory_below"]

#: The files that make a directory a Zarr store.
_ZARR_METADATA = {".zgroup", ".zarray", "zarr.json"}


def delete_below(base: str, relative: str, zarr: bool) -> bool:
    """Delete ``base/relative`` -- a regular file, or a Zarr store if ``zarr`` -- reached through no
    link. True if deleted or absent; False, deleting nothing, if a link or something else is there."""
    return _at(base, relative, lambda fd, name, mode: _file_or_store(fd, name, mode, zarr))


def delete_directory_below(base: str, relative: str) -> bool:
    """Delete the directory ``base/relative`` and everything in it, reached through no link (links
    inside are removed, not followed). True if deleted or absent; False, deleting nothing, if a link
    or no directory is there."""
    def remove(fd: int, name: str, mode: int) -> bool:
        if not stat.S_ISDIR(mode):
            return False
        _remove_tree(fd, name)
        return True

    return _at(base, relative, remove)


def _at(base: str, relative: str, act: Callable[[int, str, int], bool]) -> bool:
    """``act(directory fd, name, lstat mode)`` on ``base/relative``, walked down to without following a
    link; True if it is absent, False if a component on the way is a link or no directory."""
    *directories, name = relative.split("/")
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in directories:
            try:
                below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    return False  # a link, or not a directory
                raise
            os.close(fd)
            fd = below
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return True
        return bool(act(fd, name, mode))
    finally:
        os.close(fd)


def _file_or_store(fd: int, name: str, mode: int, zarr: bool) -> bool:
    if stat.S_ISREG(mode):
        os.unlink(name, dir_fd=fd)
        return True
    if zarr and stat.S_ISDIR(mode) and _zarr_store(fd, name):
        _remove_tree(fd, name)
        return True
    return False


def _zarr_store(fd: int, name: str) -> bool:
    store = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    try:
        return bool(set(os.listdir(store)) & _ZARR_METADATA)
    finally:
        os.close(store)


def _remove_tree(fd: int, name: str) -> None:
    """Remove the directory ``name`` under ``fd`` and everything in it, following no link."""
    for _, directories, files, here in os.fwalk(name, dir_fd=fd, topdown=False):
        for each in files:
            os.unlink(each, dir_fd=here)
        for each in directories:
            if stat.S_ISLNK(os.stat(each, dir_fd=here, follow_symlinks=False).st_mode):
                os.unlink(each, dir_fd=here)
            else:
                os.rmdir(each, dir_fd=here)
    os.rmdir(name, dir_fd=fd)
