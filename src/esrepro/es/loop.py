"""The ES training loop as ask/tell over a population evaluator, resumable with bit-identical results.

Per iteration: the strategy asks for N member seeds (a pure function of run seed and
iteration); the evaluator returns each member's mean reward (perturb, generate greedily,
score, restore, on one engine or spread over several); the strategy tells the update
(z-scored rewards); every engine applies it; their checksums must agree. Because seeds are
derived, not drawn, resuming needs only the weights and the iteration count.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from esrepro.es.strategy import ESStrategy
from esrepro.population.evaluators import EngineMismatch
from esrepro.population.worker import BATCHED_PHASES
from esrepro.settings.methods import ENGINE_FIELDS, RECIPE_FIELDS, ESSettings
from esrepro.train.resume import ResumeMismatch, announce_resume, has_state, read_state, state_key, write_state

#: Settings that do not change the weights a run ends with (a resume may change them).
NOT_IN_STATE = {"keep_every", "resume_every", "resume_on_other_gpu", "tensor_parallel_size", "max_loras",
                *ENGINE_FIELDS}


def _state_key(cfg: ESSettings, seed: int) -> dict:
    """What a resume state must have been written with: the settings that shape the weights, and the seed (EGGROLL's
    recipe options and ``noise_on`` only where they differ from ES's, so states written before they existed still
    resume)."""
    at_default = {f for f in (*RECIPE_FIELDS, "noise_on") if getattr(cfg, f) == type(cfg).model_fields[f].default}
    return state_key(cfg, seed, NOT_IN_STATE | at_default)


def strategy_of(cfg: ESSettings, seed: int) -> ESStrategy:
    """The ask/tell strategy of a run with settings ``cfg`` and run seed ``seed``."""
    return ESStrategy(cfg.population, cfg.sigma, cfg.alpha, seed, antithetic=cfg.antithetic, fitness=cfg.fitness,
                      step=cfg.step)


def _save_state(state_dir: Path, cfg: ESSettings, seed: int, iteration: int, evaluator, log: list[dict],
                extra: dict[str, list[dict]] | None = None) -> None:
    """Write the resume state atomically: the engines' weights (and masters), completed iterations, the log so
    far, and each ``extra`` list of rows (``<name>.jsonl``, e.g. the periodic evaluation's points)."""
    meta = {"completed_iterations": iteration, "config": _state_key(cfg, seed),
            "noise_device": evaluator.noise_device()}
    write_state(state_dir, meta, log, evaluator.save_state, extra)
    evaluator.mark_state(state_dir)


def _load_state(state_dir: Path, cfg: ESSettings, seed: int, evaluator,
                extra: dict[str, list[dict]] | None = None) -> tuple[int, list[dict]]:
    """Load a resume state into every engine; returns (start iteration, log). Each ``extra`` list is
    replaced, in place, by the rows the state holds for it."""
    meta, log = read_state(state_dir, _state_key(cfg, seed), extra)
    written_on, here = meta.get("noise_device"), evaluator.noise_device()
    if written_on is not None and written_on != here:
        if not cfg.resume_on_other_gpu:
            raise ResumeMismatch(
                f"{state_dir} was written by engines drawing noise on {written_on}, these draw it on {here}: the same "
                f"seeds would give other noise; resume on {written_on}, or set the ES option resume_on_other_gpu: "
                f"true to go on with this GPU's noise, or delete {state_dir} to start afresh"
            )
        print(f"ES: resuming on {here} a state written on {written_on} (resume_on_other_gpu): from iteration "
              f"{meta['completed_iterations']} on, members draw this GPU's noise", flush=True)
    evaluator.load_state(state_dir)
    return meta["completed_iterations"], log


def iteration_batch(n_examples: int, per_iteration: int, seed: int, iteration: int) -> list[int]:
    """Indices of the training prompts scored in ``iteration`` when each iteration takes ``per_iteration`` of them.

    The prompts are read as one stream of epochs, each a fresh permutation seeded by (run seed,
    epoch); iteration t takes stream positions [t * per_iteration, (t + 1) * per_iteration). So a
    batch is a pure function of (seed, iteration) and resumes exactly; every prompt is used once per
    epoch. (The authors' shuffled DataLoader ends each epoch with a shorter batch instead of
    running into the next epoch.)
    """
    if not 1 <= per_iteration <= n_examples:
        raise ValueError(f"prompts per iteration ({per_iteration}) must be in [1, {n_examples}]")
    start, stop = iteration * per_iteration, (iteration + 1) * per_iteration
    out: list[int] = []
    for epoch in range(start // n_examples, (stop - 1) // n_examples + 1):
        perm = np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), 0x5EED])).permutation(n_examples)
        lo, hi = max(start, epoch * n_examples), min(stop, (epoch + 1) * n_examples)
        out += perm[lo - epoch * n_examples: hi - epoch * n_examples].tolist()
    return out


def run_es(
    evaluator,
    cfg: ESSettings,
    state_dir: str | Path,
    seed: int = 0,
    on_iteration: Callable[[dict], None] | None = None,
    progress: bool = True,
    extra: dict[str, list[dict]] | None = None,
) -> list[dict]:
    """Train the evaluator's engines with ES; returns the per-iteration log.

    A resume checkpoint is written to ``state_dir`` every ``cfg.resume_every`` iterations;
    if one exists when called, the run continues from it. Raises :class:`EngineMismatch`
    if the engines' weights ever differ after an update. ``extra``: named lists of rows the
    caller appends to (from ``on_iteration``), kept in the resume checkpoint and restored in
    place on resume. With ``cfg.prompts_per_iteration`` each iteration scores the members on
    :func:`iteration_batch`'s prompts only.
    """
    state_dir = Path(state_dir)
    strategy = strategy_of(cfg, seed)
    start, log = 0, []
    if has_state(state_dir):
        start, log = _load_state(state_dir, cfg, seed, evaluator, extra)
        announce_resume("ES", state_dir, start, cfg.iterations, "iteration")
    bar = tqdm(total=cfg.iterations, initial=start, desc="ES", unit="it", disable=not progress)
    for it in range(start, cfg.iterations):
        t_iter = time.perf_counter()
        seeds = strategy.ask(it)
        if cfg.prompts_per_iteration is None:
            rewards, seconds = evaluator.rewards(seeds, cfg.sigma)
        else:
            batch = iteration_batch(cfg.train_examples, cfg.prompts_per_iteration, seed, it)
            rewards, seconds = evaluator.rewards(seeds, cfg.sigma, batch)
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
            # the batched path's own phases (members as adapters: loading them, grading apart from generation)
            **{f"seconds_{k}": seconds[k] for k in BATCHED_PHASES if k in seconds},
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
            _save_state(state_dir, cfg, seed, done, evaluator, log, extra)
    bar.close()
    return log
