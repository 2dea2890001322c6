"""Bounds that refuse absurd aggregation instructions before anything is allocated.

A corrupt or hostile aggregation file is small but may *claim* anything: a
map of 10^12 fragments, a dimension of 10^15 elements, an instruction
variable of a terabyte that was declared but never written, or compressed
so well that 50 kB inflate to gigabytes. Each claim is checked against dask
config limits before any array is allocated or read:

- ``daskcfa.limits.max-memory`` (default 1 GiB): the bytes parsing one
  aggregation file may make the reader allocate, summed over its aggregated
  variables: instruction variables as declared (shape x item size, and the
  Python objects strings become), JSON attributes at their worst expansion,
  and :data:`FRAGMENT_BYTES` per fragment of every grid;
- ``daskcfa.limits.max-fragments`` (default: as many fragments as that
  memory holds, ``max-memory // FRAGMENT_BYTES``);
- ``daskcfa.limits.max-elements`` (default 10^14): the aggregated array;
- ``daskcfa.limits.max-group-depth`` (default 100): nested groups, which
  every consumer of the opened dataset (xarray's datatree, ``describe``)
  would otherwise follow as deep as a file likes.

Parsers charge what they are about to allocate with :func:`charge` inside
:func:`parsing`, one account per aggregation file.
"""

from __future__ import annotations

import contextvars
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import dask.config
from dask.utils import parse_bytes

from .errors import CFAFormatError

#: 1 GiB: a million fragments with their URIs take about a quarter of it.
DEFAULT_MAX_MEMORY = 1 << 30
#: What one fragment costs once parsed: its model columns and graph (README, "What scales how": ~230 bytes).
FRAGMENT_BYTES = 256
#: A Python ``str`` in an object array: the object header and the array's pointer.
STRING_BYTES = 64
#: Bytes of Python objects per byte of JSON text, at worst (``[[],[],...]``: a 56-byte list per 3 bytes).
JSON_EXPANSION = 24
#: Groups nested deeper than this are refused (netCDF files rarely nest more than a few).
DEFAULT_MAX_GROUP_DEPTH = 100
#: 10^14 elements: 400 TB of 4-byte values in one variable, beyond any archive's single variable.
DEFAULT_MAX_ELEMENTS = 10**14
#: Characters of one string in a ``char`` fragment (its string-length dimension): 1 MiB.
DEFAULT_MAX_STRING_LENGTH = 1 << 20


def max_memory() -> int:
    """``daskcfa.limits.max-memory`` in bytes (a number or a string such as ``"2GiB"``)."""
    value = dask.config.get("daskcfa.limits.max-memory", DEFAULT_MAX_MEMORY)
    return parse_bytes(value) if isinstance(value, str) else int(value)


def max_json_bytes() -> int:
    """The largest JSON document daskcfa reads (a reference set, Zarr metadata, a manifest): parsed,
    JSON takes up to :data:`JSON_EXPANSION` bytes per character, so a document may take at most
    ``max-memory`` once parsed."""
    return max_memory() // JSON_EXPANSION


def max_fragments() -> int:
    value = dask.config.get("daskcfa.limits.max-fragments", None)
    return int(value) if value is not None else max_memory() // FRAGMENT_BYTES


def max_elements() -> int:
    return int(dask.config.get("daskcfa.limits.max-elements", DEFAULT_MAX_ELEMENTS))


def max_string_length() -> int:
    return int(dask.config.get("daskcfa.limits.max-string-length", DEFAULT_MAX_STRING_LENGTH))


@dataclass
class _Account:
    source: str
    used: int = 0


_ACCOUNT: contextvars.ContextVar[_Account | None] = contextvars.ContextVar("daskcfa_parse_account", default=None)


@contextmanager
def parsing(source: str) -> Iterator[None]:
    """One memory account for everything parsed from the aggregation file ``source``
    (nested calls for the same file share it)."""
    current = _ACCOUNT.get()
    if current is not None and current.source == source:
        yield
        return
    token = _ACCOUNT.set(_Account(source))
    try:
        yield
    finally:
        _ACCOUNT.reset(token)


def remaining() -> int:
    """Bytes the file being parsed may still make the reader allocate."""
    account = _ACCOUNT.get()
    return max(0, max_memory() - (account.used if account is not None else 0))


def charge(nbytes: int, what: str, **where: Any) -> None:
    """Count ``nbytes`` about to be allocated for ``what``; refuse them beyond ``max-memory``."""
    account = _ACCOUNT.get()
    used = account.used if account is not None else 0
    limit = max_memory()
    if used + nbytes > limit:
        earlier = f" (this file's instructions already took {used:,})" if used else ""
        raise CFAFormatError(
            f"{what} would make the reader allocate {nbytes:,} bytes{earlier}, more than the limit of "
            f"{limit:,} bytes (raise dask config 'daskcfa.limits.max-memory' if this is genuine)",
            **where,
        )
    if account is not None:
        account.used += nbytes


def check_fragment_count(counts: Sequence[Any], **where: Any) -> None:
    """Refuse a fragment grid larger than ``daskcfa.limits.max-fragments``, and charge its memory.

    A dimension without fragments (zero-length) counts as one: it must not
    let the other dimensions list any number of fragments.
    """
    total = 1
    for n in counts:
        total *= max(int(n), 1)
    if total > max_fragments():
        raise CFAFormatError(
            f"the instructions describe {total:,} fragments, more than the limit of {max_fragments():,} "
            "(raise dask config 'daskcfa.limits.max-fragments' if this is genuine)",
            **where,
        )
    charge(total * FRAGMENT_BYTES, f"a grid of {total:,} fragments", **where)


def check_array_size(dims: Sequence[str], shape: Sequence[int], **where: Any) -> None:
    """Refuse an aggregated array of more than ``daskcfa.limits.max-elements`` elements."""
    total = math.prod(int(n) for n in shape)
    if total > max_elements():
        described = ", ".join(f"{d}={int(n):,}" for d, n in zip(dims, shape))
        raise CFAFormatError(
            f"the aggregated dimensions ({described}) describe {total:,} elements, more than the limit of "
            f"{max_elements():,} (raise dask config 'daskcfa.limits.max-elements' if this is genuine)",
            **where,
        )


def check_group_depth(depth: int, **where: Any) -> None:
    """Refuse groups nested deeper than ``daskcfa.limits.max-group-depth``."""
    limit = int(dask.config.get("daskcfa.limits.max-group-depth", DEFAULT_MAX_GROUP_DEPTH))
    if depth > limit:
        raise CFAFormatError(
            f"groups are nested {depth} levels deep, deeper than the limit of {limit} "
            "(raise dask config 'daskcfa.limits.max-group-depth' if this is genuine)",
            **where,
        )
