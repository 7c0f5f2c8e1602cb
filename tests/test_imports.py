"""The library's modules import one another without circles (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for f in (SRC / "esrepro").rglob("*.py"):
        parts = f.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _type_checking(node: ast.AST) -> bool:
    """Whether ``node`` is an ``if TYPE_CHECKING:`` block (its imports never run)."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
                                         or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST):
    """Every node of ``tree``, module level and inside functions, but not inside ``if TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(tree):
        if _type_checking(child):
            for other in child.orelse:
                yield other
                yield from _nodes(other)
            continue
        yield child
        yield from _nodes(child)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The esrepro modules ``name`` imports anywhere in its body, module level and inside functions (``if
    TYPE_CHECKING:`` blocks left out). A package's ``__init__`` importing its own submodules counts: importing any
    submodule runs the package's ``__init__`` first, so a submodule that reaches back to its package through other
    modules closes a circle."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # ``from x import y``: the submodule x.y where there is one, else the module x
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_the_library_has_no_import_circles():
    graph = import_graph()
    assert "esrepro.tasks.math" in graph and "esrepro.steps" in graph  # the walk found the library
    assert "esrepro.tasks.math_answer" in graph["esrepro.tasks.math_data"]  # the walk follows from-imports
    assert "esrepro.pipeline.names" in graph["esrepro.pipeline"]  # a package's own submodules count
    found = circles(graph)
    assert not found, "\n".join(f"circle of {len(c)} modules: {', '.join(c)}" for c in found)


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking_blocks(tmp_path):
    pkg = tmp_path / "src" / "esrepro"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from esrepro import c\n"
                              "def f():\n    from esrepro.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("from esrepro.sub.b import g\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from esrepro import a\n")
    (pkg / "c.py").write_text("import esrepro.a\n")
    modules = {".".join(f.relative_to(tmp_path / "src").with_suffix("").parts).removesuffix(".__init__"): f
               for f in pkg.rglob("*.py")}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["esrepro.a"] == {"esrepro.sub.b"} and graph["esrepro.sub"] == {"esrepro.sub.b"}
    assert circles(graph) == [["esrepro.a", "esrepro.sub.b"]]


#: The library's layers by stage, lowest first: a module may import its own layer and the layers below it.
#: ``provenance.manifest`` (every step's manifest and the hashes it records) is shared by all stages; the rest of
#: ``provenance`` (audit, RO-Crate, DVC, golden outputs) comes after the report, its package ``__init__`` (the
#: repository path manifests record) with the manifests (PACKAGE_LAYERS). Above them the planning rooms, one
#: direction (docs/architecture.md): read -> rehearsal's registry -> resolve -> plan -> place -> validate ->
#: rehearse -> load -> price and check -> specs -> steps and CLI.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("esrepro", "esrepro.io", "esrepro.numerics", "esrepro.paths", "esrepro.devices",
                    "esrepro.lifeline", "esrepro.settings", "esrepro.provenance.manifest", "esrepro.memory")),
    ("data", ("esrepro.data", "esrepro.tasks")),
    ("models", ("esrepro.models", "esrepro.perturb", "esrepro.backends", "esrepro.population")),
    ("train", ("esrepro.train", "esrepro.es", "esrepro.essa", "esrepro.rl")),
    ("evaluate", ("esrepro.evaluate",)),
    ("kl", ("esrepro.kl",)),
    ("report", ("esrepro.report",)),
    ("provenance", ("esrepro.provenance",)),
    ("read", ("esrepro.config",)),
    ("rehearsal registry", ("esrepro.rehearsal.registry",)),
    ("resolve", ("esrepro.pipeline",)),
    ("plan", ("esrepro.plan", "esrepro.jobs", "esrepro.claim_plan")),
    ("place", ("esrepro.cluster",)),
    ("validate", ("esrepro.checks",)),
    ("rehearse", ("esrepro.rehearsal.transform",)),
    ("load", ("esrepro.pipeline.load",)),
    ("price and check", ("esrepro.scaling", "esrepro.job_time", "esrepro.cost", "esrepro.resume_cost",
                         "esrepro.plan_check", "esrepro.rl_memory", "esrepro.claim_cost")),
    ("specs", ("esrepro.specs", "esrepro.pipeline.notes")),
    ("steps", ("esrepro.preflight", "esrepro.rehearsal", "esrepro.steps", "esrepro.cli", "esrepro.forkserver")),
]

#: ``rehearsal.families`` (the hub models' config facts, data without imports) serves the memory model too.
PACKAGE_LAYERS = {"esrepro.provenance": "foundation", "esrepro.rehearsal.families": "foundation"}


def _layer(module: str) -> int:
    """The index in LAYERS of ``module``'s layer (PACKAGE_LAYERS, else its longest matching prefix)."""
    if module in PACKAGE_LAYERS:
        return [name for name, _ in LAYERS].index(PACKAGE_LAYERS[module])
    found = [(len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    assert found, f"{module} is in no layer of LAYERS"
    return max(found)[1]


def test_no_module_imports_from_a_higher_layer():
    modules = _modules()
    upward = [f"{name} ({LAYERS[_layer(name)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
              for name, path in modules.items() for target in sorted(_imports(name, path, modules))
              if _layer(target) > _layer(name)]
    assert not upward, "\n".join(upward)


def test_a_circle_put_back_fails(monkeypatch):
    """The settings' resolution asking the pricing room again (as it once did for resume_every: auto) closes a
    circle through the planning rooms, and the graph sees it though the import sits inside a function."""
    graph = import_graph()
    graph["esrepro.pipeline.method_settings"] = graph["esrepro.pipeline.method_settings"] | {"esrepro.resume_cost"}
    found = circles(graph)
    assert found and {"esrepro.pipeline", "esrepro.pipeline.method_settings", "esrepro.resume_cost",
                      "esrepro.scaling", "esrepro.cluster"} <= set(found[0])
