"""The runtime each job asks SLURM for, from its estimated time at the paper's sizes (esrepro.planning.scaling): 1.25x
the estimate, in attempts no longer than the registry's ``runtime``, which is the ceiling of one attempt."""

from __future__ import annotations

from typing import Any

from esrepro.models.architecture import ArchitectureError
from esrepro.pipeline import Pipeline
from esrepro.planning.cluster import layout, slurm_resource
from esrepro.planning.scaling import STEP_RULES, job_cost, step_cost
from esrepro.settings.registry import Resources


def timed_job(p: Pipeline, task: str, model: str, method: str, cell: str | None = None) -> Resources:
    """A train job's :func:`layout` with its runtime set from its estimated time (esrepro.planning.scaling.schedule): the
    registry's ``runtime`` is only the ceiling of one attempt."""
    if p.cfg.rehearsal is not None:  # toy budgets on CPUs: the paper-size estimate does not apply
        return layout(p, task, model, method, cell)
    minutes = round(job_cost(p, task, model, method, cell).runtime_hours * 60)
    return layout(p, task, model, method, cell).model_copy(update={"runtime": minutes})


def train_resource(p: Pipeline, task: str, model: str, method: str, key: str, cell: str | None = None) -> Any:
    """One Snakemake resource of a train, grid-cell or GRPO-baseline job (:func:`slurm_resource`); its runtime from
    its estimate (:func:`timed_job`)."""
    if key == "runtime":
        return timed_job(p, task, model, method, cell).runtime
    return slurm_resource(layout(p, task, model, method, cell), key)


def timed_step(p: Pipeline, rule: str, wildcards: dict) -> Resources:
    """The registry resources of an evaluation, KL, download, selection or parameter-shift job (``rule``: a key of
    esrepro.planning.scaling.STEP_RULES) with its runtime set from its estimate (esrepro.planning.scaling.step_cost); the registry's
    ``runtime`` is the ceiling."""
    res = p.resources(wildcards["model"], STEP_RULES[rule])
    if p.cfg.rehearsal is not None:  # toy budgets on CPUs: the paper-size estimate does not apply
        return res
    try:
        minutes = round(step_cost(p, rule, wildcards).runtime_hours * 60)
    except ArchitectureError:  # a model whose config cannot be built: named, never priced at the ceiling
        raise
    except ValueError:  # a split whose size only its prepared data can tell: the registry's runtime
        return res
    return res.model_copy(update={"runtime": minutes})
