"""Secrets stay secret through a whole distributed read *and write*, at DEBUG level.

Extends tests/storage/test_policy.py (which covers reads, graphs and errors)
with ``to_cfa`` on a real LocalCluster: every logger of distributed, daskcfa,
fsspec, s3fs, botocore, aiohttp... at DEBUG in the client and in every
worker, plus the workers', nannies' and scheduler's own logs. The secret
must appear in none of them, in no exception text (a failed write, a failed
read, with tracebacks), in no pickled task graph (read and write) and in no
repr -- whether the credentials come from ``storage_options`` or from the
standard AWS environment variables.
"""

from __future__ import annotations

import base64
import itertools
import logging
import os
import pickle
import secrets
import traceback

import cloudpickle
import dask.array as da
import numpy as np
import pytest

import daskcfa
from builders import assert_matches
from secret_helpers import (LOGGERS, _start_capture, _stop_capture, _unique_options, _worker_lines,
                            _worker_start_capture)

from .conftest import truth


def _text_of(err: BaseException) -> str:
    return "".join(traceback.format_exception(err)) + repr(err) + str(err) + repr(err.args)


def _graph_blob(collection) -> bytes:
    graph = dict(collection.__dask_graph__())
    return b"".join(pickle.dumps(k) + cloudpickle.dumps(v) for k, v in graph.items()) + cloudpickle.dumps(collection)


@pytest.fixture
def debug_everywhere():
    handler, saved = _start_capture(LOGGERS)
    yield handler.lines
    _stop_capture(handler, saved)


@pytest.mark.parametrize("credentials", ["storage_options", "environment"])
def test_distributed_write_and_read_leak_no_secret(s3_server, debug_everywhere, monkeypatch, credentials):
    from distributed import Client, LocalCluster

    secret, key = s3_server.secret, s3_server.key
    if credentials == "environment":  # the standard AWS variables, inherited by the worker processes
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        options = {"client_kwargs": {"endpoint_url": s3_server.endpoint_url}, "use_listings_cache": False,
                   "config_kwargs": {"read_timeout": 61.25}}
    else:
        options = _unique_options(s3_server)
    bucket = s3_server.new_bucket("secrets")
    url = f"s3://{bucket}/out/tas.nca"
    expected = truth((8, 6, 5), seed=59)
    data = da.from_array(expected, chunks=(2, 6, 5))
    texts: list[str] = []
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None, host="127.0.0.1",
                      silence_logs=logging.DEBUG) as cluster, Client(cluster) as client:
        client.run(_worker_start_capture)
        delayed = daskcfa.to_cfa(data, url, variable="tas", dims=("time", "lat", "lon"), attrs={"units": "K"},
                                 fragment_shape=(2, 6, 5), storage_options=options, compute=False)
        blobs = [_graph_blob(delayed)]
        texts += [repr(delayed), repr(dict(delayed.__dask_graph__()))]
        assert client.compute(delayed).result() == url

        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        blobs.append(_graph_blob(x))
        ds = daskcfa.open_cfa(url, storage_options=options)
        texts += [repr(x), repr(ds), repr(ds["tas"]), x._repr_html_()]
        assert_matches(x.compute(), expected)

        # failures, raised in the workers: a write into a bucket that does not exist, a fragment gone
        with pytest.raises(daskcfa.CFAError) as write_error:
            daskcfa.to_cfa(data, f"s3://{bucket}-missing/out/tas.nca", variable="tas", dims=("time", "lat", "lon"),
                           fragment_shape=(2, 6, 5), storage_options=options)
        fs = s3_server.filesystem()
        fs.rm(next(p for p in fs.find(f"{bucket}/out/tas") if p.endswith("/tas.tas.1.0.0.nc")))
        with pytest.raises(daskcfa.MissingFragmentError) as read_error:
            x.compute()
        texts += [_text_of(write_error.value), _text_of(read_error.value)]
        blobs += [pickle.dumps(write_error.value), pickle.dumps(read_error.value)]

        worker_lines = [line for lines in client.run(_worker_lines).values() for line in lines]
        logs = [msg for records in client.get_worker_logs().values() for _, msg in records]
        logs += [msg for records in client.get_worker_logs(nanny=True).values() for _, msg in records]
        logs += [msg for _, msg in client.get_scheduler_logs()]

    assert len(worker_lines) > 50 and any("put_object" in line for line in worker_lines), \
        "the workers' DEBUG logs did not capture the uploads"
    assert any("get_object" in line or "GetObject" in line for line in worker_lines + debug_everywhere)
    everything = "\n".join(worker_lines + logs + list(debug_everywhere) + texts)
    assert secret not in everything
    for blob in blobs:
        assert secret.encode() not in blob
    print(f"secrets: {len(worker_lines)} worker log lines, {len(debug_everywhere)} client log lines, "
          f"{len(logs)} cluster log records, {sum(map(len, blobs)):,} bytes of pickled graphs and errors checked")


