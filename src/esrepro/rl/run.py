"""The RL trainer: GRPO / Dr.GRPO (TRL) or PPO for as many steps as the ES sample budget allows."""

from __future__ import annotations

import shutil
from pathlib import Path

from esrepro import paths as P
from esrepro.rl.budget import Budget, rl_budget, samples_per_step
from esrepro.settings.methods import GRPO_ALGORITHMS
from esrepro.train.context import TrainContext, TrainOutcome


def budget_of(settings: dict) -> Budget:
    """The run's steps from the ES sample budget the plan put in its settings (``sample_budget``)."""
    if not settings.get("sample_budget"):
        raise ValueError("RL settings need sample_budget (the ES run's iterations x population x train_examples)")
    return rl_budget(int(settings["sample_budget"]), samples_per_step(settings))


def _resuming(algorithm: str, resume_dir: Path) -> bool:
    """Whether the run continues from a resume state (then its kept snapshots and periodic rows stay)."""
    if algorithm in GRPO_ALGORITHMS:
        from esrepro.rl.trl_resume import last_complete

        return last_complete(resume_dir) is not None
    from esrepro.train.resume import has_state

    return has_state(resume_dir)


def train_rl(ctx: TrainContext) -> TrainOutcome:
    """Train with the run's RL algorithm; every log row gets ``iteration`` (= step), as ES logs have.

    With ``ctx.adapter_dir`` (GRPO only) the policy is that peft adapter on ``ctx.model_dir``, and the
    outcome's ``save`` writes the trained adapter (peft format), not a checkpoint.

    The trainer keeps its resume state in ``<run>/resume/`` every ``resume_every`` steps; a restarted run
    continues from it with its snapshots and periodic-evaluation rows, a fresh one starts without them. The state
    is removed once the run directory is complete.
    """
    from esrepro.runtime.distributed import world

    settings = ctx.settings.as_dict()
    budget = budget_of(settings)
    algorithm = settings["algorithm"]
    snapshots = ctx.run_dir / P.SNAPSHOTS
    resume_dir = ctx.run_dir / P.RESUME
    if algorithm in GRPO_ALGORITHMS:
        from esrepro.rl.grpo import train_grpo as trainer
    elif algorithm == "ppo":
        from esrepro.rl.ppo import train_ppo as trainer
    else:
        raise ValueError(f"unknown RL algorithm {algorithm!r}")
    here = world()
    from esrepro.train.periodic import clear_periodic, periodic_of, write_periodic

    if here.is_main and not _resuming(algorithm, resume_dir):  # a fresh run: no stale snapshots or points
        shutil.rmtree(snapshots, ignore_errors=True)
        clear_periodic(ctx.run_dir)
    extra: dict = {"resume_dir": resume_dir}
    if ctx.adapter_dir is not None:
        if algorithm == "ppo":
            raise ValueError("training a LoRA adapter (adapter_dir) is not implemented for PPO; GRPO only")
        extra["adapter_dir"] = ctx.adapter_dir
    if settings.get("keep_every"):
        if algorithm == "ppo":
            raise ValueError("keep_every (kept snapshots) is not implemented for PPO")
        extra["snapshot_dir"] = snapshots
    periodic = periodic_of(ctx.settings, ctx.task, ctx.eval_examples)
    if periodic is not None:
        extra["periodic"] = (periodic, budget.samples_per_step)
    model, tok, rows = trainer(ctx.model_dir, ctx.task, ctx.examples, settings, steps=budget.steps, seed=ctx.seed,
                               dtype=ctx.dtype, chat=ctx.chat, **extra)
    if periodic is not None and here.is_main:
        write_periodic(ctx.run_dir, periodic.rows)
    rows = [{"iteration": r["step"], **r} for r in rows]
    manifest: dict = {"budget": budget.as_dict()}
    if algorithm in GRPO_ALGORITHMS:
        from esrepro.rl.grpo_parallel import process_batch

        manifest["per_process"] = process_batch(settings, here.world_size)
        manifest["sharding"] = settings.get("sharding", "ddp")
        if ctx.device == "cpu":
            from esrepro.rl.grpo import cpu_overrides

            manifest["cpu_overrides"] = cpu_overrides(settings)
    else:
        from esrepro.rl.ppo import cpu_overrides
        from esrepro.rl.ppo_parallel import shares

        manifest["per_process"] = shares(ctx.settings, here.world_size).as_dict()
        manifest["sharding"] = settings.get("sharding", "ddp")
        if overrides := cpu_overrides(settings, ctx.device):
            manifest["cpu_overrides"] = overrides

    def save(path: Path) -> None:
        from esrepro.rl.grpo import save_policy

        save_policy(model, tok, path)  # a checkpoint, or a peft policy's trained adapter

    def finish() -> None:
        shutil.rmtree(resume_dir, ignore_errors=True)  # the run directory is complete: nothing to resume

    return TrainOutcome(log=rows, save=save, extra=manifest, finish=finish)
