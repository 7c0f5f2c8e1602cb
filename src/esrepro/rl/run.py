"""The RL trainer: GRPO / Dr.GRPO (TRL) or PPO for as many steps as the ES sample budget allows."""

from __future__ import annotations

import shutil
from pathlib import Path

from esrepro import paths as P
from esrepro.rl.budget import Budget, rl_budget, samples_per_step
from esrepro.train.context import TrainContext, TrainOutcome


def budget_of(settings: dict) -> Budget:
    """The run's steps from the ES sample budget the plan put in its settings (``sample_budget``)."""
    if not settings.get("sample_budget"):
        raise ValueError("RL settings need sample_budget (the ES run's iterations x population x train_examples)")
    return rl_budget(int(settings["sample_budget"]), samples_per_step(settings))


def train_rl(ctx: TrainContext) -> TrainOutcome:
    """Train with the run's RL algorithm; every log row gets ``iteration`` (= step), as ES logs have.

    With ``ctx.adapter_dir`` (GRPO only) the policy is that peft adapter on ``ctx.model_dir``, and the
    outcome's ``save`` writes the trained adapter (peft format), not a checkpoint.
    """
    settings = ctx.settings.as_dict()
    budget = budget_of(settings)
    algorithm = settings["algorithm"]
    snapshots = ctx.run_dir / P.SNAPSHOTS
    shutil.rmtree(snapshots, ignore_errors=True)  # RL runs do not resume: no stale snapshots
    if algorithm in ("grpo", "dr_grpo"):
        from esrepro.rl.grpo import train_grpo as trainer
    elif algorithm == "ppo":
        from esrepro.rl.ppo import train_ppo as trainer
    else:
        raise ValueError(f"unknown RL algorithm {algorithm!r}")
    extra = {}
    if ctx.adapter_dir is not None:
        if algorithm == "ppo":
            raise ValueError("training a LoRA adapter (adapter_dir) is not implemented for PPO; GRPO only")
        extra["adapter_dir"] = ctx.adapter_dir
    if settings.get("keep_every"):
        if algorithm == "ppo":
            raise ValueError("keep_every (kept snapshots) is not implemented for PPO")
        extra["snapshot_dir"] = snapshots
    from esrepro.train.periodic import clear_periodic, periodic_of, write_periodic

    clear_periodic(ctx.run_dir)  # RL runs do not resume: a rerun writes its own points
    periodic = periodic_of(ctx.settings, ctx.task, ctx.eval_examples)
    if periodic is not None:
        extra["periodic"] = (periodic, budget.samples_per_step)
    model, tok, rows = trainer(ctx.model_dir, ctx.task, ctx.examples, settings, steps=budget.steps, seed=ctx.seed,
                               dtype=ctx.dtype, chat=ctx.chat, **extra)
    if periodic is not None:
        write_periodic(ctx.run_dir, periodic.rows)
    rows = [{"iteration": r["step"], **r} for r in rows]
    manifest: dict = {"budget": budget.as_dict()}
    if algorithm in ("grpo", "dr_grpo") and ctx.device == "cpu":
        from esrepro.rl.grpo import cpu_overrides

        manifest["cpu_overrides"] = cpu_overrides(settings)

    def save(path: Path) -> None:
        from esrepro.rl.grpo import save_policy

        save_policy(model, tok, path)  # a checkpoint, or a peft policy's trained adapter

    return TrainOutcome(log=rows, save=save, extra=manifest)
