"""Fast start: ``import daskcfa`` and ``daskcfa --help`` do not import the heavy libraries.

Timings are measured by ``benchmarks/startup.py`` (not asserted here: a busy
machine would make such a test flaky); what makes them fast is checked
instead: which modules a fresh interpreter has imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HEAVY = ("distributed", "dask.array", "netCDF4", "h5py", "xarray", "s3fs", "fsspec", "numpy", "cf_units")


def run(code: str) -> tuple[set[str], list[str]]:
    """The heavy modules a fresh interpreter has imported after running ``code``, and what it printed."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120,
                         cwd=Path(__file__).parents[1]).stdout.splitlines()
    return set(json.loads(out[-1])), out[:-1]


def imported_after(code: str) -> set[str]:
    return run(code)[0]


def test_import_daskcfa_imports_nothing_heavy():
    assert imported_after("import daskcfa; daskcfa.CFAError; daskcfa.__version__") == set()


def test_help_imports_nothing_heavy():
    code = ("import contextlib, io\nfrom daskcfa.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['split', '--help'])\n    except SystemExit:\n        pass")
    assert imported_after(code) == set()


def test_api_does_not_import_distributed(tmp_path):
    """daskcfa imports dask.distributed only where a cluster is used (the worker plugins).

    (Computing is not part of the probe: dask's own ``compute`` imports
    distributed, when installed, to look for a client.)
    """
    import dask.array as da

    import daskcfa

    path = str(tmp_path / "a.nc")
    daskcfa.to_cfa(da.from_array(np.arange(24.0).reshape(4, 6), chunks=(2, 3)), path, dims=("y", "x"),
                   variable="v")
    code = ("import daskcfa\n"
            "names = [n for n in daskcfa.__all__ if n not in ('FragmentBudget', 'StorageProfiles', 'fragment_stats')]\n"
            "[getattr(daskcfa, n) for n in names]\n"
            f"print(daskcfa.open_cfa({path!r})['v'].data[1:3].shape)")
    modules, printed = run(code)
    assert printed == ["(2, 6)"] and "dask.array" in modules  # (the probe sees what was imported)
    assert "distributed" not in modules
    assert "distributed" in imported_after("import daskcfa; daskcfa.FragmentBudget")


def test_lazy_names_are_the_real_ones():
    import daskcfa
    from daskcfa import api
    from daskcfa.archive import refragment

    assert daskcfa.open_cfa is api.open_cfa and daskcfa.split is refragment.refragment
    assert set(daskcfa.__all__) <= set(dir(daskcfa))
    for name in daskcfa.__all__:
        assert getattr(daskcfa, name) is not None
    try:
        daskcfa.no_such_name
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("no AttributeError")
    # subpackages load on first use, as attributes, as when daskcfa imported them eagerly
    assert run("import daskcfa\nprint(daskcfa.storage.uri.__name__, daskcfa.graph.__name__)")[1] == [
        "daskcfa.storage.uri daskcfa.graph"]


def test_version_is_the_package_metadata():
    from importlib.metadata import version

    import daskcfa

    assert version("daskcfa") == daskcfa.__version__


#: what metadata-only work must not import: dask.array costs ~1 s with the xarray, pandas and scipy it imports
ARRAY_STACK = ("dask.array", "xarray", "pandas", "scipy")


