"""GRPO-v and Dr.GRPO-v (the ES paper v2's VERL baselines, App. A.2) on TRL: the settings map to the intended
GRPOConfig, TRL computes VERL's advantages and loss aggregation on a real (tiny) model, the rollouts are VERL's
shape (several optimiser steps per rollout, prompts repeated to fill one), and a short run trains."""

from __future__ import annotations

import pytest
import torch

from esrepro.models.loading import load_tokenizer
from esrepro.rl.budget import check_problem_count, prompts_per_generation, rl_budget, samples_per_step
from esrepro.rl.grpo import grpo_config_kwargs, train_grpo, training_examples
from esrepro.settings.methods import GRPOSettings
from test_rl_trainers import SHORT, LengthTask  # a reward that varies on an untrained model


def _settings(algorithm: str, **over) -> dict:
    return GRPOSettings(algorithm=algorithm, **over).as_dict()


def _paper(algorithm: str) -> dict:
    """The paper config's GRPO-v / Dr.GRPO-v: VERL's defaults, with prompts repeated to fill a rollout."""
    return _settings(algorithm, repeat_prompts=True)


def test_verl_variants_map_to_the_intended_grpo_config():
    """A.2: batch 1,024 prompts x 8, lr 1e-6; GRPO-v token-mean with KL 1e-3, Dr.GRPO-v seq-mean-token-sum-norm
    (scale 1,024) without KL or std scaling; VERL's mini-batch of 256 prompts: 4 optimiser steps per rollout."""
    for algorithm, loss, scale, beta in (("verl_grpo", "bnpo", "group", 1e-3), ("verl_dr_grpo", "dr_grpo", "none", 0.0)):
        s = _settings(algorithm)
        # 8 training processes (the registry's 7B/8B RL job): each 16 completions per micro-step (VERL's math example)
        kw = grpo_config_kwargs(s, steps=1464, seed=0, output_dir="x", on_cpu=False, world_size=8,
                                fsdp_layers=["Qwen2DecoderLayer"])
        assert (kw["loss_type"], kw["scale_rewards"], kw["beta"]) == (loss, scale, beta)
        assert (kw["learning_rate"], kw["num_generations"], kw["max_completion_length"]) == (1e-6, 8, 1024)
        assert (kw["weight_decay"], kw["epsilon"], kw["max_grad_norm"], kw["temperature"]) == (0.01, 0.2, 1.0, 1.0)
        assert kw["lr_scheduler_type"] == "constant" and kw["vllm_importance_sampling_correction"] is False
        assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"]) == (16, 16)
        # 2,048 completions per optimiser step, a rollout of 4 of them: 8,192 completions = 1,024 prompts x 8
        assert samples_per_step(s) == 2048 and prompts_per_generation(s) == 1024
        assert kw["per_device_train_batch_size"] * 8 * kw["steps_per_generation"] == 8192
        assert "updates_per_generation" not in kw and "repeat_prompts" not in kw  # ours, not GRPOConfig's
        from trl import GRPOConfig

        cfg = GRPOConfig(**{**grpo_config_kwargs(s, steps=2, seed=0, output_dir="x", on_cpu=True)})
        assert cfg.generation_batch_size == 8192 and cfg.steps_per_generation == 512
    # ES's budget (500 x 30 x 200): 1,464 steps of 2,048 = 366 rollouts
    b = rl_budget(3_000_000, samples_per_step(_settings("verl_grpo")))
    assert (b.steps, b.steps % 4) == (1464, 0)
    # a config may still override any of VERL's values; the variant's loss type stays pinned
    assert _settings("verl_grpo", beta=0.0, updates_per_generation=1)["beta"] == 0.0
    with pytest.raises(ValueError, match="loss_type bnpo"):
        GRPOSettings(algorithm="verl_grpo", loss_type="grpo")


def test_rollouts_larger_than_the_problems_repeat_them():
    """A VERL rollout of 1,024 prompts from 200 problems: whole copies (each ~5 times a rollout); without
    repeat_prompts such a run is refused, as TRL would run no step."""
    s = _paper("verl_grpo")
    problems = [{"id": i} for i in range(200)]
    rows = training_examples(problems, s)
    assert len(rows) % 1024 == 0 and len(rows) == 25_600  # lcm(200, 1,024): no incomplete rollout to drop
    assert all(rows.count(p) == 128 for p in problems[:3])
    check_problem_count(s, 200)
    with pytest.raises(ValueError, match="repeat_prompts"):
        check_problem_count({**s, "repeat_prompts": False}, 200)
    assert training_examples(problems, _settings("grpo")) == problems  # GRPO-z: 32 prompts a step, no copies

