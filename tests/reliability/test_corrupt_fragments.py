"""Damaged fragment files: a clear daskcfa error naming the fragment, or missing data
when the user asked for ``missing="fill"`` -- never a crash or silent garbage.

Real damage on real files: truncation, bit flips in the HDF5 metadata and in
compressed chunks (every flip read back in a child process, so that a
segfault in a C library would show as a failed test, not a dead pytest),
files replaced by something that is not netCDF, and fragments rewritten with
another shape or data type. Both read engines (the direct HDF5 reader and
netCDF4-python) and both remote strategies (whole object, byte ranges) are
exercised.
"""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
import warnings
from pathlib import Path

import dask
import h5py
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import Frag, assert_matches, build_cf113
from remote_helpers import upload

from .conftest import DIMS, SIZES, VICTIM, forget_open_files, fragment_error_names, replace_file, truth

pytestmark = pytest.mark.usefixtures("sync_dask")

ENGINES = ("direct", "netcdf4")
SWEEP = Path(__file__).with_name("_flip_sweep.py")
#: Flips read back per engine and region; see docs/reliability.md for the counts.
HEADER_FLIPS = 300
CHUNK_FLIPS = 150


def _dataset(tmp_path, storage=None, **kw):
    frags = (lambda index: Frag(storage=storage)) if storage else None
    return build_cf113(tmp_path / "ds", truth(), DIMS, SIZES, frags=frags, **kw)


def _victim(built) -> Path:
    return built.fragment_files[VICTIM]


def _read(built, **kw):
    forget_open_files()
    return daskcfa.from_cfa(str(built.path), "tas", **kw).compute()


def _expect_error(built, cls=daskcfa.FragmentReadError, **kw):
    with pytest.raises(daskcfa.CFAError) as info:
        _read(built, **kw)
    assert isinstance(info.value, cls), f"{type(info.value).__name__}: {info.value}"
    fragment_error_names(info.value, _victim(built).name)
    return info.value


def _expect_filled(built, **kw):
    """missing="fill": the damaged fragment reads as missing data, with a warning naming it."""
    with pytest.warns(daskcfa.CFAWarning) as record:
        got = _read(built, missing="fill", **kw)
    messages = [str(w.message) for w in record if issubclass(w.category, daskcfa.CFAWarning)]
    assert any(str(VICTIM) in m and _victim(built).name in m for m in messages), messages
    expected = built.expected.copy()
    expected[built_slices(built)] = np.ma.masked
    assert_matches(got, expected)


def built_slices(built):
    offsets = [np.cumsum((0,) + tuple(row)) for row in built.sizes]
    return tuple(slice(int(o[i]), int(o[i + 1])) for o, i in zip(offsets, VICTIM))


