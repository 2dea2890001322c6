"""Attacks on the doors session 12 changed (attack13): s3fs's unredirected HTTP session, the bounded
reader of bookkeeping JSON, the netCDF-3 header parser and its cache of variable lists, the redaction
of secrets in URLs, and point-series batches on a distributed cluster.

Real parts only: HTTP servers on 127.0.0.1 answering as S3 (``_FakeS3`` of the direct-GET attacks),
the suite's HTTP server, real files written byte by byte, a real ``distributed`` cluster. Each test of
a fix failed on the code before it (docs/reliability.md, "Session 12's doors attacked (attack13)").
"""

from __future__ import annotations

import json
import os
import struct
import threading
import tracemalloc
from pathlib import Path

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa import storage
from daskcfa.fragments.netcdf3 import NetCDF3File

from .conftest import forget_open_files, replace_file
from .test_direct_s3_attacks import BODY, KEY, SECRET, TOKEN, WAYS, _read, servers  # noqa: F401 (a fixture)


# ---------------------------------------------------------------------------
# s3fs's HTTP session (storage/s3_http.py)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("status", [301, 307])
def test_an_s3_redirect_named_by_a_uri_header_reaches_nothing_there(servers, status):
    """aiohttp follows an obsolete ``URI`` header as it follows a ``Location``; the session refused only
    a ``Location``. Before: the GET, with the session token, went to the other origin, and its body
    came back as the object's."""
    other = servers.elsewhere
    endpoint = servers(lambda method, path, headers: (status, {"URI": other.url + path}, b""))
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        _read(endpoint.url, "event-loop")
    assert other.log == [], f"another origin received {other.log}"
    assert info.value.file == "s3://bucket/f/0.nc"
    assert not {KEY, SECRET, TOKEN} & set(str(info.value).split())


@pytest.mark.parametrize("header", ["Location", "URI"])
def test_no_s3_operation_through_s3fs_follows_a_redirect(servers, header):
    """Every S3 request daskcfa makes through s3fs (HEAD, LIST, PUT of a small and a 12 MiB object,
    DELETE) answered 307 with a redirect to another origin: an UnsafeURIError naming the object, and
    nothing reaches that origin (before, with ``URI``: each request, and its session token, went there)."""
    other = servers.elsewhere
    endpoint = servers(lambda method, path, headers: (307, {header: other.url + path}, b""))
    profile = storage.profiles.register({"key": KEY, "secret": SECRET, "token": TOKEN,
                                         "client_kwargs": {"endpoint_url": endpoint.url}}, protocol="s3")
    operations = {"s3://bucket/x.nc": lambda uri: storage.exists(uri, profile),
                  "s3://bucket/d/": lambda uri: storage.listdir(uri, profile),
                  "s3://bucket/small.nc": lambda uri: storage.put_bytes(uri, b"CDF", profile),
                  "s3://bucket/large.nc": lambda uri: storage.put_bytes(uri, bytes(12 << 20), profile),
                  "s3://bucket/gone.nc": lambda uri: storage.delete(uri, profile)}
    with dask.config.set({"daskcfa.storage.retries": 0}):
        for uri, operation in operations.items():
            with pytest.raises(daskcfa.UnsafeURIError) as info:
                operation(uri)
            assert info.value.file == uri
            assert other.log == [], f"another origin received {other.log}"


# ---------------------------------------------------------------------------
# Bodies of no bound: a whole GET on fsspec's event loop, and bookkeeping JSON (storage/objects.py)
# ---------------------------------------------------------------------------
def _chunked(body: bytes) -> tuple[int, dict, bytes]:
    return 200, {"Content-Length": None, "Transfer-Encoding": "chunked"}, \
        b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"


def test_a_body_of_no_declared_length_is_refused_on_the_event_loop_too(servers):
    """A chunked body declares no length: the blocking GET refused it, the GET on the event loop read
    it whole whatever ``max_bytes`` said (before: 20 MiB returned under a 1 MiB bound)."""
    endpoint = servers(lambda *_: _chunked(BODY + bytes(20 << 20)))
    with pytest.raises(daskcfa.errors.StorageError, match="did not declare") as info:
        _read(endpoint.url, "event-loop", max_bytes=1 << 20)
    assert info.value.file == "s3://bucket/f/0.nc"


