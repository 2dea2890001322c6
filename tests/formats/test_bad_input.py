"""Malformed aggregation datasets give clear daskcfa errors.

Each test writes a real (broken) dataset, asserts the exact CFAError
subclass, and checks that ``.file``, ``.variable`` and ``.fragment`` and the
message say where the problem is. Bare KeyError/IndexError/ValueError must
never escape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import (Frag, assert_matches, build_cf113, build_cfa04, build_cfa05, build_cfa06,
                      build_cfapyx_interim, build_cfdm_interim, build_nca, make_truth, write_fragment_file,
                      write_netcdf)

pytestmark = pytest.mark.usefixtures("other_cwd", "sync_dask")

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (2, 3))  # 3 x 1 x 2 grid
SHAPE = (6, 4, 5)


def truth(**kw):
    return make_truth(SHAPE, "f4", seed=11, **kw)


def _var_ok(err, variable):
    return err.variable is not None and err.variable.lstrip("/") == variable.lstrip("/")


def expect_open_error(path, variable="tas", cls=daskcfa.CFAFormatError, mentions=()):
    """Opening (parsing the aggregation file) must raise ``cls`` naming file and variable."""
    with pytest.raises(daskcfa.CFAError) as info:
        daskcfa.from_cfa(str(path), variable)
    err = info.value
    assert type(err) is cls or isinstance(err, cls), f"expected {cls.__name__}, got {type(err).__name__}: {err}"
    name = Path(path).name
    assert err.file is not None and name in err.file, f".file should name {name}: {err.file!r}"
    assert name in str(err)
    if variable is not None:
        assert _var_ok(err, variable), f".variable should be {variable!r}: {err.variable!r}"
        assert variable.lstrip("/") in str(err)
    for word in mentions:
        assert word in str(err), f"message should mention {word!r}: {err}"
    return err


def expect_compute_error(built, cls, index, *, key=None):
    """Opening succeeds (lazy); computing raises ``cls`` naming the fragment."""
    x = daskcfa.from_cfa(str(built.path), built.variable)
    with pytest.raises(daskcfa.CFAError) as info:
        (x if key is None else x[key]).compute()
    err = info.value
    assert isinstance(err, cls), f"expected {cls.__name__}, got {type(err).__name__}: {err}"
    assert isinstance(err, daskcfa.FragmentError)
    assert err.fragment == tuple(index), f".fragment should be {index}: {err.fragment}"
    assert _var_ok(err, built.variable)
    fragment_name = Path(built.fragment_uris[tuple(index)][0]).name
    assert fragment_name in str(err), f"message should name {fragment_name}: {err}"
    assert str(tuple(index)) in str(err)
    assert "tas" in str(err)
    return err


def good(tmp_path, **kw):
    return build_cf113(tmp_path, truth(), DIMS, SIZES, **kw)


def set_attr(path, name, value, variable="tas"):
    with netCDF4.Dataset(str(path), "a") as ds:
        ds[variable].setncattr(name, value)


def add_var(path, name, dtype, dims, data, new_dims=None):
    with netCDF4.Dataset(str(path), "a") as ds:
        for d, n in (new_dims or {}).items():
            ds.createDimension(d, n)
        if dtype is str:
            v = ds.createVariable(name, str, dims)
            v[...] = np.asarray(data, dtype=object)
        else:
            v = ds.createVariable(name, dtype, dims, fill_value=False)
            v[...] = np.asarray(data, dtype=dtype)


AGG_DATA = "map: fragment_map uris: fragment_uris identifiers: fragment_identifiers"


# ---------------------------------------------------------------------------
# The map
# ---------------------------------------------------------------------------
def test_map_row_not_summing_to_dimension_size(tmp_path):
    b = good(tmp_path)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        m = ds["fragment_map"]
        m.set_auto_mask(False)
        row = m[0, :]
        row[2] = 2  # time: 2 + 3 + 2 = 7 != 6
        m[0, :] = row
    expect_open_error(b.path, mentions=("time",))


def test_map_row_too_small(tmp_path):
    b = good(tmp_path)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        m = ds["fragment_map"]
        m[2, 0] = 1  # lon: 1 + 3 = 4 != 5
    expect_open_error(b.path, mentions=("lon",))


def test_map_with_wrong_number_of_rows(tmp_path):
    b = good(tmp_path)
    add_var(b.path, "short_map", "i4", ("two", "j"), [[2, 3, 1], [4, 0, 0]], new_dims={"two": 2})
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_map", "short_map"))
    expect_open_error(b.path)


def test_map_with_too_many_rows(tmp_path):
    b = good(tmp_path)
    add_var(b.path, "long_map", "i4", ("four", "j3"), [[2, 3, 1], [4, -1, -1], [2, 3, -1], [1, -1, -1]],
            new_dims={"four": 4, "j3": 3})
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_map", "long_map"))
    expect_open_error(b.path)


def test_non_integer_map(tmp_path):
    b = good(tmp_path)
    add_var(b.path, "float_map", "f8", ("i", "j"), [[2.5, 3.5, 0.0], [4.0, -1, -1], [2.0, 3.0, -1]])
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_map", "float_map"))
    expect_open_error(b.path)


def test_string_map(tmp_path):
    b = good(tmp_path)
    add_var(b.path, "text_map", str, ("i", "j"), [["2", "3", "1"], ["4", "", ""], ["2", "3", ""]])
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_map", "text_map"))
    expect_open_error(b.path)


def test_zero_only_map_row(tmp_path):
    b = good(tmp_path)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        ds["fragment_map"][1, :] = [0, 0, 0]  # lat: no fragment at all
    expect_open_error(b.path, mentions=("lat",))


def test_negative_map_row(tmp_path):
    b = good(tmp_path)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        ds["fragment_map"][1, :] = [-4, -4, -4]
    expect_open_error(b.path, mentions=("lat",))


def test_map_claiming_a_trillion_fragments_is_refused_up_front(tmp_path):
    """A tiny file whose map describes 10**12 fragments: refuse, do not allocate.

    Run in a child process with a 3 GiB address-space limit and a timeout, so
    that a reader that tries to materialise the grid fails fast instead of
    eating the shared machine.
    """
    n = 10_000
    path = tmp_path / "huge.nc"
    write_netcdf(
        path,
        dims={"time": n, "lat": n, "lon": n, "i": 3, "j": n, "f_time": n, "f_lat": n, "f_lon": n},
        variables={
            "tas": dict(dtype="f4", attrs={"units": "K", "aggregated_dimensions": "time lat lon",
                                           "aggregated_data": AGG_DATA}),
            "fragment_map": dict(dtype="i4", dims=("i", "j"), data=np.ones((3, n), "i4")),
            "fragment_uris": dict(dtype="vlen", dims=("f_time", "f_lat", "f_lon")),  # declared, never written
            "fragment_identifiers": dict(dtype="vlen", dims=(), data="tas"),
        },
    )
    assert path.stat().st_size < 1_000_000
    code = textwrap.dedent(f"""
        import resource, sys
        limit = 3 * 1024 ** 3
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        import daskcfa
        try:
            x = daskcfa.from_cfa({str(path)!r}, "tas")
            print("OPENED", x.npartitions)
        except daskcfa.CFAError as e:
            print("CFAERROR", type(e).__name__, e.variable, e.file)
            print(str(e))
        except MemoryError:
            print("MEMORYERROR")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    out = proc.stdout
    assert out.startswith("CFAERROR CFAFormatError"), (out, proc.stderr[-2000:])
    assert "huge.nc" in out and "tas" in out


