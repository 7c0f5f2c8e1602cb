"""`esrepro cost`: every job of the paper's DAG counted once, requests within 1-2x the estimates, the outputs."""

from __future__ import annotations

import collections
import csv
import re
import subprocess
import sys

import pytest

from conftest import REPO
from esrepro.cli import main
from esrepro.config import load_yaml
from esrepro.planning.cost import TOTAL, add, csv_text, job_rows, markdown, summary, within
from esrepro.planning.jobs import plan_jobs
from esrepro.planning.load import load_pipeline
from esrepro.planning.scaling import schedule


@pytest.fixture(scope="module")
def paper():
    return load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=REPO)


@pytest.mark.slow
def test_jobs_are_the_dags_jobs(paper):
    """Per rule, as many jobs as `snakemake -n -F` schedules for the paper's config from nothing."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "--configfile", "config/paper.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = proc.stdout.split("Job stats:", 1)[1]
    dag = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)}
    jobs = plan_jobs(paper)
    assert dict(collections.Counter(j.rule for j in jobs)) == {k: v for k, v in dag.items() if k != "total"}
    assert len(jobs) == dag["total"]
    assert len({(j.rule, tuple(j.wildcards.items())) for j in jobs}) == len(jobs)  # each once


def test_tables_add_up_to_the_total(paper):
    rows = summary(paper)
    assert rows[-1].group == TOTAL and len({r.group for r in rows}) == len(rows)
    summed, total = add(TOTAL, rows[:-1]), rows[-1]
    for name in ("jobs", "gpu_jobs", "max_gpus", "attempts"):
        assert getattr(summed, name) == getattr(total, name), name
    for name in ("requested_gpu_h", "estimated_gpu_h", "unestimated_gpu_h", "kept_tb", "resume_tb"):
        assert getattr(summed, name) == pytest.approx(getattr(total, name), rel=1e-12), name
    assert rows[-1].jobs == len(plan_jobs(paper))


def test_requests_are_within_one_and_two_times_the_estimates(paper):
    pairs = job_rows(paper)
    rows = [r for _, r in pairs]
    estimated = [r for r in rows if r.estimated_gpu_h]
    gpu_jobs = [r for r in rows if r.gpu_jobs]
    assert estimated == gpu_jobs and len(gpu_jobs) == 628  # every GPU job has an estimate: train, evaluate, KL
    assert sum(j.rule in ("train", "train_cell", "essa_grpo") for j, r in pairs if r.estimated_gpu_h) == 292
    assert all(r.unestimated_gpu_h == 0 for r in rows)
    assert within(estimated) and within(summary(paper))
    total = summary(paper)[-1]
    assert total.estimated_gpu_h <= total.requested_gpu_h <= 2 * total.estimated_gpu_h
    assert all(r.attempts <= 3 for r in rows)  # the SLURM profile's retries: 2


@pytest.mark.parametrize("hours", [0.34, 0.9, 1.0, 3.3, 7.9, 40.0, 61.1, 99.3, 389.0])
def test_schedule(hours):
    minutes, n = schedule(hours, ceiling=10080 if hours > 200 else 2880)
    assert hours * 60 <= minutes * n <= 2 * hours * 60 and minutes <= (10080 if hours > 200 else 2880)


def test_outputs_are_written(tmp_path, capsys):
    assert main(["cost", "config/paper.yaml", "--csv", str(tmp_path / "c.csv"),
                 "--markdown", str(tmp_path / "out" / "c.md")]) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "out" / "c.md").read_text() == printed and "| Total | 756 |" in printed
    assert "290 minutes on 8 GPUs" in printed
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    assert rows[-1]["group"] == TOTAL and int(rows[-1]["jobs"]) == 756


def test_a_bad_path_is_one_clear_error(tmp_path, capsys):
    assert main(["cost", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such config file" in capsys.readouterr().err


def test_docs_show_the_commands_output(paper):
    from esrepro.config import validate_published
    from esrepro.planning.cost import paper_figures

    text = markdown(summary(paper), paper_figures(validate_published(REPO / "config" / "published.yaml")))
    assert text in (REPO / "docs" / "scaling.md").read_text(), \
        "docs/scaling.md's cost table is stale: paste `esrepro cost config/paper.yaml` into it"
    assert csv_text(summary(paper)).count("\n") == len(summary(paper)) + 1


def test_steps_ask_for_their_estimate_at_least_a_floor(paper):
    """Evaluation and KL jobs ask for 1.25x their estimate in one attempt; CPU steps for at least 15 minutes;
    every runtime at most the registry's."""
    from esrepro.planning.job_time import timed_step
    from esrepro.planning.scaling import STEP_FLOOR_MINUTES, STEP_RULES, step_cost

    steps = [j for j in plan_jobs(paper) if j.rule in STEP_RULES]
    assert {j.rule for j in steps} == set(STEP_RULES)
    for job in steps:
        c, res = step_cost(paper, job.rule, job.wildcards), timed_step(paper, job.rule, job.wildcards)
        ceiling = paper.resources(job.wildcards["model"], STEP_RULES[job.rule]).runtime
        assert STEP_FLOOR_MINUTES <= res.runtime <= ceiling and res.runtime == round(c.runtime_hours * 60)
        assert (c.gpus > 0) == (job.rule in ("evaluate", "kl")), job
        if c.gpus:
            assert 1 <= c.runtime_hours / c.hours <= 2, (job, c)


def test_kl_scores_every_kept_snapshot(paper):
    """A conciseness run keeps every 200th of its 1,000 iterations (v2 App. A.2): its KL job scores five checkpoints."""
    from esrepro.planning.scaling import kept_snapshots, kl_seconds

    run = next(j.wildcards for j in plan_jobs(paper) if j.rule == "kl" and j.wildcards["method"].startswith("es_"))
    assert kept_snapshots(paper, run["task"], run["model"], run["method"]) == 4
    _, tokens = kl_seconds(paper, run["task"], run["model"], run["method"])
    _, base = kl_seconds(paper, run["task"], run["model"], "base")
    assert tokens == 5 * base


def test_split_rows_count_published_sizes(paper):
    from esrepro.planning.scaling import split_rows

    assert [split_rows(paper, t, "test") for t in ("countdown", "gsm8k", "math500", "minerva", "olympiad_bench",
                                                   "aime24", "amc23", "sudoku")] == [2000, 1319, 500, 272, 675, 30,
                                                                                     83, 200]
    assert split_rows(paper, "countdown", "test", limit=200) == 200
