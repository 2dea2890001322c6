"""Reading aggregations whose files live on remote storage (issue "Remote storage").

Everything talks to real servers on 127.0.0.1 (daskcfa_testing.servers):
SeaweedFS for S3 (checks SigV4 signatures), a range-capable HTTP server with
byte counters, and pydap for OPeNDAP. Datasets are written by
tests/builders.py from numpy ground truth, uploaded, and read back.

The safe-URI policy, credential handling and secrecy are in
storage/test_policy.py; this module covers reading: every dialect on S3,
mixed locations, HTTP byte-range economy, OPeNDAP, relative resolution and
concurrency.
"""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest

import daskcfa
from builders import DIALECTS, Frag, assert_matches, build, build_nca_virtual, make_truth
from remote_helpers import (
    DIMS,
    SHAPE,
    SIZES,
    rewrite_uris,
    truth,
    upload,
    write_cf113,
    write_chunked_fragment,
)
from daskcfa import storage

pytestmark = pytest.mark.usefixtures("other_cwd")


# ---------------------------------------------------------------------------
# 1. Every dialect on S3
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_on_s3(tmp_path, s3_server, s3_bucket, s3fs_fs, dialect):
    built = build(dialect, tmp_path / "ds", truth(), DIMS, SIZES)
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "data/run1")
    url = f"{base}/{built.path.name}"
    x = daskcfa.from_cfa(url, built.variable, storage_options=s3_server.storage_options)
    assert x.shape == SHAPE
    assert x.chunks == built.chunks
    got = x.compute()
    assert_matches(got, built.expected)
    # a slice across fragment boundaries, and a single point
    assert_matches(x[1:5, 2, 1:4].compute(), built.expected[1:5, 2, 1:4])
    assert_matches(x[5, 3, 4].compute(), built.expected[5, 3, 4])


@pytest.mark.parametrize("dialect", ["CFA-0.5", "CFA-0.4"])
def test_s3netcdf4_variable_in_a_group_on_s3(tmp_path, s3_server, s3_bucket, s3fs_fs, dialect):
    built = build(dialect, tmp_path / "ds", truth(), DIMS, SIZES, group="forecast")
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "grouped")
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", "/forecast/tas", storage_options=s3_server.storage_options)
    assert_matches(x.compute(), built.expected)


def test_nca_virtual_partitions_on_s3(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built = build_nca_virtual(tmp_path / "ds", truth(masked=0), cf_role=False)
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "nca")
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", "tas", storage_options=s3_server.storage_options)
    assert_matches(x.compute(), built.expected, rtol=1e-5)
    assert_matches(x[4:, ::-1, 1:4].compute(), built.expected[4:, ::-1, 1:4], rtol=1e-5)


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6", "CFA-0.4"])
def test_open_cfa_on_s3(tmp_path, s3_server, s3_bucket, s3fs_fs, dialect):
    built = build(dialect, tmp_path / "ds", truth(), DIMS, SIZES, attrs={"long_name": "T"})
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "ds")
    with daskcfa.open_cfa(f"{base}/{built.path.name}", storage_options=s3_server.storage_options) as ds:
        assert {"tas", "time", "lat", "lon"} <= set(ds.variables)
        for d, n in zip(DIMS, SHAPE):
            assert len(ds.dimensions[d]) == n
            coord = ds.variables[d]
            # builders write coordinates as arange * 1.5 + 10
            np.testing.assert_array_equal(np.asarray(coord.data.compute()), np.arange(n) * 1.5 + 10.0)
            np.testing.assert_array_equal(np.asarray(coord[...]), np.arange(n) * 1.5 + 10.0)
        tas = ds.variables["tas"]
        assert tas.getncattr("long_name") == "T"
        assert_matches(tas.data.compute(), built.expected)


def test_s3_threaded_and_synchronous_agree(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "x")
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", "tas", storage_options=s3_server.storage_options)
    with dask.config.set(scheduler="synchronous"):
        a = x.compute()
    with dask.config.set(scheduler="threads"):
        b = x.compute()
    assert_matches(a, built.expected)
    assert_matches(b, built.expected)


# ---------------------------------------------------------------------------
# 2. Mixed locations
# ---------------------------------------------------------------------------
def test_local_aggregation_with_fragments_on_s3(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "frags")
    # rewrite every URI to an absolute s3:// one, then delete the local fragments
    rewrite_uris(built.path, built.names["uris"], lambda u: f"{base}/{u}")
    for path in built.fragment_files.values():
        path.unlink()
    x = daskcfa.from_cfa(str(built.path), "tas", storage_options=s3_server.storage_options)
    assert_matches(x.compute(), built.expected)
    # keyed by protocol works the same
    y = daskcfa.from_cfa(str(built.path), "tas", storage_options={"s3": s3_server.storage_options})
    assert_matches(y.compute(), built.expected)


def test_local_aggregation_fragments_split_between_local_and_s3(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built = build("CFA-0.6", tmp_path / "ds", truth(), DIMS, SIZES)
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "half")
    # fragments with an even first index go to S3; the others stay local (relative)
    moved = {u for i, (u,) in built.fragment_uris.items() if i[0] % 2 == 0}
    rewrite_uris(built.path, built.names["file"], lambda u: f"{base}/{u}" if u in moved else u)
    for i, path in built.fragment_files.items():
        if i[0] % 2 == 0:
            path.unlink()
    x = daskcfa.from_cfa(str(built.path), "tas", storage_options={"s3": s3_server.storage_options})
    assert_matches(x.compute(), built.expected)


