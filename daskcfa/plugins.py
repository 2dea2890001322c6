"""Distributed worker plugins."""

from __future__ import annotations

from typing import Any, Mapping

from distributed.diagnostics.plugin import WorkerPlugin

from .storage import profiles

__all__ = ["StorageProfiles"]


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
        return cls({ref.name: profiles._REGISTRY[ref.name]}) if ref.name else cls({})

    def setup(self, worker: Any) -> None:
        profiles.install(self._profiles)

    def __repr__(self) -> str:
        return f"StorageProfiles({sorted(self._profiles)})"
