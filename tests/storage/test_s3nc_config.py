"""S3netCDF4's configuration file (``~/.s3nc.json`` / ``$S3_NC_CONFIG``) as daskcfa reads it.

A leftover template, a malformed file or keys daskcfa does not use must never
break reads that use no alias: one warning says what is ignored, and only a
URI naming an unusable alias fails (a StorageError naming it, no secret).
"""

from __future__ import annotations

import json
import os
import warnings

import dask
import pytest

import daskcfa
from daskcfa import storage
from daskcfa.storage import objects
from builders import assert_matches, build
from daskcfa.fragments.manager import Budget, manager
from daskcfa.storage import s3nc
from daskcfa.storage.s3nc import s3nc_config
from remote_helpers import DIMS, SIZES, truth, upload

#: S3netCDF4's config/.s3nc.json.template as its install step copies it (a jinja2 template, not JSON).
TEMPLATE = """{
    "version": "9",
    "hosts": {
        "{{ hostname0 }}": {
            "alias": "{{ host0_alias }}",
            "url": "{{ host0_url }}",
            "credentials": {"accessKey": "{{ host0_access_key }}", "secretKey": "{{ host0_secret_key }}"},
            "backend": "s3aioFileObject",
            "api": "S3v4"
        }
    },
    "cache_location" : "{{ cache_location }}",
    "resource_allocation" : {
        "memory": "{{ memory_allocation_limit }}",
        "filehandles": {{ filehandle_allocation_limit }}
    }
}
"""


@pytest.fixture
def s3nc_file(tmp_path, monkeypatch):
    """Where the configuration goes; it is looked at again on every use while the test runs."""
    path = tmp_path / "s3nc.json"
    monkeypatch.setenv("S3_NC_CONFIG", str(path))
    monkeypatch.setattr(s3nc, "_S3NC_RECHECK_SECONDS", 0.0)
    yield path
    manager().configure(None)  # (the config's budgets again: a later test's dask.config.set applies)


def _host(s3_server, alias="tenancy-0", url=None):
    return {f"s3://{alias}": {"alias": alias, "url": url or s3_server.endpoint_url,
                              "credentials": {"accessKey": s3_server.key, "secretKey": s3_server.secret},
                              "backend": "s3FileObject", "api": "S3v4"}}


def _read_locally(tmp_path):
    """A local aggregation read the way a fresh process would (the budget taken from the config)."""
    built = build("CF-1.13", tmp_path / "local", truth(), DIMS, SIZES)
    manager().configure(Budget.from_config())
    assert_matches(daskcfa.from_cfa(str(built.path), "tas").compute(), built.expected)


def _config_warnings(record) -> list[str]:
    return [str(w.message) for w in record
            if issubclass(w.category, daskcfa.CFAWarning) and "S3netCDF4 configuration" in str(w.message)]


def test_leftover_template_breaks_no_read(tmp_path, s3nc_file, s3_server, s3_bucket, s3fs_fs):
    s3nc_file.write_text(TEMPLATE)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _read_locally(tmp_path)
        built = build("CFA-0.4", tmp_path / "s3", truth(), DIMS, SIZES)
        base = upload(s3fs_fs, tmp_path / "s3", s3_bucket, "plain")
        x = daskcfa.from_cfa(f"{base}/{built.path.name}", "tas", storage_options=s3_server.storage_options)
        assert_matches(x.compute(), built.expected)
    found = _config_warnings(record)
    assert len(found) == 1, found  # one warning for the file, however often it is consulted
    assert str(s3nc_file) in found[0] and "cannot be read" in found[0]
    assert manager().budget == Budget.parse(filehandles=8, memory="512MiB")  # the defaults


