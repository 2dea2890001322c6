"""The ci/ scripts a new user runs (issue 28): each runs what exists, and says what it does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import s3fs

ROOT = Path(__file__).resolve().parents[1]


def test_s3_server_script_serves_until_terminated():
    """``ci/s3-server --bucket NAME`` prints its exports once the real server answers, and stops on SIGTERM
    (before: it ran ``daskcfa/testing/servers.py``, a path that no longer exists)."""
    proc = subprocess.Popen(["bash", str(ROOT / "ci" / "s3-server"), "--bucket", "firsthour"],
                            env={**os.environ, "PYTHON": sys.executable}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        exports: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while "DASKCFA_S3_ENDPOINT_URL" not in exports and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("export "):
                name, _, value = line[len("export "):].strip().partition("=")
                exports[name] = value
        assert "DASKCFA_S3_ENDPOINT_URL" in exports, proc.stderr.read()[-3000:] if proc.poll() is not None else exports
        s3 = s3fs.S3FileSystem(key=exports["AWS_ACCESS_KEY_ID"], secret=exports["AWS_SECRET_ACCESS_KEY"],
                               client_kwargs={"endpoint_url": exports["DASKCFA_S3_ENDPOINT_URL"]},
                               skip_instance_cache=True)
        assert s3.ls("") == ["firsthour"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # (its own session: this test started it)
            proc.wait()
    assert proc.returncode == 0


def test_demo_setup_installs_only_the_package(tmp_path):
    """``ci/demo`` sets up with ``ci/setup demo``: daskcfa and its dependencies, no system packages, and says so.
    Run on a copy of ci/ whose installer and python only record what they are asked (nothing is installed)."""
    (tmp_path / "ci").mkdir()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    for script in ("setup", "demo"):
        (tmp_path / "ci" / script).write_text((ROOT / "ci" / script).read_text())
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    log = tmp_path / "log"
    (tmp_path / "ci" / "install").write_text(f'echo "install $*" >> {log}\n')
    (tmp_path / ".venv" / "bin" / "python").write_text(f'#!/bin/sh\necho "python $*" >> {log}\n')
    (tmp_path / ".venv" / "bin" / "python").chmod(0o755)
    bin_dir = tmp_path / "bin"  # apt-get, if it were called, would say so
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "apt-get $*" >> {log}\n')
    (bin_dir / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    first = subprocess.run(["bash", "ci/demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    again = subprocess.run(["bash", "ci/demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert log.read_text().splitlines() == ["install .venv/bin/python -e .", "python -c import daskcfa",
                                            "python examples/demo.py", "python examples/demo.py"]
    assert "installing daskcfa" in first.stderr and "running examples/demo.py" in first.stderr
    assert "installing" not in again.stderr
