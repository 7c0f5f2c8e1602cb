"""Everything a run will read, checked before any job starts: references, settings, sizes.

Each check appends one-line problems (``file: field.path: what is wrong``); the run is
refused with all of them at once.
"""

from __future__ import annotations

from typing import Callable

from esrepro.pipeline import BASE, Pipeline
from esrepro.settings.layers import ConfigError, at


def _collect(problems: list[str], fn: Callable[[], object]) -> object:
    """Run ``fn``; a ConfigError's lines (or a KeyError's message) become problems."""
    try:
        return fn()
    except ConfigError as exc:
        problems.extend(exc.problems)
    except KeyError as exc:
        problems.append(str(exc.args[0]) if exc.args else repr(exc))
    return None


def check_pipeline(p: Pipeline) -> None:
    """Raise ConfigError listing every problem of ``p``'s config and registry (nothing when all is well)."""
    problems: list[str] = []
    for check in (_models, _tasks, _methods, _evaluation, _studies, _sizes, _essa_study):
        check(p, problems)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))


def _models(p: Pipeline, out: list[str]) -> None:
    for i, key in enumerate(p.cfg.models):
        if key not in p.registry:
            out.append(at(p.source, "models", i) + f": {key!r} is not in the registry {p.registry_source}")


def _tasks(p: Pipeline, out: list[str]) -> None:
    from esrepro.tasks import known_tasks

    known = known_tasks()
    for section in ("data", "train", "evaluate", "task_options", "kl"):
        for task in getattr(p.cfg, section):
            if task not in known:
                out.append(at(p.source, section, task) + f": unknown task; known: {', '.join(known)}")
    for section in ("train", "evaluate", "kl"):
        for task in getattr(p.cfg, section):
            if task in known and task not in p.cfg.data:
                out.append(at(p.source, section, task) + f": no data.{task} entry to read")
    t1 = p.cfg.report.table1
    if t1.task not in p.cfg.evaluate:
        out.append(at(p.source, "report", "table1", "task") + f": {t1.task!r} is not evaluated (no evaluate.{t1.task})")


def _methods(p: Pipeline, out: list[str]) -> None:
    models = [m for m in p.models if m in p.registry]
    for task, block in p.cfg.train.items():
        for method in block.overrides():
            if method not in block.methods:
                out.append(at(p.source, "train", task, method) + f": settings for a method not in train.{task}.methods")
        for method in block.methods:
            algo = _collect(out, lambda: p.algorithm_of(task, method))
            if algo is None:
                continue
            for model in models:
                _collect(out, lambda: p.method_settings(model, task, method))
                _grid(p, out, model, task, method, algo.rl)
    for model in models:  # registry overrides of methods this config never runs are still checked
        for method, values in p.model(model).methods.items():
            if not isinstance(values, dict):
                out.append(at(p.registry_source, "models", model, "methods", method) + ": expected a mapping")


def _grid(p: Pipeline, out: list[str], model: str, task: str, method: str, rl: bool) -> None:
    grid = p.grid(model, method)
    where = at(p.registry_source, "models", model, "methods", method, "grid")
    if not grid:
        return
    if not rl:
        out.append(f"{where}: grids are for RL methods (ppo, grpo, dr_grpo)")
        return
    fields = p.algorithm_of(task, method).settings.model_fields
    for key, values in grid.items():
        if key not in fields:
            out.append(f"{where}.{key}: not a setting of {method}")
        elif not isinstance(values, list) or not values:
            out.append(f"{where}.{key}: expected a non-empty list of values")
    if not any(p.startswith(where) for p in out):
        for cell in p.grid_cells(model, method):
            _collect(out, lambda: p.method_settings(model, task, method, cell))


def _evaluation(p: Pipeline, out: list[str]) -> None:
    for task in p.cfg.evaluate:
        s = _collect(out, lambda: p.eval_settings(task))
        if s is not None and s.train_task and s.train_task not in p.cfg.train:
            out.append(at(p.source, "evaluate", task, "train_task") + f": no train.{s.train_task} entry")
    for task in p.cfg.kl:
        _collect(out, lambda: p.kl_settings(task))


def _studies(p: Pipeline, out: list[str]) -> None:
    for name, study in p.studies().items():
        where = at(p.source, "studies", name)
        known_model = study.model in p.registry
        if not known_model:
            out.append(f"{where}.model: {study.model!r} is not in the registry {p.registry_source}")
        if study.task not in p.cfg.data:
            out.append(f"{where}.task: no data.{study.task} entry to train on")
        if study.task not in p.cfg.kl:
            out.append(f"{where}.task: no kl.{study.task} entry saying how KL is measured")
        methods = _collect(out, lambda: p.study_methods(name)) or {}
        clash = set(methods) & set(p.train_methods(study.task))
        if clash:
            out.append(f"{where}: method names {sorted(clash)} also in train.{study.task}.methods")
        for method in methods if known_model else ():
            _collect(out, lambda: p.method_settings(study.model, study.task, method))


