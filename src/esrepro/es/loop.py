"""The ES training loop as ask/tell over a population evaluator, resumable with bit-identical results.

Per iteration: the strategy asks for N member seeds (a pure function of run seed and
iteration); the evaluator returns each member's mean reward (perturb, generate greedily,
score, restore, on one engine or spread over several); the strategy tells the update
(z-scored rewards); every engine applies it; their checksums must agree. Because seeds are
derived, not drawn, resuming needs only the weights and the iteration count.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from esrepro.es.strategy import ESStrategy
from esrepro.io import atomic_path, read_jsonl, write_json
from esrepro.population.evaluators import EngineMismatch
from esrepro.settings.methods import ESSettings

#: Settings that do not change the weights a run ends with (a resume may change them).
NOT_IN_STATE = {"keep_every", "resume_every", "engines", "backend", "tensor_parallel_size"}


class ResumeMismatch(RuntimeError):
    """A resume checkpoint exists but was written by a run with different settings."""


def _state_key(cfg: ESSettings, seed: int) -> dict:
    """What a resume state must have been written with: the settings that shape the weights, and the seed."""
    return {**cfg.model_dump(mode="json", exclude=NOT_IN_STATE), "seed": seed}


def _save_state(state_dir: Path, cfg: ESSettings, seed: int, iteration: int, evaluator, log: list[dict]) -> None:
    """Write the resume checkpoint atomically: weights (and masters), completed iterations, log so far."""
    with atomic_path(state_dir, is_dir=True) as tmp:
        evaluator.save_state(tmp)
        (tmp / "log.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in log))
        write_json(tmp / "state.json", {"completed_iterations": iteration, "config": _state_key(cfg, seed)})
    evaluator.mark_state(state_dir)


def _load_state(state_dir: Path, cfg: ESSettings, seed: int, evaluator) -> tuple[int, list[dict]]:
    """Load a resume checkpoint into every engine; returns (start iteration, log)."""
    meta = json.loads((state_dir / "state.json").read_text())
    if meta["config"] != _state_key(cfg, seed):
        raise ResumeMismatch(
            f"{state_dir} was written with settings {meta['config']}, not {_state_key(cfg, seed)}; "
            f"delete {state_dir} to start this run afresh"
        )
    evaluator.load_state(state_dir)
    return meta["completed_iterations"], read_jsonl(state_dir / "log.jsonl")


def run_es(
    evaluator,
    cfg: ESSettings,
    state_dir: str | Path,
    seed: int = 0,
    on_iteration: Callable[[dict], None] | None = None,
    progress: bool = True,
) -> list[dict]:
    """Train the evaluator's engines with ES; returns the per-iteration log.

    A resume checkpoint is written to ``state_dir`` every ``cfg.resume_every`` iterations;
    if one exists when called, the run continues from it. Raises :class:`EngineMismatch`
    if the engines' weights ever differ after an update.
    """
    state_dir = Path(state_dir)
    strategy = ESStrategy(cfg.population, cfg.sigma, cfg.alpha, seed)
    start, log = 0, []
    if (state_dir / "state.json").exists():
        start, log = _load_state(state_dir, cfg, seed, evaluator)
    bar = tqdm(total=cfg.iterations, initial=start, desc="ES", unit="it", disable=not progress)
    for it in range(start, cfg.iterations):
        t_iter = time.perf_counter()
        seeds = strategy.ask(it)
        rewards, seconds = evaluator.rewards(seeds, cfg.sigma)
        update = strategy.tell(seeds, rewards)
        t_update = evaluator.apply_update(update)
        sums = evaluator.checksums()
        if len(set(sums)) != 1:
            raise EngineMismatch(f"iteration {it}: the {len(sums)} engines hold different weights after the same "
                                 f"update (checksums {sorted(set(sums))}); stopping")
        r = np.asarray(rewards)
        row = {
            "iteration": it,
            "reward_mean": float(r.mean()),
            "reward_std": float(r.std()),
            "reward_min": float(r.min()),
            "reward_max": float(r.max()),
            "rewards": rewards,
            "seeds": seeds,
            "checksum": sums[0],
            "engines": evaluator.engines,
            "seconds_generation": seconds["generation"],
            "seconds_perturb": seconds["perturb"],
            "seconds_restore": seconds["restore"],
            "seconds_update": t_update,
            "seconds_total": time.perf_counter() - t_iter,
        }
        log.append(row)
        if on_iteration:
            on_iteration(row)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}")
        bar.update()
        done = it + 1
        if done % cfg.resume_every == 0 or done == cfg.iterations:
            _save_state(state_dir, cfg, seed, done, evaluator, log)
    bar.close()
    return log


def clear_state(state_dir: str | Path) -> None:
    """Remove a finished run's resume checkpoint."""
    shutil.rmtree(state_dir, ignore_errors=True)
