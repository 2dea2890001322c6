"""HTTP redirects and fragment sizing: bytes come only from where the safe-URI policy allows.

An HTTP aggregation names its fragments on its own host, which the policy
allows; the host then answers a fragment with a redirect (301, 302, 303, 307,
308) to another origin, where a valid fragment of other values waits. A
followed redirect would not fail: it would return those values as data. Every
case asserts the refusal (a daskcfa error naming the fragment's URI, the
variable and the fragment), that the other origin received no request at all
(every hop is checked before it is sent), and that the planted values never
come back. Redirects the policy allows (same origin) are still followed.

Also here: ``describe(storage_size=True)`` sizes fragment files under the
same policy as reading (a hostile aggregation on S3 or HTTP must not make it
stat local files or ask other origins).
"""

from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, build, make_truth, write_fragment_file
from daskcfa import storage
from daskcfa.storage.policy import LocationPolicy
from remote_helpers import rewrite_uris, upload, write_cf113, write_chunked_fragment

from .conftest import DIMS, SIZES, VICTIM, forget_open_files, truth

PLANTED = 12345.0
STATUSES = [301, 302, 303, 307, 308]
#: dask config and redirect rule that send a read through each way of reading a remote fragment
READ_PATHS = {
    "whole-object": ({}, "whole"),  # one GET of a small object
    # (fsspec asks the size with a GET when a HEAD fails: both redirect)
    "stat": ({"daskcfa.io.small-object": 0, "daskcfa.io.whole-fragment-fraction": 2.0}, None),
    "byte-ranges": ({"daskcfa.io.small-object": 0, "daskcfa.io.whole-fragment-fraction": 2.0}, "GET"),
}


def _plant(path: Path, shape=(3, 4, 3)) -> Path:
    """A valid fragment holding PLANTED everywhere (what a followed redirect would read)."""
    return write_fragment_file(path, "tas", DIMS, np.full(shape, PLANTED, "f4"), {"units": "K"})


@pytest.fixture
def origins(tmp_path, make_http_server):
    """An HTTP aggregation on ``home``; ``other`` (another origin) holds a planted
    fragment at the victim's path."""
    built = build("CF-1.13", tmp_path / "home" / "ds", truth(), DIMS, SIZES)
    victim = "/" + built.fragment_files[VICTIM].relative_to(tmp_path / "home").as_posix()
    _plant(tmp_path / "other" / victim.lstrip("/"))
    home = make_http_server(tmp_path / "home")
    other = make_http_server(tmp_path / "other")
    return built, home, other, victim


def _refused(err: BaseException, home, victim: str) -> None:
    """An UnsafeURIError about a redirect naming the redirected fragment, variable and index."""
    assert isinstance(err, daskcfa.UnsafeURIError), f"{type(err).__name__}: {err}"
    assert "redirect" in err.reason, err
    assert err.file == home.url + victim, err
    assert err.variable is not None and err.variable.lstrip("/") == "tas", err
    assert err.fragment == VICTIM, err


def _read(x, **config):
    with dask.config.set(config):
        return x.compute(scheduler="sync")


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("path", sorted(READ_PATHS))
def test_off_origin_redirect_is_refused(origins, status, path):
    built, home, other, victim = origins
    config, only = READ_PATHS[path]
    home.redirect(victim, other.url + victim, status=status, only=only)
    x = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas")
    with pytest.raises(daskcfa.CFAError) as info:
        _read(x[:, 1:3, 1:4] if path != "whole-object" else x, **config)
    _refused(info.value, home, victim)
    assert other.requests == 0, f"{other.requests} request(s) reached the other origin"
    assert any(r.path == victim and r.status == status for r in home.log), "the redirect was not exercised"


def test_refusal_is_not_filled_as_missing(origins):
    built, home, other, victim = origins
    home.redirect(victim, other.url + victim, status=302)
    x = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas", missing="fill")
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        _read(x)
    _refused(info.value, home, victim)
    assert other.requests == 0


@pytest.mark.parametrize("operation", ["exists", "stat", "read_whole", "read_ranges"])
def test_every_storage_read_checks_every_hop(origins, operation):
    """The storage functions the readers use, each given the aggregation's policy."""
    built, home, other, victim = origins
    url = home.url + victim
    policy = LocationPolicy.for_aggregation(home.url_for("ds/" + built.path.name))
    calls = {"exists": lambda: storage.exists(url, policy=policy),
             "stat": lambda: storage.stat(url, policy=policy),
             "read_whole": lambda: storage.read_whole(url, policy=policy),
             "read_ranges": lambda: storage.read_ranges(url, [(0, 8), (100, 8)], policy=policy)}
    for status in STATUSES:
        home.clear_redirects()
        home.redirect(victim, other.url + victim, status=status)
        with pytest.raises(daskcfa.UnsafeURIError, match="redirect") as info:
            calls[operation]()
        assert info.value.file == url
    assert other.requests == 0
    home.clear_redirects()
    calls[operation]()  # without the redirect, the same call works


