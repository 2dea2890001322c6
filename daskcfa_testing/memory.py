"""Peak memory of the worker processes of a ``distributed`` cluster, measured on the workers.

Used by the tests and benchmarks that check a memory budget in reality::

    with WorkerPeakMemory(client) as peaks:
        daskcfa.refragment(...)
    peaks.growth  # {worker address: peak RSS - RSS before, in bytes}

On entry every worker records its RSS (the baseline), resets the kernel's
peak-RSS mark (``/proc/self/clear_refs``, Linux) when it can, and starts a
thread sampling its RSS; on exit the peak is the larger of the sampled peak
and the kernel's mark (``VmHWM``), which catches spikes between samples.
"""

from __future__ import annotations

import threading
from typing import Any

import psutil

__all__ = ["WorkerPeakMemory"]

_SAMPLERS: dict[str, Any] = {}


def peak_rss(pid: int | str = "self") -> int | None:
    """The kernel's record of a process's peak resident memory (``VmHWM``, Linux), in bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _start(interval: float, dask_worker: Any = None) -> int:
    """Worker side: baseline RSS, reset the peak mark, start sampling."""
    process = psutil.Process()
    baseline = process.memory_info().rss
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        kernel = True
    except OSError:
        kernel = False
    state = {"baseline": baseline, "peak": baseline, "kernel": kernel, "stop": threading.Event()}

    def sample() -> None:
        while not state["stop"].wait(interval):
            state["peak"] = max(state["peak"], process.memory_info().rss)

    thread = threading.Thread(target=sample, name="daskcfa-peak-memory", daemon=True)
    state["thread"] = thread
    _SAMPLERS["current"] = state
    thread.start()
    return baseline


def _stop(dask_worker: Any = None) -> dict[str, Any]:
    """Worker side: stop sampling; the baseline and the peak RSS."""
    state = _SAMPLERS.pop("current")
    state["stop"].set()
    state["thread"].join()
    peak = max(state["peak"], psutil.Process().memory_info().rss)
    hwm = peak_rss() if state["kernel"] else None
    if hwm is not None:
        peak = max(peak, hwm)
    return {"baseline": state["baseline"], "peak": peak, "kernel": hwm is not None}


class WorkerPeakMemory:
    """Context manager measuring each worker's peak RSS over the block, relative to its RSS on entry."""

    def __init__(self, client: Any, interval: float = 0.01) -> None:
        self.client = client
        self.interval = interval
        self.results: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> "WorkerPeakMemory":
        self.client.run(_start, self.interval)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.results = self.client.run(_stop)

    @property
    def growth(self) -> dict[str, int]:
        """Peak RSS minus the RSS on entry, per worker address (bytes)."""
        return {w: r["peak"] - r["baseline"] for w, r in self.results.items()}

    @property
    def peak(self) -> dict[str, int]:
        return {w: r["peak"] for w, r in self.results.items()}
