"""Remote storage: the safe-URI policy, credentials, and secrecy (issue "Remote storage").

Real servers only (daskcfa_testing.servers): SeaweedFS checks SigV4
signatures, so a wrong secret really is refused; the HTTP server counts every
request, so "refused before any request" is observable.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import traceback

import cloudpickle
import dask
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, build
from remote_helpers import DIMS, SIZES, rewrite_uris, truth, upload
from secret_helpers import _start_capture, _stop_capture, _unique_options, _worker_lines, _worker_start_capture
from daskcfa.storage import profiles as storage_profiles

pytestmark = pytest.mark.usefixtures("other_cwd")

VICTIM = (1, 0, 1)  # the fragment whose URI the policy tests replace


@pytest.fixture(autouse=True)
def _no_cloud_metadata(monkeypatch):
    """botocore must never look for credentials on an instance-metadata address."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _s3_dataset(tmp_path, fs, bucket, prefix="ds", dialect="CF-1.13", change=None):
    """Build locally, optionally rewrite URIs (``change(index, uri) -> uri``), upload; returns (built, url)."""
    built = build(dialect, tmp_path / prefix, truth(), DIMS, SIZES)
    if change is not None:
        uri_var = built.names.get("uris") or built.names.get("file")
        by_uri = {v[0]: i for i, v in built.fragment_uris.items()}
        rewrite_uris(built.path, uri_var, lambda u: change(by_uri[u], u))
    base = upload(fs, tmp_path / prefix, bucket, prefix)
    return built, f"{base}/{built.path.name}"


def _s3fs_calls(caplog):
    return [r.getMessage() for r in caplog.records if r.name.startswith("s3fs")]


# ---------------------------------------------------------------------------
# 6. The safe-URI policy
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["file-uri", "absolute-path", "other-bucket", "http-host"])
def test_s3_aggregation_refuses_unsafe_references(tmp_path, s3_server, s3_bucket, s3fs_fs, http_server, caplog,
                                                   kind):
    other = s3_server.new_bucket("other")
    (http_server.root / "f.nc").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    s3fs_fs.pipe(f"{other}/f.nc", b"x")
    unsafe = {
        "file-uri": "file:///etc/passwd",
        "absolute-path": "/etc/passwd",
        "other-bucket": f"s3://{other}/f.nc",
        "http-host": http_server.url_for("f.nc"),
    }[kind]
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket,
                             change=lambda i, u: unsafe if i == VICTIM else u)
    x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)  # lazy: no error yet
    # the other fragments read fine
    assert_matches(x[:2].compute(), built.expected[:2])
    http_server.reset()
    caplog.set_level(logging.DEBUG, logger="s3fs")
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        x.compute()
    err = info.value
    assert err.fragment == VICTIM
    assert daskcfa.storage.resolve(unsafe, url) in str(err)  # the URI, as resolved
    assert err.variable in ("tas", "/tas")
    # refused before any request for it
    assert http_server.requests == 0
    assert not any(other in m for m in _s3fs_calls(caplog))
    assert s3_server.secret not in str(err) and s3_server.secret not in repr(err)


def test_s3_aggregation_relative_path_outside_stays_in_bucket(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """A relative reference can never become a local path: it resolves inside the bucket."""
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket,
                             change=lambda i, u: "../../../../../../etc/passwd" if i == VICTIM else u)
    x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    assert info.value.file == f"s3://{s3_bucket}/etc/passwd"
    assert info.value.fragment == VICTIM