def test_redirect_while_h5py_reads_metadata(tmp_path, make_http_server):
    """Byte ranges redirected only after the first block: h5py meets the refusal
    while it reads metadata through the remote file object. It must come out as
    a daskcfa error (or the fragment read whole from its allowed place), never
    as a bare exception, and never as a request to the other origin."""
    data = make_truth((64, 32, 32), seed=8).filled(0).astype("f4")
    write_chunked_fragment(tmp_path / "home" / "big" / "f0.nc", "tas", DIMS, data, chunks=(4, 32, 32))
    write_cf113(tmp_path / "home" / "agg.nc", "tas", DIMS, ((64,), (32,), (32,)), [["big/f0.nc"]])
    _plant(tmp_path / "other" / "big" / "f0.nc", shape=(64, 32, 32))
    home = make_http_server(tmp_path / "home")
    other = make_http_server(tmp_path / "other")
    home.redirect("/big/f0.nc", other.url + "/big/f0.nc", status=307, only="range", after=1)
    x = daskcfa.from_cfa(home.url_for("agg.nc"), "tas")
    config = {"daskcfa.io.small-object": 0, "daskcfa.io.whole-fragment-fraction": 2.0,
              "daskcfa.storage.block-size": 1024}
    try:
        got = _read(x[3, 5, :7], **config)
    except daskcfa.UnsafeURIError as exc:
        assert exc.fragment == (0, 0, 0) and "redirect" in exc.reason
    else:
        np.testing.assert_array_equal(got, data[3, 5, :7])
    assert sum(r.status == 307 for r in home.log) >= 1, "the redirect was not exercised"
    assert other.requests == 0


WALK = 12


