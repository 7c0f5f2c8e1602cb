"""The rehearsal's RL jobs at the paper jobs' process counts (up to 8 gloo processes), with a batch thinned to a step
or two that those processes share as they share the paper's; and one step of GRPO and of PPO actually run at every
world size the paper's RL jobs use, through the launcher and entry point the rehearsal's jobs use."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from esrepro.config import workflow_config
from esrepro.planning import cluster, specs
from esrepro.planning.jobs import plan_jobs
from esrepro.planning.load import load_pipeline
from esrepro.planning.rehearsal_bounds import rl_jobs, rl_steps
from esrepro.planning.rehearsal_registry import rl_batch
from esrepro.rl.budget import check_problem_count, rl_budget, samples_per_step
from esrepro.rl.grpo import grpo_config_kwargs
from esrepro.rl.shares import admits, largest_world, per_process
from esrepro.settings.methods import GRPO_ALGORITHMS

BIN = Path(sys.executable).parent


def _pipeline(path: str):
    raw, source = workflow_config([path], {})
    return load_pipeline(raw, source, REPO)


PAPER, REHEARSAL = _pipeline("config/paper.yaml"), _pipeline("config/rehearsal.yaml")


PAPER_JOBS, REHEARSAL_JOBS = rl_jobs(PAPER), rl_jobs(REHEARSAL)


def _family(algorithm: str) -> str:
    return "grpo" if algorithm in GRPO_ALGORITHMS else algorithm


#: (GRPO or PPO, processes) of the paper's RL jobs: the world sizes the rehearsal must exercise.
PAPER_WORLDS = sorted({(_family(a), n) for *_, a, n in PAPER_JOBS})


def _rehearsal_cell(model: str, method: str, cell: str | None) -> str | None:
    """The rehearsal's cell standing in for a paper job's (its grid keeps the first cell of each)."""
    if cell is None:
        return None
    cells = REHEARSAL.grid_cells(model, method)
    return cell if cell in cells else next(iter(cells))


# --- the thinning ---------------------------------------------------------------------------------------------


def test_rl_batch_keeps_how_the_papers_batch_divides_at_toy_size():
    grpo8 = {"algorithm": "grpo", "per_device_train_batch_size": 32, "gradient_accumulation_steps": 8,
             "num_generations": 8}
    # the paper's 4 processes take 2 of its 8 accumulation steps each; the toy batch: one step of a group of 2 each
    assert rl_batch(grpo8, 4) == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4,
                                  "num_generations": 2}
    # 60 completions (2 groups of 30) in one micro-step over 6 processes: 6 completions, one group across them all
    concise = {"algorithm": "grpo", "per_device_train_batch_size": 60, "gradient_accumulation_steps": 1,
               "num_generations": 30}
    assert rl_batch(concise, 6) == {"per_device_train_batch_size": 6, "gradient_accumulation_steps": 1,
                                    "num_generations": 6}
    assert not admits({**concise, **rl_batch(concise, 6)}, 8) and not admits({**concise, **rl_batch(concise, 6)}, 7)
    ppo = {"algorithm": "ppo", "prompts_per_step": 256, "mini_batch_size": 128, "micro_batch_size": 8}
    assert rl_batch(ppo, 8) == {"prompts_per_step": 16, "mini_batch_size": 8, "micro_batch_size": 1,
                                "rollout_batch_size": None}
    with pytest.raises(ValueError, match=r"per_device_train_batch_size \(30\) x gradient_accumulation_steps \(1\)"):
        rl_batch({**concise, "per_device_train_batch_size": 30}, 4)  # the paper's batch does not admit the count


def test_every_rl_job_of_the_rehearsal_runs_at_the_paper_jobs_process_count():
    paper = {job[:4]: job[5] for job in PAPER_JOBS}
    for task, model, method, cell, algorithm, n in REHEARSAL_JOBS:
        assert n == paper[(task, model, method, cell)], (task, model, method, cell)
        settings = REHEARSAL.method_settings(model, task, method, cell).as_dict()
        per_process(settings, n)  # GRPO's process_batch, PPO's shares: built at that world size
        assert largest_world(settings, 8) == n
        steps = rl_budget(settings["sample_budget"], samples_per_step(settings)).steps
        per_rollout = int(settings.get("updates_per_generation") or 1)
        assert 1 <= steps <= rl_steps(per_rollout) and steps % per_rollout == 0, (task, model, method, steps)
        job = specs.method_spec(REHEARSAL, model, task, method, cell)
        if algorithm in GRPO_ALGORITHMS:  # the trainer's arguments as the job builds them, resuming as it does
            grpo_config_kwargs(job, steps=steps, seed=0, output_dir="unused", on_cpu=True, world_size=n, resume=True)
        check_problem_count(settings, settings["train_examples"])
        launcher = cluster.rl_launcher(REHEARSAL, model, specs.method_spec(REHEARSAL, model, task, method, cell))
        assert f"--nproc-per-node {n} " in launcher, launcher
    # the rehearsal runs every world size the paper's RL jobs use, for GRPO and PPO alike where the paper does
    assert {(_family(a), n) for *_, a, n in REHEARSAL_JOBS} >= {w for w in PAPER_WORLDS if w[1] == 4} | \
        {("grpo", 6), ("grpo", 8)}
    assert {n for *_, n in REHEARSAL_JOBS} == {n for *_, n in PAPER_JOBS}


def test_the_rehearsal_gives_every_paper_rl_job_its_process_count():
    """Every RL job of the paper's DAG, on models and cells the rehearsal does not run as well: the rehearsal's
    settings for it (its thinned grid's cell) get the paper job's process count, and those processes share them."""
    compared, kinds = set(), set()
    for task, model, method, cell, algorithm, n in PAPER_JOBS:
        if method not in REHEARSAL.train_methods(task) and REHEARSAL.study_method(task, method) is None:
            continue  # a study value the rehearsal thins away (another beta or learning rate of the same runs)
        thin = _rehearsal_cell(model, method, cell)
        settings = REHEARSAL.method_settings(model, task, method, thin).as_dict()
        assert cluster.layout(REHEARSAL, task, model, method, thin).training_processes() == n, (model, method, cell)
        per_process(settings, n)
        compared.add((model, method))
        kinds.add((task, model, algorithm))
    # 7 Table 1 models x 5 RL methods, 4 of the conciseness studies' GRPO runs, ESSA's GRPO baseline; and every
    # task, model and algorithm of the paper's RL jobs
    assert len(compared) == 40 and kinds == {(t, m, a) for t, m, _, _, a, _ in PAPER_JOBS}


def test_essa_sft_keeps_at_most_rehearsal_processes():
    """ESSA's SFT, which takes the same registry entry as the RL jobs, keeps its two processes (rehearsal.processes)."""
    p, launched = REHEARSAL, 0
    for job in plan_jobs(p):
        w = job.wildcards
        if job.rule == "train" and p.algorithm_of(w["task"], w["method"]).name == "essa":
            assert PAPER.resources(w["model"], "train").training_processes() == 8
            launcher = cluster.launcher(p, w["task"], w["model"], w["method"], "ray-slurm")
            assert launcher.startswith("ESREPRO_TRAIN_PROCESSES=2 "), (w, launcher)
            launched += 1
    assert launched >= 3


# --- one step at every paper world size, with real processes --------------------------------------------------


def _job_at(family: str, world: int) -> tuple[str, str, str, str | None]:
    """A paper RL job of ``family`` at ``world`` processes, one the rehearsal runs where there is one."""
    found = [j[:4] for j in PAPER_JOBS if (_family(j[4]), j[5]) == (family, world)]
    ran = {j[:4] for j in REHEARSAL_JOBS}
    return next((j for j in found if j in ran), found[0])


@pytest.fixture(scope="module")
def countdown(tmp_path_factory):
    from esrepro.tasks.countdown import prepare

    out = tmp_path_factory.mktemp("countdown")
    prepare(out, {"kind": "generated", "n_train": 16, "n_test": 4}, seed=0)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family,world", PAPER_WORLDS, ids=[f"{f}-{w}" for f, w in PAPER_WORLDS])
def test_one_step_runs_at_the_paper_jobs_world_size(family, world, tiny_model_dir, countdown, tmp_path):
    """The rehearsal's settings of a paper job at that world size, one optimiser step, under the torchrun prefix the
    job's rule runs (esrepro.planning.cluster.rl_launcher) and the rule's entry point (`esrepro train`), with gloo processes;
    on the tiny test model and Countdown, whatever the job's own task."""
    task, model, method, cell = _job_at(family, world)
    cell = _rehearsal_cell(model, method, cell)
    spec = specs.method_spec(REHEARSAL, model, task, method, cell)
    launcher = cluster.rl_launcher(REHEARSAL, model, spec)
    assert f"--nproc-per-node {world} " in launcher
    one_step = samples_per_step(spec)
    spec.update(sample_budget=one_step, eval_every=None, keep_every=None, train_examples=16, task_options={})
    out = tmp_path / "run"
    cmd = shlex.split(launcher) + ["esrepro", "train", "--method", method, "--task", "countdown", "--model", "test",
                                   "--model-dir", str(tiny_model_dir), "--dtype", "float32", "--data-dir",
                                   str(countdown), "--spec", json.dumps(spec), "--seed", "0", "--out", str(out),
                                   "--threads", "1", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == world
    assert manifest["budget"]["steps"] == 1 and manifest["budget"]["samples_per_step"] == one_step
    assert manifest["per_process"] == per_process(spec, world)
    rows = (out / "log.jsonl").read_text().splitlines()
    assert len(rows) == 1, rows
    print(f"{family} x {world} processes ({model} {method}): {time.monotonic() - started:.1f} s")


def test_docs_list_the_rl_jobs_process_counts():
    from esrepro.planning.rehearsal_bounds import rl_process_table

    table = rl_process_table(PAPER, REHEARSAL)
    assert table in (REPO / "docs" / "rehearsal.md").read_text(), "docs/rehearsal.md's table of RL processes:\n" + table
