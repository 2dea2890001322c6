"""Parsers of the legacy dialects: CFA-0.5, CFA-0.4/0.3 (S3netCDF4) and NCA (early cf-python).

The aggregation files are built here with netCDF4-python exactly as those
tools lay them out, including sparse partition matrices, netCDF-3 files and
variables inside netCDF-4 groups.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from daskcfa.errors import CFAFormatError, CFAWarning
from daskcfa.formats.nca import parse_nca
from daskcfa.formats.s3netcdf import parse_cfa04, parse_cfa05

SIZES = {"time": 12, "lat": 4, "lon": 6}
ATTRS = {"units": "K", "standard_name": "air_temperature"}

Location = list[tuple[int, int]]  # [start, stop) per dimension


def s3_bounds(size: int, n: int) -> list[int]:
    """Fragment boundaries as S3netCDF4 splits a dimension into ``n`` (rounding half up)."""
    return [int(0.5 + i * size / n) for i in range(n + 1)]


def even_partitions(sizes: dict[str, int], pm_shape: tuple[int, ...], stem: str = "a7") -> dict[tuple, tuple]:
    """Every partition of an S3netCDF4 split: index -> (location, file name)."""
    bounds = [s3_bounds(size, n) for size, n in zip(sizes.values(), pm_shape)]
    return {
        index: (
            [(b[i], b[i + 1]) for b, i in zip(bounds, index)],
            f"{stem}/{stem}.tas.{'.'.join(map(str, index))}.nc",
        )
        for index in itertools.product(*(range(n) for n in pm_shape))
    }


def write_cfa05(
    path: Path,
    partitions: dict[tuple, tuple[Location, str]],
    pm_shape: tuple[int, ...],
    *,
    sizes: dict[str, int] = SIZES,
    parent: str | None = None,
    inclusive: bool = False,
    pm_dims: list[str] | None = None,
    var_attrs: dict[str, Any] | None = None,
    fmt: str = "NETCDF4",
) -> Path:
    """A CFA-0.5 aggregation file as S3netCDF4 v2 writes it; unlisted partitions stay unwritten."""
    pm_dims = list(sizes) if pm_dims is None else pm_dims
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.Conventions = "CF-1.6 CFA-0.5"
        for name, size in sizes.items():
            ds.createDimension(name, size)
        owner = ds if parent is None else ds.createGroup(parent)
        var = owner.createVariable("tas", "f4")
        var.setncatts(
            {
                **ATTRS,
                "cf_role": "cfa_variable",
                "cfa_dimensions": " ".join(sizes),
                "cfa_group": "cfa_tas",
                **(var_attrs or {}),
            }
        )
        group = owner.createGroup("cfa_tas")
        for name, n in zip(pm_dims, pm_shape):
            group.createDimension(name, n)
        group.createDimension("ndimensions", len(pm_shape))
        group.createDimension("bounds", 2)
        group.createVariable("pmshape", "i4", ("ndimensions",))[:] = pm_shape
        group.createVariable("pmdimensions", str)[...] = np.array(", ".join(pm_dims), dtype=object)
        index = group.createVariable("index", "i4", (*pm_dims, "ndimensions"))
        location = group.createVariable("location", "i4", (*pm_dims, "ndimensions", "bounds"))
        shape = group.createVariable("shape", "i4", (*pm_dims, "ndimensions"))
        ncvar, file, format_ = (group.createVariable(name, str, tuple(pm_dims)) for name in ("ncvar", "file", "format"))
        for pos, (loc, fname) in partitions.items():
            index[pos] = pos
            location[pos] = [[a, b - 1 if inclusive else b] for a, b in loc]
            shape[pos] = [b - a for a, b in loc]
            ncvar[pos], file[pos], format_[pos] = "tas", fname, fmt
    return path


def partition_json(index: tuple, loc: Location, fname: str | None, *, inclusive: bool, **extra: Any) -> dict:
    """One element of ``Partitions`` as S3netCDF4 (subarray, inclusive) or NCA (data, exclusive) writes it."""
    data: dict[str, Any] = {"ncvar": "tas", "shape": [b - a for a, b in loc]}
    if fname is not None:
        data["file"] = fname
    if inclusive:
        data["format"] = "NETCDF3_CLASSIC"
        return {"index": list(index), "location": [[a, b - 1] for a, b in loc], "subarray": data, **extra}
    data["dtype"] = "float"
    return {"index": list(index), "location": [list(pair) for pair in loc], "data": data, "format": "netCDF", **extra}


def write_json_dialect(
    path: Path,
    array: dict[str, Any] | str,
    *,
    nca: bool,
    sizes: dict[str, int] = SIZES,
    dims_attr: str | None = None,
    fmt: str = "NETCDF3_CLASSIC",
    private: dict[str, tuple[str, ...]] | None = None,
) -> Path:
    """A CFA-0.4 (``cfa_array``) or NCA (``nca_array``) aggregation file; ``private`` adds
    variables (name -> dimensions) holding partitions inside the aggregation file."""
    prefix = "nca" if nca else "cfa"
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.Conventions = "CF-1.5 NCA" if nca else "CF-1.6 CFA-0.4"
        for name, size in sizes.items():
            ds.createDimension(name, size)
        for name, var_dims in (private or {}).items():
            ds.createVariable(name, "f4", var_dims).cf_role = f"{prefix}_private"
        var = ds.createVariable("tas", "f4")
        var.setncatts(
            {
                **ATTRS,
                "cf_role": f"{prefix}_variable",
                dims_attr or f"{prefix}_dimensions": " ".join(sizes),
                f"{prefix}_array": array if isinstance(array, str) else json.dumps(array),
            }
        )
    return path


def write_cfa04(path: Path, partitions: dict[tuple, tuple[Location, str]], pm_shape: tuple, **kwargs: Any) -> Path:
    array = {
        "pmshape": list(pm_shape),
        "pmdimensions": list(kwargs.get("sizes", SIZES)),
        "Partitions": [partition_json(i, loc, f, inclusive=True) for i, (loc, f) in partitions.items()],
    }
    array.update(kwargs.pop("array_extra", {}))
    return write_json_dialect(path, array, nca=False, **kwargs)


def parse(parser, path: Path, name: str = "tas"):
    with netCDF4.Dataset(path) as ds:
        return parser(ds[name], str(path))


def format_error(parser, path: Path, *, variable: str = "/tas", fragment: tuple | None = None, match: str = ""):
    """Parse expecting a CFAFormatError that names the file, the variable and the fragment."""
    with pytest.raises(CFAFormatError, match=match) as info:
        parse(parser, path, variable.lstrip("/"))
    err = info.value
    assert err.file == str(path) and str(path) in str(err)
    assert err.variable == variable and repr(variable) in str(err)
    if fragment is not None:
        assert err.fragment == fragment and str(fragment) in str(err)
    return err


# ---------------------------------------------------------------------------
# CFA-0.5
# ---------------------------------------------------------------------------


def test_cfa05_full_matrix(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "a7.nca", even_partitions(SIZES, (3, 2, 1)), (3, 2, 1))
    av = parse(parse_cfa05, path)
    assert av.name == "/tas" and av.dialect == "CFA-0.5" and av.source == str(path)
    assert av.dims == ("time", "lat", "lon") and av.shape == (12, 4, 6)
    assert av.dtype == np.dtype("float32")
    assert av.attrs == ATTRS
    assert av.extra == {"instructions": {"/cfa_tas"}}
    assert av.fragments.grid.sizes == ((4, 4, 4), (2, 2), (6,))
    ref = av.fragments[(2, 1, 0)]
    assert ref.uris == ("a7/a7.tas.2.1.0.nc",) and ref.identifier == "tas"
    assert ref.shape == (4, 2, 6) and not ref.is_missing
    assert not any(r.is_missing for r in av.fragments)


def test_cfa05_uneven_split_as_s3netcdf4_rounds(tmp_path: Path) -> None:
    sizes = {"time": 10, "lat": 5, "lon": 6}
    path = write_cfa05(tmp_path / "a.nca", even_partitions(sizes, (4, 2, 1)), (4, 2, 1), sizes=sizes)
    assert parse(parse_cfa05, path).fragments.grid.sizes == ((3, 2, 3, 2), (3, 2), (6,))


def test_cfa05_sparse_partitions_are_missing_and_sizes_inferred(tmp_path: Path) -> None:
    sizes = {"time": 10, "lat": 4, "lon": 6}
    everything = even_partitions(sizes, (4, 2, 1))
    written = {i: everything[i] for i in [(0, 0, 0), (1, 1, 0)]}  # time slabs 2 and 3 never written
    av = parse(parse_cfa05, write_cfa05(tmp_path / "sparse.nca", written, (4, 2, 1), sizes=sizes))
    assert av.fragments.grid.sizes == ((3, 2, 3, 2), (2, 2), (6,))
    assert av.shape == (10, 4, 6)
    assert av.fragments[(1, 1, 0)].uris == ("a7/a7.tas.1.1.0.nc",)
    for index in [(0, 1, 0), (1, 0, 0), (2, 0, 0), (3, 1, 0)]:
        ref = av.fragments[index]
        assert ref.is_missing and ref.uris == () and ref.identifier is None


def test_cfa05_nothing_written_splits_evenly(tmp_path: Path) -> None:
    sizes = {"time": 10, "lat": 4, "lon": 6}
    av = parse(parse_cfa05, write_cfa05(tmp_path / "empty.nca", {}, (4, 2, 1), sizes=sizes))
    assert av.fragments.grid.sizes == ((3, 2, 3, 2), (2, 2), (6,))
    assert all(ref.is_missing for ref in av.fragments)


def test_cfa05_variable_in_netcdf4_group(tmp_path: Path) -> None:
    parts = even_partitions(SIZES, (2, 1, 1), stem="a7.model")
    av = parse(parse_cfa05, write_cfa05(tmp_path / "a7.nca", parts, (2, 1, 1), parent="model"), "model/tas")
    assert av.name == "/model/tas" and av.basename == "tas"
    assert av.extra["instructions"] == {"/model/cfa_tas"}
    assert av.fragments.grid.sizes == ((6, 6), (4,), (6,))
    assert av.fragments[(1, 0, 0)].uris == ("a7.model/a7.model.tas.1.0.0.nc",)


def test_cfa05_inclusive_ends_from_older_s3netcdf4_are_recognised(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "old.nca", even_partitions(SIZES, (3, 2, 1)), (3, 2, 1), inclusive=True)
    with pytest.warns(CFAWarning, match="inclusively"):
        av = parse(parse_cfa05, path)
    assert av.fragments.grid.sizes == ((4, 4, 4), (2, 2), (6,))


def test_cfa05_partition_matrix_over_some_dimensions_in_other_order(tmp_path: Path) -> None:
    # pm dimensions (lon, time): indices and location rows follow them
    written = {(j, i): ([(3 * j, 3 * j + 3), (4 * i, 4 * i + 4)], f"p{i}{j}.nc") for i in range(3) for j in range(2)}
    path = write_cfa05(tmp_path / "sub.nca", written, (2, 3), pm_dims=["lon", "time"])
    with netCDF4.Dataset(path, "a") as ds:  # shapes follow the pm dimensions too
        ds["cfa_tas"]["shape"][...] = np.broadcast_to([3, 4], (2, 3, 2))
    av = parse(parse_cfa05, path)
    assert av.fragments.grid.sizes == ((4, 4, 4), (4,), (3, 3))
    assert av.fragments[(2, 0, 1)].uris == ("p21.nc",)


def test_cfa05_base_prefix(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "b.nca", even_partitions(SIZES, (1, 1, 1)), (1, 1, 1))
    with netCDF4.Dataset(path, "a") as ds:
        ds["cfa_tas"].createVariable("base", str)[...] = np.array("s3://bucket/data/", dtype=object)
    assert parse(parse_cfa05, path).fragments[(0, 0, 0)].uris == ("s3://bucket/data/a7/a7.tas.0.0.0.nc",)


def test_cfa05_missing_group(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "g.nca", {}, (1, 1, 1), var_attrs={"cfa_group": "cfa_nothere"})
    format_error(parse_cfa05, path, match="cfa_nothere")


def test_cfa05_unknown_dimension(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "d.nca", {}, (1, 1, 1), var_attrs={"cfa_dimensions": "time lat height"})
    format_error(parse_cfa05, path, match="height")


def test_cfa05_pmdimensions_not_aggregated(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "pd.nca", {}, (1, 1), pm_dims=["time", "height"])
    format_error(parse_cfa05, path, match="height")


def test_cfa05_pmshape_not_matching_dims(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "pm.nca", {}, (3, 2, 1))
    with netCDF4.Dataset(path, "a") as ds:
        ds["cfa_tas"]["pmdimensions"][...] = np.array("time, lat", dtype=object)
    format_error(parse_cfa05, path, match="pmshape")


def test_cfa05_pmshape_not_matching_matrix_variables(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "pv.nca", even_partitions(SIZES, (3, 2, 1)), (3, 2, 1))
    with netCDF4.Dataset(path, "a") as ds:
        ds["cfa_tas"]["pmshape"][:] = [4, 2, 1]
    format_error(parse_cfa05, path, match="partition matrix needs")


def test_cfa05_absurd_matrix_refused_before_reading(tmp_path: Path) -> None:
    sizes = {"time": 10**6, "lat": 10**6}
    path = write_cfa05(tmp_path / "huge.nca", {}, (10**6, 10**6), sizes=sizes)
    began = time.perf_counter()
    format_error(parse_cfa05, path, match="more than")
    assert time.perf_counter() - began < 5


def test_cfa05_index_variable_disagrees(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "ix.nca", even_partitions(SIZES, (3, 2, 1)), (3, 2, 1))
    with netCDF4.Dataset(path, "a") as ds:
        ds["cfa_tas"]["index"][1, 0, 0] = [7, 0, 0]
    format_error(parse_cfa05, path, fragment=(1, 0, 0), match="index")


def test_cfa05_location_outside_array(tmp_path: Path) -> None:
    parts = even_partitions(SIZES, (3, 2, 1))
    parts[(2, 1, 0)] = ([(8, 13), (2, 4), (0, 6)], "x.nc")
    format_error(parse_cfa05, write_cfa05(tmp_path / "o.nca", parts, (3, 2, 1)), fragment=(2, 1, 0), match="outside")


def test_cfa05_overlapping_locations(tmp_path: Path) -> None:
    parts = even_partitions(SIZES, (3, 2, 1))
    for j in range(2):  # the whole second time slab starts too early
        loc, fname = parts[(1, j, 0)]
        parts[(1, j, 0)] = ([(3, 8)] + loc[1:], fname)
    format_error(parse_cfa05, write_cfa05(tmp_path / "ov.nca", parts, (3, 2, 1)), fragment=(1, 0, 0), match="overlap")


def test_cfa05_inconsistent_locations_in_one_slab(tmp_path: Path) -> None:
    parts = even_partitions(SIZES, (3, 2, 1))
    loc, fname = parts[(1, 1, 0)]
    parts[(1, 1, 0)] = ([(4, 7)] + loc[1:], fname)
    path = write_cfa05(tmp_path / "in.nca", parts, (3, 2, 1))
    format_error(parse_cfa05, path, fragment=(1, 1, 0), match="same slab")


def test_cfa05_non_netcdf_fragments(tmp_path: Path) -> None:
    path = write_cfa05(tmp_path / "pp.nca", even_partitions(SIZES, (1, 1, 1)), (1, 1, 1), fmt="PP")
    format_error(parse_cfa05, path, fragment=(0, 0, 0), match="'PP'")


# ---------------------------------------------------------------------------
# CFA-0.4 / 0.3
# ---------------------------------------------------------------------------


def test_cfa04_netcdf3_with_base_and_old_dimension_attribute(tmp_path: Path) -> None:
    path = write_cfa04(
        tmp_path / "t04.nca",
        even_partitions(SIZES, (2, 2, 1), stem="t04"),
        (2, 2, 1),
        dims_attr="cf_dimensions",
        array_extra={"base": "s3://bucket/archive"},
    )
    av = parse(parse_cfa04, path)
    assert av.dialect == "CFA-0.4" and av.dims == ("time", "lat", "lon") and av.dtype == np.dtype("float32")
    assert av.attrs == ATTRS
    assert av.extra == {"instructions": set()}
    assert av.fragments.grid.sizes == ((6, 6), (2, 2), (6,))
    ref = av.fragments[(1, 0, 0)]
    assert ref.uris == ("s3://bucket/archive/t04/t04.tas.1.0.0.nc",) and ref.identifier == "tas"


def test_cfa04_only_written_partitions_listed(tmp_path: Path) -> None:
    sizes = {"time": 10, "lat": 4, "lon": 6}
    everything = even_partitions(sizes, (4, 2, 1))
    written = {i: everything[i] for i in [(0, 0, 0), (0, 1, 0), (2, 0, 0)]}
    av = parse(parse_cfa04, write_cfa04(tmp_path / "s.nca", written, (4, 2, 1), sizes=sizes))
    assert av.fragments.grid.sizes == ((3, 2, 3, 2), (2, 2), (6,))
    assert av.fragments[(2, 0, 0)].uris == ("a7/a7.tas.2.0.0.nc",)
    assert [ref.index for ref in av.fragments if not ref.is_missing] == [(0, 0, 0), (0, 1, 0), (2, 0, 0)]


def test_cfa04_unwritten_middle_slabs_share_their_gap(tmp_path: Path) -> None:
    sizes = {"time": 11, "lat": 4, "lon": 6}
    everything = even_partitions(sizes, (4, 1, 1))  # time split 3, 3, 2, 3
    written = {i: everything[i] for i in [(0, 0, 0), (3, 0, 0)]}
    av = parse(parse_cfa04, write_cfa04(tmp_path / "gap.nca", written, (4, 1, 1), sizes=sizes))
    assert av.fragments.grid.sizes == ((3, 3, 2, 3), (4,), (6,))
    assert [ref.is_missing for ref in av.fragments] == [False, True, True, False]


def test_cfa04_scalar_aggregated_data(tmp_path: Path) -> None:
    array = {"Partitions": [{"index": [], "location": [], "subarray": {"ncvar": "x", "file": "x.nc", "shape": []}}]}
    av = parse(parse_cfa04, write_json_dialect(tmp_path / "s.nca", array, nca=False, sizes={}))
    assert av.dims == () and av.shape == () and av.fragments.grid.sizes == ()
    assert av.fragments[()].uris == ("x.nc",) and av.fragments[()].identifier == "x"


def test_cfa04_partition_inside_aggregation_file(tmp_path: Path) -> None:
    array = {
        "pmshape": [2],
        "pmdimensions": ["time"],
        "Partitions": [
            partition_json((0,), [(0, 6), (0, 4), (0, 6)], None, inclusive=True) | {"subarray": {"ncvar": "cfa_abc"}},
            partition_json((1,), [(6, 12), (0, 4), (0, 6)], "b.nc", inclusive=True),
        ],
    }
    path = write_json_dialect(tmp_path / "p.nca", array, nca=False, private={"cfa_abc": ("time", "lat", "lon")})
    av = parse(parse_cfa04, path)
    ref = av.fragments[(0, 0, 0)]
    assert ref.uris == (str(path),) and ref.identifier == "/cfa_abc"
    assert av.extra["instructions"] == {"/cfa_abc"}
    assert av.fragments[(1, 0, 0)].uris == ("b.nc",)


def test_cfa04_exclusive_ends_written_by_mistake_are_recognised(tmp_path: Path) -> None:
    parts = even_partitions(SIZES, (2, 1, 1))
    array = {
        "pmshape": [2, 1, 1],
        "pmdimensions": list(SIZES),
        "Partitions": [partition_json(i, loc, f, inclusive=False) for i, (loc, f) in parts.items()],
    }
    with pytest.warns(CFAWarning, match="exclusively"):
        av = parse(parse_cfa04, write_json_dialect(tmp_path / "x.nca", array, nca=False))
    assert av.fragments.grid.sizes == ((6, 6), (4,), (6,))


@pytest.mark.parametrize(
    "array, match",
    [
        ('{"pmshape": [2, 1, 1], "Partitions": [', "neither JSON nor a Python literal"),
        ('["not", "an", "object"]', "JSON object"),
        ({"pmshape": [1, 1, 1], "pmdimensions": list(SIZES)}, "Partitions"),
        ({"pmshape": [2, 1], "pmdimensions": list(SIZES), "Partitions": []}, "pmshape"),
        ({"pmshape": "2", "pmdimensions": list(SIZES), "Partitions": []}, "pmshape"),
        ({"pmshape": [1, 1, 1], "pmdimensions": ["time", "lat", "height"], "Partitions": []}, "height"),
        ({"pmshape": [10**6, 10**6, 1], "pmdimensions": list(SIZES), "Partitions": []}, "more than"),
        ({"pmshape": [0, 1, 1], "pmdimensions": list(SIZES), "Partitions": []}, "dimension has size 12"),
        ({"pmshape": [1, 1, 1], "pmdimensions": list(SIZES), "Partitions": ["p"]}, r"Partitions\[0\]"),
        ({"pmshape": [1, 1, 1], "pmdimensions": list(SIZES), "Partitions": [{"index": [0, "0", 0]}]}, "index"),
    ],
)
def test_cfa04_malformed_array(tmp_path: Path, array: Any, match: str) -> None:
    format_error(parse_cfa04, write_json_dialect(tmp_path / "bad.nca", array, nca=False), match=match)


def test_cfa04_unknown_aggregated_dimension(tmp_path: Path) -> None:
    path = write_cfa04(tmp_path / "u.nca", even_partitions(SIZES, (1, 1, 1)), (1, 1, 1))
    with netCDF4.Dataset(path, "a") as ds:
        ds["tas"].cfa_dimensions = "time lat longitude"
    format_error(parse_cfa04, path, match="longitude")


def _broken_cfa04(tmp_path: Path, change: dict[tuple, Any]) -> Path:
    parts: dict[tuple, Any] = dict(even_partitions(SIZES, (2, 2, 1)))
    parts.update(change)
    array = {
        "pmshape": [2, 2, 1],
        "pmdimensions": list(SIZES),
        "Partitions": [
            p if isinstance(p, dict) else partition_json(i, p[0], p[1], inclusive=True) for i, p in parts.items()
        ],
    }
    return write_json_dialect(tmp_path / "broken.nca", array, nca=False)


def _last_partition(**fields: Any) -> dict[tuple, dict]:
    """Partition (1, 1, 0) written raw, with a correct (inclusive) location unless given."""
    return {(1, 1, 0): {"index": [1, 1, 0], "location": [[6, 11], [2, 3], [0, 5]], **fields}}


@pytest.mark.parametrize(
    "change, fragment, match",
    [
        ({(2, 0, 0): ([(0, 6), (0, 2), (0, 6)], "x.nc")}, (2, 0, 0), "outside the partition matrix"),
        ({(1, 1, 0): ([(6, 14), (2, 4), (0, 6)], "x.nc")}, (1, 1, 0), "outside the array"),
        ({(1, 1, 0): ([(6, 5), (2, 4), (0, 6)], "x.nc")}, (1, 1, 0), "ends before it starts"),
        ({(1, 1, 0): ([(6, 12), (1, 4), (0, 6)], "x.nc")}, (1, 1, 0), "same slab"),
        (_last_partition(subarray={"ncvar": "t", "file": "x", "shape": [9]}), (1, 1, 0), "shape recorded"),
        (_last_partition(location="6:12", subarray={"ncvar": "t"}), (1, 1, 0), "location"),
        (_last_partition(), (1, 1, 0), "subarray"),
        (_last_partition(subarray={"file": "x"}), (1, 1, 0), "ncvar"),
        (_last_partition(subarray={"ncvar": "t", "file": "a.pp", "format": "PP"}), (1, 1, 0), "'PP'"),
    ],
)
def test_cfa04_malformed_partition(tmp_path: Path, change: dict, fragment: tuple, match: str) -> None:
    format_error(parse_cfa04, _broken_cfa04(tmp_path, change), fragment=fragment, match=match)


def test_cfa04_duplicate_partition(tmp_path: Path) -> None:
    parts = even_partitions(SIZES, (2, 1, 1))
    listed = [partition_json(i, loc, f, inclusive=True) for i, (loc, f) in parts.items()]
    array = {"pmshape": [2, 1, 1], "pmdimensions": list(SIZES), "Partitions": listed + listed[:1]}
    path = write_json_dialect(tmp_path / "dup.nca", array, nca=False)
    format_error(parse_cfa04, path, fragment=(0, 0, 0), match="more than once")


def test_cfa04_overlap_and_gap(tmp_path: Path) -> None:
    overlap = {(1, j, 0): ([(5, 12), (2 * j, 2 * j + 2), (0, 6)], "x.nc") for j in range(2)}
    format_error(parse_cfa04, _broken_cfa04(tmp_path, overlap), fragment=(1, 0, 0), match="overlap or leave a gap")
    short = {(1, j, 0): ([(6, 11), (2 * j, 2 * j + 2), (0, 6)], "x.nc") for j in range(2)}
    format_error(parse_cfa04, _broken_cfa04(tmp_path, short), fragment=(1, 0, 0), match="dimension has size 12")



# ---------------------------------------------------------------------------
# NCA
# ---------------------------------------------------------------------------


def _nca_array(partitions: list[dict], **top: Any) -> dict[str, Any]:
    return {"pdimensions": ["time"], "pshape": [2], **top, "Partitions": partitions}


def test_nca_units_dimension_order_and_directions(tmp_path: Path) -> None:
    first = partition_json(
        (0,),
        [(0, 5), (0, 4), (0, 6)],
        "/data/jan-may.nc",
        inclusive=False,
        units="degC",
        dimensions=["lon", "time", "lat"],
        directions={"time": True, "lat": True},
    )
    first["data"]["shape"] = [6, 5, 4]
    second = partition_json((1,), [(5, 12), (0, 4), (0, 6)], "/data/jun-dec.nc", inclusive=False)
    array = _nca_array([first, second], directions={"time": True, "lat": False, "lon": True})
    av = parse(parse_nca, write_json_dialect(tmp_path / "t.nca", array, nca=True, fmt="NETCDF4"))
    assert av.dialect == "NCA" and av.attrs == ATTRS and av.dims == ("time", "lat", "lon")
    assert av.fragments.grid.sizes == ((5, 7), (4,), (6,))
    ref = av.fragments[(0, 0, 0)]
    assert ref.uris == ("/data/jan-may.nc",) and ref.identifier == "tas"
    assert ref.units == "degC" and ref.axes == (2, 0, 1) and ref.reversed == (False, True, False)
    plain = av.fragments[(1, 0, 0)]
    assert plain.units is None and plain.axes is None and plain.reversed is None


def test_nca_partition_without_a_size_one_dimension(tmp_path: Path) -> None:
    sizes = {"time": 4, "height": 1, "lat": 3}
    parts = [
        partition_json(
            (i,), [(2 * i, 2 * i + 2), (0, 1), (0, 3)], f"f{i}.nc", inclusive=False, dimensions=["time", "lat"]
        )
        for i in range(2)
    ]
    for p in parts:
        p["data"]["shape"] = [2, 3]  # the file variable has no height dimension
    av = parse(parse_nca, write_json_dialect(tmp_path / "h.nca", _nca_array(parts), nca=True, sizes=sizes))
    assert av.fragments[(1, 0, 0)].axes == (0, 2)


def test_nca_private_partition_in_aggregation_file(tmp_path: Path) -> None:
    private = partition_json((0,), [(0, 6), (0, 4), (0, 6)], None, inclusive=False, dimensions=["lon", "time", "lat"])
    private["data"] = {"ncvar": "nca_45sdf83745", "shape": [6, 6, 4]}
    public = partition_json((1,), [(6, 12), (0, 4), (0, 6)], "test2.nc", inclusive=False)
    path = write_json_dialect(
        tmp_path / "t2.nca", _nca_array([private, public]), nca=True, private={"nca_45sdf83745": ("lon", "time", "lat")}
    )
    av = parse(parse_nca, path)
    assert av.fragments[(0, 0, 0)].uris == (str(path),)
    assert av.fragments[(0, 0, 0)].identifier == "/nca_45sdf83745"
    assert av.extra["instructions"] == {"/nca_45sdf83745"}


def test_nca_part_selecting_everything_is_accepted(tmp_path: Path) -> None:
    parts = [
        partition_json(
            (0,), [(0, 6), (0, 4), (0, 6)], "a.nc", inclusive=False, part="[(0, 5, 1), [0, 1, 2, 3], (0, 5, 1)]"
        ),
        partition_json((1,), [(6, 12), (0, 4), (0, 6)], "b.nc", inclusive=False, part="[]"),
    ]
    av = parse(parse_nca, write_json_dialect(tmp_path / "p.nca", _nca_array(parts), nca=True))
    assert av.fragments[(0, 0, 0)].uris == ("a.nc",)


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"part": "[(0, 5, 2), [0, 1, 2, 3], (0, 5, 1)]"}, "does not fit the shape"),
        ({"part": "[(0, 5, 1), [0, 1, 2, 3]]"}, "one index selection per dimension"),
        ({"part": "[(0, 5, 1), [0, 1, 2, 4], (0, 5, 1)]"}, r"selection 1 .* within the file variable \(size 4\)"),
        ({"part": "[__import__('os')]"}, "part is neither JSON nor a Python literal"),
        ({"format": "PP"}, "only netCDF fragments"),
        ({"calendar": "360_day"}, "calendar"),
        ({"dimensions": ["time", "lat", "height"]}, "leaves out dimension 'lon'"),
        ({"dimensions": ["time", "lat"]}, "leaves out dimension 'lon'"),
        ({"directions": {"time": "up"}}, "directions"),
        ({"directions": {"height": True}}, r"directions .* should map dimensions \['time', 'lat', 'lon'\]"),
        ({"units": 273.15}, "units"),
    ],
)
def test_nca_unsupported_or_malformed_partition(tmp_path: Path, extra: dict, match: str) -> None:
    parts = [
        partition_json((0,), [(0, 6), (0, 4), (0, 6)], "a.nc", inclusive=False, **extra),
        partition_json((1,), [(6, 12), (0, 4), (0, 6)], "b.nc", inclusive=False),
    ]
    path = write_json_dialect(tmp_path / "bad.nca", _nca_array(parts), nca=True)
    format_error(parse_nca, path, fragment=(0, 0, 0), match=match)


def test_nca_bad_json(tmp_path: Path) -> None:
    path = write_json_dialect(tmp_path / "j.nca", "{'pshape': [2]", nca=True)
    format_error(parse_nca, path, match="neither JSON nor a Python literal")


def test_nca_python_style_json_and_virtual_partitions(tmp_path: Path) -> None:
    """Single quotes, tuples and None (the convention's own examples); a ``part`` taking the
    whole file variable backwards; a size-1 file dimension the aggregation does not span."""
    parts = [
        partition_json((0,), [(0, 6), (0, 4), (0, 6)], "a.nc", inclusive=False,
                       part="[(5, 0, -1), [0, 1, 2, 3], (0, 5, 1)]"),
        partition_json((1,), [(6, 12), (0, 4), (0, 6)], "b.nc", inclusive=False,
                       dimensions=["height", "time", "lat", "lon"], directions={"height": True}),
    ]
    parts[1]["data"]["shape"] = [1, 6, 4, 6]
    path = write_json_dialect(tmp_path / "p.nca", str({**_nca_array(parts), "base": None}), nca=True)
    av = parse(parse_nca, path)
    assert av.fragments[(0, 0, 0)].part == (range(5, -1, -1), (0, 1, 2, 3), range(0, 6))
    assert av.fragments[(1, 0, 0)].axes == (-1, 0, 1, 2) and av.fragments[(1, 0, 0)].part is None


# ---------------------------------------------------------------------------
# Robustness: whatever the JSON holds, only CFAFormatError may come out
# ---------------------------------------------------------------------------

_JUNK = [None, 0, -1, 10**20, "x", "", [], {}, [1, 2], [[0, 1]], True, 1.5, ["time"], "[(0, 1, 1)]", [0, 0, 0]]


def _mutated(value: Any, rng: random.Random) -> Any:
    """``value`` with one nested element replaced by junk or deleted."""
    value = copy.deepcopy(value)
    paths, stack = [], [((), value)]
    while stack:
        path, node = stack.pop()
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            paths.append(path + (key,))
            stack.append((path + (key,), child))
    *parents, key = rng.choice(paths)
    owner = value
    for step in parents:
        owner = owner[step]
    if isinstance(owner, dict) and rng.random() < 0.3:
        del owner[key]
    else:
        owner[key] = copy.deepcopy(rng.choice(_JUNK))
    return value


@pytest.mark.parametrize("parser", [parse_cfa04, parse_nca])
def test_json_dialects_raise_only_format_errors(parser, tmp_path: Path) -> None:
    nca = parser is parse_nca
    valid = {
        "pmdimensions": ["time", "lat"],
        "pmshape": [2, 2],
        "directions": {"lat": False},
        "Partitions": [
            partition_json(i[:2], loc, f, inclusive=not nca, units="K", dimensions=["lon", "time", "lat"], part="[]")
            for i, (loc, f) in even_partitions(SIZES, (2, 2, 1)).items()
        ],
    }
    path = write_json_dialect(tmp_path / "fuzz.nca", valid, nca=nca, fmt="NETCDF4")
    rng = random.Random(20260101)
    with netCDF4.Dataset(path, "a") as ds:
        for _ in range(300):
            ds["tas"].setncattr("nca_array" if nca else "cfa_array", json.dumps(_mutated(valid, rng)))
            try:
                parser(ds["tas"], str(path))
            except CFAFormatError:
                pass


# ---------------------------------------------------------------------------
# Zero-length dimensions in every partition-matrix dialect
# ---------------------------------------------------------------------------
EMPTY_TIME = {"time": 0, "lat": 4, "lon": 6}


def _zero_length_aggregation(dialect: str, directory: Path, pm_time: int) -> Path:
    """An aggregation over a zero-length ``time``: ``pm_time`` 0 (no partition along it) or 1
    (one partition of size 0, its location [0, 0)); lat and lon split in two along lon."""
    directory.mkdir(parents=True, exist_ok=True)
    parts = {} if pm_time == 0 else {
        (0, 0, j): ([(0, 0), (0, 4), (3 * j, 3 * j + 3)], f"a7/a7.tas.0.0.{j}.nc") for j in range(2)}
    pm_shape = (pm_time, 1, 2)
    for _, name in parts.values():
        (directory / name).parent.mkdir(exist_ok=True)
        with netCDF4.Dataset(directory / name, "w") as ds:
            for dim, n in zip(EMPTY_TIME, (0, 4, 3)):
                ds.createDimension(dim, n)
            ds.createVariable("tas", "f4", tuple(EMPTY_TIME)).units = "K"
    if dialect == "CFA-0.5":
        return write_cfa05(directory / "a.nca", parts, pm_shape, sizes=EMPTY_TIME)
    if dialect == "CFA-0.4":
        return write_cfa04(directory / "a.nca", parts, pm_shape, sizes=EMPTY_TIME, fmt="NETCDF4")
    array = {"pdimensions": list(EMPTY_TIME), "pshape": list(pm_shape),
             "Partitions": [partition_json(i, loc, f, inclusive=False) for i, (loc, f) in parts.items()]}
    return write_json_dialect(directory / "a.nca", array, nca=True, sizes=EMPTY_TIME, fmt="NETCDF4")


@pytest.mark.parametrize("pm_time", [0, 1])
@pytest.mark.parametrize("dialect", ["CFA-0.5", "CFA-0.4", "NCA"])
def test_zero_length_dimension_reads_as_an_empty_array(tmp_path: Path, placed, dialect: str, pm_time: int) -> None:
    import daskcfa

    url, options = placed(_zero_length_aggregation(dialect, tmp_path / "ds", pm_time))
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    assert x.shape == (0, 4, 6) and x.dtype == np.float32
    got = x.compute()
    assert got.shape == (0, 4, 6) and got.dtype == np.float32
    assert x[:, 1:3, 2].compute().shape == (0, 2)
    assert not daskcfa.verify(url, deep=True, storage_options=options).problems
