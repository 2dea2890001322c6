"""The documentation builds without a warning, and every snippet on its pages runs as users run it.

The quick start, reading, writing and migration pages are run as a user
pastes them: each page's snippets in order, in one fresh interpreter, in a
new empty directory, with nothing hidden (no ``testsetup``: the sample
archive comes from ``daskcfa.sample``, on the page).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import daskcfa

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: the pages whose snippets paste into a fresh interpreter, as they are
PASTED = ("guide/quickstart.md", "guide/reading.md", "guide/writing.md", "guide/migration.md")
#: fenced blocks of Python: ``{doctest}``/``pycon`` sessions, ``{testcode}``/``python`` code
FENCE = re.compile(r"^```(\{doctest\}|\{testcode\}|python|pycon)[^\n]*\n(.*?)^```$", re.M | re.S)
HIDDEN = re.compile(r"^```\{(testsetup|testcleanup)\}|^:hide:", re.M)

#: run in the fresh interpreter: the blocks (page, line, kind, text) from stdin, in order, in one namespace
RUNNER = """
import doctest, json, sys
blocks = json.load(sys.stdin)
globs = {"__name__": "__main__"}
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
for page, line, kind, text in blocks:
    if kind in ("python", "{testcode}"):
        exec(compile("\\n" * line + text, page, "exec"), globs)
    else:
        test = doctest.DocTestParser().get_doctest(text, globs, f"{page}:{line}", page, line)
        runner.run(test, clear_globs=False)
        globs = test.globs  # (a DocTest runs in a copy of the namespace given)
sys.exit(1 if runner.summarize(verbose=False).failed else 0)
"""

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")


def snippets(page: str) -> list[tuple[str, int, str, str]]:
    """The Python blocks of a page in order: (page, line, kind, text)."""
    text = (DOCS / page).read_text()
    return [(page, text.count("\n", 0, m.start(2)), m.group(1), m.group(2)) for m in FENCE.finditer(text)]


@pytest.mark.parametrize("page", PASTED)
def test_page_pastes_into_a_fresh_interpreter(page, tmp_path):
    assert not HIDDEN.search((DOCS / page).read_text()), f"{page} hides setup from its reader"
    blocks = snippets(page)
    assert blocks, page
    empty = tmp_path / "new"
    empty.mkdir()
    env = dict(os.environ)  # (the daskcfa under test, as if installed)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(daskcfa.__file__).parents[1])] + env.get("PYTHONPATH", "").split(
        os.pathsep))
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(blocks), cwd=empty, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


def test_the_runner_fails_on_a_wrong_snippet(tmp_path):
    """(the runner above can fail: a snippet whose output differs, and one that raises)"""
    for blocks in ([("p.md", 3, "{doctest}", ">>> 1 + 1\n3\n")], [("p.md", 3, "python", "raise SystemExit(2)\n")]):
        done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(blocks), cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0


@pytest.mark.parametrize("builder", ["html", "doctest"])
def test_docs_build_with_warnings_as_errors(builder, tmp_path):
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder,
                           str(DOCS), str(tmp_path / builder)], capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    if builder == "doctest":
        report = (tmp_path / builder / "output.txt").read_text()
        assert " 0 failures in tests" in report and "tests" in report, report[-2000:]
    else:
        assert (tmp_path / builder / "api.html").read_text().count("daskcfa.from_cfa") >= 1
        assert "refragment" in (tmp_path / builder / "cli.html").read_text()
