"""The process group of a training job started by a distributed launcher (torchrun, one process per GPU).

A job on G GPUs runs ``esrepro train`` (or ``essa-sft`` / ``essa-grpo``) in G processes under
``torchrun`` (:func:`esrepro.planning.cluster.launcher`); each reads its place from the launcher's
environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``). Without a launcher the world is one
process. Every process runs the trainer (they exchange gradients); only the main process
(rank 0) writes the run directory.

Batch sizes in a method's settings are totals per optimiser step, whatever the world size:
:func:`split_batch` divides them over the processes, so a run scores the same samples on one
GPU or on eight.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    """This process's place among the job's training processes."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # processes on this node (they share its CPU threads)

    @property
    def is_main(self) -> bool:
        """Whether this process writes the job's outputs (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether the job runs in more than one process."""
        return self.world_size > 1

    def device(self, device: str) -> str:
        """This process's device: its own GPU (``cuda:LOCAL_RANK``) when ``device`` is CUDA, else ``device``."""
        if device.startswith("cuda") and self.distributed:
            return f"cuda:{self.local_rank}"
        return device


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name}={value!r} (set by the distributed launcher) is not an integer") from None


def world() -> World:
    """The world this process was launched into (one process when no launcher set ``WORLD_SIZE``)."""
    size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", rank)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"launcher environment: RANK={rank} is not in [0, WORLD_SIZE={size})")
    return World(rank=rank, local_rank=local, world_size=size, local_world_size=_env_int("LOCAL_WORLD_SIZE", size))


def split_batch(total: int, world_size: int, field: str) -> int:
    """Each process's share of ``total`` (a per-step total of the settings' ``field``); an error naming the
    field when the processes cannot share it evenly."""
    if total % world_size:
        raise ValueError(f"{field}: {total} per optimiser step cannot be split evenly over {world_size} "
                         f"training processes (one per GPU); choose a multiple of {world_size} or another GPU count")
    return total // world_size


def init_process_group(device: str, timeout_s: float | None = None) -> None:
    """Join the launcher's process group (NCCL on GPUs, gloo on CPUs); nothing to do for one process.
    ``timeout_s``: how long a collective waits for every process before the job fails (None: torch's default, 10
    minutes for NCCL); the plan sets it above the longest resume save (esrepro.planning.resume_cost)."""
    from datetime import timedelta

    import torch.distributed as dist

    w = world()
    if not w.distributed or dist.is_initialized():
        return
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(w.local_rank)
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", rank=w.rank, world_size=w.world_size,
                            timeout=timeout)


def barrier() -> None:
    """Wait for every process of the group; nothing to wait for in a one-process world. In a launcher's world of
    several processes the group must exist by then (:func:`init_process_group`): a barrier before it would return
    at once and order nothing, so it is refused."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    elif world().distributed:
        raise RuntimeError(f"barrier in a world of {world().world_size} processes before their process group exists "
                           "(it would wait for nobody): call esrepro.runtime.distributed.init_process_group first")
