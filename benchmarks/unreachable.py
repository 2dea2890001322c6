"""Time to failure of a read from an unreachable S3 endpoint (issue #18.2), default settings.

    python -m benchmarks.unreachable [--repeats 3] [--repo PATH]

Each run is a fresh interpreter that binds a port on 127.0.0.1, closes it,
and times ``daskcfa.from_cfa("s3://bucket/x.nca")`` with that port as the
endpoint until the ``StorageError`` (imports are outside the timing).
``--repo`` runs another checkout's daskcfa on the same interpreter and
libraries, to compare before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN = """
import socket, time
import daskcfa
print(daskcfa.__file__)
from_cfa = daskcfa.from_cfa
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
options = {"key": "AKIDBENCHMARK1", "secret": "benchmark-secret-value",
           "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
started = time.perf_counter()
try:
    from_cfa("s3://bucket/x.nca", storage_options=options)
except daskcfa.StorageError:
    print(time.perf_counter() - started)
else:
    raise SystemExit("the read did not fail")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=HERE.parent)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(args.repo.resolve()))
    # (run in the checkout: ``python -c`` puts the working directory first on sys.path)
    times = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, "-c", RUN], env=env, cwd=args.repo, check=True, capture_output=True,
                             text=True).stdout.split()
        module, seconds = out
        assert Path(module).resolve().is_relative_to(args.repo.resolve()), module  # the checkout asked for
        times.append(float(seconds))
    print(f"{args.repo}: time to failure median {statistics.median(times):.1f} s "
          f"(min {min(times):.1f}, max {max(times):.1f}, {len(times)} runs)")


if __name__ == "__main__":
    main()
