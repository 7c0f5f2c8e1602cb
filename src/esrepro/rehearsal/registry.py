"""The model registry as the rehearsal runs it: the same models and layouts, on CPUs, with thinned RL grids; and
an RL run's per-step batch thinned for the paper job's training processes (:func:`rl_batch`).

Pure functions of a registry and the rehearsal's settings, below the pipeline: the rehearsal transforms the config
and the registry (:mod:`esrepro.rehearsal.transform`) before the pipeline that runs is built.
"""

from __future__ import annotations

import math
from typing import Any

from esrepro.rl.grpo_parallel import process_batch
from esrepro.settings.methods import GRPO_ALGORITHMS
from esrepro.settings.pipeline import Rehearsal
from esrepro.settings.registry import ModelEntry, Resources


def cpu_resources(res: Resources, rehearsal: Rehearsal) -> Resources:
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


def thin_method(method: dict, rehearsal: Rehearsal) -> dict:
    """A registry method entry with its RL grid cut to the first value of every setting, no extra cells, and at
    most ``rehearsal.ray_cpus`` engines (one CPU each)."""
    out = {k: v for k, v in method.items() if k != "cells"}
    if isinstance(out.get("engines"), int):
        out["engines"] = min(out["engines"], rehearsal.ray_cpus)
    if isinstance(out.get("grid"), dict):
        out["grid"] = {k: list(v)[:1] for k, v in out["grid"].items()}
    return out


def rehearsal_registry(registry: dict[str, ModelEntry], rehearsal: Rehearsal) -> dict[str, ModelEntry]:
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
