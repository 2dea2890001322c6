"""Aggregations spelled as formats.md allows but the usual tools do not write (attack16b).

Every dataset is written by tests/builders.py from numpy ground truth, then one
detail is respelled the way another tool (or a hand) may write it.
"""

from __future__ import annotations

import pytest

import daskcfa
from builders import assert_matches, build, make_truth
from remote_helpers import rewrite_uris

pytestmark = pytest.mark.usefixtures("other_cwd")

DIMS = ("time", "lat", "lon")
SIZES = ((2, 3, 1), (4,), (2, 3))


@pytest.mark.parametrize("dialect", ["CF-1.13", "CFA-0.6"])
@pytest.mark.parametrize("spelling", ["file:{path}", "FILE://{path}", "File://localhost{path}"],
                         ids=["rfc8089-one-slash", "upper-case-scheme", "mixed-case-localhost"])
def test_file_uris_in_every_rfc_8089_spelling(tmp_path, dialect, spelling):
    """``file:/abs/path`` (RFC 8089's minimal form, what Java's ``File.toURI`` writes, so netCDF-Java
    based tools) and scheme names in any case are absolute URIs: never paths relative to the
    aggregation file (before: ``<directory>/file:/abs/path``, or the working directory for ``FILE://``)."""
    built = build(dialect, tmp_path, make_truth((6, 4, 5), "f4", seed=2, masked=0.1), DIMS, SIZES)
    rewrite_uris(built.path, built.names.get("uris") or built.names["file"],
                 lambda u: spelling.format(path=(built.path.parent / u).resolve().as_posix()))
    assert_matches(daskcfa.from_cfa(str(built.path), built.variable).compute(), built.expected)
