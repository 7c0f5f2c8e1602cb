"""What each claim of the claims table costs to decide: the jobs behind the files its rule reads (the runs, their
training and start points, the evaluations and KL measurements, the models and data) and their requested GPU-hours,
from the same cost model as ``esrepro cost`` (:func:`esrepro.planning.cost.job_row`). ``esrepro claim-costs CONFIG`` lists
them, cheapest first, each with its target: ``snakemake <target>`` runs only that claim's jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from esrepro.config import read_config
from esrepro.io import write_text
from esrepro.pipeline import BASE, ESSA_GRPO, ESSA_REF, Pipeline
from esrepro.planning.claim_plan import ClaimPlan
from esrepro.planning.cost import TRAINING, job_row
from esrepro.planning.jobs import Job, plan_jobs
from esrepro.planning.load import load_pipeline
from esrepro.planning.plan import Plan
from esrepro.report.claims.catalogue import claim_of

TrainKey = tuple[str, str, str, int]  # (training task, model, method, seed)


@dataclass(frozen=True)
class ClaimCost:
    """The jobs that decide one row and what they ask SLURM for."""

    row: str
    jobs: int
    gpu_jobs: int
    gpu_hours: float
    target: str


def _training_keys(p: Pipeline, task: str, model: str, method: str, seed: int) -> set[TrainKey]:
    """The training runs behind a run of ``method`` on ``task``: the run itself, the run a snapshot is kept from,
    the run it starts from (``start_from``) and, for ESSA's GRPO baseline, the reference run whose SFT start it
    takes; recursively."""
    if method == BASE:
        return set()
    train = p.train_task_of(task) if task not in p.essa_tasks() else task
    snap = p.snapshots(train).get(method) if train in p.cfg.train else None
    if snap is not None:
        return _training_keys(p, train, model, snap.method, seed)
    out = {(train, model, method, seed)}
    start = p.start_of(model, train, method) if train in p.cfg.train else None
    if start is not None:
        out |= _training_keys(p, train, model, start.method, seed)
    if method == ESSA_GRPO:
        out |= _training_keys(p, train, model, ESSA_REF, seed)
    return out


def row_jobs(p: Pipeline, claims: ClaimPlan, row: str, jobs: list[Job] | None = None) -> list[Job]:
    """The jobs whose outputs a row's rule reads, directly or through what they need."""
    jobs = plan_jobs(p) if jobs is None else jobs
    evals, kls, training, models, tasks = set(), set(), set(), set(), set()
    for kind, task, model, method, seed in claims.keys(row):
        models.add(model)
        tasks.add(task)
        if kind == "evals":
            evals.add((task, model, method, seed))
        elif kind == "kl":
            kls.add((task, model, method, seed))
        training |= _training_keys(p, task, model, method, seed)
    tasks |= {t for t, _, _, _ in training}
    models |= {m for _, m, _, _ in training}
    out = []
    for job in jobs:
        w = job.wildcards
        key = (w.get("task"), w.get("model"), w.get("method"), int(w["seed"]) if "seed" in w else None)
        if (job.rule in (*TRAINING, "select_rl") and key in training) or (job.rule == "evaluate" and key in evals) \
                or (job.rule == "kl" and key in kls) \
                or (job.rule in ("fetch_model", "build_tiny") and w.get("model") in models) \
                or (job.rule in ("download_data", "prepare_data") and w.get("task") in tasks):
            out.append(job)
    return out


def claim_costs(p: Pipeline) -> list[ClaimCost]:
    """Every planned row's cost, in the table's order."""
    plan = Plan(p)
    claims, jobs = ClaimPlan(plan), plan_jobs(p)
    out = []
    for row in claims.rows():
        rows = [job_row(p, j) for j in row_jobs(p, claims, row, jobs)]
        out.append(ClaimCost(row, len(rows), sum(r.gpu_jobs for r in rows), sum(r.requested_gpu_h for r in rows),
                             claims.target(row)))
    return out


#: The claims Table 1's runs decide (their rows' keys): what ``claims.seeds`` multiplies.
TABLE1_CLAIMS = ("es_improves_base", "es_beats_rl", "es_ahead_throughout", "es_sample_efficiency_v1")


def table1_cost(p: Pipeline) -> ClaimCost | None:
    """Every job Table 1's claims read, each counted once (None: the config plans none of them)."""
    plan = Plan(p)
    claims, jobs = ClaimPlan(plan), plan_jobs(p)
    rows = [r for r in claims.rows() if claim_of(r).key in TABLE1_CLAIMS]
    if not rows:
        return None
    picked = {id(j): j for r in rows for j in row_jobs(p, claims, r, jobs)}
    costs = [job_row(p, j) for j in picked.values()]
    return ClaimCost("table1", len(costs), sum(c.gpu_jobs for c in costs), sum(c.requested_gpu_h for c in costs),
                     "")


def table1_line(p: Pipeline) -> str:
    """Table 1's claims together, at this config's ``claims.seeds``, in one line."""
    c = table1_cost(p)
    if c is None:
        return "Table 1's claims: none planned\n"
    k = max(p.cfg.claims.seeds, len(p.seeds))
    return (f"Table 1's claims together ({k} seed{'s' if k > 1 else ''} a run; each job once): "
            f"{c.jobs} jobs, {c.gpu_jobs} GPU jobs, {c.gpu_hours:,.0f} GPU-h requested\n")


def markdown(costs: list[ClaimCost], limit: int | None = None) -> str:
    """The rows' costs as a Markdown table, cheapest first (the ``limit`` cheapest, when given)."""
    lines = ["| claim | where | jobs | GPU jobs | GPU-h requested | target |", "|---|---|---:|---:|---:|---|"]
    for c in sorted(costs, key=lambda c: (c.gpu_hours, c.jobs, c.row))[:limit]:
        claim = claim_of(c.row)
        title = claim.title + (f": {c.row.split('.', 1)[1]}" if claim.per_model else "")
        lines.append(f"| {title} | {claim.where} | {c.jobs} | {c.gpu_jobs} | {c.gpu_hours:,.0f} | `{c.target}` |")
    return "\n".join(lines) + "\n"


def main(config: str, markdown_out: str | None = None) -> int:
    """Print what deciding each claim of ``config``'s claims table costs, cheapest first."""
    if not Path(config).is_file():
        raise FileNotFoundError(f"{config}: no such config file")
    p = load_pipeline(read_config(config), config)
    text = markdown(claim_costs(p))
    print(text, end="")
    print("\n" + table1_line(p), end="")
    if markdown_out:
        write_text(markdown_out, text)
    return 0
