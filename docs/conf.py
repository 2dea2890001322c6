"""Sphinx configuration of daskcfa's documentation (built in CI with warnings as errors:
``python -m sphinx -W -b html docs docs/_build/html``; examples run with ``-b doctest``)."""

from __future__ import annotations

import os

import daskcfa

#: the examples' sample archive module, which the pages' examples import
EXAMPLES = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples"))
doctest_global_setup = f"import sys; sys.path.insert(0, {EXAMPLES!r})"

project = "daskcfa"
author = "the daskcfa developers"
copyright = "the daskcfa developers"
release = daskcfa.__version__
version = release

extensions = [
    "myst_parser",  # the pages are Markdown (as the README and the design notes are)
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",  # the examples in the pages are run: a page cannot drift from the code
    "sphinx.ext.intersphinx",
    "sphinxarg.ext",  # the CLI reference from the CLI's own argparse parser
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False}
# Cross-references to other projects' objects are not resolved (intersphinx has no network here);
# names the signatures mention that these docs do not define are not errors.
intersphinx_mapping: dict = {}
nitpicky = False
suppress_warnings = ["myst.xref_missing"]
html_theme = "alabaster"
html_title = f"daskcfa {release}"
