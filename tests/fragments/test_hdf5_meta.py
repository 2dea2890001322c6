"""The direct parser of HDF5 metadata (:mod:`daskcfa.fragments.hdf5_meta`) describes every
variable exactly as the h5py path does, or leaves it to h5py: on real netCDF-4 files of
every layout, type and attribute kind netCDF4-python writes (differential), and on those
files' metadata damaged byte by byte (fuzz)."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from daskcfa.fragments.hdf5 import HDF5File, ParsedVariable
from daskcfa.fragments.hdf5_meta import checksum

BENCH = Path("/work/bench-data")
DTYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8"]


def create(nc, name, dtype, dims, **kwargs):
    with warnings.catch_warnings():  # "endian-ness of dtype and endian kwarg do not match"
        warnings.simplefilter("ignore", UserWarning)
        return nc.createVariable(name, dtype, dims, **kwargs)


def values(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype[0] == "f":
        return rng.normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def _types(base: Path) -> list[tuple[Path, list[str]]]:
    out = []
    for dtype in DTYPES:
        path = base / f"types_{dtype}.nc"
        with netCDF4.Dataset(path, "w") as nc:
            nc.createDimension("y", 7)
            nc.createDimension("x", 11)
            names = []
            for endian in ("little", "big"):
                for storage in ("contiguous", "chunked"):
                    name = f"{endian}_{storage}"
                    kw = dict(contiguous=True) if storage == "contiguous" else dict(chunksizes=(3, 4))
                    create(nc, name, dtype, ("y", "x"), endian=endian, **kw)[:] = values(dtype, (7, 11))
                    names.append(name)
        out.append((path, names))
    return out


def _filters(base: Path) -> list[tuple[Path, list[str]]]:
    path = base / "filters.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("t", None)
        nc.createDimension("y", 9)
        nc.createDimension("x", 13)
        storages = {
            "zlib": dict(zlib=True, complevel=4, shuffle=False, chunksizes=(2, 4, 5)),
            "zlib_shuffle": dict(zlib=True, shuffle=True, chunksizes=(2, 4, 5)),
            "fletcher": dict(fletcher32=True, chunksizes=(3, 9, 13)),
            "all": dict(zlib=True, shuffle=True, fletcher32=True, chunksizes=(1, 3, 7)),
            "nofill": dict(fill_value=False, chunksizes=(2, 9, 13)),
        }
        for name, kw in storages.items():
            create(nc, name, "f4", ("t", "y", "x"), **kw)[:] = values("f4", (5, 9, 13))
    second = base / "unwritten.nc"
    with netCDF4.Dataset(second, "w") as nc:
        nc.createDimension("t", None)
        nc.createDimension("y", 9)
        nc.createDimension("x", 13)
        create(nc, "t", "f8", ("t",))[:] = np.arange(3.0)
        create(nc, "unwritten", "i2", ("t", "y", "x"), chunksizes=(1, 9, 13))
        create(nc, "partly", "f8", ("t", "y", "x"), chunksizes=(1, 4, 4), fill_value=-1.5)[1, 2:5, 3] = 7.0
        create(nc, "never", "f4", ("y", "x"), contiguous=True)
    return [(path, [*storages, "t", "y"]), (second, ["unwritten", "partly", "never", "t", "y", "x"])]


def _attributes(base: Path) -> list[tuple[Path, list[str]]]:
    path = base / "attributes.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 6)
        nc.setncattr("title", "a file")
        v = create(nc, "packed", "i2", ("x",), fill_value=np.int16(-999))
        v.missing_value = np.int16(-998)
        v.valid_range = np.array([-500, 500], "i2")
        v.scale_factor = np.float32(0.5)
        v.add_offset = 10.0
        v[:] = np.array([1, -999, 3, -998, 600, 6], "i2")
        u = create(nc, "unsigned", "i1", ("x",), fill_value=np.int8(-1))
        u.setncattr("_Unsigned", "true")
        u[:] = np.array([-1, -2, 3, 4, 5, 6], "i1")
        s = create(nc, "strings", "f8", ("x",))
        s.setncattr("units", "K")
        s.setncattr("empty", "")
        s.setncattr_string("vlen", "a vlen string \u00e9")
        s.setncattr_string("vlens", ["one", "two", ""])
        s[:] = np.arange(6.0)
        n = create(nc, "numbers", "f8", ("x",))
        n.setncattr("numbers", np.arange(5, dtype="u8"))
        n.setncattr("big", np.array([1.5, 2.5], ">f8"))
        n.setncattr("one", np.float32(3.25))
        n.setncattr("bytes", np.array([1, 2], "i1"))
        n[:] = np.arange(6.0)
        d = create(nc, "dense", "f4", ("x",))  # more than 8 attributes: HDF5 stores them densely
        for i in range(12):
            d.setncattr(f"a{i}", i)
        d[:] = 1
    return [(path, ["packed", "unsigned", "strings", "numbers", "dense", "x"])]


def _shapes(base: Path) -> list[tuple[Path, list[str]]]:
    path = base / "shapes.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 4)
        nc.createDimension("y", 3)
        nc.createDimension("lonely", 5)  # a dimension without a variable
        create(nc, "scalar", "f8", ())[...] = 3.5
        create(nc, "x", "f4", ("y",))[:] = [1, 2, 3]  # named like a dimension, not its coordinate
        create(nc, "y", "i4", ("y",))[:] = [7, 8, 9]
        create(nc, "square", "u2", ("y", "y"))[:] = values("u2", (3, 3))
        create(nc, "lonely_user", "f4", ("lonely", "x"))[:] = values("f4", (5, 4))
    groups = base / "groups.nc"
    with netCDF4.Dataset(groups, "w") as nc:
        nc.createDimension("x", 4)
        nc.createDimension("y", 3)
        create(nc, "y", "i4", ("y",))[:] = [7, 8, 9]
        g = nc.createGroup("g")
        g.createDimension("z", 2)
        create(g, "v", "f4", ("z", "x"), chunksizes=(1, 4))[:] = values("f4", (2, 4))
        create(g, "z", "f8", ("z",))[:] = [0.5, 1.5]
        h = g.createGroup("h")
        create(h, "w", "i2", ("y",))[:] = [1, 2, 3]
        create(nc, "text", str, ("y",))[:] = np.array(["a", "bb", "ccc"], object)
    return [(path, ["scalar", "x", "y", "square", "lonely_user", "lonely", "absent", "./y"]),
            (groups, ["g/v", "/g/z", "g/h/w", "text", "absent", "g", "g/absent", "g//v", "y"])]


def _many_links(base: Path) -> list[tuple[Path, list[str]]]:
    path = base / "many_links.nc"
    with netCDF4.Dataset(path, "w") as nc:  # more than 8 links: HDF5 stores them densely
        nc.createDimension("x", 3)
        for i in range(10):
            create(nc, f"v{i}", "f4", ("x",))[:] = i
    return [(path, ["v0", "v9"])]


BUILDERS = [_types, _filters, _attributes, _shapes, _many_links]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[tuple[Path, list[str]]]:
    base = tmp_path_factory.mktemp("hdf5meta")
    out = []
    for build in BUILDERS:
        out += build(base)
    for name in ("n100_f10x512x512_raw_contig", "n1000_f1x180x360_zlib1_c1x180x360",
                 "n100_f10x512x512_zlib1_c1x512x512"):
        frag = BENCH / name / "frag" / "tas_00000.nc"
        if frag.exists():
            out.append((frag, ["tas", "lat", "lon", "time"]))
    return out


def _outcome(call):
    try:
        value = call()
    except Exception as exc:  # (what matters is that both paths fail alike)
        return ("error", type(exc).__name__)
    return value


def describe(source, name: str, parse: bool) -> tuple[dict, bool]:
    """Everything a reader sees of variable ``name``: description, attributes, layout, values;
    and whether the parser described it."""
    try:
        f = HDF5File(source, label="x", parse=parse)
    except Exception as exc:
        return {"open file": ("error", type(exc).__name__)}, False
    with f:
        try:
            var = f.variable(name)
        except Exception as exc:
            return {"open": ("error", type(exc).__name__)}, False
        ndim = len(var.shape)
        keys = [(0,) * ndim, (-1,) * ndim]
        if np.prod(var.shape, dtype=float) <= 1e5:  # (damage may make a dimension huge: read only a corner)
            keys += [(slice(None),) * ndim, (slice(None, None, 2),) * ndim]

        def layout():
            lay = var.storage_layout()
            return (lay.dtype.str, lay.shape, lay.chunks, lay.filters, repr(lay.fill_value), lay.starts.tolist(),
                    lay.byte_offsets.tolist(), lay.sizes.tolist(), lay.filter_masks.tolist())

        def read(key):
            got = var.read(key)
            return got.tobytes(), got.shape, got.dtype.str

        return {
            "what": (var.name, var.shape, var.dtype.str, var.chunks, var.no_fill, var.chunk_nbytes, var.compressed),
            "dims": _outcome(lambda: tuple(var.dims)),
            "names": _outcome(lambda: list(var.attrs)),
            "attrs": _outcome(lambda: [(k, repr(var.attrs.get(k)), k in var.attrs) for k in
                                       [*var.attrs, "_FillValue", "missing_value", "absent", "NAME", "CLASS"]]),
            "fill": _outcome(lambda: repr(var._fill)),
            "layout": _outcome(layout),
            "values": [_outcome(lambda key=key: read(key)) for key in keys],
            "ranges": [_outcome(lambda key=key: var.chunk_ranges(key)) for key in keys],
        }, isinstance(var, ParsedVariable)


def compare(source, name: str) -> bool:
    """Assert both paths describe ``name`` alike; whether the parser described it."""
    new, parsed = describe(source, name, True)
    old, _ = describe(source, name, False)
    assert new == old, name
    return parsed


def test_differential(files):
    parsed, fell_back = [], []
    for path, names in files:
        for name in names:
            (parsed if compare(path, name) else fell_back).append(f"{path.name}:{name}")
    # the parser answers for the common case, and leaves the rest to h5py
    assert {f"types_{dtype}.nc:{endian}_{storage}" for dtype in DTYPES for endian in ("little", "big")
            for storage in ("contiguous", "chunked")} <= set(parsed)
    assert {"filters.nc:all", "filters.nc:zlib", "filters.nc:nofill", "unwritten.nc:unwritten", "unwritten.nc:t",
            "unwritten.nc:never", "attributes.nc:strings", "attributes.nc:numbers", "attributes.nc:packed",
            "shapes.nc:scalar", "shapes.nc:x", "shapes.nc:lonely_user", "groups.nc:g/v", "groups.nc:g/h/w",
            "groups.nc:/g/z"} <= set(parsed)
    assert {"attributes.nc:dense", "many_links.nc:v0", "groups.nc:text"} <= set(fell_back)


def test_differential_in_memory(files):
    for path, names in files[:3]:
        data = np.frombuffer(path.read_bytes(), np.uint8)
        for name in names[:6]:
            compare(data, name)



def test_headers_parsed_before(tmp_path):
    """Object header blocks are remembered by their bytes (fragments repeat them): a file whose
    header sits where an earlier file's did, with other bytes, is described by its own."""
    paths = []
    for units in ("K", "C"):
        path = tmp_path / f"units_{units}.nc"
        with netCDF4.Dataset(path, "w") as nc:
            nc.createDimension("x", 4)
            v = create(nc, "v", "f4", ("x",), contiguous=True)
            v.units = units
            v[:] = np.arange(4.0)
        paths.append(path)
    first, second = (HDF5File(str(path)) for path in paths)
    try:
        described = [f.variable("v") for f in (first, second)]
        assert all(isinstance(v, ParsedVariable) for v in described)
        assert [v.attrs["units"] for v in described] == ["K", "C"]
    finally:
        first.close()
        second.close()
    for path in paths:
        compare(path, "v")

