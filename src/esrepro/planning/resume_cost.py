"""What an RL run's resume state costs at the paper's scale: its size, the time to write it, how often it is written
(``resume_every: auto``) and the process-group timeout above the longest write (the tables of docs/scaling.md).

- Size: float32 weights and both AdamW moments of every trained model, 12 bytes a parameter each (PPO: actor and
  critic, 24; GRPO: the policy, 12; :data:`esrepro.planning.cost.RESUME_BYTES`); a LoRA policy's adapter is counted as
  nothing beside the base. RNG states, the prompt queue and the log are a few kilobytes.
- Writing: the state is sharded (torch.distributed.checkpoint): under ``sharding: fsdp`` every process writes its
  1/W share, so the job's nodes write in parallel; under ``ddp`` one node writes it whole. Each node writes at
  :data:`WRITE_BYTES_PER_S` to the cluster's shared storage (an assumption: 1 GB/s a node, a parallel file system's
  sustained write per client; measure it on the cluster and change it here), plus :data:`SAVE_OVERHEAD_S` a save.
- Interval: the fewest steps between saves that keep saving at most :data:`MAX_SAVE_SHARE` (3%) of the run's
  time, ``ceil(save seconds / (0.03 x step seconds))`` with a step's seconds from :func:`esrepro.planning.scaling.job_cost`;
  but never more steps than a quarter of one SLURM attempt runs, so an attempt that ends at its time limit loses
  at most a quarter of its work; at most the run's steps.
- Timeout: every collective of the job (NCCL, gloo) waits :data:`TIMEOUT_FACTOR` x the longest save, at least
  :data:`MIN_TIMEOUT_S` (transformers' ``ddp_timeout`` default; NCCL's own is 10 minutes), so a slow save is not
  taken for a dead process.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from esrepro.pipeline import ESSA_GRPO, Pipeline
from esrepro.planning.cluster import layout
from esrepro.planning.cost import RESUME_BYTES
from esrepro.planning.scaling import STARTUP_SECONDS, job_cost, model_parameters, run_steps
from esrepro.settings.methods import MethodSettings

WRITE_BYTES_PER_S = 1e9  # one node's sustained write to the shared file system (assumed)
SAVE_OVERHEAD_S = 10.0  # a save's fixed cost: DCP's planning collectives, opening files, metadata (assumed)
MAX_SAVE_SHARE = 0.03  # saving takes at most this share of a run
ATTEMPT_SHARE = 0.25  # at most this share of one SLURM attempt between two saves
TIMEOUT_FACTOR = 3
MIN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class ResumeCost:
    """One RL run's resume state: size, write time, interval and the process-group timeout."""

    model: str
    method: str
    algorithm: str
    gpus: int
    nodes: int
    state_bytes: float  # the whole state
    bytes_per_rank: float  # the most one process writes
    save_seconds: float
    step_seconds: float
    steps: int
    interval: int  # resume_every
    timeout_s: int  # the process-group timeout

    @property
    def saves(self) -> int:
        return self.steps // self.interval

    @property
    def save_share(self) -> float:
        """The share of the run's training time spent saving."""
        return self.saves * self.save_seconds / (self.steps * self.step_seconds)

    def as_dict(self) -> dict:
        return {**asdict(self), "saves": self.saves, "save_share": self.save_share}


def state_bytes(algorithm: str, params: float, adapter: bool = False) -> float:
    """Bytes of an RL run's resume state (``adapter``: a LoRA policy on a frozen base, counted as 0)."""
    return 0.0 if adapter else RESUME_BYTES[algorithm] * params


def save_seconds(state: float, writer_nodes: int) -> float:
    """Seconds to write ``state`` bytes from ``writer_nodes`` nodes in parallel."""
    return SAVE_OVERHEAD_S + state / (writer_nodes * WRITE_BYTES_PER_S)


