"""FIFOs and devices where files are expected: refused at once, never read.

Opening a FIFO for reading waits for a writer, for ever (the reader hung,
even inside ``allowed_locations``); a device such as ``/dev/zero`` never
ends. Only regular files are opened, in every path that opens local files:
both read engines, the size and existence checks, verify, aggregate (scan),
refragment, relocate, info and the aggregation file itself. Links are
followed before the check.

Each case runs in a forked child process with a deadline, killed if it is
still running then: a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from pathlib import Path

import dask
import numpy as np
import pytest

import daskcfa
from builders import assert_matches, build
from daskcfa import storage
from remote_helpers import rewrite_uris

from .conftest import DIMS, SIZES, VICTIM, forget_open_files, truth

#: Seconds a refusal may take at most (observed: milliseconds; the machine is shared).
DEADLINE = 20.0
FIFO, CHARACTER_DEVICE = "a FIFO", "a character device"


def _within_deadline(call):
    """What ``call()`` gave in a forked child: ``("value", v)`` or ``("error", exc)``,
    and the warnings it issued; fails if it did not finish before the deadline."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def child():  # (dask's thread pool, if the parent made one, did not survive the fork)
        with warnings.catch_warnings(record=True) as caught, dask.config.set(scheduler="synchronous"):
            warnings.simplefilter("always")
            try:
                outcome = ("value", call())
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                outcome = ("error", exc)
        try:
            sender.send((outcome, [str(w.message) for w in caught]))
        except Exception as exc:  # (an exception that does not pickle)
            sender.send((("error", RuntimeError(f"{outcome[1]!r} ({exc})")), []))

    process = context.Process(target=child, daemon=True)
    process.start()
    try:
        if not receiver.poll(DEADLINE):
            pytest.fail(f"blocked for more than {DEADLINE:.0f} s on a special file")
        return receiver.recv()
    finally:
        process.kill()
        process.join(10)


def _raised(call) -> BaseException:
    (kind, value), _ = _within_deadline(call)
    assert kind == "error", f"no error: {value!r}"
    return value


@pytest.fixture
def tree(tmp_path):
    """tmp/archive/ds: a local aggregation confined to tmp/archive."""
    built = build("CF-1.13", tmp_path / "archive" / "ds", truth(), DIMS, SIZES)
    return built, tmp_path / "archive"


def _fifo(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return str(path)


def _make(kind: str, built, root: Path) -> tuple[str, list[str]]:
    """Put a special file in place of the victim fragment: (what it is, allowed_locations)."""
    victim = built.fragment_files[VICTIM]
    allowed = [str(root)]
    if kind == "fifo":
        _fifo(victim)
        return FIFO, allowed
    if kind == "link-to-fifo":
        fifo = _fifo(root / "pipes" / "p")
        victim.unlink()
        victim.symlink_to(fifo)
        return FIFO, allowed
    device = "/dev/urandom" if kind == "dev-urandom" else "/dev/zero"
    if kind == "link-to-dev-zero":
        victim.unlink()
        victim.symlink_to(device)
    else:  # the aggregation names the device itself
        original = built.fragment_uris[VICTIM][0]
        rewrite_uris(built.path, built.names["uris"], lambda u: device if u == original else u)
    return CHARACTER_DEVICE, [*allowed, "/dev"]


KINDS = ["fifo", "link-to-fifo", "dev-zero", "dev-urandom", "link-to-dev-zero"]


@pytest.mark.parametrize("engine", ["auto", "netcdf4"])
@pytest.mark.parametrize("kind", KINDS)
def test_special_fragment_is_refused_fast(tree, kind, engine):
    built, root = tree
    what, allowed = _make(kind, built, root)
    x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=allowed)
    with dask.config.set({"daskcfa.io.engine": engine}):
        err = _raised(lambda: x.compute(scheduler="sync"))
    assert isinstance(err, daskcfa.FragmentReadError), f"{type(err).__name__}: {err}"
    assert f"not a regular file ({what})" in str(err)
    assert err.fragment == VICTIM and err.variable.lstrip("/") == "tas"
    # missing="fill": an unreadable fragment, read as missing data
    forget_open_files()
    filled = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=allowed, missing="fill")
    (kind, value), warned = _within_deadline(lambda: filled.compute(scheduler="sync"))
    assert any("not a regular file" in w for w in warned), warned
    expected = built.expected.copy()
    expected[2:5, 0:4, 2:5] = np.ma.masked
    assert_matches(value, expected)


def test_aggregation_file_that_is_a_fifo(tmp_path):
    fifo = _fifo(tmp_path / "agg.nc")
    for call in (lambda: daskcfa.open_cfa(fifo), lambda: daskcfa.describe(fifo),
                 lambda: daskcfa.relocate(fifo, {"a/": "b/"}, target=str(tmp_path / "out.nc"))):
        err = _raised(call)
        assert isinstance(err, daskcfa.StorageError) and "not a regular file (a FIFO)" in str(err), err
        assert err.file == fifo


def test_storage_reads_refuse_special_files(tmp_path):
    fifo = _fifo(tmp_path / "p.nc")
    for special in (fifo, "/dev/zero"):
        for call in (storage.read_whole, storage.open_file, storage.stat, storage.local_stat):
            err = _raised(lambda: call(special))
            assert isinstance(err, daskcfa.StorageError) and "not a regular file" in str(err), (call, err)
    assert storage.irregular(os.stat(tmp_path).st_mode) == "a directory"
    assert storage.irregular(os.stat(__file__).st_mode) is None


def test_verify_reports_a_fifo_fragment(tree):
    built, root = tree
    _, allowed = _make("fifo", built, root)
    (_, report), _ = _within_deadline(lambda: daskcfa.verify(str(built.path), allowed_locations=allowed))
    assert [(p.index, p.kind) for p in report.problems] == [(VICTIM, "unreadable")], report.problems
    assert "not a regular file (a FIFO)" in report.problems[0].message


def test_sizing_a_fifo_fragment(tree):
    built, root = tree
    _make("fifo", built, root)
    err = _raised(lambda: daskcfa.describe(str(built.path), storage_size=True))
    assert isinstance(err, daskcfa.StorageError) and "not a regular file (a FIFO)" in str(err)
    assert err.fragment == VICTIM and err.variable.lstrip("/") == "tas"


def test_refragment_source_with_a_fifo_fragment(tree, tmp_path):
    built, root = tree
    _make("fifo", built, root)
    err = _raised(lambda: daskcfa.refragment(str(built.path), str(tmp_path / "out" / "agg.nc"),
                                             fragment_shape={"time": 3}))
    assert isinstance(err, daskcfa.FragmentReadError) and "not a regular file (a FIFO)" in str(err), err
    assert err.fragment == VICTIM


def test_aggregate_files_with_a_fifo_among_them(tree, tmp_path):
    built, _ = tree
    files = sorted(str(p) for p in built.fragment_files.values())
    fifo = _fifo(tmp_path / "extra.nc")
    err = _raised(lambda: daskcfa.aggregate([*files, fifo], str(tmp_path / "agg.nc")))
    assert isinstance(err, daskcfa.AggregationError) and "not a regular file (a FIFO)" in str(err), err
    assert "extra.nc" in str(err)
