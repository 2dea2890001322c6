"""One benchmark scenario, daskcfa at another revision against daskcfa now, in alternation.

    python -m benchmarks.compare --base REV --scenario write-local [--scenario write-s3] [--rounds 3] [--quick]

A change that must cost less than a few per cent cannot be judged from two
runs made hours apart on a shared machine. This runs the scenario's raw limit
and daskcfa, once with the package of revision ``REV`` (checked out in a
temporary git worktree; the harness is always this one) and once with the
working tree's, alternating for ``--rounds`` rounds, and reports each
version's ratio to the raw limit measured in the same run (median over the
rounds) and the difference between the two. The committed result files of
the scenario are left as they were; the comparison goes to
``results/compare-<scenario>[.quick].json``. Write scenarios only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import write as wmod

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")


def _one_run(scenario: str, quick: bool, root: str | None) -> float:
    """daskcfa's ratio to the raw limit in one ``benchmarks.run`` of the scenario."""
    tools = f"{wmod.RAW_LIMIT[scenario]},daskcfa"
    cmd = [sys.executable, "-m", "benchmarks.run", "--scenario", scenario, "--tools", tools, "--repeats", "1",
           "--no-count"] + (["--quick"] if quick else [])
    env = {k: v for k, v in os.environ.items() if k != wmod.DASKCFA_ROOT}
    if root:
        env[wmod.DASKCFA_ROOT] = root
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    path = os.path.join(RESULTS, f"{scenario}{'.quick' if quick else ''}.json")
    if done.returncode != 0 or not os.path.exists(path):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    with open(path) as f:
        result = json.load(f)["tools"]
    if result.get("daskcfa", {}).get("status") != "ok":
        raise SystemExit(f"daskcfa did not run ({'base' if root else 'now'}): {result.get('daskcfa')}")
    return float(result["daskcfa"]["x_raw_limit"])


def compare(scenario: str, base: str, rounds: int, quick: bool) -> dict:
    suffix = ".quick" if quick else ""
    kept = os.path.join(RESULTS, f"{scenario}{suffix}.json")
    original = open(kept).read() if os.path.exists(kept) else None
    ratios: dict[str, list[float]] = {"base": [], "now": []}
    with tempfile.TemporaryDirectory(prefix="daskcfa-base-") as tmp:
        tree = os.path.join(tmp, "tree")
        subprocess.run(["git", "worktree", "add", "--detach", tree, base], cwd=REPO, check=True,
                       capture_output=True)
        root = os.path.join(tmp, "package")  # the base's daskcfa alone (its benchmarks must not shadow ours)
        os.makedirs(root)
        os.symlink(os.path.join(tree, "daskcfa"), os.path.join(root, "daskcfa"))
        try:
            for k in range(rounds):
                for version in (("base", "now") if k % 2 == 0 else ("now", "base")):
                    ratios[version].append(_one_run(scenario, quick, root if version == "base" else None))
                    print(f"{scenario} round {k + 1}: {version} {ratios[version][-1]:.3f}x", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, capture_output=True)
            if original is None:
                if os.path.exists(kept):
                    os.unlink(kept)
            else:
                with open(kept, "w") as f:
                    f.write(original)
    base_ratio, now_ratio = statistics.median(ratios["base"]), statistics.median(ratios["now"])
    return {"scenario": scenario, "quick": quick, "base": base, "rounds": rounds,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "ratios": ratios,
            "median_base": base_ratio, "median_now": now_ratio, "change": now_ratio / base_ratio - 1}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the git revision to compare with")
    p.add_argument("--scenario", action="append", required=True, choices=wmod.SCENARIOS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    for scenario in a.scenario:
        out = compare(scenario, a.base, a.rounds, a.quick)
        path = os.path.join(RESULTS, f"compare-{scenario}{'.quick' if a.quick else ''}.json")
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
        print(f"{scenario}: base {a.base} {out['median_base']:.3f}x, now {out['median_now']:.3f}x the raw limit "
              f"(medians of {a.rounds}): {out['change']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