# ---------------------------------------------------------------------------
# aggregated_dimensions / aggregated_data
# ---------------------------------------------------------------------------
def test_unknown_aggregated_dimension(tmp_path):
    b = good(tmp_path)
    set_attr(b.path, "aggregated_dimensions", "time lat height")
    expect_open_error(b.path, mentions=("height",))


def test_aggregated_data_names_a_nonexistent_variable(tmp_path):
    b = good(tmp_path)
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_uris", "no_such_var"))
    expect_open_error(b.path, mentions=("no_such_var",))


def test_aggregated_data_names_a_variable_in_a_nonexistent_group(tmp_path):
    b = good(tmp_path)
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_uris", "/nogroup/fragment_uris"))
    expect_open_error(b.path, mentions=("/nogroup/fragment_uris",))


def test_missing_map_keyword(tmp_path):
    b = good(tmp_path)
    set_attr(b.path, "aggregated_data", "uris: fragment_uris identifiers: fragment_identifiers")
    expect_open_error(b.path, mentions=("map",))


def test_only_unknown_keywords(tmp_path):
    b = good(tmp_path)
    set_attr(b.path, "aggregated_data", "foo: fragment_map bar: fragment_uris")
    expect_open_error(b.path)


def test_cf_keywords_are_case_sensitive(tmp_path):
    """CF-1.13 keywords are case-sensitive: "Map:" is not "map:"."""
    b = good(tmp_path)
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("map:", "Map:"))
    expect_open_error(b.path, mentions=("map",))


