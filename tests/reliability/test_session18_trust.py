"""Session 18's trust-boundary holes closed (trust18): hostile HTTP ranges and bodies, hostile
attribute values (docs/reliability.md, "Hostile attribute values and HTTP ranges checked (trust18)").

Real parts only: raw-socket HTTP servers on 127.0.0.1 answering as scripted, real netCDF and Zarr
files. Each test failed on main (407ffab): wrong values or bytes taken, memory read without bound,
or a bare Python error.
"""

from __future__ import annotations

import re
import threading
import zlib
from typing import Callable

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa import storage

from remote_helpers import scripted_server

BODY = np.random.default_rng(18).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
N = len(BODY)


def _head(request: str) -> bytes | None:
    if request.startswith("HEAD"):
        return f"HTTP/1.1 200 OK\r\nContent-Length: {N}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n".encode()
    return None


def _ranges(said: Callable[[int, int], str], shift: int = 0, header: str = "Content-Range"):
    """Answers to ranged GETs: 206, the bytes ``shift`` past those asked, ``Content-Range: said(first, last)``."""
    def answer(request: str) -> bytes:
        asked = re.search(r"(?i)^range: bytes=(\d+)-(\d+)", request, re.M)
        first, last = int(asked[1]) + shift, int(asked[2]) + shift
        body = BODY[first:last + 1]
        return _head(request) or (f"HTTP/1.1 206 Partial Content\r\n{header}: {said(first, last)}\r\n"
                                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    return answer


def _read(read: Callable[[], object]) -> object:
    with dask.config.set({"daskcfa.storage.retries": 0}):
        return read()


@pytest.fixture
def profile():
    return storage.profiles.register({}, protocol="http")


def test_a_206_holding_other_bytes_than_asked_is_refused(profile):
    """A 206 naming (and holding) the bytes one past those asked for, of the right length: on main
    taken as the range asked for (the wrong bytes returned). Now a ``StorageError`` naming the object."""
    uri, listener = scripted_server(_ranges(lambda first, last: f"bytes {first}-{last}/{N}", shift=1))
    try:
        with pytest.raises(daskcfa.errors.StorageError, match="not the bytes asked for") as caught:
            parts = _read(lambda: storage.read_ranges(uri, [(0, 100), (5000, 100)], profile))
            assert parts == [BODY[0:100], BODY[5000:5100]]  # (main: each one byte on)
        assert caught.value.file == uri
    finally:
        listener.close()


@pytest.mark.parametrize("said", ["bytes 0-100/200000", "bytes 1-100/200000", "bytes 0-99", "bytes=0-99/200000", "", "bytes 0-99/200000, 1-2"])
def test_a_206_whose_content_range_is_not_the_range_asked_is_refused(profile, said):
    """The right bytes, but a ``Content-Range`` that does not name them (more bytes, another start, no
    complete length, a malformed one, an empty one): refused, as the bytes cannot be told to be those asked for."""
    uri, listener = scripted_server(_ranges(lambda first, last: said))
    try:
        with pytest.raises(daskcfa.errors.StorageError, match="not the bytes asked for"):
            _read(lambda: storage.read_ranges(uri, [(0, 100)], profile))
    finally:
        listener.close()


@pytest.mark.parametrize("said", ["bytes {first}-{last}/*", "BYTES  {first}-{last}/200000", "bytes {first}-{last}/200000",
                                  "bytes {first}-{last}/100"])
@pytest.mark.parametrize("header", ["Content-Range", "content-range", "CONTENT-RANGE"])
def test_a_206_naming_the_range_asked_is_read(profile, said, header):
    """Legitimate spellings (an unknown complete length ``*``, the unit in capitals, the header in any case,
    a sloppy complete length: the suite's trickling server echoes the range asked for beside it)."""
    uri, listener = scripted_server(_ranges(lambda first, last: said.format(first=first, last=last), header=header))
    try:
        assert _read(lambda: storage.read_ranges(uri, [(0, 100), (199_900, 100)], profile)) == [BODY[:100],
                                                                                              BODY[199_900:]]
    finally:
        listener.close()


def _endless(way: str) -> Callable[[str], bytes]:
    """A whole GET answered by 64 MiB: chunked without a declared length, or a deflate bomb."""
    if way == "chunked":
        piece = b"\0" * (1 << 20)
        body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(64)) + b"0\r\n\r\n"
        head = "Transfer-Encoding: chunked\r\n"
    else:
        body = zlib.compress(b"\0" * (64 << 20), 9)
        head = f"Content-Encoding: deflate\r\nContent-Length: {len(body)}\r\n"
    return lambda request: (f"HTTP/1.1 200 OK\r\n{head}Connection: close\r\n\r\n").encode() + body