def test_secret_in_a_url_is_redacted_from_errors_and_warnings(tmp_path, http_server):
    """Credentials embedded in a URI (``user:pw@`` or a signed query) never reach a message."""
    from builders import build
    from remote_helpers import rewrite_uris

    from .conftest import DIMS, SIZES, VICTIM

    secret = "pw-embedded-0123456789"
    built = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    host = http_server.url.split("://")[1]
    rewrite_uris(built.path, built.names["uris"],
                 lambda u: f"http://reader:{secret}@{host}/gone.nc?X-Amz-Signature={secret}"
                 if u == built.fragment_uris[VICTIM][0] else u)
    # refused by a confining policy: the refusal quotes the URI, redacted
    x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=[str(tmp_path)])
    with pytest.raises(daskcfa.UnsafeURIError) as refused:
        x.compute(scheduler="sync")
    # allowed, but not there: the error, and with missing="fill" the warning, name it redacted
    x = daskcfa.from_cfa(str(built.path), "tas")
    with pytest.raises(daskcfa.MissingFragmentError) as missing:
        x.compute(scheduler="sync")
    with pytest.warns(daskcfa.CFAWarning, match="gone.nc") as record:
        daskcfa.from_cfa(str(built.path), "tas", missing="fill").compute(scheduler="sync")
    for text in (_text_of(refused.value), _text_of(missing.value), *(str(w.message) for w in record)):
        assert secret not in text and "***" in text


# -- every credential field, at DEBUG level (issue 15, items 3-5) ---------------------------------------------

def _s3_aggregation(s3_server, tmp_path, seed: int):
    """A CF-1.13 aggregation uploaded to a fresh bucket; (its url, numpy ground truth, built, base url)."""
    from builders import build
    from remote_helpers import upload

    from .conftest import DIMS, SIZES

    built = build("CF-1.13", tmp_path / "ds", truth(seed=seed), DIMS, SIZES)
    base = upload(s3_server.filesystem(), tmp_path / "ds", s3_server.new_bucket("secrets"), "ds")
    return f"{base}/{built.path.name}", built.expected, built, base


def _credential_options(s3_server, field: str) -> tuple[dict, list[str]]:
    """Storage options giving the credentials through ``field``, and the values that must never be seen."""
    unique = {"config_kwargs": {"read_timeout": 70 + next(_COUNTER) + 0.25}, "use_listings_cache": False}
    endpoint = {"endpoint_url": s3_server.endpoint_url}
    if field == "key_secret":
        return {**unique, "key": s3_server.key, "secret": s3_server.secret, "client_kwargs": endpoint}, \
            [s3_server.key, s3_server.secret]
    if field == "client_kwargs":
        return {**unique, "client_kwargs": {**endpoint, "aws_access_key_id": s3_server.key,
                                            "aws_secret_access_key": s3_server.secret}}, \
            [s3_server.key, s3_server.secret]
    token = f"session-token-{next(_COUNTER)}-{secrets.token_urlsafe(24)}"
    return {**unique, "key": s3_server.key, "secret": s3_server.secret, "token": token, "client_kwargs": endpoint}, \
        [s3_server.key, s3_server.secret, token]


