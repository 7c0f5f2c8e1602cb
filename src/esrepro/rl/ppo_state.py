"""PPO's resume state (``<run>/resume/``): written atomically every ``resume_every`` optimiser steps.

It holds the completed steps, the prompt-order queue, numpy's RNG state (state.json); the log rows and the
periodic evaluation's points so far; actor and critic weights and both AdamW states in ``weights/``, written by
torch.distributed.checkpoint with every process writing its own shard (FSDP2: its 1/W of the float32 masters and
moments; DDP: the replicated tensors, each written once), so no process gathers the whole state and the write
is spread over the nodes; and each process's torch RNG states (CPU and, on GPUs, its CUDA device). A state written
with other settings, seed or number of processes (each process's RNG state and prompt share) is refused with a
message naming the folder to delete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esrepro.rl import ppo_parallel as par
from esrepro.train.resume import has_state, read_state, state_key, write_state

#: Settings that do not change the weights a run ends with (a resume may change them).
NOT_IN_STATE = {"resume_every", "collective_timeout", "eval_every", "eval_limit", "eval_batch_size", "eval_max_new_tokens", "keep_every",
                "sample_budget"}


@dataclass
class Progress:
    """Where a run stands: completed steps, the prompt-order queue, the log rows and periodic points so far."""

    step: int
    order: list[int]
    rows: list[dict]
    periodic_rows: list[dict]


def key(cfg: Any, seed: int, world_size: int, dtype: str) -> dict:
    """What a state must have been written with (an error when ``resume_every`` is still ``auto``: the plan resolves
    it, esrepro.planning.resume_cost)."""
    if cfg.resume_every == "auto":
        raise ValueError("resume_every: auto is resolved by the plan from the run's resume state and step time "
                         "(esrepro.planning.resume_cost); a run given it directly needs a number of steps")
    return state_key(cfg, seed, NOT_IN_STATE, {"world_size": world_size, "dtype": dtype})


def _rng_state(device: str) -> dict:
    out = {"cpu": torch.get_rng_state()}
    if device.startswith("cuda"):
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


WEIGHTS = "weights"  # the torch.distributed.checkpoint folder inside the state


def _pairs(models: dict) -> dict:
    return {"actor": (models["actor"], models["actor_optim"]), "critic": (models["critic"], models["critic_optim"])}


def save(resume_dir: str | Path, run_key: dict, progress: Progress, rng: np.random.Generator, models: dict,
         device: str, is_main: bool) -> None:
    """Write the state (every process calls it: each writes its shard of the weights and optimiser states into the
    temporary folder rank 0 opened, which rank 0 renames into place once all are written)."""
    rngs = par.gather_objects(_rng_state(device))
    if not is_main:
        folder = par.gather_objects(None)[0]  # the temporary folder rank 0 opened
        par.save_training_state(_pairs(models), str(Path(folder) / WEIGHTS))
        par.gather_objects(None)  # rank 0 renames only once every shard is written
        par.gather_objects(None)  # nobody reads a half-written state
        return

    def payload(folder: Path) -> None:
        par.gather_objects(str(folder))
        par.save_training_state(_pairs(models), str(folder / WEIGHTS))
        torch.save(rngs, folder / "rng.pt")
        par.gather_objects(None)

    meta = {"completed_steps": progress.step, "config": run_key, "order": progress.order,
            "numpy_rng": rng.bit_generator.state}
    write_state(resume_dir, meta, progress.rows, payload, {"periodic_eval": progress.periodic_rows})
    par.gather_objects(None)


def load(resume_dir: str | Path, run_key: dict, rng: np.random.Generator, models: dict, device: str,
         rank: int) -> Progress | None:
    """Continue from the state in ``resume_dir`` (None: there is none); restores weights, optimisers, RNGs."""
    if resume_dir is None or not has_state(resume_dir):
        return None
    folder = Path(resume_dir)
    periodic_rows: list[dict] = []
    extra = {"periodic_eval": periodic_rows}
    meta, rows = read_state(folder, run_key, extra)
    par.load_training_state(_pairs(models), str(folder / WEIGHTS))  # each process reads its own shards
    rngs = torch.load(folder / "rng.pt", weights_only=True)
    torch.set_rng_state(rngs[rank]["cpu"])
    if "cuda" in rngs[rank] and device.startswith("cuda"):
        torch.cuda.set_rng_state(rngs[rank]["cuda"], device)
    rng.bit_generator.state = meta["numpy_rng"]
    return Progress(meta["completed_steps"], list(meta["order"]), rows, periodic_rows)
