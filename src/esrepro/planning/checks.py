"""Everything a run will read, checked before any job starts: references, settings, sizes.

Each check appends one-line problems (``file: field.path: what is wrong``); the run is
refused with all of them at once.
"""

from __future__ import annotations

import math
from typing import Callable

from esrepro.essa.data import baseline_problems_needed
from esrepro.models.entry_check import entry_problems
from esrepro.pipeline import BASE, ESSA_GRPO, ESSA_REF, Pipeline
from esrepro.planning.cluster import train_job, train_resources_key
from esrepro.population.placement import engines_per_gpu
from esrepro.rl.budget import check_problem_count
from esrepro.settings.base import renamed
from esrepro.settings.layers import ConfigError, at
from esrepro.settings.methods import ES_ALGORITHMS
from esrepro.tasks import known_tasks, split_sizes
from esrepro.tasks.math_data import MATH_SETS


def _collect(problems: list[str], fn: Callable[..., object], *args: object) -> object:
    """Run ``fn(*args)``; a ConfigError's lines (or a KeyError's message) become problems."""
    try:
        return fn(*args)
    except ConfigError as exc:
        problems.extend(exc.problems)
    except KeyError as exc:
        problems.append(str(exc.args[0]) if exc.args else repr(exc))
    return None


def check_pipeline(p: Pipeline) -> None:
    """Raise ConfigError listing every problem of ``p``'s config and registry (nothing when all is well)."""
    problems: list[str] = []
    for check in (_models, _model_sources, _tasks, _methods, _engines, _evaluation, _studies, _sizes, _essa_study,
                  _per_task):
        check(p, problems)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))


def _registry_keys(p: Pipeline, out: list[str], keys: list[str], *field: str) -> list[str]:
    """The ``keys`` (a config list of models at ``field``) the registry has; one problem for each it lacks."""
    out += [at(p.source, *field, i) + f": {key!r} is not in the registry {p.registry_source}"
            for i, key in enumerate(keys) if key not in p.registry]
    return [key for key in keys if key in p.registry]


def _models(p: Pipeline, out: list[str]) -> None:
    _registry_keys(p, out, p.cfg.models, "models")


def _model_sources(p: Pipeline, out: list[str]) -> None:
    """Every hub or folder model the run touches is a causal LM transformers builds (its stated config, or its
    folder's config.json, weights and tokenizer, and the two agreeing): :func:`esrepro.models.entry_check.
    entry_problems`, a meta-device build, no weights read."""
    models = _collect(out, p.all_models) or []
    for key in models:
        out += entry_problems(key, p.model(key), p.registry_source)


def _tasks(p: Pipeline, out: list[str]) -> None:
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
    for task, block in p.cfg.train.items():
        models = [m for m in p.train_models(task) if m in p.registry]
        for method in block.overrides():
            if method not in block.methods:
                out.append(at(p.source, "train", task, method) + f": settings for a method not in train.{task}.methods")
        for method in block.methods:
            algo = _collect(out, p.algorithm_of, task, method)
            if algo is None:
                continue
            for model in models:
                _collect(out, p.method_settings, model, task, method)
                _grid(p, out, model, task, method, algo.rl)
    for model in p.all_models():  # registry overrides of methods this config never runs are still checked
        for method, values in p.model(model).methods.items():
            if not isinstance(values, dict):
                out.append(at(p.registry_source, "models", model, "methods", method) + ": expected a mapping")


