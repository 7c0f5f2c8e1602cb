"""Training on every task: periodic evaluation (ES, GRPO, PPO; one point per interval; resumes with an ES run),
per-iteration prompt batches, MATH training data, the multi-format tiny warm start, and the parameter-shift
step on a real ES run."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from esrepro.es.loop import iteration_batch
from esrepro.io import read_jsonl
from esrepro.report.sample_curves import read_periodic_eval
from esrepro.rl.budget import es_sample_budget
from esrepro.tasks import get_task, prepare_task

ES = {"iterations": 8, "population": 4, "sigma": 0.05, "alpha": 0.05, "train_examples": 6, "max_new_tokens": 8,
      "batch_size": 6, "noise": "iid", "restore": "exact", "resume_every": 2, "eval_every": 2, "eval_limit": 5}


@pytest.fixture(scope="module")
def countdown(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("countdown")
    prepare_task("countdown", out, {"kind": "generated", "n_train": 6, "n_test": 8}, seed=0)
    return out


def _train(model_dir: Path, data_dir: Path, out: Path, spec: dict, method: str = "es", task: str = "countdown",
           seed: int = 3) -> list[str]:
    return [sys.executable, "-m", "esrepro.cli", "train", "--method", method, "--task", task, "--model", "test",
            "--model-dir", str(model_dir), "--data-dir", str(data_dir), "--spec", json.dumps(spec),
            "--seed", str(seed), "--out", str(out), "--threads", "1"]


ENV = {**os.environ, "TQDM_DISABLE": "1"}


def _train_here(model_dir: Path, data_dir: Path, out: Path, spec: dict, method: str = "es", task: str = "countdown",
                seed: int = 3) -> None:
    """`esrepro train` in this process (the CLI's function; no interpreter start-up)."""
    from esrepro.steps.train import train

    train(task=task, model="test", model_dir=str(model_dir), data_dir=str(data_dir), spec=spec, method=method,
          out=str(out), seed=seed, threads=1)


# --- periodic evaluation -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_es_periodic_eval_one_point_per_interval_and_resumes_with_the_run(tiny_model_dir, countdown, tmp_path):
    """A point before training and after every eval_every iterations; a run killed after a resume checkpoint
    and restarted writes the same points, none twice."""
    straight = tmp_path / "straight"
    _train_here(tiny_model_dir, countdown, straight, ES)
    rows = read_periodic_eval(straight / "periodic_eval.jsonl")  # checks the format Figure 6 reads
    assert [r["iteration"] for r in rows] == [0, 2, 4, 6, 8]
    assert [r["samples"] for r in rows] == [it * 4 * 6 for it in (0, 2, 4, 6, 8)]
    assert all(r["n"] == 5 and r["split"] == "test" for r in rows)
    manifest = json.loads((straight / "manifest.json").read_text())
    assert "periodic_eval" in manifest["outputs"]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train(tiny_model_dir, countdown, killed, ES), env=ENV)
    state = killed / "resume" / "state.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if state.exists() and json.loads(state.read_text())["completed_iterations"] >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "training finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = json.loads(state.read_text())["completed_iterations"]
    assert 2 <= done < ES["iterations"]
    kept = read_jsonl(killed / "resume" / "periodic_eval.jsonl")
    assert [r["iteration"] for r in kept] == [it for it in (0, 2, 4, 6, 8) if it <= done]
    subprocess.run(_train(tiny_model_dir, countdown, killed, ES), check=True, env=ENV, timeout=600)
    assert read_jsonl(killed / "periodic_eval.jsonl") == read_jsonl(straight / "periodic_eval.jsonl")
    assert read_jsonl(killed / "log.jsonl")[-1]["checksum"] == read_jsonl(straight / "log.jsonl")[-1]["checksum"]


def test_periodic_eval_leaves_the_es_trajectory_unchanged(tiny_model_dir, countdown, tmp_path):
    plain = {k: v for k, v in ES.items() if not k.startswith("eval_")}
    a, b = tmp_path / "a", tmp_path / "b"
    _train_here(tiny_model_dir, countdown, a, plain)
    _train_here(tiny_model_dir, countdown, b, {**ES, "eval_every": 3})
    assert not (a / "periodic_eval.jsonl").exists()
    assert read_jsonl(a / "log.jsonl")[-1]["checksum"] == read_jsonl(b / "log.jsonl")[-1]["checksum"]
    assert [r["iteration"] for r in read_jsonl(b / "periodic_eval.jsonl")] == [0, 3, 6]


