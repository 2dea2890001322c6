"""The package's structure: imports down the layers and without cycles, private names kept private,
package ``__init__`` files that only re-export.

Read from the source with :mod:`ast` (nothing is imported), so that a cycle
hidden behind a function-level import is found as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import daskcfa

PACKAGE = Path(daskcfa.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, str | None]]:
    """``(module, imported name)`` for every import of a daskcfa module in ``name``,
    at any depth (module level or inside functions); the name is None for ``import x``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "daskcfa"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == "daskcfa":
                out += [(module, alias.name) for alias in node.names]
    return out


def _targets(module: str, imported: str | None) -> tuple[str, str | None]:
    """The module an import depends on, and the attribute taken from it (None: a submodule)."""
    if imported is not None and f"{module}.{imported}" in MODULES:
        return f"{module}.{imported}", None
    return module, imported


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        deps = {_targets(m, i)[0] for m, i in _imports(name)}
        graph[name] = {d for d in deps if d in MODULES and d != name and not name.startswith(d + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


#: The layers, bottom to top, each a set of top-level names of the package (a module, or a subpackage with
#: everything in it; "" is the package itself). A module imports only from its own layer or the ones below.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({"errors", "choices", "logs", "lazy", "locks", "units", "arguments", "config", "limits",
                        "model", "decode"})),
    ("storage", frozenset({"storage"})),
    ("formats", frozenset({"formats"})),
    ("fragments", frozenset({"fragments"})),
    ("write", frozenset({"write"})),
    ("graph", frozenset({"graph"})),
    ("api", frozenset({"api", "dataset", "netcdf4", "netcdf4_read", "inputs", "append", "index_writer",
                       "plugins"})),
    ("archive", frozenset({"archive"})),
    ("front ends", frozenset({"cli", "__main__", "progress", "xarray_backend", "xarray_accessor", "sample_data",
                              "exports", ""})),
)


def _fake_module(tmp_path, monkeypatch, name: str, text: str) -> None:
    """A module ``name`` of the package holding ``text``, for the walks' own tests."""
    module = tmp_path / "m.py"
    module.write_text(text)
    monkeypatch.setitem(MODULES, name, module)


def _layer(module: str) -> int | None:
    """The position in :data:`LAYERS` of a dotted module name (None: in no layer)."""
    top = module.split(".")[1] if "." in module else ""
    return next((i for i, (_, names) in enumerate(LAYERS) if top in names), None)


def _upward(names=None) -> list[str]:
    """Every import of a daskcfa module from a higher layer, as ``importer (layer) -> imported (layer)``."""
    offences = []
    for name in sorted(MODULES if names is None else names):
        for module, imported in _imports(name):
            target = _targets(module, imported)[0]
            if target in MODULES and _layer(target) > _layer(name):
                offences.append(f"{name} ({LAYERS[_layer(name)][0]}) -> {target} ({LAYERS[_layer(target)][0]})")
    return sorted(set(offences))


def test_every_module_has_a_layer() -> None:
    assert [name for name in MODULES if _layer(name) is None] == []


def test_every_import_is_of_a_module_that_exists() -> None:
    """(An import of a moved module would be in no layer, and escape the layer test.)"""
    assert [f"{name} -> {module}" for name in MODULES for module, imported in _imports(name)
            if _targets(module, imported)[0] not in MODULES] == []


def test_imports_go_down_the_layers() -> None:
    """docs/architecture.md, "Layers and rules": every import (module level or inside a function) is of a
    module in the importer's own layer or one below it."""
    assert _upward() == []


def test_the_layer_walk_finds_upward_imports(tmp_path, monkeypatch) -> None:
    _fake_module(tmp_path, monkeypatch, "daskcfa.storage.fake",
                 "from ..errors import CFAError\n\ndef f():\n    from ..graph.read import to_dask\n")
    assert _upward(["daskcfa.storage.fake"]) == ["daskcfa.storage.fake (storage) -> daskcfa.graph.read (graph)"]


#: Defaults with one home, ``daskcfa/choices.py``: no other module writes one of them again as a literal
#: (``"50MB"`` was written in six places; docstrings may quote them).
SHARED_DEFAULTS = ("MAX_FRAGMENT_SIZE", "MAX_MEM")


def _copied_defaults(names=None) -> list[str]:
    """``module:line value`` for each string literal equal to one of :data:`SHARED_DEFAULTS` outside their
    home, docstrings and other bare strings aside."""
    from daskcfa import choices

    values = {getattr(choices, name) for name in SHARED_DEFAULTS}
    found = []
    for name in MODULES if names is None else names:
        if name == "daskcfa.choices":
            continue
        tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
        bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        found += [f"{name}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values
                  and id(node) not in bare]
    return sorted(found)


def test_shared_defaults_have_one_home() -> None:
    assert _copied_defaults() == []


def test_the_defaults_walk_finds_copies(tmp_path, monkeypatch) -> None:
    _fake_module(tmp_path, monkeypatch, "daskcfa.fake", "def f(x, size='50MB', *, mem='1GiB'):\n    '''50MB'''\n\n"
                 "class C:\n    size: str = '50MB'\np.add_argument('--max-mem', default='1GiB')\n"
                 "s = x if x is not None else '50MB'\n")
    assert _copied_defaults(["daskcfa.fake"]) == ["daskcfa.fake:1 '1GiB'", "daskcfa.fake:1 '50MB'",
                                                  "daskcfa.fake:5 '50MB'", "daskcfa.fake:6 '1GiB'",
                                                  "daskcfa.fake:7 '50MB'"]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_import_cycles() -> None:
    # (a package importing its own submodules is not a cycle: they are loaded after it)
    assert _cycles(_graph()) == []


