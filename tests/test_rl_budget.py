"""Equal sample budgets: RL steps from the ES budget."""

from __future__ import annotations

import pytest

from esrepro.rl.budget import es_sample_budget, rl_budget, samples_per_step
from esrepro.rl.grpo import grpo_config_kwargs


def test_es_budget_is_iterations_x_population_x_examples():
    assert es_sample_budget({"iterations": 30, "population": 16, "train_examples": 64}) == 30_720
    assert es_sample_budget({"iterations": 500, "population": 30, "train_examples": 200}) == 3_000_000


def test_samples_per_step_per_algorithm():
    grpo = {"algorithm": "grpo", "per_device_train_batch_size": 32, "gradient_accumulation_steps": 8}
    assert samples_per_step(grpo) == 256
    assert samples_per_step({"algorithm": "dr_grpo", "per_device_train_batch_size": 60,
                             "gradient_accumulation_steps": 1}) == 60
    assert samples_per_step({"algorithm": "ppo", "prompts_per_step": 256}) == 256
    with pytest.raises(ValueError, match="samples-per-step"):
        samples_per_step({"algorithm": "es"})


def test_rl_steps_never_exceed_the_budget():
    b = rl_budget(30_720, 256)
    assert (b.steps, b.samples_used) == (120, 30_720)
    b = rl_budget(3_000_000, 240)
    assert b.steps == 12_500 and b.samples_used == 3_000_000
    b = rl_budget(1000, 96)
    assert b.steps == 10 and b.samples_used == 960 <= 1000
    assert rl_budget(10, 64).steps == 1  # at least one step
    with pytest.raises(ValueError):
        rl_budget(0, 8)


PINNED = dict(algorithm="grpo", loss_type="grpo", scale_rewards="group", beta=0.0, num_generations=2,
              learning_rate=1e-4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8,
              per_device_train_batch_size=4, gradient_accumulation_steps=1, epsilon=0.2, num_iterations=1,
              lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, bf16=True,
              gradient_checkpointing=True, disable_dropout=True, mask_truncated_completions=False,
              importance_sampling_level="token")


def test_grpo_settings_must_pin_drifting_defaults_and_match_the_algorithm():
    kw = grpo_config_kwargs(PINNED, steps=5, seed=1, output_dir="x", on_cpu=True)
    assert kw["max_steps"] == 5 and kw["loss_type"] == "grpo" and kw["scale_rewards"] == "group"
    assert kw["bf16"] is False and kw["gradient_checkpointing"] is False and kw["use_cpu"] is True
    assert kw["max_completion_length"] == 8 and "max_new_tokens" not in kw  # TRL's name for it
    assert grpo_config_kwargs(PINNED, steps=5, seed=1, output_dir="x", on_cpu=False)["bf16"] is True
    with pytest.raises(ValueError, match="loss_type"):
        grpo_config_kwargs({k: v for k, v in PINNED.items() if k != "loss_type"}, steps=1, seed=0,
                           output_dir="x", on_cpu=True)
    with pytest.raises(ValueError, match="dr_grpo/none"):
        grpo_config_kwargs({**PINNED, "algorithm": "dr_grpo"}, steps=1, seed=0, output_dir="x", on_cpu=True)


def test_a_grpo_step_needs_as_many_problems_as_it_draws():
    """TRL runs no step at all when the problems are fewer than one step's prompts: refused with the fields."""
    from esrepro.rl.budget import check_problem_count, prompts_per_step

    grpo = {"algorithm": "grpo", "per_device_train_batch_size": 32, "gradient_accumulation_steps": 2,
            "num_generations": 4}
    assert prompts_per_step(grpo) == 16 and prompts_per_step({"algorithm": "ppo", "prompts_per_step": 8}) == 8
    check_problem_count(grpo, 16)
    with pytest.raises(ValueError, match="train_examples: 15 training problems, but one grpo step draws 16"):
        check_problem_count(grpo, 15)
