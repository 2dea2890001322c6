"""The target disk is full or refuses writes: a clear error, nothing half-committed.

Real kernel errors, no mocks:
- disk full: a 2 MiB tmpfs mounted for the test (ENOSPC), filled either by
  the fragments themselves or just before the commit; and, where mounting is
  not permitted, a child process whose file-size limit (RLIMIT_FSIZE) makes
  the kernel refuse larger files (EFBIG);
- permission denied: the target directory made immutable (``chattr +i``,
  which stops root too), and a fragment unreadable by a child process that
  dropped root privileges (``os.setuid`` to nobody).

After each failure: no aggregation file, no temporary file, and every
fragment left behind is complete (its marker says so, and it reads back);
re-running the same call once space or permission is back resumes and
completes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
from dask.callbacks import Callback

import daskcfa
from builders import assert_matches, build_cf113

from .conftest import DIMS, SIZES, truth

SHAPE = (16, 64, 128)  # 16 fragments of 32 KiB: 512 KiB in all, random (incompressible) values


def _write(x, target, **kw):
    return daskcfa.to_cfa(x, str(target), variable="tas", dims=DIMS, attrs={"units": "K"},
                          fragment_shape=(1, 64, 128), **kw)


def _assert_nothing_half_done(directory: Path, target: Path) -> int:
    """No aggregation file, no temporaries; every fragment with a marker reads back. Returns how many."""
    assert not target.exists(), "an aggregation file was committed"
    # dask raises the first task error while other fragment tasks may still be
    # running (and failing, then removing their temporaries): give them time
    deadline = time.monotonic() + 30
    while True:
        leftovers = [p for p in directory.rglob("*") if p.name.endswith(".part")]
        if not leftovers or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not leftovers, leftovers
    markers = list(directory.rglob(".daskcfa/*.nc.json"))  # beside their fragments, in the generation
    for marker in markers:
        fragment = marker.parent.parent / marker.name.removesuffix(".json")
        with open(fragment, "rb") as f:
            assert f.read(4) == b"\x89HDF"
    return len(markers)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs; skips (saying why) where mounting is not permitted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}); "
                    "test_file_size_limit_in_a_child_process covers disk-full instead")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_while_writing_fragments(small_disk):
    expected = truth(SHAPE, seed=41, masked=0.0)
    x = da.from_array(expected, chunks=(1, 64, 128))
    ballast = small_disk / "ballast"
    ballast.write_bytes(os.urandom(1_700_000))  # leaves room for a few fragments only
    target = small_disk / "out" / "tas.nca"
    with dask.config.set(scheduler="threads", num_workers=2), pytest.raises(daskcfa.CFAError) as info:
        _write(x, target)
    err = info.value
    assert err.fragment is not None and err.variable == "/tas", err
    assert ("No space left on device" in str(err) or "bytes free on its filesystem" in str(err)) and err.file.endswith(".nc")
    kept = _assert_nothing_half_done(small_disk / "out", target)
    assert kept < 16
    ballast.unlink()
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    assert _write(x, target) == str(target)  # the same call resumes
    assert_matches(daskcfa.from_cfa(str(target)).compute(), expected)


class FillDiskBeforeCommit(Callback):
    """When the last fragment task has finished, fill the disk: only the commit is left to fail."""

    def __init__(self, disk: Path, fragments: int) -> None:
        super().__init__()
        self.disk, self.left = disk, fragments

    def _posttask(self, key, result, dsk, state, worker_id):
        name = key[0] if isinstance(key, tuple) else key
        if str(name).startswith("cfa-write-"):
            self.left -= 1
            if self.left == 0:
                with open(self.disk / "filler", "wb") as f:
                    try:
                        while True:
                            f.write(bytes(1 << 16))
                            f.flush()
                    except OSError:
                        pass


def test_disk_full_at_commit(small_disk):
    expected = truth((4, 64, 128), seed=43, masked=0.0)
    target = small_disk / "out" / "tas.nca"
    with dask.config.set(scheduler="threads", num_workers=2), FillDiskBeforeCommit(small_disk, 4), \
            pytest.raises(daskcfa.StorageError, match="No space left on device"):
        _write(expected, target)
    assert _assert_nothing_half_done(small_disk / "out", target) == 4
    (small_disk / "filler").unlink()
    _write(expected, target)
    assert_matches(daskcfa.from_cfa(str(target)).compute(), expected)


LIMITED_WRITER = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np
    import daskcfa
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the kernel then fails the write with EFBIG
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    x = np.random.default_rng(3).random((4, 64, 128)).astype("f4")
    try:
        daskcfa.to_cfa(x, sys.argv[1], variable="tas", dims=("time", "lat", "lon"), fragment_shape=(1, 64, 128))
        print("WROTE")
    except daskcfa.CFAError as exc:
        print("CFAERROR", type(exc).__name__, exc.fragment)
        print(exc)
""")


