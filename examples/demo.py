"""Demo: build a small CFA-netCDF archive on local disk and analyse it with dask.

What it shows, on embedded defaults (no arguments needed):
1. 24 monthly fragment files of a (time, lat, lon) temperature field, plus a
   CF-1.13 aggregation file describing how they tile one array;
2. ``daskcfa.open_cfa`` / ``daskcfa.from_cfa``: a dask array whose chunks are
   the fragments, opened without touching a single fragment file;
3. an analysis (global mean, a one-point time series, a regional climatology)
   on an in-process ``distributed`` cluster, checked against numpy.

Run: ``bash ci/demo`` (or ``python examples/demo.py [--dir DIR]``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import netCDF4
import numpy as np
from distributed import Client, LocalCluster

import daskcfa

NT, NY, NX, PER_FILE = 24, 90, 180, 1


def truth() -> np.ndarray:
    t, y, x = np.meshgrid(np.arange(NT), np.arange(NY), np.arange(NX), indexing="ij")
    return (273.15 + 20 * np.cos(np.deg2rad(y * 2 - 90)) + 5 * np.sin(2 * np.pi * t / 12) + 0.01 * x).astype("f4")


def build_archive(directory: str) -> str:
    """Write fragment files and a CF-1.13 aggregation file; return its path."""
    data = truth()
    os.makedirs(os.path.join(directory, "tas"), exist_ok=True)
    uris = []
    for i in range(0, NT, PER_FILE):
        name = f"tas/tas_{i // PER_FILE:03d}.nc"
        with netCDF4.Dataset(os.path.join(directory, name), "w") as ds:
            ds.createDimension("time", PER_FILE)
            ds.createDimension("lat", NY)
            ds.createDimension("lon", NX)
            time_var = ds.createVariable("time", "f8", ("time",))
            time_var.units, time_var.calendar = "days since 2000-01-01", "360_day"
            time_var[:] = np.arange(i, i + PER_FILE) * 30
            var = ds.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True, complevel=1,
                                    chunksizes=(1, NY, NX))
            var.units, var.standard_name = "K", "air_temperature"
            var[:] = data[i : i + PER_FILE]
        uris.append(name)
    path = os.path.join(directory, "tas.nc")
    with netCDF4.Dataset(path, "w") as ds:
        ds.Conventions = "CF-1.13"
        for dim, size in (("time", NT), ("lat", NY), ("lon", NX), ("f_time", len(uris)), ("f_lat", 1),
                          ("f_lon", 1), ("j", len(uris))):
            ds.createDimension(dim, size)
        ds.createDimension("i", 3)
        lat = ds.createVariable("lat", "f8", ("lat",))
        lat.units, lat[:] = "degrees_north", np.linspace(-89, 89, NY)
        lon = ds.createVariable("lon", "f8", ("lon",))
        lon.units, lon[:] = "degrees_east", np.linspace(0, 358, NX)
        tas = ds.createVariable("tas", "f4", ())
        tas.units, tas.standard_name = "K", "air_temperature"
        tas.aggregated_dimensions = "time lat lon"
        tas.aggregated_data = "map: fragment_map uris: fragment_uris identifiers: fragment_id"
        fmap = ds.createVariable("fragment_map", "i4", ("i", "j"))
        sizes = np.ma.masked_all((3, len(uris)), "i4")
        sizes[0, :] = PER_FILE
        sizes[1, 0], sizes[2, 0] = NY, NX
        fmap[:] = sizes
        furis = ds.createVariable("fragment_uris", str, ("f_time", "f_lat", "f_lon"))
        furis[:] = np.array(uris, dtype=object).reshape(len(uris), 1, 1)
        ds.createVariable("fragment_id", str, ())[...] = "tas"
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where to write the archive (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or tmp
        path = build_archive(directory)
        print(f"archive: {path} ({NT // PER_FILE} fragment files)")

        t0 = time.perf_counter()
        with daskcfa.open_cfa(path) as ds:
            tas = ds["tas"]
            print(f"opened in {1000 * (time.perf_counter() - t0):.1f} ms: {tas}")
            print(f"fragment grid {tas.fragments.shape}; dask chunks along time: {tas.data.chunks[0][:4]}...")

        expected = truth()
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            x = daskcfa.from_cfa(path, "tas")
            mean, series, clim = client.compute([x.mean(), x[:, 45, 90], x[:, 30:60, 40:80].mean(axis=0)], sync=True)
            print(f"global mean          {float(mean):.4f} K (numpy: {expected.mean(dtype='f8'):.4f} K)")
            print(f"series at (45, 90)   {np.round(np.asarray(series)[:6], 3)} ...")
            print(f"regional climatology {clim.shape}, max {float(clim.max()):.3f} K")
            assert np.allclose(mean, expected.mean(dtype="f8"), rtol=1e-5)
            assert np.allclose(series, expected[:, 45, 90])
            assert np.allclose(clim, expected[:, 30:60, 40:80].mean(axis=0), rtol=1e-5)
        print("all results agree with numpy")


if __name__ == "__main__":
    main()
