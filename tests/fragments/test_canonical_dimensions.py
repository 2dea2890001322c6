"""Canonical form of fragments (daskcfa.fragments.canonical): dimensions are matched by position.

CF-1.13 and CFA define the canonical form by position ("same number of
dimensions in the same order"); fragment dimension names are not significant
(``/work/shared/formats.md``). Each test writes a real aggregation with
numpy ground truth, rewrites fragments with other dimension names, and reads
it from local disk and from the S3 test server, with both fragment engines.
"""

from __future__ import annotations

import warnings

import dask
import netCDF4
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskcfa
from builders import Frag, assert_matches, build_cf113, make_truth, write_fragment_file

pytestmark = pytest.mark.usefixtures("other_cwd", "sync_dask")

DIMS = ("time", "lat", "lon")
ENGINES = ("direct", "netcdf4")


def _rewrite(path, dims) -> None:
    """The fragment at ``path`` again, same values and shape, its dimensions called ``dims``."""
    with netCDF4.Dataset(str(path)) as ds:
        var = ds["tas"]
        var.set_auto_maskandscale(False)
        values, attrs = var[...], {k: var.getncattr(k) for k in var.ncattrs()}
    path.unlink()
    write_fragment_file(path, "tas", dims, np.asarray(values), attrs)


def _read(built, placed, engine, key=Ellipsis):
    url, options = placed(built.path)
    with dask.config.set({"daskcfa.io.engine": engine}):
        return daskcfa.from_cfa(url, "tas", storage_options=options)[key].compute()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("names", [("lon", "time", "lat"), ("lat", "time", "lon"), ("lon", "lat", "time")])
def test_aggregated_names_in_another_order_are_read_by_position(tmp_path, placed, engine, names):
    """Equal sizes, the aggregated names permuted: read by position (with a warning), never refused."""
    truth = make_truth((8, 4, 4), seed=3, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, ((4, 4), (4,), (4,)))
    _rewrite(built.fragment_files[(1, 0, 0)], names)
    with pytest.warns(daskcfa.CFAWarning) as record:
        got = _read(built, placed, engine)
    assert_matches(got, built.expected)
    messages = [str(w.message) for w in record if issubclass(w.category, daskcfa.CFAWarning)]
    assert any("another order" in m and "(1, 0, 0)" in m and "aggregation.tas.1.0.0.nc" in m for m in messages)
    with pytest.warns(daskcfa.CFAWarning):
        assert_matches(_read(built, placed, engine, (slice(3, 7), 2)), built.expected[3:7, 2])


@pytest.mark.parametrize("engine", ENGINES)
def test_renamed_dimensions_of_equal_sizes_are_read_without_a_warning(tmp_path, placed, engine):
    truth = make_truth((6, 3, 3), seed=4, masked=0.1)
    built = build_cf113(tmp_path / "ds", truth, DIMS, ((3, 3), (3,), (3,)),
                        frags=lambda index: Frag(rename_dims=True))
    _rewrite(built.fragment_files[(0, 0, 0)], ("lat", "x", "y"))  # one aggregated name, elsewhere
    with warnings.catch_warnings():
        warnings.simplefilter("error", daskcfa.CFAWarning)
        assert_matches(_read(built, placed, engine), built.expected)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("names", [("lon", "time"), ("a", "b"), ("time", "lat")])
def test_missing_size1_dimensions_are_restored_by_position(tmp_path, placed, engine, names):
    """A fragment lacking size-1 dimensions, whatever its dimensions are called: its
    dimensions match the aggregated ones of the same sizes, left to right."""
    truth = make_truth((4, 1, 5, 1, 4), seed=5, masked=0.1)
    dims = ("time", "lev", "lat", "ens", "lon")
    built = build_cf113(tmp_path / "ds", truth, dims, ((4,), (1,), (2, 3), (1,), (4,)))
    path = built.fragment_files[(0, 0, 1, 0, 0)]
    with netCDF4.Dataset(str(path)) as ds:
        var = ds["tas"]
        var.set_auto_maskandscale(False)
        values, attrs = var[...], {k: var.getncattr(k) for k in var.ncattrs()}
    path.unlink()
    # (4, 1, 3, 1, 4) stored as (4, 3, 4) under unrelated or misleading names
    write_fragment_file(path, "tas", names + ("z",), np.asarray(values).reshape(4, 3, 4), attrs)
    assert_matches(_read(built, placed, engine), built.expected)
    assert_matches(_read(built, placed, engine, (slice(None), 0, slice(1, 4), slice(0, 0))),
                   built.expected[:, 0, 1:4, 0:0])
    assert_matches(_read(built, placed, engine, (2, 0, 3, 0)), built.expected[2, 0, 3, 0])


