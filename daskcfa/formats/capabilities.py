"""What each dialect daskcfa writes can carry: one table, consulted by the encoder, the writers and their messages.

The dialects' names are :data:`daskcfa.choices.WRITE_FORMATS` (kept there, free
of imports, for the command line's parser); this table says what each can
describe, so that a rule such as "which dialects can mark a fragment
missing" is written once.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Capabilities", "CAPABILITIES", "can", "dialects_that", "listed"]


@dataclass(frozen=True)
class Capabilities:
    """What aggregations written in one dialect can describe."""

    #: the name readers give the dialect (``AggregatedVariable.dialect``)
    read_as: str
    #: a wholly missing fragment among fragments in files (read as missing values)
    missing_fragments: bool
    #: fragments given by one value each (CF ``unique_values``), not by a file
    unique_values: bool
    #: several URIs (alternative locations) per fragment
    alternatives: bool
    #: fragments that are Zarr stores (readers of the other dialects expect netCDF files)
    zarr_fragments: bool
    #: S3netCDF4's dialects: a variable in a group sits at that group path in its fragments, and local
    #: fragments are named by plain paths (S3netCDF4 takes ``file://`` for the name of an S3 host)
    s3netcdf4: bool


#: Format name (``format=``) -> what it can describe, in the order of :data:`~daskcfa.choices.WRITE_FORMATS`.
CAPABILITIES = {
    "CF-1.13": Capabilities("CF-1.13", missing_fragments=False, unique_values=True, alternatives=False,
                            zarr_fragments=True, s3netcdf4=False),
    "CFA-0.6.2": Capabilities("CFA-0.6", missing_fragments=True, unique_values=False, alternatives=True,
                              zarr_fragments=False, s3netcdf4=False),
    "CFA-0.5": Capabilities("CFA-0.5", missing_fragments=True, unique_values=False, alternatives=False,
                            zarr_fragments=False, s3netcdf4=True),
    "CFA-0.4": Capabilities("CFA-0.4", missing_fragments=True, unique_values=False, alternatives=False,
                            zarr_fragments=False, s3netcdf4=True),
}


def can(format: str, capability: str) -> bool:
    """Whether aggregations in ``format`` carry ``capability`` (a :class:`Capabilities` field; False for
    a format daskcfa does not write, which the encoder refuses by name)."""
    found = CAPABILITIES.get(format)
    return found is not None and bool(getattr(found, capability))


def dialects_that(capability: str) -> tuple[str, ...]:
    """The formats that carry ``capability``, in the table's order."""
    return tuple(name for name in CAPABILITIES if can(name, capability))


def listed(names: tuple[str, ...]) -> str:
    """``("a", "b", "c")`` as ``"a, b and c"``, for messages."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
