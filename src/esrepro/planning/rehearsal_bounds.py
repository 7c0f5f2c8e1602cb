"""The rehearsal as a transformation of a config and a registry, applied before the pipeline that runs is built.

``rehearse(cfg, registry)`` returns the config, the registry and one last settings layer per run, such that every
job of the DAG is bounded whatever layer of config/paper.yaml (or the registry, or the code's defaults) set its
size:

1. the registry on CPUs with thinned RL grids (:func:`esrepro.planning.rehearsal_registry.rehearsal_registry`);
2. ``defaults.evaluate``, ``evaluate.<task>``, ``defaults.kl`` and ``kl.<task>`` clamped to :data:`BOUNDS` (their
   whole layering: an evaluation's or KL job's settings are those layers and the code's defaults);
3. every train job's settings resolved from (1, 2) and every over-bound field written into the run's own last
   layer (:data:`BOUNDS`; an ESSA run's ``train_examples`` follows its bounded parts);
4. an RL run's per-step batch thinned for the paper job's training processes
   (:func:`esrepro.planning.rehearsal_registry.rl_batch`; the count: :func:`esrepro.planning.cluster.rl_job`, the function every
   RL job's placement calls), its sample budget cut to :data:`RL_STEPS` optimiser steps.

config/rehearsal.yaml may still shrink layers itself (smaller than the bounds, or data sizes and sweeps); what it
leaves alone is bounded here. The settings' resolution never asks the rehearsal anything: it sees a config, a
registry and layers.
"""

from __future__ import annotations

from typing import Any

from esrepro.pipeline import Pipeline
from esrepro.planning.cluster import DATA_PARALLEL, layout, rl_job
from esrepro.planning.jobs import plan_jobs
from esrepro.planning.rehearsal_registry import rehearsal_registry, rl_batch
from esrepro.rl.budget import prompts_per_generation, samples_per_step
from esrepro.settings.layers import ConfigError, Layer
from esrepro.settings.methods import ESSASettings, MethodSettings
from esrepro.settings.pipeline import EvalSettings, KLSettings, PipelineConfig
from esrepro.settings.registry import ModelEntry

#: The most any job of the rehearsal runs, per setting (iterations, populations, problems, tokens, batches): a value
#: above it, or null where null means "all" (:data:`NULL_IS_ALL`), becomes the bound.
BOUNDS: dict[str, int] = {
    "iterations": 3, "population": 6, "train_examples": 8, "prompts_per_iteration": 4, "max_new_tokens": 8,
    "eval_max_new_tokens": 8, "max_prompt_tokens": 256, "eval_limit": 4, "limit": 4, "n_samples": 2,
    "batch_size": 8, "eval_batch_size": 8, "sft_examples": 8, "fitness_examples": 4, "val_examples": 4,
    "sft_epochs": 1, "sft_prompts_per_step": 4, "rank": 8, "resample_per_step": 4,
}
#: Settings whose null means "every one" (the whole split, every problem): bounded too (``eval_limit`` only where
#: ``eval_every`` sets a periodic evaluation: without one it is never read).
NULL_IS_ALL = ("train_examples", "eval_limit", "limit")
#: ESSA's problems: ``train_examples`` is their sum (esrepro.settings.methods.ESSASettings).
ESSA_PARTS = ("sft_examples", "fitness_examples", "val_examples")
#: Optimiser steps an RL run of the rehearsal takes at most (its sample budget cut to that many steps' samples).
RL_STEPS = 2
#: The rules whose jobs train a run (workflow/rules/train.smk).
TRAIN_RULES = ("train", "train_cell", "essa_grpo")
#: The rules whose jobs train an RL run (esrepro.planning.cluster.DATA_PARALLEL algorithms).
RL_RULES = TRAIN_RULES
#: How the rehearsal's run layers are named in errors.
SOURCE = "rehearsal"


def over_bound(values: dict[str, Any], fields: dict | None = None) -> dict[str, int]:
    """The fields of ``values`` above :data:`BOUNDS` (or null where null means all), set to their bound;
    ``fields``: the settings class's fields (only those are bounded; None: every key of ``values``)."""
    out = {}
    for key, bound in BOUNDS.items():
        if key not in values or (fields is not None and key not in fields):
            continue
        value = values[key]
        if key == "eval_limit" and values.get("eval_every", 0) is None:
            continue
        if (value is None and key in NULL_IS_ALL) or (isinstance(value, int) and not isinstance(value, bool)
                                                      and value > bound):
            out[key] = bound
    return out