def test_s3_aggregation_with_fragments_elsewhere_in_the_same_bucket(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """Relative references with ``..`` reach sibling prefixes of the same bucket."""
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES, fragment_dir="fragments")
    s3fs_fs.put(str(tmp_path / "ds" / "fragments"), f"{s3_bucket}/store/fragments", recursive=True)
    rewrite_uris(built.path, built.names["uris"], lambda u: "../../store/" + u)
    s3fs_fs.put(str(built.path), f"{s3_bucket}/catalogue/v1/{built.path.name}")
    x = daskcfa.from_cfa(f"s3://{s3_bucket}/catalogue/v1/{built.path.name}", "tas",
                         storage_options=s3_server.storage_options)
    assert_matches(x.compute(), built.expected)


def _split_s3_http(tmp_path, s3fs_fs, s3_bucket, http, *, agg_on_s3):
    """A CF-1.13 dataset whose fragments with an even first index are on S3, the others on HTTP."""
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "mix")
    for i, path in built.fragment_files.items():  # HTTP copies of the others
        if i[0] % 2:
            target = http.root / "mix" / path.relative_to(tmp_path / "ds")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())

    def where(u):
        i = next(k for k, (v,) in built.fragment_uris.items() if v == u)
        return f"{base}/{u}" if i[0] % 2 == 0 else http.url_for(f"mix/{u}")

    rewrite_uris(built.path, built.names["uris"], where)
    if agg_on_s3:
        s3fs_fs.put(str(built.path), f"{s3_bucket}/mix/{built.path.name}")
        url = f"{base}/{built.path.name}"
    else:
        url = str(built.path)
    for path in built.fragment_files.values():
        path.unlink()
    return built, url


@pytest.mark.parametrize("how", ["keyed", "flat", "config"])
def test_fragments_split_between_s3_and_http_local_aggregation(tmp_path, s3_server, s3_bucket, s3fs_fs,
                                                               make_http_server, how):
    (tmp_path / "www").mkdir()
    http = make_http_server(tmp_path / "www")
    built, url = _split_s3_http(tmp_path, s3fs_fs, s3_bucket, http, agg_on_s3=False)
    config = {}
    if how == "keyed":
        options = {"s3": s3_server.storage_options, "http": {}}
    elif how == "flat":
        # a local aggregation file takes no options: flat ones are its fragments' S3 options
        options = s3_server.storage_options
    else:
        options, config = None, {"daskcfa.storage.options.s3": s3_server.storage_options}
    with dask.config.set(config):
        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        assert_matches(x.compute(), built.expected)
    assert http.requests > 0


def test_fragments_split_between_s3_and_http_s3_aggregation(tmp_path, s3_server, s3_bucket, s3fs_fs,
                                                            make_http_server):
    (tmp_path / "www").mkdir()
    http = make_http_server(tmp_path / "www", username="reader", password="pw-for-http-only")
    built, url = _split_s3_http(tmp_path, s3fs_fs, s3_bucket, http, agg_on_s3=True)
    options = {"s3": s3_server.storage_options, "http": http.storage_options}
    # the default policy confines an S3 aggregation to its bucket
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    with pytest.raises(daskcfa.UnsafeURIError):
        x.compute()
    assert http.requests == 0
    # widened to that HTTP server, it reads (basic auth from the keyed options)
    allowed = ["default", http.url + "/"]
    x = daskcfa.from_cfa(url, "tas", storage_options=options, allowed_locations=allowed)
    assert_matches(x.compute(), built.expected)
    assert http.requests > 0 and all(r.status in (200, 206) for r in http.log)
    # flat options are the S3 ones (the aggregation's protocol): HTTP then has no
    # credentials, and the refusal is a StorageError naming the HTTP fragment
    x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options, allowed_locations=allowed)
    with pytest.raises(daskcfa.StorageError) as info:
        x.compute()
    assert info.value.file.startswith(http.url)
    assert "pw-for-http-only" not in str(info.value)


def test_fragment_names_with_spaces_and_unicode(tmp_path, s3_server, s3_bucket, s3fs_fs, make_http_server):
    """References are written as tools write them (not percent-encoded)."""
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(), DIMS, SIZES, fragment_dir="my fragments/été")
    assert all(" " in u and "été" in u for (u,) in built.fragment_uris.values())
    base = upload(s3fs_fs, tmp_path / "www" / "ds", s3_bucket, "with space")
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", "tas", storage_options=s3_server.storage_options)
    assert_matches(x.compute(), built.expected)
    http = make_http_server(tmp_path / "www")
    x = daskcfa.from_cfa(http.url_for("ds/" + built.path.name), "tas")
    assert_matches(x.compute(), built.expected)


@pytest.mark.parametrize("fmt", ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF4_CLASSIC"])
def test_netcdf3_and_classic_fragments_remote(tmp_path, s3_server, s3_bucket, s3fs_fs, make_http_server, fmt):
    """Fragments read through netCDF4-python from memory: each object fetched exactly once
    (netCDF-C must not be handed the URL, or it fetches the object again itself)."""
    built = build("CFA-0.6", tmp_path / "www" / "ds", truth(), DIMS, SIZES, fmt=fmt, strings="char",
                  frags=lambda i: Frag(format=fmt))
    base = upload(s3fs_fs, tmp_path / "www" / "ds", s3_bucket, "nc3")
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", "tas", storage_options=s3_server.storage_options)
    assert_matches(x.compute(), built.expected)
    http = make_http_server(tmp_path / "www")
    x = daskcfa.from_cfa(http.url_for("ds/" + built.path.name), "tas")
    http.reset()
    assert_matches(x.compute(), built.expected)
    for index, path in built.fragment_files.items():
        sent = _bytes_of(http, path.name)
        assert sent == path.stat().st_size, (index, sent, path.stat().st_size)


# ---------------------------------------------------------------------------
# 3. HTTP(S): byte ranges
# ---------------------------------------------------------------------------
def test_http_aggregation_and_fragments(tmp_path, make_http_server):
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(), DIMS, SIZES)
    http = make_http_server(tmp_path / "www")
    x = daskcfa.from_cfa(http.url_for("ds/" + built.path.name), "tas")
    assert x.chunks == built.chunks
    assert_matches(x.compute(), built.expected)
    assert_matches(x[2:4, 1:3, 1:4].compute(), built.expected[2:4, 1:3, 1:4])


