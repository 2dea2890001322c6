"""VirtualiZarr's reference sets and daskcfa's, each read by the other (issue #29): a kerchunk reference
set VirtualiZarr builds over netCDF files (its ``HDFParser``), aggregated by daskcfa, is read one dask
chunk per referenced chunk-grid block, with numpy's values; and ``to_references(inline=False)`` is
accepted by VirtualiZarr's kerchunk parser, its values equal to numpy's."""

from __future__ import annotations

import math

import numpy as np
import pytest

import daskcfa
from builders import DEFAULT_FILL, Frag, assert_matches, build_cf113, make_truth

vz = pytest.importorskip("virtualizarr")
pytest.importorskip("obstore")
pytest.importorskip("xarray")

from obspec_utils.registry import ObjectStoreRegistry  # noqa: E402
from obstore.store import LocalStore  # noqa: E402
from virtualizarr.parsers import HDFParser, KerchunkJSONParser  # noqa: E402

pytestmark = pytest.mark.usefixtures("other_cwd")

DIMS = ("time", "lat", "lon")
SHAPE = (20, 18, 36)
TEN = ((2,) * 10, (18,), (36,))
FILL = DEFAULT_FILL("f4")
STORAGE = {"zlib-chunked": {"zlib": True, "chunksizes": (1, 9, 18)}, "uncompressed": None}


def registry() -> ObjectStoreRegistry:
    return ObjectStoreRegistry({"file://": LocalStore()})


@pytest.mark.parametrize("storage", list(STORAGE))
def test_virtualizarr_reference_set_aggregated_keeps_its_chunk_grid(tmp_path, storage):
    """VirtualiZarr's own reference set of ten files, given to ``aggregate``: one dask chunk per chunk of
    the set's Zarr grid (a contiguous file is one chunk: ten chunks), not one chunk of the whole array."""
    truth = make_truth(SHAPE, "f4", seed=11, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, TEN,
                        frags=lambda index: Frag(fill_value=FILL, storage=STORAGE[storage]))
    files = [f"file://{path}" for _, path in sorted(built.fragment_files.items())]
    virtual = vz.open_virtual_mfdataset(files, parser=HDFParser(), registry=registry(), concat_dim="time",
                                        combine="nested")
    refs = str(tmp_path / "vz.json")
    virtual.vz.to_kerchunk(refs, format="json")
    aggregation = daskcfa.aggregate([refs], str(tmp_path / "agg.nc"))
    array = daskcfa.from_cfa(aggregation, "tas")
    chunk = (1, 9, 18) if STORAGE[storage] else (2, 18, 36)
    assert array.numblocks == tuple(math.ceil(n / c) for n, c in zip(SHAPE, chunk))
    assert array.npartitions == (80 if STORAGE[storage] else 10)
    assert_matches(array.compute(), built.expected, rtol=0)


def test_to_references_inline_false_is_read_by_virtualizarr(tmp_path):
    """VirtualiZarr's kerchunk parser takes the whole set (coordinates by reference, URIs written out,
    codecs as filters) and loads values equal to numpy's."""
    truth = make_truth(SHAPE, "f4", seed=13, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, TEN,
                        frags=lambda index: Frag(fill_value=FILL, storage=STORAGE["zlib-chunked"]))
    out = daskcfa.to_references(str(built.path), output=str(tmp_path / "refs.json"), inline=False)
    url = f"file://{out}"
    virtual = vz.open_virtual_dataset(url, parser=KerchunkJSONParser(), registry=registry())
    assert set(virtual.variables) == {"time", "lat", "lon", "tas"}
    assert type(virtual["tas"].data).__name__ == "ManifestArray", "tas by reference"
    loaded = vz.open_virtual_dataset(url, parser=KerchunkJSONParser(), registry=registry(),
                                     loadable_variables=["tas", "time", "lat", "lon"])
    got = np.ma.masked_invalid(loaded["tas"].values)
    assert_matches(got, built.expected, rtol=0)
    np.testing.assert_array_equal(loaded["lat"].values, np.arange(18) * 1.5 + 10.0)

