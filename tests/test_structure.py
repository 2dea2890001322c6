"""The package's structure: imports without cycles, private names kept private,
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