def test_the_walk_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_names_imported_from_other_modules() -> None:
    offences = []
    for name in MODULES:
        for module, imported in _imports(name):
            target, attribute = _targets(module, imported)
            if target == name:
                continue
            if any(_private(part) for part in target.split(".")) or (attribute is not None and _private(attribute)):
                offences.append(f"{name}: {target}{'.' + attribute if attribute else ''}")
    assert offences == []


def test_package_inits_only_re_export() -> None:
    """A package ``__init__`` holds a docstring, imports, ``__all__``, plain aliases and what lazy
    re-exports need (a table of names to modules, module ``__getattr__``/``__dir__``, imports for type
    checkers), nothing else."""
    offences = []
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__"):
                continue  # re-exports imported on first use
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                    and all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body) and not node.orelse):
                continue  # the lazy names, imported for type checkers
            if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
                    and all(isinstance(v, ast.Constant) for v in [*node.value.keys, *node.value.values])):
                continue  # the table of lazy names and their modules
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.List, ast.Tuple,
                                                                                         ast.Name, ast.Attribute,
                                                                                         ast.Constant)):
                continue  # __all__, __version__, aliases
            offences.append(f"{name}:{node.lineno}")
    assert offences == []


def test_no_module_over_800_lines() -> None:
    """A module that long does several jobs (issue #30: netcdf4.py, 1,326 lines, did five)."""
    assert {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 800} == {}


# ---------------------------------------------------------------------------
# Every error daskcfa raises is a CFAError (issue 28 item 5)
# ---------------------------------------------------------------------------
import builtins  # noqa: E402

#: Builtin exceptions, which daskcfa raises only where Python's protocols or a translating caller expect them.
BUILTIN_ERRORS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}

#: Where the builtin is what callers expect: Python's protocols (``hasattr``, ``len``; the package's lazy
#: ``__getattr__`` is ``exports.load``), netCDF4-python's ``getncattr``, a lock released by another thread (as
#: ``threading``), abstract methods, an optional dependency absent, the ``python -m`` exit, an unreachable line.
PROTOCOL_RAISES = {("__getattr__", "AttributeError"), ("__setattr__", "AttributeError"), ("load", "AttributeError"),
                   ("getncattr", "AttributeError"), ("__len__", "TypeError"), ("release", "RuntimeError"),
                   ("__iter__", "NotImplementedError"), ("fragment_values", "NotImplementedError"),
                   ("plot_layout", "ImportError"), ("<module>", "SystemExit"), ("with_retries", "AssertionError")}

#: Modules below the fragment layer whose errors never reach users as they are: ``fragments/canonical.py``
#: (``_LIBRARY_ERRORS``), ``archive/scan.py`` and ``formats/netcdf.py`` turn them into located CFAErrors,
#: ``storage/s3nc.py`` into a warning about its configuration, ``decode.py``'s callers into CFAFormatError.
TRANSLATED_BY_CALLERS = {
    "daskcfa.fragments.codecs", "daskcfa.fragments.hdf5_filters", "daskcfa.fragments.hdf5",
    "daskcfa.fragments.hdf5_netcdf", "daskcfa.fragments.netcdf", "daskcfa.fragments.netcdf3",
    "daskcfa.fragments.zarr", "daskcfa.fragments.chunk_index", "daskcfa.storage.local", "daskcfa.storage.s3nc",
    "daskcfa.decode", "daskcfa.archive.scan",
}


def _builtin_raises(name: str) -> list[tuple[str, int, str, str]]:
    """``(module, line, function, exception)`` for every ``raise Builtin(...)`` / ``raise Builtin`` in ``name``."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in BUILTIN_ERRORS:
                    found.append((name, child.lineno, function, exc.id))
            visit(child, function)

    visit(tree, "<module>")
    return found


def _bare_builtin_raises(names=None) -> list[tuple[str, int, str, str]]:
    return [r for name in (MODULES if names is None else names) if name not in TRANSLATED_BY_CALLERS
            for r in _builtin_raises(name) if (r[2], r[3]) not in PROTOCOL_RAISES]


def test_every_error_raised_is_a_cfa_error() -> None:
    """No ``raise ValueError(...)``, ``raise FileExistsError(...)``... outside the readers whose callers
    translate them: the user gets a CFAError subclass that is also that builtin (errors.py)."""
    assert _bare_builtin_raises() == []


def test_the_raise_walk_finds_bare_builtins(tmp_path, monkeypatch) -> None:
    _fake_module(tmp_path, monkeypatch, "daskcfa.fake", "def f(x):\n    if x:\n        raise ValueError('bad')\n"
                 "    raise FileExistsError\ndef __getattr__(n):\n    raise AttributeError(n)\n")
    assert _bare_builtin_raises(["daskcfa.fake"]) == [("daskcfa.fake", 3, "f", "ValueError"), ("daskcfa.fake", 4, "f",
                                                                                 "FileExistsError")]