@pytest.mark.parametrize("engine", ENGINES)
def test_shape_that_fits_no_position_is_still_refused(tmp_path, engine):
    """Reading by position never reads a fragment whose shape does not fit."""
    truth = make_truth((6, 4, 4), seed=6)
    built = build_cf113(tmp_path / "ds", truth, DIMS, ((3, 3), (4,), (4,)))
    path = built.fragment_files[(1, 0, 0)]
    path.unlink()
    write_fragment_file(path, "tas", ("lat", "time", "lon"), np.zeros((4, 3, 4), "f4"), {"units": "K"})
    with dask.config.set({"daskcfa.io.engine": engine}), pytest.raises(daskcfa.FragmentShapeError) as info:
        daskcfa.from_cfa(str(built.path), "tas").compute()
    assert info.value.fragment == (1, 0, 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_naming_of_a_fitting_fragment_reads_by_position(tmp_path_factory, data):
    """Hostile namings: any names (the aggregated ones shuffled, repeated elsewhere, unrelated),
    size-1 dimensions dropped or kept: the values are always those of the position."""
    shape = tuple(data.draw(st.lists(st.sampled_from([1, 2, 2, 3]), min_size=1, max_size=4), label="shape"))
    dims = tuple(f"d{k}" for k in range(len(shape)))
    truth = make_truth((2 * shape[0],) + shape[1:], seed=data.draw(st.integers(0, 99)), masked=0.2)
    built = build_cf113(tmp_path_factory.mktemp("naming"), truth, dims, ((shape[0], shape[0]),) + tuple(
        (n,) for n in shape[1:]))
    keep = [k for k, n in enumerate(shape) if n > 1 or data.draw(st.booleans(), label=f"keep {k}")]
    pool = list(dims) + ["x", "y", "z", "w"]
    names = data.draw(st.one_of(st.permutations([dims[k] for k in keep]),
                                st.permutations(pool).map(lambda p: p[: len(keep)])), label="names")
    path = built.fragment_files[(1,) + (0,) * (len(shape) - 1)]
    with netCDF4.Dataset(str(path)) as ds:
        var = ds["tas"]
        var.set_auto_maskandscale(False)
        values, attrs = var[...], {k: var.getncattr(k) for k in var.ncattrs()}
    path.unlink()
    write_fragment_file(path, "tas", names, np.asarray(values).reshape(tuple(shape[k] for k in keep)), attrs)
    engine = data.draw(st.sampled_from(ENGINES), label="engine")
    with warnings.catch_warnings(), dask.config.set({"daskcfa.io.engine": engine}):
        warnings.simplefilter("ignore", daskcfa.CFAWarning)
        assert_matches(daskcfa.from_cfa(str(built.path), "tas").compute(), built.expected)


def test_a_fragment_whose_dimension_list_holds_no_references_is_refused_naming_it(tmp_path):
    """A damaged ``DIMENSION_LIST`` (text where dimension scale references belong), read for a
    fragment of two equal sizes (its names are compared with the aggregated ones): a FragmentReadError
    naming the fragment and saying why, from the direct reader, never handed on to netCDF-C (which
    crashed the process on such a file once)."""
    import h5py

    truth = make_truth((8, 4, 4), seed=3)
    built = build_cf113(tmp_path / "ds", truth, DIMS, ((4, 4), (4,), (4,)))
    path = built.fragment_files[(1, 0, 0)]
    with h5py.File(path, "a") as f:
        del f["tas"].attrs["DIMENSION_LIST"]
        f["tas"].attrs["DIMENSION_LIST"] = np.array([b"time", b"lat", b"lon"])
    with pytest.raises(daskcfa.FragmentReadError) as info:
        daskcfa.from_cfa(str(built.path), "tas")[4:8].compute()
    assert info.value.fragment == (1, 0, 0) and "DIMENSION_LIST" in str(info.value)
    assert_matches(daskcfa.from_cfa(str(built.path), "tas")[:4].compute(), built.expected[:4])
