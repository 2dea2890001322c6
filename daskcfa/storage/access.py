"""How a reader may reach storage: the credentials reference, the location policy,
and what to do with a fragment that cannot be read."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .. import config
from ..errors import ArgumentError
from . import redaction
from .policy import LocationPolicy
from .profiles import ProfileRef, register, split_url_credentials, with_profile
from .uri import normalise, scheme_of

#: ``missing=`` choices: raise the fragment's error, or read the fragment as missing data.
MISSING_CHOICES = ("raise", "fill")


@dataclass(frozen=True)
class Access:
    """Everything a task needs to open fragments, and nothing secret.

    ``missing="fill"`` reads a fragment that is absent or unreadable (not
    netCDF, truncated, corrupt, wrong shape) as missing data, with a
    :class:`~daskcfa.errors.CFAWarning` naming it, instead of raising.
    """

    profile: ProfileRef
    policy: LocationPolicy
    missing: str = "raise"
    #: the chunk index read beside the aggregation file (a
    #: :class:`daskcfa.fragments.chunk_index.ChunkIndex`), or None: fragments read the usual way
    chunk_index: Any = None

    def __post_init__(self) -> None:
        _check_missing(self.missing)

    @classmethod
    def default(cls, source: str) -> "Access":
        return cls(ProfileRef(None), LocationPolicy.for_aggregation(source))

    def with_logins(self, logins: str | None) -> "Access":
        """This access, also sending the logins an aggregated variable's fragment URIs held
        (:attr:`daskcfa.model.AggregatedVariable.logins`) to their origins."""
        if logins is None:
            return self
        return dataclasses.replace(self, profile=with_profile(self.profile, ProfileRef(logins)))

    @classmethod
    def for_aggregation(cls, url: str, storage_options: Mapping[str, Any] | None = None,
                        allowed_locations: Iterable[str] | None = None, missing: str = "raise") -> "Access":
        _check_missing(missing)  # before the options are registered anywhere
        profile = register(storage_options, protocol=scheme_of(url))
        return cls(profile, LocationPolicy.for_aggregation(url, allowed_locations, profile), missing)


def open_aggregation(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None,
                     allowed_locations: Iterable[str] | None = None, missing: str = "raise") -> tuple[str, Access]:
    """The aggregation file's normalised URL (a path object, as netCDF4-python and xarray take,
    as its path), any ``user:password@`` taken out of it (into the storage profile, so that
    reprs, graphs and summaries never show it), and the :class:`Access` to read it and its
    fragments with."""
    config.check()
    url = os.fspath(url) if isinstance(url, os.PathLike) else url
    if not isinstance(url, str):
        raise ArgumentError(f"an aggregation's URL is a string or a path, not {type(url).__name__}")
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ArgumentError(f"storage_options is a mapping of fsspec's options, not {type(storage_options).__name__}")
    url, storage_options = split_url_credentials(url, storage_options)
    redaction.remember(None, url)  # (a signed query stays in the URL: fsspec and aiohttp log it)
    url = normalise(url)
    return url, Access.for_aggregation(url, storage_options, allowed_locations, missing)


def _check_missing(missing: str) -> None:
    if missing not in MISSING_CHOICES:
        raise ArgumentError(f"missing must be one of {', '.join(map(repr, MISSING_CHOICES))}, got {missing!r}")
