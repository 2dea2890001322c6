"""How long opening an NCA aggregation of 10,000 partitions takes when its ``nca_array``
is JSON, and when it is the same document with Python-style quotes (as the convention's
examples write it), which daskcfa reads with its own literal parser (no ``eval``).

    python benchmarks/nca_literals.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import netCDF4

import daskcfa

N = 10_000


def write(path: Path, text: str) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", N)
        ds.createDimension("lat", 4)
        var = ds.createVariable("tas", "f4")
        var.setncatts({"cf_role": "nca_variable", "nca_dimensions": "time lat", "nca_array": text})


def main() -> None:
    parts = [{"index": [i], "location": [[i, i + 1], [0, 4]], "part": "[(0, 0, 1), (0, 3, 1)]",
              "data": {"file": f"sub/f{i}.nc", "ncvar": "tas", "shape": [1, 4], "dtype": "float"}}
             for i in range(N)]
    array = {"pdimensions": ["time"], "pshape": [N], "Partitions": parts}
    with tempfile.TemporaryDirectory() as directory:
        for name, text in (("JSON", json.dumps(array)), ("Python-style", str(array))):
            path = Path(directory) / f"{name}.nca"
            write(path, text)
            times = []
            for _ in range(3):
                start = time.perf_counter()
                aggregation = daskcfa.read_aggregation(str(path), "tas")
                times.append(time.perf_counter() - start)
            assert aggregation.fragments.grid.grid_shape == (N, 1)
            print(f"{name}: {len(text) / 1e6:.2f} MB attribute, open median {sorted(times)[1]:.3f} s")


if __name__ == "__main__":
    main()
