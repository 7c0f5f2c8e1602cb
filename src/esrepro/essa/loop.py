"""The ESSA loop: CMA-ES ask/tell over a population evaluator, resumable with bit-identical results.

Per generation: the strategy asks for its population of candidates (flat vectors of
singular values); the generation's fitness problems are drawn (a pure function of run
seed and generation, :func:`esrepro.essa.data.generation_subset`); the evaluator scores
every candidate on them (apply, generate greedily, score, restore, on one engine or
several); the strategy is told the rewards. Every ``val_every`` generations the
distribution's mean is scored on the held-out problems. Candidates never change an
engine's weights, so the resume state is the CMA-ES state (its RNG included) and the log:
written atomically after the first generation and then every ``resume_every`` generations, so a
killed run loses at most ``resume_every`` generations (at the papers' scale one generation of 192
candidates on 880 problems takes minutes, not seconds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from esrepro import paths as P
from esrepro.essa.data import generation_subset
from esrepro.essa.strategy import CMAStrategy
from esrepro.settings.methods import ENGINE_FIELDS, ESSASettings, without_default_lora_targets
from esrepro.train.resume import announce_resume, has_state, read_state, state_key, write_state

#: Settings that do not change the candidates or their rewards (a resume may change them).
NOT_IN_STATE = {"keep_every", "resume_every", "max_loras", *ENGINE_FIELDS}


@dataclass(frozen=True)
class Problems:
    """Where a run's candidates are scored: indices into the evaluator's examples."""

    fitness: list[int]  # the fixed subset; each generation draws from it
    val: list[int]  # held-out problems the mean is scored on (empty: none)


def essa_state_key(cfg: ESSASettings, seed: int, extra: dict | None = None) -> dict:
    """What a resume state must have been written with: the settings that shape the run, the seed, and ``extra``
    (e.g. the SFT adapter's hash). ``lora_targets`` enters it only when it is not the default ``attention``: the
    key states had before the setting."""
    return without_default_lora_targets(state_key(cfg, seed, NOT_IN_STATE, extra))


def _save_state(state_dir: Path, key: dict, strategy: CMAStrategy, log: list[dict], meta: dict) -> None:
    write_state(state_dir, {"completed_generations": strategy.generation, "config": key, **meta}, log,
                lambda folder: (folder / P.CMA_STATE).write_bytes(strategy.to_bytes()))


def load_state(state_dir: str | Path, key: dict) -> tuple[CMAStrategy, list[dict], dict]:
    """(strategy, log, metadata) of a resume state; a state written with other settings is refused."""
    meta, log = read_state(state_dir, key)
    return CMAStrategy.from_state((Path(state_dir) / P.CMA_STATE).read_bytes()), log, meta


def _mean_reward(evaluator, x: np.ndarray, problems: Sequence[int]) -> tuple[float, float]:
    t0 = time.perf_counter()
    rewards, _ = evaluator.candidate_rewards([x], list(problems))
    return rewards[0], time.perf_counter() - t0


def run_essa(
    evaluator,
    cfg: ESSASettings,
    x0: np.ndarray,
    problems: Problems,
    state_dir: str | Path,
    seed: int = 0,
    key_extra: dict | None = None,
    on_generation: Callable[[dict, CMAStrategy], None] | None = None,
    progress: bool = True,
) -> tuple[list[dict], CMAStrategy, dict]:
    """Run CMA-ES from ``x0`` for ``cfg.iterations``; returns (log, strategy, metadata).

    The metadata holds ``val_reward_sft``, the held-out score of ``x0`` (None without
    held-out problems). If ``state_dir`` holds a resume state the run continues from it.
    """
    state_dir = Path(state_dir)
    key = essa_state_key(cfg, seed, key_extra)
    if has_state(state_dir):
        strategy, log, meta = load_state(state_dir, key)
        announce_resume("ESSA", state_dir, strategy.generation, cfg.iterations, "generation")
        meta = {"val_reward_sft": meta.get("val_reward_sft")}
    else:
        strategy = CMAStrategy(x0, cfg.sigma0, cfg.population, seed, covariance=cfg.covariance)
        log = []
        meta = {"val_reward_sft": _mean_reward(evaluator, x0, problems.val)[0] if problems.val else None}
    elapsed = log[-1]["elapsed_seconds"] if log else 0.0
    bar = tqdm(total=cfg.iterations, initial=strategy.generation, desc="ESSA", unit="gen", disable=not progress)
    for g in range(strategy.generation, cfg.iterations):
        t_start = time.perf_counter()
        xs = strategy.ask()
        t_asked = time.perf_counter()
        subset = [problems.fitness[i] for i in generation_subset(seed, g, len(problems.fitness),
                                                                 cfg.resample_per_step)]
        rewards, seconds = evaluator.candidate_rewards(xs, subset)
        t_scored = time.perf_counter()
        strategy.tell(xs, rewards)
        t_told = time.perf_counter()
        r = np.asarray(rewards)
        total = t_told - t_start
        elapsed += total
        row = {
            "iteration": g,
            "generation": g,
            "reward_mean": float(r.mean()),
            "reward_std": float(r.std()),
            "reward_min": float(r.min()),
            "reward_max": float(r.max()),
            "best_reward": strategy.best[1],
            "rewards": [float(v) for v in rewards],
            "problems": subset,
            "sigma": strategy.sigma,
            "engines": evaluator.engines,
            "seconds_ask_tell": (t_asked - t_start) + (t_told - t_scored),
            "seconds_rebuild": seconds["apply"] + seconds["restore"],
            "seconds_generation": seconds["generation"],
            "seconds_scoring_wall": t_scored - t_asked,
            "seconds_total": total,
            "elapsed_seconds": elapsed,
        }
        done = g + 1
        if problems.val and (done % cfg.val_every == 0 or done == cfg.iterations):
            row["val_reward"], row["seconds_eval"] = _mean_reward(evaluator, strategy.mean, problems.val)
        log.append(row)
        if on_generation:
            on_generation(row, strategy)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}")
        bar.update()
        if done == 1 or done % cfg.resume_every == 0 or done == cfg.iterations:
            _save_state(state_dir, key, strategy, log, meta)
    bar.close()
    return log, strategy, meta
