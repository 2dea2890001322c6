"""Child process of test_corrupt_fragments: read an aggregation once per bit flip of one fragment.

Run as ``python _flip_sweep.py SPEC.json``; prints one JSON line per flip, as
soon as it is known, so that a crash (a segfault in a C library) shows which
flip caused it. Outcomes: ``same`` (the flip changed nothing the reader
uses), ``diff`` (different values: silent garbage), ``error:<CFAError
subclass>`` or ``other:<exception type>`` (a non-daskcfa exception).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import dask
import numpy as np

import daskcfa
from daskcfa.fragments.manager import manager


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    victim = spec["victim"]
    original = open(victim, "rb").read()
    expected = np.load(spec["expected"])
    mask = np.load(spec["mask"])
    for engine in spec["engines"]:
        with dask.config.set({"daskcfa.io.engine": engine, "scheduler": "synchronous"}):
            for position, bit in spec["flips"]:
                damaged = bytearray(original)
                damaged[position] ^= 1 << bit
                with open(victim + ".flip", "wb") as f:
                    f.write(damaged)
                os.replace(victim + ".flip", victim)  # a new inode: HDF5 must not reuse a cached open file
                manager().close_all()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        got = daskcfa.from_cfa(spec["aggregation"], "tas").compute()
                    same = (np.array_equal(np.ma.getmaskarray(got), mask)
                            and np.array_equal(np.ma.getdata(got)[~mask], expected[~mask]))
                    outcome = "same" if same else "diff"
                except daskcfa.CFAError as exc:
                    outcome = f"error:{type(exc).__name__}"
                    if exc.fragment != tuple(spec["index"]) or os.path.basename(victim) not in str(exc):
                        outcome = f"unlocated:{type(exc).__name__}:{exc}"
                except Exception as exc:  # noqa: BLE001 - what the test is looking for
                    outcome = f"other:{type(exc).__name__}:{str(exc)[:200]}"
                print(json.dumps([engine, position, bit, outcome]), flush=True)
    with open(victim, "wb") as f:
        f.write(original)


if __name__ == "__main__":
    main(sys.argv[1])