_COUNTER = itertools.count()


@pytest.mark.parametrize("field", ["key_secret", "client_kwargs", "token"])
def test_no_credential_field_in_debug_logs_threaded(s3_server, tmp_path, debug_everywhere, field):
    """botocore logs request headers and canonical requests at DEBUG level (the
    session token, the access key in ``Credential=``): daskcfa redacts every
    credential it holds from the process's log records."""
    url, expected, _, _ = _s3_aggregation(s3_server, tmp_path, seed=61)
    debug_everywhere.clear()  # (the test's own uploads, before daskcfa was given any credentials)
    options, hidden = _credential_options(s3_server, field)
    if field == "token":  # SeaweedFS knows no session tokens: refused, clearly
        with pytest.raises(daskcfa.StorageError) as refused:
            daskcfa.from_cfa(url, "tas", storage_options=options)
        texts = [_text_of(refused.value)]
    else:
        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        assert_matches(x.compute(scheduler="threads"), expected)
        texts = []
    botocore = [line for line in debug_everywhere if line.startswith(("botocore", "aiobotocore"))]
    assert any("Authorization" in line or "authorization" in line for line in botocore), \
        "botocore's DEBUG lines with the request headers were not captured"
    everything = "\n".join(list(debug_everywhere) + texts)
    for value in hidden:
        assert value not in everything
    assert "***" in everything
    print(f"secrets ({field}): {len(hidden)} values searched in {len(debug_everywhere):,} DEBUG lines "
          f"({len(botocore):,} of botocore), {everything.count('***')} redactions")


@pytest.mark.parametrize("field", ["key_secret", "client_kwargs"])
def test_no_credential_field_in_debug_logs_of_the_blocking_get(s3_server, tmp_path, debug_everywhere, field):
    """Large objects the lean GET leaves to it (here, TCP keep-alive asked for) come down through
    daskcfa's own botocore client (storage/direct.py; the event loop held throughout), whose DEBUG
    lines (botocore's request headers, urllib3's requests) are redacted as s3fs's are; nor is a
    credential in its repr. (The lean GET's own DEBUG lines: test_lean_get_attacks.py.)"""
    from remote_helpers import event_loop_held, large_fragments

    url, data = large_fragments(tmp_path, s3_server.filesystem(), s3_server.new_bucket("secrets"), "ds", seed=67)
    options, hidden = _credential_options(s3_server, field)
    options["config_kwargs"] = {**options["config_kwargs"], "tcp_keepalive": True}
    x = daskcfa.from_cfa(url, "tas", storage_options=options)
    debug_everywhere.clear()
    with event_loop_held() as held_throughout:
        got = x.compute(scheduler="threads")
        assert held_throughout()
    np.testing.assert_array_equal(np.ma.getdata(got), data)
    from daskcfa.storage import direct

    made = [client for _, client in direct._CLIENTS.values() if client is not None]
    lines = list(debug_everywhere)
    assert any(line.startswith("botocore") and "uthorization" in line for line in lines), \
        "the blocking client's DEBUG lines with the request headers were not captured"
    assert any(line.startswith("urllib3") and "GET /" in line for line in lines)
    everything = "\n".join(lines + [repr(c) for c in made] + [repr(c.meta.config) for c in made])
    for value in hidden:
        assert value not in everything
    assert "***" in everything


def _config_texts(dask_worker=None) -> list[str]:
    """This process's dask config as repr and as ``dask.config.serialize`` (what SSH clusters pass on), decoded too."""
    import dask.config

    serialized = dask.config.serialize(dask.config.config)
    return [repr(dask.config.config), serialized, repr(dask.config.deserialize(serialized))]


