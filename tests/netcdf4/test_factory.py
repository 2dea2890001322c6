"""daskcfa.netcdf4's constructor: which class each mode gives, the one Dimension and reading Dataset of the
public API, and an update that reads the aggregation file once (issue #30)."""

from __future__ import annotations

import numpy as np
import pytest

import daskcfa
from daskcfa import storage
from daskcfa.netcdf4 import (AggregationWriter, Dataset, Dimension, GrowingDimension, PlainWriter, VariableState,
                             WritableVariable)
from daskcfa.netcdf4.existing import read_existing
from daskcfa.storage.access import open_aggregation


def archive(url: str, fmt: str = "CFA4") -> np.ndarray:
    """An archive with coordinates (ordinary variables) and one aggregated field; its values."""
    values = np.arange(6 * 4 * 5, dtype="f4").reshape(6, 4, 5)
    with Dataset(url, "w", format=fmt) as ds:
        for name, size in [("time", None), ("lat", 4), ("lon", 5)]:
            ds.createDimension(name, size)
            ds.createVariable(name, "f8", (name,))[:] = np.arange(6 if size is None else size)
        ds.createVariable("tas", "f4", ("time", "lat", "lon"), subarray_shape=[2, 4, 5])[:] = values
    return values


def opens_of(url: str, monkeypatch) -> list[str]:
    """Every open of the netCDF file ``url`` through daskcfa's storage layer, from now on."""
    opened, real = [], storage.netcdf_file

    def counting(where, *args, **kwargs):
        if str(where).rstrip("/").endswith(url.rsplit("/", 1)[-1]):
            opened.append(str(where))
        return real(where, *args, **kwargs)

    monkeypatch.setattr(storage, "netcdf_file", counting)
    return opened


@pytest.mark.parametrize("fmt", [None, "CFA4"])
def test_an_update_reads_the_aggregation_file_once(tmp_path, monkeypatch, fmt):
    """Dataset(url, "a") took the format from one open, the structure from another and each ordinary
    variable's values from one more each (5 opens here); now one read gives all three."""
    url = str(tmp_path / "tas.nca")
    values = archive(url)
    opened = opens_of(url, monkeypatch)
    ds = Dataset(url, "a", format=fmt)
    assert len(opened) == 1, opened
    with ds:
        ds["tas"][6] = np.full((4, 5), -1, "f4")
        ds["time"][6] = 6
    monkeypatch.undo()
    with Dataset(url) as back:
        np.testing.assert_array_equal(back["tas"][:], np.concatenate([values, np.full((1, 4, 5), -1, "f4")]))
        np.testing.assert_array_equal(back["time"][:], np.arange(7))
        np.testing.assert_array_equal(back["lat"][:], np.arange(4))


def test_an_update_reads_again_what_changed_before_it_held_the_lease(tmp_path):
    """The constructor reads before the writer holds the lease: what another writer committed in between
    is read again (not lost, nor its fragments referenced after they were retired)."""
    url = str(tmp_path / "tas.nca")
    values = archive(url)
    existing = read_existing(*open_aggregation(url))
    with Dataset(url, "a") as other:  # (commits between the read and the lease)
        other["tas"][0, 0, 0] = 1000
        other["lat"][0] = 90
    with AggregationWriter.create(url, "a", True, ("CFA-0.5", "NETCDF4", "NETCDF4"), None, existing=existing) as ds:
        ds["tas"][5, 0, 0] = 2000
    values[0, 0, 0], values[5, 0, 0] = 1000, 2000
    with Dataset(url) as back:
        np.testing.assert_array_equal(back["tas"][:], values)
        assert back["lat"][0] == 90


def test_one_dimension_and_one_reading_dataset_and_writers_named_for_what_they_are(tmp_path):
    url = str(tmp_path / "tas.nca")
    archive(url, "CF-1.13")
    assert Dimension is daskcfa.Dimension and Dataset is daskcfa.Dataset
    with Dataset(url) as ds, daskcfa.open_cfa(url) as opened:
        assert type(ds) is daskcfa.Dataset and type(opened) is daskcfa.Dataset
        assert all(isinstance(d, daskcfa.Dimension) for d in ds.dimensions.values())
    with Dataset(str(tmp_path / "new.nca"), "w", format="CF-1.13") as writer:
        assert isinstance(writer, AggregationWriter) and isinstance(writer, daskcfa.Group)
        assert not isinstance(writer, daskcfa.Dataset)  # (its aggregated variables are not readable yet)
        assert writer.isopen() and writer.filepath() == writer.url
        time = writer.createDimension("time", None)
        assert isinstance(time, GrowingDimension) and repr(time).startswith("<daskcfa.netcdf4.GrowingDimension")
        tas = writer.createVariable("tas", "f4", ("time",), subarray_shape=[3])
        assert isinstance(tas, WritableVariable) and isinstance(writer.state_of(tas), VariableState)
        tas[:5] = np.arange(5)
        assert writer.state_of(tas).layout.grid(tas.shape).sizes == ((3, 2),)
        assert repr(writer).startswith("<daskcfa.netcdf4.AggregationWriter ")
    assert not writer.isopen()
    with Dataset(str(tmp_path / "plain.nc"), "w", format="NETCDF4") as plain:
        assert isinstance(plain, PlainWriter) and not isinstance(plain, daskcfa.Dataset)
