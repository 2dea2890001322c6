"""Attacks on the doors session 14 changed and the least-attacked front doors (attack15): secrets in
URIs reaching errors, the command line and logs; the HTTP bounded GET; HDF5 chunk entries; masked
reductions joined without numpy.ma.

Real parts only: netCDF-4 files written by netCDF4-python, the suite's HTTP server requiring a login,
the command line run in-process (``daskcfa.cli.main``). Each test of a fix failed on main as it was
(e7106d3) (docs/reliability.md, "Session 14's doors attacked (attack15)").
"""

from __future__ import annotations

import logging
import secrets
import struct
import tracemalloc
import traceback
import warnings
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import daskcfa
from daskcfa import cli
from daskcfa.errors import CFAError

from remote_helpers import write_cf113

from .test_redirects import origins  # noqa: F401 (a fixture)

PASSWORD = "Pw15attack9q"


def _aggregation(directory: Path) -> Path:
    """A CF-1.13 aggregation of one netCDF-4 fragment ``x(n)`` of four values."""
    directory.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(directory / "f.nc", "w") as nc:
        nc.createDimension("n", 4)
        nc.createVariable("x", "f4", ("n",))[:] = np.arange(4)
    return write_cf113(directory / "agg.nc", "x", ("n",), [[4]], [["f.nc"]])


def _every_front_door(url: str) -> list[str]:
    """What ``from_cfa``, ``Dataset``, the xarray backend and ``to_cfa`` show of ``url``: results,
    warnings, tracebacks (chained errors too); each error must be daskcfa's."""
    import xarray as xr

    shown = []
    for call in (lambda: daskcfa.from_cfa(url, "x").compute(), lambda: daskcfa.Dataset(url)["x"][:],
                 lambda: xr.open_dataset(url, engine="daskcfa").load(),
                 lambda: daskcfa.to_cfa(np.arange(4.0), url.replace("agg.nc", "new.nc"), variable="y", dims=("n",))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                shown.append(repr(call()))
            except CFAError:
                shown.append(traceback.format_exc())
        shown += [str(w.message) for w in caught]
    return shown


def _command_line(argv: list[str], capsys) -> tuple[int, str]:
    status = cli.main(argv)
    out = capsys.readouterr()
    return status, out.out + out.err


# ---------------------------------------------------------------------------
# secrets in URIs: other spellings (errors._SECRET_QUERY, profiles.take_login)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("query", ["auth[token]", "credentials[secret]", "api_key[]", "user%5Bpassword%5D"])
def test_a_secret_parameter_named_in_brackets_is_redacted(tmp_path, make_http_server, query, capsys):
    """``?auth[token]=...`` (the bracketed names of PHP and Rails forms): the 401 error of every front
    door and of ``daskcfa info`` quoted the URI with the secret (main, e7106d3)."""
    _aggregation(tmp_path / "srv")
    server = make_http_server(tmp_path / "srv", username="reader", password="other-login-1")
    url = f"{server.url}/agg.nc?{query}={PASSWORD}"
    status, text = _command_line(["info", url], capsys)
    assert status == 1 and "access denied" in text
    shown = "\n".join([text, *_every_front_door(url)])
    assert PASSWORD not in shown
    assert f"{query}=***" in shown


@pytest.mark.parametrize("scheme", ["s3", "s3a"])
def test_an_s3_uri_holding_a_login_is_refused_without_showing_it(tmp_path, scheme, capsys, caplog):
    """``s3://KEY:SECRET@bucket/agg.nc``: no S3 reader takes a login there; botocore's validation error
    quoted the whole "bucket name", secret included, inside daskcfa's message, in every front door,
    ``daskcfa info``/``verify`` and s3fs's DEBUG record (main, e7106d3). Now an ``ArgumentError``."""
    caplog.set_level(logging.DEBUG)
    url = f"{scheme}://AKIAEXAMPLE15:{PASSWORD}@bucket/agg.nc"
    for command in (["info", url], ["verify", url], ["info", "--debug", url]):
        status, text = _command_line(command, capsys)
        assert status == 1 and "S3 URI holding a login" in text and PASSWORD not in text
    shown = _every_front_door(url)
    assert all("S3 URI holding a login" in s for s in shown)
    assert PASSWORD not in "\n".join(shown) + "\n".join(r.getMessage() for r in caplog.records)


def test_an_s3_fragment_uri_holding_a_login_is_refused_without_showing_it(tmp_path):
    """The same URI as a fragment of an aggregation file: the variable's ``CFAFormatError`` names the file."""
    agg = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[4]], [[f"s3://AKIAEXAMPLE15:{PASSWORD}@bucket/f.nc"]])
    with pytest.raises(daskcfa.errors.CFAFormatError) as caught:
        daskcfa.from_cfa(str(agg), "x").compute()
    text = traceback.format_exception(caught.value)
    assert "S3 URI holding a login" in str(caught.value) and str(agg) in str(caught.value)
    assert PASSWORD not in "".join(text)


