"""The conciseness study's GRPO learning-rate sweep: the ES paper's Figure 4 (a, b) and Figure 5 (a-d) (v2 App.
A.4; Figures 3 and 4 in v1).

- Figure 4(a): mean reward against mean KL(fine-tuned || base) of every GRPO model, for
  beta in {0, 0.01, 0.1, 1.0} x learning rate in {2, 3, 4, 5} x 1e-6, four seeds.
- Figure 4(b): the ES Pareto front against the GRPO front pooled over those learning rates and betas.
- Figure 5(a-d): one panel per learning rate: the distribution of rewards of sampled
  responses (20 per held-out prompt) of GRPO at each beta, of ES at each sigma, and of the
  base model (Qwen2.5-7B-Instruct); (c, d) are the learning rates 4e-6 and 5e-6.

The paper's rewards are normalised to [0, 1] (v2 App. A.2: 0 is a raw reward of -2000, 1 the best, 0):
``reward_worst=-2000`` (the default, :data:`~esrepro.report.conciseness.REWARD_WORST`) reproduces that;
``reward_worst=None`` plots raw rewards. Its reward is measured on sampled responses, hence
``reward="reward_sampled"`` by default (``"reward"``: greedy); KL by Schulman's k3 (v2 App. A.2) by default.

Input: the ``kl.json`` files ``esrepro kl`` writes (see :mod:`esrepro.report.conciseness`),
with ``samples.jsonl`` beside each for the distributions. A GRPO run's beta and learning
rate are read from ``hyper`` (``beta``, ``learning_rate``), else from its method name
(``grpo_beta0.01``, ``grpo_lr3e-06``, ``grpo_beta0.1_lr2e-06``); a GRPO run with neither is an error.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from esrepro.io import read_json, read_jsonl
from esrepro.report.conciseness import REWARD_WORST, load_kl, normalise_reward, pareto_front
from esrepro.report.figures import save_figure, write_frame_csv

PathLike = str | os.PathLike
RewardField = Literal["reward_sampled", "reward"]

#: algorithms whose runs make up the sweep (each needs a learning rate)
SWEEP_ALGORITHMS = ("grpo", "dr_grpo")
_NUMBER = r"([0-9][0-9.]*(?:[eE][+-]?[0-9]+)?)"
_NAME_KEYS = {key: re.compile(rf"(?:^|_){short}{_NUMBER}(?=_|$)")
              for key, short in (("beta", "beta"), ("learning_rate", "lr"), ("sigma", "sigma"))}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def value_from_name(method: str, key: str) -> float | None:
    """``beta`` / ``learning_rate`` / ``sigma`` from a method name (``grpo_beta0.01_lr3e-06``), else None."""
    m = _NAME_KEYS[key].search(method)
    return float(m[1]) if m else None


def load_sweep(kl_paths: Iterable[PathLike], reward: RewardField = "reward_sampled",
               reward_worst: float | None = REWARD_WORST) -> pd.DataFrame:
    """One row per kl.json: algorithm, beta, learning_rate, sigma, seed, reward, KL estimates, checkpoints.

    ``reward`` and every checkpoint's reward are mapped by :func:`normalise_reward` when
    ``reward_worst`` is given.
    """
    paths = list(kl_paths)
    runs = load_kl(paths)
    rows = []
    for r in runs.to_dict("records"):
        hyper = read_json(r["path"]).get("hyper", {}) or {}
        vals = {k: hyper.get(k, value_from_name(r["method"], k)) for k in ("beta", "learning_rate", "sigma")}
        if r["algorithm"] in SWEEP_ALGORITHMS and vals["learning_rate"] is None:
            raise ValueError(f"{r['path']}: {r['algorithm']} run {r['method']!r} has no learning rate "
                             "(neither hyper.learning_rate nor 'lr<value>' in the method name)")
        if reward not in r or (isinstance(r[reward], float) and math.isnan(r[reward])):
            raise ValueError(f"{r['path']}: no {reward!r} in kl.json")
        checkpoints = []
        for c in r["checkpoints"]:
            if reward not in c:
                raise ValueError(f"{r['path']}: checkpoint at iteration {c.get('iteration')} has no {reward!r}")
            checkpoints.append({**c, "reward": normalise_reward(c[reward], reward_worst), "reward_raw": float(c[reward])})
        rows.append({**{k: r[k] for k in ("model", "method", "seed", "algorithm", "exact", "k1", "k3", "path")},
                     **{k: (math.nan if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
                        for k, v in vals.items()},
                     "reward": normalise_reward(r[reward], reward_worst), "reward_raw": float(r[reward]),
                     "checkpoints": checkpoints})
    return pd.DataFrame(rows)


def _reward_label(reward: RewardField, worst: float | None) -> str:
    what = "sampled responses" if reward == "reward_sampled" else "greedy responses"
    scale = f"normalised: 0 = {worst:g}, 1 = 0" if worst is not None else "raw: −|len(response) − len(solution)|"
    return f"mean reward ({what})\n{scale}"


def sweep_points(runs: pd.DataFrame, kl: str = "k3") -> pd.DataFrame:
    """The plotted points: each run's final (kind ``run``), each configuration's mean ± std over seeds
    (``config``), every kept checkpoint (``checkpoint``, with ``on_front`` for its algorithm family's front);
    ``reward`` as plotted, ``reward_raw`` before normalisation."""
    rows = []
    for r in runs.itertuples(index=False):
        base = {"algorithm": r.algorithm, "beta": r.beta, "learning_rate": r.learning_rate, "sigma": r.sigma}
        rows.append({**base, "kind": "run", "seed": r.seed, "iteration": math.nan, "kl": getattr(r, kl),
                     "reward": r.reward, "reward_raw": r.reward_raw, "kl_std": math.nan, "reward_std": math.nan,
                     "seeds": 1})
        for c in r.checkpoints:
            rows.append({**base, "kind": "checkpoint", "seed": r.seed, "iteration": c["iteration"], "kl": c[kl],
                         "reward": c["reward"], "reward_raw": c["reward_raw"], "kl_std": math.nan,
                         "reward_std": math.nan, "seeds": 1})
    keys = ["algorithm", "beta", "learning_rate", "sigma"]
    for key, g in runs.groupby(keys, dropna=False, sort=True):
        rows.append({**dict(zip(keys, key, strict=True)), "kind": "config", "seed": math.nan, "iteration": math.nan,
                     "kl": float(g[kl].mean()), "reward": float(g["reward"].mean()),
                     "reward_raw": float(g["reward_raw"].mean()), "kl_std": float(g[kl].std()) if len(g) > 1 else math.nan,
                     "reward_std": float(g["reward"].std()) if len(g) > 1 else math.nan, "seeds": len(g)})
    pts = pd.DataFrame(rows)
    pts["on_front"] = False
    ck = pts[pts["kind"] == "checkpoint"]
    for family in ("es", "rl"):
        sel = ck[ck["algorithm"] == "es"] if family == "es" else ck[ck["algorithm"].isin(SWEEP_ALGORITHMS)]
        if len(sel):
            front = sel.index[pareto_front(list(sel["kl"]), list(sel["reward"]))]
            pts.loc[front, "on_front"] = True
    return pts


def _lr_colors(lrs: Sequence[float]) -> dict[float, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["plasma"]
    k = max(1, len(lrs) - 1)
    return {lr: cmap(0.05 + 0.8 * i / k) for i, lr in enumerate(sorted(lrs))}


def sweep_figure(points: pd.DataFrame, out_stem: PathLike, ylabel: str, kl: str = "k3",
                 title: str = "Conciseness: GRPO over learning rates and β, against ES") -> list[Path]:
    """(a) GRPO configurations' reward vs KL, colour = learning rate, marker = β; (b) ES vs GRPO Pareto fronts."""
    rl = points[points["algorithm"].isin(SWEEP_ALGORITHMS)]
    if rl.empty:
        raise ValueError("sweep_figure: no GRPO / Dr.GRPO runs in the sweep")
    lrs = sorted(set(rl["learning_rate"]))
    betas = sorted(set(rl["beta"].dropna()))
    colors = _lr_colors(lrs)
    marker = {b: _MARKERS[i % len(_MARKERS)] for i, b in enumerate(betas)}
    fig = Figure(figsize=(13.0, 5.0), layout="constrained")
    ax, bx = fig.subplots(1, 2, sharey=True)
    for r in rl[rl["kind"] == "run"].itertuples(index=False):
        ax.scatter(r.kl, r.reward, color=colors[r.learning_rate], marker=marker.get(r.beta, "x"), s=14, alpha=0.35,
                   linewidths=0)
    for r in rl[rl["kind"] == "config"].itertuples(index=False):
        ax.errorbar(r.kl, r.reward, xerr=None if math.isnan(r.kl_std) else r.kl_std,
                    yerr=None if math.isnan(r.reward_std) else r.reward_std, color=colors[r.learning_rate],
                    marker=marker.get(r.beta, "x"), markersize=8, markeredgecolor="k", markeredgewidth=0.5,
                    elinewidth=0.8, capsize=2)
    handles = [Line2D([], [], color=colors[lr], marker="o", linestyle="", label=f"lr = {lr:.3g}") for lr in lrs]
    handles += [Line2D([], [], color="0.4", marker=marker[b], linestyle="", label=f"β = {b:g}") for b in betas]
    ax.legend(handles=handles, fontsize="x-small", loc="lower right", ncols=2,
              title="large: mean ± std over seeds; small: each seed", title_fontsize="x-small")
    ax.set_title("(a) GRPO: final models over learning rates and β", fontsize="medium")
    # (b) Pareto fronts over every kept checkpoint
    ck = points[points["kind"] == "checkpoint"]
    for family, color, name in (("rl", "k", "GRPO (all learning rates and β)"), ("es", "C0", "ES (all σ)")):
        sel = ck[ck["algorithm"].isin(SWEEP_ALGORITHMS)] if family == "rl" else ck[ck["algorithm"] == "es"]
        if sel.empty:
            continue
        bx.scatter(sel["kl"], sel["reward"], color=color, s=10, alpha=0.25, linewidths=0)
        front = sel[sel["on_front"]].sort_values("kl")
        bx.step(front["kl"], front["reward"], where="post", color=color, linewidth=1.8, label=f"{name}: Pareto front")
        bx.scatter(front["kl"], front["reward"], color=color, s=24, zorder=4)
    base = points[(points["kind"] == "run") & (points["algorithm"] == "base")]
    if len(base):
        for a in (ax, bx):
            a.scatter(base["kl"], base["reward"], color="0.3", marker="*", s=150, zorder=5, label="base model")
    bx.legend(loc="lower right", fontsize="x-small", title="faint: every kept checkpoint", title_fontsize="x-small")
    bx.set_title("(b) Pareto fronts: ES against GRPO", fontsize="medium")
    for a in (ax, bx):
        a.set_xlabel(f"KL(fine-tuned || base) per response ({kl})")
        a.grid(True, alpha=0.3)
    ax.set_ylabel(ylabel)
    fig.suptitle(title)
    return save_figure(fig, out_stem)


def build_lr_sweep(
    kl_paths: Sequence[PathLike],
    out_stem: PathLike,
    kl: str = "k3",
    reward: RewardField = "reward_sampled",
    reward_worst: float | None = REWARD_WORST,
) -> list[Path]:
    """Figure 4 (a, b) from kl.json files (GRPO sweep runs, ES runs, base): PNG, PDF and CSV of the points."""
    runs = load_sweep(kl_paths, reward, reward_worst)
    points = sweep_points(runs, kl)
    paths = sweep_figure(points, out_stem, _reward_label(reward, reward_worst), kl)
    return [*paths, write_frame_csv(points, Path(f"{out_stem}.csv"))]


# --- Figure 5: reward distributions per learning rate --------------------------------------
def sample_rewards_by_run(runs: pd.DataFrame) -> dict[int, list[float]]:
    """Row index of ``runs`` -> raw rewards of the run's sampled responses (``samples.jsonl`` beside kl.json)."""
    out = {}
    for i, path in runs["path"].items():
        samples = Path(path).with_name("samples.jsonl")
        if not samples.exists():
            raise FileNotFoundError(f"{samples}: the sampled responses of {path} are missing")
        rows = read_jsonl(samples)
        if any("reward" not in s for s in rows):
            raise ValueError(f"{samples}: a response has no 'reward'")
        out[i] = [float(s["reward"]) for s in rows]
    return out


def distribution_table(runs: pd.DataFrame, rewards: dict[int, list[float]],
                       learning_rates: Sequence[float] | None = None, n_bins: int = 40,
                       reward_worst: float | None = REWARD_WORST) -> pd.DataFrame:
    """Per learning-rate panel and series (GRPO per β at that rate, ES per σ, base): density per bin.

    ``rewards``: raw rewards per run (:func:`sample_rewards_by_run`). Responses are pooled over
    seeds; the bins span every reward, one per integer when the rewards are integers spanning
    fewer than ``n_bins`` values (the raw conciseness reward is); the rewards are then mapped with
    :func:`normalise_reward` and the edges linearly when ``reward_worst`` is given.
    """
    rl = runs[runs["algorithm"].isin(SWEEP_ALGORITHMS)]
    found = sorted(set(rl["learning_rate"]))
    if learning_rates is None:
        panels = found
    else:
        panels = []
        for lr in learning_rates:
            match = [f for f in found if math.isclose(f, lr, rel_tol=1e-6)]
            if not match:
                present = ", ".join(f"{f:g}" for f in found)
                raise ValueError(f"learning rate {lr:g}: no GRPO run (rates present: {present})")
            panels.append(match[0])
    series: list[tuple[float, str, str, float, list[float]]] = []  # (panel lr, label, algorithm, value, rewards)
    for lr in panels:
        for (algo, beta), g in rl[np.isclose(rl["learning_rate"], lr)].groupby(["algorithm", "beta"], dropna=False):
            name = "GRPO" if algo == "grpo" else "Dr.GRPO"
            series.append((lr, f"{name} β = {beta:g}", algo, beta, [x for i in g.index for x in rewards[i]]))
        for sigma, g in runs[runs["algorithm"] == "es"].groupby("sigma", dropna=False):
            series.append((lr, f"ES σ = {sigma:g}", "es", sigma, [x for i in g.index for x in rewards[i]]))
        base = runs[runs["algorithm"] == "base"]
        if len(base):
            series.append((lr, "base model", "base", math.nan, [x for i in base.index for x in rewards[i]]))
    values = [x for s in series for x in s[4]]
    if not values:
        raise ValueError("distribution_table: no sampled rewards")
    lo, hi = min(values), max(values)
    if all(float(v).is_integer() for v in values) and hi - lo < n_bins:
        edges = np.arange(lo - 0.5, hi + 1.0, 1.0)
    else:
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, n_bins + 1)
    norm = np.vectorize(lambda v: normalise_reward(v, reward_worst), otypes=[float])
    # the edges map linearly (unclipped), so that the best reward's bin keeps its width
    edges = edges if reward_worst is None else (edges - reward_worst) / -reward_worst
    rows = []
    for lr, label, algo, value, vals in series:
        dens, _ = np.histogram(norm(np.asarray(vals, dtype=float)), bins=edges, density=True)
        for i in range(len(edges) - 1):
            rows.append({"learning_rate": lr, "series": label, "algorithm": algo, "value": value, "n": len(vals),
                         "lo": float(edges[i]), "hi": float(edges[i + 1]), "density": float(dens[i])})
    return pd.DataFrame(rows)


