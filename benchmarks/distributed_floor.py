"""What a ``distributed`` cluster costs dask itself, against threads, on the graph of a whole-array mean.

    python -m benchmarks.distributed_floor [--fragments 100] [--shape 10,512,512] [--task-ms 31] [--rounds 7]

No daskcfa and no I/O: each chunk's task holds its thread for ``--task-ms`` milliseconds without the
GIL (sleeping, as an inflate or a ``pread`` runs) and returns a float32 array of the fragment's shape;
then ``mean(dtype="f8")`` as in the ``mean-zlib`` scenario, the same chunks and reduction tree. The
same graph runs on the threaded scheduler (2 threads) and on a ``LocalCluster`` of 2 worker processes
of 1 thread (``daskcfa-distributed``'s), in turn, ``--rounds`` times, after a warm-up of each; it
prints the wall times, the medians and cluster/threads pair by pair. Issue #31 asks daskcfa on the
cluster for at most 1.15x daskcfa on threads: what this prints is the ratio dask's scheduling alone
gives for tasks as long as daskcfa's (the default, 31 ms, is 2 threads x 1.57 s / 100 fragments, the
threaded zlib mean of the quiet run of session 17)."""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np


def _chunk(shape: tuple[int, ...], seconds: float, block_info: dict | None = None) -> np.ndarray:
    """A fragment's array after ``seconds`` of holding the thread without the GIL."""
    start = time.perf_counter()
    values = np.ones(shape, "f4")
    while (left := seconds - (time.perf_counter() - start)) > 0:
        time.sleep(min(left, 0.002))
    return values


def _mean(fragments: int, shape: tuple[int, ...], seconds: float):
    import dask.array as da

    chunks = ((shape[0],) * fragments, *((n,) for n in shape[1:]))
    return da.map_blocks(_chunk, shape, seconds, chunks=chunks, dtype="f4",
                         meta=np.empty((0,) * len(shape), "f4")).mean(dtype="f8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fragments", type=int, default=100)
    parser.add_argument("--shape", default="10,512,512", help="one fragment's shape")
    parser.add_argument("--task-ms", type=float, default=31.0, help="how long each chunk's task holds its thread")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    shape = tuple(int(n) for n in args.shape.split(","))
    seconds = args.task_ms / 1000

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        runs = {"threads": {"scheduler": "threads", "num_workers": 2}, "cluster": {"scheduler": client}}
        for how in runs.values():  # (warm-up: imports, the workers' first tasks)
            _mean(args.fragments, shape, seconds).compute(**how)
        walls: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, how in runs.items():
                graph = _mean(args.fragments, shape, seconds)
                gc.collect()
                start = time.perf_counter()
                graph.compute(**how)
                walls[name].append(time.perf_counter() - start)
    threads, cluster_ = statistics.median(walls["threads"]), statistics.median(walls["cluster"])
    pairs = [c / t for c, t in zip(walls["cluster"], walls["threads"])]
    print(f"{args.fragments} chunks of {shape}, tasks of {args.task_ms:g} ms, {args.rounds} rounds")
    print("threads (s): " + " ".join(f"{w:.3f}" for w in walls["threads"]) + f"  median {threads:.3f}")
    print("cluster (s): " + " ".join(f"{w:.3f}" for w in walls["cluster"]) + f"  median {cluster_:.3f}")
    print(f"cluster / threads: median of the walls {cluster_ / threads:.3f}x; pair by pair "
          + " ".join(f"{p:.3f}" for p in pairs) + f" (median {statistics.median(pairs):.3f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
