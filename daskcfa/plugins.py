"""Distributed worker plugins (:class:`StorageProfiles` lives with the profiles it installs)."""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .fragments.manager import DEFAULT_FILEHANDLES, DEFAULT_MEMORY, Budget, manager
from .storage.profiles import StorageProfiles

__all__ = ["StorageProfiles", "FragmentBudget", "fragment_stats"]


class FragmentBudget(WorkerPlugin):
    """Per-worker budgets for open fragment files and fragment bytes in memory.

    ``client.register_plugin(FragmentBudget(memory="1GiB", filehandles=64))``
    configures the fragment file manager of every worker, including workers
    that join later; at teardown every cached fragment is closed (and an in-process
    worker's process follows the dask config's budgets again). Read the
    counters with ``client.run(daskcfa.fragment_stats)``.
    """

    idempotent = False

    def __init__(self, memory: str | int = DEFAULT_MEMORY, filehandles: int = DEFAULT_FILEHANDLES) -> None:
        self.budget = Budget.parse(filehandles=filehandles, memory=memory)

    def setup(self, worker: Any) -> None:
        manager().configure(self.budget)

    def teardown(self, worker: Any) -> None:
        manager().close_all()
        manager().configure(None)  # (a worker in this very process: its budgets follow the dask config again)

    def __repr__(self) -> str:
        return f"FragmentBudget(memory={self.budget.memory}, filehandles={self.budget.filehandles})"


def fragment_stats() -> dict[str, int]:
    """This process's fragment file manager counters (use with ``client.run``)."""
    return manager().stats()
