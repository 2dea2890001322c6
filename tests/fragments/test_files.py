"""fragments/files.py: each fragment open, the engine chosen and every fallback to netCDF4 logged at DEBUG."""

from __future__ import annotations

import logging
import dask
import netCDF4
import numpy as np
import pytest

import daskcfa

LOGGER = "daskcfa.fragments.files"


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG]


@pytest.mark.parametrize("fragment_format, config, engine", [
    ("NETCDF4", {}, "direct HDF5"),
    ("NETCDF3_CLASSIC", {}, "direct netCDF-3"),
    ("NETCDF4", {"daskcfa.io.engine": "netcdf4"}, "netCDF4-python"),
])
def test_fragment_opens_name_the_file_and_engine(tmp_path, caplog, fragment_format, config, engine):
    data = np.arange(24, dtype="f4").reshape(4, 6)
    url = daskcfa.to_cfa(data, str(tmp_path / "t.nca"), variable="v", dims=("time", "x"), fragment_shape=(2, 6),
                         fragment_format=fragment_format)
    caplog.set_level(logging.DEBUG, logger="daskcfa")
    with dask.config.set({"scheduler": "synchronous", **config}):
        np.testing.assert_array_equal(daskcfa.from_cfa(url, "v").compute(), data)
    opened = [m for m in _messages(caplog) if m.startswith("opened fragment ")]
    assert len(opened) == 2, _messages(caplog)
    assert all(f"(local file; engine: {engine})" in m for m in opened)
    assert {m.split()[2] for m in opened} == {str(p) for p in (tmp_path / "t").rglob("*.nc")}


def test_a_fallback_to_netcdf4_is_logged(tmp_path, caplog):
    """The direct netCDF-3 reader leaves character variables to netCDF4-python: said at DEBUG."""
    words = np.array(["alpha", "beta", "gamma", "delta"], dtype=object)
    url = daskcfa.to_cfa(words, str(tmp_path / "w.nca"), variable="name", dims=("time",), fragment_shape=(2,))
    fragments = sorted(p for p in (tmp_path / "w").rglob("*.nc") if ".daskcfa" not in p.parts)
    assert len(fragments) == 2
    for i, path in enumerate(fragments):  # the same fragments as netCDF-3 files of characters
        path.unlink()
        with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as ds:
            ds.createDimension("time", 2)
            ds.createDimension("nchar", 5)
            ds.createVariable("name", "S1", ("time", "nchar"))[:] = netCDF4.stringtochar(
                words[2 * i:2 * i + 2].astype("S5"))
    caplog.set_level(logging.DEBUG, logger="daskcfa")
    with dask.config.set(scheduler="synchronous"):
        assert daskcfa.from_cfa(url, "name").compute().tolist() == words.tolist()
    messages = _messages(caplog)
    for path in fragments:
        assert f"opened fragment {path} (local file; engine: direct netCDF-3)" in messages
        assert any(m.startswith(f"fragment {path}, variable 'name': the direct reader cannot open it")
                   for m in messages), messages
        assert f"opening fragment {path} with netCDF4-python" in messages


@pytest.mark.parametrize("fragment_format", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_fragments_read_leave_nothing_to_the_cyclic_collector(tmp_path, fragment_format):
    """Every handle is freed by reference counting once closed: garbage in cycles (37 objects a
    fragment, once) made the collector's full passes over a large process cost more than the reads."""
    import gc

    from daskcfa.fragments.manager import manager

    data = np.arange(48, dtype="f4").reshape(8, 6)
    url = daskcfa.to_cfa(data, str(tmp_path / "t.nca"), variable="v", dims=("time", "x"), fragment_shape=(1, 6),
                         fragment_format=fragment_format)
    x = daskcfa.from_cfa(url, "v")
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        with dask.config.set(scheduler="synchronous"):
            np.testing.assert_array_equal(x[:, 3].compute(), data[:, 3])
        manager().close_all()
        gc.collect()
        ours = [o for o in gc.garbage if type(o).__module__.startswith("daskcfa")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not ours, ours[:5]


def test_attributes_asked_for_by_get(tmp_path):
    """A fragment variable's ``attrs.get`` (how decoding asks for the attributes most fragments
    lack) gives the value of one present and the default of one absent, with either engine."""
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 3)
        var = nc.createVariable("v", "i2", ("x",), fill_value=np.int16(-1))
        var.units = "K"
        var.scale_factor = np.float32(0.5)
        var[:] = [1, 2, 3]
    from daskcfa.fragments.files import open_fragment

    for engine in ("direct", "netcdf4"):
        with dask.config.set({"daskcfa.io.engine": engine}), open_fragment(str(path), "v") as var:
            assert var.attrs.get("units") == "K" and var.attrs.get("scale_factor") == np.float32(0.5)
            assert var.attrs.get("add_offset") is None and var.attrs.get("valid_min", "none") == "none"
            assert var.attrs.get("_FillValue") == -1