@pytest.mark.parametrize("dialect", ["CFA-0.5", "NCA"])
def test_http_legacy_dialects(tmp_path, make_http_server, dialect):
    built = build(dialect, tmp_path / "www" / "ds", truth(), DIMS, SIZES)
    http = make_http_server(tmp_path / "www")
    x = daskcfa.from_cfa(http.url_for("ds/" + built.path.name), built.variable)
    assert_matches(x.compute(), built.expected)


BIG_SHAPE = (512, 64, 64)  # float32: 8 MiB per fragment
BIG_CHUNKS = (16, 64, 64)  # HDF5 chunks of 256 KiB


@pytest.fixture
def big_http_dataset(tmp_path, make_http_server):
    """Two 8 MiB fragments (uncompressed 256 KiB HDF5 chunks) served over HTTP."""
    www = tmp_path / "www"
    rng = np.random.default_rng(3)
    data = rng.random((2 * BIG_SHAPE[0],) + BIG_SHAPE[1:], dtype="f4")
    for k in range(2):
        write_chunked_fragment(www / "big" / f"f{k}.nc", "tas", DIMS, data[k * BIG_SHAPE[0]:(k + 1) * BIG_SHAPE[0]],
                               chunks=BIG_CHUNKS)
    write_cf113(www / "agg.nc", "tas", DIMS, ((BIG_SHAPE[0],) * 2, (BIG_SHAPE[1],), (BIG_SHAPE[2],)),
                [["big/f0.nc"], ["big/f1.nc"]])
    http = make_http_server(www)
    return http, data, (www / "big" / "f0.nc").stat().st_size


def _bytes_of(http, name):
    return sum(r.nbytes for r in http.log if r.path.endswith(name))


def _requests_for(http, name):
    return sum(1 for r in http.log if r.path.endswith(name))


def test_http_point_read_fetches_little(big_http_dataset):
    http, data, object_size = big_http_dataset
    chunk_bytes = int(np.prod(BIG_CHUNKS)) * 4
    x = daskcfa.from_cfa(http.url_for("agg.nc"), "tas")
    http.reset()
    with dask.config.set(scheduler="synchronous"):
        value = x[100, 5, 7].compute()
    assert value == data[100, 5, 7]
    sent = _bytes_of(http, "f0.nc")
    block = daskcfa.storage.block_size()
    print(f"\npoint read: {sent} bytes of a {object_size}-byte object in {http.requests} requests "
          f"({100 * sent / object_size:.1f}%); HDF5 chunk {chunk_bytes}, metadata block {block}")
    assert _bytes_of(http, "f1.nc") == 0, "the other fragment must not be touched"
    assert sent < 0.25 * object_size
    # chunk bytes (ranged GETs at least a chunk long) at most ~1.1 chunk
    chunk_reads = [r.nbytes for r in http.log if r.path.endswith("f0.nc") and r.range and r.nbytes >= chunk_bytes
                   and r.nbytes != block]
    assert sum(chunk_reads) <= 1.1 * chunk_bytes
    assert sent <= 1.1 * chunk_bytes + 2 * block + 4096
    assert not any(r.range is None and r.method == "GET" and r.path.endswith("f0.nc") for r in http.log), \
        "no whole-object GET for a point read"
    # the size, one metadata block (which also shows the HDF5 signature), the chunk
    assert _requests_for(http, "f0.nc") <= 3


def test_http_full_read_fetches_each_object_once(big_http_dataset):
    http, data, object_size = big_http_dataset
    x = daskcfa.from_cfa(http.url_for("agg.nc"), "tas")
    http.reset()
    got = x.compute()
    np.testing.assert_array_equal(got, data)
    for name in ("f0.nc", "f1.nc"):
        sent = _bytes_of(http, name)
        print(f"\nfull read of {name}: {sent} bytes for a {object_size}-byte object")
        assert object_size <= sent <= object_size + 64 * 1024, "whole object once, not twice"
        assert _requests_for(http, name) <= 2, "the size, then one GET"