def test_credentials_never_in_dask_config_dumps_or_worker_logs(s3_server, tmp_path, debug_everywhere):
    """Storage options reach workers through the plugin only: not in dask config
    (client or workers, as repr or serialised), not in a cluster-state dump,
    not in worker logs at DEBUG, not in pickled graphs -- and workers that
    join later can still read."""
    from distributed import Client, LocalCluster

    from remote_helpers import rewrite_uris

    url, expected, built, base = _s3_aggregation(s3_server, tmp_path, seed=67)
    # the same fragments from a local aggregation file: the token goes to the workers only
    rewrite_uris(built.path, built.names["uris"], lambda u: f"{base}/{u}")
    debug_everywhere.clear()  # (the test's own uploads)
    options, hidden = _credential_options(s3_server, "token")
    token_options = options
    options, _ = _credential_options(s3_server, "key_secret")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None, host="127.0.0.1",
                      silence_logs=logging.DEBUG) as cluster, Client(cluster) as client:
        client.run(_worker_start_capture)
        x = daskcfa.from_cfa(url, "tas", storage_options=options)
        assert_matches(x.compute(), expected)
        with pytest.raises(daskcfa.StorageError):  # (refused by the server: SeaweedFS knows no session tokens)
            daskcfa.from_cfa(str(built.path), "tas", storage_options=token_options,
                             allowed_locations=[base + "/"]).compute()
        # a worker started now gets the options from the scheduler's plugin
        first = set(client.scheduler_info()["workers"])
        cluster.scale(2)
        client.wait_for_workers(2, timeout=120)
        (late,) = set(client.scheduler_info()["workers"]) - first
        client.run(_worker_start_capture, workers=[late])
        assert_matches(client.compute(x, workers=[late]).result(), expected)
        # write through the cluster, with the options, and read it back on the late worker
        written = daskcfa.to_cfa(da.from_array(expected, chunks=(2, 4, 5)), url.rsplit("/", 2)[0] + "/out/tas.nca",
                                 variable="tas", dims=("time", "lat", "lon"), fragment_shape=(2, 4, 5),
                                 storage_options=options)
        y = daskcfa.from_cfa(written, "tas", storage_options=options)
        assert_matches(client.compute(y, workers=[late]).result(), expected)

        texts = _config_texts() + [t for ts in client.run(_config_texts).values() for t in ts]
        dump = tmp_path / "cluster-state"
        client.dump_cluster_state(str(dump), format="yaml")
        texts.append((tmp_path / "cluster-state.yaml").read_text())
        texts += [line for lines in client.run(_worker_lines).values() for line in lines]
        texts += [msg for records in client.get_worker_logs().values() for _, msg in records]
        texts += [msg for records in client.get_worker_logs(nanny=True).values() for _, msg in records]
        texts += [msg for _, msg in client.get_scheduler_logs()]
        blobs = [_graph_blob(x), _graph_blob(y)]
    texts += list(debug_everywhere)
    assert sum(len(t) for t in texts) > 100_000, "too little was searched"
    everything = "\n".join(texts)
    for value in hidden:
        assert value not in everything
        for blob in blobs:
            assert value.encode() not in blob
    print(f"secrets: {len(hidden)} values searched in dask config (client, 2 workers, serialised), a "
          f"{(tmp_path / 'cluster-state.yaml').stat().st_size:,}-byte cluster dump, "
          f"{sum(map(len, texts)):,} characters of logs and config, {sum(map(len, blobs)):,} bytes of graphs")


