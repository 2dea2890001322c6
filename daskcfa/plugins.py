"""Distributed worker plugins."""

from __future__ import annotations

from typing import Any, Mapping

from distributed.diagnostics.plugin import WorkerPlugin

from .fragments.manager import DEFAULT_FILEHANDLES, DEFAULT_MEMORY, Budget, manager
from .storage import profiles

__all__ = ["StorageProfiles", "FragmentBudget", "fragment_stats"]


class StorageProfiles(WorkerPlugin):
    """Installs storage options on every worker (also on workers that join later),
    so that tasks can refer to them by name instead of carrying credentials."""

    idempotent = True

    def __init__(self, profiles_by_name: Mapping[str, Mapping[str, Any]]) -> None:
        self._profiles = {k: dict(v) for k, v in profiles_by_name.items()}

    @classmethod
    def from_options(cls, storage_options: Mapping[str, Any], *, protocol: str = "s3") -> "StorageProfiles":
        """The plugin for options given to ``from_cfa(..., storage_options=...)``."""
        ref = profiles.register(storage_options, protocol=protocol)
        return cls(profiles.encoded({ref.name: profiles._REGISTRY[ref.name]})) if ref.name else cls({})

    def setup(self, worker: Any) -> None:
        profiles.install(self._profiles)

    def __repr__(self) -> str:
        return f"StorageProfiles({sorted(self._profiles)})"


class FragmentBudget(WorkerPlugin):
    """Per-worker budgets for open fragment files and fragment bytes in memory.

    ``client.register_plugin(FragmentBudget(memory="1GiB", filehandles=64))``
    configures the fragment file manager of every worker, including workers
    that join later; at teardown every cached fragment is closed. Read the
    counters with ``client.run(daskcfa.fragment_stats)``.
    """

    idempotent = False

    def __init__(self, memory: str | int = DEFAULT_MEMORY, filehandles: int = DEFAULT_FILEHANDLES) -> None:
        self.budget = Budget.parse(filehandles=filehandles, memory=memory)

    def setup(self, worker: Any) -> None:
        manager().configure(self.budget)

    def teardown(self, worker: Any) -> None:
        manager().close_all()

    def __repr__(self) -> str:
        return f"FragmentBudget(memory={self.budget.memory}, filehandles={self.budget.filehandles})"


def fragment_stats() -> dict[str, int]:
    """This process's fragment file manager counters (use with ``client.run``)."""
    return manager().stats()