@pytest.mark.parametrize("url", ["http://", "https://:@/", "http://[::1", f"http://reader:{PASSWORD}@[::1/agg.nc",
                                 "http://[::1]x/agg.nc", f"http://reader:{PASSWORD}@[::1]8080/agg.nc",
                                 "http://127.0.0.1:-1/agg.nc", f"http://reader:{PASSWORD}@127.0.0.1:99999/agg.nc"])
def test_an_http_url_naming_no_host_or_a_bad_port_is_a_daskcfa_error(url, capsys):
    """A careless aggregation URL: aiohttp's bare ``InvalidUrlClientError`` (no host), urllib's bare
    ``ValueError`` ("Invalid IPv6 URL", "Port out of range") on main (e7106d3), from every front door and
    as ``daskcfa info``'s one line. Now an ``ArgumentError`` (``profiles.split_url_credentials``, where the
    aggregation URL's login is taken out), the URL shown only without its login."""
    import xarray as xr

    for call in (lambda: daskcfa.from_cfa(url), lambda: daskcfa.Dataset(url),
                 lambda: xr.open_dataset(url, engine="daskcfa")):
        with pytest.raises(daskcfa.errors.ArgumentError) as caught:
            call()
        assert PASSWORD not in "".join(traceback.format_exception(caught.value))
    status, text = _command_line(["info", url], capsys)
    assert status == 1 and "URL" in text and PASSWORD not in text


# ---------------------------------------------------------------------------
# HDF5 chunk entries (fragments/hdf5.py)
# ---------------------------------------------------------------------------
def _set_chunk_address(fragment: Path, address: int) -> None:
    """Rewrite the address of the one chunk in the fragment's v1 B-tree."""
    from .test_session13_attacks import chunk_entry

    data, at = chunk_entry(fragment)
    data[at + 24:at + 32] = struct.pack("<Q", address)
    fragment.write_bytes(bytes(data))


@pytest.mark.parametrize("entry", ["size 2**32-16", "size 2**31-1", "address 2**63", "address 2**63-16"])
def test_a_chunk_entry_far_past_the_end_of_a_small_file_is_refused_before_a_buffer_is_made(tmp_path, entry):
    """A 27 KB fragment whose one chunk's B-tree entry claims 4 GiB: a whole read made a buffer of 4 GiB
    before finding the file shorter (4,162 MiB traced on main, e7106d3); an address past 2**63 was an
    ``OverflowError`` quoted in the message. Now every read of a local chunk checks it lies within the
    file (as point reads did since session 14) first: a ``FragmentReadError`` naming the fragment."""
    from .test_session13_attacks import _one_chunk_fragment, _read_point, _set_chunk_size

    aggregation, fragment = _one_chunk_fragment(tmp_path)
    what, value = entry.split(" ")
    (_set_chunk_size if what == "size" else _set_chunk_address)(fragment, eval(value))  # noqa: S307 (the ids above)
    for index in (slice(None), 5, slice(0, 10)):
        tracemalloc.start()
        try:
            with pytest.raises(daskcfa.errors.FragmentReadError) as caught:
                _read_point(aggregation, index)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20
        assert "runs past the end of the file" in str(caught.value)
        assert caught.value.fragment == (0,) and str(fragment) in str(caught.value)


# ---------------------------------------------------------------------------
# updates of a hostile archive: Dataset(url, "a"), to_cfa(mode="r+"/"a")
# ---------------------------------------------------------------------------
def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def _write(path: Path, values: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("n", len(values))
        nc.createVariable("x", "f4", ("n",))[:] = values


@pytest.mark.parametrize("update", ["r+ region", "Dataset a region", "Dataset r+ region", "a append"])
def test_an_update_of_an_archive_naming_fragments_elsewhere_writes_nothing_there(tmp_path, update):
    """An archive whose fragments are ``../victim/f.nc``, an absolute path and a ``file://`` URI outside
    its directory: an update rewrites fragments it touches as new ones beside the archive, appends beside
    it too, and never writes, replaces or deletes a file the archive names (nor any file outside its
    directory); the values read back are the old ones with the update."""
    victim = tmp_path / "victim"
    for name, values in (("f0.nc", [0, 1, 2, 3]), ("f1.nc", [4, 5, 6, 7]), ("f2.nc", [8, 9, 10, 11])):
        _write(victim / name, np.array(values, "f4"))
    home = tmp_path / "home"
    home.mkdir()
    uris = [["../victim/f0.nc", str(victim / "f1.nc"), (victim / "f2.nc").as_uri()]]
    aggregation = write_cf113(home / "agg.nc", "x", ("n",), [[4, 4, 4]], uris)
    before = _tree(victim)
    new = np.array([40, 41, 42, 43, 44, 45], "f4")  # across the first two fragments, each in part
    expected = np.arange(12, dtype="f4")
    if update == "r+ region":
        daskcfa.to_cfa(new, str(aggregation), mode="r+", variable="x", region={"n": slice(2, 8)})
        expected[2:8] = new
    elif update.startswith("Dataset"):
        with daskcfa.Dataset(str(aggregation), update.split()[1]) as ds:
            ds["x"][2:8] = new
        expected[2:8] = new
    else:
        daskcfa.to_cfa(new, str(aggregation), mode="a", variable="x", dims=("n",), append_dim="n")
        expected = np.concatenate([expected, new])
    assert _tree(victim) == before
    assert {p.name for p in tmp_path.iterdir()} == {"victim", "home"}
    np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(str(aggregation), "x").compute()), expected)


