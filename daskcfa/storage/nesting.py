"""How deep a netCDF-4 file nests its groups, found before netCDF4-python opens it.

netCDF4-python builds a file's groups recursively when it opens the file: a
few hundred nested levels raise RecursionError inside its constructor, which
leaves the library in a state where a later open may crash the process. HDF5
walks the group tree without recursion in Python, so the depth is measured
here first and a file nested deeper than ``daskcfa.limits.max-group-depth``
is refused before netCDF4-python sees it.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from ..lazy import h5py
from ..limits import check_group_depth

__all__ = ["HDF5_SIGNATURE", "check_nesting"]

#: The first bytes of an HDF5 (netCDF-4) file.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_IMAGES = itertools.count()


def check_nesting(source: str | os.PathLike[str] | Any, *, label: str) -> None:
    """Refuse a netCDF-4 file (a path, or its bytes in memory) whose groups nest too deep.

    Anything that is not HDF5 (netCDF-3 has no groups) passes untouched;
    netCDF4-python then reports what it makes of it.
    """
    # (the default close degree: a file the direct reader holds open is shared, never closed under it)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source, "rb") as f:
                if f.read(8) != HDF5_SIGNATURE:
                    return
        except OSError:
            return
        name = os.fsencode(source)
    else:
        image = bytes(memoryview(source)[:8])
        if image != HDF5_SIGNATURE:
            return
        fapl.set_fapl_core(backing_store=False)
        fapl.set_file_image(bytes(source) if not isinstance(source, bytes) else source)
        name = f"daskcfa-nesting-{next(_IMAGES)}".encode()
    try:
        fid = h5py.h5f.open(name, h5py.h5f.ACC_RDONLY, fapl)
    except (OSError, ValueError, RuntimeError):
        return  # damaged: netCDF4-python will say so
    deepest = [0]

    def visit(path: bytes, info: Any) -> None:  # "a/b" is a group 2 deep, or a variable in one 1 deep
        deepest[0] = max(deepest[0], path.count(b"/") + (info.type == h5py.h5o.TYPE_GROUP))

    try:
        h5py.h5o.visit(fid, visit, info=True)
    except (OSError, ValueError, RuntimeError, KeyError):
        return
    finally:
        fid.close()
    check_group_depth(deepest[0], file=label)
