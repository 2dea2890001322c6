"""Re-fragment a CFA archive in a SLURM batch job, on dask workers started by dask-jobqueue.

What it shows:
1. ``dask_jobqueue.SLURMCluster``: every SLURM job is one dask worker process
   with one thread (``cores=1, processes=1``: netCDF-C/HDF5 serialize inside
   a process, so parallelism comes from processes), with its own ``memory``
   and ``walltime``; ``interface`` picks the network the workers talk on
   (``lo`` on a one-node SLURM, ``ib0``/``eth0`` on a real cluster);
   ``job_script_prologue`` sets up each job's environment (here: activate
   this Python's virtual environment); ``local_directory`` puts the
   workers' spill space on node-local scratch (``$TMPDIR``);
2. the workers as SLURM jobs: ``squeue`` is polled while they run, and the
   jobs seen running are reported;
3. ``daskcfa.refragment(source, target, fragment_shape=..., max_mem=...)``
   on those workers: the archive rewritten with a new fragment shape (by
   default from one map per year to time series tiles), every new fragment
   written by its own task, no data through this process;
4. the check that the new archive holds exactly the old one's values.

Run: ``python examples/slurm_refragment.py`` (needs SLURM's ``sbatch``;
writes a sample archive to a temporary directory, which must be visible to
the compute nodes: choose it with ``--workdir``). On a real archive, e.g. on
JASMIN's LOTUS::

    python examples/slurm_refragment.py /gws/.../tas.nca /gws/.../tas_ts.nca \\
        --fragment-shape time=1200,lat=30,lon=30 --jobs 8 --memory 8GiB \\
        --walltime 02:00:00 --partition short-serial --interface ib0

This script can itself run as a batch job (``sbatch --wrap "python ..."``):
it then submits the worker jobs from there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import dask.array as da
from dask_jobqueue import SLURMCluster
from distributed import Client

import daskcfa
import sample


class SqueueWatch(threading.Thread):
    """Polls ``squeue`` for jobs named ``job_name``; records every job seen RUNNING, and on which nodes."""

    def __init__(self, job_name: str, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.job_name, self.interval = job_name, interval
        self.running: dict[str, str] = {}  # job id -> node list
        self._done = threading.Event()

    def poll(self) -> list[list[str]]:
        """One ``squeue`` snapshot of our jobs: rows of (job id, state, nodes)."""
        out = subprocess.run(["squeue", "--noheader", "--name", self.job_name, "--format", "%i %T %N"],
                             capture_output=True, text=True, timeout=10).stdout
        rows = [line.split(maxsplit=2) for line in out.splitlines() if line.strip()]
        for row in rows:
            if len(row) == 3 and row[1] == "RUNNING":
                self.running[row[0]] = row[2]
        return rows

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self._done.set()
        self.join()


def parse_shape(text: str) -> dict[str, int] | tuple[int, ...]:
    """``time=120,lat=15`` (by dimension) or ``120,15,30`` (every dimension)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if all("=" in p for p in parts):
        return {name: int(size) for name, size in (p.split("=", 1) for p in parts)}
    return tuple(int(p) for p in parts)


def start_cluster(args: argparse.Namespace, log_directory: str) -> SLURMCluster:
    prologue = list(args.prologue)
    if sys.prefix != sys.base_prefix:  # running in a virtual environment: the jobs activate it too
        prologue.insert(0, f"source {sys.prefix}/bin/activate")
    return SLURMCluster(
        job_name=args.job_name,
        queue=args.partition,
        account=args.account,
        cores=1,
        processes=1,
        memory=args.memory,
        walltime=args.walltime,
        interface=args.interface,
        job_script_prologue=prologue,
        local_directory=args.scratch,
        log_directory=log_directory,
        python=sys.executable,
    )


def wait_for_workers(client: Client, n: int, timeout: float, log_directory: str) -> None:
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError:
        tails = [path.read_text()[-2000:] for path in sorted(Path(log_directory).glob("*.err"))]
        queue = subprocess.run(["squeue", "--format", "%i %j %T %R"], capture_output=True, text=True,
                               timeout=10).stdout  # the reason a job still waits, if one does
        raise SystemExit(f"{n} workers did not connect within {timeout:.0f} s; squeue:\n{queue}"
                         f"job logs in {log_directory}:\n" + "\n".join(tails)) from None