def _imported(code: str, names: tuple[str, ...]) -> tuple[set[str], list[str]]:
    """Which of ``names`` a fresh interpreter has imported after running ``code``, and what it printed."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {names!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    return set(json.loads(out[-1])), out[:-1]


def test_metadata_only_work_imports_no_array_stack(tmp_path):
    """``daskcfa info`` / ``verify`` (quick), ``open_cfa``, ``Dataset(url)``, ``describe``, ``verify`` on a
    real archive import neither dask.array nor xarray, pandas, scipy (before: all four, ~1.3 s of a 1.5 s
    ``info``)."""
    import daskcfa

    url = daskcfa.sample(str(tmp_path / "tas.nca"))
    cases = {
        "cli info": f"from daskcfa.cli import main\nmain(['info', {url!r}])",
        "cli verify": f"from daskcfa.cli import main\nmain(['verify', {url!r}])",
        "open_cfa": (f"import daskcfa\nds = daskcfa.open_cfa({url!r})\nv = ds['tas']\n"
                     "print(v.dims, v.shape, v.units, v.fragments.shape, ds['lat'].shape, sorted(ds.dimensions))"),
        "Dataset": f"import daskcfa\nprint(daskcfa.Dataset({url!r})['tas'].fragments.shape)",
        "describe": f"import daskcfa\nprint(daskcfa.describe({url!r}).variables[0].grid)",
        "verify": f"import daskcfa\nprint(daskcfa.verify({url!r}).ok)",
    }
    for name, code in cases.items():
        modules, printed = _imported(code, ARRAY_STACK)
        assert printed, name  # (each did its work)
        assert modules == set(), f"{name} imported {sorted(modules)}"
    assert "10 fragment(s)" in _imported(cases["cli verify"], ())[1][-1]
    assert _imported(cases["open_cfa"], ())[1] == ["('time', 'lat', 'lon') (120, 45, 90) K (10, 1, 1) (45,) "
                                                   "['lat', 'lon', 'time']"]


def test_from_cfa_imports_only_what_a_dask_array_needs(tmp_path):
    """``from_cfa`` imports dask.array, but none of xarray, pandas, scipy that dask.array itself does not
    import (dask 2026.8's ``dask.array`` imports xarray and scipy.sparse when installed), nor zarr, numcodecs,
    s3fs, aiohttp, distributed or matplotlib (needed only by some fragments, stores, clusters or plots)."""
    import daskcfa

    url = daskcfa.sample(str(tmp_path / "tas.nca"))
    others = ("zarr", "numcodecs", "s3fs", "aiohttp", "distributed", "matplotlib")
    with_dask_array, _ = _imported("import dask.array", ARRAY_STACK)
    modules, printed = _imported(f"import daskcfa\nprint(daskcfa.from_cfa({url!r}, 'tas').numblocks)",
                                 ("dask.array",) + ARRAY_STACK + others)
    assert printed == ["(10, 1, 1)"] and "dask.array" in modules
    assert modules - {"dask.array"} <= with_dask_array


def test_a_local_read_imports_no_s3_client(tmp_path):
    """Reading local fragments imports neither s3fs nor aiobotocore, botocore or aiohttp: only S3 reads
    need the client that checks whole objects' CRC-32 (storage/transfer.py)."""
    import daskcfa

    url = daskcfa.sample(str(tmp_path / "tas.nca"))
    modules, printed = _imported(f"import daskcfa\nprint(float(daskcfa.from_cfa({url!r}, 'tas').mean().compute()) > 0)",
                                 ("s3fs", "aiobotocore", "botocore", "aiohttp"))
    assert printed == ["True"] and modules == set()


#: what a first result from local netCDF files does not need (issue #31: daskcfa's share of a fresh process's
#: time to a first result): the remote stack (fsspec, yarl and what yarl imports), and cf-units (fragments whose
#: units are the aggregation's text are not converted)
NOT_FOR_A_LOCAL_FIRST_RESULT = ("fsspec", "yarl", "multidict", "idna", "propcache", "cf_units", "s3fs", "aiohttp",
                                "botocore", "zarr")


def test_a_first_local_result_imports_no_remote_stack_nor_cf_units(tmp_path):
    """A fresh ``from_cfa(url)[0, 0, 0].compute()`` on local netCDF-4 fragments imports none of
    :data:`NOT_FOR_A_LOCAL_FIRST_RESULT` (before: fsspec, yarl and cf-units, about 35 ms of CPU)."""
    import daskcfa

    url = daskcfa.sample(str(tmp_path / "tas.nca"))
    code = f"import daskcfa\nprint(float(daskcfa.from_cfa({url!r}, 'tas')[0, 0, 0].compute()))"
    modules, printed = _imported(code, NOT_FOR_A_LOCAL_FIRST_RESULT)
    assert len(printed) == 1 and float(printed[0]) == float(daskcfa.from_cfa(url, "tas")[0, 0, 0].compute())
    assert modules == set()