def test_dangling_keyword_in_aggregated_data(tmp_path):
    b = good(tmp_path)
    set_attr(b.path, "aggregated_data", AGG_DATA + " unique_values:")
    expect_open_error(b.path)


def test_aggregated_data_without_colons(tmp_path):
    b = good(tmp_path)
    set_attr(b.path, "aggregated_data", "fragment_map fragment_uris fragment_identifiers")
    expect_open_error(b.path)


def test_aggregated_dimensions_without_aggregated_data(tmp_path):
    b = good(tmp_path)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        ds["tas"].delncattr("aggregated_data")
    expect_open_error(b.path)


def test_uris_shape_inconsistent_with_map(tmp_path):
    b = good(tmp_path)
    add_var(b.path, "few_uris", str, ("f_time", "f_lat", "one"), [[[u]] for u in ["a.nc", "b.nc", "c.nc"]],
            new_dims={"one": 1})
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_uris", "few_uris"))
    expect_open_error(b.path, mentions=("few_uris",))


def test_identifiers_shape_inconsistent_with_map(tmp_path):
    b = good(tmp_path)
    add_var(b.path, "bad_ids", str, ("f_time",), ["tas", "tas", "tas"])
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_identifiers", "bad_ids"))
    expect_open_error(b.path)


def test_unique_values_shape_inconsistent_with_map(tmp_path):
    u = np.ma.ones((4, 6))
    b = build_cf113(tmp_path, u, ("y", "x"), ((2, 2), (3, 3)), unique=True)
    add_var(b.path, "bad_unique", "f8", ("f_y", "three"), [[1.0, 2.0, 3.0]] * 2, new_dims={"three": 3})
    set_attr(b.path, "aggregated_data", "map: fragment_map unique_values: bad_unique")
    expect_open_error(b.path, mentions=("bad_unique",))


def test_aggregation_variable_with_dimensions(tmp_path):
    """The CF-1.13 aggregation variable must be scalar."""
    b = good(tmp_path)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        v = ds.createVariable("tas2", "f4", ("lat",))
        v.aggregated_dimensions = "time lat lon"
        v.aggregated_data = AGG_DATA
    expect_open_error(b.path, variable="tas2")


def test_cfa06_missing_location_term(tmp_path):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES)
    set_attr(b.path, "aggregated_data", "file: cfa_file format: cfa_format address: cfa_address")
    expect_open_error(b.path, mentions=("location",))


def test_cfa06_bad_substitutions(tmp_path):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, substitutions=True)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        ds["cfa_file"].substitutions = "${BASE} file:///nowhere/ ${X}"
    expect_open_error(b.path)