def _read_where_head_and_get_disagree(servers, get, read, uri, error):
    """``read(uri, profile)`` of an S3 object whose HEAD says 12 bytes and whose GET answers ``get``,
    under ``max-memory=64MiB``, expected to raise ``error``: ``(pytest's ExceptionInfo, peak bytes traced)``."""
    def respond(method, path, headers):
        return (200, {"Content-Length": "12"}, b"") if method == "HEAD" else get

    endpoint = servers(respond)
    profile = storage.profiles.register({"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint.url}},
                                        protocol="s3")
    tracemalloc.start()
    try:
        with dask.config.set({"daskcfa.limits.max-memory": "64MiB", "daskcfa.storage.retries": 0}):
            with pytest.raises(error) as info:
                read(uri, profile)
        return info, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("answer", ["longer", "chunked"])
def test_bookkeeping_json_on_s3_is_bounded_at_its_get_too(servers, answer):
    """``read_json`` bounded an S3 document by its size at the HEAD, then read the GET's body whole: an
    object replaced meanwhile (or a server whose GET and HEAD disagree) was read and parsed whatever its
    size. Before: 30 MiB of ``[[],...]`` read and parsed, about 730 MiB at the peak, under
    ``max-memory=64MiB``; now a daskcfa error naming the document, before the body."""
    growing = b"[" + b"[]," * (10 << 20) + b"[]]"
    get = _chunked(growing) if answer == "chunked" else (200, {}, growing)  # (made before memory is traced)
    uri = "s3://bucket/t/.daskcfa/manifest.json"
    info, peak = _read_where_head_and_get_disagree(servers, get, storage.read_json, uri, daskcfa.CFAError)
    assert info.value.file == uri
    assert isinstance(info.value, daskcfa.BudgetError if answer == "longer" else daskcfa.errors.StorageError)
    assert answer == "chunked" or "max-memory" in str(info.value)  # (the setting that bounds it)
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB traced at the peak"


def test_a_json_reference_set_on_s3_is_bounded_at_its_get_too(servers):
    """A JSON reference set had its own copy of the bounded read: its size at the HEAD checked, then
    the GET's body read and parsed whole (the gap ``read_json`` had). Now it is read by ``read_json``:
    a body longer than the HEAD said is refused before it is read, a FragmentReadError naming the set."""
    from daskcfa.fragments.reference_sets import open_reference_set

    growing = (200, {}, b"[" + b"[]," * (10 << 20) + b"[]]")
    uri = "s3://bucket/t/refs.json"
    info, peak = _read_where_head_and_get_disagree(servers, growing, open_reference_set, uri, daskcfa.FragmentReadError)
    assert info.value.file == uri and "max-memory" in str(info.value)
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB traced at the peak"


# ---------------------------------------------------------------------------
# Redaction (errors.py)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("parameter", ["access_token", "api_key", "apikey", "client_secret", "X-Amz-Signature"])
def test_a_secret_query_parameter_never_reaches_an_error_or_a_log(http_server, caplog, parameter):
    """Redaction knew a list of parameter names (``token``, ``key``, ``X-Amz-Signature``...), not the
    common ``access_token``, ``api_key`` or ``client_secret``: before, an aggregation URL carrying
    one showed it in the error (and the log of every failed attempt)."""
    secret = "s3cr3t-value-" + parameter.lower()
    url = f"{http_server.url}/missing.nc?{parameter}={secret}&x=1"
    with caplog.at_level("DEBUG", logger="daskcfa"), pytest.raises(daskcfa.CFAError) as info:
        daskcfa.from_cfa(url)
    assert secret not in str(info.value) and "***" in str(info.value)
    assert secret not in caplog.text


def test_a_password_holding_an_at_sign_is_redacted_whole(tmp_path, make_http_server):
    """``http://reader:pa@ss@host/`` is read with the password ``pa@ss`` (URL parsers take the
    authority's last ``@``), but redaction stopped at the first: before, a source given so to
    ``aggregate`` was kept in the version record as ``http://***@ss...@host/f.nc``, beside the data."""
    import netCDF4

    with netCDF4.Dataset(tmp_path / "f.nc", "w") as nc:
        nc.createDimension("time", 3)
        nc.createVariable("time", "f8", ("time",))[:] = [0, 1, 2]
        nc["time"].units = "days since 2000-01-01"
        nc.createVariable("tas", "f4", ("time",))[:] = [1, 2, 3]
    password = "pa@ss-attack13-never-shown"
    server = make_http_server(tmp_path, username="reader", password=password)
    url = str(tmp_path / "out" / "t.nc")
    daskcfa.aggregate([server.url.replace("://", f"://reader:{password}@") + "/f.nc"], url)
    stored = "".join(p.read_text() for p in (tmp_path / "out" / "t" / ".daskcfa" / "versions").glob("*.json"))
    assert "://***@127.0.0.1" in stored and "ss-attack13" not in stored


# ---------------------------------------------------------------------------
# The netCDF-3 header parser and its cache of variable lists (fragments/netcdf3.py)
# ---------------------------------------------------------------------------
def _header(version: int, numrecs: int, dims: list[tuple[str, int]], variables: list[tuple], *,
            tail: bytes = b"") -> bytes:
    """A netCDF-3 file byte by byte (counts 64-bit in CDF-5, offsets from CDF-2 on): ``variables`` as
    ``(name, dimids, type code, begin)``, no attributes; ``tail`` after the header. Any field may lie."""
    count = ">Q" if version == 5 else ">I"
    offset = ">I" if version == 1 else ">Q"

    def n(value: int) -> bytes:
        return struct.pack(count, value)

    def name(text: str) -> bytes:
        raw = text.encode()
        return n(len(raw)) + raw + b"\0" * (-len(raw) % 4)

    out = b"CDF" + bytes([version]) + n(numrecs)
    out += struct.pack(">I", 0x0A) + n(len(dims)) + b"".join(name(d) + n(size) for d, size in dims)
    out += struct.pack(">I", 0) + n(0)  # (no global attributes)
    out += struct.pack(">I", 0x0B) + n(len(variables))
    for var, dimids, code, begin in variables:
        out += name(var) + n(len(dimids)) + b"".join(n(d) for d in dimids)
        out += struct.pack(">I", 0) + n(0) + struct.pack(">I", code) + n(0) + struct.pack(offset, begin)
    return out + tail


def _honest(version: int = 1) -> bytes:
    """A valid file: ``v`` (2, 6) float32 at the end of the header, values 0..11."""
    head = _header(version, 0, [("t", 2), ("x", 6)], [("v", (0, 1), 5, 0)])
    return _header(version, 0, [("t", 2), ("x", 6)], [("v", (0, 1), 5, len(head))],
                   tail=np.arange(12, dtype=">f4").tobytes())


#: hostile headers, each beside the honest one: (version, numrecs, dims, variables, tail)
_DATA = np.arange(12, dtype=">f4").tobytes()
HOSTILE = {
    "begin-past-the-end-cdf1": (1, 0, [("t", 2), ("x", 6)], [("v", (0, 1), 5, 2**32 - 4)], _DATA),
    "begin-2**64-cdf2": (2, 0, [("t", 2), ("x", 6)], [("v", (0, 1), 5, 2**64 - 8)], _DATA),
    "begin-2**63-cdf5": (5, 0, [("t", 2), ("x", 6)], [("v", (0, 1), 5, 2**63)], _DATA),
    "numrecs-2**31": (1, 2**31, [("t", 0), ("x", 6)], [("v", (0, 1), 5, 100)], _DATA),
    "numrecs-2**64-2-cdf5": (5, 2**64 - 2, [("t", 0), ("x", 6)], [("v", (0, 1), 5, 200)], _DATA),
    "dimension-id-out-of-range": (1, 0, [("t", 2), ("x", 6)], [("v", (0, 7), 5, 100)], _DATA),
    "dimension-id-2**32-1": (1, 0, [("t", 2), ("x", 6)], [("v", (0, 2**32 - 1), 5, 100)], _DATA),
    "dimension-2**63-cdf5": (5, 0, [("t", 2), ("x", 2**63)], [("v", (0, 1), 5, 200)], _DATA),
    "rank-2**31": (1, 0, [("t", 2), ("x", 6)], [("v", (0,) * 3, 5, 100)], _DATA),
    "type-of-cdf5-in-cdf1": (1, 0, [("t", 2), ("x", 6)], [("v", (0, 1), 10, 100)], _DATA),
    "type-2**32-1": (1, 0, [("t", 2), ("x", 6)], [("v", (0, 1), 2**32 - 1, 100)], _DATA),
}


def _hostile(case: str) -> bytes:
    version, numrecs, dims, variables, tail = HOSTILE[case]
    data = _header(version, numrecs, dims, variables, tail=tail)
    if case == "rank-2**31":  # (the rank field of ``v`` says 2**31 dimensions follow)
        at = data.index(b"v\0\0\0") + 4
        data = data[:at] + struct.pack(">I", 2**31) + data[at + 4:]
    return data


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_netcdf3_headers_are_fragment_errors_naming_the_fragment(tmp_path, case):
    """Counts, sizes and offsets near 2**31, 2**32, 2**63 and 2**64, numrecs lies, dimension ids and
    type codes out of range: a FragmentError naming file, variable and fragment (never a bare
    OverflowError from a read at an offset past 2**63, never a value), read through an aggregation."""
    url = str(tmp_path / "a.nc")
    daskcfa.to_cfa(np.arange(24, dtype="f4").reshape(4, 6), url, variable="v", dims=("t", "x"),
                   fragment_shape=(2, 6), fragment_format="NETCDF3_CLASSIC")
    victim = sorted((tmp_path / "a").rglob("*.nc"))[1]
    replace_file(victim, _hostile(case))
    forget_open_files()
    with pytest.raises(daskcfa.FragmentError) as info:
        daskcfa.from_cfa(url).compute(scheduler="sync")
    assert info.value.fragment == (1, 0) and info.value.variable.lstrip("/") == "v"
    assert info.value.file.endswith(victim.name)


def test_a_header_claiming_more_than_the_memory_budget_is_not_read_that_far(tmp_path):
    """A 14-byte header whose first name claims 2 GiB, in a 600 MiB (sparse) fragment: the parser read
    the file again, twice as much each time, up to 256 MiB whatever the memory budget (before: 512 MiB
    traced under ``daskcfa.budget.memory=64MiB``, then "malformed"). Now a BudgetError naming the
    fragment once the header passes a quarter of the budget."""
    url = str(tmp_path / "a.nc")
    daskcfa.to_cfa(np.arange(24, dtype="f4").reshape(4, 6), url, variable="v", dims=("t", "x"),
                   fragment_shape=(2, 6), fragment_format="NETCDF3_CLASSIC")
    victim = sorted((tmp_path / "a").rglob("*.nc"))[1]
    victim.unlink()
    with open(victim, "wb") as f:
        f.write(b"CDF\x01" + struct.pack(">IIII", 0, 0x0A, 1, 2**31 - 1) + b"t")
        f.truncate(600 << 20)
    forget_open_files()
    tracemalloc.start()
    try:
        with dask.config.set({"daskcfa.budget.memory": "64MiB"}), pytest.raises(daskcfa.BudgetError) as info:
            daskcfa.from_cfa(url).compute(scheduler="sync")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.fragment == (1, 0) and info.value.file.endswith(victim.name)
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB traced at the peak"


def test_a_cached_variable_list_is_checked_again_against_each_file(tmp_path):
    """The variable list of a benign file, remembered, byte for byte the list of a hostile one whose
    dimensions or record count differ: every check that depends on more than the list's bytes runs
    again (the hostile file is refused, the benign one still reads), in either order, from 8 threads."""
    honest = _honest()
    # the same variable list, at the same place: a dimension made larger than the file holds,
    # or the first made the record dimension with a record count the file does not hold
    wider = _header(1, 0, [("t", 2), ("x", 7)], [("v", (0, 1), 5, honest.index(_DATA))], tail=_DATA)
    records = _header(1, 3, [("t", 0), ("x", 6)], [("v", (0, 1), 5, honest.index(_DATA))], tail=_DATA)
    start = honest.index(struct.pack(">II", 0x0B, 1))  # (the variable list's tag and count)
    for hostile in (wider, records):
        assert hostile[start:] == honest[start:] and hostile[:start] != honest[:start]
    errors: list[BaseException] = []

    def parse(k: int) -> None:
        try:
            for i in range(200):
                if (i + k) % 2:
                    values = NetCDF3File(data=honest).variable("v").read((slice(None), slice(None)))
                    assert values.tolist() == np.arange(12, dtype="f4").reshape(2, 6).tolist()
                else:
                    with pytest.raises(daskcfa.FragmentError, match="truncated"):
                        NetCDF3File(data=(wider, records)[i % 4 // 2])
        except BaseException as exc:  # (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=parse, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors[0]


# ---------------------------------------------------------------------------
# Bookkeeping JSON planted locally (storage/objects.py read_json)
# ---------------------------------------------------------------------------
def _plant(path: Path, what: str) -> None:
    documents = {
        "duplicate-keys": b'{"fragments": {}, "fragments": [1], "generation": "g-0000000000000000"}',
        "nan-and-infinity": b'{"fragments": {"a": {"size": NaN, "mtime": Infinity}}, "generation": -Infinity}',
        "a-million-digit-integer": b'{"generation": ' + b"9" * 1_000_000 + b"}",
        "not-utf-8": b'{"generation": "\xff\xfe\xfa"}',
        "utf-16": json.dumps({"fragments": {"../../x": {}}}).encode("utf-16"),
        "fragments-outside": json.dumps({"fragments": {"../../../etc/passwd": {"size": 1},
                                                       "/etc/passwd": {}, "s3://other/x.nc": {}},
                                         "generation": "../../g-0000000000000000"}).encode(),
    }
    if what in documents:
        path.write_bytes(documents[what])
    elif what == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "link-to-a-fifo":
        os.mkfifo(path.with_name("elsewhere"))
        path.symlink_to(path.with_name("elsewhere"))
    else:
        path.mkdir()


PLANTED = ["duplicate-keys", "nan-and-infinity", "a-million-digit-integer", "not-utf-8", "utf-16",
           "fragments-outside", "link-to-dev-zero", "fifo", "link-to-a-fifo", "directory"]


@pytest.mark.parametrize("document", ["manifest.json", "retired.json"])
@pytest.mark.parametrize("what", PLANTED)
def test_planted_bookkeeping_json_is_never_a_bare_error_nor_a_hang(tmp_path, document, what):
    """What a manifest or retired list may be planted as: an overwrite then succeeds (the document
    ignored as malformed) or fails with a daskcfa error naming it, within a minute; nothing outside the
    dataset is touched, and the data read back are the new ones (or the old ones, when it failed)."""
    url, x = str(tmp_path / "t.nc"), np.arange(24.0).reshape(4, 6)
    keywords = {"variable": "v", "dims": ("a", "b"), "fragment_shape": (2, 6)}
    daskcfa.to_cfa(x, url, **keywords)
    planted = tmp_path / "t" / ".daskcfa" / document
    planted.unlink(missing_ok=True)
    _plant(planted, what)
    outcome: list = []

    def write() -> None:
        try:
            with dask.config.set(scheduler="sync"):
                daskcfa.to_cfa(x + 1, url, mode="w", **keywords)
            outcome.append(None)
        except BaseException as exc:  # (judged below)
            outcome.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    thread.join(60)
    assert outcome, "the write did not end within 60 s"
    if outcome[0] is not None:
        assert isinstance(outcome[0], daskcfa.CFAError), repr(outcome[0])
        assert outcome[0].file is not None and outcome[0].file.endswith(document), outcome[0]
    expected = x if outcome[0] is not None else x + 1
    np.testing.assert_array_equal(daskcfa.from_cfa(url).compute(scheduler="sync"), expected)
    assert Path("/etc/passwd").exists()


# ---------------------------------------------------------------------------
# The cache of resolved local references (storage/uri.py)
# ---------------------------------------------------------------------------
def test_the_same_relative_fragment_names_in_two_directories_each_read_their_own(tmp_path):
    """Two aggregations in different directories whose fragments have the same relative names, read
    in turn (the cache of resolved references is keyed by the aggregation's path too); then a fragment
    of the first replaced by a link to the second's, after it was read: the new bytes are read."""
    import shutil

    import netCDF4

    x = np.arange(24.0).reshape(4, 6)
    daskcfa.to_cfa(x, str(tmp_path / "a" / "t.nc"), variable="v", dims=("p", "q"), fragment_shape=(2, 6))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for fragment in (tmp_path / "b").rglob("t.v.*.nc"):
        with netCDF4.Dataset(fragment, "a") as nc:
            nc["v"][:] = -nc["v"][:]
    for _ in range(2):
        np.testing.assert_array_equal(daskcfa.from_cfa(str(tmp_path / "a" / "t.nc")).compute(), x)
        np.testing.assert_array_equal(daskcfa.from_cfa(str(tmp_path / "b" / "t.nc")).compute(), -x)
    first = sorted((tmp_path / "a").rglob("t.v.*.nc"))[0]
    first.unlink()
    first.symlink_to(tmp_path / "b" / first.relative_to(tmp_path / "a"))
    np.testing.assert_array_equal(daskcfa.from_cfa(str(tmp_path / "a" / "t.nc")).compute(), np.r_[-x[:2], x[2:]])


# ---------------------------------------------------------------------------
# Point-series batches on a distributed cluster (graph/batched.py)
# ---------------------------------------------------------------------------
def test_a_point_series_on_a_cluster_names_the_fragment_that_fails_mid_batch(tmp_path):
    """Batches of up to 32 fragments on a cluster: a fragment damaged, then missing, in the middle of a
    batch is named by the error (not the batch's first); a cluster of 100,000 threads keeps one task a
    fragment; a closed cluster's client still the default falls back at once to the threaded rule."""
    from distributed import Client, LocalCluster

    from builders import build_cf113, make_truth

    built = build_cf113(tmp_path, make_truth((320, 4, 4), "f4", seed=11, masked=0.2), ("time", "lat", "lon"),
                        ((1,) * 320, (4,), (4,)))
    victim = Path(built.fragment_uris[(37, 0, 0)][0])
    victim = victim if victim.is_absolute() else built.path.parent / victim
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):
        series = daskcfa.from_cfa(str(built.path))[:, 2, 1]
        assert max(series.chunks[0]) > 1  # (batched)
        replace_file(victim, victim.read_bytes()[:100])
        with pytest.raises(daskcfa.FragmentReadError) as damaged:
            series.compute()
        victim.unlink()
        with pytest.raises(daskcfa.MissingFragmentError) as missing:  # (other keys: not the erred tasks again)
            daskcfa.from_cfa(str(built.path))[:, 2, 2].compute()
        for info in (damaged, missing):
            assert info.value.fragment == (37, 0, 0) and info.value.file.endswith(victim.name)
    with LocalCluster(n_workers=1, threads_per_worker=100_000, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):
        assert daskcfa.from_cfa(str(built.path), missing="fill")[:, 2, 1].numblocks == (320,)
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
    client = Client(cluster)
    try:
        cluster.close()
        with dask.config.set(num_workers=1):
            assert daskcfa.from_cfa(str(built.path), missing="fill")[:, 2, 1].numblocks == (320 // 8,)
    finally:
        client.close()
