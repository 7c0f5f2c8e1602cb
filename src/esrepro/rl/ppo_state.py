"""PPO's resume state (``<run>/resume/``): written atomically every ``resume_every`` optimiser steps.

It holds the completed steps, the prompt-order queue, numpy's RNG state (state.json); the log rows and the
periodic evaluation's points so far; actor and critic weights and both AdamW states (full, unsharded: rank 0
writes them); and each process's torch RNG states (CPU and, on GPUs, its CUDA device). A state written with
other settings, seed or number of processes is refused with a message naming the folder to delete.
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
NOT_IN_STATE = {"resume_every", "eval_every", "eval_limit", "eval_batch_size", "eval_max_new_tokens", "keep_every",
                "sample_budget"}
PIECES = ("actor", "critic", "actor_optim", "critic_optim")


@dataclass
class Progress:
    """Where a run stands: completed steps, the prompt-order queue, the log rows and periodic points so far."""

    step: int
    order: list[int]
    rows: list[dict]
    periodic_rows: list[dict]


def key(cfg: Any, seed: int, world_size: int, dtype: str) -> dict:
    """What a state must have been written with."""
    return state_key(cfg, seed, NOT_IN_STATE, {"world_size": world_size, "dtype": dtype})


def _rng_state(device: str) -> dict:
    out = {"cpu": torch.get_rng_state()}
    if device.startswith("cuda"):
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def save(resume_dir: str | Path, run_key: dict, progress: Progress, rng: np.random.Generator, models: dict,
         device: str, is_main: bool) -> None:
    """Write the state (every process calls it: the gathers are collective; rank 0 writes)."""
    actor, critic, opt_a, opt_c = models["actor"], models["critic"], models["actor_optim"], models["critic_optim"]
    rngs = par.gather_objects(_rng_state(device))
    gather = {"actor": lambda: par.full_model_state(actor), "critic": lambda: par.full_model_state(critic),
              "actor_optim": lambda: par.full_optim_state(actor, opt_a),
              "critic_optim": lambda: par.full_optim_state(critic, opt_c)}
    if not is_main:
        for name in PIECES:  # take part in the gathers, one piece at a time
            gather[name]()
        par.gather_objects(None)
        return

    def payload(folder: Path) -> None:
        for name in PIECES:  # one piece in host memory at a time
            torch.save(gather[name](), folder / f"{name}.pt")
        torch.save(rngs, folder / "rng.pt")

    meta = {"completed_steps": progress.step, "config": run_key, "order": progress.order,
            "numpy_rng": rng.bit_generator.state}
    write_state(resume_dir, meta, progress.rows, payload, {"periodic_eval": progress.periodic_rows})
    par.gather_objects(None)  # nobody reads a half-written state


def load(resume_dir: str | Path, run_key: dict, rng: np.random.Generator, models: dict, device: str,
         rank: int) -> Progress | None:
    """Continue from the state in ``resume_dir`` (None: there is none); restores weights, optimisers, RNGs."""
    if resume_dir is None or not has_state(resume_dir):
        return None
    folder = Path(resume_dir)
    periodic_rows: list[dict] = []
    extra = {"periodic_eval": periodic_rows}
    meta, rows = read_state(folder, run_key, extra)
    for m, o in (("actor", "actor_optim"), ("critic", "critic_optim")):
        # sharded: rank 0 reads the full state and broadcasts it (one host copy per node, not per process)
        reads = rank == 0 or not par.sharded(models[m])
        weights = torch.load(folder / f"{m}.pt", map_location="cpu", weights_only=True) if reads else {}
        optim = torch.load(folder / f"{o}.pt", map_location="cpu", weights_only=True) if reads else {}
        par.load_full_state(models[m], models[o], weights, optim)
    rngs = torch.load(folder / "rng.pt", weights_only=True)
    torch.set_rng_state(rngs[rank]["cpu"])
    if "cuda" in rngs[rank] and device.startswith("cuda"):
        torch.cuda.set_rng_state(rngs[rank]["cuda"], device)
    rng.bit_generator.state = meta["numpy_rng"]
    return Progress(meta["completed_steps"], list(meta["order"]), rows, periodic_rows)