def test_password_in_an_http_url_stays_out_of_reprs_graphs_and_info(tmp_path, make_http_server):
    """``https://user:pw@host/agg.nc``: the login moves into the storage profile
    (for that origin only); reads still authenticate against a server that
    requires it; reprs, pickled graphs and ``daskcfa info --json`` never show it."""
    import json
    import subprocess
    import sys

    from builders import build

    from .conftest import DIMS, SIZES

    password = f"url-pw-{secrets.token_urlsafe(18)}"
    (tmp_path / "www").mkdir()
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(seed=71), DIMS, SIZES)
    server = make_http_server(tmp_path / "www", username="reader", password=password)
    url = server.url_for("ds/" + built.path.name).replace("://", f"://reader:{password}@", 1)

    x = daskcfa.from_cfa(url, "tas")
    ds = daskcfa.open_cfa(url)
    assert_matches(x.compute(scheduler="threads"), built.expected)
    assert_matches(ds["tas"].data.compute(scheduler="threads"), built.expected)
    info = subprocess.run([sys.executable, "-m", "daskcfa", "info", url, "--json"], capture_output=True, text=True,
                          timeout=300)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["url"] == server.url_for("ds/" + built.path.name)
    texts = [repr(x), repr(ds), repr(ds["tas"]), x._repr_html_(), info.stdout, info.stderr,
             repr(daskcfa.describe(url))]
    blobs = [_graph_blob(x), _graph_blob(ds["tas"].data), cloudpickle.dumps(ds)]
    # a wrong password is refused by the server: a daskcfa error, without the password
    wrong = url.replace(password, password[::-1])
    with pytest.raises(daskcfa.CFAError) as refused:
        daskcfa.open_cfa(wrong)
    texts.append(_text_of(refused.value))
    for text in texts:
        assert password not in text and password[::-1] not in text
    for blob in blobs:
        assert password.encode() not in blob


def test_password_in_a_fragment_uri_stays_out_of_the_graph(tmp_path, make_http_server):
    """Fragment URIs ``http://user:pw@host/f.nc`` written in the aggregation file itself: the read
    authenticates, and the pickled graph (sent to a scheduler, logged at DEBUG) must not hold the password."""
    from builders import build
    from remote_helpers import rewrite_uris

    from .conftest import DIMS, SIZES

    password = f"frag-pw-{secrets.token_urlsafe(18)}"
    (tmp_path / "www").mkdir()
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(seed=72), DIMS, SIZES)
    server = make_http_server(tmp_path / "www", username="reader", password=password)
    files = {u: built.fragment_files[index] for index, uris in built.fragment_uris.items() for u in uris}
    rewrite_uris(built.path, built.names["uris"], lambda u: server.url_for(
        str(files[u].relative_to(tmp_path / "www"))).replace("://", f"://reader:{password}@", 1))
    x = daskcfa.from_cfa(str(built.path), "tas")
    assert_matches(x.compute(scheduler="threads"), built.expected)  # (the login is used)
    assert password not in repr(x)
    assert password.encode() not in _graph_blob(x)


def _fragments_behind_a_login(tmp_path, make_http_server, seed: int):
    """A local CF-1.13 aggregation whose fragment URIs are ``http://reader:<pw>@host/...`` on a
    server requiring that login: (built, the password, the server)."""
    from builders import build
    from remote_helpers import rewrite_uris

    from .conftest import DIMS, SIZES

    password = f"frag-pw-{secrets.token_urlsafe(18)}"
    (tmp_path / "www").mkdir()
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(seed=seed), DIMS, SIZES)
    server = make_http_server(tmp_path / "www", username="reader", password=password)
    files = {u: built.fragment_files[index] for index, uris in built.fragment_uris.items() for u in uris}
    rewrite_uris(built.path, built.names["uris"], lambda u: server.url_for(
        str(files[u].relative_to(tmp_path / "www"))).replace("://", f"://reader:{password}@", 1))
    return built, password, server


