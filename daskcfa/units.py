"""cf-units, imported so that a process's locale cannot stop it.

cf-units switches ``LC_NUMERIC`` to ``"C"`` while it loads UDUNITS-2, then
restores the name :func:`locale.getlocale` gave. Python 3.11 reports a
``C.UTF-8`` locale set from the environment (as Sphinx, IPython and many
GUI programs set it) as ``en_US.UTF-8``, which cannot be set back where that
locale is not installed: the import fails with ``locale.Error`` after the
switch to ``"C"``, so a second import succeeds.

Imported on first use (:func:`unit`): most reads compare units as text only
(the same text: no conversion), and cf-units and UDUNITS-2 cost a fresh
process's first result about 14 ms (issue #31).
"""

from __future__ import annotations

import functools
import locale
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cf_units import Unit

__all__ = ["unit", "same_units", "checked_unit"]


@functools.cache
def _cf_units() -> Any:
    try:
        import cf_units
    except locale.Error:
        import cf_units
    return cf_units


def unit(units: Any, calendar: Any = None) -> Unit:
    """``cf_units.Unit(units, calendar=calendar)``, cf-units imported now."""
    return _cf_units().Unit(units, calendar=calendar)


def same_units(a: Any, b: Any) -> bool:
    """Whether two ``units`` strings mean the same to UDUNITS: xarray writes times in ``days since
    2000-01-01 00:00:00`` and, given those units, encodes the next piece in ``days since 2000-01-01``."""
    try:
        return bool(unit(str(a)) == unit(str(b)))
    except ValueError:  # (units UDUNITS cannot parse: only the same text is the same)
        return False


@functools.lru_cache(maxsize=256)
def checked_unit(units: str, calendar: Any) -> Unit:
    """``Unit(units, calendar=calendar)``, refused (ValueError) when it is a time reference whose
    date no calendar holds: UDUNITS takes ``days since 2000-13-45`` and converts from a date that
    cftime (and so netCDF4-python and xarray) refuses. Remembered: every fragment is checked."""
    checked = unit(units, calendar)
    if checked.is_time_reference():
        checked.num2date(0)
    return checked
