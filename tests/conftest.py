"""Shared pytest fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

import dask
import pytest

# ---------------------------------------------------------------------------
# Fixtures for the end-to-end read tests (formats/test_read_dialects.py,
# formats/test_bad_input.py, formats/test_cfdm_interop.py), which build real aggregation
# datasets with tests/builders.py.
# ---------------------------------------------------------------------------
sys.path.insert(0, str(Path(__file__).parent))  # `import builders` from any test module


@pytest.fixture(autouse=True)
def _own_dask_threads():
    """Each test computes on a thread pool of its own (dask's default), drained when it ends.

    When a task fails, dask's threaded scheduler raises at once but lets the
    other tasks of that computation run on in its pool. A test that expects
    the error passes while they still read fragments through netCDF-C, and
    the next test, writing its files with netCDF4-python outside daskcfa's
    lock, would share netCDF-C with them (not thread-safe: a crash of the
    whole run, seen as exit 139).
    """
    import dask.threaded

    yield
    # (dask's default pool, created by the test's first computation; the next test makes its own)
    pool, dask.threaded.default_pool = dask.threaded.default_pool, None
    if pool is not None:
        pool.shutdown(wait=True)


@pytest.fixture(autouse=True)
def _logging_enabled():
    """cfdm (a peer imported by the interop tests) turns logging off for the whole process when
    imported (``logging.disable()``): tests that look at log records run with it on again."""
    import logging

    logging.disable(logging.NOTSET)
    yield


@pytest.fixture
def other_cwd(tmp_path_factory, monkeypatch):
    """Run the test from an unrelated working directory.

    Relative fragment URIs must resolve against the aggregation file's
    directory, never against the cwd: with the cwd elsewhere, a reader that
    gets this wrong cannot find the fragments.
    """
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    return elsewhere


@pytest.fixture
def sync_dask():
    """Compute with dask's synchronous scheduler (plain tracebacks, deterministic)."""
    import dask

    with dask.config.set(scheduler="synchronous"):
        yield


# ---------------------------------------------------------------------------
# Real local servers (daskcfa_testing.servers): S3 (SeaweedFS `weed mini`),
# HTTP with byte ranges, OPeNDAP (pydap). 127.0.0.1 only; each starts lazily,
# the first time a test asks for it, and stops at the end of the session.
# Tests that kill or restart an S3 server use `s3_server_private`, never the
# shared `s3_server`.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server():
    """The session's S3 server (`S3Server`): endpoint_url, key, secret, storage_options."""
    from daskcfa_testing.servers import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def s3netcdf4():
    """The interpreter of the S3netCDF4 venv (tests/s3netcdf4_helpers.py), or a skip saying why there is none."""
    from s3netcdf4_helpers import s3netcdf4_python

    return s3netcdf4_python()


@pytest.fixture
def s3_server_private():
    """A separate S3 server for this test only (for kill()/restart() tests)."""
    from daskcfa_testing.servers import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server):
    """Name of a fresh, empty bucket on the session's S3 server."""
    return s3_server.new_bucket()


@pytest.fixture
def s3fs_fs(s3_server):
    """A fresh (uncached) s3fs.S3FileSystem talking to the session's S3 server."""
    return s3_server.filesystem()


@pytest.fixture
def make_http_server():
    """Factory: make_http_server(directory, username=None, password=None) -> started HTTPServer."""
    from daskcfa_testing.servers import HTTPServer

    servers = []

    def make(directory, **kwargs):
        server = HTTPServer(directory, **kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def http_server(make_http_server, tmp_path_factory):
    """An HTTPServer serving a fresh empty directory (`http_server.root`) for this test."""
    return make_http_server(tmp_path_factory.mktemp("http"))


@pytest.fixture(scope="session")
def opendap_server(tmp_path_factory):
    """The session's OPeNDAP server (`OPeNDAPServer`) over `opendap_server.root`.

    Files are looked up per request, so a test writes its netCDF files into a
    fresh subdirectory of the root (see `opendap_dir`) after the server started.
    Skips with the reason when pydap's server is not available.
    """
    from daskcfa_testing.servers import OPeNDAPServer

    server = OPeNDAPServer(tmp_path_factory.mktemp("opendap"))
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture
def opendap_dir(opendap_server, request):
    """(directory, base_url): a fresh directory served by the session's OPeNDAP server."""
    import re
    import tempfile

    name = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:40]
    directory = Path(tempfile.mkdtemp(prefix=name + "-", dir=opendap_server.root))
    return directory, opendap_server.url_for(directory.name)


@pytest.fixture(params=["local", "s3"])
def placed(request):
    """Read a test's dataset where it was built, or from a copy on the session's S3 server.

    ``placed(aggregation_path)`` -> ``(url, storage_options)``; on S3 the
    aggregation file's whole directory is uploaded (relative fragment URIs
    keep working).
    """
    if request.param == "local":
        return lambda path: (str(path), None)
    server = request.getfixturevalue("s3_server")
    fs, bucket = server.filesystem(), server.new_bucket()

    def place(path):
        path = Path(path)
        fs.put(str(path.parent) + "/", f"{bucket}/ds/", recursive=True)
        return f"s3://{bucket}/ds/{path.name}", server.storage_options

    return place


@pytest.fixture
def one_version():
    """Commits keep the current version only (``daskcfa.write.keep-versions`` = 1, the behaviour
    before versions were kept): for tests of what a commit retires."""
    with dask.config.set({"daskcfa.write.keep-versions": 1}):
        yield
