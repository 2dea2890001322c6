"""The documentation builds without a warning, and every example on its pages runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")


@pytest.mark.parametrize("builder", ["html", "doctest"])
def test_docs_build_with_warnings_as_errors(builder, tmp_path):
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder,
                           str(DOCS), str(tmp_path / builder)], capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    if builder == "doctest":
        report = (tmp_path / builder / "output.txt").read_text()
        assert " 0 failures in tests" in report and "tests" in report, report[-2000:]
    else:
        assert (tmp_path / builder / "api.html").read_text().count("daskcfa.from_cfa") >= 1
        assert "refragment" in (tmp_path / builder / "cli.html").read_text()
