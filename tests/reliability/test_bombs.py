"""Small hostile files that demand huge memory, nest groups without end, or
hide file handles: refused with a daskcfa error, within the limits.

Aggregation-file bombs (every dialect): instruction variables compressed
from hundreds of megabytes to kilobytes, declared but never written, vlen
strings that all point at one long string stored once, partition matrices
of millions of partitions listed by a tiny JSON. Each is opened in a child
process whose peak resident memory (``VmHWM``, reset after the imports) is
checked against ``daskcfa.limits.max-memory``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import build

from .conftest import DIMS, SIZES, truth

REPO = Path(__file__).resolve().parents[2]
#: The limit the bombs are opened under, and what their child process may grow by.
LIMIT = 64 << 20

#: Opens ``path`` in a fresh process and reports the error and the peak RSS growth.
RUNNER = r"""
import json, sys
import dask, psutil
import daskcfa
from daskcfa import from_cfa, open_cfa  # (daskcfa imports its reading modules on first use: before the baseline)
import dask.array, h5py, zarr, numcodecs.blosc, numcodecs.lz4, numcodecs.zstd  # (daskcfa imports these lazily: likewise)
from daskcfa_testing.memory import peak_rss

args = json.loads(sys.argv[1])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
baseline = psutil.Process().memory_info().rss
result = {"error": None}
with dask.config.set(args["config"]):
    try:
        if args["action"] == "open":
            daskcfa.open_cfa(args["path"])
        else:
            x = daskcfa.from_cfa(args["path"], args.get("variable"))
            result["value"] = float(x[tuple(args["index"])].compute(scheduler="synchronous"))
    except Exception as exc:
        result.update(error=type(exc).__name__, message=str(exc)[:500], file=getattr(exc, "file", None),
                      variable=getattr(exc, "variable", None))
result["growth"] = peak_rss() - baseline
print(json.dumps(result))
"""


def run_isolated(path: Path, *, action: str = "open", config: dict | None = None, **kw) -> dict:
    """Open (or read a point of) ``path`` in a child process; its error and peak memory growth."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    spec = {"path": str(path), "action": action, "config": config or {}, **kw}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(spec)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- bomb builders ------------------------------------------------------------------


def _one_dim_cf(path: Path, n: int, *, uris: str = "vlen", keyword_map: str = "map") -> netCDF4.Dataset:
    """A CF-1.13 aggregation ``tas(big)`` of ``n`` one-element fragments (map of ones), uris not written."""
    ds = netCDF4.Dataset(path, "w")
    ds.createDimension("big", n)
    ds.createDimension("i", 1)
    tas = ds.createVariable("tas", "f4", ())
    tas.aggregated_dimensions = "big"
    tas.aggregated_data = "map: fragment_map uris: fragment_uris identifiers: fragment_identifiers"
    m = ds.createVariable("fragment_map", "i4", ("i", "big"), zlib=True, chunksizes=(1, min(n, 1 << 20)))
    for start in range(0, n, 1 << 20):
        m[0, start:start + (1 << 20)] = np.ones(min(1 << 20, n - start), "i4")
    ds.createVariable("fragment_identifiers", str, ())[...] = np.array("tas", dtype=object)
    if uris == "vlen":
        ds.createVariable("fragment_uris", str, ("big",), zlib=True, shuffle=False, chunksizes=(n,))
    else:
        ds.createDimension("strlen", 1 << 16)
        ds.createVariable("fragment_uris", "S1", ("big", "strlen"), zlib=True, chunksizes=(1, 1 << 16))
    return ds