# ---------------------------------------------------------------------------
# Legacy dialects
# ---------------------------------------------------------------------------
def test_cfa04_malformed_json(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES, json_override='{"pmshape": [3, 1, 2], "Partitions": [{"index": ')
    expect_open_error(b.path)


def test_cfa04_json_not_an_object(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES, json_override="[1, 2, 3]")
    expect_open_error(b.path)


def _cfa04_doc(b):
    with netCDF4.Dataset(str(b.path)) as ds:
        return json.loads(ds["tas"].cfa_array)


def test_cfa04_partition_location_out_of_range(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES)
    doc = _cfa04_doc(b)
    doc["Partitions"][-1]["location"][2] = [2, 9]  # lon has 5 points (inclusive end 9)
    set_attr(b.path, "cfa_array", json.dumps(doc))
    expect_open_error(b.path)


def test_cfa04_partition_index_out_of_range(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES)
    doc = _cfa04_doc(b)
    doc["Partitions"][0]["index"] = [7, 0, 0]  # pmshape is [3, 1, 2]
    set_attr(b.path, "cfa_array", json.dumps(doc))
    expect_open_error(b.path)


def test_cfa04_partition_without_subarray(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES)
    doc = _cfa04_doc(b)
    del doc["Partitions"][1]["subarray"]
    set_attr(b.path, "cfa_array", json.dumps(doc))
    expect_open_error(b.path)


def test_cfa04_negative_location(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES)
    doc = _cfa04_doc(b)
    doc["Partitions"][0]["location"][0] = [-3, 1]
    set_attr(b.path, "cfa_array", json.dumps(doc))
    expect_open_error(b.path)


def test_cfa04_duplicate_partition(tmp_path):
    """Two partitions at the same index (and place), one place never covered."""
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES)
    doc = _cfa04_doc(b)
    doc["Partitions"][1] = json.loads(json.dumps(doc["Partitions"][0]))
    set_attr(b.path, "cfa_array", json.dumps(doc))
    expect_open_error(b.path)


def test_cfa04_pmshape_disagrees_with_dimensions(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES)
    doc = _cfa04_doc(b)
    doc["pmshape"] = [3, 1]
    set_attr(b.path, "cfa_array", json.dumps(doc))
    expect_open_error(b.path)


def test_cfa05_location_disagrees_with_shape(tmp_path):
    b = build_cfa05(tmp_path, truth(), DIMS, SIZES)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        loc = ds["cfa_tas"]["location"]
        loc[0, 0, 0, 0, :] = [0, 3]  # time [0, 3) but the next partition starts at 2
    expect_open_error(b.path)


def test_nca_partition_out_of_range(tmp_path):
    b = build_nca(tmp_path, truth(), DIMS, SIZES)
    with netCDF4.Dataset(str(b.path)) as ds:
        doc = json.loads(ds["tas"].nca_array)
    doc["Partitions"][-1]["location"][0] = [5, 60]
    set_attr(b.path, "nca_array", json.dumps(doc))
    expect_open_error(b.path)


def test_numeric_uris_variable(tmp_path):
    b = good(tmp_path)
    add_var(b.path, "number_uris", "i4", ("f_time", "f_lat", "f_lon"), np.zeros((3, 1, 2), "i4"))
    set_attr(b.path, "aggregated_data", AGG_DATA.replace("fragment_uris", "number_uris"))
    expect_open_error(b.path)


def test_cfa06_float_location(tmp_path):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES)
    add_var(b.path, "float_location", "f4", ("cfa_ndim", "cfa_nmax"), [[2, 3, 1.5], [4, 0, 0], [2, 3, 0]])
    set_attr(b.path, "aggregated_data", "location: float_location file: cfa_file format: cfa_format address: cfa_address")
    expect_open_error(b.path)


