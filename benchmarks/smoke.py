"""Every tool on the chosen scenarios at ``--quick`` size, in this one process: answers checked, nothing timed.

    python -m benchmarks.smoke --scenario 'std-*' --scenario 's3-climatology-*' [--tools daskcfa,cfdm]

``benchmarks.run --quick`` proves the same in fresh processes, two per tool and scenario
(about an hour for the 48 reduction scenarios on 2 cores); this calls the same
:func:`benchmarks.tools.measure` and :func:`benchmarks.run.check` without the
process start-ups (a few minutes), for after a change to a tool or a check. The
``s3-*`` scenarios start one S3 server, as ``benchmarks.run`` does.
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks import generate
from benchmarks import s3 as s3mod
from benchmarks.run import DEFAULT_TOOLS, check, select_scenarios
from benchmarks.tools import SCENARIO_KIND, applicable, measure


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", action="append", required=True,
                   help="scenario or shell-style pattern (repeatable; 'all' for every read scenario)")
    p.add_argument("--tools", help="comma-separated subset (default: every tool that applies)")
    p.add_argument("--datadir", default=generate.DEFAULT_DATADIR)
    a = p.parse_args(argv)
    try:
        scenarios = select_scenarios(a.scenario, list(SCENARIO_KIND))
    except ValueError as e:
        p.error(str(e))
    tools = DEFAULT_TOOLS + ["dask-floor"] if not a.tools else a.tools.split(",")
    stage, wrong = None, 0
    try:
        for scenario in scenarios:
            ds = generate.at_scenario_point(generate.Dataset.load(
                generate.ensure(generate.spec_for(scenario, True), a.datadir, verbose=False)), scenario)
            if scenario in generate.S3_SCENARIOS:
                if stage is None:
                    stage = s3mod.Stage().__enter__()
                    os.environ.update(stage.env())  # (this process is the tools' process)
                stage.upload(ds.dir)
            print(f"{scenario}", flush=True)
            for tool in (t for t in tools if applicable(t, scenario)):
                res = measure(tool, scenario, ds.dir)
                if res["status"] != "ok":
                    print(f"  {tool:20s} cannot do this ({res['reason']})", flush=True)
                    continue
                ok, detail, _ = check(tool, SCENARIO_KIND[scenario], ds, res)
                wrong += not ok
                print(f"  {tool:20s} {'ok' if ok else 'WRONG ANSWER'}: {detail}", flush=True)
    finally:
        if stage is not None:
            stage.__exit__(None, None, None)
    print(f"{wrong} wrong answer{'s' if wrong != 1 else ''}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
