"""The claims table's test evidence: a paper-scale results folder whose numbers are the papers' own
(config/published.yaml), at the paper configuration's paths, with per-problem outcomes drawn independently per
method (as real evaluations produce them) or nested ("the first k problems right"); and the same evidence with a
real run's noise (:mod:`claims_calibration`). Imported by tests/test_claims.py and benchmarks/claims_calibration.py.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from esrepro.report.claims.table import claim_rows, claims_table
from esrepro.steps import registry_entries

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "config" / "published.yaml"
N_COUNTDOWN = 2000  # the paper's Countdown test set


@lru_cache(maxsize=1)
def _published_text() -> dict:
    return yaml.safe_load(PUBLISHED.read_text())


def published() -> dict:
    """config/published.yaml (a fresh copy each call: a test may change it)."""
    return copy.deepcopy(_published_text())


def display() -> dict[str, str]:
    return {k: v["display"] for k, v in registry_entries(ROOT / "config" / "models.yaml").items()}


@lru_cache(maxsize=2)
def pipeline(config: str = "paper.yaml"):
    from esrepro.config import read_config
    from esrepro.planning.load import load_pipeline

    return load_pipeline(read_config(ROOT / "config" / config, root=ROOT), f"config/{config}", root=ROOT)


@lru_cache(maxsize=2)
def spec(config: str = "paper.yaml") -> dict:
    from esrepro.planning.specs import claims_spec

    return claims_spec(pipeline(config))


def inputs(config: str = "paper.yaml") -> list[str]:
    from esrepro.planning.claim_plan import ClaimPlan
    from esrepro.planning.plan import Plan

    return ClaimPlan(Plan(pipeline(config))).all_files()


def eval_run(root: Path, task: str, model: str, method: str, accuracy: float, n: int,
             rng: np.random.Generator | None, seed: int = 0) -> None:
    """An evaluation of ``n`` problems at ``accuracy`` (%): each problem right independently (``rng``: a real
    evaluation's outcomes), or the first round(accuracy * n / 100) right (``rng`` None: nested across methods)."""
    d = root / "eval" / task / model / method / f"seed{seed}" / "test"
    d.mkdir(parents=True)
    right = rng.random(n) < accuracy / 100 if rng is not None else np.arange(n) < round(accuracy * n / 100)
    (d / "metrics.json").write_text(json.dumps({"task": task, "split": "test", "model": model, "method": method,
                                                "seed": seed, "accuracy": float(right.mean()), "n": n}))
    (d / "responses.jsonl").write_text("".join(json.dumps({"id": i, "correct": bool(c), "response": ""}) + "\n"
                                               for i, c in enumerate(right)))


def kl_run(root: Path, model: str, method: str, seed: int, algorithm: str, hyper: dict,
           points: list[tuple[int, float, float]], words: bool) -> None:
    """A kl.json with checkpoints (iteration, normalised reward, KL), the last one the final weights."""
    d = root / "kl" / "conciseness" / model / method / f"seed{seed}"
    d.mkdir(parents=True)
    cps = [{"iteration": it, "k3": kl, "k1": kl, "exact": kl, "reward": (r - 1.0) * 2000.0,
            "reward_sampled": (r - 1.0) * 2000.0} for it, r, kl in points]
    last = cps[-1]
    (d / "kl.json").write_text(json.dumps({"model": model, "method": method, "seed": seed, "algorithm": algorithm,
                                           "hyper": hyper, "reward": last["reward"],
                                           "reward_sampled": last["reward_sampled"], "k1": last["k1"],
                                           "k3": last["k3"], "exact": last["exact"], "checkpoints": cps}))
    text = "The answer is short." if words else "?! .. ))</> ;;"
    (d / "samples.jsonl").write_text("".join(json.dumps({"id": "p", "sample": i, "response": text,
                                                         "reward": last["reward"]}) + "\n" for i in range(20)))


def study_method(prefix: str, value: float, names: list[str]) -> str:
    """The paper config's method name of a swept value (es_sigma0.001, grpo_beta0.0464, ...)."""
    for name in names:
        if name.startswith(prefix) and "_lr" not in name and math.isclose(float(name[len(prefix):]), value,
                                                                           rel_tol=5e-3):
            return name
    raise KeyError(f"{prefix}{value} not among {names}")


def essa_run(root: Path, task: str, model: str, method: str, algorithm: str, curve: list[tuple[float, float]],
             rng: np.random.Generator, engines: int = 8, problems: int | None = None, pool: int = 880,
             **essa_settings: object) -> None:
    """An ESSA (or its GRPO baseline's) run with a held-out curve of (seconds, accuracy); ``essa_settings`` replace
    the paper's (population 192, rank 16, native precision)."""
    d = root / "runs" / task / model / method / "seed0"
    d.mkdir(parents=True)
    settings = {"task": task, "model": model, "method": method, "algorithm": algorithm, "val_examples": 500}
    manifest = {"settings": settings, "seed": 0, "world_size": 8, "train_examples": 5478}
    if algorithm == "essa":
        settings.update(population=192, rank=16, precision="native", engines=engines, fitness_examples=pool,
                        resample_per_step=problems)
        settings.update(essa_settings)
        manifest.update(essa={"val_reward_sft": curve[0][1]}, engines=engines)
    else:
        settings.update(per_device_train_batch_size=5, gradient_accumulation_steps=64, num_generations=4)
        manifest["essa_baseline"] = {"val_reward_sft": curve[0][1]}
    (d / "manifest.json").write_text(json.dumps(manifest))
    rows = []
    for i, (t, v) in enumerate(curve):
        row = {"iteration": i, "elapsed_seconds": t, "val_reward": v, "reward_mean": v}
        if algorithm == "essa":
            row["problems"] = sorted(rng.choice(pool, size=problems, replace=False).tolist()) if problems \
                else list(range(pool))
        rows.append(row)
    (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


#: Table 2's extra GRPO points: high betas near KL 0 with low reward (Fig. 1).
HIGH_BETAS = ((1.0, 0.78, 0.02), (0.599, 0.79, 0.05))
ESSA_MODEL = "qwen2.5-math-7b"
#: ESSA's runs as (task, model, method, algorithm, curve of (seconds, held-out accuracy), engines, problems per
#: generation): Fig. 8 (the resampled run over 0.80 within 25 minutes on 8 GPUs, GRPO after 50), Fig. 2 (290 minutes
#: to 0.76 on 8 GPUs, under 80 on 128), Fig. 6 (both runs rise over training).
ESSA_RUNS: tuple[tuple[str, str, str, str, tuple[tuple[float, float], ...], int, int | None], ...] = (
    ("gsm8k", ESSA_MODEL, "essa_ref", "essa", ((0.0, 0.62), (600.0, 0.70), (17400.0, 0.77)), 8, None),
    ("gsm8k", ESSA_MODEL, "essa_resample100", "essa", ((0.0, 0.62), (600.0, 0.74), (1440.0, 0.81)), 8, 100),
    ("gsm8k", ESSA_MODEL, "essa_grpo", "verl_grpo", ((0.0, 0.62), (1500.0, 0.70), (3060.0, 0.81)), 8, None),
    *(("gsm8k", ESSA_MODEL, f"essa_eng{e}", "essa", ((0.0, 0.62), (t, 0.77)), e, None)
      for e, t in ((16, 9000.0), (32, 7000.0), (64, 5500.0), (128, 4500.0))),
    ("prm800k", "llama-3.1-8b", "essa_ref", "essa", ((0.0, 0.30), (9000.0, 0.42)), 8, None),
    ("gsm8k", "qwen2.5-32b", "essa_ref", "essa", ((0.0, 0.80), (9000.0, 0.90)), 8, None),
)


@dataclass(frozen=True)
class Noise:
    """A real run's noise beyond its test problems' binomial draws, as standard deviations: each run's wall-clock
    times scaled by one log-normal factor (``time_log_sd``, of the logarithm), each logged held-out accuracy moved
    by a normal draw (``val_sd``, fraction)."""

    time_log_sd: float = 0.0
    val_sd: float = 0.0


def essa_fixture(root: Path, rng: np.random.Generator, noise: Noise | None = None,
                 noise_rng: np.random.Generator | None = None,
                 curves: dict[tuple[str, str, str], tuple[tuple[float, float], ...]] | None = None) -> Path:
    """The ESSA study's runs of :data:`ESSA_RUNS` (``curves``: some runs' curves replaced, by (task, model,
    method)), with ``noise`` drawn from ``noise_rng``; ``rng`` draws the resampled run's problems."""
    for task, model, method, algo, curve, engines, problems in ESSA_RUNS:
        curve = (curves or {}).get((task, model, method), curve)
        if noise is not None and noise_rng is not None:
            factor = float(np.exp(noise.time_log_sd * noise_rng.standard_normal()))
            curve = tuple((t * factor, v if i == 0 else float(np.clip(v + noise.val_sd * noise_rng.standard_normal(),
                                                                         0, 1)))
                          for i, (t, v) in enumerate(curve))
        essa_run(root, task, model, method, algo, list(curve), rng, engines=engines, problems=problems)
    return root


def conciseness_fixture(root: Path, noise: np.random.Generator, hacks: np.random.Generator | None = None,
                        grpo: dict[float, dict[str, float]] | None = None) -> Path:
    """Table 2: four seeds per configuration, normal around the paper's mean with its std; checkpoints every 200
    iterations from 400 rising to the final point (so GRPO's high betas, :data:`HIGH_BETAS`, near KL 0 lie left
    of every ES checkpoint, as in Fig. 1); the base model. A configuration
    the paper marks hacked hacks in two of its four seeds, or (``hacks``) in each seed with chance 1/2. ``grpo``:
    a GRPO row's numbers replaced, by beta."""
    pub = published()["tables"]
    names = [m for _, m, _ in pipeline().study_runs("conciseness")]
    kl_run(root, "qwen2.5-7b-instruct", "base", 0, "base", {}, [(0, 0.5, 0.0)], words=True)
    rows = list(pub["table2_conciseness"]["rows"])
    rows += [{"algorithm": "grpo", "beta": b, "learning_rate": 5e-6, "reward": r, "reward_std": 0.01, "kl": k,
              "kl_std": 0.005, "hacked": False} for b, r, k in HIGH_BETAS]
    for r in rows:
        algo = r["algorithm"]
        if algo == "grpo" and r["beta"] in (grpo or {}):
            r = {**r, **grpo[r["beta"]]}
        hyper = {"sigma": r["sigma"], "alpha": r["alpha"]} if algo == "es" else \
            {"beta": r["beta"], "learning_rate": r["learning_rate"]}
        method = study_method("es_sigma", r["sigma"], names) if algo == "es" else \
            study_method("grpo_beta", r["beta"], names)
        for s in range(4):
            reward = r["reward"] + r["reward_std"] * noise.standard_normal()
            kl = max(0.0, r["kl"] + r["kl_std"] * noise.standard_normal())
            points = [(it, 0.5 + (reward - 0.5) * it / 1000, kl * it / 1000) for it in (400, 600, 800)]
            hacked = r["hacked"] and (s % 2 == 0 if hacks is None else bool(hacks.random() < 0.5))
            kl_run(root, "qwen2.5-7b-instruct", method, s, algo, hyper, points + [(1000, reward, kl)],
                   words=not hacked)  # "sometimes": some seeds hack
    return root


def paper_fixture(root: Path, nested: bool = False, table1_override: dict | None = None, seed: int = 0) -> Path:
    """A results folder whose numbers are the papers' (config/published.yaml), at the paper config's paths."""
    rng = None if nested else np.random.default_rng(seed)
    pub = published()["tables"]
    for model, row in pub["table1_countdown"]["models"].items():
        for method, acc in {**row, **((table1_override or {}).get(model, {}))}.items():
            eval_run(root, "countdown", model, method, acc, N_COUNTDOWN, rng)
    for key, task in (("puzzles_sudoku", "sudoku"), ("puzzles_arc", "arc")):
        for model, row in pub[key]["models"].items():
            for method, acc in row.items():
                eval_run(root, task, model, method, acc, 200, rng)
    conciseness_fixture(root, np.random.default_rng(seed + 1))
    essa_fixture(root, np.random.default_rng(seed + 2))
    return root


def table(root: Path, scale: str = "paper", config: str = "paper.yaml") -> pd.DataFrame:
    rows = claim_rows(root, [str(root.parent / f) for f in inputs(config)], published(), display(), spec(config))
    return claims_table(rows, scale)


# --- the conciseness study's KL spread and GRPO learning-rate sweep ---
def table2_kl_fixture(root: Path, rng: np.random.Generator, es_kl_sd: float, grpo_kl_sd: float) -> list[str]:
    """Table 2's shape on one model: two ES and two GRPO configurations, four seeds each, rewards spread by 0.01
    and KL by ``es_kl_sd`` and ``grpo_kl_sd``; the base model."""
    kl_run(root, "m", "base", 0, "base", {}, [(0, 0.5, 0.0)], words=True)
    for method, algo, reward, kl, sd in (("es_a", "es", 0.89, 0.27, es_kl_sd), ("es_b", "es", 0.92, 0.81, es_kl_sd),
                                         ("grpo_a", "grpo", 0.87, 0.86, grpo_kl_sd),
                                         ("grpo_b", "grpo", 0.91, 1.59, grpo_kl_sd)):
        hyper = {"sigma": 0.001} if algo == "es" else {"beta": 0.01, "learning_rate": 5e-6}
        for s in range(4):
            r = reward + 0.01 * rng.standard_normal()
            k = max(0.0, kl + sd * rng.standard_normal())
            kl_run(root, "m", method, s, algo, hyper, [(1000, r, k)], words=True)
    return sorted(str(p) for p in root.glob("kl/conciseness/*/*/seed*/kl.json"))


SWEEP_LRS = (2e-6, 3e-6, 4e-6, 5e-6)


def lr_sweep_fixture(root: Path, rng: np.random.Generator, reward_of, kl_of, es_reward: float = 0.92) -> list[str]:
    """The sweep's GRPO runs (four betas x four learning rates x four seeds, normal around ``reward_of(beta,
    lr)`` and ``kl_of(beta, lr)``), ES's study runs and the base model."""
    kl_run(root, "m", "base", 0, "base", {}, [(0, 0.55, 0.0)], words=True)
    for beta in (0.0, 0.01, 0.1, 1.0):
        for lr in SWEEP_LRS:
            for s in range(4):
                r = float(np.clip(reward_of(beta, lr) + 0.01 * rng.standard_normal(), 0, 1))
                k = max(0.0, kl_of(beta, lr) + 0.05 * rng.standard_normal())
                kl_run(root, "m", f"grpo_beta{beta:g}_lr{lr:g}", s, "grpo", {"beta": beta, "learning_rate": lr},
                       [(1000, r, k)], words=True)
    for sigma in (0.001, 0.0015):
        for s in range(4):
            kl_run(root, "m", f"es_sigma{sigma:g}", s, "es", {"sigma": sigma, "alpha": sigma / 2},
                   [(1000, es_reward + 0.005 * rng.standard_normal(), 0.5)], words=True)
    return sorted(str(p) for p in root.glob("kl/conciseness/*/*/seed*/kl.json"))


def rising_reward(beta: float, lr: float) -> float:
    """A reward rising with the learning rate over the sweep, less at larger beta."""
    return 0.55 + 0.3 * (lr - 2e-6) / 3e-6 / (1 + beta)
