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
#: ``esrepro.runtime`` (forkserver, lifeline, distributed, devices, numerics) is the plumbing every stage runs on;
#: ``provenance.manifest`` (every step's manifest and the hashes it records) is shared by all stages; the rest of
#: ``provenance`` (audit, RO-Crate, DVC, golden outputs) comes after the report, its package ``__init__`` (the
#: repository path manifests record) with the manifests (PACKAGE_LAYERS). Above the runs, the settings' resolution
#: (``esrepro.pipeline``), then ``esrepro.planning`` in one direction (docs/architecture.md): plan -> place ->
#: validate -> rehearse -> load -> price and check -> specs; then the rehearsal, the steps and the CLI.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("esrepro", "esrepro.io", "esrepro.paths", "esrepro.runtime", "esrepro.settings",
                    "esrepro.provenance.manifest")),
    ("data", ("esrepro.data", "esrepro.tasks")),
    ("models", ("esrepro.models", "esrepro.perturb", "esrepro.backends", "esrepro.population")),
    ("train", ("esrepro.train", "esrepro.es", "esrepro.essa", "esrepro.rl")),
    ("evaluate", ("esrepro.evaluate",)),
    ("kl", ("esrepro.kl",)),
    ("report", ("esrepro.report",)),
    ("provenance", ("esrepro.provenance",)),
    ("read", ("esrepro.config",)),
    ("resolve", ("esrepro.pipeline",)),
    ("plan", ("esrepro.planning", "esrepro.planning.plan", "esrepro.planning.jobs", "esrepro.planning.claim_plan")),
    ("place", ("esrepro.planning.cluster",)),
    ("validate", ("esrepro.planning.checks",)),
    ("rehearse", ("esrepro.planning.rehearsal_registry", "esrepro.planning.rehearsal_bounds")),
    ("load", ("esrepro.planning.load",)),
    ("price and check", ("esrepro.planning.scaling", "esrepro.planning.job_time", "esrepro.planning.cost",
                         "esrepro.planning.resume_cost", "esrepro.planning.rl_memory", "esrepro.planning.plan_check",
                         "esrepro.planning.claim_cost")),
    ("specs", ("esrepro.planning.specs", "esrepro.planning.notes", "esrepro.planning.preflight")),
    ("rehearsal", ("esrepro.rehearsal",)),
    ("steps", ("esrepro.steps", "esrepro.cli")),
]

#: ``models.add`` writes a registry entry and reads the registry back (esrepro.config).
PACKAGE_LAYERS = {"esrepro.provenance": "foundation", "esrepro.models.add": "read"}


