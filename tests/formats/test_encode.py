"""The encoders (daskcfa.formats.encode): every dialect × netCDF file format.

Each test builds an AggregationDataset in memory, writes it, and parses it
back with daskcfa's own dialect parsers: what comes back must be what was
written. The layouts are also checked against what the reference tools
write (cfdm for CF-1.13, S3netCDF4 for CFA-0.5/0.4), and cfdm must read a
CF-1.13 file written here to the right values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

import daskcfa
from daskcfa.errors import CFAFormatError
from daskcfa.formats import aggregated_variables
from daskcfa.formats.netcdf import read_strings
from daskcfa.formats.encode import FILE_FORMATS, WRITE_FORMATS, encode_aggregation
from daskcfa.storage import put_atomic
from daskcfa.model import (
    AggregatedVariable,
    AggregationDataset,
    Dimension,
    FragmentGrid,
    Fragments,
    PlainVariable,
)

ALLOWED = [(f, ff) for f in WRITE_FORMATS for ff in FILE_FORMATS if f != "CFA-0.5" or ff == "NETCDF4"]
FORBIDDEN = [(f, ff) for f in WRITE_FORMATS for ff in FILE_FORMATS if (f, ff) not in ALLOWED]
LAT_NAMES = ["south", "mid-south", "mid-north", "nörth"]


def aggregated(name: str, dims: tuple[str, ...], sizes: Any, uris: Any, identifiers: Any, *,
               dtype: str = "f4", attrs: dict[str, Any] | None = None,
               unique_values: np.ma.MaskedArray | None = None) -> AggregatedVariable:
    grid = FragmentGrid.from_sizes(sizes)
    fragments = Fragments(
        grid,
        uris=None if uris is None else np.array(uris, dtype=object),
        identifiers=None if identifiers is None else np.array(identifiers, dtype=object),
        unique_values=unique_values,
    )
    return AggregatedVariable(name, dims, np.dtype(dtype), dict(attrs or {}), fragments, dialect="")


def example(fmt: str, file_format: str) -> AggregationDataset:
    """Two root aggregated variables with ragged grids (one with a missing fragment where the
    dialect allows, one with per-fragment identifiers and, in CFA-0.6.2, alternative URIs),
    one in a group (netCDF-4), scalar aggregated data, unique values (CF-1.13), coordinates."""
    missing = fmt != "CF-1.13"
    tas_uris = np.array([[[f"frags/tas.{i}.{j}.nc"] for j in range(2)] for i in range(3)], dtype=object)
    if missing:
        tas_uris[1, 0, 0] = ""
    pr_uris: Any = [[f"frags/pr.{i}.{j}.nc" for j in range(2)] for i in range(2)]
    if fmt == "CFA-0.6.2":
        pr_uris = [[[u, f"s3://bucket/{u}" if (i + j) % 2 else ""] for j, u in enumerate(row)]
                   for i, row in enumerate(pr_uris)]
    ds = AggregationDataset(
        attrs={"Conventions": "CF-1.8, ACDD-1.3", "title": "encode test"},
        dimensions=[Dimension("/time", 6, unlimited=True), Dimension("/lat", 4), Dimension("/lon", 3)],
        variables=[
            PlainVariable("/time", ("time",), np.dtype("f8"), {"units": "days since 2000-01-01", "axis": "T"},
                          np.arange(6.0)),
            PlainVariable("/lat", ("lat",), np.dtype("f4"), {"units": "degrees_north", "_FillValue": np.float32(-99)},
                          np.ma.MaskedArray([-45.0, -15.0, 15.0, 45.0], mask=[0, 0, 1, 0]).astype("f4")),
            PlainVariable("/lat_name", ("lat",), np.dtype(object), {"long_name": "band"},
                          np.array(LAT_NAMES, dtype=object)),
        ],
        aggregated=[
            aggregated("/tas", ("time", "lat", "lon"), [(2, 3, 1), (1, 3), (3,)], tas_uris, "tas",
                       attrs={"units": "K", "standard_name": "air_temperature", "_FillValue": np.float32(-999)}),
            aggregated("/pr", ("time", "lon"), [(3, 3), (1, 2)], pr_uris, [["pr0", "pr1"], ["pr2", "pr3"]],
                       dtype="f8", attrs={"units": "kg m-2 s-1", "scale_factor": 2.0}),
        ],
    )
    if fmt != "CFA-0.5":  # S3netCDF4's group layout has no scalar partition matrix
        ds.aggregated.append(aggregated("/sc", (), [], ["frags/sc.nc"], "sc", dtype="i2", attrs={"units": "1"}))
    if fmt == "CF-1.13":
        values = np.ma.MaskedArray([280.0, 0.0], mask=[False, True])
        ds.aggregated.append(aggregated("/uv", ("lat",), [(1, 3)], None, None, unique_values=values,
                                        attrs={"units": "K"}))
    if file_format == "NETCDF4":
        ds.group_attrs["/g"] = {"comment": "a group"}
        ds.dimensions.append(Dimension("/g/x", 5))
        ds.variables.append(PlainVariable("/g/x", ("x",), np.dtype("i4"), {}, np.arange(5, dtype="i4")))
        ds.aggregated.append(aggregated("/g/tas", ("time", "x"), [(6,), (2, 3)],
                                        [["g/tas.0.0.nc", "g/tas.0.1.nc"]], "tas", attrs={"units": "K"}))
    return ds


def write_aggregation(path: Any, dataset: AggregationDataset, **options: Any) -> None:
    """Encode ``dataset`` and put it at ``path`` as the writers do (whole or not at all)."""
    put_atomic(str(path), encode_aggregation(dataset, **options))


def assert_attrs_equal(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert np.array_equal(np.asarray(got[key]), np.asarray(value)), key


def assert_round_trip(path: Path, dataset: AggregationDataset) -> dict[str, AggregatedVariable]:
    """Parse back every aggregated variable and compare it with what was written."""
    with netCDF4.Dataset(str(path)) as nc:
        source = str(path)
        parsed = aggregated_variables(nc, source)
        assert set(parsed) == {av.name for av in dataset.aggregated}
        for written in dataset.aggregated:
            got = parsed[written.name]
            assert got.dims == written.dims
            assert got.dtype == written.dtype
            assert_attrs_equal(got.attrs, written.attrs)
            assert got.fragments.grid.sizes == written.fragments.grid.sizes
            for ref in written.fragments:
                back = got.fragments[ref.index]
                assert back.uris == ref.uris, ref.index
                assert back.is_missing == ref.is_missing, ref.index
                if not ref.is_missing and ref.value is None:
                    assert back.identifier == ref.identifier, ref.index
                assert back.value == ref.value, ref.index
        assert {n: len(d) for n, d in nc.dimensions.items() if n in ("time", "lat", "lon")} == \
               {"time": 6, "lat": 4, "lon": 3}
        np.testing.assert_array_equal(nc["time"][:], np.arange(6.0))
        lat = nc["lat"][:]
        assert lat.mask.tolist() == [False, False, True, False] and lat[0] == -45.0
        assert read_strings(nc["lat_name"]).tolist() == LAT_NAMES
        if "g" in nc.groups:
            assert nc["/g"].comment == "a group"
            np.testing.assert_array_equal(nc["/g/x"][:], np.arange(5))
        return parsed


@pytest.mark.parametrize("fmt,file_format", ALLOWED)
def test_round_trip(tmp_path, fmt, file_format):
    dataset = example(fmt, file_format)
    path = tmp_path / "agg.nc"
    write_aggregation(str(path), dataset, format=fmt, file_format=file_format)
    with netCDF4.Dataset(str(path)) as nc:
        assert nc.data_model == file_format
        conventions = nc.Conventions
    assert conventions == {
        "CF-1.13": "CF-1.13 ACDD-1.3",
        "CFA-0.6.2": "CF-1.11 CFA-0.6.2 ACDD-1.3",
        "CFA-0.5": "CF-1.8 ACDD-1.3 CFA-0.5",
        "CFA-0.4": "CF-1.8 ACDD-1.3 CFA-0.4",
    }[fmt]
    parsed = assert_round_trip(path, dataset)
    assert {av.dialect for av in parsed.values()} == {"CFA-0.6" if fmt == "CFA-0.6.2" else fmt}
    image = encode_aggregation(dataset, format=fmt, file_format=file_format)
    # Read back from a file as an uploaded object would be: netCDF-C cannot open small
    # netCDF-3 images with a header over ~1 KB from memory (a reader-side limitation).
    (tmp_path / "image.nc").write_bytes(image)
    assert_round_trip(tmp_path / "image.nc", dataset)
    if file_format.startswith("NETCDF3"):
        assert image == path.read_bytes()  # netCDF-3 images are the file, byte for byte


@pytest.mark.parametrize("fmt,file_format", FORBIDDEN)
def test_forbidden_combinations_raise(tmp_path, fmt, file_format):
    path = tmp_path / "never.nc"
    with pytest.raises(CFAFormatError, match="NETCDF4"):
        write_aggregation(str(path), example(fmt, "NETCDF4"), format=fmt, file_format=file_format)
    with pytest.raises(ValueError):
        encode_aggregation(example(fmt, "NETCDF4"), format=fmt, file_format=file_format)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("file_format", ["NETCDF4_CLASSIC", "NETCDF3_CLASSIC"])
def test_groups_need_netcdf4(file_format):
    with pytest.raises(CFAFormatError, match="no groups.*/g"):
        encode_aggregation(example("CF-1.13", "NETCDF4"), file_format=file_format)


def test_unknown_formats():
    with pytest.raises(ValueError, match="unknown aggregation format"):
        encode_aggregation(AggregationDataset(), format="NCA")
    with pytest.raises(ValueError, match="unknown netCDF file format"):
        encode_aggregation(AggregationDataset(), file_format="NETCDF5")


def test_what_a_dialect_cannot_express():
    base = example("CF-1.13", "NETCDF4")
    with_missing = example("CFA-0.4", "NETCDF4")
    with pytest.raises(CFAFormatError, match=r"wholly missing.*fragment \(1, 0, 0\)"):
        encode_aggregation(with_missing, format="CF-1.13")
    alternatives = example("CFA-0.6.2", "NETCDF4")
    for fmt in ("CF-1.13", "CFA-0.4", "CFA-0.5"):
        with pytest.raises(CFAFormatError, match="alternative URIs need CFA-0.6.2"):
            encode_aggregation(AggregationDataset(dimensions=alternatives.dimensions,
                                                  aggregated=[alternatives.aggregated[1]]), format=fmt)
    for fmt in ("CFA-0.6.2", "CFA-0.4"):
        with pytest.raises(CFAFormatError, match="only be written as CF-1.13"):
            encode_aggregation(AggregationDataset(dimensions=base.dimensions, aggregated=[base.aggregated[3]]),
                               format=fmt)
    with pytest.raises(CFAFormatError, match="scalar"):
        encode_aggregation(AggregationDataset(aggregated=[base.aggregated[2]]), format="CFA-0.5")
    wrong = AggregationDataset(dimensions=[Dimension("/time", 6)], aggregated=[base.aggregated[1]])
    with pytest.raises(CFAFormatError, match="'lon' is not a dimension"):
        encode_aggregation(wrong)
    wrong.dimensions = [Dimension("/time", 7), Dimension("/lon", 3)]
    with pytest.raises(CFAFormatError, match="span 6 along 'time', but the dimension has size 7"):
        encode_aggregation(wrong)


@pytest.mark.parametrize("fmt", ["CFA-0.5", "CFA-0.4"])
def test_partition_dialects_refuse_unrecoverable_grids(fmt):
    """Two neighbouring slabs wholly missing: a reader would have to guess their sizes."""
    uris = np.array([["a.nc"], [""], [""], ["d.nc"]], dtype=object)
    av = aggregated("/v", ("t", "x"), [(1, 1, 4, 1), (2,)], uris, "v")
    ds = AggregationDataset(dimensions=[Dimension("/t", 7), Dimension("/x", 2)], aggregated=[av])
    with pytest.raises(CFAFormatError, match="fragment sizes.*recovered"):
        encode_aggregation(ds, format=fmt)
    av.fragments.uris[2, 0] = "c.nc"  # one slab missing: its bounds are those of its neighbours
    with netCDF4.Dataset("m", memory=encode_aggregation(ds, format=fmt)) as nc:
        assert aggregated_variables(nc, "m")["/v"].fragments.grid.sizes == ((1, 1, 4, 1), (2,))


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "agg.nc"
    write_aggregation(path, example("CF-1.13", "NETCDF4"))
    before = path.read_bytes()
    bad = example("CF-1.13", "NETCDF4")
    bad.dimensions = [Dimension(d.name, d.size, unlimited=True) if d.name == "/lon" else d for d in bad.dimensions]
    with pytest.raises(CFAFormatError, match="unlimited dimension '/lon'"):
        write_aggregation(path, bad)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["agg.nc"]


def dump(path: Path) -> dict[str, Any]:
    """Variables of a file: name -> (dtype, dims, attrs, raw values)."""
    out = {}
    with netCDF4.Dataset(str(path)) as nc:
        nc.set_auto_maskandscale(False)
        for group in [nc, *nc.groups.values()]:
            for var in group.variables.values():
                out[var.name if group is nc else f"{group.path}/{var.name}"] = (
                    var.dtype, var.dimensions, {k: var.getncattr(k) for k in var.ncattrs()}, var[...])
        out["dimensions"] = {name: len(d) for name, d in nc.dimensions.items()}
    return out


def test_cf113_layout_like_cfdm(tmp_path):
    """Map int32 (ndim, max) padded with the netCDF default fill and no _FillValue; one name
    per instruction variable, no clash between /tas and /g/tas; char arrays in netCDF-3."""
    path = tmp_path / "a.nc"
    write_aggregation(path, example("CF-1.13", "NETCDF4"))
    v = dump(path)
    assert v["tas"][2]["aggregated_data"] == "map: tas_map uris: tas_uris identifiers: tas_identifiers"
    assert v["tas"][2]["aggregated_dimensions"] == "time lat lon"
    dtype, dims, attrs, values = v["tas_map"]
    assert dtype == np.int32 and dims == ("f_map_j3", "f_map_i3") and attrs == {}
    assert values.tolist() == [[2, 3, 1], [1, 3, -2147483647], [3, -2147483647, -2147483647]]
    assert v["tas_uris"][1] == ("f_time", "f_lat", "f_lon") and v["tas_uris"][3][1, 1, 0] == "frags/tas.1.1.nc"
    assert v["tas_identifiers"][1] == () and v["tas_identifiers"][3] == "tas"
    assert v["pr"][2]["aggregated_data"] == "map: pr_map uris: pr_uris identifiers: pr_identifiers"
    assert v["pr_uris"][1] == ("f_time_1", "f_lon_1")  # 2 fragments along time and lon, not 3 and 1
    assert v["pr_identifiers"][1] == ("f_time_1", "f_lon_1")
    assert v["uv_unique_values"][1] == ("f_lat",)  # shared with tas
    assert v["sc_map"][1] == () and v["sc_map"][3] == 1 and v["sc_uris"][1] == ()
    assert v["uv"][2]["aggregated_data"] == "map: uv_map unique_values: uv_unique_values"
    assert v["uv_unique_values"][2] == {"_FillValue": np.float32(netCDF4.default_fillvals["f4"])}
    assert v["/g/tas"][2]["aggregated_data"] == "map: tas_map_1 uris: tas_uris_1 identifiers: tas_identifiers_1"
    assert "f_time_2" in dump(path)["/g/tas_uris_1"][1]

    path3 = tmp_path / "a3.nc"
    write_aggregation(path3, example("CF-1.13", "NETCDF3_CLASSIC"), file_format="NETCDF3_CLASSIC")
    v3 = dump(path3)
    assert v3["tas_uris"][0] == np.dtype("S1") and v3["tas_uris"][1] == ("f_time", "f_lat", "f_lon", "strlen16")
    assert v3["tas_identifiers"][1] == ("strlen3",)
    assert v3["lat_name"][1] == ("lat", "strlen9")  # the longest, "mid-south", has 9 bytes


def test_cfa062_layout_like_cf_python(tmp_path):
    path = tmp_path / "a.nc"
    write_aggregation(path, example("CFA-0.6.2", "NETCDF4"), format="CFA-0.6.2")
    v = dump(path)
    assert v["tas"][2]["aggregated_data"] == \
        "address: tas_address file: tas_file format: tas_format location: tas_location"
    assert v["tas_format"][1] == () and v["tas_format"][3] == "nc"
    assert v["tas_address"][1] == ("f_time", "f_lat", "f_lon")  # per fragment: one is missing
    assert v["tas_address"][3][1, 0, 0] == "" and v["tas_file"][3][1, 0, 0] == ""
    assert v["pr_file"][1] == ("f_time_1", "f_lon_1", "f_alternatives")
    assert v["pr_file"][3][0, 1].tolist() == ["frags/pr.0.1.nc", "s3://bucket/frags/pr.0.1.nc"]
    assert v["sc_location"][1] == ("f_map_i1",) and v["sc_location"][3].tolist() == [1]


def test_cfa05_layout_like_s3netcdf4(tmp_path):
    path = tmp_path / "a.nca"
    write_aggregation(path, example("CFA-0.5", "NETCDF4"), format="CFA-0.5")
    v = dump(path)
    assert v["tas"][2] == {"units": "K", "standard_name": "air_temperature", "_FillValue": np.float32(-999),
                           "cf_role": "cfa_variable", "cfa_dimensions": "time lat lon", "cfa_group": "cfa_tas"}
    assert v["/g/tas"][2]["cfa_group"] == "cfa_tas_1"
    g = "/cfa_tas"
    assert v[f"{g}/pmshape"][3].tolist() == [3, 2, 1]
    assert v[f"{g}/pmdimensions"][3] == "time, lat, lon"
    assert v[f"{g}/location"][1] == ("time", "lat", "lon", "ndimensions", "bounds")
    assert v[f"{g}/location"][3][2, 1, 0].tolist() == [[5, 6], [1, 4], [0, 3]]  # end exclusive
    assert (v[f"{g}/location"][3][1, 0, 0] == -2147483647).all()  # never written
    assert v[f"{g}/shape"][3][2, 1, 0].tolist() == [1, 3, 3]
    assert v[f"{g}/file"][3][1, 0, 0] == "" and v[f"{g}/ncvar"][3][0, 0, 0] == "tas"
    assert v[f"{g}/format"][3][0, 0, 0] == "NETCDF4"
    with netCDF4.Dataset(str(path)) as nc:
        assert nc["cfa_tas"].dimensions["time"].size == 3 and nc["cfa_tas"]["location"][1, 0, 0].mask.all()


@pytest.mark.parametrize("file_format", ["NETCDF3_CLASSIC", "NETCDF4"])
def test_cfa04_layout_like_s3netcdf4(tmp_path, file_format):
    path = tmp_path / "a.nca"
    write_aggregation(path, example("CFA-0.4", file_format), format="CFA-0.4", file_format=file_format)
    with netCDF4.Dataset(str(path)) as nc:
        attrs = {k: nc["tas"].getncattr(k) for k in nc["tas"].ncattrs()}
        scalar = json.loads(nc["sc"].cfa_array)
    assert attrs["cf_role"] == "cfa_variable" and attrs["cfa_dimensions"] == "time lat lon"
    array = json.loads(attrs["cfa_array"])
    assert list(array) == ["pmshape", "pmdimensions", "Partitions"]
    assert array["pmshape"] == [3, 2, 1] and array["pmdimensions"] == ["time", "lat", "lon"]
    parts = array["Partitions"]
    assert len(parts) == 5 and [1, 0, 0] not in [p["index"] for p in parts]  # only what exists
    last = parts[-1]
    assert list(last) == ["index", "location", "subarray"] and list(last["subarray"]) == ["ncvar", "file", "format",
                                                                                           "shape"]
    assert last == {"index": [2, 1, 0], "location": [[5, 5], [1, 3], [0, 2]],  # ends inclusive
                    "subarray": {"ncvar": "tas", "file": "frags/tas.2.1.nc", "format": file_format, "shape": [1, 3, 3]}}
    assert scalar == {"pmshape": [], "pmdimensions": [], "Partitions": [
        {"index": [], "location": [], "subarray": {"ncvar": "sc", "file": "frags/sc.nc", "format": file_format,
                                                   "shape": []}}]}


def write_fragment(path: Path, name: str, data: np.ndarray, t0: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(str(path), "w") as nc:
        nc.createDimension("time", data.shape[0])
        nc.createDimension("lat", data.shape[1])
        t = nc.createVariable("time", "f8", ("time",))
        t[:] = np.arange(t0, t0 + data.shape[0], dtype="f8")
        t.units = "days since 2000-01-01"
        v = nc.createVariable(name, "f4", ("time", "lat"))
        v.units = "K"
        v[...] = data


@pytest.mark.parametrize("file_format", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_cfdm_reads_what_we_write(tmp_path, monkeypatch, file_format):
    cfdm = pytest.importorskip("cfdm")
    truth = np.arange(12, dtype="f4").reshape(4, 3) + 270
    write_fragment(tmp_path / "frags" / "a.nc", "tas", truth[:1], 0)
    write_fragment(tmp_path / "frags" / "b.nc", "tas", truth[1:], 1)
    dataset = AggregationDataset(
        dimensions=[Dimension("/time", 4), Dimension("/lat", 3)],
        variables=[
            PlainVariable("/time", ("time",), np.dtype("f8"), {"units": "days since 2000-01-01",
                                                                "standard_name": "time"}, np.arange(4.0)),
            PlainVariable("/lat", ("lat",), np.dtype("f8"), {"units": "degrees_north",
                                                              "standard_name": "latitude"}, np.array([-30.0, 0, 30])),
        ],
        aggregated=[aggregated("/tas", ("time", "lat"), [(1, 3), (3,)],
                               [["frags/a.nc"], ["frags/b.nc"]], "tas",
                               attrs={"units": "K", "standard_name": "air_temperature"})],
    )
    path = tmp_path / "agg.nc"
    write_aggregation(path, dataset, file_format=file_format)
    np.testing.assert_array_equal(daskcfa.from_cfa(str(path), "tas").compute(), truth)
    # cfdm 1.13 resolves relative URIs against the working directory, not the aggregation
    # file (formats.md; checked: from elsewhere it looks for <cwd>/frags/b.nc).
    monkeypatch.chdir(tmp_path)
    field = cfdm.read(str(path))[0]
    assert field.get_property("standard_name") == "air_temperature"
    np.testing.assert_array_equal(field.array, truth)
    np.testing.assert_array_equal(field.dimension_coordinate("time").array, np.arange(4.0))