def test_http_full_read_of_a_large_object_in_parts(big_http_dataset):
    """Objects larger than twice ``daskcfa.storage.part-size`` come down as concurrent ranged GETs."""
    http, data, object_size = big_http_dataset
    x = daskcfa.from_cfa(http.url_for("agg.nc"), "tas")
    http.reset()
    with dask.config.set({"daskcfa.storage.part-size": "1MiB"}):
        got = x.compute()
    np.testing.assert_array_equal(got, data)
    for name in ("f0.nc", "f1.nc"):
        gets = [r for r in http.log if r.path.endswith(name) and r.method == "GET"]
        assert len(gets) == -(-object_size // (1 << 20))
        assert all(r.range is not None for r in gets)
        assert _bytes_of(http, name) == object_size


def test_http_partial_read_of_a_few_chunks(big_http_dataset):
    http, data, object_size = big_http_dataset
    x = daskcfa.from_cfa(http.url_for("agg.nc"), "tas")
    http.reset()
    got = x[100:132, 10:20, :].compute()  # two or three HDF5 chunks of f0
    np.testing.assert_array_equal(got, data[100:132, 10:20, :])
    sent = _bytes_of(http, "f0.nc")
    print(f"\n32-step read: {sent} bytes ({100 * sent / object_size:.1f}% of the object)")
    assert sent < 0.4 * object_size
    # a read across both fragments touching one chunk of each
    http.reset()
    got = x[510:514, 0, 0].compute()
    np.testing.assert_array_equal(got, data[510:514, 0, 0])
    assert 0 < _bytes_of(http, "f0.nc") < 0.25 * object_size
    assert 0 < _bytes_of(http, "f1.nc") < 0.25 * object_size


def test_s3_point_read_uses_byte_ranges(tmp_path, s3_server, s3_bucket, s3fs_fs, caplog):
    rng = np.random.default_rng(4)
    data = rng.random(BIG_SHAPE, dtype="f4")
    write_chunked_fragment(tmp_path / "ds" / "big" / "f0.nc", "tas", DIMS, data, chunks=BIG_CHUNKS)
    write_cf113(tmp_path / "ds" / "agg.nc", "tas", DIMS, tuple((n,) for n in BIG_SHAPE), [[["big/f0.nc"]]])
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "big")
    x = daskcfa.from_cfa(f"{base}/agg.nc", "tas", storage_options=s3_server.storage_options)
    assert float(x[300, 1, 2].compute()) == data[300, 1, 2]
    assert_matches(x[::50, ::7, ::9].compute(), data[::50, ::7, ::9])
    np.testing.assert_array_equal(x.compute(), data)


# ---------------------------------------------------------------------------
# 4. OPeNDAP fragments
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["dap2", "mode"])
def test_opendap_fragments_from_local_aggregation(tmp_path, opendap_dir, style):
    directory, base_url = opendap_dir
    built = build("CF-1.13", directory, truth(), DIMS, SIZES)
    agg = tmp_path / "local.nc"
    host = base_url.split("://", 1)[1]

    def to_dap(u):
        if style == "dap2":
            return f"dap2://{host}/{u}"
        return f"{base_url}/{u}#mode=dap2"

    rewrite_uris(built.path, built.names["uris"], to_dap)
    agg.write_bytes(built.path.read_bytes())
    built.path.unlink()
    x = daskcfa.from_cfa(str(agg), "tas")
    assert_matches(x.compute(), built.expected)
    assert_matches(x[1:5, 2, 1:4].compute(), built.expected[1:5, 2, 1:4])


def test_opendap_aggregation_file(opendap_dir):
    """The aggregation file itself through OPeNDAP, its fragments relative on the same server."""
    directory, base_url = opendap_dir
    built = build("CF-1.13", directory, truth(), DIMS, SIZES)
    host = base_url.split("://", 1)[1]
    x = daskcfa.from_cfa(f"dap2://{host}/{built.path.name}", "tas")
    assert_matches(x.compute(), built.expected)


# ---------------------------------------------------------------------------
# 5. Relative resolution against a remote base
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("base,ref,expected", [
    ("s3://b/a/x.nca", "x/f.0.nc", "s3://b/a/x/f.0.nc"),
    ("s3://b/a/x.nca", "./x/f.0.nc", "s3://b/a/x/f.0.nc"),
    ("s3://b/a/c/x.nca", "../f.nc", "s3://b/a/f.nc"),
    ("s3://b/a/c/x.nca", "../../f.nc", "s3://b/f.nc"),
    ("s3://b/a/x.nca", "../../../../etc/passwd", "s3://b/etc/passwd"),  # never leaves the bucket
    ("s3://b/a/x.nca", "../../other-bucket/f.nc", "s3://b/other-bucket/f.nc"),
    ("s3://b/x.nca", "f.nc", "s3://b/f.nc"),
    ("s3://b/a/x.nca", "s3://c/f.nc", "s3://c/f.nc"),
    ("https://h:8443/d/agg.nc", "f/1.nc", "https://h:8443/d/f/1.nc"),
    ("https://h:8443/d/agg.nc", "../../../f.nc", "https://h:8443/f.nc"),
    ("http://h/d/agg.nc", "/etc/passwd", "/etc/passwd"),  # a local path stays local (and the policy refuses it)
])
def test_relative_resolution_against_remote_base(base, ref, expected):
    assert storage.resolve(ref, base) == expected


def test_dotdot_beyond_the_bucket_root_stays_in_the_bucket(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """``../`` past the root cannot reach another bucket, even one that exists."""
    other = s3_server.new_bucket("other")
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    s3fs_fs.put(str(tmp_path / "ds" / "fragments"), f"{other}/fragments", recursive=True)
    rewrite_uris(built.path, built.names["uris"], lambda u: f"../../../{other}/{u}")
    s3fs_fs.put(str(built.path), f"{s3_bucket}/a/{built.path.name}")
    x = daskcfa.from_cfa(f"s3://{s3_bucket}/a/{built.path.name}", "tas", storage_options=s3_server.storage_options)
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    assert info.value.file.startswith(f"s3://{s3_bucket}/{other}/fragments/")


# ---------------------------------------------------------------------------
# 8. Concurrency
# ---------------------------------------------------------------------------
def test_fifty_s3_fragments_threaded(tmp_path, s3_server, s3_bucket, s3fs_fs):
    t = make_truth((50, 16, 12), seed=9, masked=0.05)
    built = build("CF-1.13", tmp_path / "ds", t, DIMS, ((1,) * 50, (16,), (12,)))
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "fifty")
    x = daskcfa.from_cfa(f"{base}/{built.path.name}", "tas", storage_options=s3_server.storage_options)
    assert x.numblocks == (50, 1, 1)
    with dask.config.set(scheduler="synchronous"):
        t0 = time.perf_counter()
        serial = x.compute()
        t_serial = time.perf_counter() - t0
    with dask.config.set(scheduler="threads", num_workers=8):
        t0 = time.perf_counter()
        threaded = x.compute()
        t_threaded = time.perf_counter() - t0
    print(f"\n50 S3 fragments: synchronous {t_serial:.2f} s, 8 threads {t_threaded:.2f} s")
    assert_matches(serial, built.expected)
    assert_matches(threaded, built.expected)
    # many concurrent small reads, repeated, stay right
    with dask.config.set(scheduler="threads", num_workers=8):
        points = dask.compute(*[x[k, k % 16, k % 12] for k in range(50)])
    for k, p in enumerate(points):
        assert_matches(p, built.expected[k, k % 16, k % 12])


