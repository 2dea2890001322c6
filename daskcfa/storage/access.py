"""How a reader may reach storage: the credentials reference and the location policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .policy import LocationPolicy
from .profiles import ProfileRef, register
from .uri import scheme_of


@dataclass(frozen=True)
class Access:
    """Everything a task needs to open fragments, and nothing secret."""

    profile: ProfileRef
    policy: LocationPolicy

    @classmethod
    def default(cls, source: str) -> "Access":
        return cls(ProfileRef(None), LocationPolicy.for_aggregation(source))

    @classmethod
    def for_aggregation(cls, url: str, storage_options: Mapping[str, Any] | None = None,
                        allowed_locations: Iterable[str] | None = None) -> "Access":
        return cls(register(storage_options, protocol=scheme_of(url)),
                   LocationPolicy.for_aggregation(url, allowed_locations))
