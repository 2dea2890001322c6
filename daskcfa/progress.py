"""Progress as lines, for logs: the command line's ``--progress`` where stderr is not a terminal.

A terminal gets dask's (or distributed's) progress bar, redrawn in place
with carriage returns. A file (a SLURM job's log, ``2> log``) would collect
hundreds of such redraws on one line; there daskcfa writes one line each time
another :data:`STEP` percent of the tasks are done::

    daskcfa: 35% of 1,234 tasks done (12.3s)
"""

from __future__ import annotations

import time
from typing import Any, TextIO

from dask.callbacks import Callback
from dask.utils import format_time

__all__ = ["STEP", "Milestones", "LineProgress", "cluster_line_progress"]

#: Percent of the tasks between two lines.
STEP = 5


class Milestones:
    """The line to print when ``done`` of ``total`` tasks passes the next multiple of ``step`` percent."""

    def __init__(self, out: TextIO, step: int = STEP, minimum: float = 0.0, prefix: str = "daskcfa") -> None:
        self.out, self.step, self.minimum, self.prefix = out, step, minimum, prefix
        self.start = time.perf_counter()
        self.last = 0  #: the last percentage printed (0: none yet)

    def update(self, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed < self.minimum:
            return
        percent = 100 if total <= 0 else min(100, 100 * done // total)
        mark = percent - percent % self.step
        if mark <= self.last:
            return
        self.last = mark
        self.out.write(f"{self.prefix}: {mark}% of {total:,} tasks done ({format_time(elapsed)})\n")
        self.out.flush()


class LineProgress(Callback):
    """Progress lines for computations on the local schedulers (dask's callback interface)."""

    def __init__(self, out: TextIO, minimum: float = 0.0, step: int = STEP) -> None:
        super().__init__()
        self._out, self._minimum, self._step = out, minimum, step
        self._milestones: Milestones | None = None

    def _start(self, dsk: Any) -> None:
        self._milestones = Milestones(self._out, self._step, self._minimum)

    def _posttask(self, key: Any, result: Any, dsk: Any, state: dict, worker_id: Any) -> None:
        done = len(state["finished"])
        total = done + sum(len(state[k]) for k in ("ready", "waiting", "running"))
        assert self._milestones is not None
        self._milestones.update(done, total)

    def _finish(self, dsk: Any, state: dict, errored: bool) -> None:
        if not errored and self._milestones is not None:
            self._milestones.update(1, 1)


def cluster_line_progress(futures: Any, out: TextIO, step: int = STEP) -> None:
    """Progress lines for ``futures`` on a distributed cluster, until they are done (every task they need)."""
    from distributed.diagnostics.progressbar import TextProgressBar

    class _Lines(TextProgressBar):
        def _draw_bar(self, remaining: int, all: int, **kwargs: Any) -> None:
            milestones.update(all - remaining, all)

        def _draw_stop(self, **kwargs: Any) -> None:
            pass

    milestones = Milestones(out, step)
    _Lines(futures, complete=True)
