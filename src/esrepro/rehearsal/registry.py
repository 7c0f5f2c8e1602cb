"""The model registry as the rehearsal runs it: the same models and layouts, on CPUs, with thinned RL grids."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from esrepro.settings.pipeline import Rehearsal
    from esrepro.settings.registry import ModelEntry, Resources


def cpu_resources(res: "Resources", rehearsal: "Rehearsal") -> "Resources":
    """One rule's resources on CPUs: no GPUs; a multi-node job keeps its Ray cluster on one node (scripts/ray-slurm)
    with ``rehearsal.ray_cpus`` CPUs for its engines; a job of several GPUs keeps several training processes (at
    most ``rehearsal.processes``)."""
    processes = min(res.training_processes(), rehearsal.processes) if res.gpu > 1 or res.processes else None
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