def _engines(p: Pipeline, out: list[str]) -> None:
    """ES engine layouts a job's GPUs cannot hold: refused here rather than inside vLLM or Ray's scheduler."""
    for task, block in p.cfg.train.items():
        for model in (m for m in p.train_models(task) if m in p.registry):
            for method in block.methods:
                try:
                    cfg = p.method_settings(model, task, method)
                    res = train_job(p, task, model, method)
                except (ConfigError, KeyError):
                    continue  # reported by _methods
                if cfg.algorithm not in ES_ALGORITHMS or not res.gpu:
                    continue
                where = at(p.registry_source, "models", model, "resources", train_resources_key(p, task, model, method))
                tp, gpus = cfg.tensor_parallel_size, res.nodes * res.gpu
                if tp > res.gpu:
                    out.append(f"{where}: {method} on {task}: tensor_parallel_size {tp} is more than the {res.gpu} "
                               "GPUs of one node (an engine's GPUs must share a node)")
                    continue
                engines = cfg.engines or max(1, gpus // tp)
                try:
                    sharing = engines_per_gpu(engines, gpus, tp)
                except ValueError as exc:
                    out.append(f"{where}: {method} on {task}: {exc}")
                    continue
                util = cfg.gpu_memory_utilization
                if util is not None and sharing * util > 0.95:
                    out.append(f"{where}: {method} on {task}: {sharing} engines share each GPU at "
                               f"gpu_memory_utilization {util:g}, {sharing * util:.2f} of its memory in all, none "
                               "left for ES's weight copies")


def _grid(p: Pipeline, out: list[str], model: str, task: str, method: str, rl: bool) -> None:
    grid = p.grid(model, method)
    where = at(p.registry_source, "models", model, "methods", method, "grid")
    cells = p.model(model).methods.get(method, {}).get("cells")
    if not grid and cells is None:
        return
    if not rl:
        out.append(f"{where}: grids are for RL methods (ppo and the GRPO variants)")
        return
    fields = p.algorithm_of(task, method).settings.model_fields
    for key, values in grid.items():
        if key not in fields:
            out.append(f"{where}.{key}: not a setting of {method}{renamed(key, fields)}")
        elif not isinstance(values, list) or not values:
            out.append(f"{where}.{key}: expected a non-empty list of values")
    if cells is not None:  # v2: explicit cells beside the product
        cwhere = at(p.registry_source, "models", model, "methods", method, "cells")
        if not isinstance(cells, list) or not all(isinstance(c, dict) and c for c in cells):
            out.append(f"{cwhere}: expected a list of non-empty mappings of settings")
            return
        for i, cell in enumerate(cells):
            out.extend(f"{cwhere}.{i}.{k}: not a setting of {method}{renamed(k, fields)}"
                       for k in cell if k not in fields)
        product = math.prod(len(v) for v in grid.values() if isinstance(v, list)) if grid else 0
        distinct = len(p.grid_cells(model, method))  # keyed by cell name: a repeated cell collapses
        if distinct != product + len(cells):
            out.append(f"{cwhere}: a cell repeats another cell of the grid ({product} in the product, "
                       f"{len(cells)} listed, {distinct} distinct)")
    if not any(p.startswith(where) for p in out):
        for cell in p.grid_cells(model, method):
            _collect(out, p.method_settings, model, task, method, cell)


def _evaluation(p: Pipeline, out: list[str]) -> None:
    for task in p.cfg.evaluate:
        s = _collect(out, p.eval_settings, task)
        if s is not None and s.train_task and s.train_task not in p.cfg.train:
            out.append(at(p.source, "evaluate", task, "train_task") + f": no train.{s.train_task} entry")
    for task in p.cfg.kl:
        _collect(out, p.kl_settings, task)


def _studies(p: Pipeline, out: list[str]) -> None:
    for name, study in p.studies().items():
        where = at(p.source, "studies", name)
        models = _registry_keys(p, out, study.models, "studies", name, "models")
        if study.task not in p.cfg.data:
            out.append(f"{where}.task: no data.{study.task} entry to train on")
        if study.task not in p.cfg.kl:
            out.append(f"{where}.task: no kl.{study.task} entry saying how KL is measured")
        methods = _collect(out, p.study_methods, name) or {}
        clash = set(methods) & set(p.train_methods(study.task))
        if clash:
            out.append(f"{where}: method names {sorted(clash)} also in train.{study.task}.methods")
        for model in models:
            for method in methods:
                _collect(out, p.method_settings, model, study.task, method)


def _sizes(p: Pipeline, out: list[str]) -> None:
    """Counts a run asks for against what its data will hold, where that is known before preparing."""
    def known(task: str) -> dict[str, int | None]:
        try:
            return split_sizes(task, p.cfg.data[task].source.model_dump(exclude_none=True))
        except (KeyError, ValueError) as exc:
            out.append(at(p.source, "data", task, "source") + f": {exc}")
            return {}

    runs = [(task, m, meth) for task in p.cfg.train for m in p.train_models(task) if m in p.registry
            for meth in p.train_methods(task)]
    runs += [(s.task, m, meth) for name, s in p.studies().items() for m in s.models if m in p.registry
             for meth in (_collect([], p.study_methods, name) or {})]
    sizes = {task: known(task) for task in {t for t, _, _ in runs} if task in p.cfg.data}
    for task, model, method in runs:
        n = sizes.get(task, {}).get("train")
        s = _collect([], p.method_settings, model, task, method)
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
    """studies.essa (and its scaling block): models, tasks, every run's settings, precision against the device,
    data sizes."""
    study = p.essa_study()
    if study is None:
        return
    if study.grpo is not None and not study.grpo.get("keep_every"):
        out.append(f"{at(p.source, 'studies', 'essa')}.grpo.keep_every: required: the baseline's held-out curve is "
                   "scored on its kept snapshots (ESSA Figs. 6 and 8)")
    for task in p.essa_tasks():
        path = ("studies", "essa") if task == study.task else ("studies", "essa", "scaling")
        _essa_task(p, out, task, at(p.source, *path), path)


def _essa_task(p: Pipeline, out: list[str], task: str, where: str, path: tuple[str, ...]) -> None:
    models = _registry_keys(p, out, p.essa_models(task), *path, "models")
    if task not in p.cfg.data:
        out.append(f"{where}.task: no data.{task} entry to train on")
    if task not in p.cfg.evaluate:
        out.append(f"{where}.task: no evaluate.{task} entry saying how the runs are evaluated")
    clash = set(p.essa_methods(task)) & set(p.train_methods(task))
    if clash:
        out.append(f"{where}: method names {sorted(clash)} also in train.{task}.methods")
    sizes = {}
    if task in p.cfg.data:
        try:
            sizes = split_sizes(task, p.cfg.data[task].source.model_dump(exclude_none=True))
        except (KeyError, ValueError) as exc:
            out.append(at(p.source, "data", task, "source") + f": {exc}")
    for model in models:
        ref = _collect(out, p.method_settings, model, task, ESSA_REF)
        for method in p.essa_methods(task, model):
            s = ref if method == ESSA_REF else _collect(out, p.method_settings, model, task, method)
            if s is None:
                continue
            if getattr(s, "precision", "native") != "native" and p.cfg.device == "cpu":
                layer = next(l for l in reversed(p.method_layers(model, task, method)) if "precision" in l.values)
                out.append(f"{at(layer.file, layer.block, 'precision')}: {s.precision} needs a CUDA GPU "
                           f"(bitsandbytes), but device is cpu (method {method})")
            n = sizes.get("train")
            need, what = s.train_examples, "sft_examples + fitness_examples + val_examples"
            if method == ESSA_GRPO:
                try:
                    check_problem_count(s.as_dict(), s.train_examples)
                except ValueError as exc:
                    out.append(f"{where}: method {method} (model {model}): {exc}")
                if s.eval_every is not None:  # e.g. inherited from defaults.grpo
                    out.append(f"{where}: method {method} (model {model}): eval_every: {s.eval_every}: the baseline "
                               "scores its held-out curve every keep_every steps; set grpo: {eval_every: null}")
                if ref is not None:
                    need = baseline_problems_needed(ref.sft_examples, ref.fitness_examples, ref.val_examples,
                                                    s.train_examples)
                    what = ("the reference run's sft_examples + the baseline's train_examples, past the held-out "
                            "problems")
            if n is not None and need > n:
                out.append(f"{where}: method {method} (model {model}) reads {need} training problems ({what}), "
                           f"but data.{task} prepares {n}")


# --- per-task models, stability, study name clashes, report extras ---------------------------------------
def _snapshot_ref(p: Pipeline, out: list[str], task: str, ref, where: str, target: str | None = None) -> None:
    """One problem per way ``ref`` ({method, iteration}) names no weights a run of ``task`` keeps."""
    block = p.cfg.train[task]
    if ref.method not in block.methods:
        out.append(f"{where}.method: {ref.method!r} is not in train.{task}.methods")
        return
    if ref.method == target:
        out.append(f"{where}.method: a run cannot start from its own weights")
        return
    if p.is_rl(task, ref.method):
        out.append(f"{where}.method: {ref.method!r} is an RL method (best grid cell kept); only runs trained directly "
                   "(ES) keep snapshots to start from or evaluate")
        return
    for model in [m for m in p.train_models(task) if m in p.registry]:
        settings = _collect(out, p.method_settings, model, task, ref.method)
        if settings is None:
            continue
        last, every = getattr(settings, "iterations", None), settings.keep_every
        if ref.iteration == last:
            continue
        if last is not None and ref.iteration > last:
            out.append(f"{where}.iteration: {ref.iteration} is past the last iteration ({last}) of {ref.method} "
                       f"({model})")
        elif not every or ref.iteration % every:
            out.append(f"{where}.iteration: {ref.method} ({model}) keeps no snapshot at iteration {ref.iteration} "
                       f"(keep_every: {every}); set train.{task}.{ref.method}.keep_every to a divisor of it")


def _snapshots(p: Pipeline, out: list[str]) -> None:
    """train.<task>.snapshots, eval_models and each method's start_from name weights that exist, without cycles."""
    for task, block in p.cfg.train.items():
        _registry_keys(p, out, block.eval_models, "train", task, "eval_models")
        out += [at(p.source, "train", task, "eval_models") + f": {m!r} is trained on {task} (train.{task}.models); "
                "its base model is evaluated already" for m in block.eval_models if m in p.train_models(task)]
        for name, ref in block.snapshots.items():
            where = at(p.source, "train", task, "snapshots", name)
            if name in block.methods or name in block.overrides():
                out.append(f"{where}: the name of a method of train.{task}; a snapshot needs a name of its own")
            _snapshot_ref(p, out, task, ref, where)
        for method in block.methods:
            if _collect([], p.algorithm_of, task, method) is None:
                continue
            for model in [m for m in p.train_models(task) if m in p.registry]:
                settings = _collect([], p.method_settings, model, task, method)
                ref = getattr(settings, "start_from", None)
                if ref is None:
                    continue
                where = at(p.source, "train", task, method, "start_from")
                if p.is_rl(task, method):
                    out.append(f"{where}: RL methods (trained per grid cell) start from the base model")
                    continue
                _snapshot_ref(p, out, task, ref, where, target=method)
                seen, cur = {method}, ref.method
                while True:  # a chain of starts must end at a run from the base model
                    nxt = _collect([], p.start_of, model, task, cur)
                    if nxt is None:
                        break
                    if nxt.method in seen:
                        out.append(f"{where}: the runs' starts form a cycle ({' -> '.join([*seen, nxt.method])})")
                        break
                    seen.add(nxt.method)
                    cur = nxt.method
                break  # the chain and the reference are the same for every model but the iterations checked above


def _per_task(p: Pipeline, out: list[str]) -> None:
    _snapshots(p, out)
    for task, block in p.cfg.train.items():
        _registry_keys(p, out, block.models or [], "train", task, "models")
    st = p.cfg.stability
    if st is not None:
        where = at(p.source, "stability")
        if st.task not in p.cfg.train:
            out.append(f"{where}.task: no train.{st.task} entry to rerun")
        else:
            out += [f"{where}.models: {m!r} is not trained on {st.task} (train.{st.task}.models or models)"
                    for m in st.models if m not in p.train_models(st.task)]
            out += [f"{where}.methods: {m!r} is not in train.{st.task}.methods"
                    for m in st.methods if m not in p.train_methods(st.task)]
    seen: dict[tuple[str, str], str] = {}
    for name, study in p.studies().items():
        for method in _collect([], p.study_methods, name) or {}:
            other = seen.setdefault((study.task, method), name)
            if other != name:
                out.append(at(p.source, "studies", name) + f": method {method} on {study.task} is also a method of "
                           f"studies.{other}")
    extras = set(p.cfg.report.extras)
    where = at(p.source, "report", "extras")
    if "lr_sweep" in extras:
        lr = p.studies().get("conciseness_lr")
        if lr is None or lr.grpo is None:
            out.append(f"{where}: lr_sweep needs studies.conciseness_lr with a grpo sweep")
    if "stability" in extras and st is None:
        out.append(f"{where}: stability needs a stability block")
    if "math" in extras and not any(p.train_task_of(t) in p.cfg.train for t in MATH_SETS if t in p.cfg.evaluate):
        out.append(f"{where}: math needs a math set (evaluate.<set>) whose train_task is trained on")
    if "puzzles" in extras and not any(t in p.cfg.train for t in ("sudoku", "arc")):
        out.append(f"{where}: puzzles needs train.sudoku or train.arc")
    if "gains" in extras and not p.train_methods(p.cfg.report.table1.task):
        out.append(f"{where}: gains needs methods trained on report.table1.task ({p.cfg.report.table1.task})")
