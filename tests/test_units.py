"""``daskcfa.units``: cf-units imported whatever locale the process set."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import locale
locale.setlocale(locale.LC_ALL, "")  # (as Sphinx, IPython and GUI programs do)
import daskcfa.units
print(daskcfa.units.unit("K").convert(0.0, daskcfa.units.unit("degC")))
"""


def test_cf_units_imports_after_the_locale_is_set_from_the_environment():
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # (Python 3.11 reads this back as en_US.UTF-8)
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout) == -273.15
