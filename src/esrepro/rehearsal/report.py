"""The rehearsal's report: every rule of the paper's DAG, whether its jobs ran, their seconds and their work.

Seconds come from Snakemake's own job records (``.snakemake/metadata``: start and end of every job, kept per
output file); the work from each job's outputs (training logs, evaluation metrics, KL estimates).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from esrepro.io import read_jsonl, write_text

#: Columns of the report, in order.
COLUMNS = ("rule", "jobs_paper", "jobs_planned", "jobs_ran", "seconds", "seconds_max", "optimiser_steps",
           "scored_samples", "prompts_evaluated", "tokens_sampled", "ran")


def dag_jobs(config_files: Iterable[str], snakemake: str = "snakemake", cwd: str | Path = ".",
             env: dict | None = None) -> dict[str, int]:
    """Jobs per rule of a config's whole DAG, from Snakemake's own dry run (``snakemake -n``)."""
    cmd = [snakemake, "-n", "--quiet", "rules", "--forceall", "--configfile", *config_files]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return job_stats(out.stdout + out.stderr)


def job_stats(text: str) -> dict[str, int]:
    """The first "Job stats" table of a Snakemake output: rule -> jobs (without the total)."""
    rows: dict[str, int] = {}
    started = False
    for line in text.splitlines():
        if line.startswith("job ") and "count" in line:
            started = True
            continue
        if not started or line.startswith("---"):
            continue
        m = re.fullmatch(r"(\S+)\s+(\d+)", line.strip())
        if not m:
            if rows:
                break
            continue
        if m.group(1) == "total":
            break
        rows[m.group(1)] = int(m.group(2))
    if not rows:
        raise ValueError("no 'Job stats' table in the Snakemake output")
    return rows


@dataclass
class Job:
    """One finished job, as Snakemake recorded it."""

    rule: str
    seconds: float
    outputs: list[str] = field(default_factory=list)
    slurm_job: str | None = None


def _decode(rel: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(rel.replace("/", "")).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def finished_jobs(metadata_dir: str | Path, prefix: str = "") -> list[Job]:
    """Every complete job whose outputs lie under ``prefix``, from Snakemake's metadata folder."""
    jobs: dict[tuple, Job] = {}
    root = Path(metadata_dir)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        path = _decode(str(f.relative_to(root)))
        if path is None or not path.startswith(prefix):
            continue
        try:
            rec = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if rec.get("incomplete") or rec.get("starttime") is None or rec.get("endtime") is None:
            continue
        key = (rec.get("rule"), rec.get("job_hash"), rec["starttime"])
        job = jobs.setdefault(key, Job(rec["rule"], float(rec["endtime"]) - float(rec["starttime"]),
                                       slurm_job=rec.get("external_jobid")))
        job.outputs.append(path)
    return list(jobs.values())


def job_work(job: Job) -> dict[str, float]:
    """What one job did, read from its outputs: optimiser steps, scored samples, prompts, sampled tokens."""
    work: dict[str, float] = {}
    for out in job.outputs:
        p = Path(out)
        log_file = p if p.name == "log.jsonl" else p / "log.jsonl"
        if log_file.is_file():
            log = read_jsonl(log_file)
            work["optimiser_steps"] = work.get("optimiser_steps", 0) + len(log)
            scored = sum(len(r.get("rewards", [])) * r.get("problems", 1) for r in log)
            if scored:
                work["scored_samples"] = work.get("scored_samples", 0) + scored
        if p.name == "metrics.json" and p.is_file():
            work["prompts_evaluated"] = work.get("prompts_evaluated", 0) + json.loads(p.read_text()).get("n", 0)
        if p.name == "kl.json" and p.is_file():
            kl = json.loads(p.read_text())
            work["tokens_sampled"] = work.get("tokens_sampled", 0) + round(
                (kl.get("n_responses") or 0) * (kl.get("mean_tokens") or 0))
        if p.name == "manifest.json" and p.is_file() and "scored_samples" not in work:
            budget = (json.loads(p.read_text()).get("budget") or {}).get("sample_budget")
            if budget:
                work["scored_samples"] = budget
    return work


def report_rows(paper: dict[str, int], planned: dict[str, int], jobs: list[Job]) -> list[dict[str, Any]]:
    """One row per rule of the paper's DAG (and any the rehearsal ran besides), with the totals of its jobs."""
    rows = []
    for rule in list(paper) + [r for r in planned if r not in paper]:
        mine = [j for j in jobs if j.rule == rule]
        row: dict[str, Any] = {"rule": rule, "jobs_paper": paper.get(rule, 0), "jobs_planned": planned.get(rule, 0),
                               "jobs_ran": len(mine), "seconds": round(sum(j.seconds for j in mine), 1),
                               "seconds_max": round(max((j.seconds for j in mine), default=0.0), 1)}
        for j in mine:
            for k, v in job_work(j).items():
                row[k] = row.get(k, 0) + v
        row["ran"] = "yes" if mine and len(mine) >= planned.get(rule, 0) else ("partly" if mine else "no")
        rows.append({c: row.get(c, "") for c in COLUMNS})
    return rows


def write_report(rows: list[dict[str, Any]], stem: str | Path, wall_seconds: float | None = None) -> str:
    """The report as ``stem``.csv and ``stem``.md (atomically); returns the Markdown."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    write_text(f"{stem}.csv", frame.to_csv(index=False))
    ran = sum(r["ran"] == "yes" for r in rows)
    lines = [f"Rules of the paper's DAG that ran: {ran} of {len(rows)}; jobs: "
             f"{sum(int(r['jobs_ran'] or 0) for r in rows)}; job-seconds: "
             f"{sum(float(r['seconds'] or 0) for r in rows):.0f}"
             + (f"; wall clock: {wall_seconds / 60:.1f} min" if wall_seconds is not None else ""), ""]
    lines.append(frame.to_markdown(index=False))
    md = "\n".join(lines) + "\n"
    write_text(f"{stem}.md", md)
    return md
