"""``daskcfa.to_references`` (``daskcfa.archive.references``): every dialect's aggregation exported
as an fsspec reference set, opened with xarray through fsspec's reference filesystem (no daskcfa
involved), equal to ``from_cfa`` and to numpy ground truth, masked values included; locally and on
the S3 test server, as JSON and as Parquet; and the precise refusals where references cannot be exact."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
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


# ---------------------------------------------------------------------------
# Archives daskcfa writes itself (issue #28): uneven last fragments and Zarr fragments,
# read back by a process that never imports daskcfa
# ---------------------------------------------------------------------------

_PLAIN_READER = r"""
import json, sys
import numpy as np
import xarray as xr
for refs, out in json.loads(sys.argv[1]):
    with xr.open_dataset("reference://", engine="zarr", chunks=None, backend_kwargs={
            "storage_options": {"fo": refs}, "consolidated": False}) as ds:
        values = ds["tas"].to_masked_array()
        np.savez(out, data=np.ma.getdata(values), mask=np.ma.getmaskarray(values), time=ds["time"].values)
assert "daskcfa" not in sys.modules, "the reader imported daskcfa"
"""


def read_without_daskcfa(tmp_path, archives):
    """Export each archive's references to a JSON file, read them all with xarray's zarr engine in a
    fresh Python that never imports daskcfa, and give back (values, time coordinate) per archive."""
    jobs = []
    for n, url in enumerate(archives):
        refs = tmp_path / f"refs{n}.json"
        daskcfa.to_references(url, output=str(refs))
        jobs.append((str(refs), str(tmp_path / f"read{n}.npz")))
    done = subprocess.run([sys.executable, "-c", _PLAIN_READER, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = []
    for _, out in jobs:
        with np.load(out) as f:
            results.append((np.ma.MaskedArray(f["data"], mask=f["mask"]), f["time"]))
    return results


UNEVEN = (5, 4, 9)  # fragments of (2, 4, 4): the last along time holds 1 step, the last along lon 1 point
UNEVEN_COORDS = {d: np.arange(n) * 1.5 + 10.0 for d, n in zip(DIMS, UNEVEN)}


def write_uneven(path, truth_, **options):
    coords = {d: UNEVEN_COORDS[d][:n] for d, n in zip(DIMS, truth_.shape)}
    return daskcfa.to_cfa(truth_, str(path), variable="tas", dims=DIMS, coords=coords,
                          attrs={"units": "K", "_FillValue": FILL}, fragment_shape=(2, 4, 4), **options)


@pytest.mark.parametrize("fragment_format", ["NETCDF4", "NETCDF4_CLASSIC"])
def test_uneven_last_fragments_share_the_chunk_grid(tmp_path, fragment_format):
    """to_cfa stores the shorter last fragments with the chunk shape of the others (partial edge
    chunks, along dimensions the fragment defines unlimited), so that the archive exports; netCDF4-python
    reads those fragment files as written."""
    t = make_truth(UNEVEN, "f4", seed=11, masked=0.2)
    storages = {"contiguous": None, "zlib": "zlib", "chunked": {"zlib": True, "shuffle": True, "chunksizes": (1, 2, 2)}}
    urls = [write_uneven(tmp_path / f"{name}.nc", t, compression=c, fragment_format=fragment_format)
            for name, c in storages.items()]
    for url in urls:
        files = sorted((Path(url).parent / Path(url).stem).glob("g-*/*.nc"))
        assert len(files) == 9
        chunkings = set()
        for f in files:
            index = tuple(int(i) for i in f.name.split(".")[2:5])
            where = tuple(slice(o, o + n) for o, n in zip((2 * index[0], 0, 4 * index[2]), (2, 4, 4)))
            with netCDF4.Dataset(f) as nc:
                assert_matches(nc["tas"][...], t[where])  # (netCDF4-python masks by _FillValue itself)
                chunking = nc["tas"].chunking()
                if fragment_format == "NETCDF4" or index != (2, 0, 2):
                    chunkings.add("contiguous" if chunking == "contiguous" else tuple(chunking))
        shorter = {c for c in chunkings if c != "contiguous"}
        assert len(shorter) == 1, f"one chunk shape for every fragment, found {chunkings}"
    if fragment_format == "NETCDF4_CLASSIC":  # the corner fragment is short along two dimensions: one unlimited
        with pytest.raises(daskcfa.ReferencesError, match=r"variable '/tas', 1 fragment\(s\): fragment \(2, 0, 2\)"):
            daskcfa.to_references(urls[0])
        urls = [write_uneven(tmp_path / "rows.nc", t[:, :, :8], compression="zlib", fragment_format=fragment_format)]
        t = t[:, :, :8]
    for got, time in read_without_daskcfa(tmp_path, urls):
        assert_matches(got, t)
        np.testing.assert_array_equal(time, UNEVEN_COORDS["time"])


def test_zarr_fragments_exported_by_reference(tmp_path):
    """Zarr fragments (daskcfa's own, Zarr v2, uneven) become references to their chunk objects: the
    store's codecs in the exported array, chunks never written (all missing) absent there too."""
    t = make_truth(UNEVEN, "f4", seed=12, masked=0.2)
    t[2:4, :, 4:8] = np.ma.masked  # a fragment all missing: zarr-python writes none of its chunks
    urls = [write_uneven(tmp_path / f"z{n}.nc", t, fragment_format="zarr", compression=c)
            for n, c in enumerate([None, {"zlib": True, "complevel": 6, "chunksizes": (1, 3, 2)}])]
    for url in urls:
        refs = daskcfa.to_references(url)
        zarray = json.loads(refs["refs"]["tas/.zarray"])
        targets = [refs["templates"][v[0].strip("{}")] for k, v in refs["refs"].items()
                   if k.startswith("tas/") and isinstance(v, list)]
        assert targets and all("/tas/" in u and ".zarr/tas/" in u for u in targets), "each chunk its own object"
        assert all(v[1] == 0 for k, v in refs["refs"].items() if k.startswith("tas/") and isinstance(v, list))
    assert zarray["chunks"] == [1, 3, 2] and zarray["compressor"] == {"id": "zlib", "level": 6}
    assert not any(f"tas/{i}.{j}.{k}" in refs["refs"] for i in (2, 3) for j in (0, 1) for k in (2, 3))
    assert zarray["filters"] == [{"id": "shuffle", "elementsize": 4}]
    for got, _ in read_without_daskcfa(tmp_path, urls):
        assert_matches(got, t)


def _zarr_v3_fragment(path, values, time, codecs):
    zarr = pytest.importorskip("zarr")
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    group.create_array("time", data=time, dimension_names=["time"], chunks=(2,))
    for d in ("lat", "lon"):
        group.create_array(d, data=UNEVEN_COORDS[d][: values.shape[DIMS.index(d)]], dimension_names=[d])
    tas = group.create_array("tas", shape=values.shape, dtype="f4", chunks=(2, 2, 9), fill_value=FILL,
                             dimension_names=list(DIMS), attributes={"units": "K", "_FillValue": float(FILL)}, **codecs)
    tas[...] = np.ma.filled(values, FILL)
    zarr.consolidate_metadata(group.store)


def test_zarr_v3_fragments(tmp_path):
    """Zarr v3 stores aggregated by daskcfa.aggregate: their bytes + gzip codecs as a v2 array's."""
    numcodecs = pytest.importorskip("numcodecs")
    import zarr.codecs

    t = make_truth(UNEVEN, "f4", seed=13, masked=0.2)
    paths = []
    for n, (a, b) in enumerate([(0, 2), (2, 4), (4, 5)]):
        paths.append(tmp_path / "src" / f"f{n}.zarr")
        _zarr_v3_fragment(paths[-1], t[a:b], UNEVEN_COORDS["time"][a:b], {"compressors": zarr.codecs.GzipCodec(level=3)})
    url = daskcfa.aggregate([str(p) for p in paths], str(tmp_path / "v3.nc"))
    refs = daskcfa.to_references(url)
    assert json.loads(refs["refs"]["tas/.zarray"])["compressor"] == {"id": "gzip", "level": 3}
    assert numcodecs.get_codec({"id": "gzip", "level": 3})
    (got, time), = read_without_daskcfa(tmp_path, [url])
    assert_matches(got, t)
    np.testing.assert_array_equal(time, UNEVEN_COORDS["time"])

    # one store compressed otherwise: refused, naming it (one array has one pipeline)
    _zarr_v3_fragment(paths[1], t[2:4], UNEVEN_COORDS["time"][2:4], {"compressors": zarr.codecs.ZstdCodec(level=1)})
    with pytest.raises(daskcfa.ReferencesError, match=r"fragment \(1, 0, 0\) .*filters Zarr \[zstd\], fragment "
                                                      r"\(0, 0, 0\) has Zarr \[gzip\]"):
        daskcfa.to_references(url)
    # a codec no Zarr v2 reader has: refused, saying which
    _zarr_v3_fragment(paths[1], t[2:4], UNEVEN_COORDS["time"][2:4],
                      {"compressors": None, "serializer": zarr.codecs.BytesCodec(),
                       "filters": [zarr.codecs.TransposeCodec(order=(0, 1, 2))]})
    with pytest.raises(daskcfa.ReferencesError, match=r"fragment \(1, 0, 0\) .*Zarr codecs \['transpose', 'bytes'\]"):
        daskcfa.to_references(url)


def test_old_archives_with_a_different_chunk_shape_refused(tmp_path):
    """Archives written before (or by other tools) whose fragments do not share one chunk grid: refused,
    naming the odd fragments only (the chunk shape most fragments have is the array's), saying why."""
    odd = {"zlib": True, "chunksizes": (1, 2, 5)}
    built = build_cf113(tmp_path, truth(), DIMS, REGULAR,
                        frags=lambda i: Frag(fill_value=FILL, storage=odd if i == (0, 0, 0) else {"zlib": True}))
    with pytest.raises(daskcfa.ReferencesError) as info:
        daskcfa.to_references(str(built.path))
    message = str(info.value)
    assert "variable '/tas', 1 fragment(s): fragment (0, 0, 0)" in message
    assert "HDF5 chunks of (1, 2, 5), fragment (0, 0, 1) has (2, 4, 5) (a Zarr array has one regular chunk grid)" \
        in message and "refragment" in message
    assert info.value.fragment == (0, 0, 0) and info.value.variable == "/tas"


def test_zarr_fragments_on_s3(tmp_path, s3_server):
    """Zarr fragments on S3: the store listed once, each chunk a reference to its object."""
    t = make_truth(UNEVEN, "f4", seed=14, masked=0.2)
    bucket = s3_server.new_bucket()
    url = write_uneven(f"s3://{bucket}/z/w.nc", t, fragment_format="zarr", compression="zlib",
                       storage_options=s3_server.storage_options)
    refs = daskcfa.to_references(url, storage_options=s3_server.storage_options)
    assert all(u.startswith(f"s3://{bucket}/z/w/") for u in refs["templates"].values())
    with open_references(refs, s3_server.storage_options) as ds:
        assert_matches(ds["tas"].to_masked_array(), t)


def test_dataset_written_uneven_archive(tmp_path):
    """daskcfa.Dataset (netCDF4-python's API) along a growing time: the last fragment, shorter, shares
    the others' chunks (given larger than a fragment: clipped to a full-size one)."""
    t = make_truth(UNEVEN, "f4", seed=15, masked=0.2)
    url = str(tmp_path / "d.nc")
    with daskcfa.Dataset(url, "w") as ds:
        for d, n in zip(DIMS, (None, 4, 9)):
            ds.createDimension(d, n)
            ds.createVariable(d, "f8", (d,))[:] = UNEVEN_COORDS[d]
        tas = ds.createVariable("tas", "f4", DIMS, fill_value=FILL, zlib=True, chunksizes=(2, 4, 8),
                                subarray_shape=[2, 4, 4])
        tas.units = "K"
        tas[0:5] = t
    (got, time), = read_without_daskcfa(tmp_path, [url])
    assert_matches(got, t)
    np.testing.assert_array_equal(time, UNEVEN_COORDS["time"])


def _nczarr_fragment(path, values, start, shuffle):
    """A store netCDF-C writes (NCZarr), along an unlimited time when shorter than its chunks."""
    with netCDF4.Dataset(f"file://{path}#mode=nczarr,file", "w") as nc:
        for d, n in zip(DIMS, values.shape):
            nc.createDimension(d, None if d == "time" and n < 2 else n)
            nc.createVariable(d, "f8", (d,))[:] = UNEVEN_COORDS[d][start:start + n] if d == "time" else \
                UNEVEN_COORDS[d][:n]
        tas = nc.createVariable("tas", "f4", DIMS, fill_value=FILL, zlib=True, shuffle=shuffle, chunksizes=(2, 2, 9))
        tas.units = "K"
        tas[:] = values


def test_nczarr_fragments(tmp_path):
    """NCZarr stores (netCDF-C's Zarr v2) aggregated by daskcfa.aggregate export; with shuffle they are
    refused: netCDF-C records its shuffle with elementsize 0, which Zarr readers take as no shuffle."""
    t = make_truth(UNEVEN, "f4", seed=16, masked=0.2)
    paths = [tmp_path / "src" / f"f{n}.zarr" for n in range(3)]
    paths[0].parent.mkdir()
    for path, (a, b) in zip(paths, [(0, 2), (2, 4), (4, 5)]):
        _nczarr_fragment(path, t[a:b], a, shuffle=False)
    url = daskcfa.aggregate([str(p) for p in paths], str(tmp_path / "ncz.nc"))
    (got, time), = read_without_daskcfa(tmp_path, [url])
    assert_matches(got, t)
    np.testing.assert_array_equal(time, UNEVEN_COORDS["time"])
    shutil.rmtree(paths[2])
    _nczarr_fragment(paths[2], t[4:5], 4, shuffle=True)
    with pytest.raises(daskcfa.ReferencesError, match=r"fragment \(2, 0, 0\) .*shuffle of elementsize 0"):
        daskcfa.to_references(url)


HOSTILE_ZARRAY = {
    "compressor not an object": ({"compressor": "zlib"}, "is not a codec's configuration"),
    "shape not sizes": ({"shape": "x"}, "shape 'x' is not a list of sizes"),
    "fill value not a number": ({"fill_value": "abc"}, "fill_value 'abc' is not a float32"),
    "a lossy codec": ({"filters": [{"id": "quantize", "digits": 2, "dtype": "<f4"}]}, "codec 'quantize' is not exported"),
    "chunks of zero": ({"chunks": [0, 4, 4]}, r"Zarr chunks \(0, 4, 4\)"),
}


@pytest.mark.parametrize("case", list(HOSTILE_ZARRAY))
def test_hostile_zarr_metadata_refused(tmp_path, case):
    """A Zarr fragment's metadata is untrusted input: whatever it holds, a ReferencesError naming the fragment."""
    change, reason = HOSTILE_ZARRAY[case]
    url = write_uneven(tmp_path / "h.nc", make_truth(UNEVEN, "f4", seed=17), fragment_format="zarr")
    zarray = next((tmp_path / "h").glob("g-*/h.tas.1.0.1.zarr")) / "tas" / ".zarray"
    zarray.write_text(json.dumps({**json.loads(zarray.read_text()), **change}))
    with pytest.raises(daskcfa.ReferencesError, match=r"1 fragment\(s\): fragment \(1, 0, 1\) .*" + reason):
        daskcfa.to_references(url)


@pytest.mark.parametrize("file_format", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_inline_false_presents_coordinates_by_reference(tmp_path, file_format):
    """``inline=False``: every chunk is a reference, the coordinates' into the aggregation file's own
    bytes, URIs written out and codecs as filters (what VirtualiZarr and Icechunk ingest); the values
    read as before."""
    built = build_cf113(tmp_path / "ds", truth(), DIMS, REGULAR, frags=same_storage(STORAGE["zlib-shuffle"]),
                        fmt=file_format)
    refs = daskcfa.to_references(str(built.path), inline=False)
    chunks = {k: v for k, v in refs["refs"].items() if k.rpartition("/")[2] not in (".zarray", ".zattrs", ".zgroup")}
    assert {k.partition("/")[0] for k in chunks} == {"time", "lat", "lon", "tas"}
    assert all(isinstance(v, list) for v in chunks.values()), "no chunk inline"
    assert {v[0] for k, v in chunks.items() if not k.startswith("tas/")} == {str(built.path)}, \
        "URIs written out (VirtualiZarr expands no template)"
    assert not refs["templates"]
    assert all(json.loads(v)["compressor"] is None for k, v in refs["refs"].items() if k.endswith(".zarray")), \
        "codecs as filters (VirtualiZarr reads no compressor)"
    check(built, refs)
    assert not isinstance(daskcfa.to_references(str(built.path))["refs"]["time/0"], list)  # (inline by default)
