"""Packaging: the sdist and wheel built from the tracked files carry what users and packagers need.

Builds with setuptools' PEP 517 backend in-process (no network, no
isolation) from a copy of the files git tracks, so the test sees what a
release would ship.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the build uses the tracked files)")
    source = tmp_path_factory.mktemp("src")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    built = {}
    for kind in ("sdist", "wheel"):  # (one process each: setuptools keeps state between builds)
        code = f"import sys, setuptools.build_meta as b\nprint('BUILT', b.build_{kind}(sys.argv[1]))"
        proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:setuptools", "-c", code, str(out)],
                              cwd=source, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        built[kind] = out / proc.stdout.split("BUILT ")[-1].strip()
    return built


def test_sdist_has_license_docs_and_examples(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for expected in ("LICENSE", "README.md", "docs/architecture.md", "examples/sample.py", "daskcfa/py.typed",
                     "daskcfa/daskcfa.yaml"):
        assert expected in names


def test_wheel_metadata(built):
    import daskcfa

    with zipfile.ZipFile(built["wheel"]) as whl:
        names = set(whl.namelist())
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {"daskcfa/py.typed", "daskcfa/daskcfa.yaml", "daskcfa/daskcfa-schema.yaml"} <= names
    # the test servers stay in the repository: not installed, and psutil is no core dependency for them
    assert not any(n.startswith(("daskcfa_testing/", "daskcfa/testing/")) for n in names)
    core = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    assert core and not any("psutil" in line for line in core)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    fields = [line.split(": ", 1) for line in metadata.splitlines() if ": " in line]
    assert ["License-Expression", "BSD-3-Clause"] in fields
    assert ["Version", daskcfa.__version__] in fields
    assert any(k == "Project-URL" and v.startswith("Source, https://") for k, v in fields)
    assert ["Provides-Extra", "diagnostics"] in fields
    assert any(k == "Requires-Dist" and v.startswith("bokeh") and "extra == \"diagnostics\"" in v for k, v in fields)


def test_one_version_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    hits = subprocess.run(["git", "grep", "-lE", "^__version__ *=", "--", "daskcfa"], cwd=ROOT, capture_output=True,
                          text=True).stdout
    assert hits.split() == ["daskcfa/__init__.py"]


def test_diagnostics_extra_gives_performance_report(tmp_path):
    """With the ``diagnostics`` extra (bokeh), distributed's performance report is written."""
    pytest.importorskip("bokeh", reason="the diagnostics extra is not installed")
    import dask.array as da
    from distributed import Client, performance_report

    report = tmp_path / "report.html"
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0"), \
            performance_report(filename=str(report)):
        assert float(da.ones(100, chunks=10).sum().compute()) == 100.0
    assert "Bokeh" in report.read_text()[:100_000]


def test_readme_lists_every_extra_and_how_to_run_the_slow_tests():
    """README's install list names every extra pyproject.toml declares (issue 28: [docs] and [zarr] were
    missing), and says how to run the tests ``ci/test`` leaves out (marked ``slow``)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    assert [name for name in extras if f'pip install ".[{name}]"' not in readme] == []
    assert "bash ci/test -m slow" in " ".join(readme.split())