# ---------------------------------------------------------------------------
# the xarray backend (xarray_backend.py) on hostile attributes of the aggregation file
# ---------------------------------------------------------------------------
def _with_attributes(directory: Path, **attrs) -> Path:
    aggregation = _aggregation(directory)
    with netCDF4.Dataset(aggregation, "a") as nc:
        nc["x"].setncatts(attrs)
    return aggregation


@pytest.mark.parametrize("attrs", [{"units": "days since garbage"}, {"units": "days since 1970-01-01", "calendar": "x" * 40},
                                   {"scale_factor": np.array([1.0, 2.0])}], ids=["time units", "calendar", "packing"])
def test_attributes_xarray_cannot_decode_are_a_daskcfa_error_naming_the_file(tmp_path, attrs):
    """``xr.open_dataset(agg, engine="daskcfa")`` of an aggregation whose variable has time units xarray
    cannot read, or a ``scale_factor`` of two values: a bare ``ValueError`` from xarray's decoding on main
    (e7106d3). Now a ``CFAFormatError`` (still a ``ValueError``) naming the file, and the variable in
    xarray's words; ``decode_times=False``/``mask_and_scale=False`` still open it."""
    import xarray as xr

    aggregation = _with_attributes(tmp_path, **attrs)
    with pytest.raises(daskcfa.errors.CFAFormatError) as caught:
        xr.open_dataset(aggregation, engine="daskcfa")
    assert caught.value.file == str(aggregation) and "variable 'x'" in str(caught.value)
    off = {"decode_times": False} if "units" in attrs else {"mask_and_scale": False}
    assert xr.open_dataset(aggregation, engine="daskcfa", **off)["x"].shape == (4,)


@pytest.mark.parametrize("attrs", [{"scale_factor": "abc"}, {"add_offset": "1"}, {"_Encoding": "no-such-codec"}],
                         ids=["text scale", "text offset", "encoding"])
def test_attributes_xarray_decodes_lazily_are_a_daskcfa_error_at_open(tmp_path, attrs):
    """A text ``scale_factor``/``add_offset`` or an ``_Encoding`` on a float variable: xarray decodes
    them lazily, above the backend, so on main (bfd4ce5) the open said nothing and ``.load()`` raised
    a bare ``UFuncTypeError``/``AttributeError`` (as with engine="netcdf4"). Now the open is a
    ``CFAFormatError`` naming the file and the variable; ``mask_and_scale=False`` still opens the text
    packing, and a well-formed file is untouched."""
    import xarray as xr

    aggregation = _with_attributes(tmp_path, **attrs)
    with pytest.raises(daskcfa.errors.CFAFormatError) as caught:
        xr.open_dataset(aggregation, engine="daskcfa").load()
    assert caught.value.file == str(aggregation) and "variable 'x'" in str(caught.value)
    if "_Encoding" not in attrs:
        assert xr.open_dataset(aggregation, engine="daskcfa", mask_and_scale=False)["x"].shape == (4,)