@pytest.mark.parametrize("way", ["chunked", "deflate"])
def test_an_aggregation_file_read_whole_is_bounded(way):
    """An aggregation file over HTTP is read whole, with neither a size nor a bound: on main the 64 MiB
    body was read into memory (then not netCDF: a ``CFAFormatError``). Now read no further than
    ``daskcfa.limits.max-memory`` (here 4 MiB) and one byte: a ``BudgetError`` naming the setting."""
    uri, listener = scripted_server(_endless(way))
    try:
        with dask.config.set({"daskcfa.limits.max-memory": "4MiB"}), \
                pytest.raises(daskcfa.errors.BudgetError, match="daskcfa.limits.max-memory") as caught:
            _read(lambda: daskcfa.from_cfa(uri))
        assert caught.value.file == uri
    finally:
        listener.close()


@pytest.mark.parametrize("way", ["chunked", "deflate"])
def test_an_object_read_whole_without_a_size_is_bounded(way, profile):
    """``storage.read_whole`` of neither a size nor a bound (every caller of it that passes neither:
    a file to append to, a block refragment staged, an aggregation file's versions)."""
    uri, listener = scripted_server(_endless(way))
    try:
        with dask.config.set({"daskcfa.limits.max-memory": "4MiB"}), \
                pytest.raises(daskcfa.errors.BudgetError, match="daskcfa.limits.max-memory"):
            got = _read(lambda: storage.read_whole(uri, profile))
            assert len(got) <= 4 << 20  # (main: 64 MiB)
    finally:
        listener.close()


# --- storage attributes of Zarr fragments: no null, no string among numbers ------------------------------------

import json  # noqa: E402
import warnings  # noqa: E402

import netCDF4  # noqa: E402

from remote_helpers import write_cf113  # noqa: E402

VALUES = [1, 2, 3, 5, 7, 9]


def _zarr_fragment(tmp_path, attributes: dict, zarr_format: int = 2, fill_value=None):
    """An aggregation of one Zarr fragment ``frag.zarr`` (array ``x`` of :data:`VALUES`), its
    attributes then rewritten as JSON (``attributes``: as a hostile writer could)."""
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "frag.zarr"
    group = zarr.open_group(zarr.storage.LocalStore(store), mode="w", zarr_format=zarr_format)
    array = group.create_array("x", shape=(6,), dtype="f4", compressors=None, fill_value=fill_value,
                               attributes={"units": "K"} if zarr_format == 3 else {"_ARRAY_DIMENSIONS": ["n"],
                                                                                    "units": "K"},
                               **({"dimension_names": ["n"]} if zarr_format == 3 else {}))
    array[...] = VALUES
    if zarr_format == 2:
        meta = store / "x" / ".zattrs"
        meta.write_text(json.dumps({**json.loads(meta.read_text()), **attributes}))
    else:
        meta = store / "x" / "zarr.json"
        doc = json.loads(meta.read_text())
        doc["attributes"] = {**doc.get("attributes", {}), **attributes}
        meta.write_text(json.dumps(doc))
    return str(write_cf113(tmp_path / "agg.nc", "x", ("n",), [[6]], [["frag.zarr"]]))