def test_nca_malformed_json(tmp_path):
    b = build_nca(tmp_path, truth(), DIMS, SIZES)
    set_attr(b.path, "nca_array", "{not json")
    expect_open_error(b.path)


def test_cfa_role_without_instructions(tmp_path):
    b = build_cfa04(tmp_path, truth(), DIMS, SIZES)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        ds["tas"].delncattr("cfa_array")
    expect_open_error(b.path)


def test_cfa05_missing_group(tmp_path):
    b = build_cfa05(tmp_path, truth(), DIMS, SIZES)
    set_attr(b.path, "cfa_group", "cfa_nothing")
    expect_open_error(b.path, mentions=("cfa_nothing",))


def test_cfa05_group_missing_a_variable(tmp_path):
    b = build_cfa05(tmp_path, truth(), DIMS, SIZES)
    with netCDF4.Dataset(str(b.path), "a") as ds:
        ds["cfa_tas"].renameVariable("location", "not_location")
    expect_open_error(b.path)


# ---------------------------------------------------------------------------
# Variable selection
# ---------------------------------------------------------------------------
def test_ambiguous_variable(tmp_path):
    b = build_cf113(tmp_path, truth(), DIMS, SIZES, name="tas")
    build_cf113(tmp_path, truth(), DIMS, SIZES, name="pr", append=True, units="kg m-2 s-1")
    with pytest.raises(daskcfa.VariableNotFoundError) as info:
        daskcfa.from_cfa(str(b.path))
    err = info.value
    assert "tas" in str(err) and "pr" in str(err)
    assert err.file is not None and "aggregation.nc" in err.file and "aggregation.nc" in str(err)


def test_unknown_variable_name(tmp_path):
    b = good(tmp_path)
    with pytest.raises(daskcfa.VariableNotFoundError) as info:
        daskcfa.from_cfa(str(b.path), "precip")
    err = info.value
    assert "precip" in str(err)
    assert "tas" in str(err), "the message should list the aggregated variables"
    assert err.file is not None and "aggregation.nc" in err.file


def test_unknown_variable_in_group(tmp_path):
    b = good(tmp_path, group="grp")
    with pytest.raises(daskcfa.VariableNotFoundError) as info:
        daskcfa.from_cfa(str(b.path), "/other/tas")
    assert "/other/tas" in str(info.value)


def test_file_without_aggregated_variables(tmp_path):
    path = write_netcdf(tmp_path / "plain.nc", dims={"x": 3},
                        variables={"x": dict(dtype="f8", dims=("x",), data=[1.0, 2.0, 3.0])})
    with pytest.raises(daskcfa.VariableNotFoundError) as info:
        daskcfa.from_cfa(str(path))
    assert "plain.nc" in str(info.value)


def test_aggregation_file_is_not_netcdf(tmp_path):
    path = tmp_path / "garbage.nc"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(daskcfa.CFAError) as info:
        daskcfa.from_cfa(str(path), "tas")
    assert "garbage.nc" in str(info.value)


# ---------------------------------------------------------------------------
# Fragment problems: raised at compute time, naming the fragment
# ---------------------------------------------------------------------------
def test_units_not_convertible(tmp_path):
    b = good(tmp_path, frags={(1, 0, 1): Frag(units="m", raw_units=True)})
    err = expect_compute_error(b, daskcfa.UnitsError, (1, 0, 1))
    assert "m" in str(err) and "K" in str(err)
    # the other fragments are fine
    x = daskcfa.from_cfa(str(b.path), "tas")
    assert_matches(x[:2].compute(), b.expected[:2])


def test_units_unparseable(tmp_path):
    b = good(tmp_path, frags={(0, 0, 0): Frag(units="furlongs per banana", raw_units=True)})
    expect_compute_error(b, daskcfa.UnitsError, (0, 0, 0))


def test_time_units_against_plain_units(tmp_path):
    t = np.ma.MaskedArray(np.arange(12.0))
    b = build_cf113(tmp_path, t, ("time",), ((6, 6),), units="days since 2000-01-01",
                    frags={(1,): Frag(units="K", raw_units=True)})
    expect_compute_error(b, daskcfa.UnitsError, (1,))