# --- TRL's numbers against VERL's formulas, on a real tiny model ---------------------------------------------------


def _tiny(algorithm: str, **over) -> dict:
    return _settings(algorithm, **{"max_new_tokens": 8, "num_generations": 4, "per_device_train_batch_size": 8,
                                   "gradient_accumulation_steps": 1, "updates_per_generation": 1,
                                   "learning_rate": 1e-3, "train_examples": 4, "bf16": False,
                                   "gradient_checkpointing": False, **over})


def _trainer(model_dir, settings: dict, tmp_path, reward):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = load_tokenizer(model_dir)
    tok.padding_side = "left"
    cfg = GRPOConfig(**grpo_config_kwargs(settings, steps=1, seed=0, output_dir=str(tmp_path), on_cpu=True),
                     model_init_kwargs={"dtype": torch.float32})
    return GRPOTrainer(model=str(model_dir), reward_funcs=[reward], args=cfg, processing_class=tok,
                       train_dataset=Dataset.from_list([{"prompt": e["prompt"]} for e in SHORT]))


def _logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """log pi(token) of each completion token (temperature 1), by hand."""
    ids = torch.cat([prompt_ids, completion_ids], 1)
    logits = model(input_ids=ids, attention_mask=torch.cat([prompt_mask, completion_mask], 1)).logits
    logits = logits[:, prompt_ids.size(1) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def unequal_micro_batch(vocab: int) -> tuple[torch.Tensor, ...]:
    """One micro-batch of 4 random completions of unequal lengths (6, 3, 4 and 1 tokens) after 5-token prompts, with
    advantages of both signs: prompt ids and mask, completion ids and mask, advantages."""
    prompt_ids = torch.randint(5, vocab, (4, 5))
    completion_ids = torch.randint(5, vocab, (4, 6))
    completion_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    return prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask, torch.tensor([1.0, -0.5, 0.25, -0.75])


@pytest.mark.parametrize("algorithm", ["verl_grpo", "verl_dr_grpo"])
def test_trl_loss_is_verls_aggregation(tiny_model_dir, tmp_path, algorithm):
    """One micro-batch of 4 completions of unequal lengths: TRL's loss equals VERL's policy loss (ratio 1 on
    policy, so clip and dual-clip are inactive) plus beta x low_var_kl, aggregated as VERL does: token-mean
    (GRPO-v) or sequence mean of token sums / 1,024 (Dr.GRPO-v, A.2's scaling factor)."""
    torch.manual_seed(0)
    s = _tiny(algorithm, beta=0.05, max_new_tokens=1024)
    trainer = _trainer(tiny_model_dir, s, tmp_path, lambda completions, **kw: [0.0] * len(completions))
    model = trainer.model.eval()  # eval: no accumulation divisor (one micro-batch is the whole step here)
    prompt_ids, prompt_mask, completion_ids, completion_mask, advantages = unequal_micro_batch(model.config.vocab_size)
    with torch.no_grad():
        logp = _logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    ref = logp + 0.3 * torch.randn_like(logp)  # a reference model that differs from the policy
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": advantages, "ref_per_token_logps": ref,
              "num_items_in_batch": completion_mask.sum()}
    trl_loss = trainer._compute_loss(model, inputs)

    # VERL (core_algos.compute_policy_loss_vanilla, kl_penalty low_var_kl, agg_loss), by hand
    mask = completion_mask.float()
    ratio = torch.exp(logp - logp)
    a = advantages.unsqueeze(1)
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - 0.2, 1 + 0.2))
    pg = torch.where(a < 0, torch.minimum(-a * 3.0, pg), pg)  # dual clip, clip_ratio_c 3
    kl = (ref - logp).clamp(-20, 20)
    kld = (torch.exp(kl) - kl - 1).clamp(-10, 10)
    per_token = pg + 0.05 * kld
    if algorithm == "verl_grpo":  # token-mean
        want = (per_token * mask).sum() / mask.sum()
    else:  # seq-mean-token-sum-norm with loss_scale_factor 1,024
        want = ((per_token * mask).sum(-1) / 1024).mean()
    assert trl_loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
    assert trl_loss.item() != pytest.approx(((per_token * mask).sum(-1) / mask.sum(-1)).mean().item(), rel=1e-3)