HOSTILE = [("valid_range", [None, 5]), ("missing_value", [1, "2"]), ("missing_value", ["2"]), ("valid_min", None),
           ("_FillValue", [None]), ("scale_factor", [[2], [None]]), ("valid_max", [[1, "9"]])]


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("name, value", HOSTILE)
def test_a_null_or_string_among_a_zarr_fragments_numbers_is_refused(tmp_path, zarr_format, name, value):
    """On main numpy read ``[null, 5]`` as NaN and 5 (``valid_range`` masked above 5 only) and
    ``[1, "2"]`` as 1 and 2: a value netCDF cannot hold taken silently. Now a ``FragmentReadError``
    naming the fragment, the variable and the attribute."""
    path = _zarr_fragment(tmp_path, {name: value}, zarr_format)
    with pytest.raises(daskcfa.errors.FragmentReadError, match=f"attribute {name} = ") as caught:
        daskcfa.from_cfa(path, "x").compute()
    assert caught.value.variable is not None and caught.value.fragment == (0,)
    assert caught.value.file is not None and "frag.zarr" in caught.value.file


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_numbers_and_a_null_fill_value_still_read(tmp_path, zarr_format):
    """Legitimate attributes: lists of numbers, a ``fill_value`` of null (no fill value: the Zarr spec)."""
    path = _zarr_fragment(tmp_path, {"missing_value": [1, 2.0], "valid_range": [0, 8]}, zarr_format)
    got = daskcfa.from_cfa(path, "x").compute()
    np.testing.assert_array_equal(np.ma.getmaskarray(got), [True, True, False, False, False, True])


@pytest.mark.parametrize("fill", ["NaN", "Infinity", "-Infinity", 3.0])
def test_a_zarr_v2_fill_value_the_spec_allows_still_reads(tmp_path, fill):
    """``.zarray``'s ``fill_value`` ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` (Zarr v2's spelling of
    IEEE values), or a number: the array's fill value, masked as xarray reads it."""
    path = _zarr_fragment(tmp_path, {}, 2, fill_value=float(fill) if isinstance(fill, float) else None)
    meta = tmp_path / "frag.zarr" / "x" / ".zarray"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "fill_value": fill}))
    got = daskcfa.from_cfa(path, "x").compute()
    np.testing.assert_array_equal(np.ma.getmaskarray(got), [v == 3 and fill == 3.0 for v in VALUES])


# --- a scale_factor or add_offset that is not one number ---------------------------------------------------------

def _netcdf_fragment(path, fmt: str, attrs: dict) -> np.ndarray:
    """A fragment ``x`` of int16 10, 20, ..., 60 with ``attrs`` (written raw), and what netCDF4-python reads."""
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("n", 6)
        v = ds.createVariable("x", "i2", ("n",))
        v.set_auto_scale(False)
        v[:] = np.arange(10, 70, 10)
        v.units = "K"
        for key, value in attrs.items():
            v.setncattr(key, value)
    with netCDF4.Dataset(path) as ds, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ds["x"][:]


PACKINGS = [{"scale_factor": np.array([2.0, 3.0]), "add_offset": 1.0},
            {"scale_factor": 2.0, "add_offset": np.array([1.0, 5.0])},
            {"scale_factor": np.array([2.0, 3.0])}]


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_CLASSIC"])
@pytest.mark.parametrize("attrs", PACKINGS, ids=["two-scale", "two-offset", "two-scale-only"])
def test_a_fragments_packing_of_two_numbers_reads_as_netcdf4_python(tmp_path, fmt, attrs):
    """netCDF4-python unpacks nothing when ``scale_factor`` or ``add_offset`` is not one number (it
    warns). On main daskcfa applied the other one alone (``add_offset`` 1 added to the raw values).
    Now the same values as netCDF4-python, with a warning naming the attribute (once per process for
    each set of attributes: encodings are cached; hence other numbers for each format here)."""
    attrs = {k: v + (fmt == "NETCDF4") * 0.25 for k, v in attrs.items()}
    truth = _netcdf_fragment(tmp_path / "frag.nc", fmt, attrs)
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[6]], [["frag.nc"]], dtype="i2")
    with pytest.warns(daskcfa.errors.CFAWarning, match="not one number"):
        got = daskcfa.from_cfa(str(path), "x").compute()
    np.testing.assert_array_equal(np.ma.filled(got, -1), np.ma.filled(truth, -1))


