"""Fixtures and helpers shared by the fault-injection and fuzzing tests (tests/reliability).

Every fault here is real: files are truncated or bit-flipped on disk, the
SeaweedFS server is SIGKILLed, distributed workers are SIGKILLed, the
filesystem is really full (a 2 MiB tmpfs) or really read-only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from builders import make_truth

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (2, 3))  # uneven fragments: a 3 x 1 x 2 grid
SHAPE = (6, 4, 5)
VICTIM = (1, 0, 1)  # the fragment the corruption tests damage


def truth(shape=SHAPE, dtype="f4", seed=5, masked=0.1) -> np.ma.MaskedArray:
    return make_truth(shape, dtype, seed=seed, masked=masked)


def replace_file(path: Path, data: bytes) -> None:
    """Give ``path`` new contents under a new inode (HDF5 recognises an already
    open file by its inode, and would serve its cached metadata)."""
    temporary = path.with_name(path.name + ".replacing")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def forget_open_files() -> None:
    """Close this process's cached fragment handles, so the next read opens the files again."""
    from daskcfa.fragments.manager import manager

    manager().close_all()


def wait_for(condition: Callable[[], object], timeout: float = 120.0, what: str = "condition") -> object:
    """Poll ``condition`` until it returns something true (generous timeout: the machine is shared)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def fragment_error_names(err, fragment_file: str, index=VICTIM, variable: str = "tas") -> None:
    """A FragmentError that says which file, variable and fragment failed."""
    import daskcfa

    assert isinstance(err, daskcfa.FragmentError), f"{type(err).__name__}: {err}"
    assert err.fragment == tuple(index), err
    assert err.variable is not None and err.variable.lstrip("/") == variable, err
    assert err.file is not None and err.file.endswith(fragment_file), err
    assert fragment_file in str(err) and str(tuple(index)) in str(err)


@pytest.fixture(autouse=True)
def _no_cloud_metadata(monkeypatch):
    """botocore must never look for credentials on an instance-metadata address."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