def test_password_in_fragment_uris_stays_out_of_info_errors_logs_and_written_files(tmp_path, make_http_server,
                                                                                    caplog):
    """The login of fragment URIs in the aggregation file authenticates ``open_cfa`` and
    ``describe(storage_size=True)``; it is in no repr, pickled dataset, ``daskcfa info --json``,
    error (a fragment gone; ``to_references``' refusal after reading every fragment), DEBUG log
    record, nor in the file ``relocate`` writes from the aggregation (it holds the URIs without it)."""
    import json
    import subprocess
    import sys

    import netCDF4

    from .conftest import VICTIM

    caplog.set_level(logging.DEBUG)
    built, password, server = _fragments_behind_a_login(tmp_path, make_http_server, seed=74)
    ds = daskcfa.open_cfa(str(built.path))
    assert_matches(ds["tas"].data.compute(scheduler="threads"), built.expected)
    summary = daskcfa.describe(str(built.path), storage_size=True)
    assert summary.stored_bytes > 0 and not summary.missing_files  # (sized with the login)
    info = subprocess.run([sys.executable, "-m", "daskcfa", "info", str(built.path), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)
    relocated = daskcfa.relocate(str(built.path), {"http://": "http://"}, target=str(tmp_path / "moved.nc"))
    with netCDF4.Dataset(relocated) as nc:
        written = "\n".join(str(u) for v in nc.variables.values() if v.dtype is str for u in np.ravel(v[...]))
    assert server.url_for("ds") in written  # (the URIs, without the login)
    with pytest.raises(daskcfa.CFAError):  # (the server refuses a read without it)
        daskcfa.from_cfa(relocated, "tas").compute(scheduler="sync")
    login = {"headers": {"Authorization": "Basic " + base64.b64encode(f"reader:{password}".encode()).decode()}}
    again = daskcfa.from_cfa(relocated, "tas", storage_options={server.url_for(""): login})  # (given again)
    assert_matches(again.compute(scheduler="sync"), built.expected)
    with pytest.raises(daskcfa.ReferencesError) as refused:  # (irregular HDF5 chunks; each fragment read first)
        daskcfa.to_references(str(built.path))
    references = _text_of(refused.value)
    assert server.url_for("ds") in references
    (built.fragment_files[VICTIM]).unlink()
    with pytest.raises(daskcfa.MissingFragmentError) as missing:
        daskcfa.from_cfa(str(built.path), "tas").compute(scheduler="sync")
    texts = [repr(ds), repr(ds["tas"]), repr(summary), str(summary), info.stdout, info.stderr, written, references,
             _text_of(missing.value)] + [record.getMessage() for record in caplog.records]
    assert len(caplog.records) > 10
    assert not [text for text in texts if password in text or "reader:" in text]
    assert password.encode() not in cloudpickle.dumps(ds) + _graph_blob(ds["tas"].data)


def _read_in_fresh_pythons(url: str, seeds: range) -> list[str]:
    """Read the aggregation in fresh interpreters with different string hashing (set orders): what each
    printed, ``ok`` or the error's type and text."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, daskcfa\ntry:\n    daskcfa.from_cfa(sys.argv[1], 'tas').compute(scheduler='sync')\n"
            "    print('ok')\nexcept daskcfa.CFAError as exc:\n    print(type(exc).__name__, exc)\n")
    done = [subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": os.pathsep.join(
                               [str(Path(daskcfa.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])})
            for seed in seeds]
    assert all(d.returncode == 0 for d in done), [d.stderr[-2000:] for d in done]
    return [d.stdout.strip() for d in done]


def test_different_logins_for_one_origin_the_last_is_sent(tmp_path, make_http_server):
    """Fragment URIs with different logins for one origin: one login per origin is sent, the last
    fragment's in the file's order, in every run (before: whichever a set's order put last, so a run
    read or failed by chance); fragments needing another are refused by the server, a CFAError without
    any of the passwords (storage.md)."""
    from builders import build
    from remote_helpers import rewrite_uris

    from .conftest import DIMS, SIZES

    password = f"frag-pw-{secrets.token_urlsafe(18)}"
    wrong = f"other-pw-{secrets.token_urlsafe(18)}"
    (tmp_path / "www").mkdir()
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(seed=75), DIMS, SIZES)
    server = make_http_server(tmp_path / "www", username="reader", password=password)
    last = max(built.fragment_files)  # (the grid's last fragment: the last URI in the file)
    files = {u: index for index, uris in built.fragment_uris.items() for u in uris}

    def logins(pick):
        rewrite_uris(built.path, built.names["uris"], lambda u: server.url_for(
            str(built.fragment_files[files[u]].relative_to(tmp_path / "www"))).replace(
            "://", f"://reader:{pick(files[u])}@", 1))

    original = built.path.read_bytes()
    logins(lambda index: password if index == last else wrong)  # every fragment but the last: the wrong one
    assert _read_in_fresh_pythons(str(built.path), range(3)) == ["ok"] * 3
    assert_matches(daskcfa.from_cfa(str(built.path), "tas").compute(scheduler="threads"), built.expected)
    built.path.write_bytes(original)
    logins(lambda index: wrong if index == last else password)  # only the last: every fragment refused
    printed = _read_in_fresh_pythons(str(built.path), range(3))
    assert all(p.startswith("StorageError access denied (HTTP 401)") and ", fragment (" in p for p in printed), printed
    assert not [p for p in printed if password in p or wrong in p or "reader:" in p]


def test_signed_query_of_the_aggregation_url_stays_out_of_reprs_and_logs(tmp_path, make_http_server, caplog):
    """A presigned aggregation URL (``?X-Amz-Signature=...``) is its own address, so it is read with
    it; but ``repr`` of the dataset and of ``describe``'s summary printed it, and so did fsspec's
    DEBUG log records (redaction knew only credentials given as options)."""
    from builders import build

    from .conftest import DIMS, SIZES

    caplog.set_level(logging.DEBUG)
    signature = f"sig-{secrets.token_hex(12)}"
    (tmp_path / "www").mkdir()
    built = build("CF-1.13", tmp_path / "www" / "ds", truth(seed=73), DIMS, SIZES)
    server = make_http_server(tmp_path / "www")
    url = server.url_for("ds/" + built.path.name) + f"?X-Amz-Signature={signature}"
    ds = daskcfa.open_cfa(url)
    assert_matches(ds["tas"].data.compute(scheduler="threads"), built.expected)
    texts = [repr(ds), repr(daskcfa.describe(url)), str(daskcfa.describe(url))]
    texts += [record.getMessage() for record in caplog.records]
    assert any("X-Amz-Signature=" in text for text in texts)  # (the URL is shown, redacted)
    assert not [text for text in texts if signature in text]


def test_a_login_given_with_a_source_is_not_written_into_the_aggregation(tmp_path, make_http_server):
    """``aggregate`` over ``http://reader:<pw>@host/f.nc`` authenticates its reads with that login, but
    the file it writes holds the fragment URI without it (before: the password in clear, in a file
    made to be shared); whoever reads the file gives the login again, as for ``relocate``."""
    import netCDF4

    password = f"agg-pw-{secrets.token_urlsafe(18)}"
    (tmp_path / "www").mkdir()
    for k in range(2):
        with netCDF4.Dataset(tmp_path / "www" / f"f{k}.nc", "w") as nc:
            nc.createDimension("time", 3)
            nc.createVariable("time", "f8", ("time",))[:] = np.arange(3 * k, 3 * k + 3)
            nc["time"].units = "days since 2000-01-01"
            nc.createVariable("tas", "f4", ("time",))[:] = np.arange(3 * k, 3 * k + 3) + 0.5
    server = make_http_server(tmp_path / "www", username="reader", password=password)
    sources = [server.url_for(f"f{k}.nc").replace("://", f"://reader:{password}@", 1) for k in range(2)]
    target = daskcfa.aggregate(sources, str(tmp_path / "agg.nc"))
    written = (tmp_path / "agg.nc").read_bytes()
    assert password.encode() not in written and b"reader:" not in written
    assert server.url_for("f1.nc").encode() in written  # (the URI, without the login)
    with pytest.raises(daskcfa.CFAError):  # (the server refuses a read without it)
        daskcfa.from_cfa(target, "tas").compute(scheduler="sync")
    login = {"headers": {"Authorization": "Basic " + base64.b64encode(f"reader:{password}".encode()).decode()}}
    again = daskcfa.from_cfa(target, "tas", storage_options={server.url_for(""): login})
    np.testing.assert_array_equal(again.compute(scheduler="sync"), np.arange(6) + 0.5)
