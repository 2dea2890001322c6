"""What recording versions costs a writer: six overwrites of a 100-fragment dataset, one process.

    python -m benchmarks.versions [--keep N]

Writes ``to_cfa(mode="w")`` six times into a scratch directory (removed after)
and exits; time the whole process, alternating with the same script run against
another copy of the package (``PYTHONPATH``), and take the ratios pair by pair.
``--keep`` sets ``daskcfa.write.keep-versions`` (default: the config's, 5).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import dask
import numpy as np

import daskcfa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=int, default=None, help="daskcfa.write.keep-versions")
    args = parser.parse_args()
    settings = {} if args.keep is None else {"daskcfa.write.keep-versions": args.keep}
    directory = tempfile.mkdtemp(prefix="versions-bench-")
    try:
        url = os.path.join(directory, "t.nca")
        x = np.random.default_rng(0).random((100, 20, 30)).astype("f4")
        with dask.config.set(scheduler="threads", **settings):
            for i in range(6):
                daskcfa.to_cfa(x + i, url, variable="tas", dims=("time", "lat", "lon"), fragment_shape=(1, 20, 30),
                               mode="w")
    finally:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()