def test_allowed_locations_widen_to_a_second_bucket(tmp_path, s3_server, s3_bucket, s3fs_fs):
    second = s3_server.new_bucket("second")
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    s3fs_fs.put(str(built.fragment_files[VICTIM]), f"{second}/moved/victim.nc")
    rewrite_uris(built.path, built.names["uris"],
                 lambda u: f"s3://{second}/moved/victim.nc" if u == built.fragment_uris[VICTIM][0] else u)
    built.fragment_files[VICTIM].unlink()
    url = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "ds") + "/" + built.path.name
    opts = s3_server.storage_options
    with pytest.raises(daskcfa.UnsafeURIError):
        daskcfa.from_cfa(url, "tas", storage_options=opts).compute()
    x = daskcfa.from_cfa(url, "tas", storage_options=opts, allowed_locations=["default", f"s3://{second}/"])
    assert_matches(x.compute(), built.expected)
    # a prefix of the second bucket that does not hold the fragment does not widen enough
    x = daskcfa.from_cfa(url, "tas", storage_options=opts, allowed_locations=["default", f"s3://{second}/other/"])
    with pytest.raises(daskcfa.UnsafeURIError):
        x.compute()
    # the same through dask config
    with dask.config.set({"daskcfa.storage.allowed-locations": ["default", f"s3://{second}/"]}):
        x = daskcfa.from_cfa(url, "tas", storage_options=opts)
    assert_matches(x.compute(), built.expected)
    # a bucket whose name merely starts like the allowed one is not allowed
    assert not daskcfa.storage.policy.LocationPolicy.for_aggregation(
        url, ["default", f"s3://{second}"]).allows(f"s3://{second}x/victim.nc")


def test_allowed_locations_without_default_confine_to_a_prefix(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket, prefix="ds")
    opts = s3_server.storage_options
    x = daskcfa.from_cfa(url, "tas", storage_options=opts, allowed_locations=[f"s3://{s3_bucket}/ds/fragments/"])
    assert_matches(x.compute(), built.expected)
    x = daskcfa.from_cfa(url, "tas", storage_options=opts, allowed_locations=[f"s3://{s3_bucket}/elsewhere/"])
    with pytest.raises(daskcfa.UnsafeURIError):
        x.compute()


@pytest.fixture
def archive(tmp_path):
    """archive/ holds the aggregation; elsewhere/ a fragment outside it; a symlink inside points out."""
    built = build("CF-1.13", tmp_path / "archive", truth(), DIMS, SIZES)
    victim = built.fragment_files[VICTIM]
    outside = tmp_path / "elsewhere" / "victim.nc"
    outside.parent.mkdir()
    victim.rename(outside)
    return built, victim, outside


@pytest.mark.parametrize("reference", [
    "../elsewhere/victim.nc",
    "%2e%2e/elsewhere/victim.nc",
    "fragments/%2e%2e/%2E%2E/elsewhere/victim.nc",
    "fragments/../../elsewhere/victim.nc",
    "ABSOLUTE",
    "FILE-URI",
    "FILE-URI-ENCODED",
    "SYMLINK",
])
@pytest.mark.parametrize("how", ["argument", "config"])
def test_local_aggregation_confined_to_a_tree(tmp_path, archive, reference, how):
    built, victim, outside = archive
    if reference == "ABSOLUTE":
        reference = str(outside)
    elif reference == "FILE-URI":
        reference = outside.as_uri()
    elif reference == "FILE-URI-ENCODED":
        reference = (tmp_path / "archive").as_uri() + "/%2e%2e/elsewhere/victim.nc"
    elif reference == "SYMLINK":
        victim.symlink_to(outside)
        reference = built.fragment_uris[VICTIM][0]
    original = built.fragment_uris[VICTIM][0]
    rewrite_uris(built.path, built.names["uris"], lambda u: reference if u == original else u)
    # the default policy lets a local aggregation read local files anywhere
    assert_matches(daskcfa.from_cfa(str(built.path), "tas").compute(), built.expected)
    allowed = [str(tmp_path / "archive")]
    if how == "argument":
        x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=allowed)
    else:
        with dask.config.set({"daskcfa.storage.allowed-locations": allowed}):
            x = daskcfa.from_cfa(str(built.path), "tas")
    assert_matches(x[:2].compute(), built.expected[:2])  # inside the tree: fine
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        x.compute()
    assert info.value.fragment == VICTIM
    assert "victim.nc" in str(info.value)


