"""Every writer prepares its target one way (``daskcfa/write/target.py``): the same refusals, naming the same
credential-free URL, with no trace of a login given in the URL."""

from __future__ import annotations

import dask.array as da
import pytest

import daskcfa

X = da.arange(12, chunks=6, dtype="f4").reshape(3, 4)
PASSWORD = "pa55-w0rd-never-shown"

# Each writer, given a local archive ``d`` (``t.nc`` and its fragments ``t/``) and a target URL.
EXISTING = {
    "to_cfa": lambda d, url: daskcfa.to_cfa(X, url, variable="x", dims=("a", "b")),
    "aggregate": lambda d, url: daskcfa.aggregate(f"{d}/t/**/*.nc", url),
    "rebuild": lambda d, url: daskcfa.rebuild(f"{d}/t/", url),
    "refragment": lambda d, url: daskcfa.refragment(f"{d}/t.nc", url),
    "relocate": lambda d, url: daskcfa.relocate(f"{d}/t.nc", {}, target=url, uris="absolute"),
    "to_references": lambda d, url: daskcfa.to_references(f"{d}/t.nc", output=url),
    "Dataset w": lambda d, url: daskcfa.Dataset(url, "w", clobber=False, format="CF-1.13"),
    "Dataset x plain": lambda d, url: daskcfa.Dataset(url, "x", format="NETCDF4"),
}
MISSING = {
    "to_cfa r+": lambda url: daskcfa.to_cfa(X, url, variable="x", dims=("a", "b"), mode="r+"),
    "Dataset a": lambda url: daskcfa.Dataset(url, "a", format="CF-1.13"),
    "Dataset a plain": lambda url: daskcfa.Dataset(url, "a", format="NETCDF4"),
}


@pytest.fixture
def archive(tmp_path, make_http_server):
    """A written archive, served over HTTP behind a login: (local directory, its server)."""
    daskcfa.to_cfa(X, str(tmp_path / "t.nc"), variable="tas", dims=("t", "y"))
    return tmp_path, make_http_server(tmp_path, username="reader", password=PASSWORD)


def _with_login(server, name: str) -> str:
    return server.url_for(name).replace("http://", f"http://reader:{PASSWORD}@")


def _no_login_shown(error: daskcfa.CFAError, clean: str) -> None:
    assert error.file == clean, error.file  # the URL the user can act on: the login taken out, not masked
    for shown in (str(error), repr(error), error.reason):
        assert PASSWORD not in shown and "reader" not in shown, shown


@pytest.mark.parametrize("writer", EXISTING)
def test_every_writer_refuses_an_existing_target_alike(archive, writer):
    directory, server = archive
    with pytest.raises(daskcfa.TargetExistsError) as info:
        EXISTING[writer](directory, _with_login(server, "t.nc"))
    _no_login_shown(info.value, server.url_for("t.nc"))


@pytest.mark.parametrize("writer", MISSING)
def test_every_update_refuses_a_missing_target_alike(archive, writer):
    directory, server = archive
    with pytest.raises(daskcfa.NotFoundError, match="updates an existing file, and there is none") as info:
        MISSING[writer](_with_login(server, "none.nc"))
    _no_login_shown(info.value, server.url_for("none.nc"))
