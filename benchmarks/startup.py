"""Start-up benchmark: ``import daskcfa``, ``daskcfa --help`` and ``daskcfa info``, each in fresh processes.

    python -m benchmarks.startup [--repeats 11] [--repo PATH] [--no-save]
    python -m benchmarks.startup --share-only [--vs OTHER_REPO] [--archive100 FILE] [--repeats 8]

Each command runs ``--repeats`` times in a new interpreter (the operating
system's page cache warm after an untimed first run); the table gives the
median, the fastest and the slowest wall-clock time, next to an empty
interpreter (``python -c pass``) for the floor. ``daskcfa --help`` runs as
``python -m daskcfa --help`` (the same imports as the installed script) in
the checkout given by ``--repo`` (default: this one), so another checkout can
be compared on the same interpreter and libraries. ``daskcfa info`` runs on
the sample archive (10 fragments, written once by ``examples/sample.py`` in
a temporary directory), beside netCDF4-python opening the same file. The time
to a first result, ``from_cfa(url)[0, 0, 0].compute()`` on the 100-fragment
``read-zlib`` archive (``--archive100``), runs beside dask alone importing
dask.array and computing a first value (dask imports distributed then, where
installed): the difference is daskcfa's share (issue #31: at most 0.2 s). Targets:
``import daskcfa`` at most 0.5 s, ``daskcfa --help`` at most 0.7 s (issue
#18), ``daskcfa info`` at most 0.5 s (issue #28: metadata-only work imports
no dask.array).

``--share-only`` measures daskcfa's share inside one fresh process instead,
less bent by a loaded machine than the difference of two processes: dask.array
imported and a first dask compute done (dask imports distributed there), then
``gc.collect()`` (the garbage of those imports would otherwise be collected
under the clock), then the CPU seconds (``time.process_time``) of ``import
daskcfa`` and ``from_cfa(url)[0, 0, 0].compute()``; with ``--vs``, runs in
``--repo`` and in the other checkout alternate (paired). Nothing is saved.

The results go to ``benchmarks/results/startup.json`` (not with
``--no-save``). To see where the time goes:
``python -X importtime -c "import daskcfa" 2>&1 | sort -t'|' -k2 -n | tail``.
"""

from __future__ import annotations

import argparse
import json
import resource
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
    # time to first result (issue #31): daskcfa's share is the first row less the second
    "from_cfa(url)[0, 0, 0].compute() (100 fragments)": [
        "-c", "import daskcfa; daskcfa.from_cfa({archive100!r})[0, 0, 0].compute()"],
    "dask alone: import dask.array, a first compute": [
        "-c", "import dask.array as da, numpy as np; da.from_array(np.zeros((2, 2, 2)), chunks=1)[0, 0, 0].compute()"],
}
#: (first result, dask's own): the difference is daskcfa's share of the time to a first result
FIRST_RESULT = ("from_cfa(url)[0, 0, 0].compute() (100 fragments)", "dask alone: import dask.array, a first compute")
TARGETS = {"import daskcfa": 0.5, "daskcfa --help": 0.7, "daskcfa info (10 fragments)": 0.5}
SHARE_TARGET = 0.2  #: seconds: daskcfa's share of the time to a first result (issue #31)
#: ``--share-only``: daskcfa's share of the first result inside one process (CPU seconds, printed as JSON)
SHARE_CODE = ("import gc, json, time\nimport dask.array as da, numpy as np\n"
              "da.from_array(np.zeros((2, 2, 2)), chunks=1)[0, 0, 0].compute()\ngc.collect()\n"
              "start = time.process_time()\nimport daskcfa\ndaskcfa.from_cfa({archive100!r})[0, 0, 0].compute()\n"
              "print(json.dumps(time.process_time() - start))")
#: the 100-fragment archive of ``read-zlib`` (``python -m benchmarks.generate --scenario read-zlib``)
ARCHIVE100 = HERE / "data" / "n100_f10x512x512_zlib1_c1x512x512" / "aggregation.nc"


def measure(args: list[str], repo: Path, repeats: int, beside: list[str] | None = None) -> tuple[list, ...]:
    """Wall-clock and CPU (user + system) seconds of ``python ARGS`` in ``repo``, ``repeats`` times, after
    one untimed run; with ``beside``, ``python BESIDE`` runs after each of them, timed the same way (the
    two alternate, so that a machine whose speed drifts slows both alike)."""
    commands = [[sys.executable, *args]] + ([[sys.executable, *beside]] if beside else [])
    times: list[list[float]] = [[] for _ in range(2 * len(commands))]
    for i in range(repeats + 1):
        for k, command in enumerate(commands):
            start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(command, cwd=repo, check=True, stdout=subprocess.DEVNULL)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if i:
                times[2 * k].append(time.perf_counter() - start)
                times[2 * k + 1].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return tuple(times)