def _share_first_string(path: Path, name: str, length: int) -> None:
    """Make every element of the vlen variable ``name`` point at one string of ``length``
    characters stored once: the file stays small, reading it costs N x ``length``."""
    with netCDF4.Dataset(path, "a") as ds:
        ds[name][0] = "x" * length
    with h5py.File(path, "r+") as f:
        dataset = f[name]
        info = dataset.id.get_chunk_info(0)
        mask, raw = dataset.id.read_direct_chunk(info.chunk_offset)
        ids = zlib.decompress(raw)  # 16 bytes per element: length, heap collection address, index
        dataset.id.write_direct_chunk(info.chunk_offset, zlib.compress(ids[:16] * (len(ids) // 16), 9), mask)


def bomb_cf_map(tmp_path: Path) -> Path:
    """CF-1.13: a map padded to 12 million int64 columns, written and zlib-compressed."""
    base = build("CF-1.13", tmp_path / "cf", truth(), DIMS, SIZES)
    path = tmp_path / "cf-map.nc"
    shutil.copy(base.path, path)
    columns = 4_000_000
    with netCDF4.Dataset(path, "a") as ds:
        ds.createDimension("bomb", columns)
        m = ds.createVariable("bomb_map", "i8", ("i", "bomb"), zlib=True, complevel=9, chunksizes=(1, 1 << 20))
        for start in range(0, columns, 1 << 20):
            m[:, start:start + (1 << 20)] = np.full((3, min(1 << 20, columns - start)), -1, "i8")
        m[:, :3] = np.array([[2, 3, 1], [4, -1, -1], [2, 3, -1]], "i8")
        ds["tas"].aggregated_data = "map: bomb_map uris: fragment_uris identifiers: fragment_identifiers"
    return path


def bomb_cfa06_location(tmp_path: Path) -> Path:
    """CFA-0.6: a ``location`` variable declared over 12 million int64 values, never written."""
    base = build("CFA-0.6", tmp_path / "cfa06", truth(), DIMS, SIZES)
    path = tmp_path / "cfa06-location.nc"
    shutil.copy(base.path, path)
    with netCDF4.Dataset(path, "a") as ds:
        ds.createDimension("bomb", 4_000_000)
        ds.createVariable("bomb_location", "i8", ("cfa_ndim", "bomb"), zlib=True, chunksizes=(1, 1 << 20))
        ds["tas"].aggregated_data = "location: bomb_location file: cfa_file format: cfa_format address: cfa_address"
    return path


def bomb_cf_char_uris(tmp_path: Path) -> Path:
    """CF-1.13: char-array URIs of 2,000 x 65,536 characters, never written (netCDF4's
    chartostring alone would take 4 bytes per character)."""
    path = tmp_path / "cf-char-uris.nc"
    _one_dim_cf(path, 2_000, uris="char").close()
    return path


def bomb_cf_vlen_uris(tmp_path: Path) -> Path:
    """CF-1.13: 10,000 vlen URIs that all point at one 60,000-character string (600 MB when read)."""
    path = tmp_path / "cf-vlen-uris.nc"
    _one_dim_cf(path, 10_000).close()
    _share_first_string(path, "fragment_uris", 60_000)
    return path


def bomb_cfa05_matrix(tmp_path: Path) -> Path:
    """CFA-0.5: a partition matrix of a million partitions, its members declared and never written."""
    path = tmp_path / "cfa05-matrix.nc"
    n = 1_000_000
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("big", n)
        tas = ds.createVariable("tas", "f4", ())
        tas.setncatts({"cf_role": "cfa_variable", "cfa_dimensions": "big", "cfa_group": "cfa_tas"})
        g = ds.createGroup("cfa_tas")
        g.createDimension("big", n)
        g.createDimension("ndimensions", 1)
        g.createDimension("bounds", 2)
        g.createVariable("pmshape", "i4", ("ndimensions",))[...] = [n]
        for name in ("file", "ncvar", "format"):
            g.createVariable(name, str, ("big",), zlib=True, chunksizes=(1 << 16,))
        g.createVariable("location", "i4", ("big", "ndimensions", "bounds"), zlib=True)
    return path


def _json_aggregation(path: Path, attr: str, text: str) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("big", 30_000_000)
        tas = ds.createVariable("tas", "f4", ())
        role, dims = ("nca_variable", "nca_dimensions") if attr == "nca_array" else ("cfa_variable", "cfa_dimensions")
        tas.setncatts({"cf_role": role, dims: "big", attr: text})


def bomb_nca_matrix(tmp_path: Path) -> Path:
    """NCA: a 200-byte JSON claiming a partition matrix of 30 million partitions (one listed)."""
    path = tmp_path / "nca-matrix.nc"
    partition = {"index": [0], "location": [[0, 1]], "data": {"file": "f.nc", "ncvar": "tas", "shape": [1]}}
    _json_aggregation(path, "nca_array", json.dumps({"pdimensions": ["big"], "pshape": [30_000_000],
                                                     "Partitions": [partition]}))
    return path


def bomb_cfa04_json(tmp_path: Path) -> Path:
    """CFA-0.4: 6 MB of JSON made of empty lists (about 24 bytes of Python objects per byte of text)."""
    path = tmp_path / "cfa04-json.nc"
    _json_aggregation(path, "cfa_array", '{"pmshape": [1], "pmdimensions": ["big"], "padding": ['
                      + ",".join(["[]"] * 2_000_000) + '], "Partitions": []}')
    return path


BOMBS = {
    "CF-1.13 map": (bomb_cf_map, "bomb_map"),
    "CFA-0.6 location": (bomb_cfa06_location, "bomb_location"),
    "CF-1.13 char uris": (bomb_cf_char_uris, "fragment_uris"),
    "CF-1.13 vlen uris": (bomb_cf_vlen_uris, "fragment_uris"),
    "CFA-0.5 matrix": (bomb_cfa05_matrix, "fragments"),
    "NCA matrix": (bomb_nca_matrix, "fragments"),
    "CFA-0.4 JSON": (bomb_cfa04_json, "cfa_array"),
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_aggregation_file_bombs_are_refused_within_the_memory_limit(tmp_path, case):
    """Each bomb: a CFAFormatError naming the file, the variable and what was refused,
    and the process never grows past ``daskcfa.limits.max-memory``."""
    make, named = BOMBS[case]
    path = make(tmp_path)
    result = run_isolated(path, config={"daskcfa.limits.max-memory": LIMIT})
    size = path.stat().st_size
    print(f"\n{case}: {size / 1e3:.0f} kB file, peak growth {result['growth'] / 2**20:.0f} MiB: {result.get('message')}")
    assert result["error"] == "CFAFormatError", result
    assert result["file"] == str(path) and result["variable"] == "/tas", result
    assert named in result["message"] and "daskcfa.limits.max-" in result["message"], result
    assert result["growth"] < LIMIT, f"peak growth {result['growth'] / 2**20:.0f} MiB"


def test_the_memory_limit_leaves_genuine_files_alone(tmp_path):
    """Every dialect still opens under a small limit, and the fragment-count limit follows the
    memory limit unless set on its own."""
    from daskcfa import limits

    for dialect in ("CF-1.13", "CFA-0.6", "CFA-0.5", "CFA-0.4", "NCA"):
        built = build(dialect, tmp_path / dialect, truth(), DIMS, SIZES)
        with dask_config({"daskcfa.limits.max-memory": "1MiB"}):
            np.testing.assert_array_equal(daskcfa.from_cfa(str(built.path), built.variable).compute(), built.expected)
    with dask_config({"daskcfa.limits.max-memory": "1GiB"}):
        assert limits.max_fragments() == (1 << 30) // limits.FRAGMENT_BYTES
    with dask_config({"daskcfa.limits.max-memory": "1GiB", "daskcfa.limits.max-fragments": 10}):
        assert limits.max_fragments() == 10


@pytest.mark.parametrize("lengths_known", [True, False])
def test_vlen_strings_are_charged_before_they_are_read(tmp_path, monkeypatch, lengths_known):
    """Shared-string URIs under a limit they fit in: read, the values netCDF4 gives; under one
    they do not fit in: refused. Their lengths are summed from the stored heap pointers, or
    (``lengths_known=False``: storage not understood) the strings are read in charged pieces."""
    from daskcfa.formats import aggregated_variables, netcdf

    path = tmp_path / "shared.nc"
    _one_dim_cf(path, 64).close()
    _share_first_string(path, "fragment_uris", 1000)
    assert netcdf.stored_string_bytes(str(path), "/fragment_uris") == 64 * 1000
    if not lengths_known:
        monkeypatch.setattr(netcdf, "stored_string_bytes", lambda path, name: None)
    with dask_config({"daskcfa.limits.max-memory": "1MiB"}), netCDF4.Dataset(path) as ds:
        parsed = aggregated_variables(ds, str(path))["/tas"]
        expected = ds["fragment_uris"][...]
    assert parsed.fragments.uris.shape == (64, 1)
    np.testing.assert_array_equal(parsed.fragments.uris[:, 0], expected)
    with dask_config({"daskcfa.limits.max-memory": 60_000}), netCDF4.Dataset(path) as ds:
        with pytest.raises(daskcfa.CFAFormatError, match="of variable 'fragment_uris'") as info:
            aggregated_variables(ds, str(path))
    assert info.value.file == str(path) and info.value.variable == "/tas"


def dask_config(values: dict):
    import dask

    return dask.config.set(values)


# -- nested groups ----------------------------------------------------------------------


def _nest(path: Path, depth: int) -> Path:
    with netCDF4.Dataset(path, "a") as ds:
        group = ds
        for i in range(depth):
            group = group.createGroup(f"g{i}")
    return path


@pytest.mark.parametrize("depth", [150, 1000])
def test_deeply_nested_groups_are_refused_everywhere(tmp_path, depth):
    """150 levels (netCDF4 opens them; deeper than max-group-depth) and 1,000 (netCDF4-python
    itself recurses): a CFAFormatError naming the file from every path that walks groups."""
    import xarray

    from daskcfa.archive.info import describe

    base = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    path = str(_nest(base.path, depth))
    attempts = {
        "open_cfa": lambda: daskcfa.open_cfa(path),
        "describe": lambda: describe(path),
        "open_datatree": lambda: xarray.open_datatree(path, engine="daskcfa"),
        "open_dataset": lambda: xarray.open_dataset(path, engine="daskcfa"),
    }
    for name, attempt in attempts.items():
        with pytest.raises(daskcfa.CFAFormatError, match="nested") as info:
            attempt()
        assert info.value.file == path, name
    if depth == 1000:  # scanning reads only the root group, but netCDF4-python opens them all
        with pytest.raises(daskcfa.AggregationError, match="nested"):
            daskcfa.aggregate([path], str(tmp_path / "out.nc"))


def test_groups_within_the_depth_limit_open(tmp_path):
    base = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)
    path = str(_nest(base.path, 100))
    tree = __import__("xarray").open_datatree(path, engine="daskcfa")
    assert tree["/".join(f"g{i}" for i in range(100))] is not None
    np.testing.assert_array_equal(tree["tas"].values, base.expected.filled(np.nan))


# -- chunk bombs ----------------------------------------------------------------------

#: Elements of the bomb fragment: one chunk of 1 GiB of float32 zeros, about 1 MB deflated.
BOMB_ELEMENTS = 1 << 28


@functools.lru_cache
def _deflated_zeros(nbytes: int) -> bytes:
    """A valid zlib stream of ``nbytes`` zeros, built fast: after a full flush the compressor
    emits the same bytes for the same input, so one 16 MiB block is compressed once and
    repeated; the Adler-32 trailer is computed over the whole."""
    piece = bytes(min(nbytes, 16 << 20))
    compressor = zlib.compressobj(9)
    first = compressor.compress(piece) + compressor.flush(zlib.Z_FULL_FLUSH)
    again = compressor.compress(piece) + compressor.flush(zlib.Z_FULL_FLUSH)
    end = compressor.flush()[:-4]
    adler = 1
    for _ in range(nbytes // len(piece)):
        adler = zlib.adler32(piece, adler)
    return first + again * (nbytes // len(piece) - 1) + end + adler.to_bytes(4, "big")


def chunk_bomb(directory: Path, *, declared: int = BOMB_ELEMENTS, inflated: int = BOMB_ELEMENTS) -> Path:
    """A CF-1.13 aggregation of one fragment ``x(n)`` whose single zlib chunk declares ``declared``
    float32 elements and whose stream inflates to ``inflated`` elements' bytes."""
    from remote_helpers import write_cf113

    directory.mkdir(parents=True, exist_ok=True)
    fragment = directory / "bomb.nc"
    with netCDF4.Dataset(fragment, "w") as ds:
        ds.createDimension("n", declared)
        ds.createVariable("x", "f4", ("n",), zlib=True, shuffle=False, chunksizes=(declared,))
    with h5py.File(fragment, "r+") as f:
        f["x"].id.write_direct_chunk((0,), _deflated_zeros(4 * inflated), 0)
    return write_cf113(directory / "agg.nc", "x", ("n",), [[declared]], [["bomb.nc"]])


@pytest.mark.parametrize("engine", ["direct", "netcdf4"])
def test_a_chunk_larger_than_the_memory_budget_is_refused_before_it_is_inflated(tmp_path, engine):
    """A 1 MB fragment holding one 1 GiB zlib chunk, read for one value with a 64 MiB budget:
    a BudgetError naming the fragment, and the process stays far below a gigabyte."""
    path = chunk_bomb(tmp_path)
    assert (tmp_path / "bomb.nc").stat().st_size < 2 << 20
    config = {"daskcfa.io.engine": engine, "daskcfa.budget.memory": "64MiB"}
    result = run_isolated(path, action="read", variable="x", index=[BOMB_ELEMENTS - 1], config=config)
    print(f"\nchunk bomb, {engine}: peak growth {result['growth'] / 2**20:.0f} MiB: {result.get('message')}")
    assert result["error"] == "BudgetError", result
    assert "a chunk of variable 'x'" in result["message"] and "daskcfa.budget.memory" in result["message"]
    assert result["file"].endswith("bomb.nc") and result["variable"] == "/x", result
    assert result["growth"] < 64 << 20


def test_the_default_memory_budget_refuses_a_chunk_bomb(tmp_path):
    """No budget configured: the default (512 MiB) still refuses the 1 GiB chunk."""
    result = run_isolated(chunk_bomb(tmp_path), action="read", variable="x", index=[0])
    assert result["error"] == "BudgetError" and "536,870,912" in result["message"], result
    assert result["growth"] < 64 << 20


def test_a_chunk_inflating_past_its_size_is_refused_without_inflating_it(tmp_path):
    """A chunk declared as 1 MiB whose stream inflates to 1 GiB: the direct reader stops one
    byte past the declared size (FragmentReadError), in little memory."""
    path = chunk_bomb(tmp_path, declared=1 << 18)
    result = run_isolated(path, action="read", variable="x", index=[(1 << 18) - 1],
                          config={"daskcfa.io.engine": "direct"})
    print(f"\nlying chunk, direct: peak growth {result['growth'] / 2**20:.0f} MiB: {result.get('message')}")
    assert result["error"] == "FragmentReadError" and "holds" in result["message"], result
    assert result["growth"] < 64 << 20


def test_chunks_within_the_budget_read_exactly(tmp_path):
    """A 4 MiB chunk under a 64 MiB budget: read by both engines, values as numpy wrote them,
    and the bytes counted while decoding are released afterwards."""
    import dask

    from daskcfa.fragments.manager import manager

    from remote_helpers import write_cf113

    values = np.arange(1 << 20, dtype="f4")
    with netCDF4.Dataset(tmp_path / "f.nc", "w") as ds:
        ds.createDimension("n", values.size)
        ds.createVariable("x", "f4", ("n",), zlib=True, chunksizes=(values.size,))[...] = values
    path = write_cf113(tmp_path / "agg.nc", "x", ("n",), [[values.size]], [["f.nc"]])
    for engine in ("direct", "netcdf4"):
        with dask.config.set({"daskcfa.io.engine": engine}):
            before = manager().stats()["bytes"]
            got = daskcfa.from_cfa(str(path), "x")[::1000].compute(scheduler="synchronous")
            np.testing.assert_array_equal(got, values[::1000])
            assert manager().stats()["bytes"] == before
