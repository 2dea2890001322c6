"""S3netCDF4 running :func:`netcdf4_script.write_dataset`, in its own venv (``.venv-s3nc``).

    .venv-s3nc/bin/python benchmarks/s3netcdf4_peer.py     # then one JSON request per line on stdin

Started once per measured process by :mod:`benchmarks.write` (so that the
warm-up write and the timed write run in the same process, as for every
tool): each request line (``url``, ``shape``, ``frag_shape``, ``assignment``,
``format``, ``cfa_version``, ``unlimited``) runs one write and answers one JSON line
(``{"ok": true, "seconds": ...}`` or ``{"ok": false, "error": ..., "traceback": ...}``).
S3netCDF4 takes its S3 hosts from ``$S3_NC_CONFIG``. Imports numpy and
S3netCDF4 only (no daskcfa in that venv).
"""

import json
import os
import resource
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from netcdf4_script import write_dataset  # noqa: E402
from S3netCDF4._s3netCDF4 import s3Dataset  # noqa: E402


def serve() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            t0 = time.perf_counter()
            write_dataset(s3Dataset, request["url"], tuple(request["shape"]), tuple(request["frag_shape"]),
                          request["assignment"], request["format"], request.get("cfa_version"),
                          unlimited=request.get("unlimited", True))
            answer = {"ok": True, "seconds": time.perf_counter() - t0,
                      "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        except Exception as e:  # noqa: BLE001
            first = (str(e).strip().splitlines() or [""])[0]
            answer = {"ok": False, "error": f"{type(e).__name__}: {first}"[:300],
                      "traceback": traceback.format_exc()[-3000:]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve()