def test_unhonoured_keys_are_named_and_aliases_still_work(tmp_path, s3nc_file, s3_server, s3_bucket, s3fs_fs):
    config = {"version": "9", "hosts": _host(s3_server), "cache_location": "/tmp/cache",
              "backends": {"s3FileObject": {"maximum_part_size": "50MB", "turbo": True}, "s3aioFileObject": 3},
              "resource_allocation": {"memory": "1EB", "filehandles": 11, "file_handles": 20, "disk_handles": 3}}
    s3nc_file.write_text(json.dumps(config))
    built = build("CFA-0.5", tmp_path / "ds", truth(), DIMS, SIZES)
    upload(s3fs_fs, tmp_path / "ds", s3_bucket, "alias")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        x = daskcfa.from_cfa(f"s3://tenancy-0/{s3_bucket}/alias/{built.path.name}", "tas")
        manager().configure(Budget.from_config())
        assert_matches(x.compute(), built.expected)
    found = _config_warnings(record)
    assert len(found) == 1, found
    for key in ("backends.s3FileObject.turbo", "backends.s3aioFileObject", "resource_allocation.file_handles",
                "resource_allocation.disk_handles"):
        assert key in found[0]
    for key in ("cache_location", "maximum_part_size", "backend'", "backend,"):  # honoured: not named
        assert key not in found[0]
    assert s3_server.secret not in found[0]
    assert manager().budget == Budget(11, 10**18)  # "1EB" honoured, not a compute-time failure


@pytest.mark.parametrize("content", ['{"hosts": [1, 2]}', "[]", '{"hosts": {"s3://a": 3}}', "\x00\xff",
                                     '{"resource_allocation": {"memory": "lots", "filehandles": -1}}'])
