"""The same update through both front ends gives the same archive (issue 30).

Each archive is built once (real netCDF files: the test builders, or
daskcfa's own writers), copied twice, and updated the same way through
``to_cfa(mode="r+", region=...)`` / ``to_cfa(mode="a", append_dim=...)`` on
one copy and through ``daskcfa.netcdf4.Dataset(url, "a")`` on the other.
The two results must agree on the aggregation variable's encoding, on every
fragment's stored values bit for bit (or its unique value), and both must
read back as the numpy ground truth.
"""

from __future__ import annotations

import shutil

import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import Frag, assert_matches, build_cf113, build_nca, build_nca_virtual, make_truth
from daskcfa.errors import CFAFormatError
from daskcfa.netcdf4 import Dataset
from daskcfa.storage import resolve

DIMS = ("time", "lat", "lon")
SIZES = ((4, 4), (3,), (4,))
SHAPE = (8, 3, 4)
SCALE, OFFSET, FILL = 0.01, 273.15, np.int16(-32768)
#: the attributes that say how values are stored
ENCODING = ("scale_factor", "add_offset", "_FillValue", "missing_value")


def packed(truth: np.ma.MaskedArray) -> np.ma.MaskedArray:
    """``truth`` as an int16 variable packed with SCALE and OFFSET reads it back."""
    stored = np.round((np.ma.getdata(truth).astype("f8") - OFFSET) / SCALE)
    return np.ma.MaskedArray(stored * SCALE + OFFSET, mask=np.ma.getmaskarray(truth))


def packed_archive(directory, *, unlimited: bool = False, sizes=SIZES):
    """int16 fragments packed by the aggregation variable (scale_factor, add_offset, _FillValue on it)."""
    truth = make_truth(tuple(sum(row) for row in sizes), "f8", masked=0.1, seed=1, lo=-20, hi=60)
    if unlimited:  # the aggregation file made first, with time unlimited (the builder adds to it)
        directory.mkdir(parents=True)
        with netCDF4.Dataset(directory / "aggregation.nc", "w") as nc:
            nc.Conventions = "CF-1.13"
            nc.createDimension("time", None)
    built = build_cf113(directory, truth, DIMS, sizes, agg_scale_factor=SCALE, agg_add_offset=OFFSET,
                        fill_value=FILL, append=unlimited)
    return built.path, built.expected


def missing_value_archive(directory):
    """float32 fragments whose missing points hold -999: the missing_value of the fragments and of the
    aggregation variable (no _FillValue)."""
    truth = make_truth(SHAPE, "f4", masked=0.2, seed=3)
    built = build_cf113(directory, truth, DIMS, SIZES, attrs={"missing_value": np.float32(-999)},
                        frags=lambda index: Frag(missing="missing_value", fill_value=-999))
    return built.path, built.expected


def unique_archive(directory):
    """CF-1.13 fragments given by their unique values."""
    truth = np.ma.MaskedArray(np.empty(SHAPE, "f4"), mask=False)
    truth[:4], truth[4:] = 280.5, 290.25
    built = build_cf113(directory, truth, DIMS, SIZES, unique=True)
    return built.path, built.expected


def xarray_packed_archive(directory):
    """int16 packed per fragment, as to_cfa writes an xarray Dataset with packing in its encoding."""
    import xarray as xr

    truth = make_truth(SHAPE, "f8", masked=0.1, seed=4, lo=-20, hi=60)
    ds = xr.Dataset({"tas": (DIMS, np.ma.filled(truth, np.nan))}, coords={"time": np.arange(8.0)})
    ds["tas"].encoding = {"dtype": "int16", "scale_factor": SCALE, "add_offset": OFFSET, "_FillValue": FILL}
    directory.mkdir(parents=True)
    url = daskcfa.to_cfa(ds, str(directory / "aggregation.nc"), fragment_shape=(4, 3, 4))
    return url, packed(truth)


