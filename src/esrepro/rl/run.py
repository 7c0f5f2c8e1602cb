"""One RL run into a run directory shaped like ES's: checkpoint/, log.jsonl, manifest.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esrepro.rl.budget import Budget, rl_budget, samples_per_step
from esrepro.tasks.base import Task


def budget_of(settings: dict) -> Budget:
    """The run's steps from the ES sample budget the plan put in its settings (``sample_budget``)."""
    if "sample_budget" not in settings:
        raise ValueError("RL settings need sample_budget (the ES run's iterations x population x train_examples)")
    return rl_budget(int(settings["sample_budget"]), samples_per_step(settings))


def train_rl(model_dir: str | Path, task: Task, examples: list[dict], settings: dict, *, seed: int,
             dtype: str, chat: bool, snapshot_dir: str | Path | None = None) -> tuple[Any, Any, list[dict], Budget]:
    """Dispatch to the algorithm's trainer for the budgeted number of steps; returns (policy, tokenizer, log, budget).

    Every log row gets ``iteration`` (= step), so the ES curve tooling reads RL logs too.
    """
    budget = budget_of(settings)
    algorithm = settings["algorithm"]
    if algorithm in ("grpo", "dr_grpo"):
        from esrepro.rl.grpo import train_grpo as trainer
    elif algorithm == "ppo":
        from esrepro.rl.ppo import train_ppo as trainer
    else:
        raise ValueError(f"unknown RL algorithm {algorithm!r}")
    extra = {"snapshot_dir": snapshot_dir} if snapshot_dir is not None and algorithm != "ppo" else {}
    if snapshot_dir is not None and algorithm == "ppo" and settings.get("save_every"):
        raise ValueError("save_every (kept snapshots) is not implemented for PPO")
    model, tok, rows = trainer(model_dir, task, examples, settings, steps=budget.steps, seed=seed, dtype=dtype,
                               chat=chat, **extra)
    rows = [{"iteration": r["step"], **r} for r in rows]
    return model, tok, rows, budget
