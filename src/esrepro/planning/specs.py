"""What each rule hands its ``esrepro`` verb as ``--spec``: the resolved settings, as JSON.

A rule's params are what Snakemake tracks for reruns and what the manifest records, so a
spec holds exactly the settings that shape a job's output.
"""

from __future__ import annotations

import json
from typing import Any

from esrepro.pipeline import ESSA_SWEEPS, Pipeline
from esrepro.planning.claim_cost import claim_costs
from esrepro.planning.claim_plan import ClaimPlan
from esrepro.planning.plan import ExtrasPlan, Plan
from esrepro.planning.resume_cost import job_settings
from esrepro.rl.budget import es_sample_budget


def as_json(spec: dict[str, Any]) -> str:
    """Key-sorted JSON (stable, so an unchanged spec never triggers a rerun)."""
    return json.dumps(spec, sort_keys=True)


def data_spec(p: Pipeline, task: str) -> dict[str, Any]:
    """``data.<task>``: the source as written (unset keys left out) and the seed."""
    data = p.cfg.data[task]
    return {"source": data.source.model_dump(exclude_none=True), "seed": data.seed}


def build_data_spec(p: Pipeline, model: str) -> dict[str, Any]:
    """The data block of the task a built model is warm-started on (its generator options), if the config has one;
    with several warm-start tasks (``sft.tasks``), ``{"tasks": {task: data block}}``."""
    sft = p.model(model).build.sft
    if sft.tasks is not None:
        return {"tasks": {t: data_spec(p, t) for t in sft.tasks if t in p.cfg.data}}
    task = sft.task
    return data_spec(p, task) if task in p.cfg.data else {}


def model_spec(p: Pipeline, model: str) -> dict[str, Any]:
    """A registry entry without its per-method settings, resources and pin, so tuning never rebuilds a base model."""
    return p.model(model).model_dump(mode="json", exclude={"methods", "resources", "pinned"}, exclude_none=True)


def pinned_spec(p: Pipeline, model: str) -> dict[str, str] | None:
    """A built model's pinned build (``{path, sha256}``), or None when it has none."""
    pinned = p.model(model).pinned
    return None if pinned is None else pinned.model_dump(mode="json")


def method_spec(p: Pipeline, model: str, task: str, method: str, cell: str | None = None) -> dict[str, Any]:
    """One job's settings (an RL run's sample budget and priced ``resume_every: auto`` included:
    :func:`esrepro.planning.resume_cost.job_settings`) and the task's options."""
    return {**job_settings(p, model, task, method, cell).as_dict(), "task_options": p.task_options(task)}


def eval_spec(p: Pipeline, task: str) -> dict[str, Any]:
    """``evaluate.<task>`` resolved, and the task's options."""
    return {**p.eval_settings(task).model_dump(mode="json", exclude={"train_task"}),
            "task_options": p.task_options(task)}


def kl_spec(p: Pipeline, task: str) -> dict[str, Any]:
    """``kl.<task>`` resolved, and the task's options."""
    return {**p.kl_settings(task).as_dict(), "task_options": p.task_options(task)}


def essa_report_spec(p: Pipeline) -> dict[str, Any]:
    """The ESSA figures' target accuracy, each sweep's methods and every output stem."""
    study = p.essa_study()
    sweeps = {key: [m for _, m in p.essa_sweep(key)] for key, _, _ in ESSA_SWEEPS}
    plan = Plan(p)
    made, R = set(plan.essa_figures()), plan.paths
    stems = {"table": R.ESSA_TABLE}
    for key, stem in (("populations", R.ESSA_POPULATION), ("ranks", R.ESSA_RANK), ("engines", R.ESSA_ENGINES),
                      ("precisions", R.ESSA_PRECISION), ("wallclock", R.ESSA_WALLCLOCK), ("scaling", R.ESSA_SCALING)):
        if stem in made:
            stems[key] = stem
    scaling = study.scaling if study else None
    return {"target_accuracy": study.target_accuracy if study else None, "task": study.task if study else None,
            "scaling": {"task": scaling.task, "near_optimal": scaling.near_optimal} if scaling else None,
            "sweeps": sweeps, "stems": stems}


def es_variants_spec(p: Pipeline) -> dict[str, Any]:
    """The ES-variants table's runs: per Table 1 model, full-rank ES then each low-rank ES method, with its label,
    rank (None: full rank), the parameters its noise perturbs (all or linear), population, iterations, sigma, alpha
    and training samples scored (no runs when Table 1's task trains no ES variant)."""
    task, variants = p.cfg.report.table1.task, ExtrasPlan(Plan(p)).es_variants()
    runs = []
    for model in p.train_models(task) if variants else []:
        for method in ["es", *variants]:
            s = p.method_settings(model, task, method)
            rank, noise_on = getattr(s, "rank", None), getattr(s, "noise_on", "all")
            label = f"EGGROLL (rank {rank})" if rank is not None else \
                "ES, linear projections only" if noise_on == "linear" else "ES"
            runs.append({"model": model, "method": method, "rank": rank, "noise_on": noise_on, "label": label,
                         "population": s.population, "iterations": s.iterations, "sigma": s.sigma, "alpha": s.alpha,
                         "samples": es_sample_budget(s.as_dict())})
    return {"task": task, "split": p.cfg.report.table1.split, "runs": runs}


def claims_spec(p: Pipeline, rows: list[str] | None = None) -> dict[str, Any]:
    """The claims table's settings: the config's scale, Table 1's task and split, the conciseness study's reward
    cut-off and hacking margin, the ESSA study's targets, the math claims' model, and per row (all, or ``rows``) its
    selectors, the jobs that decide it, their requested GPU-hours and its own target."""
    t1 = p.cfg.report.table1
    conciseness = p.studies().get("conciseness")
    essa = p.essa_study()
    claims = ClaimPlan(Plan(p))
    selectors = claims.selectors()
    costs = {c.row: c for c in claim_costs(p) if rows is None or c.row in rows}
    return {"scale": p.cfg.scale, "task": t1.task, "split": t1.split,
            "reward_cutoff": conciseness.reward_cutoff if conciseness is not None else None,
            "hacking_margin": conciseness.hacking_margin if conciseness is not None else 0.2,
            "essa_target": essa.target_accuracy if essa is not None else None,
            "essa_grpo_target": (essa.grpo_target_accuracy if essa.grpo_target_accuracy is not None
                                 else essa.target_accuracy) if essa is not None else None,
            "math_model": claims.math_model(),
            "small_model": claims.small_model(),
            "es_variants": {r["method"]: r["label"] for r in es_variants_spec(p)["runs"] if r["rank"] is not None},
            "es_controls": {r["method"]: r["label"] for r in es_variants_spec(p)["runs"]
                            if r["rank"] is None and r["noise_on"] == "linear"},
            "claims": {row: {"select": selectors[row], "jobs": c.jobs, "gpu_jobs": c.gpu_jobs,
                             "gpu_hours": round(c.gpu_hours, 3), "target": c.target} for row, c in costs.items()}}