@pytest.mark.parametrize("algorithm", ["verl_grpo", "verl_dr_grpo"])
def test_trl_advantages_are_verls(tiny_model_dir, tmp_path, algorithm):
    """TRL's group advantages for sampled completions equal VERL's compute_grpo_outcome_advantage: (r - group mean)
    / (unbiased group std + eps) for GRPO-v, r - group mean for Dr.GRPO-v (VERL's eps 1e-6, TRL's 1e-4)."""
    torch.manual_seed(0)
    rewards_seen: list[float] = []

    def reward(completions, **kw):
        out = [float(len(c) % 5) for c in completions]
        rewards_seen.extend(out)
        return out

    s = _tiny(algorithm, temperature=1.5)
    trainer = _trainer(tiny_model_dir, s, tmp_path, reward)
    batch = [{"prompt": SHORT[i // 4]["prompt"]} for i in range(8)]  # 2 prompts x group of 4
    out = trainer._generate_and_score_completions(batch)
    r = torch.tensor(rewards_seen).view(-1, 4)
    centred = r - r.mean(1, keepdim=True)
    want = centred / (r.std(1, keepdim=True) + 1e-6) if algorithm == "verl_grpo" else centred
    assert r.std(1).gt(0).any()  # the check compares something
    torch.testing.assert_close(out["advantages"].view(-1, 4), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("algorithm", ["verl_grpo", "verl_dr_grpo"])
def test_a_verl_variant_trains_with_rollouts_of_repeated_prompts(tiny_model_dir, algorithm):
    """2 optimiser steps from one rollout of 8 prompts drawn from 4 problems (copies), with the KL term for GRPO-v."""
    torch.set_num_threads(1)
    s = _tiny(algorithm, num_generations=2, updates_per_generation=2, repeat_prompts=True)  # 4 a step, 8 a rollout
    assert prompts_per_generation(s) == 8 > len(SHORT)
    model, _, rows = train_grpo(tiny_model_dir, LengthTask(), SHORT, s, steps=2, seed=0)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(("kl" in r) == (algorithm == "verl_grpo") for r in rows)
    from safetensors.torch import load_file

    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(base[k], v) for k, v in model.state_dict().items() if k in base)


def test_essas_grpo_baseline_runs_with_verls_semantics():
    """ESSA Sec. 4.4 ran its GRPO baseline on VERL: the study's baseline is verl_grpo with ESSA's own lr 1e-4, 80
    prompts x 4 per step (one step per rollout) and no KL term, in the paper config and in the tiny one."""
    from pathlib import Path

    from esrepro.config import load_yaml
    from esrepro.planning.load import load_pipeline

    repo = Path(__file__).resolve().parents[1]
    for name, model, task in (("paper.yaml", "qwen2.5-math-7b", "gsm8k"), ("config.yaml", "tiny", "countdown")):
        p = load_pipeline(load_yaml(repo / "config" / name), f"config/{name}", root=repo)
        s = p.method_settings(model, task, "essa_grpo").as_dict()
        assert p.algorithm_of(task, "essa_grpo").name == "verl_grpo"
        assert (s["algorithm"], s["loss_type"], s["scale_rewards"], s["beta"]) == ("verl_grpo", "bnpo", "group", 0.0)
        assert (s["learning_rate"], s["num_generations"], s["updates_per_generation"]) == (1e-4, 4, 1)
        assert s["weight_decay"] == 0.01 and s["vllm_importance_sampling_correction"] is False
    paper = load_pipeline(load_yaml(repo / "config" / "paper.yaml"), "config/paper.yaml", root=repo)
    assert samples_per_step(paper.method_settings("qwen2.5-math-7b", "gsm8k", "essa_grpo").as_dict()) == 320


@pytest.mark.slow
def test_cli_trains_grpo_v_into_the_run_shape(tiny_model_dir, tmp_path):
    """`esrepro train` with a GRPO-v spec: 2 steps from one rollout of 8 prompts (4 problems, repeated), the budget
    and the per-process batch in the manifest."""
    import json
    import subprocess
    import sys

    from esrepro.tasks.countdown import prepare

    data = tmp_path / "countdown"
    prepare(data, {"kind": "generated", "n_train": 4, "n_test": 4}, seed=0)
    spec = {**_tiny("verl_grpo", num_generations=2, updates_per_generation=2, repeat_prompts=True),
            "sample_budget": 16}  # 16 // 8 completions per step = 2 steps
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "esrepro.cli", "train", "--method", "grpov", "--task", "countdown",
                    "--model", "test", "--model-dir", str(tiny_model_dir), "--data-dir", str(data),
                    "--spec", json.dumps(spec), "--seed", "0", "--out", str(out), "--threads", "1"],
                   check=True, timeout=600)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in log] == [0, 1] and log[0]["reward_mean"] == log[1]["reward_mean"]  # one rollout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["budget"] == {"sample_budget": 16, "samples_per_step": 8, "steps": 2, "samples_used": 16}
    assert manifest["settings"]["algorithm"] == "verl_grpo" and manifest["settings"]["loss_type"] == "bnpo"
