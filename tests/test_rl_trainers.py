"""Each RL trainer runs a few steps on a tiny model: weights change, KL is logged iff its coefficient > 0,
a seed reproduces a run bit for bit, and `esrepro train` writes the ES run directory shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from esrepro.rl.grpo import train_grpo
from esrepro.rl.ppo import train_ppo
from esrepro.tasks.base import Score, Task
from esrepro.tasks.countdown import prepare


class LengthTask(Task):
    """Reward = response length in characters / 40 (capped at 1): varies even for an untrained model."""

    name = "length"

    def prompt(self, example: dict) -> str:
        return example["prompt"]

    def score(self, response: str, example: dict) -> Score:
        return Score(min(len(response), 40) / 40, False)


SHORT = [{"id": i, "prompt": f"Using the numbers [{a} {b}], make {a + b}."} for i, (a, b) in
         enumerate([(3, 4), (5, 9), (12, 2), (7, 7)])]

GRPO = dict(algorithm="grpo", loss_type="grpo", scale_rewards="group", beta=0.0, num_generations=2,
            learning_rate=1e-3, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8,
            per_device_train_batch_size=4, gradient_accumulation_steps=1, epsilon=0.2, num_iterations=1,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, bf16=True,
            gradient_checkpointing=True, disable_dropout=True, mask_truncated_completions=False,
            importance_sampling_level="token", train_examples=4)
DR_GRPO = {**GRPO, "algorithm": "dr_grpo", "loss_type": "dr_grpo", "scale_rewards": "none"}
PPO = dict(algorithm="ppo", actor_learning_rate=1e-3, critic_learning_rate=1e-3, beta=0.0, prompts_per_step=4,
           mini_batch_size=2, micro_batch_size=2, ppo_epochs=1, clip_ratio=0.2, value_clip=0.5, gamma=1.0, lam=1.0,
           entropy_coef=0.001, max_grad_norm=1.0, weight_decay=0.0, max_new_tokens=8, temperature=1.0,
           train_examples=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("countdown")
    prepare(out, {"kind": "generated", "n_train": 4, "n_test": 4}, seed=0)
    return out, LengthTask(), SHORT


def _changed(model, model_dir: Path) -> bool:
    base = load_file(str(model_dir / "model.safetensors"))
    now = {k: v for k, v in model.state_dict().items()}
    return any(not torch.equal(base[k], now[k]) for k in base if k in now)


@pytest.mark.parametrize("settings", [GRPO, DR_GRPO], ids=["grpo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_grpo_trains_and_logs_kl_iff_beta_positive(tiny_model_dir, data, settings, beta):
    torch.set_num_threads(1)
    _, task, examples = data
    model, _, rows = train_grpo(tiny_model_dir, task, examples, {**settings, "beta": beta}, steps=2, seed=0)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(0.0 <= r["reward_mean"] <= 1.1 for r in rows)
    assert all(("kl" in r) == (beta > 0) for r in rows)
    assert _changed(model, tiny_model_dir)


@pytest.mark.parametrize("beta", [0.0, 0.01])
def test_ppo_trains_and_logs_kl_iff_coefficient_positive(tiny_model_dir, data, beta):
    torch.set_num_threads(1)
    _, task, examples = data
    model, _, rows = train_ppo(tiny_model_dir, task, examples, {**PPO, "beta": beta}, steps=2, seed=0,
                               progress=False)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(("kl" in r) == (beta > 0) for r in rows)
    assert all(r["vf_loss"] >= 0 for r in rows)
    assert _changed(model, tiny_model_dir)


def test_ppo_seed_reproduces_bit_for_bit(tiny_model_dir, data):
    torch.set_num_threads(1)
    _, task, examples = data
    a, _, ra = train_ppo(tiny_model_dir, task, examples, {**PPO, "beta": 0.01}, steps=2, seed=3, progress=False)
    b, _, rb = train_ppo(tiny_model_dir, task, examples, {**PPO, "beta": 0.01}, steps=2, seed=3, progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(ra) == strip(rb)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_grpo_seed_reproduces_bit_for_bit(tiny_model_dir, data):
    torch.set_num_threads(1)
    _, task, examples = data
    a, _, ra = train_grpo(tiny_model_dir, task, examples, GRPO, steps=2, seed=5)
    b, _, rb = train_grpo(tiny_model_dir, task, examples, GRPO, steps=2, seed=5)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(ra) == strip(rb)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.slow
def test_cli_writes_the_es_run_shape_with_the_budget(tiny_model_dir, data, tmp_path):
    data_dir, _, _ = data
    spec = {**DR_GRPO, "sample_budget": 10}  # 10 // 4 samples per step = 2 steps
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "esrepro.cli", "train", "--method", "drgrpo", "--task", "countdown",
                    "--model", "test", "--model-dir", str(tiny_model_dir), "--data-dir", str(data_dir),
                    "--spec", json.dumps(spec), "--seed", "0", "--out", str(out), "--threads", "1"],
                   check=True, timeout=600)
    assert (out / "checkpoint" / "model.safetensors").exists() and (out / "checkpoint" / "tokenizer.json").exists()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in log] == [0, 1]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["budget"] == {"sample_budget": 10, "samples_per_step": 4, "steps": 2, "samples_used": 8}
    assert manifest["cpu_overrides"] == {"bf16": False, "gradient_checkpointing": False}
