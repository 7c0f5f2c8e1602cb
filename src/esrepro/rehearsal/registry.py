"""The model registry as the rehearsal runs it: the same models and layouts, on CPUs, with thinned RL grids; and
an RL run's settings as the rehearsal runs them: the paper job's training processes, with a batch of a step or two.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from esrepro.pipeline import Pipeline
    from esrepro.settings.pipeline import Rehearsal
    from esrepro.settings.registry import ModelEntry, Resources

#: Optimiser steps an RL run of the rehearsal takes at most (its sample budget cut to that many steps' samples).
RL_STEPS = 2


def cpu_resources(res: "Resources", rehearsal: "Rehearsal") -> "Resources":
    """One rule's resources on CPUs: no GPUs; a multi-node job keeps its Ray cluster on one node (scripts/ray-slurm)
    with ``rehearsal.ray_cpus`` CPUs for its engines; a job of several GPUs keeps one training process per GPU (at
    most ``rehearsal.rl_processes``: an RL job's count, esrepro.cluster.rl_job; an ESSA SFT takes at most
    ``rehearsal.processes`` of them, esrepro.cluster.launcher)."""
    processes = min(res.training_processes(), rehearsal.rl_processes) if res.gpu > 1 or res.processes else None
    ray = res.ray_cluster or res.nodes > 1
    return res.model_copy(update={
        "gpu": 0, "gpu_model": None, "cpus_per_gpu": None, "cpus_per_task": rehearsal.ray_cpus if ray else rehearsal.cpus,
        "mem_mb": rehearsal.mem_mb, "runtime": rehearsal.runtime, "nodes": 1, "processes": processes,
        "ray_cluster": ray})


def thin_method(method: dict, rehearsal: "Rehearsal") -> dict:
    """A registry method entry with its RL grid cut to the first value of every setting, no extra cells, and at
    most ``rehearsal.ray_cpus`` engines (one CPU each)."""
    out = {k: v for k, v in method.items() if k != "cells"}
    if isinstance(out.get("engines"), int):
        out["engines"] = min(out["engines"], rehearsal.ray_cpus)
    if isinstance(out.get("grid"), dict):
        out["grid"] = {k: list(v)[:1] for k, v in out["grid"].items()}
    return out


def rehearsal_registry(registry: dict[str, "ModelEntry"], rehearsal: "Rehearsal") -> dict[str, "ModelEntry"]:
    """Every registry entry as the rehearsal runs it (:func:`cpu_resources`, :func:`thin_method`, the dtype)."""
    out = {}
    for key, entry in registry.items():
        update: dict = {
            "resources": {rule: cpu_resources(r, rehearsal) for rule, r in entry.resources.items()},
            "methods": {name: thin_method(dict(m), rehearsal) for name, m in entry.methods.items()},
        }
        if rehearsal.dtype:
            update["dtype"] = rehearsal.dtype
        out[key] = entry.model_copy(update=update)
    return out


def rl_batch(settings: dict, world: int) -> dict[str, Any]:
    """The per-step batch fields of an RL run thinned to toy size so that ``world`` processes share it as they share
    the paper's (``settings``: the paper run's method settings; ``world``: the paper job's processes), and no more
    processes up to ``world`` do: one completion (GRPO) or two prompts (PPO) per process and step.

    GRPO keeps how the paper's batch divides: the accumulation steps where the paper's divide by ``world`` (then one
    group of 2 per micro-step and process), else the micro-batch (``world`` completions, in groups of
    gcd(num_generations, ``world``): a group spans processes where the paper's does). PPO keeps two mini-batches per
    step: ``2 x world`` prompts, mini-batches of ``world``, one response per pass."""
    from esrepro.rl.grpo_parallel import process_batch
    from esrepro.settings.methods import GRPO_ALGORITHMS

    algorithm = settings.get("algorithm")
    if algorithm in GRPO_ALGORITHMS:
        process_batch(settings, world)  # the paper's batch admits the paper's world (else a ValueError naming it)
        if int(settings.get("gradient_accumulation_steps", 1)) % world == 0:
            return {"per_device_train_batch_size": 2, "gradient_accumulation_steps": world, "num_generations": 2}
        group = math.gcd(int(settings["num_generations"]), world)
        return {"per_device_train_batch_size": world, "gradient_accumulation_steps": 1,
                "num_generations": group if group > 1 else world}
    if algorithm == "ppo":
        return {"prompts_per_step": 2 * world, "mini_batch_size": world, "micro_batch_size": 1,
                "rollout_batch_size": None}
    raise ValueError(f"algorithm {algorithm!r} is not an RL algorithm")


def rl_settings(p: "Pipeline", model: str, task: str, method: str, settings: Any) -> Any:
    """One RL run's settings as the rehearsal runs them: the paper job's training processes (the largest count the
    paper's per-step batch admits, up to the registry's, as esrepro.cluster.rl_job gives the paper's job; here at
    most ``rehearsal.rl_processes``), with its batch thinned by :func:`rl_batch` and its sample budget cut to
    :data:`RL_STEPS` steps (and its training problems raised to one rollout's, without ``repeat_prompts``). ``settings``: the run's settings, whose batch fields are the paper's (config/rehearsal.yaml
    leaves them alone)."""
    from esrepro.rl.budget import prompts_per_generation, samples_per_step
    from esrepro.rl.shares import largest_world
    from esrepro.settings.layers import ConfigError

    paper = settings.as_dict()
    most = p.resources(model, "train").training_processes()
    world = largest_world(paper, most)
    thinned = {**paper, **(rl_batch(paper, world) if world > 1 else {})}  # one process: the paper's batch
    examples = paper.get("train_examples")
    if examples and not paper.get("repeat_prompts"):  # as many problems as a rollout draws (rl.budget)
        thinned["train_examples"] = max(int(examples), prompts_per_generation(thinned))
    budget = paper.get("sample_budget")
    if budget:
        thinned["sample_budget"] = min(int(budget), RL_STEPS * samples_per_step(thinned))
    where = f"{task}/{model}/{method}"
    try:
        out = type(settings).model_validate(thinned)
    except ValueError as exc:
        raise ConfigError(f"rehearsal: {where}: its batch thinned for {world} processes is refused: {exc}") from None
    if largest_world(out.as_dict(), most) != world:  # rl_job would give the rehearsal's job another count
        raise ConfigError(f"rehearsal: {where}: the thinned batch {rl_batch(paper, world)} admits more than the "
                          f"paper job's {world} processes (of {most})")
    return out


#: The rules whose jobs train an RL run (esrepro.cluster.DATA_PARALLEL algorithms; workflow/rules/train.smk).
RL_RULES = ("train", "train_cell", "essa_grpo")


def rl_jobs(p: "Pipeline") -> list[tuple[str, str, str, str | None, str, int]]:
    """(task, model, method, cell, algorithm, training processes) of every RL job of the pipeline's DAG."""
    from esrepro.cluster import DATA_PARALLEL, layout
    from esrepro.jobs import plan_jobs

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


def rl_process_table(paper: "Pipeline", rehearsal: "Pipeline") -> str:
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
