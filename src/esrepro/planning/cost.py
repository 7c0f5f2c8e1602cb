"""What a config's run costs before it is submitted: jobs, GPUs, GPU-hours asked for and estimated, and disk, per
paper table or figure and in total (``esrepro cost CONFIG``).

Requested GPU-hours are what the jobs ask SLURM for: GPUs x nodes x runtime of one attempt x attempts (train jobs:
:func:`esrepro.planning.job_time.timed_job`; evaluation, KL, downloads, selections and parameter shifts:
:func:`esrepro.planning.job_time.timed_step`; other jobs: their registry entry). Estimated GPU-hours are the work of a job at
its settings (:mod:`esrepro.planning.scaling`, whose throughput assumptions for an H100 are stated there and in
docs/scaling.md); the CPU steps (downloads, selections, parameter shifts, data, reports) hold no GPU and count no
GPU-hours. Disk: the final checkpoints and kept snapshots in the registry dtype, and the resume states a run holds
while it runs.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from esrepro.config import read_config, validate_published
from esrepro.io import write_text
from esrepro.pipeline import ESSA_GRPO, Pipeline
from esrepro.planning import scaling as S
from esrepro.planning.jobs import SHARED, Job, plan_jobs
from esrepro.planning.load import load_pipeline
from esrepro.planning.scaling import STEP_RULES, job_cost, kept_snapshots, model_parameters, step_cost, weight_bytes
from esrepro.settings.methods import GRPO_ALGORITHMS

#: The registry entry of each rule's jobs without an estimate (esrepro.pipeline.models.Pipeline.resources).
REGISTRY_RULE = {"build_tiny": "build"}
TRAINING = ("train", "train_cell", "essa_grpo")
#: Resume-state bytes per parameter: ES the bf16 weights; PPO and GRPO float32 weights and two AdamW moments per
#: trained model (PPO: policy and critic); ESSA a few kilobytes (CMA-ES state).
RESUME_BYTES = {"es": 2, "eggroll": 2, "ppo": 24, **{a: 12 for a in GRPO_ALGORITHMS}, "essa": 0}
TOTAL = "Total"


@dataclass(frozen=True)
class Row:
    """One table or figure's jobs (or one job), and the total."""

    group: str
    jobs: int
    gpu_jobs: int
    max_gpus: int
    requested_gpu_h: float
    estimated_gpu_h: float  # jobs with an estimate only
    requested_estimated_gpu_h: float  # what those jobs ask for
    unestimated_gpu_h: float  # what jobs without an estimate ask for
    attempts: int  # SLURM attempts of the jobs, retries over a resume state included
    kept_tb: float  # final checkpoints and kept snapshots
    resume_tb: float  # resume states while the runs run

    @property
    def ratio(self) -> float | None:
        """Requested over estimated GPU-hours of the jobs with an estimate."""
        return self.requested_estimated_gpu_h / self.estimated_gpu_h if self.estimated_gpu_h else None


def job_row(p: Pipeline, job: Job) -> Row:
    """One job's cost."""
    w = job.wildcards
    if job.rule in TRAINING:
        return _training_row(p, job)
    if job.rule in STEP_RULES:
        return _step_row(p, job)
    if job.rule in REGISTRY_RULE:
        res = p.resources(w["model"], REGISTRY_RULE[job.rule])
        gpus = res.gpu * res.nodes
        return Row(job.group, 1, int(gpus > 0), gpus, gpus * res.runtime / 60, 0.0, 0.0, gpus * res.runtime / 60,
                   1, 0.0, 0.0)
    return Row(job.group, 1, 0, 0, 0.0, 0.0, 0.0, 0.0, 1, 0.0, 0.0)  # a report or data step: CPU, minutes


def _step_row(p: Pipeline, job: Job) -> Row:
    """An evaluation, KL, download, selection or parameter-shift job: its estimate and one attempt's request."""
    c = step_cost(p, job.rule, job.wildcards)
    requested = c.gpus * c.runtime_hours
    return Row(job.group, 1, int(c.gpus > 0), c.gpus, requested, c.gpus * c.hours, requested, 0.0, 1, 0.0, 0.0)


def _training_row(p: Pipeline, job: Job) -> Row:
    w = job.wildcards
    task, model, method, cell = w["task"], w["model"], w["method"], w.get("cell")
    c = job_cost(p, task, model, method, cell)
    weights = weight_bytes(p, model)
    study = p.essa_study()
    adapter = method == ESSA_GRPO and study is not None and study.grpo_trains == "adapter"
    snapshots = kept_snapshots(p, task, model, method, cell)
    resume = model_parameters(p, model) * RESUME_BYTES[c.algorithm] if not adapter else 0.0
    requested = c.gpus * c.runtime_hours * c.attempts
    return Row(job.group, 1, 1, c.gpus, requested, c.gpus * c.hours, requested, 0.0, c.attempts,
               weights * (1 + snapshots) / 1e12, resume / 1e12)


def add(group: str, rows: list[Row]) -> Row:
    """The sum of ``rows`` under ``group``."""
    return Row(group, sum(r.jobs for r in rows), sum(r.gpu_jobs for r in rows), max((r.max_gpus for r in rows),
               default=0), *(sum(getattr(r, f) for r in rows) for f in ("requested_gpu_h", "estimated_gpu_h",
                                                                         "requested_estimated_gpu_h",
                                                                         "unestimated_gpu_h", "attempts",
                                                                         "kept_tb", "resume_tb")))


def job_rows(p: Pipeline) -> list[tuple[Job, Row]]:
    """Every job of the config with its cost, each once."""
    return [(job, job_row(p, job)) for job in plan_jobs(p)]


