"""Equal sample budgets: every method sees as many scored training samples as ES.

The paper compares methods at the same number of training-sample evaluations.
ES scores every population member on every training example in every iteration:
``iterations x population x train_examples`` samples. An RL step scores
``samples_per_step`` sampled completions, so an RL run gets
``floor(budget / samples_per_step)`` optimiser steps (at least one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from esrepro.settings.methods import GRPO_ALGORITHMS


def es_sample_budget(es_settings: dict) -> int:
    """Training-sample evaluations of an ES run: iterations x population x prompts per iteration (train_examples,
    or ``prompts_per_iteration`` when each iteration scores a batch of them)."""
    per = es_settings.get("prompts_per_iteration") or es_settings["train_examples"]
    return int(es_settings["iterations"]) * int(es_settings["population"]) * int(per)


def samples_per_step(settings: dict) -> int:
    """Completions scored per optimiser step of an RL method's settings.

    GRPO (TRL): ``per_device_train_batch_size x gradient_accumulation_steps`` completions
    (one process), i.e. ``prompts x num_generations``; PPO (ours): ``prompts_per_step`` prompts,
    one response each.
    """
    algorithm = settings.get("algorithm")
    if algorithm in GRPO_ALGORITHMS:
        return int(settings["per_device_train_batch_size"]) * int(settings.get("gradient_accumulation_steps", 1))
    if algorithm == "ppo":
        return int(settings["prompts_per_step"])
    raise ValueError(f"algorithm {algorithm!r} has no samples-per-step rule")


def prompts_per_step(settings: dict) -> int:
    """Distinct training problems one optimiser step draws (GRPO: completions / ``num_generations``; PPO: all)."""
    per_step = samples_per_step(settings)
    return per_step // int(settings["num_generations"]) if settings.get("algorithm") in GRPO_ALGORITHMS \
        else per_step


def prompts_per_generation(settings: dict) -> int:
    """Problems one GRPO rollout draws: a step's prompts x ``updates_per_generation`` (PPO: a step's prompts)."""
    return prompts_per_step(settings) * int(settings.get("updates_per_generation", 1) or 1)


def check_problem_count(settings: dict, n_problems: int, field: str = "train_examples") -> None:
    """Refuse a run whose training problems are fewer than one rollout draws (TRL would run no step at all), unless
    ``repeat_prompts`` fills its rollouts with copies of them (esrepro.rl.grpo.training_examples)."""
    need = prompts_per_generation(settings)
    if n_problems < need and not settings.get("repeat_prompts"):
        draw = "rollout" if int(settings.get("updates_per_generation", 1) or 1) > 1 else "step"
        raise ValueError(f"{field}: {n_problems} training problems, but one {settings.get('algorithm')} {draw} draws "
                         f"{need} distinct problems (per_device_train_batch_size x gradient_accumulation_steps x "
                         "updates_per_generation / num_generations); give more problems, a smaller batch, or "
                         "repeat_prompts: true")


@dataclass(frozen=True)
class Budget:
    """An RL run's share of the ES budget, recorded in its manifest and printed in Table 1's notes."""

    sample_budget: int       # ES: iterations x population x train_examples
    samples_per_step: int    # completions scored per RL optimiser step
    steps: int               # RL optimiser steps: floor(sample_budget / samples_per_step), >= 1
    samples_used: int        # steps x samples_per_step (<= sample_budget unless steps was raised to 1)

    def as_dict(self) -> dict:
        return asdict(self)


def rl_budget(sample_budget: int, per_step: int) -> Budget:
    """Steps of an RL run whose every step scores ``per_step`` samples, within ``sample_budget``."""
    if sample_budget < 1 or per_step < 1:
        raise ValueError(f"sample_budget ({sample_budget}) and samples_per_step ({per_step}) must be positive")
    steps = max(1, sample_budget // per_step)
    return Budget(sample_budget, per_step, steps, steps * per_step)
