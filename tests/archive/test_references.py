"""``daskcfa.to_references`` (``daskcfa.archive.references``): every dialect's aggregation exported
as an fsspec reference set, opened with xarray through fsspec's reference filesystem (no daskcfa
involved), equal to ``from_cfa`` and to numpy ground truth, masked values included; locally and on
the S3 test server, as JSON and as Parquet; and the precise refusals where references cannot be exact."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import DEFAULT_FILL, DIALECTS, Frag, assert_matches, build, build_cf113, build_cfa06, make_truth

xr = pytest.importorskip("xarray")
pytest.importorskip("zarr")

pytestmark = pytest.mark.usefixtures("other_cwd")

DIMS = ("time", "lat", "lon")
SHAPE = (6, 4, 10)
REGULAR = ((2, 2, 2), (4,), (5, 5))  # a 3 x 1 x 2 grid of equal fragments
FILL = DEFAULT_FILL("f4")
STORAGE = {
    "contiguous": None,
    "zlib-shuffle": {"zlib": True, "shuffle": True, "complevel": 4, "chunksizes": (1, 2, 5)},
    "fletcher32": {"zlib": True, "fletcher32": True, "chunksizes": (2, 4, 5)},
    "zstd": {"compression": "zstd", "chunksizes": (1, 4, 5)},
    "bzip2": {"compression": "bzip2", "shuffle": True, "chunksizes": (2, 2, 5)},
}


def truth(seed: int = 1, masked: float = 0.15) -> np.ma.MaskedArray:
    return make_truth(SHAPE, "f4", seed=seed, masked=masked)


def same_storage(storage=None, **kw):
    """Every fragment stored alike (the same fill value, masked points or not)."""
    return lambda index: Frag(**{"fill_value": FILL, "storage": storage, **kw})


def open_references(refs, storage_options=None, group=None, **fs_options):
    """xarray over fsspec's reference filesystem: what any Zarr user does, no daskcfa involved."""
    options = {"fo": refs, **fs_options}
    if storage_options:
        # (zarr-python's store is asynchronous: so must be the filesystem the references point into)
        options.update(remote_protocol="s3", remote_options={**storage_options, "asynchronous": True})
    # (a group as the store's root: zarr-python's FsspecStore at the root of a reference filesystem
    # lists a group's members by their full paths, and finds none of them)
    return xr.open_dataset(f"reference://{group or ''}", engine="zarr", chunks=None,
                           backend_kwargs={"storage_options": options, "consolidated": False})


def check(built, refs, url=None, storage_options=None, rtol=1e-6, **fs_options):
    group, _, name = built.variable.strip("/").rpartition("/")
    with open_references(refs, storage_options, group or None, **fs_options) as ds:
        got = ds[name].to_masked_array()
        coords = {d: ds[d].values for d in built.dims if d in ds}
    expected = daskcfa.from_cfa(url or str(built.path), built.variable, storage_options=storage_options).compute()
    assert_matches(got, expected, rtol=rtol)
    assert_matches(got, built.expected, rtol=rtol)
    assert np.ma.getmaskarray(got).any(), "the test data have missing values"
    for values in coords.values():
        np.testing.assert_array_equal(values, np.arange(len(values)) * 1.5 + 10.0)
    return got


@pytest.mark.parametrize("storage", list(STORAGE))
@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_as_references(tmp_path, dialect, storage):
    built = build(dialect, tmp_path, truth(), DIMS, REGULAR, frags=same_storage(STORAGE[storage]))
    refs = daskcfa.to_references(str(built.path))
    assert refs["version"] == 1 and len(refs["templates"]) == 6, "each fragment URI once, in templates"
    assert all(Path(u).is_absolute() for u in refs["templates"].values())
    check(built, refs)


