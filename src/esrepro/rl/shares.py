"""Which training-process counts an RL run's per-step batch admits: the one rule that the launcher's layout
(esrepro.planning.cluster.rl_job) and the training processes themselves (GRPO: esrepro.rl.grpo_parallel.process_batch;
PPO: :func:`shares`) both follow, so a job is never given a process count its own training refuses.

Kept free of torch: the workflow calls it for every RL job while it builds the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

from esrepro.runtime.distributed import split_batch
from esrepro.settings.methods import GRPO_ALGORITHMS


@dataclass(frozen=True)
class Shares:
    """One process's part of a PPO step (responses): the manifest records it."""

    world_size: int
    prompts_per_process: int     # rollouts per process and step (prompts_per_step / world_size)
    mini_batch_per_process: int  # responses per process and optimiser step (mini_batch_size / world_size)
    micro_batch_size: int        # responses per forward/backward pass (per process)
    rollout_batch_size: int      # responses per generate call (per process)
    generate_calls: int          # generate calls per process and step

    def as_dict(self) -> dict:
        return asdict(self)


def shares(cfg: Any, world_size: int) -> Shares:
    """Each PPO process's share of the settings' per-step totals; an error naming the field that does not split."""
    prompts = split_batch(cfg.prompts_per_step, world_size, "prompts_per_step")
    mini = split_batch(cfg.mini_batch_size, world_size, "mini_batch_size")
    if mini % cfg.micro_batch_size:
        raise ValueError(f"micro_batch_size: {cfg.micro_batch_size} responses per pass must divide each process's "
                         f"share of mini_batch_size ({cfg.mini_batch_size} / {world_size} processes = {mini})")
    rollout = min(cfg.rollout_batch_size or prompts, prompts)
    return Shares(world_size, prompts, mini, cfg.micro_batch_size, rollout, -(-prompts // rollout))


def per_process(settings: dict, world_size: int) -> dict:
    """One process's share of an RL run's per-step batch under ``world_size`` processes (``settings``: the run's
    method settings as a dict); a ValueError naming the field when that many processes cannot share it."""
    algorithm = settings.get("algorithm")
    if algorithm in GRPO_ALGORITHMS:
        from esrepro.rl.grpo_parallel import process_batch

        return process_batch(settings, world_size)
    if algorithm == "ppo":
        from esrepro.settings.methods import PPOSettings

        fields = ("prompts_per_step", "mini_batch_size", "micro_batch_size", "rollout_batch_size")
        cfg = {f: settings.get(f, PPOSettings.model_fields[f].default) for f in fields}
        return shares(SimpleNamespace(**cfg), world_size).as_dict()
    raise ValueError(f"algorithm {algorithm!r} is not trained as one process per GPU")


def admits(settings: dict, world_size: int) -> bool:
    """Whether ``world_size`` training processes can share the run's per-step batch (:func:`per_process`)."""
    try:
        per_process(settings, world_size)
    except ValueError:
        return False
    return True


def largest_world(settings: dict, most: int) -> int:
    """The most training processes, at most ``most``, that the run's per-step batch admits (1 always does)."""
    return max(w for w in range(1, most + 1) if w == 1 or admits(settings, w))