# ---------------------------------------------------------------------------
# 9. Read-ahead of small objects along a walk
# ---------------------------------------------------------------------------
WALK = 40


@pytest.fixture
def walk_dataset(tmp_path, make_http_server):
    """40 small one-time-step fragments served over HTTP (whole-object reads)."""
    t = make_truth((WALK, 6, 5), seed=4, masked=0.1)
    built = build("CF-1.13", tmp_path / "www" / "ds", t, DIMS, ((1,) * WALK, (6,), (5,)))
    http = make_http_server(tmp_path / "www")
    return built, http, daskcfa.from_cfa(http.url_for("ds/" + built.path.name), built.variable)


def _fragment_gets(http):
    counts = {}
    for r in http.log:
        if r.method == "GET" and "/ds/" in r.path and not r.path.endswith(".cfa.nc") and r.path.endswith(".nc"):
            counts[r.path] = counts.get(r.path, 0) + 1
    return counts


def _used(before):
    from daskcfa.fragments import readahead

    now = readahead.stats()
    return {k: now[k] - before[k] for k in now}


@pytest.mark.parametrize("scheduler", ["synchronous", "threads"])
def test_read_ahead_fetches_each_object_once_along_a_time_series(walk_dataset, scheduler):
    from daskcfa.fragments import readahead

    built, http, x = walk_dataset
    aggregation = built.path.name
    http.reset()
    before = readahead.stats()
    with dask.config.set({"daskcfa.io.readahead": 4, "scheduler": scheduler}):
        got = x[:, 2, 3].compute()
    assert_matches(got, built.expected[:, 2, 3])
    gets = {p: n for p, n in _fragment_gets(http).items() if not p.endswith(aggregation)}
    assert len(gets) == WALK and set(gets.values()) == {1}, "every object fetched exactly once"
    used = _used(before)
    if scheduler == "synchronous":  # dask walks in runs: all but the start of each run come from read-ahead
        assert used["used"] >= 3 * WALK // 4
    assert used["used"] > 0 and used["started"] <= WALK


@pytest.mark.parametrize("scheduler", ["synchronous", "threads"])
def test_read_ahead_within_chunks_of_merged_fragments(walk_dataset, scheduler):
    """A chunk of several small remote fragments (``chunks="1KiB"``: 8 fragments a chunk) reads
    them as a walk: the next ones are fetched ahead, each object exactly once."""
    built, http, _ = walk_dataset
    x = daskcfa.from_cfa(http.url_for("ds/" + built.path.name), built.variable, chunks="1KiB")
    assert len(x.chunks[0]) < WALK // 4
    http.reset()
    before = __import__("daskcfa.fragments.readahead", fromlist=["stats"]).stats()
    with dask.config.set({"daskcfa.io.readahead": 4, "scheduler": scheduler}):
        got = x.compute()
    assert_matches(got, built.expected)
    gets = {p: n for p, n in _fragment_gets(http).items() if not p.endswith(built.path.name)}
    assert len(gets) == WALK and set(gets.values()) == {1}, "every object fetched exactly once"
    used = _used(before)
    assert used["used"] >= WALK // 2 and used["started"] <= WALK


def test_read_ahead_stops_near_the_end_of_a_partial_walk(walk_dataset):
    built, http, x = walk_dataset
    http.reset()
    with dask.config.set({"daskcfa.io.readahead": 4, "scheduler": "synchronous"}):
        got = x[:10, 2, 3].compute()
    assert_matches(got, built.expected[:10, 2, 3])
    gets = {p: n for p, n in _fragment_gets(http).items() if not p.endswith(built.path.name)}
    assert 10 <= len(gets) <= 10 + 4 and set(gets.values()) == {1}


@pytest.mark.parametrize("settings", [{"daskcfa.io.readahead": 0}, {"daskcfa.io.small-object": 16}])
def test_read_ahead_off_or_objects_too_large(walk_dataset, settings):
    built, http, x = walk_dataset
    before = __import__("daskcfa.fragments.readahead", fromlist=["stats"]).stats()
    with dask.config.set({**settings, "scheduler": "synchronous"}):
        got = x[:, 2, 3].compute()
    assert_matches(got, built.expected[:, 2, 3])
    assert _used(before)["started"] == 0