GRPO = dict(algorithm="grpo", beta=0.0, num_generations=2, learning_rate=1e-3, max_new_tokens=8,
            per_device_train_batch_size=4, gradient_accumulation_steps=1, train_examples=4, sample_budget=12,
            eval_every=1, eval_limit=3)
PPO = dict(algorithm="ppo", actor_learning_rate=1e-3, critic_learning_rate=1e-3, beta=0.0, prompts_per_step=4,
           mini_batch_size=2, micro_batch_size=2, max_new_tokens=8, train_examples=4, sample_budget=8,
           eval_every=2, eval_limit=3)


@pytest.mark.parametrize("spec, method, points", [(GRPO, "grpo8", [0, 1, 2, 3]), (PPO, "ppo", [0, 2])],
                         ids=["grpo", "ppo"])
def test_rl_periodic_eval_one_point_per_interval(tiny_model_dir, countdown, tmp_path, spec, method, points):
    out = tmp_path / "run"
    _train_here(tiny_model_dir, countdown, out, spec, method=method, seed=0)
    rows = read_periodic_eval(out / "periodic_eval.jsonl")
    per_step = json.loads((out / "manifest.json").read_text())["budget"]["samples_per_step"]
    assert [r["iteration"] for r in rows] == points
    assert [r["samples"] for r in rows] == [p * per_step for p in points]
    assert all(r["n"] == 3 for r in rows)


# --- prompts per iteration (the authors' math recipe) ------------------------------------------------------------
def test_iteration_batches_are_seeded_epochs_of_the_training_prompts():
    n, per = 10, 4
    stream = [i for it in range(5) for i in iteration_batch(n, per, seed=1, iteration=it)]  # 20 = two epochs
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]  # reshuffled each epoch
    assert iteration_batch(n, per, 1, 2) == stream[8:12]  # a batch straddling two epochs
    assert iteration_batch(n, per, 2, 0) != iteration_batch(n, per, 1, 0)
    with pytest.raises(ValueError, match="prompts per iteration"):
        iteration_batch(3, 4, 0, 0)
    budget = {"iterations": 5, "population": 3, "train_examples": 100, "prompts_per_iteration": 8}
    assert es_sample_budget(budget) == 5 * 3 * 8


def test_es_budget_counts_the_prompts_per_iteration(tiny_model_dir, countdown, tmp_path):
    spec = {k: v for k, v in ES.items() if not k.startswith("eval_")} | {"iterations": 3, "prompts_per_iteration": 2}
    out = tmp_path / "run"
    _train_here(tiny_model_dir, countdown, out, spec)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["budget"] == {"sample_budget": 3 * 4 * 2}
    from esrepro.settings.methods import ESSettings

    with pytest.raises(ValueError, match="prompts_per_iteration"):
        ESSettings.model_validate({**spec, "prompts_per_iteration": 7})


# --- MATH training data and the warm start ---------------------------------------------------------------------
def test_math_train_generated_and_local_with_held_out_test(tmp_path):
    info = prepare_task("math_train", tmp_path / "gen", {"kind": "generated", "n_train": 30, "n_test": 10}, seed=0)
    assert {k: v["n"] for k, v in info["splits"].items()} == {"train": 30, "test": 10}
    task = get_task("math_train")
    rows = read_jsonl(tmp_path / "gen" / "train.jsonl") + read_jsonl(tmp_path / "gen" / "test.jsonl")
    assert len({r["problem"] for r in rows}) == 40
    from esrepro.tasks.math_train import sft_completion

    for r in rows[:12]:
        assert "\\boxed{" in task.prompt(r) and task.score(sft_completion(r), r).correct
    wrong = {**rows[0], "answer": "-1", "answers": ["-1"]}
    assert not task.score(sft_completion(rows[0]), wrong).correct
    # a local source shaped like the authors' math_lvl3to5_8k (DatasetDict, train only): test held out by seed
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list([{"problem": f"What is {i} + 1?", "answer": str(i + 1)}
                                             for i in range(20)])}).save_to_disk(str(tmp_path / "authors"))
    out = prepare_task("math_train", tmp_path / "loc", {"kind": "local", "path": str(tmp_path / "authors"),
                                                        "n_test": 5}, seed=0)
    assert {k: v["n"] for k, v in out["splits"].items()} == {"train": 15, "test": 5}
    train = {r["problem"] for r in read_jsonl(tmp_path / "loc" / "train.jsonl")}
    test = {r["problem"] for r in read_jsonl(tmp_path / "loc" / "test.jsonl")}
    assert not train & test and len(train | test) == 20
    none = prepare_task("math_train", tmp_path / "loc2", {"kind": "local", "path": str(tmp_path / "authors")}, seed=0)
    assert set(none["splits"]) == {"train"}