@pytest.mark.parametrize("trick", [
    "public/%2e%2e/private/f.nc",
    "public/%2E%2E/private/f.nc",
    "public/..%2fprivate/f.nc",
    "public/%2e%2e%2fprivate/f.nc",
    "public/.%2e/private/f.nc",
    "public/%252e%252e/private/f.nc",
])
def test_percent_encoded_dots_do_not_escape_an_http_prefix(tmp_path, s3_server, s3_bucket, s3fs_fs,
                                                           make_http_server, trick):
    www = tmp_path / "www"
    (www / "public").mkdir(parents=True)
    (www / "private").mkdir()
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    (www / "private" / "f.nc").write_bytes(built.fragment_files[VICTIM].read_bytes())
    http = make_http_server(www)
    original = built.fragment_uris[VICTIM][0]
    rewrite_uris(built.path, built.names["uris"], lambda u: f"{http.url}/{trick}" if u == original else u)
    url = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "ds") + "/" + built.path.name
    x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options,
                         allowed_locations=["default", f"{http.url}/public/"])
    http.reset()
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        x.compute()
    assert info.value.fragment == VICTIM
    assert http.requests == 0


def test_http_aggregation_is_confined_to_its_host(tmp_path, make_http_server):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    built = build("CF-1.13", tmp_path / "a" / "ds", truth(), DIMS, SIZES)
    other = make_http_server(tmp_path / "b")
    victim = built.fragment_files[VICTIM]
    (tmp_path / "b" / "victim.nc").write_bytes(victim.read_bytes())
    original = built.fragment_uris[VICTIM][0]
    rewrite_uris(built.path, built.names["uris"], lambda u: other.url_for("victim.nc") if u == original else u)
    home = make_http_server(tmp_path / "a")
    x = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas")
    with pytest.raises(daskcfa.UnsafeURIError):
        x.compute()
    assert other.requests == 0
    x = daskcfa.from_cfa(home.url_for("ds/" + built.path.name), "tas", allowed_locations=["default", other.url])
    assert_matches(x.compute(), built.expected)


# ---------------------------------------------------------------------------
# 7. Credentials: failures are daskcfa errors that name the URI, not the secret
# ---------------------------------------------------------------------------
def _assert_clean(err, *secrets):
    text = "".join(traceback.format_exception(err)) + repr(err) + str(err) + repr(err.args)
    for secret in secrets:
        assert secret not in text
    assert type(err).__module__ == "daskcfa.errors"


