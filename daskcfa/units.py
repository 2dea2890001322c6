"""cf-units, imported so that a process's locale cannot stop it.

cf-units switches ``LC_NUMERIC`` to ``"C"`` while it loads UDUNITS-2, then
restores the name :func:`locale.getlocale` gave. Python 3.11 reports a
``C.UTF-8`` locale set from the environment (as Sphinx, IPython and many
GUI programs set it) as ``en_US.UTF-8``, which cannot be set back where that
locale is not installed: the import fails with ``locale.Error`` after the
switch to ``"C"``, so a second import succeeds.
"""

from __future__ import annotations

import functools
import locale
from typing import Any

try:
    import cf_units
except locale.Error:
    import cf_units

Unit = cf_units.Unit

__all__ = ["Unit", "same_units", "checked_unit"]


def same_units(a: Any, b: Any) -> bool:
    """Whether two ``units`` strings mean the same to UDUNITS: xarray writes times in ``days since
    2000-01-01 00:00:00`` and, given those units, encodes the next piece in ``days since 2000-01-01``."""
    try:
        return bool(Unit(str(a)) == Unit(str(b)))
    except ValueError:  # (units UDUNITS cannot parse: only the same text is the same)
        return False


@functools.lru_cache(maxsize=256)
def checked_unit(units: str, calendar: Any) -> Unit:
    """``Unit(units, calendar=calendar)``, refused (ValueError) when it is a time reference whose
    date no calendar holds: UDUNITS takes ``days since 2000-13-45`` and converts from a date that
    cftime (and so netCDF4-python and xarray) refuses. Remembered: every fragment is checked."""
    unit = Unit(units, calendar=calendar)
    if unit.is_time_reference():
        unit.num2date(0)
    return unit
