"""The package's layers: no import cycle anywhere in overinterp_fast/ (audit/ included), the lower layers (ops,
runtime, methods) never import the higher ones (attr, api, audit, text, cli), and the base (errors, util) imports
nothing else of the package.

Read from the sources with ``ast``: every import statement counts, at module level, inside a function or under
``if TYPE_CHECKING:`` (a cycle of annotations is a cycle of the design, even if Python never runs it).
"""
import ast
import os

import pytest

PACKAGE = "overinterp_fast"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTENSIONS = {f"{PACKAGE}._C"}  # the compiled ops (setup.py builds them; not a Python source)
BASE = ("errors", "util")
LOWER = ("ops", "runtime", "methods")
HIGHER = ("attr", "api", "audit", "text", "cli")


def modules(root: str = ROOT) -> dict[str, tuple[str, bool]]:
    """Dotted module name -> (source path, whether it is a package's __init__)."""
    out = {}
    for folder, _, files in os.walk(os.path.join(root, PACKAGE)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = (path, f == "__init__.py")
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The package modules an import statement of ``module`` loads (a name imported from a package is its
    submodule when there is one, else the package)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = module if is_package else module.rsplit(".", 1)[0]
        if node.level:
            base = ".".join(base.split(".")[:len(base.split(".")) - node.level + 1])
            target = base + ("." + node.module if node.module else "")
        else:
            target = node.module or ""
        names = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
    out = []
    for name in names:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known and name != module:
            out.append(name)
    return out


def import_graph(root: str = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in its source, TYPE_CHECKING blocks included)."""
    mods = modules(root)
    known = set(mods) | EXTENSIONS
    graph: dict[str, set[str]] = {name: set() for name in EXTENSIONS}
    for name, (path, is_package) in mods.items():
        deps: set[str] = set()
        todo = [ast.parse(open(path, encoding="utf-8").read())]
        while todo:
            for child in ast.iter_child_nodes(todo.pop()):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    deps.update(_targets(child, name, is_package, known))
                todo.append(child)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

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
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_graph_sees_relative_absolute_and_function_level_imports():
    graph = import_graph()
    assert f"{PACKAGE}.audit.metrics" in graph[f"{PACKAGE}.audit.table"]  # from .metrics import ...
    assert f"{PACKAGE}.audit.store" in graph[f"{PACKAGE}.audit.persist"]  # from . import store
    assert f"{PACKAGE}.audit.report" in graph[f"{PACKAGE}.audit.stream"]  # inside a function
    assert f"{PACKAGE}._C" in graph[f"{PACKAGE}.ops.kernels"]  # the compiled ops, not the package
    assert f"{PACKAGE}.util.files" in graph[f"{PACKAGE}.runtime.calibration"]  # from ..util.files import ...


def test_an_annotation_only_cycle_counts(tmp_path):
    """metrics -> records -> table -> metrics, the last step under TYPE_CHECKING: still a cycle."""
    audit = tmp_path / PACKAGE / "audit"
    audit.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (audit / "__init__.py").write_text("")
    (audit / "metrics.py").write_text("from .records import AuditRecord\n")
    (audit / "records.py").write_text("def save():\n    from .table import write_table\n")
    (audit / "table.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from .metrics import border\n")
    assert cycles(import_graph(str(tmp_path))) == [[f"{PACKAGE}.audit.metrics", f"{PACKAGE}.audit.records",
                                                     f"{PACKAGE}.audit.table"]]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]] and cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("lower", LOWER)
def test_lower_layers_never_import_higher_ones(lower):
    graph = import_graph()
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() if layer(m) == lower
                   for d in deps if layer(d) in HIGHER or layer(d) == "")
    assert wrong == []


def test_the_base_imports_nothing_else_of_the_package():
    graph = import_graph()
    assert {layer(m) for m in graph} >= set(BASE)
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() if layer(m) in BASE
                   for d in deps if layer(d) not in BASE)
    assert wrong == []