@pytest.mark.parametrize("ahead_bytes", [32 << 20, 1])
def test_read_ahead_of_larger_objects_a_walk_reads_whole(walk_dataset, monkeypatch, ahead_bytes):
    """Objects over the small-object size are read ahead too when the walk wants each whole (a
    reduction): their tasks would fetch them whole anyway; at most ``_AHEAD_BYTES`` of them at a time
    (at least one), each object still fetched exactly once."""
    from daskcfa.fragments import readahead

    monkeypatch.setattr(readahead, "_AHEAD_BYTES", ahead_bytes)
    built, http, x = walk_dataset
    http.reset()
    before = readahead.stats()
    with dask.config.set({"daskcfa.io.readahead": 4, "daskcfa.io.small-object": 16, "scheduler": "synchronous"}):
        got = x[:, 1:, :].compute()
    assert_matches(got, built.expected[:, 1:, :])
    gets = {p: n for p, n in _fragment_gets(http).items() if not p.endswith(built.path.name)}
    assert len(gets) == WALK and set(gets.values()) == {1}, "every object fetched exactly once"
    used = _used(before)
    # (one object at a time: the start of each of dask's runs through the walk is fetched by its task)
    assert used["used"] >= (3 * WALK // 4 if ahead_bytes > 1 else WALK // 4) and used["started"] <= WALK


@pytest.mark.parametrize("scheduler", ["synchronous", "threads"])
def test_read_ahead_again_when_a_walk_is_done_again(walk_dataset, scheduler):
    """A walk done again (the same series computed twice, then another reduction over the
    same objects) reads ahead as the first did, though it is far shorter than the reads
    remembered: an object read twice starts a new walk."""
    from daskcfa.fragments import readahead

    assert WALK < readahead._RECENT_READS
    built, http, x = walk_dataset
    series = x[:, 2, 3]
    with dask.config.set({"daskcfa.io.readahead": 4, "scheduler": scheduler}):
        series.compute()
        for again in (series, x[:, 1:, :].sum()):
            http.reset()
            before = readahead.stats()
            got = again.compute()
            gets = {p: n for p, n in _fragment_gets(http).items() if not p.endswith(built.path.name)}
            assert len(gets) == WALK and set(gets.values()) == {1}, "every object fetched exactly once"
            assert _used(before)["used"] >= WALK // 2
    assert_matches(got, built.expected[:, 1:, :].sum())


# ---------------------------------------------------------------------------
# 10. Whole-object GETs: one request each; large S3 objects streamed, not joined
# ---------------------------------------------------------------------------
def test_whole_object_gets_ask_for_one_request():
    """s3fs would HEAD an object before every whole GET (to split large ones itself)."""
    import fsspec
    import s3fs

    assert storage.objects._one_get(s3fs.S3FileSystem(anon=True)) == {"max_concurrency": 1}
    assert storage.objects._one_get(fsspec.filesystem("http")) == {}
    assert storage.objects._one_get(fsspec.filesystem("file")) == {}


@pytest.mark.parametrize("layout", ["contiguous", "chunked"])
def test_s3_large_objects_are_received_off_the_event_loop(tmp_path, s3_server, s3_bucket, s3fs_fs, layout,
                                                          monkeypatch):
    """Fragments of a few MiB come down as one GET each (no HEAD), received in the thread that
    reads them or a read-ahead thread, signed and sent without the SDK's request machinery
    (storage/lean.py; before, through the blocking client of storage/direct.py, which a plain 200
    no longer reaches): the reads finish while fsspec's event loop, which s3fs's requests need,
    is held busy. Every read returns arrays of its own."""
    from remote_helpers import event_loop_held, large_fragments

    url, data = large_fragments(tmp_path, s3fs_fs, s3_bucket, "direct", layout)
    x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
    received, through_client = [], []
    get_signed, get_whole = storage.objects.get_signed, storage.lean.get_whole

    def counted(lean, fs, path, uri, max_bytes=None):
        received.append(path)
        return get_signed(lean, fs, path, uri, max_bytes)

    def sent_again(client, fs, path, uri, max_bytes=None):
        through_client.append(path)
        return get_whole(client, fs, path, uri, max_bytes)

    monkeypatch.setattr(storage.objects, "get_signed", counted)
    monkeypatch.setattr(storage.lean, "get_whole", sent_again)
    for scheduler in ("synchronous", "threads"):
        received.clear()
        with event_loop_held() as held_throughout:
            got = x.compute(scheduler=scheduler)
            assert held_throughout()
        assert sorted(p.rsplit("/", 1)[-1] for p in received) == ["0.nc", "1.nc"] and through_client == []
        np.testing.assert_array_equal(np.ma.getdata(got), data)
        got[0, 0, 0] = -1.0  # a result is the caller's to change
        np.testing.assert_array_equal(np.ma.getdata(x[0].compute()), data[0])
    assert_matches(x[5:30:4, 100, ::3].compute(), data[5:30:4, 100, ::3])


def test_s3_blocking_client_takes_the_service_models_s3fs_parsed(s3_server, s3_bucket):
    """The blocking client of a filesystem s3fs has connected is made with the S3 service models its
    session parsed already (the same profile, so the same data path): they are not parsed again."""
    import s3fs

    from daskcfa.storage import direct

    fs = s3fs.S3FileSystem(**s3_server.storage_options, skip_instance_cache=True)
    fs.ls(s3_bucket)  # (s3fs has connected: its session holds the models)
    client = direct.client_for(fs)
    assert client is not None
    assert client._loader is fs.session.get_component("data_loader")  # (the loader botocore made it with)


def test_s3_large_objects_missing_or_refused_name_the_fragment(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """On the blocking GET (the event loop held throughout): a fragment read with the wrong secret (a
    storage profile matching its prefix) is an access-denied StorageError naming it, neither secret
    in its text; an object gone is a NotFoundError, and so, read through an aggregation (which then
    looks for the dataset's manifest through s3fs), a MissingFragmentError naming the fragment
    (``missing="fill"``: masked, with a CFAWarning)."""
    from remote_helpers import event_loop_held, large_fragments

    url, data = large_fragments(tmp_path, s3fs_fs, s3_bucket, "refused")
    base = url.rsplit("/", 1)[0]
    x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
    filled = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options, missing="fill")
    wrong = "wrong-" + s3_server.secret[::-1]
    with dask.config.set({"daskcfa.storage.profiles": {"bad": {"match": f"{base}/f/", "secret": wrong}}}), \
            event_loop_held() as held_throughout, pytest.raises(daskcfa.errors.StorageError, match="access denied") \
            as denied:
        x.compute(scheduler="synchronous")
    assert held_throughout()
    assert denied.value.file.rsplit("/", 1)[-1] in ("0.nc", "1.nc") and denied.value.fragment is not None
    assert s3_server.secret not in str(denied.value) and wrong not in str(denied.value)
    s3fs_fs.rm(f"{base}/f/1.nc".removeprefix("s3://"))
    profile = daskcfa.storage.profiles.register(s3_server.storage_options, protocol="s3")
    with event_loop_held() as held_throughout, pytest.raises(daskcfa.errors.NotFoundError):
        storage.read_whole(f"{base}/f/1.nc", profile, size_hint=2 << 20)
    assert held_throughout()
    with pytest.raises(daskcfa.MissingFragmentError) as missing:
        x.compute(scheduler="threads")
    with pytest.warns(daskcfa.CFAWarning, match="1.nc"):
        got = filled.compute(scheduler="threads")
    assert missing.value.file.endswith("/f/1.nc") and missing.value.fragment == (1, 0, 0)
    np.testing.assert_array_equal(got[:24], data[:24])
    assert np.ma.getmaskarray(got[24:]).all()


def test_s3_large_objects_on_distributed_workers(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """On a cluster of processes each worker makes its own blocking client, from the storage
    profile the StorageProfiles plugin installed there: the graph carries no client and no
    secret, the client process made none for the compute, and the values are exact."""
    import cloudpickle
    from distributed import Client, LocalCluster

    from daskcfa.storage import direct
    from remote_helpers import large_fragments

    url, data = large_fragments(tmp_path, s3fs_fs, s3_bucket, "workers")

    def clients() -> int:
        return sum(client is not None for _, client in direct._CLIENTS.values())

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
        made_here = len(direct._CLIENTS)  # (opening the aggregation file here, a small object, may make one)
        graph = cloudpickle.dumps(dict(x.__dask_graph__()))
        assert b"botocore" not in graph and s3_server.secret.encode() not in graph
        np.testing.assert_array_equal(np.ma.getdata(x.compute()), data)
        assert sum(client.run(clients).values()) >= 1
    assert len(direct._CLIENTS) == made_here


@pytest.mark.parametrize("how", ["truncate", "stall"])
def test_s3_bodies_cut_short_are_retried_then_refused(tmp_path, s3_server, s3_bucket, s3fs_fs, how):
    """A large object's body that stops half way (the connection closed, or nothing more sent) is a
    transient fault on the blocking GET: retried, then a StorageError naming the fragment, no
    secret, within the read timeout of the storage options (``config_kwargs``, as s3fs takes it);
    never values. The event loop is held throughout: it is the blocking GET that meets it."""
    from remote_helpers import CorruptingProxy, event_loop_held, large_fragments

    url, _ = large_fragments(tmp_path, s3fs_fs, s3_bucket, how)
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    with CorruptingProxy(("127.0.0.1", port), min_body=1 << 20, how=how) as proxy:
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint_url},
                   "config_kwargs": {"read_timeout": 1}}
        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        with dask.config.set({"daskcfa.storage.retries": 2, "scheduler": "synchronous"}), \
                event_loop_held() as held_throughout, pytest.raises(daskcfa.errors.StorageError) as caught:
            x.compute()
        assert held_throughout()
    assert caught.value.file is not None and caught.value.file.rsplit("/", 1)[-1] in ("0.nc", "1.nc")
    assert proxy.corrupted == 3  # (the first attempt at the first fragment read, and two retries)
    assert s3_server.secret not in str(caught.value) and s3_server.key not in str(caught.value)


