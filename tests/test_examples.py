"""The runnable examples (examples/*.py), each run as users run it: ``python examples/<name>.py``.

Every example checks its own answers against ground truth and says so; these
tests run it in a fresh process (against a LocalCluster, the local S3 server,
or a real single-node SLURM started by ci/slurm/) and check what it printed
and what it wrote.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import daskcfa

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
import sample  # noqa: E402  (the examples' sample dataset)


def run_example(name: str, *args: str, cwd: Path, env: dict | None = None, timeout: float = 240) -> str:
    """Run ``python examples/<name>.py ARGS`` and return its output; fail with the output if it fails."""
    env = dict(env or os.environ)  # (this checkout's daskcfa, whichever one the venv has installed)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name}.py failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_example_says_what_it_shows():
    for path in EXAMPLES.glob("*.py"):
        doc = path.read_text().split('"""')[1]
        assert "Run" in doc or path.name == "sample.py", path.name
        assert len(doc.split()) > 20, path.name


def test_demo(tmp_path):
    out = run_example("demo", cwd=tmp_path)
    assert "all results agree with numpy" in out


def test_open_and_analyse_on_its_sample(tmp_path):
    out = run_example("open_and_analyse", cwd=tmp_path)
    assert "10 fragments, grid (10, 1, 1)" in out
    assert "dask and xarray agree" in out
    assert "sample: results equal the ground truth" in out


def test_open_and_analyse_a_given_url(tmp_path):
    url = sample.write(str(tmp_path / "data" / "tas.nca"))
    out = run_example("open_and_analyse", url, "--variable", "tas", "--at", "lat=51", "--at", "lon=11", cwd=tmp_path)
    assert "series at lat=52.0, lon=12.0" in out  # nearest grid point
    printed = re.search(r"series at lat=52.0, lon=12.0: \[([^\]]+)\]", out).group(1)
    expected = sample.truth()[:4, (52 + 88) // 4, 12 // 4]
    np.testing.assert_allclose([float(v) for v in printed.split()], expected, atol=1e-3)
    assert "dask and xarray agree" in out and "ground truth" not in out


def test_distributed_budget(tmp_path):
    out = run_example("distributed_budget", "--filehandles", "3", "--scratch", str(tmp_path / "scratch"), cwd=tmp_path)
    assert "10 chunks (= fragments) on 2 workers" in out
    workers = re.findall(r"misses=(\d+) evictions=(\d+) peak_files=(\d+)/(\d+)", out)
    assert len(workers) == 2
    assert sum(int(m) for m, _, _, _ in workers) >= 10  # every fragment opened, by one worker or the other
    assert all(int(peak) <= int(budget) == 3 for _, _, peak, budget in workers)  # the budget held
    assert any(int(evictions) > 0 for _, evictions, _, _ in workers)  # 5 fragments per worker, 3 handles
    assert "sample: results equal the ground truth" in out
    assert any((tmp_path / "scratch").iterdir())  # workers' local_directory used


def test_write_s3(tmp_path, s3_server, s3_bucket, s3fs_fs):
    url = f"s3://{s3_bucket}/archive/tas.nca"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3_server.key, "AWS_SECRET_ACCESS_KEY": s3_server.secret,
           "AWS_ENDPOINT_URL": s3_server.endpoint_url}
    out = run_example("write_s3", url, cwd=tmp_path, env=env)
    assert "as 10 fragments" in out and "read back: equal to the values written" in out
    assert s3_server.secret not in out
    keys = s3fs_fs.find(f"{s3_bucket}/archive")
    assert sum(k.endswith(".nc") for k in keys) == 10 and f"{s3_bucket}/archive/tas.nca" in keys
    back = daskcfa.from_cfa(url, storage_options=s3_server.storage_options).compute()
    np.testing.assert_array_equal(back, sample.truth())


# ---------------------------------------------------------------------------
# A real single-node SLURM (ci/slurm/): munged, slurmctld, slurmd on 127.0.0.1
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm():
    """Environment for SLURM's commands (``SLURM_CONF``) of a private SLURM started for these tests.

    Skips, saying why, when SLURM cannot run here (not installed, not root, daemons fail to start).
    The daemons are stopped, by the PIDs they recorded, when the tests are done.
    """
    if os.geteuid() != 0:
        pytest.skip("SLURM example: the test SLURM needs root (slurmd runs as root, munged as user munge)")
    missing = [tool for tool in ("slurmctld", "slurmd", "munged", "sbatch", "squeue") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"SLURM example: {', '.join(missing)} not installed (ci/setup installs the Debian packages "
                    "slurmctld slurmd slurm-client munge as root)")
    state = tempfile.mkdtemp(prefix="daskcfa-slurm-")  # not under pytest's private tmp: munged must reach it
    started = subprocess.run(["bash", str(ROOT / "ci" / "slurm" / "start"), state], capture_output=True, text=True,
                             timeout=90)
    try:
        if started.returncode != 0:
            pytest.skip(f"SLURM example: a single-node SLURM cannot run on this machine:\n{started.stderr}")
        yield {**os.environ, "SLURM_CONF": f"{state}/slurm.conf"}
    finally:
        subprocess.run(["bash", str(ROOT / "ci" / "slurm" / "stop"), state], capture_output=True, timeout=60)
        shutil.rmtree(state, ignore_errors=True)


def test_slurm_refragment(tmp_path, slurm):
    source = sample.write(str(tmp_path / "archive" / "tas.nca"))
    target = str(tmp_path / "archive" / "tas_timeseries.nca")
    job_name = f"daskcfa-test-{os.getpid()}"
    args = [sys.executable, str(EXAMPLES / "slurm_refragment.py"), source, target, "--jobs", "2",
            "--fragment-shape", "time=120,lat=15,lon=30", "--max-mem", "64MiB", "--memory", "1GiB",
            "--job-name", job_name, "--workdir", str(tmp_path), "--timeout", "90"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=slurm, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    running: set[str] = set()  # watched from here too, independently of the example's own watch
    deadline = time.monotonic() + 150
    while proc.poll() is None and time.monotonic() < deadline:
        rows = subprocess.run(["squeue", "--noheader", "--name", job_name, "--format", "%i %T"], env=slurm,
                              capture_output=True, text=True, timeout=10).stdout.split("\n")
        running |= {row.split()[0] for row in rows if row.endswith(" RUNNING")}
        time.sleep(0.3)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate()
    assert proc.returncode == 0, f"slurm_refragment.py failed ({proc.returncode}):\n{out}\n{err}"

    assert "2 workers connected" in out and "target equals source" in out
    seen = re.search(r"worker jobs seen RUNNING in squeue: ([\d, ]+) \(of ([\d, ]+)\)", out)
    assert seen and seen.group(1) == seen.group(2), out  # every worker job was seen running by the example
    assert set(seen.group(2).split(", ")) <= running  # ... and by this test
    new = daskcfa.from_cfa(target)
    assert new.chunks == ((120,), (15, 15, 15), (30, 30, 30))
    np.testing.assert_array_equal(new.compute(), sample.truth())
    queue = subprocess.run(["squeue", "--noheader", "--name", job_name], env=slurm, capture_output=True, text=True)
    assert queue.stdout.strip() == ""  # the worker jobs ended with the cluster