# ---------------------------------------------------------------------------
# Truncated, replaced, emptied
# ---------------------------------------------------------------------------
TRUNCATIONS = {"empty": lambda n: 0, "signature-only": lambda n: 8, "first-kilobyte": lambda n: 1024,
               "half": lambda n: n // 2, "last-byte-missing": lambda n: n - 1}
NOT_NETCDF = {
    "text": b"this is not a netCDF file\n" * 40,
    "png": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8,
    "hdf5-signature-then-zeros": b"\x89HDF\r\n\x1a\n" + bytes(4096),
    "netcdf3-signature-then-junk": b"CDF\x01" + bytes(range(256)) * 4,
    "random": random.Random(7).randbytes(5000),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("how", sorted(TRUNCATIONS))
@pytest.mark.parametrize("storage", [None, {"zlib": True}], ids=["contiguous", "zlib"])
def test_truncated_fragment(tmp_path, engine, how, storage):
    built = _dataset(tmp_path, storage)
    data = _victim(built).read_bytes()
    replace_file(_victim(built), data[: TRUNCATIONS[how](len(data))])
    with dask.config.set({"daskcfa.io.engine": engine}):
        _expect_error(built)
        _expect_filled(built)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("what", sorted(NOT_NETCDF))
def test_fragment_replaced_by_something_else(tmp_path, engine, what):
    built = _dataset(tmp_path)
    replace_file(_victim(built), NOT_NETCDF[what])
    with dask.config.set({"daskcfa.io.engine": engine}):
        _expect_error(built)
        _expect_filled(built)


def test_fragment_replaced_by_a_directory(tmp_path):
    built = _dataset(tmp_path)
    _victim(built).unlink()
    (_victim(built) / "inside").mkdir(parents=True)
    _expect_error(built)
    _expect_filled(built)


def test_missing_fragment_and_fill(tmp_path):
    built = _dataset(tmp_path)
    _victim(built).unlink()
    _expect_error(built, daskcfa.MissingFragmentError)
    _expect_filled(built)
    # open_cfa takes the same choice, for every aggregated variable
    with pytest.warns(daskcfa.CFAWarning, match=r"\(1, 0, 1\)"):
        got = daskcfa.open_cfa(str(built.path), missing="fill")["tas"][...]
    assert np.ma.getmaskarray(got)[built_slices(built)].all()
    with pytest.raises(ValueError, match="missing"):
        daskcfa.from_cfa(str(built.path), "tas", missing="ignore")


def test_fill_never_hides_an_unsafe_uri_or_unconvertible_units(tmp_path):
    built = _dataset(tmp_path)
    outside = tmp_path / "outside.nc"
    _victim(built).rename(outside)
    with netCDF4.Dataset(built.path, "a") as ds:
        uris = ds["fragment_uris"]
        uris[VICTIM] = str(outside)
    x = daskcfa.from_cfa(str(built.path), "tas", missing="fill", allowed_locations=[str(tmp_path / "ds")])
    with pytest.raises(daskcfa.UnsafeURIError):
        x.compute()
    units = build_cf113(tmp_path / "units", truth(), DIMS, SIZES,
                        frags=lambda i: Frag(units="m", raw_units=True) if i == VICTIM else Frag())
    with pytest.raises(daskcfa.UnitsError):
        daskcfa.from_cfa(str(units.path), "tas", missing="fill").compute()


# ---------------------------------------------------------------------------
# Changed shape or data type
# ---------------------------------------------------------------------------
def _rewrite_victim(built, shape=None, dtype=None, values=None, dims=None):
    path = _victim(built)
    with netCDF4.Dataset(path) as ds:
        var = ds["tas"]
        attrs = {k: var.getncattr(k) for k in var.ncattrs() if k != "_FillValue"}
        fill = var.getncattr("_FillValue") if "_FillValue" in var.ncattrs() else None
        var.set_auto_mask(False)
        old = var[...]  # masked points keep their stored fill value
        names = dims or var.dimensions
    shape = shape or old.shape
    data = values if values is not None else np.resize(old, shape)
    dtype = dtype or data.dtype
    path.unlink()
    with netCDF4.Dataset(path, "w") as ds:
        for name, n in zip(names, shape):
            ds.createDimension(name, n)
        fill = None if dtype is str or fill is None or values is not None else np.asarray(fill).astype(dtype)
        var = ds.createVariable("tas", str if dtype is str else dtype, names, fill_value=fill)
        var.setncatts(attrs)
        if dtype is str:
            var[...] = np.full(shape, "x", dtype=object)
        else:
            var[...] = np.asarray(data).astype(dtype)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("change", ["fewer-rows", "more-rows", "extra-dimension"])
def test_fragment_with_changed_shape(tmp_path, engine, change):
    built = _dataset(tmp_path)
    shape = tuple(row[i] for row, i in zip(built.sizes, VICTIM))  # (3, 4, 3)
    new = {"fewer-rows": ((2,) + shape[1:], None), "more-rows": ((4,) + shape[1:], None),
           "extra-dimension": (shape + (2,), DIMS + ("level",))}[change]
    _rewrite_victim(built, shape=new[0], dims=new[1])
    with dask.config.set({"daskcfa.io.engine": engine}):
        _expect_error(built, daskcfa.FragmentShapeError)
        _expect_filled(built)


@pytest.mark.parametrize("engine", ENGINES)
def test_fragment_with_dimension_names_reversed(tmp_path, engine):
    """Names are not significant (CF, CFA): a fragment of the right shape whose dimensions
    carry the aggregated names reversed is read by position, with a warning naming it."""
    built = _dataset(tmp_path)
    shape = tuple(row[i] for row, i in zip(built.sizes, VICTIM))  # (3, 4, 3): reversed, the same
    _rewrite_victim(built, shape=shape[::-1], dims=DIMS[::-1])
    with dask.config.set({"daskcfa.io.engine": engine}), pytest.warns(daskcfa.CFAWarning, match="another order"):
        assert_matches(_read(built), built.expected)


@pytest.mark.parametrize("engine", ENGINES)
def test_fragment_with_changed_dtype(tmp_path, engine):
    with dask.config.set({"daskcfa.io.engine": engine}):
        # text instead of numbers: refused
        built = _dataset(tmp_path / "text")
        _rewrite_victim(built, dtype=str)
        _expect_error(built)
        _expect_filled(built)
        # the same numbers in a wider type: canonical form casts them, exactly (numpy's rule)
        built = _dataset(tmp_path / "wider")
        _rewrite_victim(built, dtype="f8")
        assert_matches(_read(built), built.expected)
        # integers aggregated as int16, one fragment rewritten as floats beyond int16: refused, not wrapped
        ints = build_cf113(tmp_path / "ints", truth(dtype="i2", masked=0.0), DIMS, SIZES)
        values = np.full(tuple(row[i] for row, i in zip(ints.sizes, VICTIM)), 1e6)
        _rewrite_victim(ints, dtype="f8", values=values)
        err = _expect_error(ints)
        assert "outside the range" in str(err)
        values[0, 0, 0] = np.nan
        _rewrite_victim(ints, dtype="f8", values=values)
        assert "NaN" in str(_expect_error(ints))


# ---------------------------------------------------------------------------
# Bit flips, read back in a child process
# ---------------------------------------------------------------------------
def _sweep(tmp_path, built, flips, engines=ENGINES) -> collections.Counter:
    np.save(tmp_path / "expected.npy", np.ma.getdata(built.expected))
    np.save(tmp_path / "mask.npy", np.ma.getmaskarray(built.expected))
    spec = {"victim": str(_victim(built)), "aggregation": str(built.path), "index": list(VICTIM),
            "expected": str(tmp_path / "expected.npy"), "mask": str(tmp_path / "mask.npy"),
            "engines": list(engines), "flips": [list(f) for f in flips]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(SWEEP), str(tmp_path / "spec.json")], capture_output=True,
                          text=True, timeout=900)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]
    assert proc.returncode == 0, (f"the reader died (exit {proc.returncode}) after flip {lines[-1:] or 'none'}: "
                                  f"{proc.stderr[-3000:]}")
    assert len(lines) == len(flips) * len(engines)
    bad = [line for line in lines if line[3].startswith(("other", "unlocated"))]
    assert not bad, f"flips that escaped as non-daskcfa or unlocated errors: {bad[:10]}"
    return collections.Counter((line[0], line[3].split(":")[0]) for line in lines)