def test_s3_a_declared_length_beyond_the_memory_budget_is_refused_before_the_body(tmp_path, s3_server, s3_bucket,
                                                                                  s3fs_fs):
    """A server declaring a body of 10^15 bytes: a BudgetError naming the fragment, before
    the body is read (no buffer of that size allocated, no retry)."""
    from remote_helpers import CorruptingProxy, event_loop_held, large_fragments

    url, _ = large_fragments(tmp_path, s3fs_fs, s3_bucket, "declare")
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    with CorruptingProxy(("127.0.0.1", port), min_body=1 << 20, how="declare") as proxy:
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint_url}}
        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        with event_loop_held() as held_throughout, pytest.raises(daskcfa.errors.BudgetError) as refused:
            x.compute(scheduler="synchronous")
        assert held_throughout()
    assert refused.value.file.rsplit("/", 1)[-1] in ("0.nc", "1.nc") and "1,000,000,000,000,000" in str(refused.value)
    assert proxy.corrupted == 1
    assert s3_server.secret not in str(refused.value)


def test_s3_a_redirected_get_is_not_followed(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """An S3 endpoint answering a large fragment's GET with a 307 to another origin: the blocking
    GET does not follow it (botocore's HTTP layer follows no redirect): a CFAError naming the
    fragment, and the other origin sees no request."""
    from remote_helpers import CorruptingProxy, FailingProxy, event_loop_held, large_fragments

    url, _ = large_fragments(tmp_path, s3fs_fs, s3_bucket, "redirect")
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    with FailingProxy() as elsewhere, CorruptingProxy(("127.0.0.1", port), min_body=1 << 20, how="redirect",
                                                      location=elsewhere.endpoint_url + "/planted.nc") as proxy:
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint_url}}
        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        with event_loop_held() as held_throughout, pytest.raises(daskcfa.CFAError) as refused:
            x.compute(scheduler="synchronous")
        assert held_throughout()
    assert refused.value.file.rsplit("/", 1)[-1] in ("0.nc", "1.nc") and refused.value.fragment is not None
    assert proxy.corrupted >= 1 and elsewhere.connections == 0


