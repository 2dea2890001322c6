"""Analyse a CFA-netCDF dataset on a ``distributed`` cluster, with fragment budgets on every worker.

What it shows:
1. a ``distributed.LocalCluster`` of worker *processes* with one thread each
   (netCDF-C and HDF5 serialize calls inside a process: parallel reads come
   from processes), each with a node-local scratch directory
   (``local_directory``) for spilled data;
2. ``daskcfa.FragmentBudget`` registered on the client: every worker (also
   workers that join later) keeps at most ``--filehandles`` fragment files
   open and ``--memory`` bytes of fragment objects in memory;
3. the time mean and a one-point time series computed on the workers, then
   each worker's fragment file counters with
   ``client.run(daskcfa.fragment_stats)``: hits, misses, evictions, peaks.

Run: ``python examples/distributed_budget.py`` (a sample archive in a
temporary directory, results checked against numpy), or
``python examples/distributed_budget.py URL --variable tas --workers 4``.
Connect to an existing cluster instead with ``--scheduler tcp://host:8786``.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
from distributed import Client, LocalCluster

import daskcfa
import sample


def analyse(client: Client, url: str, variable: str | None, memory: str, filehandles: int) -> tuple:
    client.register_plugin(daskcfa.FragmentBudget(memory=memory, filehandles=filehandles))
    x = daskcfa.from_cfa(url, variable)
    print(f"{url}: {x.shape} {x.dtype}, {x.npartitions} chunks (= fragments) on "
          f"{len(client.scheduler_info()['workers'])} workers")
    point = tuple(n // 2 for n in x.shape[1:])
    mean = client.compute(x.mean(axis=0), sync=True)  # reads every fragment whole
    series = client.compute(x[(slice(None), *point)], sync=True)  # then one point of each: open handles reused
    print(f"time mean {mean.shape}: {float(mean.min()):.3f} to {float(mean.max()):.3f}")
    print(f"series at index {point}: {np.ma.round(series[:4], 3)}...")
    stats = client.run(daskcfa.fragment_stats)
    print("fragment files per worker (daskcfa.fragment_stats):")
    for address, counters in sorted(stats.items()):
        print(f"  {address}: hits={counters['hits']} misses={counters['misses']} evictions={counters['evictions']} "
              f"peak_files={counters['peak_files']}/{counters['filehandles_budget']} "
              f"peak_bytes={counters['peak_bytes']}")
    return mean, series, point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", help="aggregation file (default: write a sample to a temporary directory)")
    parser.add_argument("--variable", help="aggregated variable (path); needed when the file holds several")
    parser.add_argument("--scheduler", help="address of a running scheduler (default: start a LocalCluster)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the LocalCluster (default 2)")
    parser.add_argument("--worker-memory", default="1GiB", help="memory limit per worker (default 1GiB)")
    parser.add_argument("--memory", default="256MiB", help="fragment memory budget per worker (default 256MiB)")
    parser.add_argument("--filehandles", type=int, default=8, help="open fragment files per worker (default 8)")
    parser.add_argument("--scratch", help="node-local scratch directory for the workers (default: a temporary one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        if args.scheduler:
            cluster, client = None, Client(args.scheduler)
        else:
            cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                   memory_limit=args.worker_memory, local_directory=args.scratch or f"{tmp}/scratch",
                                   dashboard_address=None)
            client = Client(cluster)
        try:
            url = args.url or sample.write(f"{tmp}/tas.nca")
            mean, series, point = analyse(client, url, args.variable, args.memory, args.filehandles)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
        if not args.url:
            expected = sample.truth().astype("f8")
            np.testing.assert_allclose(mean, expected.mean(axis=0), rtol=1e-5)
            np.testing.assert_allclose(series, expected[(slice(None), *point)], rtol=1e-6)
            print("sample: results equal the ground truth")


if __name__ == "__main__":
    main()