def _data_start(path: Path) -> tuple[int, int]:
    """Byte range of the fragment variable's data (its only chunk, or its contiguous block)."""
    with h5py.File(path) as f:
        dsid = f["tas"].id
        if f["tas"].chunks is None:
            return dsid.get_offset(), dsid.get_storage_size()
        info = dsid.get_chunk_info(0)
        return info.byte_offset, info.size


def test_bit_flips_in_the_hdf5_metadata(tmp_path):
    """Flips anywhere before the data (superblock, object headers, attributes, heaps):
    an error naming the fragment, or a read that is exactly right -- never a crash, never garbage."""
    built = _dataset(tmp_path)  # contiguous layout: everything before the data is metadata
    start, _ = _data_start(_victim(built))
    rng = random.Random(20261123)
    flips = sorted({(rng.randrange(start), rng.randrange(8)) for _ in range(HEADER_FLIPS)})
    outcomes = _sweep(tmp_path, built, flips)
    for engine in ENGINES:
        assert outcomes[(engine, "diff")] == 0, outcomes
        assert outcomes[(engine, "error")] > len(flips) // 10, outcomes  # the sweep really hit the headers
    print("metadata flips:", dict(outcomes))


@pytest.mark.parametrize("storage", [{"zlib": True}, {"zlib": True, "shuffle": True, "fletcher32": True},
                                     {"fletcher32": True}], ids=["zlib", "zlib-shuffle-fletcher32", "fletcher32"])
