"""cf-units, imported so that a process's locale cannot stop it.

cf-units switches ``LC_NUMERIC`` to ``"C"`` while it loads UDUNITS-2, then
restores the name :func:`locale.getlocale` gave. Python 3.11 reports a
``C.UTF-8`` locale set from the environment (as Sphinx, IPython and many
GUI programs set it) as ``en_US.UTF-8``, which cannot be set back where that
locale is not installed: the import fails with ``locale.Error`` after the
switch to ``"C"``, so a second import succeeds.
"""

from __future__ import annotations

import locale
from typing import Any

try:
    import cf_units
except locale.Error:
    import cf_units

Unit = cf_units.Unit

__all__ = ["Unit", "same_units"]


def same_units(a: Any, b: Any) -> bool:
    """Whether two ``units`` strings mean the same to UDUNITS: xarray writes times in ``days since
    2000-01-01 00:00:00`` and, given those units, encodes the next piece in ``days since 2000-01-01``."""
    try:
        return bool(Unit(str(a)) == Unit(str(b)))
    except ValueError:  # (units UDUNITS cannot parse: only the same text is the same)
        return False
