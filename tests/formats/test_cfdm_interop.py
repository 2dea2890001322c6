"""Aggregations written by cfdm (the CF reference implementation) read by daskcfa.

The fragment files are written here with netCDF4-python from numpy ground
truth; cfdm reads them, concatenates the fields (one dask chunk per fragment,
as ``cfa_write="field"`` arranges) and writes a CF-1.13 aggregation file with
``cfa={"constructs": "field", "uri": ...}``. daskcfa must then return the
ground truth, with one chunk per fragment. cfdm is used only as a writer:
the expected values always come from numpy.
"""

from __future__ import annotations

import os
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import assert_matches

cfdm = pytest.importorskip("cfdm", reason="cfdm (and its UDUNITS library) is needed to write the aggregation files")

pytestmark = pytest.mark.usefixtures("other_cwd")

LAT = np.linspace(-60.0, 60.0, 6)
LON = np.arange(8) * 45.0


def write_cf_fragment(path: Path, data: np.ma.MaskedArray, t0: int, lat: np.ndarray, *, name="tas",
                      units="K", fill=None, packing=None, dtype="f4"):
    """One self-describing CF fragment: time/lat/lon coordinates + the data variable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(str(path), "w") as ds:
        ds.Conventions = "CF-1.12"
        nt, ny, nx = data.shape
        ds.createDimension("time", nt)
        ds.createDimension("lat", ny)
        ds.createDimension("lon", nx)
        t = ds.createVariable("time", "f8", ("time",))
        t[:] = np.arange(t0, t0 + nt, dtype="f8")
        t.units, t.standard_name, t.calendar = "days since 2000-01-01", "time", "standard"
        y = ds.createVariable("lat", "f8", ("lat",))
        y[:] = lat
        y.units, y.standard_name = "degrees_north", "latitude"
        x = ds.createVariable("lon", "f8", ("lon",))
        x[:] = LON[:nx]
        x.units, x.standard_name = "degrees_east", "longitude"
        if packing is not None:
            sf, off = packing
            v = ds.createVariable(name, "i2", ("time", "lat", "lon"), fill_value=np.int16(-32767))
            v.scale_factor, v.add_offset = sf, off
        else:
            v = ds.createVariable(name, dtype, ("time", "lat", "lon"), fill_value=fill)
        v.units, v.standard_name = units, "air_temperature"
        v[...] = data
    return path


def aggregate(fragment_grid, out: Path, *, uri="relative", fmt="NETCDF4", group=None):
    """cfdm: read fragments (one chunk each), concatenate along lat then time, write an aggregation."""
    rows = []
    for row in fragment_grid:
        fields = [cfdm.read(str(p), cfa_write="field")[0] for p in row]
        rows.append(cfdm.Field.concatenate(fields, axis="latitude") if len(fields) > 1 else fields[0])
    f = cfdm.Field.concatenate(rows, axis="time") if len(rows) > 1 else rows[0]
    if group:
        f.nc_set_variable_groups([group])
    out.parent.mkdir(parents=True, exist_ok=True)
    cfdm.write(f, str(out), fmt=fmt, cfa={"constructs": "field", "uri": uri})
    return out


def make(tmp_path, time_sizes=(2, 3, 1), lat_sizes=(6,), *, masked=0.0, seed=0, **frag_kw):
    """Write the fragment grid for a (sum(time), sum(lat), 8) truth; return truth and the file grid."""
    rng = np.random.default_rng(seed)
    shape = (sum(time_sizes), sum(lat_sizes), len(LON))
    truth = np.ma.MaskedArray(rng.uniform(200, 320, size=shape).astype("f4"),
                              mask=rng.random(shape) < masked if masked else False)
    grid, t0 = [], 0
    for i, nt in enumerate(time_sizes):
        row, y0 = [], 0
        for j, ny in enumerate(lat_sizes):
            block = truth[t0:t0 + nt, y0:y0 + ny]
            row.append(write_cf_fragment(tmp_path / "frags" / f"tas_{i}_{j}.nc", block, t0, LAT[y0:y0 + ny], **frag_kw))
            y0 += ny
        grid.append(row)
        t0 += nt
    return truth, grid


def uris_in(path: Path, group_var="fragment_uris"):
    with netCDF4.Dataset(str(path)) as ds:
        v = ds[group_var]
        data = v[...]
        if v.dtype == np.dtype("S1"):
            data = netCDF4.chartostring(data)
        return [str(u) for u in np.ravel(data)]


def test_cfdm_relative_uris_along_time(tmp_path):
    truth, grid = make(tmp_path)
    agg = aggregate(grid, tmp_path / "agg" / "tas_agg.nc", uri="relative")
    assert all(u.startswith("../frags/") for u in uris_in(agg)), "cfdm should have written relative URIs"
    x = daskcfa.from_cfa(str(agg), "tas")
    assert x.chunks == ((2, 3, 1), (6,), (8,))
    assert x.dtype == np.float32
    assert_matches(x.compute(), truth)
    assert_matches(daskcfa.from_cfa(str(agg)).compute(), truth)  # the only aggregated variable


def test_cfdm_absolute_uris_two_dimensional_grid(tmp_path):
    truth, grid = make(tmp_path, time_sizes=(4, 2), lat_sizes=(1, 2, 3))
    agg = aggregate(grid, tmp_path / "tas_agg.nc", uri="absolute")
    assert all("://" in u or u.startswith("/") for u in uris_in(agg))
    x = daskcfa.from_cfa(str(agg), "tas")
    assert x.chunks == ((4, 2), (1, 2, 3), (8,))
    assert_matches(x.compute(), truth)
    assert_matches(x[::-1, 2:5, -3].compute(), truth[::-1, 2:5, -3])


def test_cfdm_netcdf3_char_arrays(tmp_path):
    truth, grid = make(tmp_path, time_sizes=(3, 3), lat_sizes=(2, 4))
    agg = aggregate(grid, tmp_path / "agg3.nc", uri="relative", fmt="NETCDF3_CLASSIC")
    with netCDF4.Dataset(str(agg)) as ds:
        assert ds.data_model == "NETCDF3_CLASSIC"
        assert ds["fragment_uris"].dtype == np.dtype("S1")
    x = daskcfa.from_cfa(str(agg), "tas")
    assert x.chunks == ((3, 3), (2, 4), (8,))
    assert_matches(x.compute(), truth)


def test_cfdm_masked_fragments(tmp_path):
    truth, grid = make(tmp_path, masked=0.25, fill=np.float32(-999.0))
    agg = aggregate(grid, tmp_path / "masked.nc")
    x = daskcfa.from_cfa(str(agg), "tas")
    got = x.compute()
    assert np.ma.getmaskarray(got).sum() == np.ma.getmaskarray(truth).sum() > 0
    assert_matches(got, truth)
    filled = daskcfa.from_cfa(str(agg), "tas", mask=False).compute()
    np.testing.assert_array_equal(np.asarray(filled), truth.filled(np.float32(-999.0)))


def test_cfdm_packed_fragments(tmp_path):
    truth, grid = make(tmp_path, packing=(0.01, 260.0))
    # netCDF4 packed the truth; what the fragments mean is the rounded value.
    expected = np.round((truth.astype("f8") - 260.0) / 0.01) * 0.01 + 260.0
    agg = aggregate(grid, tmp_path / "packed.nc")
    got = daskcfa.from_cfa(str(agg), "tas").compute()
    assert_matches(got, expected, rtol=1e-6)


def test_cfdm_one_time_step_per_fragment(tmp_path):
    truth, grid = make(tmp_path, time_sizes=(1,) * 5, lat_sizes=(3, 3))
    agg = aggregate(grid, tmp_path / "steps.nc")
    x = daskcfa.from_cfa(str(agg), "tas")
    assert x.chunks == ((1,) * 5, (3, 3), (8,))
    assert_matches(x.compute(), truth)
    assert_matches(x[:, 4, 1].compute(), truth[:, 4, 1])


def test_cfdm_field_in_group(tmp_path):
    """cfdm puts the variable in /forecast and the instructions in the root group."""
    truth, grid = make(tmp_path, time_sizes=(2, 4))
    agg = aggregate(grid, tmp_path / "grouped.nc", group="forecast")
    with netCDF4.Dataset(str(agg)) as ds:
        assert "tas" in ds.groups["forecast"].variables
    x = daskcfa.from_cfa(str(agg), "/forecast/tas")
    assert x.chunks == ((2, 4), (6,), (8,))
    assert_matches(x.compute(), truth)


def test_cfdm_output_through_open_cfa(tmp_path):
    truth, grid = make(tmp_path, time_sizes=(2, 4), lat_sizes=(2, 4))
    agg = aggregate(grid, tmp_path / "ds.nc")
    with daskcfa.open_cfa(str(agg)) as ds:
        names = set(ds.variables)
        assert {"tas", "time", "lat", "lon"} <= names
        assert not {n for n in names if n.startswith("fragment_")}, names
        v = ds.variables["tas"]
        assert tuple(v.dims) == ("time", "lat", "lon")
        assert v.attrs["units"] == "K" and v.attrs["standard_name"] == "air_temperature"
        assert tuple(v.fragments.shape) == (2, 2, 1)
        assert_matches(v[...], truth)
        assert_matches(v[1:3, ::-2], truth[1:3, ::-2])
        np.testing.assert_array_equal(np.asarray(ds.variables["time"][...]), np.arange(6.0))
        np.testing.assert_array_equal(np.asarray(ds.variables["lat"][...]), LAT)
        np.testing.assert_array_equal(np.asarray(ds.variables["lon"][...]), LON)


def test_cfdm_output_moved_with_its_fragments(tmp_path):
    """cfdm's relative URIs still resolve after moving the whole tree."""
    truth, grid = make(tmp_path / "orig")
    agg = aggregate(grid, tmp_path / "orig" / "agg" / "a.nc", uri="relative")
    os.rename(tmp_path / "orig", tmp_path / "moved")
    got = daskcfa.from_cfa(str(tmp_path / "moved" / "agg" / "a.nc"), "tas").compute()
    assert_matches(got, truth)


