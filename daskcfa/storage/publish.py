"""Putting an aggregation file in place: the write modes, what each does with a
target that exists, and the atomic put under a lease.

One home for the rule every writer follows (``to_cfa``, ``aggregate``,
``rebuild``, ``relocate``, ``refragment``): ``"w-"`` never overwrites, ``"w"``
replaces, ``"r+"`` updates an existing file, ``"a"`` grows one (or creates it).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import ArgumentError, TargetExistsError, redact
from ..logs import logger
from .atomic import put_atomic
from .lease import Lease
from .objects import exists
from .profiles import ProfileRef

__all__ = ["WRITE_MODES", "UPDATE_MODES", "WHOLE_FILE_MODES", "check_mode", "refuse_existing", "put_aggregation"]

log = logger(__name__)

#: Every write mode (``to_cfa``).
WRITE_MODES = ("w-", "w", "a", "r+")
#: The modes that change an existing aggregation (and keep what they do not change).
UPDATE_MODES = ("a", "r+")
#: The modes of writers that write a whole new file and cannot update one.
WHOLE_FILE_MODES = ("w-", "w")


def check_mode(mode: str, allowed: Sequence[str] = WRITE_MODES) -> str:
    """``mode`` if it is one of ``allowed``; ValueError otherwise."""
    if mode not in allowed:
        raise ArgumentError(f"mode must be one of {', '.join(allowed)}, got {mode!r}")
    return mode


def refuse_existing(url: str, mode: str, profile: ProfileRef, hint: str = "mode='w-' never overwrites") -> bool:
    """Whether ``url`` exists; :class:`TargetExistsError` (saying ``hint``) if it does and ``mode`` is ``"w-"``."""
    found = exists(url, profile)
    if found and mode == "w-":
        raise TargetExistsError(f"the target exists; {hint}", file=url)
    return found


def put_aggregation(url: str, payload: bytes, mode: str, profile: ProfileRef, lease: Lease | None = None, *,
                    detail: str = "") -> None:
    """Put an encoded aggregation file in place: written under a temporary name, then moved.

    ``mode="w-"`` refuses a file that exists by now (it may have appeared
    since the caller last looked). Without ``lease`` (held by the caller), a
    lease on ``url`` is taken for the while; with it, the lease is looked at
    right before the put (the last look: a successor that took it over from a
    live writer keeps that writer's generation a lease's time for this put's
    sake, :func:`~daskcfa.storage.lease.retire_abandoned`). The commit is logged at INFO,
    with ``detail`` (what the caller wrote or referenced).
    """
    own = lease is None
    held = Lease.new(url, profile).acquire() if lease is None else lease
    try:
        if not own:
            held.confirm(force=True)
        refuse_existing(url, mode, profile)
        put_atomic(url, payload, profile)
        log.info("committed aggregation file %s (%s%d bytes, mode %r)", redact(url),
                 f"{detail}; " if detail else "", len(payload), mode)
    finally:
        if own:
            held.release()