def copies(tmp_path, make):
    """The archive ``make`` builds, twice: (to_cfa's copy, Dataset's copy, ground truth)."""
    url, truth = make(tmp_path / "src")
    name = str(url).rpartition("/")[2]
    for copy in ("to_cfa", "dataset"):
        shutil.copytree(tmp_path / "src", tmp_path / copy)
    return str(tmp_path / "to_cfa" / name), str(tmp_path / "dataset" / name), truth


def encoding(url):
    with netCDF4.Dataset(url) as nc:
        var = nc["tas"]
        return var.dtype, {k: var.getncattr(k) for k in ENCODING if k in var.ncattrs()}


def stored(url):
    """Every fragment as stored: its unique value, or its file variable's dtype, encoding
    attributes and raw values; None for a missing fragment."""
    av = daskcfa.read_aggregation(url, "tas")
    out = {}
    for index in av.fragments.grid.indices():
        ref = av.fragments[index]
        if ref.value is not None:
            out[index] = ("unique", ref.value)
        elif ref.uris:
            with netCDF4.Dataset(resolve(ref.uris[0], url)) as nc:
                var = nc[ref.identifier or "tas"]
                var.set_auto_maskandscale(False)
                attrs = {k: var.getncattr(k) for k in ENCODING if k in var.ncattrs()}
                out[index] = (var.dtype, attrs, np.asarray(var[...]))
        else:
            out[index] = None
    return out


def assert_same_archives(a, b):
    assert encoding(a) == encoding(b)
    left, right = stored(a), stored(b)
    assert left.keys() == right.keys()
    for index in left:
        x, y = left[index], right[index]
        assert (x is None) == (y is None), index
        if x is None:
            continue
        assert len(x) == len(y) and x[:-1] == y[:-1], (index, x[:-1], y[:-1])
        np.testing.assert_array_equal(x[-1], y[-1], err_msg=f"fragment {index} stored differently")


def update_both_ways(via_to_cfa, via_dataset, truth, new, region, buffer_size):
    """``new`` into ``region`` along time through ``to_cfa(mode="r+")`` and, one time step at a time,
    through ``Dataset(url, "a")``; the values both should read."""
    daskcfa.to_cfa(new, via_to_cfa, mode="r+", region={"time": region})
    with Dataset(via_dataset, "a", buffer_size=buffer_size) as ds:
        for step, t in enumerate(range(region.start, region.stop)):
            ds["tas"][t] = new[step]
    expected = truth.copy()
    expected[region] = new
    return expected