# ---------------------------------------------------------------------------
# daskcfa writes CF-1.13 -> cfdm and CFAPyX read (issue 13 item 14)
# ---------------------------------------------------------------------------
TRUTH_SHAPE = (6, 4, 5)
COORDS = {"time": (np.arange(6.0), {"units": "days since 2000-01-01", "standard_name": "time"}),
          "lat": (np.linspace(-45.0, 45.0, 4), {"units": "degrees_north", "standard_name": "latitude"}),
          "lon": (np.arange(5.0) * 72, {"units": "degrees_east", "standard_name": "longitude"})}


def _truth() -> np.ma.MaskedArray:
    rng = np.random.default_rng(13)
    values = 250.0 + 0.5 * rng.integers(0, 200, TRUTH_SHAPE)  # exact in float32 and in the packing below
    return np.ma.MaskedArray(values.astype("f4"), mask=rng.random(TRUTH_SHAPE) < 0.15)


def _written(tmp_path: Path, uris: str, packed: bool) -> tuple[str, np.ma.MaskedArray]:
    truth = _truth()
    url = str(tmp_path / "archive" / "tas.nc")
    if packed:  # xarray packs (int16, scale_factor/add_offset): the fragments hold the packed values
        xr = pytest.importorskip("xarray")
        da_ = xr.DataArray(truth.astype("f8").filled(np.nan), dims=("time", "lat", "lon"), name="tas",
                           coords={k: (k, v, a) for k, (v, a) in COORDS.items()}, attrs={"units": "K"})
        da_.encoding = {"dtype": "int16", "scale_factor": 0.5, "add_offset": 250.0, "_FillValue": np.int16(-32767)}
        daskcfa.to_cfa(da_.to_dataset(), url, fragment_shape={"time": 2, "lat": 2}, uris=uris)
    else:
        daskcfa.to_cfa(truth, url, variable="tas", dims=("time", "lat", "lon"), attrs={"units": "K"}, coords=COORDS,
                       fragment_shape=(2, 2, 5), uris=uris)
    return url, truth


