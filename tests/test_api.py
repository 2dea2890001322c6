"""Bad arguments to the public API are daskcfa errors that say what to give instead."""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np
import pytest

import daskcfa

X = da.ones((4, 6), chunks=(2, 6), dtype="f4")


@pytest.mark.parametrize("kwargs, message", [
    ({}, "needs variable="),
    ({"variable": "x", "dims": ("a",)}, "name 1 dimensions, the data have 2"),
    ({"variable": "x", "dims": ("a", "b"), "coords": {"c": np.arange(4)}}, "not one of the dimensions"),
    ({"variable": "x", "dims": ("a", "b"), "coords": {"a": np.arange(3)}}, "has 3 values"),
    ({"variable": "x", "dims": ("a", "b"), "fragment_format": "ZARR9"}, "unknown fragment format"),
    ({"variable": "x", "dims": ("a", "b"), "keep_previous": -1}, "keep_previous"),
    ({"variable": "x", "dims": ("a", "b"), "compression": 3}, "compression must be"),
    ({"variable": "x", "dims": ("a", "b"), "fragment_name": "{nothing}"}, "fragment_name"),
])
def test_to_cfa_bad_arguments_are_argument_errors(tmp_path, kwargs, message):
    target = tmp_path / "out.nca"
    with pytest.raises(daskcfa.ArgumentError, match=message) as info:
        daskcfa.to_cfa(X, str(target), **kwargs)
    assert isinstance(info.value, daskcfa.CFAError)
    assert not target.exists() and not (tmp_path / "out").exists()


def test_argument_errors_are_still_what_they_were():
    """Callers that caught ValueError or TypeError before keep working."""
    with pytest.raises(ValueError):
        raise daskcfa.ArgumentError("x")
    with pytest.raises(TypeError):
        raise daskcfa.ArgumentError("x")


def test_to_cfa_writes_the_chunk_index(tmp_path):
    """chunk_index=True: the committed aggregation's chunk index is beside it, and reads through it equal."""
    import os

    from daskcfa.fragments.chunk_index import index_uri

    x = np.ma.masked_greater(np.arange(240.0).reshape(6, 40), 200)
    url = daskcfa.to_cfa(x, str(tmp_path / "i.nc"), variable="v", dims=("t", "x"), fragment_shape=(2, 40),
                         compression="zlib", chunk_index=True)
    assert os.path.exists(index_uri(url).removeprefix("file://"))
    got = daskcfa.from_cfa(url, chunk_index=True)
    np.testing.assert_array_equal(np.ma.getmaskarray(got.compute()), np.ma.getmaskarray(x))
    np.testing.assert_array_equal(got[:, 3].compute(), x[:, 3])
    with pytest.raises(daskcfa.ArgumentError, match="needs compute=True"):
        daskcfa.to_cfa(x, str(tmp_path / "j.nc"), variable="v", dims=("t", "x"), chunk_index=True, compute=False)


# ---------------------------------------------------------------------------
# Every error is a CFAError, and still the builtin it was (issue 28 item 5)
# ---------------------------------------------------------------------------
def _written(directory):
    directory.mkdir(exist_ok=True)
    url = str(directory / "t.nc")
    daskcfa.to_cfa(X, url, variable="tas", dims=("t", "y"))
    return url


