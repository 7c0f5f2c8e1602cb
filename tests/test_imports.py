"""The library's modules import one another without circles (function-level imports included)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for f in (SRC / "esrepro").rglob("*.py"):
        parts = f.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The esrepro modules ``name`` imports anywhere in its body (a package's own submodules left out:
    ``__init__`` re-exports are not circles)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not (path.name == "__init__.py" and target.startswith(name + ".")):
                found.add(target)
    return found


def test_the_library_has_no_import_circles():
    modules = _modules()
    assert "esrepro.tasks.math" in modules and "esrepro.steps" in modules  # the walk found the library
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "esrepro.tasks.math_answer" in graph["esrepro.tasks.math_data"]  # the walk follows from-imports
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from None