def _read_with_cfdm(url: str) -> np.ma.MaskedArray:
    fields = [f for f in cfdm.read(url) if f.nc_get_variable(None) == "tas"]
    assert len(fields) == 1, fields
    return np.ma.asarray(fields[0].array)


def _read_with_cfapyx(url: str) -> np.ma.MaskedArray:
    xr = pytest.importorskip("xarray")
    pytest.importorskip("cfapyx", reason="CFAPyX (pip install cfapyx) is needed for this interop test")
    with xr.open_dataset(url, engine="CFA") as ds:
        values = np.asarray(ds["tas"].values)
    return np.ma.masked_invalid(values)


READERS = {"cfdm": _read_with_cfdm, "cfapyx": _read_with_cfapyx}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("packed", [False, True], ids=["float", "packed"])
@pytest.mark.parametrize("uris, where", [("relative", "archive"), ("absolute", "archive"), ("absolute", "elsewhere")])
def test_daskcfa_cf113_read_by_peers(tmp_path, monkeypatch, reader, packed, uris, where):
    url, truth = _written(tmp_path, uris, packed)
    # the peers resolve relative URIs against the working directory: relative archives only from their own
    monkeypatch.chdir(Path(url).parent if where == "archive" else tmp_path)
    got = READERS[reader](url)
    assert_matches(got, truth, rtol=0)
    assert_matches(daskcfa.from_cfa(url).compute(), truth, rtol=0)


def test_absolute_uris_are_file_uris_and_fragments_declare_conventions(tmp_path):
    url, _ = _written(tmp_path, "absolute", packed=True)
    with netCDF4.Dataset(url) as nc:
        uris = [str(u) for u in np.ravel(nc["tas_uris"][...])]
        # the fragments' fill value, unpacked type: what CFAPyX leaves at their missing points
        assert nc["tas"].dtype == np.float64 and nc["tas"]._FillValue == -32767.0
    assert all(u.startswith("file:///") for u in uris), uris
    fragment = daskcfa.storage.to_local_path(uris[0])
    with netCDF4.Dataset(fragment) as nc:
        assert nc.Conventions.startswith("CF-")
        assert nc["tas"].dtype == np.int16 and nc["tas"].scale_factor == 0.5