def share_pairs(repos: list[Path], archive: Path, repeats: int) -> dict[str, list[float]]:
    """daskcfa's share of the first result in one fresh process (``SHARE_CODE``), ``repeats`` times in each
    of ``repos`` in turn (after one untimed round), the order reversed every other round."""
    code = SHARE_CODE.format(archive100=str(archive))
    shares: dict[str, list[float]] = {str(repo): [] for repo in repos}
    for i in range(repeats + 1):
        for repo in repos if i % 2 == 0 else repos[::-1]:
            out = subprocess.run([sys.executable, "-c", code], cwd=repo, check=True, capture_output=True, text=True)
            if i:
                shares[str(repo)].append(json.loads(out.stdout.splitlines()[-1]))
    return shares


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
    parser.add_argument("--archive100", type=Path, default=ARCHIVE100,
                        help="the 100-fragment aggregation file of the time-to-first-result rows")
    parser.add_argument("--share-only", action="store_true",
                        help="only daskcfa's share of the first result, measured inside one process (CPU)")
    parser.add_argument("--vs", type=Path, action="append", default=[],
                        help="with --share-only: another checkout, its runs alternating with --repo's")
    args = parser.parse_args(argv)
    check_repo(args.repo)
    if args.share_only:
        for repo in args.vs:
            check_repo(repo)
        for repo, shares in share_pairs([args.repo, *args.vs], args.archive100, args.repeats).items():
            print(f"{repo}: daskcfa's share, CPU s: median {statistics.median(shares):.3f} "
                  f"(min {min(shares):.3f}, max {max(shares):.3f}; runs {' '.join(f'{s:.3f}' for s in shares)})")
        return 0
    rows, results = [], {}
    scratch = tempfile.TemporaryDirectory(prefix="daskcfa-startup-")
    archive = f"{scratch.name}/tas.nca"
    subprocess.run([sys.executable, "examples/sample.py", archive], cwd=args.repo, check=True,
                   stdout=subprocess.DEVNULL)

    def row(name: str, times: list[float], cpu: list[float]) -> None:
        median = statistics.median(times)
        results[name] = {"median": median, "min": min(times), "max": max(times), "runs": times,
                         "cpu_median": statistics.median(cpu), "cpu_runs": cpu}
        target = TARGETS.get(name)
        verdict = "" if target is None else ("met" if median <= target else "NOT met") + f" (<= {target} s)"
        rows.append(f"| `{name}` | {median:.3f} | {min(times):.3f} | {max(times):.3f} | "
                    f"{statistics.median(cpu):.3f} | {verdict} |")

    def command(name: str) -> list[str]:
        return [a.format(archive=archive, archive100=str(args.archive100)) for a in COMMANDS[name]]

    for name in COMMANDS:
        if name not in FIRST_RESULT:
            row(name, *measure(command(name), args.repo, args.repeats))
    first, floor = FIRST_RESULT
    first_wall, first_cpu, floor_wall, floor_cpu = measure(command(first), args.repo, args.repeats, command(floor))
    row(first, first_wall, first_cpu)
    row(floor, floor_wall, floor_cpu)
    share = [a - b for a, b in zip(first_wall, floor_wall)]
    share_cpu = statistics.median(a - b for a, b in zip(first_cpu, floor_cpu))
    results["daskcfa's share of the first result"] = {"median": statistics.median(share), "runs": share,
                                                      "cpu_median": share_cpu}
    rows.append(f"| daskcfa's share of the first result (each run less the dask-alone run beside it) | "
                f"{statistics.median(share):.3f} | {min(share):.3f} | {max(share):.3f} | {share_cpu:.3f} | "
                f"{'met' if statistics.median(share) <= SHARE_TARGET else 'NOT met'} (<= {SHARE_TARGET} s) |")
    table = "\n".join(["| command | median s | min s | max s | CPU s (median) | target |", "|---|---|---|---|---|---|",
                       *rows])
    print(table)
    if not args.no_save:
        out = {"when": time.strftime("%Y-%m-%d %H:%M"), "repo": str(args.repo.resolve()),
               "python": sys.version.split()[0], "repeats": args.repeats, "results": results, "table": table}
        (HERE / "results" / "startup.json").write_text(json.dumps(out, indent=1) + "\n")
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