@pytest.mark.usefixtures("sandbox")
def test_warm_start_pairs_are_correct_and_avoid_the_prepared_rows(tmp_path):
    from esrepro.models.warm_start import mixed_pairs, task_pairs

    source = {"kind": "generated", "n_train": 30, "n_test": 10, "min_empty": 2, "max_empty": 4}
    prepare_task("sudoku", tmp_path / "sudoku", source, seed=0)
    banned = read_jsonl(tmp_path / "sudoku" / "train.jsonl") + read_jsonl(tmp_path / "sudoku" / "test.jsonl")
    # the warm start's own stream would draw some of the prepared puzzles (Reasoning Gym's item k of seed s is
    # item k - 1 of seed s + 1): seeded 7,919 below the warm start's, they must all be left out
    from esrepro.models.warm_start import SEED_OFFSET

    pairs = task_pairs("sudoku", 40, seed=-SEED_OFFSET, source=source, banned=banned)
    assert len(pairs) == 40
    prompts = {p for p, _ in pairs}
    from esrepro.tasks.sudoku import sudoku_prompt

    assert len(prompts) == 40 and not prompts & {sudoku_prompt(e["question"]) for e in banned}
    got, made, groups = mixed_pairs({"countdown": 5, "math_train": 5, "sudoku": 5, "arc": 5}, seed=1,
                                    sources={"sudoku": {"min_empty": 2, "max_empty": 4}}, banned={})
    assert made == {"countdown": 5, "math_train": 5, "sudoku": 5, "arc": 5} and sorted(set(groups)) == sorted(made)
    again, _, _ = mixed_pairs({"countdown": 5, "math_train": 5, "sudoku": 5, "arc": 5}, seed=1,
                              sources={"sudoku": {"min_empty": 2, "max_empty": 4}}, banned={})
    assert got == again  # seeded
    # every completion answers in its task's format, where its grader looks
    from esrepro.tasks.arc import last_python_block
    from esrepro.tasks.math import last_boxed

    for (prompt, completion), task in zip(got, groups, strict=True):
        if task == "math_train":
            assert last_boxed(completion) is not None and prompt.startswith("<|im_start|>system")
        elif task == "sudoku":  # its reward is 1.0: tests/test_tasks_sudoku.py scores sft_completion
            assert "Mini Sudoku" in prompt and prompt.endswith("<think>") and "<answer>" in completion
        elif task == "arc":
            assert last_python_block(completion) is not None and prompt.endswith("<|im_start|>assistant\n")
        else:
            assert "<answer>" in completion and prompt.endswith("<think>")
    # the synthetic ARC-format tasks: the completion is a transform program that maps the test input to its output
    import random

    from esrepro.tasks.arc import SYNTHETIC_RULES, synthetic_example
    from esrepro.tasks.arc import sft_completion as arc_completion

    examples = [synthetic_example(random.Random(k)) for k in range(40)]
    assert {e["rule"] for e in examples} == set(SYNTHETIC_RULES)
    assert all(s.correct for s in get_task("arc").score_many([arc_completion(e) for e in examples], examples))


