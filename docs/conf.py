"""Sphinx configuration of daskcfa's documentation (built in CI with warnings as errors:
``python -m sphinx -W -b html docs docs/_build/html``; examples run with ``-b doctest``)."""

from __future__ import annotations

import daskcfa

# Each page's examples run in a new empty directory, as a reader pastes them (tests/test_docs.py runs the
# guide's pages so too, each in a fresh interpreter); nothing else is set up for them.
doctest_global_setup = ("import os as _os, tempfile as _tempfile\n"
                        "_cwd = _os.getcwd()\n_os.chdir(_tempfile.mkdtemp(prefix='daskcfa-docs-'))")
doctest_global_cleanup = ("import shutil as _shutil\n_new = _os.getcwd()\n_os.chdir(_cwd)\n"
                          "_shutil.rmtree(_new, ignore_errors=True)")

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