# -- fuzz ---------------------------------------------------------------------


def _headers(data: bytes) -> list[tuple[int, int]]:
    """``(start, checksum offset)`` of the superblock and every first object header block."""
    out = [(0, 44)]
    at = data.find(b"OHDR")
    while at >= 0:
        flags = data[at + 5]
        start = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        size = int.from_bytes(data[at + start:at + start + width], "little")
        end = at + start + width + size
        if end + 4 <= len(data) and int.from_bytes(data[end:end + 4], "little") == checksum(data[at:], end - at):
            out.append((at, end))
        at = data.find(b"OHDR", at + 1)
    return out


def _reseal(data: bytearray, headers: list[tuple[int, int]]) -> None:
    """Recompute the checksums a mutation broke: damage that HDF5's checksums do not catch."""
    for start, end in headers:
        data[end:end + 4] = checksum(bytes(data[start:end]), end - start).to_bytes(4, "little")


def _fuzz_source(tmp_path: Path) -> tuple[bytes, list[str]]:
    path = tmp_path / "fuzz.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("t", None)
        nc.createDimension("x", 5)
        create(nc, "x", "f8", ("x",))[:] = np.arange(5.0)
        v = create(nc, "v", "i2", ("t", "x"), zlib=True, shuffle=True, chunksizes=(2, 3), fill_value=np.int16(-9))
        v.scale_factor = 0.5
        v.setncattr_string("note", ["a", "bc"])
        v.units = "m"
        v[:] = np.arange(20, dtype="i2").reshape(4, 5)
        create(nc, "c", "u1", ("x",), contiguous=True)[:] = np.arange(5, dtype="u1")
    return path.read_bytes(), ["v", "c", "x"]