def distribution_figure(
    table: pd.DataFrame,
    out_stem: PathLike,
    xlabel: str,
    title: str = "Conciseness: reward distributions per GRPO learning rate, against ES",
) -> list[Path]:
    """One panel per learning rate: GRPO per β (solid), ES per σ (dashed blues), base model (grey, filled)."""
    lrs = list(dict.fromkeys(table["learning_rate"]))
    ncols = min(2, len(lrs))
    nrows = math.ceil(len(lrs) / ncols)
    fig = Figure(figsize=(6.4 * ncols, 3.9 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True).ravel()
    from matplotlib import colormaps

    blues, warm = colormaps["Blues"], colormaps["autumn"]
    for k, (ax, lr) in enumerate(zip(axes, lrs, strict=False)):
        panel = table[table["learning_rate"] == lr]
        labels = list(dict.fromkeys(panel["series"]))
        rl_labels = [s for s in labels if panel[panel["series"] == s]["algorithm"].iloc[0] in SWEEP_ALGORITHMS]
        es_labels = [s for s in labels if panel[panel["series"] == s]["algorithm"].iloc[0] == "es"]
        for s in labels:
            sub = panel[panel["series"] == s]
            edges = np.append(sub["lo"].to_numpy(), sub["hi"].iloc[-1])
            algo = sub["algorithm"].iloc[0]
            lab = f"{s} (n={sub['n'].iloc[0]})"
            if algo == "base":
                ax.stairs(sub["density"], edges, fill=True, color="0.6", alpha=0.5, label=lab)
            elif algo == "es":
                i = es_labels.index(s)
                ax.stairs(sub["density"], edges, color=blues(0.5 + 0.45 * i / max(1, len(es_labels) - 1)),
                          linestyle="--", linewidth=1.6, label=lab)
            else:
                i = rl_labels.index(s)
                ax.stairs(sub["density"], edges, color=warm(0.85 * i / max(1, len(rl_labels) - 1)),
                          linewidth=1.6, label=lab)
        ax.set_title(f"({chr(ord('a') + k)}) GRPO learning rate {lr:.3g}", fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("density")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize="xx-small")
    for ax in axes[len(lrs):]:
        ax.set_visible(False)
    fig.suptitle(title)
    return save_figure(fig, out_stem)


def build_lr_distributions(
    kl_paths: Sequence[PathLike],
    out_stem: PathLike,
    learning_rates: Sequence[float] | None = None,
    reward_worst: float | None = REWARD_WORST,
    n_bins: int = 40,
) -> list[Path]:
    """Figure 5 (one panel per learning rate; ``learning_rates=[4e-6, 5e-6]`` gives 5(c, d)): PNG, PDF, CSV."""
    runs = load_sweep(kl_paths, "reward_sampled")
    table = distribution_table(runs, sample_rewards_by_run(runs), learning_rates, n_bins, reward_worst)
    scale = f"normalised: 0 = {reward_worst:g}, 1 = 0" if reward_worst is not None else "raw"
    paths = distribution_figure(table, out_stem, f"reward of a sampled response ({scale})")
    return [*paths, write_frame_csv(table, Path(f"{out_stem}.csv"))]
