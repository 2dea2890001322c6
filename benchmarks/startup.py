"""Start-up benchmark: ``import daskcfa``, ``daskcfa --help`` and ``daskcfa info``, each in fresh processes.

    python -m benchmarks.startup [--repeats 11] [--repo PATH] [--no-save]

Each command runs ``--repeats`` times in a new interpreter (the operating
system's page cache warm after an untimed first run); the table gives the
median, the fastest and the slowest wall-clock time, next to an empty
interpreter (``python -c pass``) for the floor. ``daskcfa --help`` runs as
``python -m daskcfa --help`` (the same imports as the installed script) in
the checkout given by ``--repo`` (default: this one), so another checkout can
be compared on the same interpreter and libraries. ``daskcfa info`` runs on
the sample archive (10 fragments, written once by ``examples/sample.py`` in
a temporary directory), beside netCDF4-python opening the same file. Targets:
``import daskcfa`` at most 0.5 s, ``daskcfa --help`` at most 0.7 s (issue
#18), ``daskcfa info`` at most 0.5 s (issue #28: metadata-only work imports
no dask.array).

The results go to ``benchmarks/results/startup.json`` (not with
``--no-save``). To see where the time goes:
``python -X importtime -c "import daskcfa" 2>&1 | sort -t'|' -k2 -n | tail``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: ``{archive}``: the sample archive's aggregation file
COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "import daskcfa": ["-c", "import daskcfa"],
    "daskcfa --help": ["-m", "daskcfa", "--help"],
    "netCDF4 opens the archive": ["-c", "import netCDF4; netCDF4.Dataset({archive!r}).close()"],
    "daskcfa info (10 fragments)": ["-m", "daskcfa", "info", "{archive}"],
}
TARGETS = {"import daskcfa": 0.5, "daskcfa --help": 0.7, "daskcfa info (10 fragments)": 0.5}


def measure(args: list[str], repo: Path, repeats: int) -> list[float]:
    """Wall-clock seconds of ``python ARGS`` in ``repo``, ``repeats`` times, after one untimed run."""
    command = [sys.executable, *args]
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        subprocess.run(command, cwd=repo, check=True, stdout=subprocess.DEVNULL)
        if i:
            times.append(time.perf_counter() - start)
    return times


def check_repo(repo: Path) -> None:
    """The checkout's own daskcfa is what ``python`` imports there (not an installed copy)."""
    found = subprocess.run([sys.executable, "-c", "import daskcfa; print(daskcfa.__file__)"], cwd=repo,
                           check=True, capture_output=True, text=True).stdout.strip()
    if Path(found).resolve().parent != (repo / "daskcfa").resolve():
        raise SystemExit(f"python in {repo} imports {found}, not that checkout's daskcfa")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--repo", type=Path, default=HERE.parent, help="the checkout to measure")
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/startup.json")
    args = parser.parse_args(argv)
    check_repo(args.repo)
    rows, results = [], {}
    scratch = tempfile.TemporaryDirectory(prefix="daskcfa-startup-")
    archive = f"{scratch.name}/tas.nca"
    subprocess.run([sys.executable, "examples/sample.py", archive], cwd=args.repo, check=True,
                   stdout=subprocess.DEVNULL)
    for name, command in COMMANDS.items():
        times = measure([a.format(archive=archive) for a in command], args.repo, args.repeats)
        median = statistics.median(times)
        results[name] = {"median": median, "min": min(times), "max": max(times), "runs": times}
        target = TARGETS.get(name)
        verdict = "" if target is None else ("met" if median <= target else "NOT met") + f" (<= {target} s)"
        rows.append(f"| `{name}` | {median:.3f} | {min(times):.3f} | {max(times):.3f} | {verdict} |")
    table = "\n".join(["| command | median s | min s | max s | target |", "|---|---|---|---|---|", *rows])
    print(table)
    if not args.no_save:
        out = {"when": time.strftime("%Y-%m-%d %H:%M"), "repo": str(args.repo.resolve()),
               "python": sys.version.split()[0], "repeats": args.repeats, "results": results, "table": table}
        (HERE / "results" / "startup.json").write_text(json.dumps(out, indent=1) + "\n")
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