def bounded_layer(layer: dict | None) -> dict:
    """One settings layer (a mapping of settings) with every over-bound value at its bound."""
    layer = dict(layer or {})
    return {**layer, **over_bound(layer)}


def bounded_defaults(layer: dict, settings_class: type) -> dict:
    """A ``defaults.<family>`` layer bounded, the code's defaults included: a field the layer leaves to its
    class's default gets the bound where that default is above it (or null where null means all)."""
    fields = settings_class.model_fields
    full = {k: layer.get(k, fields[k].default) for k in BOUNDS if k in fields}
    return {**layer, **over_bound(full, fields)}


def bounded_config(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with its evaluation and KL layers bounded (their settings are those layers over the code's)."""
    defaults = cfg.defaults.model_copy(update={
        "evaluate": bounded_defaults(dict(cfg.defaults.evaluate), EvalSettings),
        "kl": bounded_defaults(dict(cfg.defaults.kl), KLSettings)})
    return cfg.model_copy(update={
        "defaults": defaults,
        "evaluate": {task: bounded_layer(v) for task, v in cfg.evaluate.items()},
        "kl": {task: bounded_layer(v) if v is not None else v for task, v in cfg.kl.items()}})


def train_runs(p: Pipeline) -> list[tuple[str, str, str]]:
    """(task, model, method) of every train job of the pipeline's DAG, each once (grid cells share one)."""
    return list(dict.fromkeys((j.wildcards["task"], j.wildcards["model"], j.wildcards["method"])
                              for j in plan_jobs(p) if j.rule in TRAIN_RULES))


def run_bounds(settings: MethodSettings) -> dict[str, int]:
    """The over-bound fields of one run's settings at their bounds (an ESSA run's ``train_examples``: its bounded
    parts' sum)."""
    values = settings.as_dict()
    out = over_bound(values, type(settings).model_fields)
    if isinstance(settings, ESSASettings):
        out.pop("train_examples", None)
        if any(k in out for k in ESSA_PARTS):
            out["train_examples"] = sum(out.get(k, values[k]) for k in ESSA_PARTS)
    return out


def rl_steps(per_rollout: int = 1) -> int:
    """Optimiser steps of a rehearsal RL run: :data:`RL_STEPS`, rounded up to whole rollouts of ``per_rollout``
    steps each."""
    return -(-RL_STEPS // per_rollout) * per_rollout


def rl_thinned(p: Pipeline, task: str, model: str, method: str, settings: MethodSettings) -> dict[str, Any]:
    """An RL run's batch as the rehearsal runs it: the paper job's training processes (:func:`esrepro.planning.cluster.rl_job`
    on the paper's per-step batch), with that batch thinned by :func:`rl_batch`, the sample budget cut to
    :func:`rl_steps` steps, a ``resume_every`` that is not on a rollout boundary set to one rollout, and the training
    problems raised to one rollout's (without ``repeat_prompts``).
    ``settings``: the run's bounded settings, whose batch fields are the paper's."""
    paper = settings.as_dict()
    world = rl_job(p, model, paper).training_processes()
    thinned = {**paper, **(rl_batch(paper, world) if world > 1 else {})}  # one process: the paper's batch
    examples = paper.get("train_examples")
    if examples and not paper.get("repeat_prompts"):  # as many problems as a rollout draws (rl.budget)
        thinned["train_examples"] = max(int(examples), prompts_per_generation(thinned))
    per_rollout = int(paper.get("updates_per_generation") or 1)  # a rollout's optimiser steps (GRPO-v's VERL shape)
    budget = paper.get("sample_budget")
    if budget:  # whole rollouts: at least RL_STEPS steps
        thinned["sample_budget"] = min(int(budget), rl_steps(per_rollout) * samples_per_step(thinned))
    every = paper.get("resume_every")
    if isinstance(every, int) and every % per_rollout:  # a run resumes on rollout boundaries (esrepro.rl.grpo)
        thinned["resume_every"] = per_rollout
    where = f"{task}/{model}/{method}"
    try:
        out = type(settings).model_validate(thinned)
    except ValueError as exc:
        raise ConfigError(f"rehearsal: {where}: its batch thinned for {world} processes is refused: {exc}") from None
    if rl_job(p, model, out.as_dict()).training_processes() != world:  # the job would run at another count
        raise ConfigError(f"rehearsal: {where}: the thinned batch {rl_batch(paper, world)} admits more than the "
                          f"paper job's {world} processes (of {p.resources(model, 'train').training_processes()})")
    return {k: v for k, v in out.as_dict().items() if v != paper.get(k)}


def rehearse(cfg: PipelineConfig, registry: dict[str, ModelEntry], source: str = "config",
             registry_source: str = "registry") -> tuple[PipelineConfig, dict[str, ModelEntry],
                                                           dict[tuple[str, str, str], Layer]]:
    """The rehearsal of ``cfg`` (whose ``rehearsal`` block is set) and ``registry``: the config, the registry and the
    run layers the pipeline that runs is built from (the module's steps 1-4)."""
    assert cfg.rehearsal is not None
    registry = rehearsal_registry(registry, cfg.rehearsal)
    cfg = bounded_config(cfg)
    paper = Pipeline(cfg, registry, source, registry_source)
    runs = train_runs(paper)
    layers = {key: Layer(SOURCE, "bounds of " + "/".join(key), bounds) for key in runs
              if (bounds := run_bounds(paper.method_settings(key[1], key[0], key[2])))}
    bounded = Pipeline(cfg, registry, source, registry_source, layers)  # RL budgets from the bounded ES runs
    for task, model, method in runs:
        if bounded.algorithm_of(task, method).name in DATA_PARALLEL:
            settings = bounded.method_settings(model, task, method)
            own = layers[task, model, method].values if (task, model, method) in layers else {}
            layers[task, model, method] = Layer(SOURCE, f"bounds of {task}/{model}/{method}",
                                                {**own, **rl_thinned(bounded, task, model, method, settings)})
    return cfg, registry, layers


def rl_jobs(p: Pipeline) -> list[tuple[str, str, str, str | None, str, int]]:
    """(task, model, method, cell, algorithm, training processes) of every RL job of the pipeline's DAG."""
    out = []
    for job in plan_jobs(p):
        w = job.wildcards
        if job.rule not in RL_RULES:
            continue
        algorithm = p.algorithm_of(w["task"], w["method"]).name
        if algorithm in DATA_PARALLEL:
            res = layout(p, w["task"], w["model"], w["method"], w.get("cell"))
            out.append((w["task"], w["model"], w["method"], w.get("cell"), algorithm, res.training_processes()))
    return out


def rl_process_table(paper: Pipeline, rehearsal: Pipeline) -> str:
    """docs/rehearsal.md's table: the paper's RL jobs per task and model, their training processes (the paper's and
    the rehearsal's, the same), and how many of them each DAG runs."""
    groups: dict[tuple[str, str, int], dict] = {}
    for task, model, method, _, algorithm, n in rl_jobs(paper):
        g = groups.setdefault((task, model, n), {"methods": {}, "paper": 0, "rehearsal": 0})
        g["methods"].setdefault(algorithm, set()).add(method)
        g["paper"] += 1
    for task, model, _, _, _, n in rl_jobs(rehearsal):
        groups[(task, model, n)]["rehearsal"] += 1  # a KeyError: a job at a count the paper's never has
    lines = ["| task | model | methods | processes | jobs (paper) | jobs (rehearsal) |",
             "|---|---|---|---:|---:|---:|"]
    for (task, model, n), g in groups.items():
        methods = ", ".join(sorted(m for ms in g["methods"].values() for m in ms)) if \
            sum(len(ms) for ms in g["methods"].values()) <= 5 else \
            ", ".join(f"{a} ({len(ms)} settings)" for a, ms in g["methods"].items())
        lines.append(f"| {task} | {model} | {methods} | {n} | {g['paper']} | {g['rehearsal']} |")
    return "\n".join(lines) + "\n"
