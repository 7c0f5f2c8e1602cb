"""The rehearsal of the paper's run: config/rehearsal.yaml is config/paper.yaml with only the CPU switch and
thinned budgets; its DAG has every rule of the paper's; the report reads Snakemake's own job records."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

from conftest import REPO
from esrepro.config import workflow_config
from esrepro.planning.load import load_pipeline
from esrepro.planning.plan import Plan
from esrepro.rehearsal.report import (
    dag_jobs,
    job_stats,
    local_jobs,
    local_rules,
    outputs_work,
    report_rows,
    slurm_jobs,
    write_report,
)
from esrepro.rehearsal.run import SLICE_METHODS, SLICE_MODELS, slice_targets

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def _pipeline(*files):
    raw, source = workflow_config(list(files), {})
    return load_pipeline(raw, source, REPO)


def test_rehearsal_keeps_the_papers_models_and_layouts_on_cpus():
    paper, rehearsal = _pipeline("config/paper.yaml"), _pipeline("config/rehearsal.yaml")
    for key, entry in rehearsal.registry.items():
        real = paper.registry[key]
        assert (entry.hub_id, entry.revision, entry.family, entry.dtype) == (real.hub_id, real.revision,
                                                                             real.family, real.dtype)
        for rule, res in entry.resources.items():
            was = real.resources[rule]
            assert res.gpu == 0 and res.nodes == 1
            assert res.ray_cluster == (was.ray_cluster or was.nodes > 1), (key, rule)
            assert res.cpus_per_task == (2 if res.ray_cluster else 1), (key, rule)  # a CPU per engine of its cluster
            if was.gpu > 1:  # one gloo process per GPU, up to 8 (an RL job's; an ESSA SFT takes 2 of them)
                assert res.training_processes() == min(was.training_processes(), 8), (key, rule)
    # the 7B's ES layout (2 nodes x 4 GPUs) becomes a Ray cluster on one node, under scripts/ray-slurm
    assert paper.registry["qwen2.5-7b-instruct"].resources["train_es"].nodes == 2
    assert rehearsal.registry["qwen2.5-7b-instruct"].resources["train_es"].ray_cluster
    # one grid cell per model and method, and no extra cells
    grid = rehearsal.registry["qwen2.5-0.5b-instruct"].methods["grpo8"]
    assert "cells" not in grid and all(len(v) == 1 for v in grid["grid"].values())
    # at most a CPU's worth of engines per job: the 32B's 16 ESSA engines become 2
    assert paper.registry["qwen2.5-32b"].methods["essa"]["engines"] == 16
    assert rehearsal.registry["qwen2.5-32b"].methods["essa"]["engines"] == 2
    assert rehearsal.cfg.scale == "rehearsal" and rehearsal.cfg.workspace == "work/rehearsal"
    # the paper's engines, sharding and vLLM settings are kept
    assert rehearsal.cfg.defaults.es["backend"] == "vllm" and rehearsal.cfg.defaults.grpo["sharding"] == "fsdp"
    assert rehearsal.cfg.methods["grpo8"]["use_vllm"] is True


@pytest.mark.slow
def test_rehearsal_dag_has_every_rule_of_the_papers():
    paper, rehearsal = dag_jobs(["config/paper.yaml"], SNAKEMAKE, REPO), dag_jobs(["config/rehearsal.yaml"],
                                                                                 SNAKEMAKE, REPO)
    assert set(paper) == set(rehearsal), set(paper) ^ set(rehearsal)
    assert sum(rehearsal.values()) < sum(paper.values()) / 3
    # both families train with every Table 1 method
    plan = Plan(_pipeline("config/rehearsal.yaml"))
    families = {(plan.p.model(model).family, method) for model, method, _ in plan.train_runs("countdown")}
    assert {f for f, _ in families} == {"qwen2", "llama"}
    assert {m for _, m in families} >= {"es", "ppo", "grpo8", "grpo30", "grpov", "drgrpov"}


@pytest.mark.slow
def test_the_slice_reaches_every_task_of_the_dag_with_one_cheap_target_each():
    p = _pipeline("config/rehearsal.yaml")
    targets = slice_targets(p)
    assert all(t.startswith("work/rehearsal/") for t in targets)
    whole = dag_jobs(["config/rehearsal.yaml"], SNAKEMAKE, REPO)
    stats = dag_jobs(["config/rehearsal.yaml"], SNAKEMAKE, REPO, targets=targets)
    # every task of the DAG: each of its downloads and preparations, and an evaluation of each evaluated task
    data = ("download_data", "prepare_data")
    assert sum(stats.get(r, 0) for r in data) == sum(whole[r] for r in data) == len(Plan(p).datasets())
    for task in p.evaluated_tasks():
        assert any(t.startswith(f"work/rehearsal/results/eval/{task}/") for t in targets), task
    # cheaply: training only in the Countdown core (ES and one GRPO cell per model), one evaluation of every other
    # task, on a slice model where the task evaluates one
    core = len(SLICE_MODELS) * len(SLICE_METHODS)
    assert stats["train"] == stats["train_cell"] == len(SLICE_MODELS) and stats["kl"] == core
    assert stats["evaluate"] == core + len(p.evaluated_tasks()) - 1
    assert "work/rehearsal/results/eval/gsm8k/qwen2.5-0.5b-instruct/base/seed0/test/metrics.json" in targets
    assert {"fetch_model", "download_data", "prepare_data", "select_rl"} <= set(stats)
    assert stats["fetch_model"] == 5 and sum(stats.values()) < 45  # the slice models, the math, Sudoku, ARC ones


def test_job_stats_reads_the_first_table():
    text = "Job stats:\njob          count\n---------  -------\nfetch_model      7\nall    1\ntotal  8\n"
    assert job_stats(text) == {"fetch_model": 7, "all": 1}
    with pytest.raises(ValueError, match="Job stats"):
        job_stats("nothing to do")


def test_report_reads_slurms_and_snakemakes_job_records_and_each_rules_work(tmp_path):
    repo = tmp_path / "repo"
    work = repo / "work/rehearsal"
    run = work / "results/runs/countdown/m/es/seed0"
    run.mkdir(parents=True)
    (run / "log.jsonl").write_text("".join(json.dumps({"iteration": i, "rewards": [0.0] * 4}) + "\n"
                                           for i in range(2)))
    essa = work / "results/runs/gsm8k/m/essa_ref/seed0"  # ESSA logs the ids of the problems scored
    essa.mkdir(parents=True)
    (essa / "log.jsonl").write_text(json.dumps({"generation": 0, "rewards": [0.0] * 3, "problems": [4, 9]}) + "\n")
    cell = work / "results/runs/countdown/m/grpo8/grid/c0/seed0"
    cell.mkdir(parents=True)
    (cell / "log.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    ev = work / "results/eval/countdown/m/es/seed0/test"
    ev.mkdir(parents=True)
    (ev / "metrics.json").write_text(json.dumps({"n": 4, "accuracy": 0.0}))

    logs = f"{repo.resolve()}/.snakemake/slurm_logs"
    scontrol = "\n".join([
        f"JobId=1 JobState=COMPLETED RunTime=00:01:05 WorkDir={repo.resolve()} StdOut={logs}/rule_train/a_0/1.log",
        f"JobId=2 JobState=FAILED RunTime=00:00:09 WorkDir={repo.resolve()} StdOut={logs}/rule_train_cell/b/2.log",
        f"JobId=3 JobState=RUNNING RunTime=00:00:02 WorkDir={repo.resolve()} StdOut={logs}/rule_evaluate/c/3.log",
        "JobId=4 JobState=COMPLETED RunTime=1-00:00:00 WorkDir=/elsewhere StdOut=/elsewhere/.snakemake/"
        "slurm_logs/rule_train/d/4.log",
    ])
    jobs = slurm_jobs(scontrol, repo)
    assert [(j.rule, j.seconds, j.ok) for j in jobs] == [("train", 65, True), ("train_cell", 9, False)]

    meta = repo / ".snakemake/metadata"
    meta.mkdir(parents=True)
    for path, rule, start, end, job in [
            ("work/rehearsal/data/prepared/countdown", "prepare_data", 110.0, 111.0, 1),
            ("work/rehearsal/data/prepared/countdown/manifest.json", "prepare_data", 111.0, 112.5, 1),  # same job
            ("work/rehearsal/results/x", "train", 100.0, 100.01, 2),   # a submitted job's record
            ("work/rehearsal/data/prepared/gsm8k", "prepare_data", 5.0, 9.0, 3),  # an earlier run's job
            ("elsewhere/y", "prepare_data", 100.0, 109.0, 4)]:               # another workspace's
        name = base64.urlsafe_b64encode(path.encode()).decode()
        (meta / name).write_text(json.dumps({"rule": rule, "starttime": start, "endtime": end, "job_hash": job,
                                             "incomplete": False}))
    on_host = local_rules("rule train:\n    jobid: 2\nlocalrule prepare_data:\n    jobid: 1\n")
    assert on_host == {"prepare_data"}
    jobs += local_jobs(meta, "work/rehearsal", on_host, since=100.0)
    work_done = outputs_work(work)
    assert work_done["train"] == {"optimiser_steps": 3, "scored_samples": 8 + 6}
    assert work_done["train_cell"] == {"optimiser_steps": 1} and work_done["evaluate"] == {"prompts_evaluated": 4}
    planned = {"prepare_data": 1, "train": 1, "train_cell": 1, "evaluate": 1, "kl": 1, "all": 1}
    rows = report_rows({**planned, "kl": 3}, planned, jobs, work_done, finished=False)
    by_rule = {r["rule"]: r for r in rows}
    assert (by_rule["prepare_data"]["ran"], by_rule["prepare_data"]["where"], by_rule["prepare_data"]["seconds"]) \
        == ("yes", "local", 2.5)
    assert by_rule["train"]["ran"] == "yes" and by_rule["train"]["seconds"] == 65
    assert by_rule["train_cell"]["ran"] == "failed" and by_rule["evaluate"]["ran"] == "no"
    assert by_rule["kl"]["jobs_paper"] == 3 and by_rule["all"]["ran"] == "no"
    assert report_rows(planned, planned, jobs, finished=True)[-1]["ran"] == "yes"  # `all` ran: the run finished
    md = write_report(rows, tmp_path / "report", wall_seconds=90)
    assert "Rules of the paper's DAG that ran: 2 of 6" in md and "1.5 min" in md
    assert (tmp_path / "report.csv").read_text().splitlines()[0].startswith("rule,jobs_paper,jobs_planned")
