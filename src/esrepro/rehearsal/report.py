"""The rehearsal's report: every rule of the paper's DAG, whether its jobs ran, their seconds and their work.

Seconds come from the cluster's own records: SLURM's (``scontrol show job``: run time and state of every job the
cluster ran) for submitted jobs, Snakemake's (``.snakemake/metadata``) for the jobs it ran on the submitting host
(``localrule``). The work is read from the run's outputs: training logs, evaluation metrics, KL estimates.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from esrepro.io import read_jsonl, write_text

#: Columns of the report, in order.
COLUMNS = ("rule", "jobs_paper", "jobs_planned", "jobs_ran", "where", "seconds", "seconds_max", "optimiser_steps",
           "scored_samples", "prompts_evaluated", "tokens_sampled", "ran")
#: Work read from the run's outputs, per rule: (glob under the workspace, what it counts).
WORK_FILES = {
    "train": "results/runs/*/*/*/seed*/log.jsonl",
    "train_cell": "results/runs/*/*/*/grid/*/seed*/log.jsonl",
    "essa_grpo": "results/runs/*/*/essa_grpo/seed*/log.jsonl",
    "evaluate": "results/eval/*/*/*/seed*/*/metrics.json",
    "kl": "results/kl/*/*/*/seed*/kl.json",
}


def dag_jobs(config_files: Iterable[str], snakemake: str = "snakemake", cwd: str | Path = ".",
             env: dict | None = None, targets: Iterable[str] = ()) -> dict[str, int]:
    """Jobs per rule of a config's whole DAG (or of ``targets``'), from Snakemake's own dry run
    (``snakemake -n --forceall``)."""
    targets = list(targets)
    cmd = [snakemake, "-n", "--quiet", "rules", "--forceall", "--configfile", *config_files,
           *(["--", *targets] if targets else [])]
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
    """One job that ended: its rule, seconds, where it ran and whether it succeeded."""

    rule: str
    seconds: float
    where: str = "slurm"
    ok: bool = True


def _seconds(text: str) -> float:
    """SLURM's ``[D-]HH:MM:SS`` as seconds."""
    days, _, clock = text.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return ((int(days) if days else 0) * 24 + h) * 3600 + m * 60 + s


def slurm_jobs(scontrol_output: str, workdir: str | Path) -> list[Job]:
    """The jobs Snakemake submitted from ``workdir`` that ended, from ``scontrol show job -o`` (one job a line;
    Snakemake's SLURM executor writes each job's log under .snakemake/slurm_logs/rule_<rule>/)."""
    jobs = []
    for line in scontrol_output.splitlines():
        rec = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        m = re.search(r"/\.snakemake/slurm_logs/rule_([^/]+)/", rec.get("StdOut", ""))
        if not m or rec.get("WorkDir") != str(Path(workdir).resolve()):
            continue
        state = rec.get("JobState", "")
        if state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            continue
        jobs.append(Job(m.group(1), _seconds(rec.get("RunTime", "0:0:0")), "slurm", state == "COMPLETED"))
    return jobs


def _decode(rel: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(rel.replace("/", "")).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def local_jobs(metadata_dir: str | Path, prefix: str, rules: Iterable[str], since: float = 0.0) -> list[Job]:
    """The jobs of ``rules`` Snakemake ran itself (on the submitting host) since ``since`` (epoch seconds), with
    outputs under ``prefix``, from its metadata folder: one record per output file, a job's outputs sharing its
    hash; a job's seconds run from its first output's start to its last one's end."""
    wanted, spans = set(rules), {}
    root = Path(metadata_dir)
    for f in sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []:
        path = _decode(str(f.relative_to(root)))
        if path is None or not path.startswith(prefix):
            continue
        try:
            rec = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if (rec.get("rule") not in wanted or rec.get("incomplete") or rec.get("starttime") is None
                or float(rec["starttime"]) < since):
            continue
        key = (rec["rule"], rec.get("job_hash"))
        lo, hi = spans.get(key, (float(rec["starttime"]), float(rec["endtime"])))
        spans[key] = (min(lo, float(rec["starttime"])), max(hi, float(rec["endtime"])))
    return [Job(rule, max(0.0, hi - lo), "local") for (rule, _), (lo, hi) in spans.items()]


def local_rules(snakemake_log: str) -> set[str]:
    """The rules whose jobs a Snakemake run executed itself (it prints ``localrule <name>:`` for each)."""
    return set(re.findall(r"^localrule (\S+):", snakemake_log, re.M))


def _problems(row: dict) -> int:
    """Problems each member or candidate of a training log row was scored on (ESSA logs their ids)."""
    problems = row.get("problems", 1)
    return len(problems) if isinstance(problems, list) else int(problems or 1)


def outputs_work(workspace: str | Path) -> dict[str, dict[str, float]]:
    """Per rule, what its jobs did, read from their outputs under ``workspace``: optimiser steps (log rows),
    scored samples (members x problems), prompts evaluated, tokens sampled for KL."""
    root, work = Path(workspace), {}
    for rule, pattern in WORK_FILES.items():
        files = [f for f in root.glob(pattern)
                 if rule != "train" or ("/grid/" not in f.as_posix() and "/essa_grpo/" not in f.as_posix())]
        totals: dict[str, float] = {}
        for f in files:
            if f.name == "log.jsonl":
                log = read_jsonl(f)
                totals["optimiser_steps"] = totals.get("optimiser_steps", 0) + len(log)
                scored = sum(len(r.get("rewards", [])) * _problems(r) for r in log)
                totals["scored_samples"] = totals.get("scored_samples", 0) + scored
            elif f.name == "metrics.json":
                totals["prompts_evaluated"] = totals.get("prompts_evaluated", 0) + json.loads(f.read_text())["n"]
            elif f.name == "kl.json":
                kl = json.loads(f.read_text())
                totals["tokens_sampled"] = totals.get("tokens_sampled", 0) + round(
                    (kl.get("n_responses") or 0) * (kl.get("mean_tokens") or 0))
        work[rule] = {k: v for k, v in totals.items() if v}
    return work


def report_rows(paper: dict[str, int], planned: dict[str, int], jobs: list[Job],
                work: dict[str, dict[str, float]] | None = None, finished: bool = False) -> list[dict[str, Any]]:
    """One row per rule of the paper's DAG (and any the rehearsal planned besides) with its jobs' totals. A rule
    ran when as many of its jobs succeeded as were planned; Snakemake's own target rule (``all``) ran when the
    whole run ``finished``."""
    rows = []
    for rule in list(paper) + [r for r in planned if r not in paper]:
        mine = [j for j in jobs if j.rule == rule and j.ok]
        failed = sum(1 for j in jobs if j.rule == rule and not j.ok)
        done = len(mine) + (planned.get(rule, 0) if rule == "all" and finished else 0)
        row: dict[str, Any] = {
            "rule": rule, "jobs_paper": paper.get(rule, 0), "jobs_planned": planned.get(rule, 0), "jobs_ran": done,
            "where": "/".join(sorted({j.where for j in mine})) or ("local" if done else ""),
            "seconds": round(sum(j.seconds for j in mine), 1),
            "seconds_max": round(max((j.seconds for j in mine), default=0.0), 1), **(work or {}).get(rule, {})}
        row["ran"] = ("failed" if failed and done < planned.get(rule, 0) else
                      "yes" if done and done >= planned.get(rule, 0) else "partly" if done else "no")
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