def test_missing_fragment_file(tmp_path):
    b = good(tmp_path, frags={(2, 0, 0): Frag(write_file=False)})
    expect_compute_error(b, daskcfa.MissingFragmentError, (2, 0, 0))


def test_missing_fragment_absolute_uri(tmp_path):
    b = good(tmp_path, uri_style="file", frags={(0, 0, 1): Frag(write_file=False)})
    expect_compute_error(b, daskcfa.MissingFragmentError, (0, 0, 1))


def test_missing_fragment_all_alternatives(tmp_path):
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, alternatives=True, frags={(0, 0, 0): Frag(write_file=False)})
    x = daskcfa.from_cfa(str(b.path), "tas")
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    assert info.value.fragment == (0, 0, 0)


def test_fragment_random_bytes(tmp_path):
    b = good(tmp_path)
    b.fragment_files[(1, 0, 0)].write_bytes(os.urandom(2048))
    expect_compute_error(b, daskcfa.FragmentReadError, (1, 0, 0))


def test_fragment_truncated(tmp_path):
    b = good(tmp_path)
    p = b.fragment_files[(0, 0, 1)]
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    expect_compute_error(b, daskcfa.FragmentReadError, (0, 0, 1))


def test_fragment_empty_file(tmp_path):
    b = good(tmp_path)
    b.fragment_files[(2, 0, 1)].write_bytes(b"")
    expect_compute_error(b, daskcfa.FragmentReadError, (2, 0, 1))


def test_fragment_wrong_shape(tmp_path):
    b = good(tmp_path, frags={(0, 0, 0): Frag(write_file=False)})
    write_fragment_file(b.fragment_files[(0, 0, 0)], "tas", DIMS, np.zeros((3, 4, 2), "f4"), {"units": "K"})
    expect_compute_error(b, daskcfa.FragmentShapeError, (0, 0, 0))


def test_fragment_missing_a_dimension_longer_than_one(tmp_path):
    b = good(tmp_path, frags={(1, 0, 1): Frag(write_file=False)})
    write_fragment_file(b.fragment_files[(1, 0, 1)], "tas", ("time", "lon"), np.zeros((3, 3), "f4"), {"units": "K"})
    expect_compute_error(b, daskcfa.FragmentShapeError, (1, 0, 1))


def test_fragment_with_an_extra_dimension_longer_than_one(tmp_path):
    b = good(tmp_path, frags={(1, 0, 1): Frag(write_file=False)})
    write_fragment_file(b.fragment_files[(1, 0, 1)], "tas", ("ens",) + DIMS, np.zeros((2, 3, 4, 3), "f4"),
                        {"units": "K"})
    expect_compute_error(b, daskcfa.FragmentShapeError, (1, 0, 1))


def test_identifier_absent_in_fragment(tmp_path):
    b = good(tmp_path, frags={(2, 0, 1): Frag(identifier="air_temperature")}, identifiers="per-fragment")
    p = b.fragment_files[(2, 0, 1)]
    with netCDF4.Dataset(str(p), "a") as ds:
        ds.renameVariable("air_temperature", "something_else")
    err = expect_compute_error(b, daskcfa.FragmentReadError, (2, 0, 1))
    assert "air_temperature" in str(err)


def test_identifier_group_absent_in_fragment(tmp_path):
    b = good(tmp_path, frags=lambda i: Frag(identifier="/model/tas"))
    p = b.fragment_files[(0, 0, 1)]
    p.unlink()
    write_fragment_file(p, "tas", DIMS, np.zeros((2, 4, 3), "f4"), {"units": "K"})  # tas in root, not /model
    expect_compute_error(b, daskcfa.FragmentReadError, (0, 0, 1))