def test_a_zarr_fragments_packing_of_two_numbers_is_not_applied(tmp_path):
    """The same through a Zarr fragment (its JSON ``scale_factor`` of two numbers)."""
    path = _zarr_fragment(tmp_path, {"scale_factor": [2.0, 3.0], "add_offset": 1.0}, 2)
    with pytest.warns(daskcfa.errors.CFAWarning, match="not one number"):
        got = daskcfa.from_cfa(path, "x").compute()
    np.testing.assert_array_equal(np.ma.filled(got, -1), VALUES)


def test_the_aggregation_variables_packing_of_two_numbers_is_not_applied(tmp_path):
    """On the aggregation variable itself: on main its ``add_offset`` applied alone."""
    truth = _netcdf_fragment(tmp_path / "frag.nc", "NETCDF4", {})
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[6]], [["frag.nc"]], dtype="i2")
    with netCDF4.Dataset(path, "a") as ds:
        ds["x"].scale_factor = np.array([4.0, 3.0])
        ds["x"].add_offset = 1.5
    with pytest.warns(daskcfa.errors.CFAWarning, match="not one number"):
        got = daskcfa.from_cfa(str(path), "x").compute()
    np.testing.assert_array_equal(np.ma.filled(got, -1), np.ma.filled(truth, -1))


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_a_one_element_packing_still_unpacks(tmp_path, fmt):
    """A ``scale_factor`` and ``add_offset`` of one element each (netCDF4-python writes arrays so): unpacked."""
    truth = _netcdf_fragment(tmp_path / "frag.nc", fmt, {"scale_factor": np.array([0.5], "f4"),
                                                          "add_offset": np.array([1.0], "f4")})
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[6]], [["frag.nc"]], dtype="i2")
    with warnings.catch_warnings():
        warnings.simplefilter("error", daskcfa.errors.CFAWarning)
        got = daskcfa.from_cfa(str(path), "x").compute()
    np.testing.assert_allclose(np.ma.filled(got, -1), np.ma.filled(truth, -1))


# --- to_cfa of an xarray object xarray's encoder refuses ---------------------------------------------------------

def test_to_cfa_of_a_fill_value_and_another_missing_value_is_a_daskcfa_error(tmp_path):
    """xarray's encoder refuses a ``_FillValue`` and a different ``missing_value`` with a bare
    ``ValueError``: now an ``ArgumentError`` (a ``ValueError`` still) naming the variable, and nothing
    written."""
    xr = pytest.importorskip("xarray")
    data = xr.DataArray(np.arange(6.0, dtype="f4"), dims=("n",), name="tas")
    data.encoding = {"_FillValue": -1.0, "missing_value": -2.0}
    target = tmp_path / "out"
    with pytest.raises(daskcfa.errors.ArgumentError, match=r"conflicting _FillValue \(-1.0\) and missing_value") as caught:
        daskcfa.to_cfa(data.to_dataset(), str(target / "agg.nc"))
    assert isinstance(caught.value, ValueError) and caught.value.variable == "/tas"
    assert not target.exists() or not any(target.rglob("*"))


# --- a netCDF-4 fragment over HTTP whose server shifts small ranges ------------------------------------------------

import functools  # noqa: E402
import http.server  # noqa: E402


