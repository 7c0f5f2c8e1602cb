"""The ESSA study's GRPO baseline run for real on a tiny Countdown model: with trains=adapter only the SFT
adapter's LoRA matrices change (every other weight of the checkpoint is the base's, bit for bit), kept
snapshots are adapters scored on the held-out problems, GRPO never trains on a held-out problem, and a
train split too small is an error naming the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from esrepro.essa.data import alignment_positions, baseline_problems_needed, heldout_positions
from esrepro.steps.essa import essa_grpo
from test_essa_train import GENERATOR, countdown_model  # noqa: F401 - the warm-started model fixture

REF = {"algorithm": "essa", "sft_examples": 16, "fitness_examples": 6, "val_examples": 4, "rank": 4,
       "lora_alpha": 8, "sft_epochs": 1, "sft_learning_rate": 0.01, "sft_prompts_per_step": 8, "max_new_tokens": 24,
       "batch_size": 8, "fitness": "reward", "population": 4, "iterations": 1}
# 3 steps of 8 completions (2 prompts x 4); 10 training problems > 6 fitness ones, so some come after the held-out
GRPO = {"algorithm": "grpo", "beta": 0.0, "num_generations": 4, "learning_rate": 1e-2, "temperature": 1.0,
        "top_p": 1.0, "top_k": 0, "max_new_tokens": 16, "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1, "epsilon": 0.2, "num_iterations": 1, "lr_scheduler_type": "constant",
        "warmup_steps": 0, "weight_decay": 0.0, "max_grad_norm": 1.0, "bf16": False,
        "gradient_checkpointing": False, "disable_dropout": True, "mask_truncated_completions": False,
        "importance_sampling_level": "token", "train_examples": 10, "sample_budget": 24, "keep_every": 2}
ADAPTED = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")
N_TRAIN = 30  # 16 SFT + 6 fitness + 4 held-out + 4 after them: exactly what GRPO's 10 problems need


@pytest.fixture(scope="module")
def countdown_data(tmp_path_factory) -> Path:
    from esrepro.tasks.countdown import prepare

    out = tmp_path_factory.mktemp("countdown_grpo_data")
    prepare(out, {"kind": "generated", "n_train": N_TRAIN, "n_test": 4, **GENERATOR}, seed=0)
    return out


@pytest.fixture(scope="module")
def sft_dir(countdown_model, countdown_data, tmp_path_factory) -> Path:  # noqa: F811 - the imported fixture
    """The reference ESSA run's sft/ folder, made by the ESSA trainer's own SFT stage."""
    from esrepro.essa.data import sft_pairs
    from esrepro.essa.train import SFT, ensure_sft
    from esrepro.settings.methods import ESSASettings
    from esrepro.steps import load_examples
    from esrepro.tasks import get_task
    from esrepro.train.context import TrainContext

    task = get_task("countdown")
    run = tmp_path_factory.mktemp("essa_ref")
    ctx = TrainContext(method="essa_ref", model="test", model_dir=countdown_model, dtype="float32", chat=False,
                       settings=ESSASettings.model_validate(REF), task=task, examples=[], seed=0, run_dir=run)
    ensure_sft(ctx, sft_pairs(task, load_examples(task, countdown_data, "train", REF["sft_examples"])), reuse=False)
    return run / SFT


def _run(model_dir: Path, sft: Path, data: Path, out: Path, spec: dict = GRPO, trains: str = "adapter") -> dict:
    return essa_grpo("countdown", "test", str(model_dir), str(sft), str(data), spec, REF, "essa_grpo", str(out),
                     trains=trains)


def test_alignment_positions_skip_the_heldout_block():
    assert alignment_positions(10, 3, 2, 2) == [10, 11]
    assert alignment_positions(10, 3, 2, 6) == [10, 11, 12, 15, 16, 17]
    assert list(heldout_positions(10, 3, 2)) == [13, 14]
    assert alignment_positions(0, 2, 0, 3) == [0, 1, 2]
    assert baseline_problems_needed(10, 3, 2, 2) == 15 and baseline_problems_needed(10, 3, 2, 6) == 18


@pytest.mark.slow
def test_grpo_trains_only_the_sft_adapter(countdown_model, countdown_data, sft_dir, tmp_path):  # noqa: F811
    run = tmp_path / "grpo"
    summary = _run(countdown_model, sft_dir, countdown_data, run)
    assert summary["trains"] == "adapter" and summary["iterations"] == 3

    base = load_file(str(countdown_model / "model.safetensors"))
    start = load_file(str(run / "sft_start" / "model.safetensors"))
    final = load_file(str(run / "checkpoint" / "model.safetensors"))
    assert final.keys() == base.keys()
    kept = [k for k in base if not k.endswith(ADAPTED)]
    assert kept and all(torch.equal(final[k], base[k]) for k in kept)
    adapted = [k for k in base if k.endswith(ADAPTED)]
    assert all(not torch.equal(start[k], base[k]) for k in adapted)  # the SFT start is where GRPO began
    assert any(not torch.equal(final[k], start[k]) for k in adapted)  # ... and GRPO moved the adapter

    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    snapshot = run / "checkpoints" / "iter000002"
    assert (snapshot / "adapter_model.safetensors").is_file() and not (snapshot / "model.safetensors").exists()
    assert not list(run.glob(".merged.*"))  # the temporary merges are gone
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in log] == [0, 1, 2]
    assert "val_reward" in log[1] and "val_reward" in log[2] and "val_reward" not in log[0]

    baseline = json.loads((run / "manifest.json").read_text())["essa_baseline"]
    assert baseline["trains"] == "adapter"
    assert baseline["train_problems"] == "the alignment fold without its held-out problems: 10 problems"
    trained = {i for a, b in baseline["train_positions"] for i in range(a, b)}
    held = {i for a, b in baseline["val_positions"] for i in range(a, b)}
    assert held == set(range(22, 26)) and len(trained) == 10 and not trained & held
    assert trained == set(range(16, 22)) | set(range(26, 30))


def test_split_too_small_names_the_setting(countdown_model, countdown_data, sft_dir, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match=r"essa_grpo\.train_examples: 31 examples asked for, but .* holds 30"):
        _run(countdown_model, sft_dir, countdown_data, tmp_path / "grpo", {**GRPO, "train_examples": 11})
    assert not (tmp_path / "grpo").exists()  # refused before anything was written


def test_kl_reference_is_the_sft_start(countdown_model, countdown_data, sft_dir, tmp_path):  # noqa: F811
    """With beta > 0 TRL keeps a frozen copy of the loaded adapter as the reference: KL is logged, starts at 0
    (policy = reference = the SFT start, not the base), and only the trained adapter is saved."""
    run = tmp_path / "grpo"
    _run(countdown_model, sft_dir, countdown_data, run, {**GRPO, "beta": 0.1, "keep_every": 1})
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert log[0]["kl"] == 0.0 and all("kl" in r for r in log) and log[-1]["kl"] > 0  # the reference stays put
    for folder in (run / "adapter", run / "checkpoints" / "iter000001"):
        assert sorted(p.name for p in folder.iterdir()) == ["README.md", "adapter_config.json",
                                                            "adapter_model.safetensors"]


def test_ppo_refuses_an_adapter(tmp_path):
    from esrepro.rl.run import train_rl
    from esrepro.settings.methods import PPOSettings
    from esrepro.tasks import get_task
    from esrepro.train.context import TrainContext

    ctx = TrainContext(method="ppo", model="test", model_dir=tmp_path, dtype="float32", chat=False,
                       settings=PPOSettings.model_validate({"algorithm": "ppo", "sample_budget": 8}),
                       task=get_task("countdown"), examples=[], seed=0, run_dir=tmp_path, adapter_dir=tmp_path)
    with pytest.raises(ValueError, match="adapter_dir.*not implemented for PPO"):
        train_rl(ctx)


def test_trains_all_moves_every_weight(countdown_model, countdown_data, sft_dir, tmp_path):  # noqa: F811
    run = tmp_path / "grpo"
    _run(countdown_model, sft_dir, countdown_data, run, trains="all")
    start = load_file(str(run / "sft_start" / "model.safetensors"))
    final = load_file(str(run / "checkpoint" / "model.safetensors"))
    assert any(not torch.equal(final[k], start[k]) for k in start if not k.endswith(ADAPTED))
    assert not (run / "adapter").exists() and (run / "checkpoints" / "iter000002" / "model.safetensors").is_file()
    assert json.loads((run / "manifest.json").read_text())["essa_baseline"]["trains"] == "all"