def test_multi_format_tiny_build_is_seeded(tmp_path):
    from safetensors.torch import load_file

    from esrepro.models.tiny import build_tiny_tasks

    build = {"seed": 0, "tokenizer": {"vocab_size": 400, "corpus_problems": 60},
             "architecture": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                              "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512},
             "sft": {"tasks": {"countdown": 16, "math_train": 16, "sudoku": 8, "arc": 4}, "epochs": 1,
                     "learning_rate": 0.003, "prompts_per_step": 8}}
    a = build_tiny_tasks(build, {}, tmp_path / "a", {"sudoku": {"min_empty": 2, "max_empty": 4}})
    build_tiny_tasks(build, {}, tmp_path / "b", {"sudoku": {"min_empty": 2, "max_empty": 4}})
    assert a["sft_tasks"] == {"countdown": 16, "math_train": 16, "sudoku": 8, "arc": 4}
    assert a["sft_steps"] == 2 + 2 + 1 + 1  # one task per batch
    assert json.loads((tmp_path / "a" / "build.json").read_text())["build"]["sft"]["prompts_per_step"] == 8
    wa, wb = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert all(np.array_equal(wa[k].numpy(), wb[k].numpy()) for k in wa)


# --- Figures 7-9 on a real ES run --------------------------------------------------------------------------------
def test_param_shift_step_on_a_real_es_run_matches_the_random_walk(tiny_model_dir, tmp_path):
    """ES on conciseness (rewards vary with every response's length, unrelated to any one coordinate): the
    shifts of the toy model's ~50k parameters follow the walk of the run's own z-scores."""
    data = tmp_path / "conciseness"
    prepare_task("conciseness", data, {"kind": "generated"}, seed=0)
    spec = {"iterations": 12, "population": 8, "sigma": 0.5, "alpha": 0.01, "train_examples": 2,
            "max_new_tokens": 12, "batch_size": 2, "noise": "iid", "restore": "exact", "resume_every": 50}
    run = tmp_path / "run"
    _train_here(tiny_model_dir, data, run, spec, task="conciseness")
    out = tmp_path / "shift"
    from esrepro.steps.report import param_shift, param_shift_histogram

    param_shift_histogram(task="conciseness", model="test", method="es", model_dir=str(run / "checkpoint"),
                          base_dir=str(tiny_model_dir), run_dir=str(run), out=str(out))
    summary = json.loads((out / "manifest.json").read_text())["summary"]
    log = read_jsonl(run / "log.jsonl")
    moving = sum(1 for r in log if len(set(r["rewards"])) > 1)
    assert moving >= 6, "too few iterations with different rewards to test the walk"
    assert summary["rms_over_walk_scale"] == pytest.approx(1.0, abs=0.05)
    from esrepro.report.param_shift import half_normal_counts, read_shift_histogram

    _, hist, walk = read_shift_histogram(out / "histogram.json")
    ref = half_normal_counts(hist.bins, hist.n_params, walk.scale)
    assert np.all(np.abs(hist.counts - ref.counts) <= 5 * np.sqrt(ref.counts) + 5)
    # the figure step reads the histograms
    fig = tmp_path / "fig" / "param_shift_conciseness"
    param_shift([str(out / "histogram.json")], str(fig), task="conciseness", sampled_coords=2000)
    assert fig.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert math.isfinite(walk.scale) and walk.steps == 12


# --- dense training signals for the tiny model (accuracy stays exact) ---------------------------------------------
@pytest.mark.usefixtures("sandbox")
def test_cell_rewards_for_arc():
    ex = {"test_output": [[1, 2], [3, 4]], "train": [], "test_input": [[0]]}
    arc = get_task("arc", partial=True)

    def program(grid) -> str:  # a transform returning ``grid``, whatever its input
        return f"```python\ndef transform(grid):\n    return {grid!r}\n```"

    assert arc.score(program([[1, 2], [3, 0]]), ex).reward == pytest.approx(0.75)
    assert arc.score(program([[1, 2], [3, 4], [5, 6]]), ex).reward == pytest.approx(1.0)  # cells in place; not exact
    assert not arc.score(program([[1, 2], [3, 4], [5, 6]]), ex).correct
    assert get_task("arc").score(program([[1, 2], [3, 0]]), ex).reward == 0.0
    assert arc.score("<answer>12\n34</answer>", ex).reward == 0.0  # a grid answer is no program
