"""``daskcfa.lazy``: a module named now, imported on its first attribute look-up (in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import pickle, sys
from daskcfa.lazy import LazyModule
m = LazyModule("colorsys")
before = "colorsys" in sys.modules
hasattr(m, "__setstate__"), pickle.loads(pickle.dumps(m)), repr(m)  # (pickling and repr do not import it)
probed = "colorsys" in sys.modules
value = m.rgb_to_hsv(1.0, 0.0, 0.0)
print(before, probed, "colorsys" in sys.modules, value == sys.modules["colorsys"].rgb_to_hsv(1.0, 0.0, 0.0))
try:
    m.no_such_name
except AttributeError:
    print("AttributeError")
"""


def test_imported_on_first_attribute_only():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False", "True", "True", "AttributeError"]
