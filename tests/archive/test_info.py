"""``daskcfa.describe`` and ``plot_layout``: what an aggregation holds and where its fragments live."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import daskcfa
from builders import Frag, build, generation_dir, make_truth
from daskcfa.archive.info import DatasetSummary, plot_layout
from remote_helpers import write_cf113

DIMS = ("time", "lat", "lon")
COORDS = {"time": np.arange(6.0), "lat": np.linspace(-45, 45, 4), "lon": np.arange(5.0)}


def write(url, **kw):
    x = make_truth((6, 4, 5), "f4", seed=1)
    return daskcfa.to_cfa(x, str(url), variable="tas", dims=DIMS, attrs={"units": "K"}, coords=COORDS,
                          fragment_shape=(4, 2, 5), **kw)


def test_summary_of_a_written_dataset(tmp_path):
    url = write(tmp_path / "t.nc")
    summary = daskcfa.describe(url)
    assert isinstance(summary, DatasetSummary)
    assert summary.url == url and summary.dialects == ("CF-1.13",)
    assert summary.dimensions == {"/time": 6, "/lat": 4, "/lon": 5}
    (tas,) = summary.aggregated
    assert (tas.name, tas.dims, tas.shape, tas.dtype) == ("/tas", DIMS, (6, 4, 5), np.dtype("f4"))
    assert tas.grid == (2, 2, 1) and tas.nfragments == 4
    assert tas.fragment_sizes == ((2, 4), (2, 2), (5, 5))  # time: 4 then 2
    assert (tas.in_files, tas.unique_valued, tas.missing) == (4, 0, 0)
    assert tas.nbytes == summary.nbytes == 6 * 4 * 5 * 4
    assert summary.locations == {f"file://{generation_dir(tmp_path / 't')}": 4}
    assert summary.storages == {"file://": 4}
    assert sorted(v.name for v in summary.variables if not v.aggregated) == ["/lat", "/lon", "/time"]
    assert summary.stored_bytes is None
    text = str(summary)
    for part in ("dialect: CF-1.13", "/tas (time=6, lat=4, lon=5) float32, 480 B [CF-1.13]",
                 "4 fragment(s) in a 2 x 2 x 1 grid (4 in files); fragment sizes: time 2-4, lat 2, lon 5",
                 f"4  file://{tmp_path}/t", "/time (time=6) float64"):
        assert part in text, (part, text)


def test_storage_size_and_missing_files(tmp_path):
    url = write(tmp_path / "t.nc")
    files = sorted((tmp_path / "t").glob("g-*/*.nc"))
    summary = daskcfa.describe(url, storage_size=True)
    assert summary.stored_bytes == sum(f.stat().st_size for f in files) and summary.missing_files == ()
    files[0].unlink()
    summary = daskcfa.describe(url, storage_size=True)
    assert summary.stored_bytes == sum(f.stat().st_size for f in files[1:])
    assert summary.missing_files == (str(files[0]),)
    assert "1 file(s) not found" in str(summary)


def test_where_fragments_live(tmp_path):
    """Fragments on disk and in two buckets: counted by directory and by storage, without opening any."""
    uris = [[["a/f0.nc"], ["a/f1.nc"]], [["s3://one/x/f2.nc"], ["s3://one/y/f3.nc"]],
            [["s3://two/f4.nc"], ["/abs/f5.nc"]]]
    agg = write_cf113(tmp_path / "mixed.nc", "tas", ("time", "x"), ((1, 1, 1), (2, 2)), uris)
    summary = daskcfa.describe(str(agg))
    assert summary.locations == {f"file://{tmp_path}/a": 2, "s3://one/x": 1, "s3://one/y": 1, "s3://two": 1,
                                 "file:///abs": 1}
    assert summary.storages == {"file://": 3, "s3://one": 2, "s3://two": 1}
    assert "fragment files by storage: file:// 3, s3://one 2, s3://two 1" in str(summary)


def test_missing_and_unique_valued_fragments(tmp_path):
    x = make_truth((4, 3), "f4", seed=2)
    built = build("CFA-0.6", tmp_path, x, ("time", "x"), ((1, 1, 2), (3,)), frags={(1, 0): Frag(absent=True)})
    (var,) = daskcfa.describe(str(built.path)).aggregated
    assert (var.in_files, var.missing, var.dialect) == (2, 1, "CFA-0.6")
    values = np.ma.MaskedArray(np.repeat([[1.0], [2.0]], [2, 2], axis=0).repeat(3, axis=1).astype("f4"))
    unique = build("CF-1.13", tmp_path / "u", values, ("time", "x"), ((2, 2), (3,)), unique=True)
    (var,) = daskcfa.describe(str(unique.path)).aggregated
    assert (var.in_files, var.unique_valued, var.missing) == (0, 2, 0)
    assert var.locations == {}


def test_missing_aggregation_file(tmp_path):
    with pytest.raises(daskcfa.NotFoundError):
        daskcfa.describe(str(tmp_path / "none.nc"))


def test_plot_layout(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    url = write(tmp_path / "t.nc")
    with pytest.raises(daskcfa.ArgumentError, match="dims names unknown dimension 'depth'; dimensions: time, lat, lon"):
        plot_layout(url, str(tmp_path / "p.png"), dims=["time", "depth"])
    with pytest.raises(ValueError, match="not \\['time', 'time'\\]"):
        plot_layout(url, str(tmp_path / "p.png"), dims=["time", "time"])
    with pytest.raises(daskcfa.VariableNotFoundError):
        plot_layout(url, str(tmp_path / "p.png"), variable="pr", dims=["time", "lat"])
    out = plot_layout(url, str(tmp_path / "p.png"), dims=["time", "lat"])
    assert out == str(tmp_path / "p.png")
    image = imread(out)
    assert image.shape[:2] == (600, 800)
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 10  # a drawing, not a blank page
    two_d = write_cf113(tmp_path / "m.nc", "tas", ("time", "x"), ((1, 1), (2, 2)),
                        [[["a/f0.nc"], ["s3://b/f1.nc"]], [["a/f2.nc"], ["a/f3.nc"]]])
    plot_layout(str(two_d), str(tmp_path / "m.png"))
    assert os.path.getsize(tmp_path / "m.png") > 1000
    assert Path(tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    url = write(tmp_path / "t.nc")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r'pip install "daskcfa\[plot\]"'):
        plot_layout(url, str(tmp_path / "p.png"), dims=["time", "lat"])