def summary(p: Pipeline) -> list[Row]:
    """One row per paper table or figure, in the order of the plan (shared jobs last), then the total."""
    per_job = [r for _, r in job_rows(p)]
    groups = sorted(dict.fromkeys(r.group for r in per_job), key=lambda g: g == SHARED)
    rows = [add(g, [r for r in per_job if r.group == g]) for g in groups]
    return rows + [add(TOTAL, per_job)]


@dataclass(frozen=True)
class PaperFigure:
    """A compute or time figure the papers give (config/published.yaml's claims)."""

    where: str
    text: str
    minutes: float
    gpus: int

    @property
    def gpu_hours(self) -> float:
        return self.minutes * self.gpus / 60


def paper_figures(published: dict) -> list[PaperFigure]:
    """The published claims that give a time on a number of GPUs ("290 minutes on 8 GPUs")."""
    out = []
    for table in published.get("tables", {}).values():
        for claim in table.get("claims", []) if isinstance(table, dict) else []:
            m = re.search(r"(\d+(?:\.\d+)?) minutes on (\d+) GPUs", claim["text"])
            if m:
                out.append(PaperFigure(claim["where"], claim["text"], float(m.group(1)), int(m.group(2))))
    return out


COLUMNS = ("table or figure", "jobs", "GPU jobs", "GPUs (largest job)", "GPU-h requested", "GPU-h estimated",
           "requested / estimated", "GPU-h requested, no estimate", "SLURM attempts", "checkpoints + snapshots, TB",
           "resume states, TB")


def _cells(r: Row) -> list[str]:
    ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
    return [r.group, str(r.jobs), str(r.gpu_jobs), str(r.max_gpus), f"{r.requested_gpu_h:,.0f}",
            f"{r.estimated_gpu_h:,.0f}", ratio, f"{r.unestimated_gpu_h:,.0f}", str(r.attempts), f"{r.kept_tb:.2f}",
            f"{r.resume_tb:.2f}"]


def markdown(rows: list[Row], figures: list[PaperFigure]) -> str:
    """The rows as a Markdown table, then the papers' own figures and what the numbers assume."""
    head = "| " + " | ".join(COLUMNS) + " |\n|---|" + "---:|" * (len(COLUMNS) - 1) + "\n"
    body = "".join("| " + " | ".join(_cells(r)) + " |\n" for r in rows)
    total = rows[-1]
    out = head + body + (
        f"\nRequested: GPUs x nodes x runtime of one attempt x attempts, as the jobs ask SLURM. Estimated: the "
        f"jobs' work at the papers' sizes (esrepro.planning.scaling, upper bounds: every completion at "
        f"max_new_tokens) on H100s at {S.TRAIN_EFFICIENCY:.0%} of {S.PEAK_FLOPS / 1e12:.0f} TFLOP/s for training, "
        f"{S.GENERATION_EFFICIENCY['vllm']:.0%} (vLLM, at most {S.DECODE_CAP['vllm']:,} tokens/s) or "
        f"{S.GENERATION_EFFICIENCY['hf']:.0%} (transformers, at most {S.DECODE_CAP['hf']:,}) for generation, "
        f"{S.STARTUP_SECONDS // 60:.0f} minutes to start; assumed, not measured. Evaluation and KL: their prompts x "
        f"max_new_tokens (KL: sampled responses too, and both models' forward passes over them, for the final "
        f"weights and every kept snapshot) through transformers' generate at their batch sizes, each checkpoint "
        f"read at {S.READ_BYTES_PER_S / 1e9:g} GB/s. A training job asks for {S.MARGIN:g}x its estimate, in "
        f"attempts no longer than its registry runtime; an evaluation or KL job {S.MARGIN:g}x its estimate, at "
        f"least {S.STEP_FLOOR_MINUTES} minutes, in one attempt. CPU steps hold no GPU: downloads are estimated at "
        f"{S.DOWNLOAD_BYTES_PER_S / 1e6:g} MB/s, selections and parameter shifts at their checkpoint reads, each "
        f"asking for at least {S.STEP_FLOOR_MINUTES} minutes; data preparation, model builds and reports have no "
        f"estimate. GPU jobs without an estimate: {total.unestimated_gpu_h:,.0f} GPU-h at their registry request.\n")
    if figures:
        out += "\nThe papers' own figures:\n\n| where | what | GPUs | minutes | GPU-h |\n|---|---|---:|---:|---:|\n"
        out += "".join(f"| {f.where} | {f.text} | {f.gpus} | {f.minutes:g} | {f.gpu_hours:.1f} |\n" for f in figures)
    return out


def csv_text(rows: list[Row]) -> str:
    """The rows as CSV (unrounded)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([f.name for f in fields(Row)] + ["ratio"])
    for r in rows:
        writer.writerow([*astuple(r), "" if r.ratio is None else r.ratio])
    return buf.getvalue()


def cost(config: str, csv_out: str | None = None, markdown_out: str | None = None) -> int:
    """Print what ``config``'s run costs per paper table or figure and in total; write it as CSV or Markdown."""
    if not Path(config).is_file():
        raise FileNotFoundError(f"{config}: no such config file")
    p = load_pipeline(read_config(config), config)
    rows = summary(p)
    text = markdown(rows, paper_figures(validate_published(p.cfg.published)))
    print(text, end="")
    if csv_out:
        write_text(csv_out, csv_text(rows))
    if markdown_out:
        write_text(markdown_out, text)
    return 0


def within(rows: list[Row], low: float = 1.0, high: float = 2.0) -> bool:
    """Whether every row's requested GPU-hours are within [low, high] x its estimate (rows with one)."""
    return all(r.ratio is None or low <= r.ratio <= high for r in rows)
