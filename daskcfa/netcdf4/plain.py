"""Plain netCDF files (``format="NETCDF4"``...): netCDF4-python writes them into a temporary file,
which ``close()`` moves into place (locally) or uploads (remote)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Mapping

import netCDF4

from .. import storage
from ..errors import redact
from ..locks import NETCDF_LOCK
from ..write.target import WriteTarget

__all__ = ["PLAIN_FORMATS", "PlainWriter"]

PLAIN_FORMATS = ("NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA")
#: S3netCDF4's ``createVariable`` keywords, which mean nothing in a plain netCDF file (it ignores them too)
_FRAGMENT_KEYWORDS = ("subarray_shape", "max_subarray_size", "aggregate")


class _PlainGroup:
    """A group of a plain netCDF file: netCDF4-python's, taking S3netCDF4's keywords too."""

    def __init__(self, nc: Any) -> None:
        object.__setattr__(self, "_nc", nc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_nc"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._nc, name, value)  # (netCDF4-python's rules; this object's own fields are set in __dict__)

    def __getitem__(self, path: str) -> Any:
        return self._nc[path]

    def createVariable(self, varname: str, datatype: Any, dimensions: Any = (), **options: Any) -> Any:
        for name in _FRAGMENT_KEYWORDS:
            options.pop(name, None)
        with NETCDF_LOCK:
            return self._nc.createVariable(varname, datatype, dimensions, **options)

    def createGroup(self, groupname: str) -> "_PlainGroup":
        with NETCDF_LOCK:
            return _PlainGroup(self._nc.createGroup(groupname))


class PlainWriter(_PlainGroup):
    """A plain netCDF file written by netCDF4-python itself (every call is handed to it).

    The file is built under a temporary name beside its target (locally) or in
    scratch space (remote), and put in place at :meth:`close` in one step: a
    writer killed before ``close()`` leaves the previous file (or none).
    """

    def __init__(self, url: str, mode: str, clobber: bool, format: str,
                 storage_options: Mapping[str, Any] | None, **options: Any) -> None:
        target = WriteTarget.for_netcdf4(url, storage_options, mode, clobber, stem=False)
        url, profile = target.url, target.profile
        local = storage.is_local(url)
        if local:
            final = storage.local_path(url)
            os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
            scratch = storage.temporary_name(final)
        else:
            handle, scratch = tempfile.mkstemp(suffix=".nc", prefix="daskcfa-dataset-")
            os.close(handle)
        if mode in ("a", "r+"):
            if local:
                shutil.copyfile(storage.local_path(url), scratch)
            else:
                with open(scratch, "wb") as f:
                    f.write(storage.read_bytes(url, profile))
        with NETCDF_LOCK:
            nc = netCDF4.Dataset(scratch, "a" if mode in ("a", "r+") else "w", format=format, **options)
        super().__init__(nc)
        self.__dict__.update(_url=url, _profile=profile, _scratch=scratch, _closed=False)

    def close(self) -> None:
        """Close the file and put it in place (upload it, for remote targets)."""
        self._end(commit=True)

    def _end(self, *, commit: bool) -> None:
        if self._closed:
            return
        self.__dict__["_closed"] = True
        try:
            with NETCDF_LOCK:
                self._nc.close()
            if not commit:
                return
            if storage.is_local(self._url):
                storage.commit(self._scratch, storage.local_path(self._url), self._profile)
            else:
                storage.put_file(self._url, self._scratch, self._profile)
        finally:
            if os.path.exists(self._scratch):
                os.unlink(self._scratch)

    def __enter__(self) -> "PlainWriter":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        """An exception inside the ``with`` block abandons the write: the previous file stays."""
        self._end(commit=kind is None)

    def __repr__(self) -> str:
        return f"<daskcfa.netcdf4.PlainWriter {redact(self._url)} ({self._nc.data_model})>"