def _sizes(p: Pipeline, out: list[str]) -> None:
    """Counts a run asks for against what its data will hold, where that is known before preparing."""
    from esrepro.tasks import split_sizes

    def known(task: str) -> dict[str, int | None]:
        try:
            return split_sizes(task, p.cfg.data[task].source.model_dump(exclude_none=True))
        except (KeyError, ValueError) as exc:
            out.append(at(p.source, "data", task, "source") + f": {exc}")
            return {}

    runs = [(task, m, meth) for task in p.cfg.train for m in p.models if m in p.registry
            for meth in p.train_methods(task)]
    runs += [(s.task, s.model, meth) for name, s in p.studies().items() if s.model in p.registry
             for meth in (_collect([], lambda: p.study_methods(name)) or {})]
    sizes = {task: known(task) for task in {t for t, _, _ in runs} if task in p.cfg.data}
    for task, model, method in runs:
        n = sizes.get(task, {}).get("train")
        s = _collect([], lambda: p.method_settings(model, task, method))
        if s is None or n is None or method == BASE:
            continue
        if s.train_examples > n:
            layers = p.method_layers(model, task, method)
            src = next((l for l in reversed(layers) if "train_examples" in l.values), None)
            where = at(src.file, src.block, "train_examples") if src else at(p.source, "methods", method)
            out.append(f"{where}: {s.train_examples} training examples, but data.{task} prepares {n} "
                       f"(method {method}, model {model})")


# --- the ESSA study ------------------------------------------------------------------------------


def _essa_study(p: Pipeline, out: list[str]) -> None:
    """studies.essa: models, task, every run's settings, precision against the device, data sizes."""
    from esrepro.pipeline import ESSA_GRPO, ESSA_REF

    study = p.essa_study()
    if study is None:
        return
    where = at(p.source, "studies", "essa")
    models = []
    for i, m in enumerate(study.models):
        if m in p.registry:
            models.append(m)
        else:
            out.append(f"{where}.models.{i}: {m!r} is not in the registry {p.registry_source}")
    if study.task not in p.cfg.data:
        out.append(f"{where}.task: no data.{study.task} entry to train on")
    if study.task not in p.cfg.evaluate:
        out.append(f"{where}.task: no evaluate.{study.task} entry saying how the runs are evaluated")
    clash = set(p.essa_methods()) & set(p.train_methods(study.task))
    if clash:
        out.append(f"{where}: method names {sorted(clash)} also in train.{study.task}.methods")
    if study.grpo is not None and not study.grpo.get("keep_every"):
        out.append(f"{where}.grpo.keep_every: required: the baseline's held-out curve is scored on its kept "
                   "snapshots (ESSA Fig. 8)")
    sizes = {}
    if study.task in p.cfg.data:
        from esrepro.tasks import split_sizes

        try:
            sizes = split_sizes(study.task, p.cfg.data[study.task].source.model_dump(exclude_none=True))
        except (KeyError, ValueError) as exc:
            out.append(at(p.source, "data", study.task, "source") + f": {exc}")
    for model in models:
        ref = _collect(out, lambda: p.method_settings(model, study.task, ESSA_REF))
        for method in p.essa_methods():
            s = ref if method == ESSA_REF else _collect(out, lambda: p.method_settings(model, study.task, method))
            if s is None:
                continue
            if getattr(s, "precision", "native") != "native" and p.cfg.device == "cpu":
                layer = next(l for l in reversed(p.method_layers(model, study.task, method)) if "precision" in l.values)
                out.append(f"{at(layer.file, layer.block, 'precision')}: {s.precision} needs a CUDA GPU "
                           f"(bitsandbytes), but device is cpu (method {method})")
            n = sizes.get("train")
            need = s.train_examples if method != ESSA_GRPO or ref is None else ref.sft_examples + s.train_examples
            if n is not None and need > n:
                what = ("sft_examples + fitness_examples + val_examples" if method != ESSA_GRPO else
                        "the reference run's sft_examples + the baseline's train_examples")
                out.append(f"{where}: method {method} (model {model}) reads {need} training problems ({what}), "
                           f"but data.{study.task} prepares {n}")