def test_bit_flips_in_checked_chunks(tmp_path, storage):
    """Flips in a compressed (deflate's Adler-32) or Fletcher-32-checked chunk are detected."""
    built = _dataset(tmp_path, storage)
    start, size = _data_start(_victim(built))
    rng = random.Random(11)
    flips = sorted({(start + rng.randrange(size), rng.randrange(8)) for _ in range(CHUNK_FLIPS)})
    outcomes = _sweep(tmp_path, built, flips)
    for engine in ENGINES:
        assert outcomes[(engine, "diff")] == 0, outcomes
        assert outcomes[(engine, "error")] >= 0.9 * len(flips), outcomes
    print("chunk flips:", dict(outcomes))


def test_bit_flips_in_the_chunk_index_never_crash(tmp_path):
    """HDF5 keeps a chunked variable's index in a version-1 B-tree *without a checksum*:
    a flip there can hide a chunk (it reads as fill values) or skip a filter, and neither
    HDF5 nor anything above it can tell (see docs/reliability.md). What must hold even
    there: no crash, no non-daskcfa exception, every error located."""
    built = _dataset(tmp_path, {"zlib": True})
    tree = _victim(built).read_bytes().index(b"TREE")  # the chunk index's node signature
    flips = [(tree + offset, bit) for offset in range(72) for bit in (0, 5)]
    outcomes = _sweep(tmp_path, built, flips)
    print("chunk-index flips:", dict(outcomes))


# ---------------------------------------------------------------------------
# The same damage on S3: whole-object and byte-range reads
# ---------------------------------------------------------------------------
REMOTE_DAMAGE = {
    "truncated": lambda data, built: data[: len(data) // 2],
    "not-netcdf": lambda data, built: NOT_NETCDF["random"],
    "hdf5-signature-then-zeros": lambda data, built: NOT_NETCDF["hdf5-signature-then-zeros"],
    "flipped-chunk": lambda data, built: _flip_in_chunk(data, built),
}


def _flip_in_chunk(data: bytes, built) -> bytes:
    start, size = _data_start(_victim(built))
    damaged = bytearray(data)
    damaged[start + size // 2] ^= 0x10
    return bytes(damaged)


@pytest.mark.parametrize("strategy", ["whole", "direct", "ranges"])
@pytest.mark.parametrize("damage", sorted(REMOTE_DAMAGE))
def test_damaged_fragment_on_s3(tmp_path, s3_server, s3_bucket, s3fs_fs, strategy, damage, monkeypatch):
    if strategy == "direct":  # as large objects are read: a blocking GET into one buffer, HDF5 through a file object
        from daskcfa import storage
        from daskcfa.fragments import hdf5

        monkeypatch.setattr(storage.objects, "_DIRECT_FROM", 0)
        monkeypatch.setattr(hdf5, "_IMAGE_BYTES", 0)
    built = _dataset(tmp_path, {"zlib": True, "chunksizes": (1, 2, 2)})
    victim = _victim(built)
    replace_file(victim, REMOTE_DAMAGE[damage](victim.read_bytes(), built))
    base = upload(s3fs_fs, tmp_path / "ds", s3_bucket, "ds")
    url = f"{base}/{built.path.name}"
    config = ({"daskcfa.io.whole-fragment-fraction": 1.1, "daskcfa.io.small-object": 0} if strategy == "ranges"
              else {"daskcfa.io.whole-fragment-fraction": 0.0, "daskcfa.io.small-object": 0})
    with dask.config.set(config):
        x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
        with pytest.raises(daskcfa.CFAError) as info:
            x[:, :2].compute()  # part of each fragment: byte ranges when allowed
        fragment_error_names(info.value, victim.name)
        assert s3_server.secret not in str(info.value)
        with pytest.warns(daskcfa.CFAWarning, match=victim.name):
            got = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options,
                                   missing="fill")[:, :2].compute()
    expected = built.expected.copy()
    expected[built_slices(built)] = np.ma.masked
    assert_matches(got, expected[:, :2])


def test_warnings_are_not_errors_by_default(tmp_path):
    """A healthy dataset read with missing="fill" warns about nothing."""
    built = _dataset(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_matches(_read(built, missing="fill"), built.expected)