def test_fuzz(tmp_path):
    data, names = _fuzz_source(tmp_path)
    headers = _headers(data)
    rng = random.Random(15)
    parsed = 0
    for case in range(1200):
        damaged = bytearray(data)
        kind = case % 4
        at = rng.randrange(len(data))
        if kind == 0:  # a bit flipped
            damaged[at] ^= 1 << rng.randrange(8)
        elif kind == 1:  # a few bytes zeroed or set, checksums recomputed
            damaged[at:at + rng.randrange(1, 9)] = bytes([rng.choice([0, 0xFF, rng.randrange(256)])]) * 8
            damaged = damaged[:len(data)]
            _reseal(damaged, headers)
        elif kind == 2:  # one byte changed, checksums recomputed
            damaged[at] = rng.randrange(256)
            _reseal(damaged, headers)
        else:  # truncated
            damaged = damaged[:rng.randrange(len(data))]
        source = np.frombuffer(bytes(damaged), np.uint8)
        for name in names:
            parsed += compare(source, name)
    assert parsed > 500  # (most damage is caught; much is in bytes that do not matter)


def test_what_is_named_without_h5py_is_h5pys():
    """The checksum (from netCDF4-python's HDF5 library), the filter identifiers and the chunk entry type,
    named without importing h5py (a first read does not need it), are h5py's own."""
    import ctypes

    import h5py

    from daskcfa.fragments import hdf5_filters
    from daskcfa.fragments.hdf5 import StoreInfo

    h5 = ctypes.CDLL(h5py.h5.__file__).H5_checksum_metadata
    h5.restype, h5.argtypes = ctypes.c_uint32, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32]
    data = random.Random(31).randbytes(4099)
    assert [checksum(data, n) for n in (0, 1, 44, 4099)] == [h5(data, n, 0) for n in (0, 1, 44, 4099)]
    assert (hdf5_filters.DEFLATE, hdf5_filters.SHUFFLE, hdf5_filters.FLETCHER32) == (
        h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32)
    assert StoreInfo._fields == h5py.h5d.StoreInfo._fields