def test_fragment_variable_is_text(tmp_path):
    b = good(tmp_path, frags={(0, 0, 0): Frag(write_file=False)})
    p = b.fragment_files[(0, 0, 0)]
    write_netcdf(p, dims={"time": 2, "lat": 4, "lon": 2},
                 variables={"tas": dict(dtype="vlen", dims=DIMS, data=np.full((2, 4, 2), "x", dtype=object))})
    with pytest.raises(daskcfa.FragmentError) as info:
        daskcfa.from_cfa(str(b.path), "tas").compute()
    assert info.value.fragment == (0, 0, 0)


@pytest.mark.parametrize("kind", ["missing", "not-netcdf", "shape", "units"])
def test_fragment_error_file_attribute_names_the_fragment(tmp_path, kind):
    """``.file`` of a fragment error is the fragment's URI (the file to look at), not the aggregation file."""
    frags = {(1, 0, 0): Frag(write_file=kind not in ("missing", "shape"),
                             units="m" if kind == "units" else None, raw_units=kind == "units")}
    b = good(tmp_path, frags=frags)
    p = b.fragment_files[(1, 0, 0)]
    if kind == "not-netcdf":
        p.write_bytes(b"hello, not netCDF" * 20)
    elif kind == "shape":
        write_fragment_file(p, "tas", DIMS, np.zeros((3, 4, 1), "f4"), {"units": "K"})
    with pytest.raises(daskcfa.FragmentError) as info:
        daskcfa.from_cfa(str(b.path), "tas").compute()
    err = info.value
    assert err.fragment == (1, 0, 0)
    assert err.file is not None and "aggregation.tas.1.0.0.nc" in err.file, err.file


def test_errors_survive_pickling(tmp_path):
    """Errors cross process boundaries (distributed workers) with their location."""
    import pickle

    b = good(tmp_path, frags={(2, 0, 0): Frag(write_file=False)})
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        daskcfa.from_cfa(str(b.path), "tas").compute()
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is type(info.value)
    assert (again.file, again.variable, again.fragment) == (info.value.file, info.value.variable, info.value.fragment)
    assert str(again) == str(info.value)


# ---------------------------------------------------------------------------
# Tolerated oddities: warn, do not fail
# ---------------------------------------------------------------------------
def test_cfa06_extra_term_warns_but_reads(tmp_path):
    grid = np.array([[[f"id-{i}-{k}" for k in range(2)]] for i in range(3)], dtype=object)
    b = build_cfa06(tmp_path, truth(), DIMS, SIZES, extra_terms={"tracking_id": grid})
    with pytest.warns(daskcfa.CFAWarning, match="tracking_id"):
        x = daskcfa.from_cfa(str(b.path), "tas")
        got = x.compute()
    assert x.chunks == b.chunks
    assert_matches(got, b.expected)


def test_valid_file_gives_no_warning(tmp_path):
    b = good(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", daskcfa.CFAWarning)
        daskcfa.from_cfa(str(b.path), "tas").compute()


# ---------------------------------------------------------------------------
# Interim dialects too
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("builder,kw", [(build_cfdm_interim, "location"), (build_cfapyx_interim, "location")])
def test_interim_dialect_names_a_nonexistent_variable(tmp_path, builder, kw):
    b = builder(tmp_path, truth(), DIMS, SIZES)
    with netCDF4.Dataset(str(b.path)) as ds:
        text = ds["tas"].aggregated_data
    set_attr(b.path, "aggregated_data", text.replace("fragment_uris", "ghost_uris"))
    expect_open_error(b.path, mentions=("ghost_uris",))


@pytest.mark.parametrize("builder", [build_cfdm_interim, build_cfapyx_interim])
def test_interim_dialect_missing_fragment(tmp_path, builder):
    b = builder(tmp_path, truth(), DIMS, SIZES, frags={(1, 0, 1): Frag(write_file=False)})
    expect_compute_error(b, daskcfa.MissingFragmentError, (1, 0, 1))