def test_s3_bodies_longer_than_declared_give_the_declared_bytes(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """A server sending more bytes than the length it declared: the object is the declared bytes
    (their CRC-32 checked), never the extra ones; the next request on that connection is not
    fooled by them (a fresh connection: the values are exact)."""
    from remote_helpers import CorruptingProxy, event_loop_held, large_fragments

    url, data = large_fragments(tmp_path, s3fs_fs, s3_bucket, "extend")
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    with CorruptingProxy(("127.0.0.1", port), min_body=1 << 20, how="extend") as proxy:
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint_url}}
        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        for scheduler in ("synchronous", "threads"):
            with event_loop_held() as held_throughout:
                got = x.compute(scheduler=scheduler)
                assert held_throughout()
            np.testing.assert_array_equal(np.ma.getdata(got), data)
    assert proxy.corrupted >= 4


@pytest.mark.parametrize("side", [32, 128])  # (objects of 0.1 MiB, fetched whole; of 1.5 MiB, streamed)
@pytest.mark.parametrize("scheduler", ["synchronous", "threads"])  # (threads: fetched by the read-ahead too)
def test_s3_bytes_changed_in_transfer_are_refused(tmp_path, s3_server, s3_bucket, s3fs_fs, side, scheduler):
    """A fragment object whose bytes change on the way (the server's CRC-32 header intact) is a
    StorageError naming it, never values: daskcfa checks the CRC-32 of whole objects itself
    (storage/transfer.py). Through the same proxy, unchanged, the values are right."""
    from remote_helpers import CorruptingProxy

    data = np.random.default_rng(7).random((2 * 24, side, side), dtype="f4")
    for k in range(2):
        write_chunked_fragment(tmp_path / "ds" / "f" / f"{k}.nc", "tas", DIMS, data[k * 24:(k + 1) * 24],
                               chunks=(6, side, side))
    write_cf113(tmp_path / "ds" / "agg.nc", "tas", DIMS, ((24, 24), (side,), (side,)), [["f/0.nc"], ["f/1.nc"]])
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "changed")
    fragment_bytes = s3fs_fs.size(f"{base}/f/0.nc".removeprefix("s3://"))
    assert (fragment_bytes > storage.objects._DIRECT_FROM) == (side == 128)
    server = s3_server.endpoint_url.rsplit(":", 1)
    for min_body, corrupted in ((1 << 40, False), (fragment_bytes // 2, True)):  # (the aggregation file unchanged)
        with CorruptingProxy(("127.0.0.1", int(server[1])), min_body=min_body) as proxy:
            options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint_url}}
            x = daskcfa.from_cfa(f"{base}/agg.nc", "tas", storage_options=options)
            if not corrupted:
                np.testing.assert_array_equal(np.ma.getdata(x.compute(scheduler=scheduler)), data)
                continue
            with pytest.raises(daskcfa.errors.StorageError, match="CRC-32") as caught:
                x.compute(scheduler=scheduler)
            assert caught.value.file is not None and caught.value.file.rsplit("/", 1)[-1] in ("0.nc", "1.nc")
            assert proxy.corrupted >= 1
            assert s3_server.secret not in str(caught.value)


def test_no_read_ahead_on_distributed_workers_by_default(walk_dataset):
    """Workers share a walk's tasks: a worker reading ahead would fetch objects that the
    other then fetches again (2.1x the bytes, measured). Each object is fetched once."""
    from distributed import Client, LocalCluster

    from daskcfa.fragments import readahead

    built, http, x = walk_dataset
    assert readahead.depth() == readahead.DEFAULT_DEPTH  # (here: not a worker)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        assert client.submit(readahead.depth, pure=False).result() == 0
        http.reset()
        got = x[:, 2, 3].compute()
    assert_matches(got, built.expected[:, 2, 3])
    gets = {p: n for p, n in _fragment_gets(http).items() if not p.endswith(built.path.name)}
    assert len(gets) == WALK and set(gets.values()) == {1}


def test_read_ahead_state_stays_in_its_process(walk_dataset):
    """What an array learnt walking here (its last fragment, the URIs ahead) is not pickled
    with it: a worker that receives the array starts its own walk."""
    import pickle

    from daskcfa.graph.read import AggregatedArray

    built, http, x = walk_dataset
    with dask.config.set({"daskcfa.io.readahead": 4, "scheduler": "synchronous"}):
        x[:, 2, 3].compute()
    (array,) = [v for v in dict(x.__dask_graph__()).values() if isinstance(v, AggregatedArray)]
    assert array._last_read is not None and array._ahead_uris
    copy = pickle.loads(pickle.dumps(array))
    assert copy._last_read is None and copy._ahead_uris == {} and copy._entries == {}
    assert_matches(copy[(slice(0, 3), 2, 3)], built.expected[:3, 2, 3])


def test_an_http_netcdf4_file_read_by_h5py_block_by_block_to_its_last_partial_block(http_server):
    """h5py reads an HTTP file through daskcfa's file object, in blocks checked as byte ranges: the last
    block, past the file's end, is read up to its end (trust18's check first took the short answer to a
    whole block's range for a body ended early: every file whose size is no multiple of the block failed)."""
    import h5py
    import netCDF4

    path = http_server.root / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 1000)
        v = nc.createVariable("v", "f8", ("x",), zlib=True, chunksizes=(100,))
        v[:] = np.arange(1000.0)
    size = path.stat().st_size
    assert size % storage.block_size()  # (ends inside a block)
    f = storage.open_file(http_server.url_for("f.nc"), storage.register({}, protocol="http"))
    with f:
        assert len(f.read()) == size
        f.seek(0)
        with h5py.File(f, "r") as h5:
            np.testing.assert_array_equal(h5["v"][...], np.arange(1000.0))