def test_file_size_limit_in_a_child_process(tmp_path):
    """Disk full without mounting anything: RLIMIT_FSIZE makes the kernel refuse (EFBIG)."""
    target = tmp_path / "out" / "tas.nca"
    proc = subprocess.run([sys.executable, "-c", LIMITED_WRITER, str(target), str(16 << 10)], capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout.startswith("CFAERROR"), (proc.stdout, proc.stderr[-2000:])
    assert "cannot write fragment" in proc.stdout and "fragment (" in proc.stdout  # netCDF-C says "HDF error"
    _assert_nothing_half_done(tmp_path / "out", target)
    proc = subprocess.run([sys.executable, "-c", LIMITED_WRITER, str(target), str(1 << 30)], capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout.startswith("WROTE"), (proc.stdout, proc.stderr[-2000:])
    expected = np.random.default_rng(3).random((4, 64, 128)).astype("f4")
    np.testing.assert_array_equal(np.ma.getdata(daskcfa.from_cfa(str(target)).compute()), expected)


@pytest.fixture
def immutable(tmp_path):
    """make(path): ``chattr +i`` (undone at teardown); skips, saying why, where it is refused."""
    done = []

    def make(path: Path) -> None:
        proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"chattr +i is not available here ({proc.stderr.strip()})")
        done.append(path)

    yield make
    for path in done:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_permission_denied_on_the_target_directory(tmp_path, immutable):
    expected = truth((4, 64, 128), seed=47)
    out = tmp_path / "out"
    out.mkdir()
    immutable(out)  # even root cannot create anything in it now
    target = out / "tas.nca"
    with pytest.raises(daskcfa.CFAError) as info:
        _write(expected, target)
    err = info.value  # the write's lease, beside the aggregation file, is refused: before any fragment
    assert "Operation not permitted" in str(err) and "lease" in str(err), err
    assert list(out.iterdir()) == []
    subprocess.run(["chattr", "-i", str(out)], check=True)
    _write(expected, target)
    assert_matches(daskcfa.from_cfa(str(target)).compute(), expected)


def test_permission_denied_at_commit(tmp_path, immutable):
    """The fragments' directory is writable but the aggregation's refuses new files: the
    write's lease (taken first, beside the aggregation file) is refused with a StorageError,
    before any fragment is written; no aggregation file and no temporary appear."""
    expected = truth((4, 64, 128), seed=53)
    target = tmp_path / "out" / "tas.nca"
    (tmp_path / "out" / "tas").mkdir(parents=True)
    immutable(tmp_path / "out")  # out/ is frozen; out/tas/ (the fragments' directory) is not
    with pytest.raises(daskcfa.StorageError, match="Operation not permitted"):
        _write(expected, target)
    assert _assert_nothing_half_done(tmp_path / "out", target) == 0
    subprocess.run(["chattr", "-i", str(tmp_path / "out")], check=True)
    _write(expected, target)
    assert_matches(daskcfa.from_cfa(str(target)).compute(), expected)


UNPRIVILEGED_READER = textwrap.dedent("""
    import os, sys, warnings
    import daskcfa
    # everything a read needs is imported and used once while still root (the interpreter
    # lives under /root, which nobody may read), then privileges are dropped for good
    daskcfa.from_cfa(sys.argv[1], "tas")[:1].compute(scheduler="sync")
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    assert os.getuid() == 65534
    try:
        daskcfa.from_cfa(sys.argv[1], "tas").compute(scheduler="sync")
        print("READ")
    except daskcfa.CFAError as exc:
        print("CFAERROR", type(exc).__name__, exc.fragment)
        print(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = daskcfa.from_cfa(sys.argv[1], "tas", missing="fill").compute(scheduler="sync")
    print("FILLED", int(x.mask.sum()), len(caught))
""")


def test_fragment_unreadable_by_an_unprivileged_reader(tmp_path_factory):
    """A fragment the reading user may not open: a clear error naming it (or missing data on request)."""
    public = Path(tmp_path_factory.mktemp("public"))
    public.chmod(0o755)
    for parent in public.parents:  # nobody must be able to reach the dataset
        if str(parent) in ("/", "/tmp"):
            break
        parent.chmod(parent.stat().st_mode | 0o755)
    built = build_cf113(public / "ds", truth(), DIMS, SIZES)
    for path in (public / "ds").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    victim = built.fragment_files[(1, 0, 1)]
    victim.chmod(0o000)
    proc = subprocess.run([sys.executable, "-c", UNPRIVILEGED_READER, str(built.path)], capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout
    assert out.startswith("CFAERROR FragmentReadError (1, 0, 1)"), (out, proc.stderr[-2000:])
    assert victim.name in out and "Permission denied" in out
    assert "FILLED" in out and int(out.split("FILLED")[1].split()[0]) >= 3 * 4 * 3  # the whole fragment masked
    shutil.rmtree(public / "ds")