@pytest.mark.parametrize("call, builtin, cls", [
    (lambda url, d: daskcfa.to_cfa(X, url, variable="x", dims=("a", "b")), FileExistsError, "TargetExistsError"),
    (lambda url, d: daskcfa.to_cfa(X, f"{d}/n.nc", variable="x", dims=("a", "b"), format="CF-9"), ValueError,
     "ArgumentError"),
    (lambda url, d: daskcfa.to_cfa(X, f"{d}/n.nc", variable="x", dims=("a", "b"), mode="q"), ValueError,
     "ArgumentError"),
    (lambda url, d: daskcfa.to_cfa(X, f"{d}/n.nc", variable="x", dims=("a", "b"), uris="odd"), ValueError,
     "ArgumentError"),
    (lambda url, d: daskcfa.to_cfa(X, f"{d}/n.nc", variable="x", dims=("a", "b"), max_fragment_size="lots"),
     ValueError, "ArgumentError"),
    (lambda url, d: daskcfa.to_cfa(X, f"{d}/n.nc", variable="x", dims=("a", "b"), fragment_shape=(0, 6)),
     ValueError, "ArgumentError"),
    (lambda url, d: daskcfa.from_cfa(url, missing="skip"), ValueError, "ArgumentError"),
    (lambda url, d: daskcfa.open_cfa(url, missing="skip"), ValueError, "ArgumentError"),
    (lambda url, d: daskcfa.relocate(url, {}, target=_written(Path(d, "o")), uris="absolute"), FileExistsError,
     "TargetExistsError"),
    (lambda url, d: daskcfa.refragment(url, url), FileExistsError, "TargetExistsError"),
    (lambda url, d: daskcfa.Dataset(url, "w", clobber=False), FileExistsError, "TargetExistsError"),
    (lambda url, d: daskcfa.open_cfa(url)["tas"][9, 0], IndexError, "IndexingError"),
])
def test_every_error_is_a_cfa_error_and_still_its_builtin(tmp_path, call, builtin, cls):
    url = _written(tmp_path)
    with pytest.raises(builtin) as info:
        call(url, str(tmp_path))
    assert isinstance(info.value, daskcfa.CFAError), type(info.value)
    assert type(info.value) is getattr(daskcfa, cls)


def test_a_target_that_exists_is_named_in_the_error(tmp_path):
    url = _written(tmp_path)
    with pytest.raises(daskcfa.TargetExistsError) as info:
        daskcfa.to_cfa(X, url, variable="x", dims=("a", "b"))
    assert info.value.file == url and "mode='w'" in str(info.value)


def test_a_misspelt_variable_gets_a_did_you_mean(tmp_path):
    url = _written(tmp_path)
    with pytest.raises(daskcfa.VariableNotFoundError, match=r"'tass' does not exist \(did you mean 'tas'\?\)"):
        daskcfa.from_cfa(url, "tass")


@pytest.mark.parametrize("call", ["from_cfa", "open_cfa", "describe", "verify"])
def test_a_path_object_names_the_aggregation_as_its_string_does(tmp_path, call):
    """``pathlib.Path``, as netCDF4-python and xarray take it (before: AttributeError from urllib)."""
    url = daskcfa.sample(str(tmp_path / "tas.nca"))
    args = (Path(url), "tas") if call == "from_cfa" else (Path(url),)
    assert getattr(daskcfa, call)(*args) is not None


@pytest.mark.parametrize("url", [None, 123, b"/tmp/x.nca"])
def test_an_aggregation_url_of_another_type_is_an_argument_error(url):
    with pytest.raises(daskcfa.ArgumentError, match="string or a path"):
        daskcfa.from_cfa(url, "tas")


@pytest.mark.parametrize("call", [
    lambda url: daskcfa.from_cfa(url, 5),
    lambda url: daskcfa.from_cfa(url, "tas", chunks="bogus"),
    lambda url: daskcfa.from_cfa(url, "tas", chunks=-3),
    lambda url: daskcfa.from_cfa(url, "tas", chunks=(1, 2)),
    lambda url: daskcfa.from_cfa(url, "tas", storage_options=[1]),
    lambda url: daskcfa.open_cfa(url, storage_options="anon"),
], ids=["variable-a-number", "chunks-a-word", "chunks-negative", "chunks-too-few", "options-a-list",
        "options-a-string"])
def test_plausible_argument_mistakes_are_argument_errors(tmp_path, call):
    """Mistakes a user makes in the first hour: a daskcfa error saying what was expected (before: a bare
    AttributeError, dask's ValueError, or a negative chunk size accepted silently)."""
    url = daskcfa.sample(str(tmp_path / "tas.nca"))
    with pytest.raises(daskcfa.ArgumentError):
        call(url)