ENCODINGS = {  # the aggregation's packing and missing values, as xarray reads them from the references
    "packed aggregation": dict(agg_scale_factor=0.01, agg_add_offset=260.0, frags=same_storage(fill_value=None),
                               dtype="i2"),
    "integers": dict(dtype="i4", frags=lambda i: Frag(fill_value=DEFAULT_FILL("i4"))),
    "explicit fill": dict(fill_value=-999.0, frags=same_storage(fill_value=-999.0)),
    "NaN fill": dict(fill_value=np.nan, frags=same_storage(fill_value=np.nan, missing="nan")),
    "fragments' missing_value": dict(frags=same_storage(missing="missing_value", fill_value=-5.0)),
}


@pytest.mark.parametrize("case", list(ENCODINGS))
def test_encodings(tmp_path, case):
    options = dict(ENCODINGS[case])
    t = truth()
    if options.get("dtype") == "i4":
        t = make_truth(SHAPE, "i4", seed=2, masked=0.15, lo=-1000, hi=1000)
    if options.get("dtype") == "i2":
        options.pop("dtype")
    built = build_cf113(tmp_path, t, DIMS, REGULAR, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (xarray: "multiple fill values", which is what the data have)
        check(built, daskcfa.to_references(str(built.path)), rtol=1e-5)


def test_alternative_locations_the_first_found(tmp_path):
    built = build_cfa06(tmp_path, truth(), DIMS, REGULAR, alternatives=True, frags=same_storage())
    refs = daskcfa.to_references(str(built.path))
    assert not any("nowhere" in u for u in refs["templates"].values())
    check(built, refs)


def test_json_is_what_fsspec_reads_from_a_file(tmp_path):
    built = build_cf113(tmp_path / "ds", truth(), DIMS, REGULAR, frags=same_storage(STORAGE["zlib-shuffle"]))
    out = tmp_path / "refs.json"
    assert daskcfa.to_references(str(built.path), output=str(out)) == str(out)
    check(built, str(out))
    with pytest.raises(FileExistsError):
        daskcfa.to_references(str(built.path), output=str(out))
    daskcfa.to_references(str(built.path), output=str(out), mode="w")
    attrs = json.loads(json.loads(out.read_text())["refs"]["tas/.zattrs"])
    assert attrs["units"] == "K" and attrs["_ARRAY_DIMENSIONS"] == list(DIMS)


def test_parquet(tmp_path):
    pytest.importorskip("kerchunk")
    built = build_cf113(tmp_path / "ds", truth(), DIMS, REGULAR, frags=same_storage(STORAGE["zlib-shuffle"]))
    out = tmp_path / "refs.parq"
    assert daskcfa.to_references(str(built.path), output=str(out), record_size=7) == str(out)
    assert (out / ".zmetadata").is_file() and len(list((out / "tas").glob("refs.*.parq"))) == 4  # 24 chunks / 7
    # (the protocol named: with pyarrow installed, pandas reads a null path as NaN, and fsspec's
    # scan of every reference for its protocol stops at that float)
    check(built, str(out), remote_protocol="file")


def test_on_s3(tmp_path, s3_server):
    built = build_cf113(tmp_path / "ds", truth(), DIMS, REGULAR, frags=same_storage(STORAGE["zlib-shuffle"]))
    fs, bucket = s3_server.filesystem(), s3_server.new_bucket()
    fs.put(str(built.path.parent) + "/", f"{bucket}/ds/", recursive=True)
    url, options = f"s3://{bucket}/ds/{built.path.name}", s3_server.storage_options
    refs = daskcfa.to_references(url, storage_options=options)
    assert all(u.startswith(f"s3://{bucket}/ds/fragments/") for u in refs["templates"].values())
    text = json.dumps(refs)
    assert s3_server.key not in text and s3_server.secret not in text, "credentials never enter the references"
    check(built, refs, url, options)
    out = f"s3://{bucket}/refs.json"
    daskcfa.to_references(url, output=out, storage_options=options)
    assert json.loads(fs.cat(out)) == refs
    pytest.importorskip("kerchunk")
    out = f"s3://{bucket}/refs.parq"
    daskcfa.to_references(url, output=out, storage_options=options)
    check(built, out, url, options, target_options=options)


def test_missing_fragments_read_as_missing(tmp_path):
    """CFA-0.6.2 may leave a fragment out: its chunks are absent and read as the fill value."""
    built = build_cfa06(tmp_path, truth(), DIMS, REGULAR, fill_value=FILL,
                        frags=lambda i: Frag(fill_value=FILL, absent=i == (1, 0, 1)))
    refs = daskcfa.to_references(str(built.path))
    assert not any(k.startswith("tas/1.0.1") for k in refs["refs"]), "no chunk references a missing fragment"
    got = check(built, refs)
    assert np.ma.getmaskarray(got)[2:4, :, 5:].all()


def test_netcdf3_fragments_are_one_chunk_each(tmp_path):
    built = build_cf113(tmp_path, truth(), DIMS, REGULAR, frags=same_storage(format="NETCDF3_CLASSIC"))
    refs = daskcfa.to_references(str(built.path))
    zarray = json.loads(refs["refs"]["tas/.zarray"])
    assert zarray["chunks"] == [2, 4, 5] and zarray["dtype"] == ">f4"
    check(built, refs)


def test_edge_chunks_of_the_last_fragments(tmp_path):
    """HDF5 stores an edge chunk whole, as Zarr does: the last fragments along a dimension may end
    inside a chunk (here along an unlimited dimension, whose chunks netCDF-C does not clamp)."""
    t = make_truth((5, 4, 10), "f4", seed=3, masked=0.2)
    chunked = {"zlib": True, "chunksizes": (2, 4, 5)}
    clamped = {"zlib": True, "chunksizes": (1, 4, 5)}  # (netCDF-C refuses chunks longer than a fixed dimension)
    built = build_cf113(tmp_path, t, DIMS, ((2, 2, 1), (4,), (5, 5)),
                        frags=lambda i: Frag(fill_value=FILL, storage=clamped if i[0] == 2 else chunked))
    with pytest.raises(daskcfa.ReferencesError, match=r"fragment \(2, 0, 0\).*HDF5 chunks of \(1, 4, 5\)"):
        daskcfa.to_references(str(built.path))
    for j in (0, 1):  # the last row again, along an unlimited time: chunks of (2, 4, 5), the last one half used
        built.fragment_files[(2, 0, j)].unlink()  # (a new file: this process may hold the old one open)
        with netCDF4.Dataset(built.fragment_files[(2, 0, j)], "w") as nc:
            nc.createDimension("time", None)
            nc.createDimension("lat", 4)
            nc.createDimension("lon", 5)
            var = nc.createVariable("tas", "f4", DIMS, fill_value=FILL, **chunked)
            var.units = "K"
            var[0:1] = t[4:5, :, 5 * j:5 * j + 5]
    got = check(built, daskcfa.to_references(str(built.path)))
    assert_matches(got, t)


def test_daskcfa_written_archives_are_referenceable(tmp_path):
    t = truth(seed=7)
    url = daskcfa.to_cfa(t, str(tmp_path / "w.nc"), variable="tas", dims=DIMS, attrs={"units": "K"},
                         coords={d: np.arange(n) * 1.5 + 10.0 for d, n in zip(DIMS, SHAPE)},
                         fragment_shape=(2, 4, 5), compression="zlib")
    with open_references(daskcfa.to_references(url)) as ds:
        assert_matches(ds["tas"].to_masked_array(), t)


def test_variable_and_groups(tmp_path):
    built = build(DIALECTS[5], tmp_path, truth(), DIMS, REGULAR, frags=same_storage(), group="/grp")
    refs = daskcfa.to_references(str(built.path), built.variable)
    assert "grp/.zgroup" in refs["refs"] and "grp/tas/.zarray" in refs["refs"]
    check(built, refs)
    with pytest.raises(daskcfa.VariableNotFoundError, match="aggregated variables: /grp/tas"):
        daskcfa.to_references(str(built.path), "nothere")


# ---------------------------------------------------------------------------
# What cannot be exact: refused, naming the fragment and the reason
# ---------------------------------------------------------------------------


def _mixed(default: Frag, odd: Frag):
    return lambda index: odd if index == (1, 0, 1) else default


zlib = {"zlib": True, "shuffle": False, "chunksizes": (1, 2, 5)}
REFUSALS = {
    "irregular grid": (dict(sizes=((2, 3, 1), (4,), (5, 5))), r"fragment \(1, 0, 0\).*shape \(2, 4, 5\)|"
                                                               r"fragment \(1, 0, 0\).*off the regular grid"),
    "chunk shapes": (dict(frags=_mixed(Frag(fill_value=FILL, storage=zlib),
                                       Frag(fill_value=FILL, storage={"zlib": True, "chunksizes": (2, 2, 5)}))),
                     r"fragment \(1, 0, 1\) .*HDF5 chunks of \(2, 2, 5\), fragment \(0, 0, 0\) has \(1, 2, 5\)"),
    "filters": (dict(frags=_mixed(Frag(fill_value=FILL, storage=zlib),
                                  Frag(fill_value=FILL, storage={**zlib, "shuffle": True}))),
                r"fragment \(1, 0, 1\) .*filters \[shuffle, zlib\], fragment \(0, 0, 0\) has \[zlib\]"),
    "units": (dict(frags=_mixed(Frag(fill_value=FILL), Frag(fill_value=FILL, units="degC"))),
              r"fragment \(1, 0, 1\) .*units 'degC' are converted"),
    "packing": (dict(frags=_mixed(Frag(fill_value=FILL), Frag(scale_factor=0.01, add_offset=260.0))),
                r"fragment \(1, 0, 1\) .*packed"),
    "fill values": (dict(frags=_mixed(Frag(fill_value=FILL), Frag(fill_value=-1.0))),
                    r"fragment \(1, 0, 1\) .*missing values \{-1.0\} of its own"),
    "dtype": (dict(frags=_mixed(Frag(fill_value=FILL), Frag(dtype="f8"))),
              r"fragment \(1, 0, 1\) .*stored as float64, the aggregation holds float32"),
    "byte order": (dict(frags=_mixed(Frag(fill_value=FILL), Frag(dtype=">f4", fill_value=FILL))),
                   r"fragment \(1, 0, 1\) .*stored as >f4, fragment \(0, 0, 0\) as <f4"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_name_the_fragment_and_why(tmp_path, case):
    options, pattern = REFUSALS[case]
    sizes = options.pop("sizes", REGULAR)
    built = build_cf113(tmp_path, truth(), DIMS, sizes, **{"frags": same_storage(), **options})
    with pytest.raises(daskcfa.ReferencesError, match=pattern) as info:
        daskcfa.to_references(str(built.path))
    message = str(info.value)
    assert "refragment" in message and "variable '/tas', " in message
    assert info.value.variable == "/tas" and info.value.file == str(built.path)


def test_unique_values_refused(tmp_path):
    t = np.ma.MaskedArray(np.repeat(np.arange(3.0, dtype="f4"), 2)[:, None, None] * np.ones(SHAPE, "f4"))
    built = build_cf113(tmp_path, t, DIMS, REGULAR, unique=True)
    with pytest.raises(daskcfa.ReferencesError, match="unique value"):
        daskcfa.to_references(str(built.path))


def test_absent_file_refused(tmp_path):
    built = build_cf113(tmp_path, truth(), DIMS, REGULAR,
                        frags=lambda i: Frag(fill_value=FILL, write_file=i != (2, 0, 0)))
    with pytest.raises(daskcfa.ReferencesError, match=r"fragment \(2, 0, 0\) \(no file\): fragment file not found"):
        daskcfa.to_references(str(built.path))


def test_bad_arguments(tmp_path):
    built = build_cf113(tmp_path, truth(), DIMS, REGULAR, frags=same_storage())
    with pytest.raises(daskcfa.ArgumentError, match="format must be one of"):
        daskcfa.to_references(str(built.path), format="yaml")
    with pytest.raises(daskcfa.ArgumentError, match="give output="):
        daskcfa.to_references(str(built.path), format="parquet")
    with pytest.raises(ValueError, match="mode must be one of"):
        daskcfa.to_references(str(built.path), output=str(tmp_path / "r.json"), mode="r+")
