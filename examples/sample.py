"""The sample archive of the examples: :mod:`daskcfa.sample_data` (``daskcfa.sample``), as a script.

Ten years of monthly near-surface temperature on a 4-degree grid,
``tas(time, lat, lon)``, written as a CF-1.13 aggregation of one fragment per
year. The examples import this module for the archive (``write``), its
ground truth (``truth``) and its parts (``lazy``, ``coords``, ``ATTRS``...).

Run as a script to write it: ``python examples/sample.py /path/to/tas.nca``.
"""

from __future__ import annotations

import argparse

from daskcfa.sample_data import ATTRS, DIMS, FRAGMENT_SHAPE, SHAPE, VARIABLE, coords, lazy, sample as write, truth

__all__ = ["ATTRS", "DIMS", "FRAGMENT_SHAPE", "SHAPE", "VARIABLE", "coords", "lazy", "truth", "write"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", metavar="URL", help="the aggregation file to write (e.g. /tmp/tas.nca)")
    print(write(parser.parse_args(argv).url))


if __name__ == "__main__":
    main()
