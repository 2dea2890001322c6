"""The benchmark tool measures nothing without the warm-up it was asked for.

A tool's first run in a fresh process pays its lazy imports; ``--warm=DIR`` runs it once on
the tiny dataset first. When DIR was missing (a machine whose bench data were regenerated
without it), the warm-up was skipped in silence and the measured run cost ~3x its CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_a_missing_warm_up_dataset_refuses_to_measure(tmp_path: Path) -> None:
    made = _run("benchmarks.generate", "--warmup", "--datadir", str(tmp_path))
    assert made.returncode == 0, made.stderr
    warm = tmp_path / "warmup"
    assert json.loads((warm / "params.json").read_text())["complete"]

    missing = tmp_path / "elsewhere" / "warmup"
    refused = _run("benchmarks.tools", "daskcfa", "mean-uncompressed", str(warm), "--no-probe", f"--warm={missing}")
    assert refused.returncode == 2
    assert "@@RESULT@@" not in refused.stdout
    assert f"no warm-up dataset at {missing}" in refused.stderr
    assert "benchmarks.generate --warmup" in refused.stderr

    measured = _run("benchmarks.tools", "daskcfa", "mean-uncompressed", str(warm), "--no-probe", f"--warm={warm}")
    assert measured.returncode == 0, measured.stderr
    result = json.loads(measured.stdout.split("@@RESULT@@ ", 1)[1])
    assert result["status"] == "ok" and "warmup_error" not in result
