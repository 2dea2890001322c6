"""The local test servers (daskcfa_testing.servers) behave like real ones.

Everything here talks to real servers on 127.0.0.1: SeaweedFS for S3, the
threaded range-capable HTTP server, and pydap's OPeNDAP server.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import pytest

# ---------------------------------------------------------------------------
# S3 (SeaweedFS)
# ---------------------------------------------------------------------------


def _denied(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, (PermissionError, ClientError))


def test_s3_round_trip(s3fs_fs, s3_bucket):
    data = np.random.default_rng(1).bytes(100_000)
    path = f"{s3_bucket}/dir/fragment_0.nc"
    s3fs_fs.pipe(path, data)
    assert s3fs_fs.cat_file(path) == data
    assert s3fs_fs.cat_file(path, start=10, end=1000) == data[10:1000]
    assert s3fs_fs.cat_file(path, start=-100) == data[-100:]
    assert s3fs_fs.info(path)["size"] == len(data)
    assert s3fs_fs.find(s3_bucket) == [path]


def test_s3_multipart_upload(s3fs_fs, s3_bucket):
    part = 5 * 2**20
    data = np.random.default_rng(2).bytes(2 * part + 12345)
    path = f"{s3_bucket}/big.bin"
    with s3fs_fs.open(path, "wb", block_size=part) as f:
        for i in range(0, len(data), part):
            f.write(data[i : i + part])
    assert s3fs_fs.info(path)["size"] == len(data)
    assert s3fs_fs.cat_file(path, start=part - 5, end=part + 5) == data[part - 5 : part + 5]


def test_s3_storage_options_work_with_fsspec(s3_server, s3_bucket):
    import fsspec

    url = f"s3://{s3_bucket}/a.txt"
    with fsspec.open(url, "wb", **s3_server.storage_options) as f:
        f.write(b"hello")
    with fsspec.open(url, "rb", **s3_server.storage_options) as f:
        assert f.read() == b"hello"
    assert "region_name" not in s3_server.storage_options["client_kwargs"]


def test_s3_wrong_secret_is_denied(s3_server, s3fs_fs, s3_bucket):
    s3fs_fs.pipe(f"{s3_bucket}/secret.txt", b"x")
    bad = s3_server.filesystem(secret=s3_server.secret + "x")
    with pytest.raises(Exception) as info:
        bad.cat_file(f"{s3_bucket}/secret.txt")
    assert _denied(info.value), repr(info.value)
    with pytest.raises(Exception) as info:
        bad.pipe(f"{s3_bucket}/other.txt", b"y")
    assert _denied(info.value), repr(info.value)
    assert not s3fs_fs.exists(f"{s3_bucket}/other.txt")


def test_s3_anonymous_is_refused(s3_server, s3fs_fs, s3_bucket):
    import s3fs

    s3fs_fs.pipe(f"{s3_bucket}/private.txt", b"x")
    anon = s3fs.S3FileSystem(
        anon=True, client_kwargs={"endpoint_url": s3_server.endpoint_url}, skip_instance_cache=True
    )
    with pytest.raises(Exception) as info:
        anon.cat_file(f"{s3_bucket}/private.txt")
    assert _denied(info.value), repr(info.value)


def test_s3_fresh_buckets_are_isolated(s3_server, s3fs_fs):
    a, b = s3_server.new_bucket(), s3_server.new_bucket("other")
    assert a != b and b.startswith("other-")
    assert s3fs_fs.find(a) == [] and s3fs_fs.find(b) == []
    s3fs_fs.pipe(f"{a}/k", b"1")
    assert s3fs_fs.find(b) == []
    assert not s3fs_fs.exists(f"{b}/k")
    assert {a, b} <= set(s3fs_fs.ls(""))


def test_s3_upload_does_not_create_a_bucket(s3fs_fs):
    with pytest.raises(FileNotFoundError):
        s3fs_fs.pipe("no-such-bucket-daskcfa/k", b"x")
    assert "no-such-bucket-daskcfa" not in s3fs_fs.ls("")


def test_s3_restart_keeps_data(s3_server_private):
    server = s3_server_private
    bucket = server.new_bucket()
    fs = server.filesystem()
    fs.pipe(f"{bucket}/keep.bin", b"persistent")
    old_pid, endpoint = server.pid, server.endpoint_url

    server.kill()  # a crash
    assert not server.running
    server.restart()
    assert server.running and server.pid != old_pid and server.endpoint_url == endpoint
    assert server.filesystem().cat_file(f"{bucket}/keep.bin") == b"persistent"

    server.restart(hard=False)  # SIGTERM, then start again
    assert server.filesystem().cat_file(f"{bucket}/keep.bin") == b"persistent"

    directory, proc = server.directory, server._proc
    server.stop()  # the process is gone and so is its data directory
    assert proc.poll() is not None
    assert not directory.exists()
    assert not server.running


# ---------------------------------------------------------------------------
# HTTP with byte ranges
# ---------------------------------------------------------------------------


@pytest.fixture
def served_bytes(http_server):
    data = np.random.default_rng(3).bytes(50_000)
    (http_server.root / "sub").mkdir()
    (http_server.root / "sub" / "f.bin").write_bytes(data)
    http_server.reset()
    return data


def _get(url, headers=None, method="GET"):
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_http_range_reads_through_fsspec(http_server, served_bytes):
    import fsspec

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    url = http_server.url_for("sub/f.bin")
    assert fs.cat_file(url, start=100, end=1100) == served_bytes[100:1100]
    assert http_server.requests == 1
    assert http_server.bytes_sent == 1000
    assert http_server.log[0].range == "bytes=100-1099"
    assert http_server.log[0].status == 206

    http_server.reset()
    assert (http_server.requests, http_server.bytes_sent, http_server.log) == (0, 0, [])
    assert fs.cat_file(url) == served_bytes
    assert http_server.bytes_sent == len(served_bytes)

    assert fs.info(url)["size"] == len(served_bytes)
    assert fs.ls(http_server.url + "/sub/", detail=False) == [url]


def test_http_range_semantics(http_server, served_bytes):
    url, n = http_server.url_for("sub/f.bin"), len(served_bytes)

    status, headers, body = _get(url, {"Range": "bytes=0-0"})
    assert (status, headers["Content-Range"], body) == (206, f"bytes 0-0/{n}", served_bytes[:1])
    assert headers["Accept-Ranges"] == "bytes"

    status, headers, body = _get(url, {"Range": "bytes=-10"})
    assert (status, headers["Content-Range"], body) == (206, f"bytes {n - 10}-{n - 1}/{n}", served_bytes[-10:])

    status, headers, body = _get(url, {"Range": f"bytes={n - 5}-"})
    assert (status, body) == (206, served_bytes[-5:])

    status, headers, body = _get(url, {"Range": f"bytes={n - 5}-{n + 100}"})  # clipped
    assert (status, headers["Content-Range"], body) == (206, f"bytes {n - 5}-{n - 1}/{n}", served_bytes[-5:])

    status, headers, _ = _get(url, {"Range": f"bytes={n}-"})
    assert (status, headers["Content-Range"]) == (416, f"bytes */{n}")

    status, headers, body = _get(url, {"Range": "bytes=0-1,5-6"})  # multi-range: ignored
    assert (status, body) == (200, served_bytes)

    status, headers, body = _get(url, method="HEAD")
    assert (status, int(headers["Content-Length"]), body) == (200, n, b"")
    assert headers["Accept-Ranges"] == "bytes"

    assert _get(http_server.url_for("nope.bin"))[0] == 404
    assert _get(http_server.url + "/../../etc/passwd")[0] == 404  # stays inside the root
    assert http_server.requests == 9


def test_http_basic_auth(make_http_server, tmp_path):
    import fsspec

    (tmp_path / "a.bin").write_bytes(b"0123456789")
    server = make_http_server(tmp_path, username="user", password="pa:ss")
    url = server.url_for("a.bin")

    status, headers, _ = _get(url)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    wrong = make_http_server(tmp_path, username="user", password="other").storage_options
    assert _get(url, wrong["headers"])[0] == 401

    fs = fsspec.filesystem("http", skip_instance_cache=True, **server.storage_options)
    assert fs.cat_file(url, start=2, end=5) == b"234"
    assert [r.status for r in server.log] == [401, 401, 206]


def test_http_redirects(http_server):
    """Redirect rules: status, Location (+ rest of the path and query), method and range filters, ``after``."""
    import http.client

    (http_server.root / "a.nc").write_bytes(b"0123456789")

    def ask(path, method="GET", headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", http_server.port, timeout=30)
        try:
            conn.request(method, path, headers=headers or {})
            response = conn.getresponse()
            response.read()
            return response.status, response.getheader("Location")
        finally:
            conn.close()

    http_server.redirect("/a.nc", "http://127.0.0.1:9/b.nc", status=308)
    assert ask("/a.nc.dds?x[0]") == (308, "http://127.0.0.1:9/b.nc.dds?x[0]")
    http_server.clear_redirects()
    http_server.redirect("/a.nc", "http://elsewhere/a.nc", status=301, only="range", after=1)
    assert ask("/a.nc") == (200, None)  # a whole GET: not matched
    assert ask("/a.nc", headers={"Range": "bytes=0-3"}) == (206, None)  # the first match passes
    assert ask("/a.nc", headers={"Range": "bytes=0-3"}) == (301, "http://elsewhere/a.nc")
    assert ask("/a.nc", method="HEAD") == (200, None)
    http_server.clear_redirects()
    http_server.redirect("/", None, status=302, only="HEAD")
    assert ask("/a.nc", method="HEAD") == (302, None)
    assert ask("/a.nc") == (200, None)
    with pytest.raises(ValueError):
        http_server.redirect("/", "x", only="POST")


# ---------------------------------------------------------------------------
# OPeNDAP (pydap, read with netCDF4's DAP2 client)
# ---------------------------------------------------------------------------


def _write_dap_file(path):
    import netCDF4

    rng = np.random.default_rng(4)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("lat", 30)
        ds.createDimension("lon", 40)
        ds.createDimension("n", 5)
        ds.createDimension("strlen", 12)
        ds.title = 'a "quoted" title'
        ds.precise = 0.1234567890123
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = np.arange(6) + 0.5
        lat = ds.createVariable("lat", "i2", ("lat",))
        lat.scale_factor, lat.add_offset = 0.5, -7.5  # packed coordinate
        lat[:] = np.linspace(-7.5, 7.0, 30)
        tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), fill_value=np.float32(1e20))
        values = np.ma.masked_greater(rng.random((6, 30, 40), dtype="f4"), 0.9)
        tas[:] = values
        tas.scale_factor = 1.000001234567  # precision past %.6g
        pr = ds.createVariable("pr", "i2", ("time", "lat"), fill_value=np.int16(-999))
        pr.scale_factor, pr.add_offset = 0.01, 1.0
        pr[:] = np.ma.masked_less(rng.integers(-50, 1000, (6, 30)).astype("i2"), 0)
        ds.createVariable("scalar", "f8", ()).assignValue(3.25)
        for dt, fill, vals in [
            ("i1", -5, [-128, -5, 0, 1, 127]),
            ("u1", 250, [0, 128, 250, 255, 1]),
            ("u2", 65000, [0, 40000, 65000, 1, 2]),
            ("u4", 4_000_000_000, [0, 3_000_000_000, 4_000_000_000, 1, 2]),
            ("i8", -9, [0, -9, 2**31 - 1, -(2**31), 5]),
        ]:
            v = ds.createVariable(f"v_{dt}", dt, ("n",), fill_value=np.array(fill, dt))
            v[:] = np.array(vals, dtype=dt)
        ds.createVariable("too_big", "i8", ("n",))[:] = [0, 1, 2, 3, 2**40]
        names = ds.createVariable("names", "S1", ("n", "strlen"))
        names[:] = netCDF4.stringtochar(np.array(["a", "", "ccc", "twelve_chars", "e"], dtype="S12"))
        labels = ds.createVariable("labels", str, ("n",))
        labels[:] = np.array(["x", "", "zz", "w", "v"], dtype=object)


@pytest.fixture
def dap_file(opendap_dir):
    directory, base = opendap_dir
    _write_dap_file(directory / "data.nc")
    return directory / "data.nc", f"{base}/data.nc"


def _assert_same(a, b):
    assert np.shape(a) == np.shape(b)
    assert np.asarray(a).dtype == np.asarray(b).dtype, (np.asarray(a).dtype, np.asarray(b).dtype)
    np.testing.assert_array_equal(np.ma.getmaskarray(a), np.ma.getmaskarray(b))
    np.testing.assert_array_equal(np.ma.filled(a, 0), np.ma.filled(b, 0))


SLICES = [
    np.s_[:],
    np.s_[0],
    np.s_[-1],
    np.s_[1:4, 5:25, 3:37],
    np.s_[::2, ::3, 1::7],
    np.s_[5, -3:, :-3],
    np.s_[2, 29, 39],
    np.s_[[0, 3, 5], 4, :],
    np.s_[:, [0, 10, 20], [1, 2]],
    np.s_[..., 7],
]


@pytest.mark.parametrize("key", SLICES, ids=range(len(SLICES)))
def test_opendap_sliced_reads_match(dap_file, key):
    import netCDF4

    local_path, url = dap_file
    with netCDF4.Dataset(local_path) as local, netCDF4.Dataset(url) as remote:
        _assert_same(remote["tas"][key], local["tas"][key])
        pr_key = key[:2] if isinstance(key, tuple) else key
        if pr_key is not Ellipsis and not (isinstance(pr_key, tuple) and Ellipsis in pr_key):
            _assert_same(remote["pr"][pr_key], local["pr"][pr_key])


def test_opendap_whole_file(dap_file):
    import netCDF4

    local_path, url = dap_file
    with netCDF4.Dataset(local_path) as local, netCDF4.Dataset(url) as remote:
        assert remote.title == local.title
        assert remote.precise == local.precise  # full precision, not pydap's %.6g
        assert remote["tas"].scale_factor == local["tas"].scale_factor
        assert remote["time"].units == local["time"].units
        assert remote.dimensions["time"].isunlimited()
        for name in ["time", "lat", "tas", "pr", "scalar", "v_i1", "v_u1", "v_u2", "v_u4"]:
            _assert_same(remote[name][...], local[name][...])
        _assert_same(remote["lat"][3:9], local["lat"][3:9])
        _assert_same(remote["v_u4"][1:4], local["v_u4"][1:4])
        # DAP2 has no 64-bit integers: int64 is served as int32 when it fits...
        np.testing.assert_array_equal(remote["v_i8"][:], local["v_i8"][:])
        assert remote["v_i8"][:].dtype == np.int32
        # ... and not at all (rather than wrong) when it does not
        assert "too_big" not in remote.variables
        # strings: DAP2 Strings, shown by netCDF-C as chars with a maxStrlen64 dimension
        assert list(netCDF4.chartostring(remote["names"][:])) == ["a", "", "ccc", "twelve_chars", "e"]
        assert list(remote["labels"][:]) == ["x", "", "zz", "w", "v"]


def test_opendap_requests_are_subset_on_the_server(opendap_server, dap_file):
    import netCDF4

    _, url = dap_file
    with netCDF4.Dataset(url) as remote:
        remote.set_auto_maskandscale(False)
        opendap_server.reset()
        remote["tas"][2, 3:5, 10:20]
        log = opendap_server.request_log
    assert any(entry.endswith("data.nc.dods?tas[2][3:4][10:19]") for entry in log), log
    assert opendap_server.requests == len(log)
    assert 0 < opendap_server.bytes_sent < 2000