def same_values(source: str, target: str) -> bool:
    """Whether every aggregated variable of ``target`` equals ``source``'s: values, masks, NaNs (on the workers)."""
    with daskcfa.open_cfa(source) as old, daskcfa.open_cfa(target) as new:
        if set(old.aggregated_variables) != set(new.aggregated_variables):
            return False
        checks = []
        for path, var in old.aggregated_variables.items():
            a, b = var.data, new.aggregated_variables[path].data
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            ma, mb = da.ma.getmaskarray(a), da.ma.getmaskarray(b)
            fa, fb = da.ma.filled(a, 0), da.ma.filled(b, 0)
            equal = fa == fb
            if a.dtype.kind in "fc":
                equal |= da.isnan(fa) & da.isnan(fb)
            checks.append(((ma == mb) & (equal | ma)).all())
        return all(bool(ok) for ok in da.compute(*checks))


def refragment(source: str, target: str, fragment_shape: str, max_mem: str) -> None:
    """Plan (metadata only, printed), then re-fragment on the cluster's workers (the default client)."""
    shape = parse_shape(fragment_shape)
    print(daskcfa.plan_refragment(source, fragment_shape=shape, max_mem=max_mem))
    t0 = time.perf_counter()
    daskcfa.refragment(source, target, fragment_shape=shape, max_mem=max_mem)
    print(f"refragmented in {time.perf_counter() - t0:.1f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", nargs="?", help="aggregation file to re-fragment (default: a sample archive)")
    parser.add_argument("target", nargs="?", help="new aggregation file (default: beside the source, _ts suffix)")
    parser.add_argument("--fragment-shape", default="time=120,lat=15,lon=30",
                        help="new fragment shape, by dimension or positional (default: time=120,lat=15,lon=30)")
    parser.add_argument("--max-mem", default="512MiB", help="memory per task while re-fragmenting (default 512MiB)")
    parser.add_argument("--jobs", type=int, default=2, help="SLURM jobs = dask workers (default 2)")
    parser.add_argument("--memory", default="2GiB", help="memory per job (default 2GiB)")
    parser.add_argument("--walltime", default="00:10:00", help="walltime per job (default 00:10:00)")
    parser.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    parser.add_argument("--account", help="SLURM account")
    parser.add_argument("--interface", default="lo",
                        help="network interface of scheduler and workers (default lo: one node; ib0/eth0 on clusters)")
    parser.add_argument("--scratch", default="${TMPDIR:-/tmp}",
                        help="workers' node-local scratch, expanded in the job (default ${TMPDIR:-/tmp})")
    parser.add_argument("--prologue", action="append", default=[], metavar="LINE",
                        help="extra job script line before the worker starts (repeatable), e.g. 'module load ...'")
    parser.add_argument("--job-name", default="daskcfa-refragment", help="SLURM job name of the workers")
    parser.add_argument("--workdir", help="directory for the sample archive and job logs (default: temporary)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the workers (default 120)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        source = args.source or sample.write(os.path.join(workdir, "tas.nca"))
        target = args.target or (source.rsplit(".", 1)[0] + "_ts.nca")
        log_directory = os.path.join(workdir, "slurm-logs")
        watch = SqueueWatch(args.job_name)
        t0 = time.perf_counter()
        with start_cluster(args, log_directory) as cluster, Client(cluster) as client:
            cluster.scale(jobs=args.jobs)
            watch.start()
            wait_for_workers(client, args.jobs, args.timeout, log_directory)
            print(f"{args.jobs} workers connected in {time.perf_counter() - t0:.1f} s "
                  f"(scheduler {cluster.scheduler_address})")
            print("squeue:")
            for row in watch.poll():
                print("  " + " ".join(row))
            jobs = {name: job.job_id for name, job in cluster.workers.items()}
            refragment(source, target, args.fragment_shape, args.max_mem)
            ok = same_values(source, target)
            watch.stop()
        seen = sorted(job for job in jobs.values() if job in watch.running)
        print(f"worker jobs seen RUNNING in squeue: {', '.join(seen) or 'none'} (of {', '.join(sorted(jobs.values()))})")
        old, new = daskcfa.from_cfa(source), daskcfa.from_cfa(target)
        print(f"{source}: {old.npartitions} fragments {old.chunksize} -> {target}: {new.npartitions} fragments "
              f"{new.chunksize}")
        if not ok:
            raise SystemExit("the re-fragmented archive differs from the source")
        print("target equals source")


if __name__ == "__main__":
    main()
