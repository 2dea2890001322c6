"""S3netCDF4's configuration file (``~/.s3nc.json`` / ``$S3_NC_CONFIG``) as daskcfa reads it.

A leftover template, a malformed file or keys daskcfa does not use must never
break reads that use no alias: one warning says what is ignored, and only a
URI naming an unusable alias fails (a StorageError naming it, no secret).
"""

from __future__ import annotations

import json
import os
import warnings

import pytest

import daskcfa
from builders import assert_matches, build
from daskcfa.fragments.manager import Budget, manager
from daskcfa.storage import s3nc
from daskcfa.storage.s3nc import parse_size, s3nc_config
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
    budget = manager().budget
    yield path
    manager().configure(budget)


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
    config = {"version": "9", "hosts": _host(s3_server),
              "backends": {"s3FileObject": {"maximum_part_size": "50MB"}}, "cache_location": "/tmp/cache",
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
    for key in ("backends", "cache_location", "resource_allocation.file_handles",
                "resource_allocation.disk_handles", "hosts.s3://tenancy-0.backend"):
        assert key in found[0]
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


@pytest.mark.parametrize("text, expected", [
    ("50MB", 50 * 10**6), ("1GB", 10**9), ("10 kB", 10**4), ("1.5GB", 1_500_000_000), ("2TB", 2 * 10**12),
    ("3PB", 3 * 10**15), ("1EB", 10**18), ("1ZB", 10**21), ("1YB", 10**24), ("512", 512), (4096, 4096), ("7B", 7),
])
def test_sizes_in_decimal_units_up_to_yottabytes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "1XB", "1.2.3GB", "-1MB", True, None, 1.5, "{{ memory }}", "1e3MB"])
def test_sizes_that_are_not(text):
    with pytest.raises(ValueError):
        parse_size(text)