def _layer(module: str) -> int:
    """The index in LAYERS of ``module``'s layer (PACKAGE_LAYERS, else its longest matching prefix)."""
    if module in PACKAGE_LAYERS:
        return [name for name, _ in LAYERS].index(PACKAGE_LAYERS[module])
    found = [(len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    assert found, f"{module} is in no layer of LAYERS"
    return max(found)[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """"module (layer) imports target (layer)" for every import of ``graph`` into a higher layer of LAYERS."""
    return [f"{name} ({LAYERS[_layer(name)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
            for name in sorted(graph) for target in sorted(graph[name]) if _layer(target) > _layer(name)]


def test_no_module_imports_from_a_higher_layer():
    found = upward_imports(import_graph())
    assert not found, "\n".join(found)


def test_an_upward_import_put_back_fails():
    """The imports this layering once had to take out, each put back alone, are each seen: the config's loading
    asking the validation room, the table notes asking the resume's price, a run asking the memory model of the
    plan check, and the plan asking the rehearsal."""
    for name, target in [("esrepro.pipeline.method_settings", "esrepro.planning.checks"),
                         ("esrepro.pipeline", "esrepro.planning.resume_cost"),
                         ("esrepro.essa.train", "esrepro.planning.rl_memory"),
                         ("esrepro.planning.plan", "esrepro.rehearsal.replicas")]:
        graph = import_graph()
        assert target not in graph[name]
        graph[name] = graph[name] | {target}
        assert upward_imports(graph) == [f"{name} ({LAYERS[_layer(name)][0]}) imports {target} "
                                         f"({LAYERS[_layer(target)][0]})"]


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


#: Packages that run a job or state its settings: none of them reaches the planning package, however indirectly.
RUNS = ("esrepro.settings", "esrepro.pipeline", "esrepro.train", "esrepro.es", "esrepro.essa", "esrepro.rl",
        "esrepro.population", "esrepro.perturb", "esrepro.backends", "esrepro.models", "esrepro.tasks",
        "esrepro.runtime")


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_runs_never_reach_planning_and_planning_never_reaches_the_rehearsal():
    graph = import_graph()
    assert "esrepro.planning.plan_check" in graph and "esrepro.runtime.forkserver" in graph
    runs = [f"{m} reaches {sorted(t for t in _reach(graph, m) if _in(t, ('esrepro.planning',)))}"
            for m in sorted(graph) if _in(m, RUNS) and any(_in(t, ("esrepro.planning",)) for t in _reach(graph, m))]
    assert not runs, "\n".join(runs)
    plans = [f"{m} reaches {sorted(t for t in _reach(graph, m) if _in(t, ('esrepro.rehearsal',)))}"
             for m in sorted(graph) if _in(m, ("esrepro.planning",))
             and any(_in(t, ("esrepro.rehearsal",)) for t in _reach(graph, m))]
    assert not plans, "\n".join(plans)
    graph["esrepro.rl.budget"] = graph["esrepro.rl.budget"] | {"esrepro.planning.jobs"}  # the case that must fail
    assert any(_in(t, ("esrepro.planning",)) for t in _reach(graph, "esrepro.rl.grpo"))


def test_a_circle_put_back_fails(monkeypatch):
    """The settings' resolution asking the pricing room again (as it once did for resume_every: auto) closes a
    circle through the planning rooms, and the graph sees it though the import sits inside a function."""
    graph = import_graph()
    graph["esrepro.pipeline.method_settings"] = graph["esrepro.pipeline.method_settings"] | {"esrepro.planning.resume_cost"}
    found = circles(graph)
    assert found and {"esrepro.pipeline", "esrepro.pipeline.method_settings", "esrepro.planning.resume_cost",
                      "esrepro.planning.scaling", "esrepro.planning.cluster"} <= set(found[0])


#: Libraries whose import costs a job or the CLI noticeably (each at least about 0.4 s on the project's CPU, or the
#: stack of a GPU framework): a function-level import of an esrepro module is there to defer one of them. numpy,
#: pydantic, PyYAML, jsonschema, huggingface_hub (lazy itself) and safetensors (its torch half is torch's) are not.
HEAVY = ("torch", "transformers", "vllm", "ray", "trl", "peft", "accelerate", "bitsandbytes", "deepspeed",
         "datasets", "pyarrow", "pandas", "scipy", "matplotlib", "sympy", "math_verify", "papermill", "nbformat",
         "nbconvert", "snakemake")


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The modules one import statement names: esrepro modules by their longest existing name, other libraries by
    their top-level package (a relative import resolved against ``name``'s package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for target in targets:
        if target.split(".")[0] != "esrepro":
            out.append(target.split(".")[0])
            continue
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.append(target)
    return list(dict.fromkeys(out))


def _scoped_imports(tree: ast.AST, in_function: bool = False):
    """(import statement, whether it runs inside a function) of every import of ``tree`` outside ``if
    TYPE_CHECKING:`` blocks (a class body runs at import, as the module does)."""
    for child in ast.iter_child_nodes(tree):
        children = child.orelse if _type_checking(child) else [child]
        for node in children:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, in_function
            yield from _scoped_imports(node, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                               ast.Lambda)))


def heavy_libraries(modules: dict[str, Path]) -> dict[str, set[str]]:
    """The :data:`HEAVY` libraries importing each module loads: its module-level imports', those of the esrepro
    modules it imports at module level, and its packages' ``__init__``s', transitively."""
    direct: dict[str, set[str]] = {}
    for name, path in modules.items():
        direct[name] = set()
        for node, in_function in _scoped_imports(ast.parse(path.read_text())):
            if not in_function:
                direct[name].update(_imported(name, path, node, modules))
        parent = name
        while "." in parent:
            parent = parent.rpartition(".")[0]
            direct[name].add(parent)
    heavy: dict[str, set[str]] = {}

    def visit(name: str, seen: set[str]) -> set[str]:
        if name in heavy:
            return heavy[name]
        seen.add(name)
        found = {lib for lib in direct[name] if lib in HEAVY}
        for dep in direct[name]:
            if dep in modules and dep not in seen:
                found |= visit(dep, seen)
        return found

    for name in modules:
        heavy[name] = visit(name, set())
    return heavy


def light_function_imports(modules: dict[str, Path]) -> dict[str, list[str]]:
    """"module:line -> imported module" of every function-level import of an esrepro module that defers no heavy
    library (:func:`heavy_libraries` of the imported module is empty) and carries no comment giving a reason (on
    its lines or on the comment line just above)."""
    heavy = heavy_libraries(modules)
    out: dict[str, list[str]] = {}
    for name, path in modules.items():
        lines = path.read_text().splitlines()
        for node, in_function in _scoped_imports(ast.parse("\n".join(lines))):
            if not in_function:
                continue
            light = [t for t in _imported(name, path, node, modules) if t in modules and not heavy[t]]
            said = any("#" in line for line in lines[node.lineno - 1:node.end_lineno]) or \
                lines[node.lineno - 2].strip().startswith("#")
            if light and not said:
                out.setdefault(name, []).extend(f"{name}:{node.lineno} -> {t}" for t in light)
    return out


#: Function-level imports of light esrepro modules (by importing module) that were there when the check came: each
#: is to move to module level, or to say its reason, with its module's next change. The list only shrinks: an entry
#: no longer found fails too, so that it is taken off.
KNOWN_LIGHT: dict[str, set[str]] = {
    'esrepro.backends.hf': {'esrepro.io'},
    'esrepro.backends.vllm_engine': {'esrepro.runtime.devices', 'esrepro.runtime.lifeline'},
    'esrepro.cli': {'esrepro.runtime.forkserver', 'esrepro.runtime.lifeline', 'esrepro.runtime.numerics', 'esrepro.settings.layers'},
    'esrepro.es.train': {'esrepro.io', 'esrepro.population.spec', 'esrepro.rl.budget', 'esrepro.train.periodic',
        'esrepro.train.resume'},
    'esrepro.essa.data': {'esrepro.tasks.countdown'},
    'esrepro.essa.lora': {'esrepro.runtime.distributed', 'esrepro.provenance.manifest'},
    'esrepro.essa.sft_launch': {'esrepro.runtime.distributed'},
    'esrepro.essa.svd': {'esrepro.io'},
    'esrepro.essa.train': {'esrepro.essa.data', 'esrepro.essa.loop', 'esrepro.essa.sft_launch', 'esrepro.essa.spec',
        'esrepro.models.memory', 'esrepro.population.placement', 'esrepro.population.spec', 'esrepro.provenance.manifest'},
    'esrepro.essa.vllm_engine': {'esrepro.runtime.devices', 'esrepro.models.decoding'},
    'esrepro.runtime.forkserver': {'esrepro.runtime.lifeline'},
    'esrepro.models.tiny': {'esrepro.models.warm_start', 'esrepro.tasks.countdown'},
    'esrepro.models.warm_start': {'esrepro.tasks.arc', 'esrepro.tasks.countdown', 'esrepro.tasks.gsm8k_data',
        'esrepro.tasks.math', 'esrepro.tasks.math_train', 'esrepro.tasks.sudoku'},
    'esrepro.planning.plan_check': {'esrepro.planning.cluster', 'esrepro.config', 'esrepro.io',
        'esrepro.planning.jobs', 'esrepro.planning.load', 'esrepro.population.placement', 'esrepro.rl.budget',
        'esrepro.rl.grpo_parallel', 'esrepro.rl.shares'},
    'esrepro.population.placement': {'esrepro.population.ray_session'},
    'esrepro.population.spec': {'esrepro.tasks'},
    'esrepro.planning.preflight': {'esrepro.planning.plan_check', 'esrepro.tasks', 'esrepro.tasks.sources'},
    'esrepro.provenance.golden': {'esrepro.io'},
    'esrepro.provenance.manifest': {'esrepro.runtime.numerics', 'esrepro.provenance'},
    'esrepro.provenance.rocrate': {'esrepro.provenance.manifest'},
    'esrepro.rl.grpo': {'esrepro.runtime.distributed', 'esrepro.io', 'esrepro.paths', 'esrepro.rl.budget',
        'esrepro.rl.grpo_parallel', 'esrepro.rl.trl_resume', 'esrepro.train.periodic'},
    'esrepro.rl.ppo': {'esrepro.train.periodic'},
    'esrepro.rl.run': {'esrepro.runtime.distributed', 'esrepro.rl.grpo_parallel', 'esrepro.rl.trl_resume',
        'esrepro.train.periodic', 'esrepro.train.resume'},
    'esrepro.rl.shares': {'esrepro.rl.grpo_parallel', 'esrepro.settings.methods'},
    'esrepro.rl.trl_resume': {'esrepro.runtime.distributed'},
    'esrepro.steps': {'esrepro.config', 'esrepro.runtime.distributed', 'esrepro.provenance.manifest'},
    'esrepro.steps.config': {'esrepro.config', 'esrepro.planning.load', 'esrepro.settings.docs'},
    'esrepro.steps.data': {'esrepro.provenance.manifest', 'esrepro.tasks'},
    'esrepro.steps.essa': {'esrepro.runtime.devices', 'esrepro.runtime.distributed', 'esrepro.essa.data', 'esrepro.essa.train',
        'esrepro.io', 'esrepro.population.spec', 'esrepro.provenance.manifest', 'esrepro.rl.run',
        'esrepro.settings.methods', 'esrepro.steps', 'esrepro.steps.train', 'esrepro.tasks', 'esrepro.train.context'},
    'esrepro.steps.evaluate': {'esrepro.runtime.devices', 'esrepro.models.memory', 'esrepro.provenance.manifest',
        'esrepro.settings.pipeline', 'esrepro.tasks'},
    'esrepro.steps.kl': {'esrepro.runtime.devices', 'esrepro.provenance.manifest', 'esrepro.settings.pipeline',
        'esrepro.steps.train', 'esrepro.tasks'},
    'esrepro.steps.models': {'esrepro.models.fetch'},
    'esrepro.steps.provenance': {'esrepro.io', 'esrepro.provenance.audit', 'esrepro.provenance.dvc',
        'esrepro.provenance.golden', 'esrepro.provenance.manifest', 'esrepro.provenance.rocrate'},
    'esrepro.steps.report': {'esrepro.config', 'esrepro.runtime.devices', 'esrepro.io', 'esrepro.paths',
        'esrepro.provenance.manifest'},
    'esrepro.steps.train': {'esrepro.runtime.devices', 'esrepro.runtime.distributed', 'esrepro.provenance.manifest',
        'esrepro.rl.select', 'esrepro.settings.methods', 'esrepro.tasks', 'esrepro.train.context',
        'esrepro.train.periodic'},
    'esrepro.tasks.math': {'esrepro.tasks.math_data'},
}


def _light_pairs(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: {hit.split(" -> ")[1] for hit in hits} for name, hits in light_function_imports(modules).items()}


def test_function_level_imports_defer_a_heavy_library_or_say_why():
    found = _light_pairs(_modules())
    new = [f"{name} -> {t}" for name, targets in sorted(found.items())
           for t in sorted(targets - KNOWN_LIGHT.get(name, set()))]
    assert not new, ("function-level imports of esrepro modules that load no heavy library (tests/test_imports.py "
                     "HEAVY): import them at module level, or give the reason in a comment on the line\n" +
                     "\n".join(new))
    gone = [f"{name} -> {t}" for name, targets in sorted(KNOWN_LIGHT.items())
            for t in sorted(targets - found.get(name, set()))]
    assert not gone, "no longer function-level (or now heavy): take them off KNOWN_LIGHT\n" + "\n".join(gone)


def test_a_function_level_import_is_judged_by_what_its_module_loads(tmp_path):
    pkg = tmp_path / "src" / "esrepro"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text("import torch\n")  # heavy itself
    (pkg / "loop.py").write_text("from typing import TYPE_CHECKING\nfrom esrepro.engine import x\n"
                                 "if TYPE_CHECKING:\n    import pandas\n")  # heavy through engine
    (pkg / "names.py").write_text("import json\nif False:\n    import os\ndef f():\n    import scipy\n")  # light
    (pkg / "steps.py").write_text(
        "def a():\n    from esrepro.loop import run\n"  # defers torch: allowed
        "def b():\n    from esrepro.names import N\n"  # defers nothing: flagged
        "def c():\n    from esrepro import names  # read only by c's callers\n"  # a reason given: allowed
        "def d():\n    # forks first\n    import esrepro.names\n"
        "class K:\n    from esrepro.names import M\n"  # a class body runs at import: module level
        "    def e(self):\n        from esrepro.names import (\n            N,\n        )\n")  # flagged
    modules = {".".join(f.relative_to(tmp_path / "src").with_suffix("").parts).removesuffix(".__init__"): f
               for f in pkg.rglob("*.py")}
    assert heavy_libraries(modules)["esrepro.loop"] == {"torch"} and not heavy_libraries(modules)["esrepro.names"]
    assert light_function_imports(modules) == {"esrepro.steps": ["esrepro.steps:4 -> esrepro.names",
                                                                  "esrepro.steps:13 -> esrepro.names"]}
