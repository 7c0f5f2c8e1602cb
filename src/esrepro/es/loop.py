"""The ES training loop, resumable from its last checkpoint with bit-identical results.

Per iteration: N member seeds (a pure function of run seed, iteration, member); for each
member perturb in place, generate greedily on the training prompts, score, restore;
z-score the N mean rewards; apply the decomposed update. Because seeds are derived,
not drawn, resuming needs only the parameters and the iteration count.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from esrepro.backends.base import Backend
from esrepro.es.noise import NoiseVariant, member_seed
from esrepro.es.ops import perturb_, restore_exact_, restore_subtract_, snapshot, update_, zscore
from esrepro.io import atomic_path, read_jsonl, write_json


@dataclass(frozen=True)
class ESConfig:
    """Hyperparameters of one ES run (the paper: N=30, sigma=1e-3, alpha=5e-4, 500 iterations)."""

    iterations: int
    population: int
    sigma: float
    alpha: float
    max_new_tokens: int
    noise: NoiseVariant = "iid"
    restore: Literal["exact", "subtract"] = "exact"
    master_weights: Literal["float32"] | None = None
    checkpoint_every: int = 10
    seed: int = 0

    @classmethod
    def from_settings(cls, settings: dict, seed: int) -> "ESConfig":
        """Build from a config ``train.<task>.es`` block (extra keys are ignored)."""
        names = set(cls.__dataclass_fields__) - {"seed"}
        return cls(seed=seed, **{k: v for k, v in settings.items() if k in names})


ScoreFn = Callable[[list[str]], list[float]]


class ResumeMismatch(RuntimeError):
    """A resume checkpoint exists but was written by a run with different settings."""


def _save_state(state_dir: Path, cfg: ESConfig, iteration: int, params, masters, log: list[dict]) -> None:
    """Write the resume checkpoint atomically: weights, masters, completed iterations, log so far."""
    tensors = {f"p{k}": p.detach().contiguous() for k, p in enumerate(params)}
    if masters is not None:
        tensors.update({f"m{k}": m.contiguous() for k, m in enumerate(masters)})
    with atomic_path(state_dir, is_dir=True) as tmp:
        save_file(tensors, str(tmp / "state.safetensors"))
        (tmp / "log.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in log))
        write_json(tmp / "state.json", {"completed_iterations": iteration, "config": asdict(cfg)})


def _load_state(state_dir: Path, cfg: ESConfig, params, masters) -> tuple[int, list[dict]]:
    """Load a resume checkpoint into ``params`` (and ``masters``); returns (start iteration, log)."""
    meta = json.loads((state_dir / "state.json").read_text())
    if meta["config"] != asdict(cfg):
        raise ResumeMismatch(
            f"{state_dir} was written with settings {meta['config']}, not {asdict(cfg)}; "
            f"delete {state_dir} to start this run afresh"
        )
    tensors = load_file(str(state_dir / "state.safetensors"))
    with torch.no_grad():
        for k, p in enumerate(params):
            p.copy_(tensors[f"p{k}"])
        if masters is not None:
            for k, m in enumerate(masters):
                m.copy_(tensors[f"m{k}"])
    return meta["completed_iterations"], read_jsonl(state_dir / "log.jsonl")


@torch.no_grad()
def run_es(
    backend: Backend,
    prompts: list[str],
    score: ScoreFn,
    cfg: ESConfig,
    state_dir: str | Path,
    on_iteration: Callable[[dict], None] | None = None,
    progress: bool = True,
) -> list[dict]:
    """Train ``backend``'s weights in place with ES; returns the per-iteration log.

    ``score(responses)`` maps the responses to ``prompts`` to per-prompt rewards.
    A checkpoint is written to ``state_dir`` every ``cfg.checkpoint_every`` iterations;
    if one exists when called, the run continues from it.
    """
    state_dir = Path(state_dir)
    params = [p for _, p in backend.named_parameters()]
    masters = [p.detach().to(torch.float32).clone() for p in params] if cfg.master_weights else None
    start, log = 0, []
    if (state_dir / "state.json").exists():
        start, log = _load_state(state_dir, cfg, params, masters)
    bar = tqdm(total=cfg.iterations, initial=start, desc="ES", unit="it", disable=not progress)
    for it in range(start, cfg.iterations):
        t_iter = time.perf_counter()
        seeds = [member_seed(cfg.seed, it, n) for n in range(cfg.population)]
        saved = (masters if masters is not None else snapshot(params)) if cfg.restore == "exact" else None
        rewards: list[float] = []
        t_gen = t_pert = t_rest = 0.0
        for s in seeds:
            t0 = time.perf_counter()
            perturb_(params, s, cfg.sigma, cfg.noise)
            t1 = time.perf_counter()
            responses = backend.generate(prompts, cfg.max_new_tokens)
            rewards.append(float(np.mean(score(responses))))
            t2 = time.perf_counter()
            if saved is not None:
                restore_exact_(params, saved)
            else:
                restore_subtract_(params, s, cfg.sigma, cfg.noise)
            t3 = time.perf_counter()
            t_pert, t_gen, t_rest = t_pert + t1 - t0, t_gen + t2 - t1, t_rest + t3 - t2
        t0 = time.perf_counter()
        update_(params, seeds, zscore(rewards).tolist(), cfg.alpha, cfg.noise, masters)
        t_upd = time.perf_counter() - t0
        r = np.asarray(rewards)
        row = {
            "iteration": it,
            "reward_mean": float(r.mean()),
            "reward_std": float(r.std()),
            "reward_min": float(r.min()),
            "reward_max": float(r.max()),
            "rewards": rewards,
            "seeds": seeds,
            "seconds_generation": t_gen,
            "seconds_perturb": t_pert,
            "seconds_restore": t_rest,
            "seconds_update": t_upd,
            "seconds_total": time.perf_counter() - t_iter,
        }
        log.append(row)
        if on_iteration:
            on_iteration(row)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}")
        bar.update()
        done = it + 1
        if done % cfg.checkpoint_every == 0 or done == cfg.iterations:
            _save_state(state_dir, cfg, done, params, masters, log)
    bar.close()
    return log


def clear_state(state_dir: str | Path) -> None:
    """Remove a finished run's resume checkpoint."""
    shutil.rmtree(state_dir, ignore_errors=True)
