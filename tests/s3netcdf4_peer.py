"""Run S3netCDF4 2.1rc1 in its own venv (``.venv-s3nc``), driven by tests/formats/test_s3netcdf4_interop.py.

    python s3netcdf4_peer.py read PATH VARIABLE OUT.npy
    python s3netcdf4_peer.py write PATH FORMAT CFA_VERSION VARIABLE IN.npy SUBARRAY_SHAPE

``read`` saves what S3netCDF4 returns for the whole variable (values and mask).
``write`` writes IN.npy (dims ``time lat lon`` with float coordinates) as
S3netCDF4 writes it, one sub-array per assignment (a ``__setitem__`` spanning
several sub-arrays fails in this version). ``VARIABLE`` may be ``/group/tas``.
S3netCDF4 takes its S3 hosts from ``$S3_NC_CONFIG``.
"""

import sys

import numpy as np
from S3netCDF4._s3netCDF4 import s3Dataset as Dataset

DIMS = ("time", "lat", "lon")


def read(path, variable, out):
    ds = Dataset(path, "r")
    try:
        owner = ds
        *groups, name = [p for p in variable.split("/") if p]
        for group in groups:
            owner = owner.groups[group]
        values = np.ma.asarray(owner.variables[name][:])
    finally:
        ds.close()
    np.savez(out, data=values.data, mask=np.ma.getmaskarray(values))


def write(path, fmt, version, variable, source, subarray):
    data = np.ma.asarray(np.load(source))
    shape = np.array([int(n) for n in subarray.split(",")])
    ds = Dataset(path, "w", format=fmt, cfa_version=version)
    *groups, name = [p for p in variable.split("/") if p]
    owner = ds
    for group in groups:
        owner = owner.createGroup(group)
    for dim, size in zip(DIMS, data.shape):
        owner.createDimension(dim, size)
        coord = owner.createVariable(dim, "f8", (dim,))
        coord[:] = np.arange(size, dtype="f8")
    var = owner.createVariable(name, data.dtype, DIMS, fill_value=-999.0, subarray_shape=shape)
    var.units = "K"
    starts = [range(0, n, s) for n, s in zip(data.shape, shape)]
    for corner in np.ndindex(*[len(r) for r in starts]):
        where = tuple(slice(r[i], r[i] + s) for r, i, s in zip(starts, corner, shape))
        var[where] = data[where]
    ds.close()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"read": read, "write": write}[command](*args)