def interval(save_s: float, step_s: float, steps: int, attempt_s: float, multiple: int = 1) -> int:
    """Steps between saves: saving at most MAX_SAVE_SHARE of the time, at most ATTEMPT_SHARE of an attempt between
    two saves, at most ``steps``; at least 1; then a multiple of ``multiple`` (a GRPO rollout's optimiser steps: a run
    resumes on rollout boundaries): rounded up where the attempt and the run allow, else down, at least one."""
    want = math.ceil(save_s / (MAX_SAVE_SHARE * step_s))
    cap = max(1, math.floor(ATTEMPT_SHARE * attempt_s / step_s))
    every = max(1, min(want, cap, steps))
    up = -(-every // multiple) * multiple
    return up if up <= min(cap, steps) else max(multiple, every // multiple * multiple)


def timeout_seconds(save_s: float) -> int:
    """The process-group timeout above a save of ``save_s`` seconds."""
    return max(MIN_TIMEOUT_S, math.ceil(TIMEOUT_FACTOR * save_s))


def resume_cost(p: "Pipeline", task: str, model: str, method: str, cell: str | None = None) -> ResumeCost:
    """The resume-state arithmetic of one RL run of the pipeline's config (one grid ``cell`` with ``cell``)."""
    c = job_cost(p, task, model, method, cell)
    s = p.method_settings(model, task, method, cell).as_dict()
    res = layout(p, task, model, method, cell)
    study = p.essa_study()
    adapter = method == ESSA_GRPO and study is not None and study.grpo_trains == "adapter"
    size = state_bytes(c.algorithm, model_parameters(p, model), adapter)
    sharded = s.get("sharding") == "fsdp"
    writers = res.nodes if sharded else 1
    per_rank = size / c.gpus if sharded else size
    save_s = save_seconds(size, writers)
    steps = run_steps(p, task, model, method, cell)
    step_s = max(1e-9, (c.hours * 3600 - STARTUP_SECONDS) / steps)
    every = interval(save_s, step_s, steps, c.runtime_hours * 3600, int(s.get("updates_per_generation") or 1))
    return ResumeCost(model=model, method=method, algorithm=c.algorithm, gpus=c.gpus, nodes=res.nodes,
                      state_bytes=size, bytes_per_rank=per_rank, save_seconds=save_s, step_seconds=step_s,
                      steps=steps, interval=every, timeout_s=timeout_seconds(save_s))


def job_settings(p: Pipeline, model: str, task: str, method: str, cell: str | None = None) -> MethodSettings:
    """The settings one job runs with: the run's resolved settings, an RL run's ``resume_every: auto`` priced into an
    interval and its ``collective_timeout`` (an explicit one kept) by :func:`resume_cost`, whose arithmetic reads the
    settings with ``auto`` unresolved. Every user of a job's arguments calls this: the job's spec
    (:func:`esrepro.planning.specs.method_spec`) and the plan check."""
    settings = p.method_settings(model, task, method, cell)
    if getattr(settings, "resume_every", None) != "auto":
        return settings
    c = resume_cost(p, task, model, method, cell)
    return settings.model_copy(update={"resume_every": c.interval,
                                       "collective_timeout": settings.collective_timeout or c.timeout_s})


def rl_runs(p: "Pipeline") -> list[tuple[str, str, str]]:
    """(task, model, method) of every RL training run of the config, each once (grid cells share the arithmetic)."""
    out: list[tuple[str, str, str]] = []
    for task in p.cfg.train:
        for model in p.train_models(task):
            out += [(task, model, m) for m in p.train_methods(task) if p.is_rl(task, m)]
    study = p.essa_study()
    if study is not None and ESSA_GRPO in p.essa_methods(study.task):
        out += [(study.task, model, ESSA_GRPO) for model in p.essa_models()]
    return list(dict.fromkeys(out))


def markdown_table(costs: list[ResumeCost]) -> str:
    """docs/scaling.md's resume-state table: one row per run."""
    head = ("| model | method | GPUs (nodes) | resume state, GB | per process, GB | save, s | step, s | "
            "resume_every, steps | saves | saving, % of run | process-group timeout, s |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    rows = [f"| {c.model} | {c.method} | {c.gpus} ({c.nodes}) | {c.state_bytes / 1e9:.1f} | "
            f"{c.bytes_per_rank / 1e9:.1f} | {c.save_seconds:.0f} | {c.step_seconds:.1f} | {c.interval:,} | "
            f"{c.saves:,} | {100 * c.save_share:.1f} | {c.timeout_s:,} |" for c in costs]
    return head + "\n".join(rows) + "\n"