def test_malformed_file_gives_one_warning(tmp_path, s3nc_file, content):
    s3nc_file.write_bytes(content.encode("latin-1"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _read_locally(tmp_path)
        s3nc_config()
    assert len(_config_warnings(record)) == 1


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_configuration_that_never_ends_is_not_read(tmp_path, s3nc_file, kind):
    """A FIFO, /dev/zero or a huge file as the configuration: one warning, no hang, no memory blow-up."""
    if kind == "fifo":
        os.mkfifo(s3nc_file)  # nobody writes to it: opening it for reading would block forever
    elif kind == "device":
        s3nc_file.symlink_to("/dev/zero")
    else:
        s3nc_file.write_text('{"hosts": {}, "pad": "' + "x" * (2 << 20) + '"}')
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _read_locally(tmp_path)
    found = _config_warnings(record)
    assert len(found) == 1 and ("not a regular file" in found[0] or "larger than" in found[0])


def test_an_unusable_alias_fails_only_when_used(tmp_path, s3nc_file, s3_server, s3_bucket, s3fs_fs):
    hosts = {**_host(s3_server), **_host(s3_server, "broken", url="{{ host1_url }}")}
    hosts["s3://broken"]["credentials"]["secretKey"] = "Broken-secret-0123456789"
    s3nc_file.write_text(json.dumps({"hosts": hosts}))
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    upload(s3fs_fs, tmp_path / "ds", s3_bucket, "ds")
    with pytest.warns(daskcfa.CFAWarning, match="host 's3://broken'"):
        x = daskcfa.from_cfa(f"s3://tenancy-0/{s3_bucket}/ds/{built.path.name}", "tas")
    assert_matches(x.compute(), built.expected)
    with pytest.raises(daskcfa.StorageError, match="alias 'broken' cannot be used") as info:
        daskcfa.from_cfa(f"s3://broken/{s3_bucket}/ds/{built.path.name}", "tas")
    assert "Broken-secret" not in str(info.value) and s3_server.secret not in str(info.value)


# ---------------------------------------------------------------------------
# Keys with a daskcfa meaning: transfer settings of the host's backend, cache_location
# ---------------------------------------------------------------------------
def _transfer_config(s3_server, backend_settings, backend="s3FileObject"):
    host = _host(s3_server)
    host["s3://tenancy-0"]["backend"] = backend
    return {"version": "9", "hosts": host, "backends": {backend: backend_settings}}


def test_transfer_settings_reach_the_hosts_filesystem(s3nc_file, s3_server, s3_bucket):
    settings = {"maximum_part_size": "6MB", "maximum_parts": 3, "enable_multipart_upload": True,
                "enable_multipart_download": True, "connect_timeout": 7, "read_timeout": 11.5}
    s3nc_file.write_text(json.dumps(_transfer_config(s3_server, settings)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", daskcfa.CFAWarning)  # every key honoured: no warning
        fs, path = storage.filesystem(f"s3://tenancy-0/{s3_bucket}/x.nc")
    assert path == f"{s3_bucket}/x.nc"
    assert fs.default_block_size == 6_000_000 and fs.max_concurrency == 3
    assert fs.config_kwargs["connect_timeout"] == 7 and fs.config_kwargs["read_timeout"] == 11.5
    assert fs.config_kwargs["retries"] == {"total_max_attempts": 1, "mode": "standard"}  # daskcfa's one retry layer
    plain, _ = storage.filesystem(f"s3://{s3_bucket}/x.nc", storage.register(s3_server.storage_options, protocol="s3"))
    assert plain.default_block_size != 6_000_000  # only the alias's host


@pytest.mark.parametrize("multipart, parts", [(True, 3), (False, None)])
def test_uploads_follow_the_part_size_and_multipart_switch(tmp_path, s3nc_file, s3_server, s3_bucket, s3fs_fs,
                                                           multipart, parts):
    settings = {"maximum_part_size": str(5 << 20), "enable_multipart_upload": multipart}
    s3nc_file.write_text(json.dumps(_transfer_config(s3_server, settings, backend="s3aioFileObject")))
    payload = os.urandom(11 << 20)
    local = tmp_path / "big.bin"
    local.write_bytes(payload)
    storage.put_file(f"s3://tenancy-0/{s3_bucket}/big.bin", str(local))
    etag = s3fs_fs.info(f"{s3_bucket}/big.bin")["ETag"].strip('"')
    assert (etag.rpartition("-")[2] == str(parts)) if parts else "-" not in etag  # a multipart ETag counts its parts
    assert s3fs_fs.cat_file(f"{s3_bucket}/big.bin") == payload


def test_whole_objects_in_one_get_without_multipart_download(s3nc_file, s3_server, s3_bucket, s3fs_fs, monkeypatch):
    payload = os.urandom(3 << 20)
    s3fs_fs.pipe_file(f"{s3_bucket}/obj.bin", payload)
    uri = f"s3://tenancy-0/{s3_bucket}/obj.bin"
    ranged = []
    original = objects.read_ranges
    monkeypatch.setattr(objects, "read_ranges", lambda *a, **k: ranged.append(a) or original(*a, **k))
    with dask.config.set({"daskcfa.storage.part-size": "512KiB"}):
        for download, gets in ((True, 1), (False, 0)):
            s3nc_file.write_text(json.dumps(_transfer_config(s3_server, {"enable_multipart_download": download})))
            ranged.clear()
            assert storage.read_whole(uri, known_size=len(payload)).tobytes() == payload
            assert len(ranged) == gets


@pytest.mark.parametrize("value, expected", [
    ("/scratch/cache", "/scratch/cache"), ("~/s3nc-cache", os.path.expanduser("~/s3nc-cache")),
    ("{{ cache_location }}", None), (3, None),
])
def test_cache_location(s3nc_file, value, expected):
    s3nc_file.write_text(json.dumps({"version": "9", "hosts": {}, "cache_location": value}))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert storage.cache_location() == expected
    found = _config_warnings(record)
    assert len(found) == (expected is None) and all("cache_location" in w for w in found)


def test_no_cache_location_without_a_configuration(s3nc_file):
    assert storage.cache_location() is None


@pytest.mark.parametrize("settings, named", [
    ({"maximum_part_size": "lots"}, "maximum_part_size"), ({"maximum_parts": 0}, "maximum_parts"),
    ({"enable_multipart_upload": "yes"}, "enable_multipart_upload"), ({"read_timeout": -1}, "read_timeout"),
])
def test_unusable_transfer_settings_are_named_and_defaults_kept(s3nc_file, s3_server, s3_bucket, settings, named):
    s3nc_file.write_text(json.dumps(_transfer_config(s3_server, settings)))
    with pytest.warns(daskcfa.CFAWarning, match=f"backends.s3FileObject.{named}.*the default is used"):
        fs, _ = storage.filesystem(f"s3://tenancy-0/{s3_bucket}/x.nc")
    assert fs.default_block_size == 50 * 2**20 and "read_timeout" not in fs.config_kwargs