CASES = {
    "packed-aggregation": (packed_archive, 0.5 * SCALE + 1e-9),
    "missing_value": (missing_value_archive, 0.0),
    "unique_values": (unique_archive, 0.0),
    "packed-fragments": (xarray_packed_archive, 0.5 * SCALE + 1e-9),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("region", [slice(1, 3), slice(3, 6)], ids=["inside-one", "across-two"])
@pytest.mark.parametrize("buffer_size", [None, 1], ids=["buffered", "spilled"])
def test_region_update_is_the_same_through_both_front_ends(tmp_path, case, region, buffer_size):
    """``buffer_size=1``: the Dataset writes each assignment's fragments at once, incomplete, and reads
    them back for the next assignment (one time step at a time)."""
    make, atol = CASES[case]
    via_to_cfa, via_dataset, truth = copies(tmp_path, make)
    new = make_truth((region.stop - region.start, 3, 4), "f8", masked=0.25, seed=7, lo=-10, hi=60)
    new[0, 0, 0] = 53.43
    if case == "unique_values" and region == slice(1, 3):
        # one fragment rewritten in a file, the other unique-valued: CF-1.13 has no way to say so
        before = stored(via_to_cfa)
        with pytest.raises(CFAFormatError, match="cannot mix unique-valued fragments"):
            daskcfa.to_cfa(new, via_to_cfa, mode="r+", region={"time": region})
        with pytest.raises(CFAFormatError, match="cannot mix unique-valued fragments"):
            with Dataset(via_dataset, "a", buffer_size=buffer_size) as ds:
                ds["tas"][region] = new
        for url in (via_to_cfa, via_dataset):
            assert stored(url) == before
            assert_matches(daskcfa.from_cfa(url).compute(), truth)
        return
    expected = update_both_ways(via_to_cfa, via_dataset, truth, new, region, buffer_size)
    for url in (via_to_cfa, via_dataset):
        assert_matches(daskcfa.from_cfa(url).compute(), expected, atol=atol, rtol=1e-6)
    assert_same_archives(via_to_cfa, via_dataset)


@pytest.mark.parametrize("mode", ["a", "r+"])
def test_append_to_packed_aggregation_is_the_same_through_both_front_ends(tmp_path, mode):
    via_to_cfa, via_dataset, truth = copies(tmp_path, lambda d: packed_archive(d, unlimited=True))
    new = make_truth((4, 3, 4), "f8", masked=0.25, seed=8, lo=-10, hi=60)
    times = np.arange(8.0, 12.0) * 1.5 + 10.0
    daskcfa.to_cfa(new, via_to_cfa, mode="a", append_dim="time", coords={"time": times})
    with Dataset(via_dataset, mode) as ds:
        ds["tas"][8:12] = new
        ds["time"][8:12] = times
    expected = np.ma.concatenate([truth, packed(new)])
    for url in (via_to_cfa, via_dataset):
        assert_matches(daskcfa.from_cfa(url).compute(), expected, atol=1e-9, rtol=1e-9)
    assert_same_archives(via_to_cfa, via_dataset)


def test_update_keeps_unique_valued_fragments_it_does_not_assign(tmp_path):
    """Before issue 30, Dataset(url, "a") refused any archive with unique_values fragments."""
    url, truth = unique_archive(tmp_path / "u")
    before = stored(str(url))
    with Dataset(str(url), "a") as ds:
        ds.comment = "updated"
        ds["tas"].long_name = "air temperature"
    assert stored(str(url)) == before == {(0, 0, 0): ("unique", 280.5), (1, 0, 0): ("unique", 290.25)}
    opened = daskcfa.open_cfa(str(url))
    assert (opened.attrs["comment"], opened["tas"].attrs["long_name"]) == ("updated", "air temperature")
    assert_matches(daskcfa.from_cfa(str(url)).compute(), truth)


def test_append_completing_a_short_packed_fragment_keeps_its_stored_values(tmp_path):
    """The last fragment along the unlimited dimension holds 2 of 4 steps: appending rewrites it
    with its 2 stored steps bit for bit (its missing points as the aggregation's fill value, whose
    encoding it now carries) and the 2 new ones packed, then starts a new fragment."""
    url, truth = packed_archive(tmp_path / "p", unlimited=True, sizes=((4, 2), (3,), (4,)))
    url = str(url)
    before = stored(url)
    new = make_truth((4, 3, 4), "f8", masked=0.25, seed=9, lo=-10, hi=60)
    with Dataset(url, "a") as ds:
        ds["tas"][6:10] = new
        ds["time"][6:10] = np.arange(6.0, 10.0)
    after = stored(url)
    assert encoding(url) == (np.dtype("i2"), {"scale_factor": SCALE, "add_offset": OFFSET, "_FillValue": FILL})
    np.testing.assert_array_equal(after[(0, 0, 0)][-1], before[(0, 0, 0)][-1])
    grown = after[(1, 0, 0)][-1]
    assert grown.shape == (4, 3, 4) and after[(2, 0, 0)][-1].shape == (2, 3, 4)
    _, attrs, held = before[(1, 0, 0)]  # (the builder's fragments have a _FillValue of their own)
    np.testing.assert_array_equal(grown[:2], np.where(held == attrs["_FillValue"], FILL, held))
    expected = np.ma.concatenate([truth, packed(new)])
    assert_matches(daskcfa.from_cfa(url).compute(), expected, atol=1e-9, rtol=1e-9)


def test_packed_region_update_on_s3_is_the_same_through_both_front_ends(tmp_path, s3_server):
    """On the S3 test server; the two updated archives are then downloaded and compared bit for bit."""
    url, truth = packed_archive(tmp_path / "src")
    fs, bucket, options = s3_server.filesystem(), s3_server.new_bucket(), s3_server.storage_options
    urls = {}
    for copy in ("to_cfa", "dataset"):
        fs.put(str(tmp_path / "src") + "/", f"{bucket}/{copy}/", recursive=True)
        urls[copy] = f"s3://{bucket}/{copy}/{url.name}"
    new = make_truth((3, 3, 4), "f8", masked=0.25, seed=10, lo=-10, hi=60)
    daskcfa.to_cfa(new, urls["to_cfa"], mode="r+", region={"time": slice(2, 5)}, storage_options=options)
    with Dataset(urls["dataset"], "a", storage_options=options) as ds:
        ds["tas"][2:5] = new
    expected = truth.copy()
    expected[2:5] = packed(new)
    local = {}
    for copy, remote in urls.items():
        assert_matches(daskcfa.from_cfa(remote, storage_options=options).compute(), expected, atol=1e-9, rtol=1e-9)
        fs.get(f"{bucket}/{copy}/", str(tmp_path / "back" / copy) + "/", recursive=True)
        local[copy] = str(tmp_path / "back" / copy / url.name)
    assert_same_archives(local["to_cfa"], local["dataset"])


@pytest.mark.parametrize("form", [{"reverse": (True, False, False)}, {"transpose": (0, 2, 1)}],
                         ids=["reversed", "transposed"])
def test_update_refuses_kept_fragments_the_format_cannot_describe(tmp_path, form):
    """An NCA fragment stored reversed or transposed, kept by an update converting the archive to
    CF-1.13: refused by both front ends, the archive unchanged. (Before, the update dropped how the
    fragment lies in its file: a reversed one then read back reversed, silently, a transposed one
    failed to read; Dataset(url, "a") refused a reversed one.)"""
    truth = make_truth(SHAPE, "f8", seed=11)
    built = build_nca(tmp_path / "n", truth, DIMS, SIZES, frags={(1, 0, 0): Frag(**form)})
    url = str(built.path)
    files = {p: p.read_bytes() for p in (tmp_path / "n").rglob("*") if p.is_file()}
    with pytest.raises(CFAFormatError, match="fragments with their own"):
        daskcfa.to_cfa(np.ones((2, 3, 4)), url, mode="r+", region={"time": slice(0, 2)}, format="CF-1.13")
    with pytest.raises(CFAFormatError, match="fragments with their own"):
        with Dataset(url, "a", format="CF-1.13") as ds:
            ds["tas"][0:2] = np.ones((2, 3, 4))
    assert_matches(daskcfa.from_cfa(url).compute(), built.expected)
    assert all(p.read_bytes() == content for p, content in files.items())


def test_update_converting_fragments_in_their_own_units_is_the_same_through_both_front_ends(tmp_path):
    """NCA fragments in degC of a K aggregation, converted to CF-1.13 by the update: the rewritten
    fragment holds kelvin, the kept one its own units. (Dataset(url, "a") refused them before.)"""
    def make(directory):
        built = build_nca(directory, make_truth(SHAPE, "f8", seed=12), DIMS, SIZES,
                          frags=lambda index: Frag(units="degC"))
        return built.path, built.expected

    via_to_cfa, via_dataset, truth = copies(tmp_path, make)
    new = make_truth((2, 3, 4), "f8", masked=0.25, seed=13)
    daskcfa.to_cfa(new, via_to_cfa, mode="r+", region={"time": slice(1, 3)}, format="CF-1.13")
    with Dataset(via_dataset, "a", format="CF-1.13") as ds:
        ds["tas"][1:3] = new
    expected = truth.copy()
    expected[1:3] = new
    for url in (via_to_cfa, via_dataset):
        assert_matches(daskcfa.from_cfa(url).compute(), expected)
    assert_same_archives(via_to_cfa, via_dataset)


@pytest.mark.parametrize("value", [OFFSET + SCALE * int(FILL), OFFSET + SCALE * (int(FILL) + 0.4)],
                         ids=["exactly", "rounded"])
def test_a_value_packing_to_the_fill_value_is_refused_by_both_front_ends(tmp_path, value):
    """A valid (unmasked) value whose packed form is the _FillValue would read back as missing:
    it was stored so, silently, through both front ends. Now refused, the archive unchanged."""
    via_to_cfa, via_dataset, truth = copies(tmp_path, packed_archive)
    new = make_truth((1, 3, 4), "f8", masked=0.0, seed=7, lo=-10, hi=60)
    new[0, 1, 2] = value
    with pytest.raises(daskcfa.ArgumentError, match="1 values pack to stored values read back as missing.*variable '/tas'"):
        daskcfa.to_cfa(new, via_to_cfa, mode="r+", region={"time": slice(1, 2)})
    with pytest.raises(daskcfa.ArgumentError, match="read back as missing.*'/tas'"):
        with Dataset(via_dataset, "a") as ds:
            ds["tas"][1] = new[0]
    for url in (via_to_cfa, via_dataset):
        assert_same_archives(str(tmp_path / "src" / url.rpartition("/")[2]), url)
        assert_matches(daskcfa.from_cfa(url).compute(), truth)
    new[0, 1, 2] = np.ma.masked  # masked, it is stored as the fill, as before
    daskcfa.to_cfa(new, via_to_cfa, mode="r+", region={"time": slice(1, 2)})
    assert np.ma.is_masked(daskcfa.from_cfa(via_to_cfa).compute()[1, 1, 2])


def test_packed_values_outside_the_stored_type_name_the_variable_through_to_cfa(tmp_path):
    """The refusal of values the packed type cannot hold named no variable through to_cfa (the
    encoding step of the graph did not locate it); through Dataset it did."""
    url, _ = packed_archive(tmp_path / "a")
    new = make_truth((1, 3, 4), "f8", masked=0.0, seed=7, lo=-10, hi=60)
    new[0, 0, 0] = 1e6
    with pytest.raises(daskcfa.ArgumentError, match="outside the range of int16.*variable '/tas'"):
        daskcfa.to_cfa(new, str(url), mode="r+", region={"time": slice(1, 2)})


@pytest.mark.parametrize("region", [slice(0, 3), slice(3, 6)], ids=["first-row", "second-row"])
def test_update_of_nca_virtual_partitions_is_refused_alike_by_both_front_ends(tmp_path, region):
    """NCA's virtual partitions (several partitions over parts of one file variable), with a
    partition in its own units and extra dimension and one inside the NCA file, stored reversed:
    an update converting the archive to CF-1.13 keeps partitions CF-1.13 cannot describe. Both
    front ends refuse with the same error and leave every file as it was."""
    built = build_nca_virtual(tmp_path / "v", make_truth((6, 4, 5), "f4", masked=0, seed=14))
    url = str(built.path)
    files = {p: p.read_bytes() for p in (tmp_path / "v").rglob("*") if p.is_file()}
    messages = []
    with pytest.raises(CFAFormatError) as via_to_cfa:
        daskcfa.to_cfa(np.ones((3, 4, 5), "f4"), url, mode="r+", region={"time": region}, format="CF-1.13")
    messages.append(str(via_to_cfa.value))
    with pytest.raises(CFAFormatError) as via_dataset:
        with Dataset(url, "a", format="CF-1.13") as ds:
            ds["tas"][region] = np.ones((3, 4, 5), "f4")
    messages.append(str(via_dataset.value))
    assert messages[0] == messages[1] and "cannot be written" in messages[0]
    assert_matches(daskcfa.from_cfa(url).compute(), built.expected)
    assert all(p.read_bytes() == content for p, content in files.items())


# --------------------------------------------------------------------------
# Strings: a vlen str variable aggregated, as netCDF4-python writes str variables
# --------------------------------------------------------------------------

def words(shape, seed):
    """Strings of varied lengths (one empty), as numpy object arrays hold netCDF's vlen strings."""
    rng = np.random.default_rng(seed)
    out = np.array(["".join(rng.choice(list("abcdéx_"), rng.integers(0, 9))) for _ in range(int(np.prod(shape)))],
                   dtype=object).reshape(shape)
    out.flat[0] = ""
    return out


def string_archive(directory):
    """A str variable aggregated by ``daskcfa.netcdf4.Dataset`` along an unlimited time, with its coordinate."""
    truth = words(SHAPE, seed=20)
    directory.mkdir(parents=True)
    url = str(directory / "aggregation.nc")
    with Dataset(url, "w", format="CF-1.13") as ds:
        ds.createDimension("time", None)
        ds.createDimension("lat", 3)
        ds.createDimension("lon", 4)
        ds.createVariable("time", "f8", ("time",))[:] = np.arange(8.0)
        tas = ds.createVariable("tas", str, DIMS, subarray_shape=(4, 3, 4), aggregate=True)
        tas[:] = truth
    return url, truth


def to_cfa_string_archive(directory):
    """A str variable aggregated by ``to_cfa`` from a numpy object array (before: its ``r+`` update failed
    with dask's NotImplementedError, as dask cannot size object chunks)."""
    truth = words(SHAPE, seed=20)
    directory.mkdir(parents=True)
    url = daskcfa.to_cfa(truth, str(directory / "aggregation.nc"), variable="tas", dims=DIMS, fragment_shape=(4, 3, 4))
    return url, truth


def assert_strings(url, expected):
    got = daskcfa.from_cfa(url).compute()
    assert got.dtype == object and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_a_string_archive_is_aggregated_by_the_dataset(tmp_path):
    url, truth = string_archive(tmp_path / "s")
    assert daskcfa.open_cfa(url)["tas"].is_aggregated
    assert encoding(url) == (str, {})
    assert {i: s[0] for i, s in stored(url).items()} == {(0, 0, 0): str, (1, 0, 0): str}
    assert_strings(url, truth)


@pytest.mark.parametrize("make", [string_archive, to_cfa_string_archive], ids=["by-dataset", "by-to_cfa"])
@pytest.mark.parametrize("region", [slice(1, 3), slice(3, 6)], ids=["inside-one", "across-two"])
@pytest.mark.parametrize("buffer_size", [None, 1], ids=["buffered", "spilled"])
def test_string_region_update_is_the_same_through_both_front_ends(tmp_path, make, region, buffer_size):
    via_to_cfa, via_dataset, truth = copies(tmp_path, make)
    new = words((region.stop - region.start, 3, 4), seed=21)
    expected = update_both_ways(via_to_cfa, via_dataset, truth, new, region, buffer_size)
    for url in (via_to_cfa, via_dataset):
        assert_strings(url, expected)
    assert_same_archives(via_to_cfa, via_dataset)


@pytest.mark.parametrize("added", [4, 2], ids=["whole-fragment", "part-fragment"])
def test_string_append_is_the_same_through_both_front_ends(tmp_path, added):
    via_to_cfa, via_dataset, truth = copies(tmp_path, string_archive)
    new = words((added, 3, 4), seed=22)
    times = np.arange(8.0, 8.0 + added)
    daskcfa.to_cfa(new, via_to_cfa, mode="a", append_dim="time", coords={"time": times})
    with Dataset(via_dataset, "a") as ds:
        ds["tas"][8:8 + added] = new
        ds["time"][8:8 + added] = times
    for url in (via_to_cfa, via_dataset):
        assert_strings(url, np.concatenate([truth, new]))
    assert_same_archives(via_to_cfa, via_dataset)


def test_strings_unassigned_in_a_new_fragment_are_empty_through_both_front_ends(tmp_path):
    """netCDF has no missing string: netCDF4-python reads a string never written as "". A fragment
    the Dataset writes only partly assigned holds "" elsewhere, as a region to_cfa fills does."""
    url = str(tmp_path / "partial.nc")
    with Dataset(url, "w", format="CF-1.13") as ds:
        ds.createDimension("time", 8)
        ds.createDimension("lat", 3)
        ds.createDimension("lon", 4)
        ds.createVariable("tas", str, DIMS, subarray_shape=(4, 3, 4), aggregate=True)[1:3] = words((2, 3, 4), 23)
    expected = np.full(SHAPE, "", dtype=object)
    expected[1:3] = words((2, 3, 4), 23)
    assert_strings(url, expected)


@pytest.mark.parametrize("value, refusal", [
    (b"\xff\xfe", "bytes that are not UTF-8"),  # (was written, and the fragment unreadable since)
    ("\ud800", "lone surrogate"),
    (None, "of type NoneType, not str"),
    (3, "of type int, not str"),
], ids=["not-utf8", "surrogate", "None", "int"])
def test_a_value_no_netcdf_string_can_hold_is_refused_alike_by_both_front_ends(tmp_path, value, refusal):
    """Bytes that are not UTF-8, a lone surrogate, None or a number among the strings: a FragmentError
    naming why, through both front ends, before anything is written (the archive reads as before)."""
    via_to_cfa, via_dataset, truth = copies(tmp_path, string_archive)
    new = words((2, 3, 4), seed=25)
    new[1, 2, 3] = value
    with pytest.raises(daskcfa.FragmentError, match=refusal):
        daskcfa.to_cfa(new, via_to_cfa, mode="r+", region={"time": slice(1, 3)})
    with pytest.raises(daskcfa.FragmentError, match=refusal):
        with Dataset(via_dataset, "a") as ds:
            ds["tas"][1:3] = new
    for url in (via_to_cfa, via_dataset):
        assert_strings(url, truth)


@pytest.mark.parametrize("datatype, values, refusal", [
    (str, words(SHAPE, seed=24), "holds strings"),
    ("i8", np.arange(96, dtype="i8").reshape(SHAPE), "int64, which NETCDF3_CLASSIC fragments cannot hold"),
], ids=["strings", "int64"])
def test_a_type_netcdf3_fragments_cannot_hold_is_refused_alike_by_both_front_ends(tmp_path, datatype, values,
                                                                                  refusal):
    """S3netCDF4's CFA3 writes netCDF-3 fragments, which have no string or 64-bit type: both front ends
    refuse to aggregate such a variable into them, with the same error (the Dataset when the variable
    is defined), and write nothing."""
    messages = []
    with pytest.raises(daskcfa.ArgumentError) as via_to_cfa:
        daskcfa.to_cfa(values, str(tmp_path / "a" / "t.nc"), variable="tas", dims=DIMS, format="CFA-0.4",
                       fragment_format="NETCDF3_CLASSIC")
    messages.append(str(via_to_cfa.value))
    with pytest.raises(daskcfa.ArgumentError) as via_dataset:
        with Dataset(str(tmp_path / "b" / "t.nc"), "w", format="CFA3") as ds:
            ds.createDimension("time", 8)
            ds.createDimension("lat", 3)
            ds.createDimension("lon", 4)
            ds.createVariable("tas", datatype, DIMS, aggregate=True)
            raise AssertionError("defined")
    messages.append(str(via_dataset.value))
    assert messages[0] == messages[1] and refusal in messages[0]
    assert not any(p.is_file() for p in tmp_path.rglob("*"))
