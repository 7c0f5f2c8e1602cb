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


#: The library's layers by stage, lowest first: a module may import its own layer and the layers below it.
#: ``provenance.manifest`` (every step's manifest and the hashes it records) is shared by all stages; the rest of
#: ``provenance`` (audit, RO-Crate, DVC, golden outputs) comes after the report, its package ``__init__`` (the
#: repository path manifests record) with the manifests (PACKAGE_LAYERS).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("esrepro", "esrepro.io", "esrepro.numerics", "esrepro.paths", "esrepro.devices",
                    "esrepro.lifeline", "esrepro.settings", "esrepro.provenance.manifest")),
    ("data", ("esrepro.data", "esrepro.tasks")),
    ("models", ("esrepro.models", "esrepro.perturb", "esrepro.backends", "esrepro.population")),
    ("train", ("esrepro.train", "esrepro.es", "esrepro.essa", "esrepro.rl")),
    ("evaluate", ("esrepro.evaluate",)),
    ("kl", ("esrepro.kl",)),
    ("report", ("esrepro.report",)),
    ("provenance", ("esrepro.provenance",)),
    ("wiring", ("esrepro.pipeline", "esrepro.config", "esrepro.checks", "esrepro.plan", "esrepro.specs",
                "esrepro.cluster", "esrepro.scaling", "esrepro.job_time", "esrepro.jobs", "esrepro.cost",
                "esrepro.preflight", "esrepro.rehearsal", "esrepro.steps", "esrepro.cli", "esrepro.forkserver",
                "esrepro.plan_check", "esrepro.resume_cost")),
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