def test_variables_of_characters_with_their_encoding_open_as_xarray_decodes_them(tmp_path):
    """The lazy decoding check refuses nothing xarray decodes: ``char`` variables with ``_Encoding``
    "utf-8" (netCDF4-python's strings), aggregated and stored in the aggregation file, and packed
    integers. On main (bfd4ce5) the stored one failed at load with a bare ``IndexError``: the backend
    handed xarray strings joined by netCDF4-python where it had declared characters."""
    import xarray as xr

    words = ["ab", "cde", "f", "ghij"]
    paths = []
    for k in range(2):
        paths.append(tmp_path / f"f{k}.nc")
        with netCDF4.Dataset(paths[-1], "w") as nc:
            nc.createDimension("n", 2)
            nc.createDimension("c", 4)
            nc.createDimension("m", 5)
            nc.createVariable("n", "i4", ("n",))[:] = [2 * k, 2 * k + 1]
            text = nc.createVariable("t", "S1", ("n", "c"))
            text._Encoding = "utf-8"
            text[:] = netCDF4.stringtochar(np.array(words[2 * k:2 * k + 2], "S4"))
            label = nc.createVariable("label", "S1", ("m",))  # (the same in each file: stored, not aggregated)
            label._Encoding = "utf-8"
            label.set_auto_chartostring(False)
            label[:] = np.frombuffer("réel".encode(), "S1")  # (5 bytes)
            packed = nc.createVariable("p", "i2", ("n",))
            packed.scale_factor, packed.add_offset = 0.5, 10.0
            packed[:] = [11.0 + k, 12.5 + k]
    aggregation = daskcfa.aggregate([str(p) for p in paths], str(tmp_path / "agg.nc"))
    ds = xr.open_dataset(aggregation, engine="daskcfa").load()
    assert list(ds["t"].values) == words
    assert ds["label"].values[()] == "réel"
    np.testing.assert_array_equal(ds["p"].values, [11.0, 12.5, 12.0, 13.5])


# ---------------------------------------------------------------------------
# a login inside a storage option's URL (storage/redaction.py)
# ---------------------------------------------------------------------------
def test_a_login_in_the_endpoint_url_of_the_storage_options_stays_out_of_debug_logs(s3_server, caplog):
    """``client_kwargs={"endpoint_url": "http://user:<pw>@host:port"}``: the write and the read fail
    (aiohttp refuses a login beside botocore's signature) with a ``StorageError`` showing no password,
    but botocore's DEBUG records ("Calling endpoint provider", "Sending http request") held it on main
    (e7106d3): only the values of credential keys were redacted. Now a login or signed query of any
    URL given as an option is."""
    caplog.set_level(logging.DEBUG)
    password = f"Ep{secrets.token_hex(8)}"  # (this test's own: a value another test made the process redact is no test)
    options = s3_server.storage_options
    endpoint = s3_server.endpoint_url.replace("http://", f"http://user:{password}@")
    options = {**options, "client_kwargs": {**options.get("client_kwargs", {}), "endpoint_url": endpoint}}
    url = f"s3://{s3_server.new_bucket()}/agg.nc"
    with pytest.raises(daskcfa.errors.StorageError) as caught:
        daskcfa.to_cfa(np.arange(4.0), url, variable="y", dims=("n",), storage_options=options)
    with pytest.raises(daskcfa.errors.StorageError):
        daskcfa.from_cfa(url, storage_options=options).compute()
    logs = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "Sending http request" in logs  # (botocore's DEBUG records were made)
    assert password not in logs + "".join(traceback.format_exception(caught.value))


def test_relocating_to_an_s3_prefix_holding_a_login_writes_no_secret(tmp_path):
    """``relocate(agg, {old: "s3://KEY:SECRET@bucket/"})``: attack14's fix drops an HTTP login from the
    new prefix, but an S3 one was written into the relocated file, secret in clear (main, e7106d3).
    Now refused before anything is written, the file unchanged."""
    aggregation = _aggregation(tmp_path)
    before = aggregation.read_bytes()
    with pytest.raises(daskcfa.errors.ArgumentError) as caught:
        daskcfa.relocate(str(aggregation), {str(tmp_path) + "/": f"s3://AKIAEXAMPLE15:{PASSWORD}@bucket/"})
    assert PASSWORD not in "".join(traceback.format_exception(caught.value))
    assert aggregation.read_bytes() == before


# ---------------------------------------------------------------------------
# the bounded HTTP GET (storage/objects.py _http_get_bounded)
# ---------------------------------------------------------------------------
def test_the_bounded_http_get_checks_every_redirect_hop(origins):
    """``read_whole(..., max_bytes=...)`` of an HTTP object (how reference sets and bookkeeping JSON are
    read since session 14: a streamed GET) redirected to another origin: refused as every other read is,
    no request reaching the other origin (``test_redirects.py`` checks ``read_whole`` without a bound)."""
    from daskcfa import storage
    from daskcfa.storage.policy import LocationPolicy

    from .test_redirects import STATUSES

    built, home, other, victim = origins
    url = home.url + victim
    policy = LocationPolicy.for_aggregation(home.url_for("ds/" + built.path.name))
    for status in STATUSES:
        home.clear_redirects()
        home.redirect(victim, other.url + victim, status=status)
        with pytest.raises(daskcfa.UnsafeURIError, match="redirect") as caught:
            storage.read_whole(url, policy=policy, max_bytes=1 << 20)
        assert caught.value.file == url
    assert other.requests == 0
    home.clear_redirects()
    assert len(storage.read_whole(url, policy=policy, max_bytes=1 << 20).tobytes()) > 0
