"""The conciseness study: Table 2 (reward and KL per configuration) and the data of its figures.

Everything is read from the ``kl.json`` files ``esrepro kl`` writes (one per run, and one
for the base model): each has the run's labels, its algorithm and swept hyperparameter
(``hyper``), the greedy reward and the KL estimates of the final weights, and the same
for every snapshot kept along the way (``checkpoints``), the Pareto figure's points.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from esrepro.io import read_json, read_jsonl
from esrepro.report.tables import STD_SUFFIX, write_table

PathLike = str | os.PathLike

#: algorithm -> (label, swept hyperparameter)
ALGORITHMS: dict[str, tuple[str, str | None]] = {
    "base": ("Original", None),
    "es": ("ES", "sigma"),
    "grpo": ("GRPO", "beta"),
    "dr_grpo": ("Dr.GRPO", "beta"),
    "ppo": ("PPO", "beta"),
}
KL_COLUMNS = {"exact": "KL exact", "k1": "KL k1", "k3": "KL k3"}
REQUIRED = ("model", "method", "seed", "algorithm", "reward", "k1", "k3", "exact", "checkpoints")


def load_kl(paths: Iterable[PathLike]) -> pd.DataFrame:
    """One row per kl.json: labels, algorithm, swept value (``param``, ``value``), reward and KL."""
    rows = []
    for path in paths:
        rec = read_json(path)
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            raise ValueError(f"{path}: kl.json is missing field(s) {', '.join(missing)}")
        algo = rec["algorithm"]
        param = ALGORITHMS.get(algo, (algo, None))[1]
        value = rec.get("hyper", {}).get(param) if param else None
        rows.append({
            "model": rec["model"], "method": rec["method"], "seed": rec["seed"], "algorithm": algo,
            "param": param, "value": value, "iteration": rec.get("iteration"),
            "reward": rec["reward"], "reward_sampled": rec.get("reward_sampled", math.nan),
            **{k: rec[k] for k in KL_COLUMNS}, "checkpoints": rec["checkpoints"], "path": str(path),
        })
    return pd.DataFrame(rows)


def _order(algo: str) -> int:
    return list(ALGORITHMS).index(algo) if algo in ALGORITHMS else len(ALGORITHMS)


def table2(runs: pd.DataFrame, reward_cutoff: float | None) -> pd.DataFrame:
    """Per configuration (algorithm x swept value): reward and KL, mean and sample std over seeds.

    ``Kept`` says whether the configuration's mean reward reaches ``reward_cutoff``
    (always yes without a cut-off; the base model is a reference row, never filtered).
    """
    records = []
    groups = runs.groupby(["algorithm", "value"], dropna=False, sort=False)
    for (algo, value), g in sorted(groups, key=lambda kv: (_order(kv[0][0]), -1 if pd.isna(kv[0][1]) else kv[0][1])):
        label, param = ALGORITHMS.get(algo, (algo, None))
        rec: dict[str, Any] = {
            "Method": label,
            "Setting": "" if param is None or pd.isna(value) else f"{param} = {value:g}",
            "Seeds": len(g),
        }
        for col, name in (("reward", "Reward"), ("reward_sampled", "Reward (sampled)"),
                          *((k, v) for k, v in KL_COLUMNS.items())):
            rec[name] = float(g[col].mean())
            rec[name + STD_SUFFIX] = float(g[col].std()) if len(g) > 1 else math.nan
        kept = algo == "base" or reward_cutoff is None or rec["Reward"] >= reward_cutoff
        rec["Kept"] = "yes" if kept else "no"
        records.append(rec)
    df = pd.DataFrame(records)
    df.index = pd.Index(
        [f"{r['Method']} {r['Setting']}".strip() for r in records], name="configuration"
    )
    return df


def build_table2(
    kl_paths: Sequence[PathLike],
    out_stem: PathLike,
    reward_cutoff: float | None,
    notes: Sequence[str] = (),
    model_display: str | None = None,
) -> pd.DataFrame:
    """Load the kl.json files, build Table 2 and write it as csv, md and tex (3 decimals)."""
    runs = load_kl(kl_paths)
    df = table2(runs, reward_cutoff)
    models = sorted(set(runs["model"]))
    who = model_display or ", ".join(models)
    caption = f"Conciseness ({who}): reward and KL(fine-tuned || base) per configuration"
    cut = ("no reward cut-off (every configuration kept)" if reward_cutoff is None
           else f"reward cut-off {reward_cutoff:g}: a configuration is kept when its mean reward over seeds "
                f"is at least that; dropped: {', '.join(df.index[df['Kept'] == 'no']) or 'none'}")
    default_notes = [
        "Mean ± sample std over seeds. Reward: greedy, -|len(response) - len(solution)| in characters, "
        "mean over the held-out prompts; Reward (sampled): the same over the responses KL is measured on.",
        "KL exact: full-vocabulary KL per token; k1, k3: Schulman's estimators; each summed per response.",
        cut[0].upper() + cut[1:] + ".",
    ]
    write_table(df, out_stem, caption, [*default_notes, *notes], decimals=3)
    return df


# --- figures' data -----------------------------------------------------------------------
def checkpoint_points(runs: pd.DataFrame, kl: str = "exact") -> pd.DataFrame:
    """Every kept snapshot and final weights as a (KL, reward) point, labelled by run."""
    rows = []
    for r in runs.itertuples(index=False):
        for c in r.checkpoints:
            rows.append({"algorithm": r.algorithm, "method": r.method, "value": r.value, "seed": r.seed,
                         "iteration": c["iteration"], "kl": c[kl], "reward": c["reward"]})
    return pd.DataFrame(rows, columns=["algorithm", "method", "value", "seed", "iteration", "kl", "reward"])


def pareto_front(kl: Sequence[float], reward: Sequence[float]) -> list[int]:
    """Indices of the non-dominated points (lower KL and higher reward are better), by increasing KL.

    A point is dominated when another has KL <= and reward >= with one strict. Ties
    (identical points) keep the first.
    """
    order = sorted(range(len(kl)), key=lambda i: (kl[i], -reward[i], i))
    front, best = [], -math.inf
    for i in order:
        if reward[i] > best:
            front.append(i)
            best = reward[i]
    return front


def pareto_table(runs: pd.DataFrame, kl: str = "exact") -> pd.DataFrame:
    """The Pareto figure's numbers: every checkpoint point (``point = checkpoint``; ``pareto_front`` marks
    its method's non-dominated points, the base model has none) and each configuration's mean over seeds
    of its final weights (``point = configuration mean``, the labelled points); ``kl`` names the estimator."""
    points = checkpoint_points(runs, kl)
    points.insert(0, "point", "checkpoint")
    points["pareto_front"] = False
    for algo, pts in points.groupby("algorithm", sort=False):
        if algo != "base":
            front = pareto_front(list(pts["kl"]), list(pts["reward"]))
            points.loc[pts.index[front], "pareto_front"] = True
    means = []
    for algo in dict.fromkeys(runs["algorithm"]):
        if algo == "base":
            continue
        sub = runs[runs["algorithm"] == algo]
        for value, row in sub.groupby("value")[[kl, "reward"]].mean().iterrows():
            methods = ",".join(dict.fromkeys(sub.loc[sub["value"] == value, "method"]))
            means.append({"point": "configuration mean", "algorithm": algo, "method": methods, "value": value,
                          "seed": math.nan, "iteration": math.nan, "kl": row[kl], "reward": row["reward"],
                          "pareto_front": False})
    table = pd.concat([points, pd.DataFrame(means, columns=points.columns)], ignore_index=True) if means else points
    table = table.astype({"seed": "Int64", "iteration": "Int64"})
    table.insert(table.columns.get_loc("kl"), "kl_estimator", kl)
    return table


def reward_histograms(rewards: dict[tuple[str, Any], list[float]]) -> pd.DataFrame:
    """The reward-distribution figure's numbers: per panel (each method but the base model, or the base model
    alone) and series (the base model, then each configuration), the density of every reward bin ``[lo, hi)``
    (at most 40 equal bins from the lowest reward - 0.5 to the highest + 0.5, shared by every series) and the
    series' response count ``n``."""
    import numpy as np

    if not rewards:
        raise ValueError("reward_histograms: no samples")
    algos = [a for a in ALGORITHMS if a != "base" and any(k[0] == a for k in rewards)]
    algos += sorted({k[0] for k in rewards} - set(ALGORITHMS))
    everything = [x for v in rewards.values() for x in v]
    lo, hi = min(everything), max(everything)
    edges = np.linspace(lo - 0.5, hi + 0.5, min(40, int(hi - lo) + 2) + 1)
    base = rewards.get(("base", None), [])
    rows = []
    for panel in algos or ["base"]:
        series = [("base", None, base)] if base else []
        keys = sorted((k for k in rewards if k[0] == panel and panel != "base"), key=lambda k: k[1])
        series += [(k[0], k[1], rewards[k]) for k in keys]
        for algo, value, vals in series:
            density, _ = np.histogram(np.asarray(vals, dtype=float), bins=edges, density=True)
            for i in range(len(edges) - 1):
                rows.append({"panel": panel, "algorithm": algo, "value": math.nan if value is None else value,
                             "n": len(vals), "lo": float(edges[i]), "hi": float(edges[i + 1]),
                             "density": float(density[i])})
    return pd.DataFrame(rows, columns=["panel", "algorithm", "value", "n", "lo", "hi", "density"])


def sample_rewards(kl_paths: Iterable[PathLike]) -> dict[tuple[str, Any], list[float]]:
    """Per configuration (algorithm, swept value): the rewards of every sampled response, pooled over seeds."""
    out: dict[tuple[str, Any], list[float]] = {}
    runs = load_kl(kl_paths)
    for r in runs.itertuples(index=False):
        samples = Path(r.path).with_name("samples.jsonl")
        key = (r.algorithm, None if r.value is None or pd.isna(r.value) else r.value)
        out.setdefault(key, []).extend(float(s["reward"]) for s in read_jsonl(samples))
    return out