class _Shifting(http.server.SimpleHTTPRequestHandler):
    """The standard library's file server answering ranged GETs of fewer than ``small`` bytes 206 with the
    bytes one further on (and a ``Content-Range`` naming them: a broken server, not a corrupting link),
    or ignoring ``Range`` for them altogether (200, the whole file)."""

    how = "shift"
    small = 100_000

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        asked = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if not asked or self.how == "ignore":
            return super().do_GET()
        with open(self.translate_path(self.path), "rb") as f:
            data = f.read()
        first, last = int(asked[1]), min(int(asked[2]), len(data) - 1)
        if first > 0 and last - first < self.small:
            first, last = first + 1, last + 1
        body = data[first:last + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{first + len(body) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("how", ["shift", "ignore"])
def test_h5py_blocks_of_an_http_fragment_are_the_bytes_asked_for(tmp_path, how):
    """h5py's metadata blocks of a netCDF-4 fragment over HTTP (here 512 bytes each) went through
    fsspec's ``async_fetch_range``, which takes a 206 whatever its ``Content-Range`` names (and a 200's
    start): on main the fragment's metadata was read from the wrong bytes ("variable 'x' not found in
    the fragment file"). Now each block is checked as every range is; the fragment reads right (the
    refused blocks' fragment is then read whole) or fails naming the range."""
    truth = np.random.default_rng(3).random((400, 3000))
    with netCDF4.Dataset(tmp_path / "frag.nc", "w") as ds:
        ds.createDimension("a", 400)
        ds.createDimension("b", 3000)
        v = ds.createVariable("x", "f8", ("a", "b"), chunksizes=(50, 3000))
        v.units = "K"
        v[:] = truth
    write_cf113(tmp_path / "agg.nc", "x", ("a", "b"), [[400], [3000]], [["frag.nc"]], dtype="f8")
    handler = type("Handler", (_Shifting,), {"how": how})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with dask.config.set({"daskcfa.storage.retries": 0, "daskcfa.storage.block-size": 512}):
            got = daskcfa.from_cfa(f"http://127.0.0.1:{server.server_address[1]}/agg.nc", "x")[:60, :5].compute()
        np.testing.assert_array_equal(np.ma.filled(got, np.nan), truth[:60, :5])
    except daskcfa.errors.StorageError as exc:
        assert "not the bytes asked for" in str(exc) or "ignores byte ranges" in str(exc), exc
    finally:
        server.shutdown()
        server.server_close()


def test_an_nczarr_fragments_nan_and_infinities_read_as_netcdf4_python(tmp_path):
    """NCZarr (netCDF-C) writes NaN and the infinities in attributes as Zarr spells them: ``"_FillValue":
    "NaN"``, ``"missing_value": ["NaN", "Infinity"]``, ``"valid_max": "Infinity"``. On main the fragment
    was refused ("unreadable _FillValue 'NaN'"); now read as netCDF4-python reads the store (not taken
    for strings among numbers, which are refused)."""
    store = tmp_path / "frag.zarr"
    try:
        with netCDF4.Dataset(f"file://{store}#mode=nczarr,file", "w") as ds:
            ds.createDimension("n", 4)
            v = ds.createVariable("x", "f4", ("n",), fill_value=np.float32(np.nan))
            v.missing_value = np.array([np.nan, np.inf], "f4")
            v.valid_max = np.float32(np.inf)
            v.units = "K"
            v[:] = [1, np.inf, np.nan, 4]
    except (OSError, RuntimeError) as exc:
        pytest.skip(f"this netCDF-C writes no NCZarr: {exc}")
    assert '"NaN"' in (store / "x" / ".zattrs").read_text()
    with netCDF4.Dataset(f"file://{store}#mode=nczarr,file") as ds:
        truth = ds["x"][:]
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[4]], [["frag.zarr"]])
    got = daskcfa.from_cfa(str(path), "x").compute()
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(truth))
    np.testing.assert_array_equal(got.compressed(), truth.compressed())
