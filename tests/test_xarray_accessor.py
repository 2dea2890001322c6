"""``ds.cfa``: ``to_cfa``, the fragment table and the summary on an xarray Dataset, and when it is registered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import daskcfa
from daskcfa.sample_data import FRAGMENT_SHAPE, truth

pytestmark = pytest.mark.usefixtures("other_cwd")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> str:
    return daskcfa.sample(str(tmp_path_factory.mktemp("sample") / "tas.nca"))


def test_fragment_table_and_info(archive):
    ds = xr.open_dataset(archive, engine="daskcfa", chunks={})
    table = ds.cfa.fragments
    assert list(table.columns) == ["variable", "fragment", "start", "shape", "uri", "identifier", "value"]
    assert len(table) == 10 and set(table["variable"]) == {"/tas"}
    assert table["fragment"].tolist() == [(i, 0, 0) for i in range(10)]
    assert table["start"].tolist() == [(12 * i, 0, 0) for i in range(10)]
    assert set(table["shape"]) == {FRAGMENT_SHAPE} and set(table["identifier"]) == {"tas"}
    model = daskcfa.open_cfa(archive)["tas"].fragments
    assert table["uri"].tolist() == [model[(i, 0, 0)].uris[0] for i in range(10)]
    summary = ds.cfa.info()
    assert summary.nfragments == 10 and str(summary) == str(daskcfa.describe(archive))


def test_to_cfa_writes_the_dataset(archive, tmp_path):
    ds = xr.open_dataset(archive, engine="daskcfa", chunks={})
    out = ds.cfa.to_cfa(str(tmp_path / "copy.nca"), fragment_shape=(24, 45, 90))
    assert daskcfa.from_cfa(out, "tas").numblocks == (5, 1, 1)
    np.testing.assert_array_equal(daskcfa.from_cfa(out, "tas").compute(), truth())
    back = xr.open_dataset(out, engine="daskcfa")
    xr.testing.assert_identical(back.time, ds.time)


def test_a_dataset_not_opened_from_a_file_has_no_fragments():
    ds = xr.Dataset({"v": (("t",), np.arange(3.0))})
    with pytest.raises(daskcfa.ArgumentError, match="not opened from a file"):
        ds.cfa.fragments
    with pytest.raises(daskcfa.ArgumentError, match="not opened from a file"):
        ds.cfa.info()


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_registered_by_import_daskcfa_when_xarray_is_imported():
    """xarray first: ``import daskcfa`` registers ``ds.cfa``; daskcfa alone imports no xarray for it."""
    assert _run("import xarray as xr, daskcfa\nprint(hasattr(xr.Dataset, 'cfa'))") == ["True"]
    assert _run("import sys, daskcfa\nprint('xarray' in sys.modules)") == ["False"]


def test_registered_when_xarray_loads_its_backends(archive):
    """daskcfa first, xarray later: registered by the backend module, which xarray imports with its backends."""
    code = (f"import daskcfa, xarray as xr\nprint(hasattr(xr.Dataset, 'cfa'))\n"
            f"ds = xr.open_dataset({archive!r}, engine='daskcfa')\nprint(hasattr(xr.Dataset, 'cfa'), "
            "len(ds.cfa.fragments))")
    assert _run(code) == ["False", "True", "10"]
