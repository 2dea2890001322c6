"""Where a write goes: the one way every writer prepares its target.

``to_cfa``, ``aggregate``/``rebuild``/``refragment``, ``relocate``,
``to_references`` and ``daskcfa.Dataset(url, "w"/"x"/"a"/"r+")`` all open their
target here, so they agree on what a target URL means: any ``user:password@``
taken out of it (as readers take it out: :func:`~daskcfa.storage.access.open_aggregation`),
the location policy of what the target will refer to, the mode rule of
:mod:`daskcfa.storage.publish` (an existing target refused as a
:class:`~daskcfa.errors.TargetExistsError`, a missing one to update as a
:class:`~daskcfa.errors.NotFoundError`, both naming the credential-free URL),
and the lease that keeps other writers out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import dask

from ..errors import ArgumentError, NotFoundError, TargetExistsError, redact
from ..storage.access import Access, open_aggregation
from ..storage.lease import Lease, generation_of
from ..storage.local import real_location
from ..storage.manifest import check_bookkeeping, other_owner
from ..storage.profiles import ProfileRef
from ..storage.publish import UPDATE_MODES, WRITE_MODES, check_mode, refuse_existing

__all__ = ["WriteTarget", "nothing_to_update"]


def nothing_to_update(mode: str, url: str) -> NotFoundError:
    """The error of an update whose target is not there (or was removed before the lease was held)."""
    return NotFoundError(f"mode={mode!r} updates an existing file, and there is none", file=url)


@dataclass(frozen=True)
class WriteTarget:
    """A write's target, prepared: its URL (credential-free), how to reach it, its mode, and whether it exists.

    Holds nothing secret (credentials stay behind ``access.profile``), so it
    may appear in reprs, logs and task graphs.
    """

    url: str
    access: Access
    mode: str  #: one of :data:`~daskcfa.storage.publish.WRITE_MODES`
    exists: bool

    @property
    def profile(self) -> ProfileRef:
        return self.access.profile

    @classmethod
    def open(cls, url: str, storage_options: Mapping[str, Any] | None, mode: str, *,
             modes: Sequence[str] = WRITE_MODES, hint: str = "use mode='w' to overwrite it",
             asked: str | None = None, allowed_locations: Iterable[str] | None = None,
             stem: bool = True) -> "WriteTarget":
        """The target at ``url`` for a write in ``mode`` (one of ``modes``).

        ``"w-"`` refuses a target that exists (saying ``hint``), ``"r+"`` one
        that does not. ``asked`` is how the caller's user spelt the mode
        (netCDF4-python's ``"a"`` is ``"r+"`` here), for the messages. ``stem``: the target keeps
        its fragments, manifest and versions in ``<stem>/`` (an aggregation file), which must then be
        no other aggregation file's (``a.nc`` and ``a.nca`` would share ``a/``).
        """
        check_mode(mode, modes)
        url, access = open_aggregation(url, storage_options, allowed_locations)
        if generation_of(real_location(url)) is not None:  # (also named through a link to the directory)
            raise ArgumentError("the target lies in a generation directory (g-<16 hex digits>/), where a daskcfa "
                                "dataset keeps its fragments: writing it would replace one; write it elsewhere",
                                file=url)
        exists = refuse_existing(url, mode, access.profile, hint)
        if mode == "r+" and not exists:
            raise nothing_to_update(asked or mode, url)
        if stem:
            Lease.new(url, access.profile)  # (a target no lease can guard is refused before its <stem>/ is read)
            check_bookkeeping(url)
        other = other_owner(url, access.profile) if stem else None
        if other is not None:
            raise TargetExistsError(f"its fragment directory is that of {redact(other)} (the same name before the "
                                    f"extension): write it under another name", file=url)
        return cls(url, access, mode, exists)

    @classmethod
    def for_netcdf4(cls, url: str, storage_options: Mapping[str, Any] | None, mode: str,
                    clobber: bool, stem: bool = True) -> "WriteTarget":
        """The target of ``daskcfa.Dataset(url, mode, clobber=clobber)`` (netCDF4-python's modes, ``"x"``
        already made ``"w"`` with ``clobber=False``): ``"a"`` and ``"r+"`` update an existing file."""
        ours = ("w" if clobber else "w-") if mode == "w" else "r+"
        return cls.open(url, storage_options, ours, asked=mode, hint="clobber=False (or mode 'x') never overwrites",
                        stem=stem)

    def lease(self, generation: str = "", *, acquire: bool = False) -> Lease:
        """The lease on this target (see :mod:`daskcfa.storage.lease`), taken now when ``acquire``.

        An update waits for another writer's lease (dask config
        ``daskcfa.write.lease-wait``): concurrent updates queue up. A new
        write fails at once instead.
        """
        lease = Lease.new(self.url, self.profile, generation)
        if acquire:
            lease.acquire(wait=float(dask.config.get("daskcfa.write.lease-wait")) if self.mode in UPDATE_MODES else 0.0)
        return lease