def test_read_ahead_refuses_off_origin_redirect(tmp_path, make_http_server):
    """A fetch started ahead of the reads checks every hop too (it would otherwise
    send the request to the other origin and hand its bytes to the read)."""
    from daskcfa.fragments import readahead

    t = make_truth((WALK, 6, 5), seed=4, masked=0.1)
    built = build("CF-1.13", tmp_path / "home" / "ds", t, DIMS, ((1,) * WALK, (6,), (5,)))
    victim_index = (WALK // 2, 0, 0)
    victim = "/" + built.fragment_files[victim_index].relative_to(tmp_path / "home").as_posix()
    _plant(tmp_path / "other" / victim.lstrip("/"), shape=(1, 6, 5))
    home = make_http_server(tmp_path / "home")
    other = make_http_server(tmp_path / "other")
    home.redirect(victim, other.url + victim, status=307)
    x = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas")
    before = readahead.stats()
    with pytest.raises(daskcfa.UnsafeURIError, match="redirect") as info:
        _read(x[:, 2, 3], **{"daskcfa.io.readahead": 4})
    assert info.value.fragment == victim_index
    assert readahead.stats()["started"] > before["started"]
    assert sum(r.path == victim for r in home.log) >= 2, "the victim was not fetched ahead as well as read"
    assert other.requests == 0


@pytest.mark.parametrize("status", STATUSES)
def test_same_origin_redirect_is_followed(origins, status):
    built, home, other, victim = origins
    moved = home.root / "moved" / Path(victim).name
    moved.parent.mkdir()
    moved.write_bytes(built.fragment_files[VICTIM].read_bytes())
    home.redirect(victim, f"{home.url}/moved/{moved.name}", status=status)
    x = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas")
    assert_matches(_read(x), built.expected)
    assert any(r.path == f"/moved/{moved.name}" for r in home.log)
    # ... unless the user confined the aggregation to a prefix the redirect leaves
    forget_open_files()
    confined = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas", allowed_locations=[home.url + "/ds/"])
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        _read(confined)
    _refused(info.value, home, victim)


def test_redirect_without_location(origins):
    """aiohttp hands a 3xx without ``Location`` back as the answer: its body must not become the fragment."""
    built, home, other, victim = origins
    home.redirect(victim, None, status=302)
    x = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas")
    with pytest.raises(daskcfa.StorageError, match="redirect without a location") as info:
        _read(x)
    assert info.value.fragment == VICTIM and info.value.file == home.url + victim


def test_redirected_aggregation_file(tmp_path, origins, make_http_server):
    """The aggregation file's own URL was the user's choice: its redirect is
    followed, and its fragments stay confined to the origin the user named."""
    built, home, other, victim = origins
    (tmp_path / "gate").mkdir()
    gate = make_http_server(tmp_path / "gate")
    gate.redirect("/", home.url + "/ds/", status=302)
    x = daskcfa.from_cfa(f"{gate.url}/{built.path.name}", "tas")  # followed
    assert x.shape == built.expected.shape
    with pytest.raises(daskcfa.UnsafeURIError, match="redirect"):
        _read(x)  # each fragment, named on the gate's origin, redirects to home's: refused
    assert other.requests == 0
    widened = daskcfa.from_cfa(f"{gate.url}/{built.path.name}", "tas", allowed_locations=["default", home.url + "/"])
    assert_matches(_read(widened), built.expected)


def test_opendap_fragment_behind_redirect(tmp_path, make_http_server, opendap_dir, opendap_server):
    """netCDF-C's DAP client follows redirects itself: the endpoint is probed first."""
    directory, base_url = opendap_dir
    _plant(directory / "planted.nc")
    built = build("CF-1.13", tmp_path / "home" / "ds", truth(), DIMS, SIZES)
    home = make_http_server(tmp_path / "home")
    host = home.url.split("://", 1)[1]
    original = built.fragment_uris[VICTIM][0]
    rewrite_uris(built.path, built.names["uris"], lambda u: f"dap2://{host}/dap/victim.nc" if u == original else u)
    home.redirect("/dap/victim.nc", f"{base_url}/planted.nc", status=302)
    opendap_server.reset()
    x = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas")
    with pytest.raises(daskcfa.UnsafeURIError, match="redirect") as info:
        _read(x)
    assert info.value.fragment == VICTIM and info.value.file == f"dap2://{host}/dap/victim.nc"
    assert opendap_server.requests == 0
    assert any(r.path == "/dap/victim.nc.dds" for r in home.log)
    # the same endpoint without the redirect, allowed explicitly, reads the planted file through netCDF-C
    direct = f"{base_url}/planted.nc".replace("http://", "dap2://")
    rewrite_uris(built.path, built.names["uris"], lambda u: direct if u.startswith("dap2://") else u)
    y = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas", allowed_locations=["default", direct])
    got = _read(y)
    assert np.all(got[2:5, :, 2:5] == PLANTED)


# ---------------------------------------------------------------------------
# describe(storage_size=True): the same policy as reading
# ---------------------------------------------------------------------------
def _hostile(built, reference: str) -> None:
    """Name ``reference`` in place of the victim fragment (again and again)."""
    current = built.fragment_uris[VICTIM][0]
    rewrite_uris(built.path, built.names["uris"], lambda u: reference if u == current else u)
    built.fragment_uris[VICTIM][0] = reference


def test_sizing_an_s3_aggregation_obeys_the_policy(tmp_path, s3_server, s3_bucket, s3fs_fs, http_server):
    secret = _plant(tmp_path / "secret.nc")
    _plant(http_server.root / "planted.nc")
    cases = {"local-file": str(secret), "file-uri": f"file://{secret}", "http": f"{http_server.url}/planted.nc",
             "other-bucket": f"s3://{s3_bucket}x/planted.nc"}
    for case, reference in cases.items():
        built = build("CF-1.13", tmp_path / case, truth(), DIMS, SIZES)
        _hostile(built, reference)
        url = upload(s3fs_fs, tmp_path / case, s3_bucket, case) + "/" + built.path.name
        http_server.reset()
        with pytest.raises(daskcfa.UnsafeURIError) as info:
            daskcfa.describe(url, storage_options=s3_server.storage_options, storage_size=True)
        assert info.value.fragment == VICTIM and info.value.variable.lstrip("/") == "tas", case
        assert http_server.requests == 0, case
        # the summary without sizes is harmless: it opens nothing
        assert daskcfa.describe(url, storage_options=s3_server.storage_options).nfragments == 6
    widened = daskcfa.describe(url, storage_options=s3_server.storage_options, storage_size=True,
                               allowed_locations=["default", f"s3://{s3_bucket}x/"])
    assert widened.missing_files == (f"s3://{s3_bucket}x/planted.nc",)


def test_sizing_an_http_aggregation_obeys_the_policy(tmp_path, origins):
    built, home, other, victim = origins
    url = home.url_for("ds/" + built.path.name)
    home.redirect(victim, other.url + victim, status=301)  # a redirect off the origin
    with pytest.raises(daskcfa.UnsafeURIError, match="redirect") as info:
        daskcfa.describe(url, storage_size=True)
    _refused(info.value, home, victim)
    home.clear_redirects()
    _hostile(built, "/etc/shadow")  # a local file named by a remote aggregation
    with pytest.raises(daskcfa.UnsafeURIError, match="/etc/shadow") as info:
        daskcfa.describe(url, storage_size=True)
    assert info.value.fragment == VICTIM
    _hostile(built, f"{other.url}{victim}")  # another origin
    with pytest.raises(daskcfa.UnsafeURIError):
        daskcfa.describe(url, storage_size=True)
    assert other.requests == 0
    summary = daskcfa.describe(url, storage_size=True, allowed_locations=["default", other.url + "/"])
    sizes = sum(p.stat().st_size for p in built.fragment_files.values() if p != built.fragment_files[VICTIM])
    assert summary.stored_bytes == sizes + (other.root / victim.lstrip("/")).stat().st_size
    assert other.requests >= 1