def test_wrong_secret_for_the_aggregation_file(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    wrong = "Wrong-" + s3_server.secret[::-1]
    options = dict(s3_server.storage_options, secret=wrong)
    with pytest.raises(daskcfa.StorageError) as info:
        daskcfa.from_cfa(url, "tas", storage_options=options)
    err = info.value
    assert not isinstance(err, (daskcfa.NotFoundError, daskcfa.UnsafeURIError))
    assert err.file == url and url in str(err)
    _assert_clean(err, wrong, s3_server.secret)
    with pytest.raises(daskcfa.StorageError) as info:
        daskcfa.open_cfa(url, storage_options=options)
    _assert_clean(info.value, wrong, s3_server.secret)


def test_wrong_secret_for_a_fragment(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """Fragments under one prefix get a (wrong) secret from a named profile."""
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    wrong = "Wrong-" + s3_server.secret[::-1]
    victim = url.rsplit("/", 1)[0] + "/" + built.fragment_uris[VICTIM][0]
    profile = {"match": victim, "secret": wrong}
    with dask.config.set({"daskcfa.storage.profiles.broken": profile}):
        x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
        assert_matches(x[:2].compute(), built.expected[:2])
        with pytest.raises(daskcfa.StorageError) as info:
            x.compute()
    err = info.value
    assert not isinstance(err, daskcfa.NotFoundError)
    assert err.file == victim and err.fragment == VICTIM
    _assert_clean(err, wrong, s3_server.secret)


def test_no_credentials_at_all(tmp_path, s3_server, s3_bucket, s3fs_fs, monkeypatch):
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(daskcfa.StorageError) as info:
        daskcfa.from_cfa(url, "tas", storage_options={"client_kwargs": {"endpoint_url": s3_server.endpoint_url}})
    assert info.value.file == url
    _assert_clean(info.value, s3_server.secret)


def test_missing_bucket_and_object_for_the_aggregation_file(s3_server, s3_bucket):
    opts = s3_server.storage_options
    for url in (f"s3://{s3_bucket}/no/such/file.nc", f"s3://no-such-bucket-{s3_bucket}/file.nc"):
        with pytest.raises(daskcfa.NotFoundError) as info:
            daskcfa.from_cfa(url, "tas", storage_options=opts)
        assert info.value.file == url
        _assert_clean(info.value, s3_server.secret)
        with pytest.raises(daskcfa.NotFoundError):
            daskcfa.open_cfa(url, storage_options=opts)


def test_missing_fragment_object_and_bucket(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    base = url.rsplit("/", 1)[0]
    victim = f"{base}/{built.fragment_uris[VICTIM][0]}"
    s3fs_fs.rm(victim[len("s3://"):])
    x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    assert info.value.file == victim
    assert info.value.fragment == VICTIM
    _assert_clean(info.value, s3_server.secret)
    # a fragment in a bucket that does not exist (allowed, so that the request is made)
    gone = f"s3://gone-{s3_bucket}/f.nc"
    built2, url2 = _s3_dataset(tmp_path, s3fs_fs, s3_bucket, prefix="ds2",
                               change=lambda i, u: gone if i == VICTIM else u)
    x = daskcfa.from_cfa(url2, "tas", storage_options=s3_server.storage_options,
                         allowed_locations=["default", gone])
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    assert info.value.file == gone and info.value.fragment == VICTIM


def test_missing_and_refused_http_fragments(tmp_path, make_http_server):
    (tmp_path / "www").mkdir()
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(), DIMS, SIZES)
    built.fragment_files[VICTIM].unlink()
    http = make_http_server(tmp_path / "www")
    x = daskcfa.from_cfa(http.url_for("ds/" + built.path.name), "tas")
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    assert info.value.fragment == VICTIM and info.value.file.startswith(http.url)
    with pytest.raises(daskcfa.NotFoundError):
        daskcfa.from_cfa(http.url_for("ds/nothing.nc"), "tas")
    # basic auth: without or with a wrong password, "access denied" and not "not found"
    locked = make_http_server(tmp_path / "www", username="reader", password="s3cret-pw-123")
    for options in (None, {"headers": {"Authorization": "Basic d3Jvbmc6d3Jvbmc="}}):
        with pytest.raises(daskcfa.StorageError) as info:
            daskcfa.from_cfa(locked.url_for("ds/" + built.path.name), "tas", storage_options=options)
        assert not isinstance(info.value, daskcfa.NotFoundError)
        assert "denied" in str(info.value)
        _assert_clean(info.value, "s3cret-pw-123", "d3Jvbmc6d3Jvbmc=")
    x = daskcfa.from_cfa(locked.url_for("ds/" + built.path.name), "tas", storage_options=locked.storage_options)
    assert_matches(x[:2].compute(), built.expected[:2])


def test_s3netcdf4_alias_config(tmp_path, s3_server, s3_bucket, s3fs_fs, monkeypatch):
    built, _ = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    config = {
        "version": "9",
        "hosts": {
            "s3://myalias": {
                "alias": "myalias",
                "url": s3_server.endpoint_url,
                "credentials": {"accessKey": s3_server.key, "secretKey": s3_server.secret},
                "backend": "s3aioFileObject",
                "api": "S3v4",
            }
        },
        "resource_allocation": {"memory": "100MB", "filehandles": 20},
    }
    path = tmp_path / "s3nc.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("S3_NC_CONFIG", str(path))
    url = f"s3://myalias/{s3_bucket}/ds/{built.path.name}"
    x = daskcfa.from_cfa(url, "tas")
    graph = dict(x.__dask_graph__())
    assert_matches(x.compute(), built.expected)
    with daskcfa.open_cfa(url) as ds:
        np.testing.assert_array_equal(np.asarray(ds.variables["lat"][...]), np.arange(4) * 1.5 + 10.0)
    for task in graph.values():
        assert s3_server.secret.encode() not in cloudpickle.dumps(task)
    # a wrong secret in the alias file: a StorageError without the secret
    config["hosts"]["s3://myalias"]["credentials"]["secretKey"] = "Alias-wrong-secret-0123456789"
    path.write_text(json.dumps(config))
    os.utime(path, ns=(1, 10**18))  # a new mtime: the configuration is reloaded
    monkeypatch.setattr(daskcfa.storage.s3nc, "_S3NC_RECHECK_SECONDS", 0.0)  # (now, not in 1 s)
    with pytest.raises(daskcfa.StorageError) as info:
        daskcfa.from_cfa(url, "tas")
    _assert_clean(info.value, "Alias-wrong-secret-0123456789", s3_server.secret)


def test_s3netcdf4_alias_confines_to_the_bucket(tmp_path, s3_server, s3_bucket, s3fs_fs, monkeypatch):
    """Behind an alias, the unit an aggregation is confined to is still the bucket."""
    config = {"hosts": {"s3://myalias": {"alias": "myalias", "url": s3_server.endpoint_url,
                                         "credentials": {"accessKey": s3_server.key,
                                                         "secretKey": s3_server.secret}}}}
    path = tmp_path / "s3nc.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("S3_NC_CONFIG", str(path))
    other = s3_server.new_bucket("other")
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    s3fs_fs.put(str(built.fragment_files[VICTIM]), f"{other}/victim.nc")
    previous = built.fragment_uris[VICTIM][0]
    for reference, error in ((f"s3://myalias/{other}/victim.nc", daskcfa.UnsafeURIError),
                             (f"../../{other}/victim.nc", daskcfa.MissingFragmentError)):
        rewrite_uris(built.path, built.names["uris"], lambda u, old=previous, new=reference: new if u == old else u)
        previous = reference
        s3fs_fs.put(str(built.path), f"{s3_bucket}/a/{built.path.name}")
        s3fs_fs.put(str(tmp_path / "ds" / "fragments"), f"{s3_bucket}/a/fragments", recursive=True)
        x = daskcfa.from_cfa(f"s3://myalias/{s3_bucket}/a/{built.path.name}", "tas")
        assert_matches(x[:2].compute(), built.expected[:2])
        with pytest.raises(error) as info:
            x.compute()
        assert info.value.fragment == VICTIM
        if error is daskcfa.MissingFragmentError:
            assert info.value.file == f"s3://myalias/{s3_bucket}/{other}/victim.nc"
    # widened explicitly, the other bucket behind the alias is read
    rewrite_uris(built.path, built.names["uris"],
                 lambda u: f"s3://myalias/{other}/victim.nc" if u == previous else u)
    s3fs_fs.put(str(built.path), f"{s3_bucket}/a/{built.path.name}")
    x = daskcfa.from_cfa(f"s3://myalias/{s3_bucket}/a/{built.path.name}", "tas",
                         allowed_locations=["default", f"s3://myalias/{other}/"])
    assert_matches(x.compute(), built.expected)


def test_dask_config_options_and_named_profiles(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    good = s3_server.storage_options
    with dask.config.set({"daskcfa.storage.options.s3": good}):
        x = daskcfa.from_cfa(url, "tas")
        assert_matches(x.compute(), built.expected)
    wrong = dict(good, secret="Wrong-profile-secret-0123456789")
    profiles = {
        # the longest matching prefix wins: the whole bucket is refused ...
        "everything": dict(wrong, match=[f"s3://{s3_bucket}/"]),
        # ... except under ds/, where the right credentials apply
        "ds": dict(good, match=[f"s3://nonexistent-bucket/", f"s3://{s3_bucket}/ds/"]),
    }
    with dask.config.set({"daskcfa.storage.profiles": profiles}):
        x = daskcfa.from_cfa(url, "tas")
        assert_matches(x.compute(), built.expected)
    with dask.config.set({"daskcfa.storage.profiles": {"everything": profiles["everything"]}}):
        with pytest.raises(daskcfa.StorageError) as info:
            daskcfa.from_cfa(url, "tas")
    _assert_clean(info.value, "Wrong-profile-secret-0123456789", s3_server.secret)
    # a profile for another prefix does not apply
    with dask.config.set({"daskcfa.storage.profiles": {"other": dict(good, match=f"s3://x{s3_bucket}/")}}):
        with pytest.raises(daskcfa.StorageError):
            daskcfa.from_cfa(url, "tas")


# ---------------------------------------------------------------------------
# 7. Secrets never leak: graph, reprs, errors, logs, distributed workers
# ---------------------------------------------------------------------------


def _graph_pickles(x):
    out = []
    for key, task in dict(x.__dask_graph__()).items():
        out.append(pickle.dumps(key))
        out.append(cloudpickle.dumps(task))
    return b"".join(out)


def test_secret_absent_from_graph_reprs_and_errors(tmp_path, s3_server, s3_bucket, s3fs_fs):
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    options = _unique_options(s3_server)
    secret = s3_server.secret
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    y = (x[1:5] * 2).sum(axis=0)
    for arr in (x, y):
        blob = _graph_pickles(arr)
        assert secret.encode() not in blob and secret not in repr(dict(arr.__dask_graph__()))
        assert secret not in repr(arr) and secret not in str(arr.name)
        assert secret not in arr._repr_html_()
    assert secret.encode() not in cloudpickle.dumps(x)
    ds = daskcfa.open_cfa(url, storage_options=options)
    assert secret not in repr(ds)
    for name in ("tas", "lat"):
        assert secret.encode() not in _graph_pickles(ds.variables[name].data)
    # never in dask config (copied to workers, dumped with the cluster state)
    assert secret not in repr(dask.config.config)
    # errors raised at compute time
    s3fs_fs.rm(f"{s3_bucket}/ds/{built.fragment_uris[VICTIM][0]}")
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    _assert_clean(info.value, secret)
    assert secret.encode() not in pickle.dumps(info.value)


def test_http_basic_auth_secret_absent_from_graph_and_errors(tmp_path, make_http_server):
    (tmp_path / "www").mkdir()
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(), DIMS, SIZES)
    http = make_http_server(tmp_path / "www", username="reader", password="http-pw-never-shown")
    token = http.storage_options["headers"]["Authorization"].split()[1]
    x = daskcfa.from_cfa(http.url_for("ds/" + built.path.name), "tas", storage_options=http.storage_options)
    blob = _graph_pickles(x)
    assert token.encode() not in blob and b"http-pw-never-shown" not in blob
    assert_matches(x.compute(), built.expected)
    built.fragment_files[VICTIM].unlink()
    with pytest.raises(daskcfa.MissingFragmentError) as info:
        x.compute()
    _assert_clean(info.value, token, "http-pw-never-shown")


def _worker_knows(name, dask_worker=None):
    from daskcfa.storage import profiles

    return {"plugin": name in profiles._REGISTRY,
            "config": dask.config.get(f"daskcfa.storage.registered.{name}", None) is not None}


def _check_distributed_run(client, x, built, secret, client_lines):
    got = x.compute()
    assert_matches(got, built.expected)
    assert_matches(x[2:5, 1].compute(), built.expected[2:5, 1])
    worker_lines = [line for lines in client.run(_worker_lines).values() for line in lines]
    logs = [msg for records in client.get_worker_logs().values() for _, msg in records]
    logs += [msg for records in client.get_worker_logs(nanny=True).values() for _, msg in records]
    logs += [msg for _, msg in client.get_scheduler_logs()]
    everything = "\n".join(worker_lines + logs + client_lines)
    assert len(worker_lines) > 10, "DEBUG logging was not captured in the workers"
    assert any("s3fs" in line or "botocore" in line for line in worker_lines), "no storage I/O logged by workers"
    assert secret not in everything


@pytest.fixture
def debug_logs():
    handler, saved = _start_capture()
    yield handler.lines
    _stop_capture(handler, saved)


def _cluster():
    from distributed import LocalCluster

    return LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                        silence_logs=logging.DEBUG, host="127.0.0.1")


def test_distributed_client_created_before_from_cfa(tmp_path, s3_server, s3_bucket, s3fs_fs, debug_logs):
    from distributed import Client

    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    options = _unique_options(s3_server)
    secret = s3_server.secret
    with _cluster() as cluster, Client(cluster) as client:
        client.run(_worker_start_capture)
        x = daskcfa.from_cfa(url, "tas", storage_options=options)  # registers the worker plugin
        name = next(iter(_profile_names(x)))
        _check_distributed_run(client, x, built, secret, debug_logs)
        # the plugin message really went through the (DEBUG-logged) comms
        worker_lines = [line for lines in client.run(_worker_lines).values() for line in lines]
        assert any("plugin" in line for line in debug_logs + worker_lines)
        known = client.run(_worker_knows, name)
        assert all(k["plugin"] and not k["config"] for k in known.values()), known
        # an error raised in a worker comes back clean
        s3fs_fs.rm(f"{s3_bucket}/ds/{built.fragment_uris[VICTIM][0]}")
        with pytest.raises(daskcfa.MissingFragmentError) as info:
            x.compute()
        assert info.value.fragment == VICTIM
        _assert_clean(info.value, secret)
    assert secret not in "\n".join(debug_logs)


def test_distributed_cluster_created_after_from_cfa(tmp_path, s3_server, s3_bucket, s3fs_fs, debug_logs):
    """The options never travel through dask config: a cluster created after from_cfa() gets them
    from the plugin its client registers as it starts (distributed's client preload, which dask
    config names, and nothing more). With that preload taken out of dask config, the cluster does
    not know them (a clear error saying what to do) until they are shared by hand."""
    from distributed import Client

    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    options = _unique_options(s3_server)
    secret = s3_server.secret
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    name = next(iter(_profile_names(x)))
    with _cluster() as cluster, Client(cluster) as client:
        known = client.run(_worker_knows, name)
        assert all(k["plugin"] and not k["config"] for k in known.values()), known
        client.run(_worker_start_capture)
        _check_distributed_run(client, x, built, secret, debug_logs)
    with dask.config.set({"distributed.client.preload": []}), _cluster() as cluster, Client(cluster) as client:
        known = client.run(_worker_knows, name)
        assert not any(k["config"] or k["plugin"] for k in known.values()), known
        with pytest.raises(daskcfa.StorageError, match="StorageProfiles.from_options") as info:
            x.compute()
        _assert_clean(info.value, secret)
        client.register_plugin(daskcfa.StorageProfiles.from_options(options))
        client.run(_worker_start_capture)
        _check_distributed_run(client, x, built, secret, debug_logs)
    assert secret not in "\n".join(debug_logs)


def test_distributed_client_connected_after_an_earlier_registration(tmp_path, s3_server, s3_bucket, s3fs_fs):
    """Workers started before the options were first registered, client connected after:
    a second from_cfa with the same options must still share them with that cluster."""
    from distributed import Client

    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    options = _unique_options(s3_server)
    with _cluster() as cluster:
        daskcfa.from_cfa(url, "tas", storage_options=options)  # no client yet: this process only
        with Client(cluster) as client:
            x = daskcfa.from_cfa(url, "tas", storage_options=options)
            name = next(iter(_profile_names(x)))
            assert all(k["plugin"] for k in client.run(_worker_knows, name).values())
            assert_matches(x.compute(), built.expected)


def _profile_names(x):
    names = set()
    for task in dict(x.__dask_graph__()).values():
        blob = cloudpickle.dumps(task)
        for name in list(storage_profiles._REGISTRY):
            if name.encode() in blob:
                names.add(name)
    assert names, "the graph refers to no registered profile"
    return names


def test_worker_plugin_payload_does_not_show_the_options():
    """The plugin daskcfa registers carries the options encoded, never in clear
    (distributed logs whole messages at DEBUG level)."""
    from daskcfa.plugins import StorageProfiles

    options = {"s3": {"key": "AKIDEXAMPLE", "secret": "plugin-secret-0123456789"}}
    plugin = StorageProfiles(storage_profiles.encoded({"p-test-encoded": options}))
    blob = cloudpickle.dumps(plugin) + pickle.dumps(plugin)
    assert b"plugin-secret-0123456789" not in blob
    assert "plugin-secret-0123456789" not in repr(plugin)
    cloudpickle.loads(blob[: len(cloudpickle.dumps(plugin))]).setup(worker=None)
    assert storage_profiles._REGISTRY["p-test-encoded"] == options


def test_from_options_plugin_payload_does_not_show_the_options():
    from daskcfa.plugins import StorageProfiles

    plugin = StorageProfiles.from_options({"key": "AKIDEXAMPLE", "secret": "from-options-secret-0123456789"})
    assert b"from-options-secret-0123456789" not in cloudpickle.dumps(plugin)


def test_s3netcdf4_alias_fragments_read_through_the_real_url(tmp_path, s3_server, s3_bucket, s3fs_fs, monkeypatch):
    """An archive written through an alias (fragment URIs ``s3://tenancy-0/<bucket>/...``) opened by
    its real URL: the alias names the same endpoint and bucket, so the same location. An alias
    reaching another endpoint, or another bucket, is still another location."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on: an endpoint elsewhere
        sock.bind(("127.0.0.1", 0))
        elsewhere = f"http://127.0.0.1:{sock.getsockname()[1]}"
    hosts = {f"s3://{alias}": {"alias": alias, "url": url,
                               "credentials": {"accessKey": s3_server.key, "secretKey": s3_server.secret}}
             for alias, url in (("tenancy-0", s3_server.endpoint_url.upper().rstrip("/") + "/"),
                                ("elsewhere", elsewhere))}
    path = tmp_path / "s3nc.json"
    path.write_text(json.dumps({"hosts": hosts}))
    monkeypatch.setenv("S3_NC_CONFIG", str(path))
    other = s3_server.new_bucket("other")
    for reference, error in ((None, None), (f"s3://tenancy-0/{other}/victim.nc", daskcfa.UnsafeURIError),
                             ("s3://elsewhere/{bucket}/ds/{u}", daskcfa.UnsafeURIError)):
        def change(index, uri, reference=reference):
            if reference is None or index != VICTIM:
                return f"s3://tenancy-0/{s3_bucket}/ds/{uri}"
            return reference.format(bucket=s3_bucket, u=uri)

        built, url = _s3_dataset(tmp_path / str(error), s3fs_fs, s3_bucket, change=change)
        s3fs_fs.put(str(built.fragment_files[VICTIM]), f"{other}/victim.nc")
        x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
        if error is None:
            assert_matches(x.compute(), built.expected)
            continue
        assert_matches(x[:2].compute(), built.expected[:2])
        with pytest.raises(error) as info:
            x.compute()
        assert info.value.fragment == VICTIM


def test_credentials_of_an_earlier_environment_are_not_kept(tmp_path, s3_server, s3_bucket, s3fs_fs, monkeypatch):
    """A read with credentials from the environment, then one with none (the environment emptied, other
    options): the second is refused, not signed with what the first resolved (a botocore session kept for
    the process resolved credentials once)."""
    built, url = _s3_dataset(tmp_path, s3fs_fs, s3_bucket)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    endpoint = {"client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    first = daskcfa.from_cfa(url, "tas", storage_options={**endpoint, "config_kwargs": {"read_timeout": 71.5}})
    np.testing.assert_array_equal(np.ma.filled(first.compute(), 0), np.ma.filled(truth(), 0))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(daskcfa.StorageError) as info:
        daskcfa.from_cfa(url, "tas", storage_options={**endpoint, "config_kwargs": {"read_timeout": 72.5}})
    _assert_clean(info.value, s3_server.secret)
