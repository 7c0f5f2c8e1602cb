"""The ES paper's further conciseness claims: ES's KL varies less over seeds than GRPO's, as its reward does (v2
Sec. 4.2, Table 2); GRPO's reward and KL rise with its learning rate (v2 App. A.4, Fig. 4a); and at small learning
rates GRPO stays near the base model's reward while ES moves it up (v2 App. A.4, Fig. 5).

Each reads the conciseness study's runs (one ``kl.json`` per configuration and seed, the final weights) and, for the
last two, the GRPO learning-rate sweep's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import BY_KEY
from esrepro.report.claims.conciseness import welch_gap
from esrepro.report.claims.rows import ClaimRow, why_of
from esrepro.report.conciseness import PAPER_KL, paper_rows
from esrepro.report.verdicts import FAILS, HOLDS, NOT_RESOLVED, Interval, Outcome

#: What each claim reads: the normalised reward and the paper's KL estimator (Schulman's k3).
METRICS = {"reward": "reward_norm", "KL": PAPER_KL}
#: Fig. 5's GRPO panels that stay near the base model: the sweep's smallest learning rates, this many of them.
SMALL_LRS = 2


def _spread(runs: pd.DataFrame, column: str) -> list[dict[str, Any]]:
    """Per ES or GRPO configuration: mean reward, ``column``'s mean and std over seeds, and the number of seeds."""
    out = []
    for (algo, method), g in runs[runs["algorithm"].isin(["es", "grpo"])].groupby(["algorithm", "method"]):
        vals = g[column].astype(float)
        out.append({"algo": algo, "method": method, "reward": float(g["reward_norm"].astype(float).mean()),
                    "n": len(vals), "std": float(vals.std()) if len(vals) > 1 else math.nan})
    return out


def kl_stability_row(runs: pd.DataFrame, published: Mapping[str, Any], reward_cutoff: float | None) -> ClaimRow:
    """Table 2's KL: GRPO's largest KL std over seeds over ES's smallest, among the configurations whose reward is
    above the cut-off, the F interval of the ratio Bonferroni-widened for choosing that pair (rule 3)."""
    claim = BY_KEY["es_kl_stable"]
    prow = paper_rows(published)
    es_p = [r for r in prow if r["algorithm"] == "es" and "kl_std" in r]
    gr_p = [r for r in prow if r["algorithm"] == "grpo" and "kl_std" in r]
    paper = "not in published.yaml"
    if es_p and gr_p:
        g, e = max(gr_p, key=lambda r: r["kl_std"]), min(es_p, key=lambda r: r["kl_std"])
        paper = f"GRPO KL std {g['kl_std']:g} / ES {e['kl_std']:g} = {g['kl_std'] / e['kl_std']:.1f}x (4 seeds)"
    if runs.empty:
        return ClaimRow(claim, None, claim.title, paper, "not run", V.untestable("not run"), "not run")
    per = _spread(runs, PAPER_KL)
    kept = [p for p in per if p["n"] > 1 and (reward_cutoff is None or p["reward"] > reward_cutoff)]
    es_k, gr_k = [p for p in kept if p["algo"] == "es"], [p for p in kept if p["algo"] == "grpo"]
    ours, interval = f"{len(kept)} of {len(per)} configurations with 2+ seeds above the cut-off {reward_cutoff}", ""
    if not (es_k and gr_k):
        outcome = V.untestable("no ES or no GRPO configuration with 2+ seeds above the reward cut-off")
    else:
        g, e = max(gr_k, key=lambda p: p["std"]), min(es_k, key=lambda p: p["std"])
        iv = V.std_ratio_interval(g["std"], g["n"], e["std"], e["n"], pairs=len(gr_k) * len(es_k))
        if iv is None:
            outcome = V.untestable("ES's smallest KL std is 0: no ratio")
        else:
            outcome = V.ratio_outcome(f"GRPO {g['method']} KL std / ES {e['method']} KL std", iv)
            interval = f"{iv.estimate:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}] ({iv.method})"
            ours += f"; KL std ratio {iv.estimate:.1f}x"
    why = {HOLDS: "the ratio's interval lies above 1", NOT_RESOLVED: "the ratio's interval includes 1",
           FAILS: "the ratio's interval lies below 1"}.get(outcome.verdict, outcome.reason)
    return ClaimRow(claim, None, claim.title, paper, ours, outcome, why,
                    interval or "F interval of the KL std ratio (needs 2+ seeds)")


def above_zero(text: str, iv: Interval, against: str) -> Outcome:
    """Holds when ``iv``'s 95% interval lies above 0; does not hold when its refuting end (Holm's bound) lies below
    0, saying ``against``; not resolved otherwise."""
    if iv.lo > 0:
        return Outcome(HOLDS, text)
    if iv.against < 0:
        return Outcome(FAILS, f"{text}: {against}")
    return Outcome(NOT_RESOLVED, f"{text}: the interval includes 0")


def slope_interval(x: np.ndarray, y: np.ndarray, family: int) -> Interval | None:
    """The least-squares slope of ``y`` on ``x`` with its 95% t interval (n - 2 degrees of freedom) and its upper end
    at level 1 - 0.05 / ``family``; None with fewer than three points or two distinct x."""
    from scipy import stats

    if x.size < 3 or np.unique(x).size < 2:
        return None
    fit = stats.linregress(x, y)
    if not math.isfinite(fit.stderr) or fit.stderr == 0:
        return Interval(float(fit.slope), float(fit.slope), float(fit.slope), "least squares, no residual spread")
    q, q_family = stats.t.ppf([(1 + V.LEVEL) / 2, 1 - (1 - V.LEVEL) / 2 / max(1, family)], x.size - 2)
    return Interval(float(fit.slope), fit.slope - q * fit.stderr, fit.slope + q * fit.stderr,
                    f"least-squares slope on log10 learning rate over {x.size} runs, t interval",
                    fit.slope + q_family * fit.stderr if family > 1 else None)


def _grpo_sweep(runs: pd.DataFrame) -> pd.DataFrame:
    if runs.empty:
        return runs
    g = runs[runs["algorithm"] == "grpo"]
    return g[g["learning_rate"].notna() & g["beta"].notna()]


def lr_trend_row(runs: pd.DataFrame) -> ClaimRow:
    """Fig. 4a: per beta, the slopes of GRPO's reward and KL on log learning rate (every seed a point) clear 0.
    Holds when every slope's 95% interval lies above 0 (an intersection-union test); does not hold when one lies
    below 0 at Holm's bound over the slopes; not resolved otherwise."""
    claim = BY_KEY["grpo_lr_raises_reward_kl"]
    sweep = _grpo_sweep(runs)
    lrs = sorted(sweep["learning_rate"].astype(float).unique()) if not sweep.empty else []
    if len(lrs) < 2:
        return ClaimRow(claim, None, claim.title, "Fig. 4a: curves only", "not run",
                        V.untestable("no GRPO learning-rate sweep with two or more rates"), "not run")
    betas = sorted(sweep["beta"].astype(float).unique())
    family = 2 * len(betas)
    cases, ours, intervals = [], [], []
    for beta in betas:
        g = sweep[sweep["beta"].astype(float) == beta]
        x = np.log10(g["learning_rate"].astype(float).to_numpy())
        for what, col in METRICS.items():
            name = f"{what} at beta {beta:g}"
            iv = slope_interval(x, g[col].astype(float).to_numpy(), family)
            if iv is None:
                cases.append((name, V.untestable("fewer than three runs or one learning rate")))
                continue
            intervals.append(f"{name}: {iv.text(3)}")
            cases.append((name, above_zero(f"slope {iv.text(3)}", iv, f"falls (Holm over {family} slopes)")))
        means = g.groupby(g["learning_rate"].astype(float))[["reward_norm", PAPER_KL]].mean()
        ours.append(f"beta {beta:g}: " + ", ".join(f"{lr:g} {r:.2f}/{k:.2f}" for lr, (r, k) in means.iterrows()))
    return ClaimRow(claim, None, claim.title, "Fig. 4a: curves only; both rise with the learning rate",
                    "reward/KL by learning rate: " + "; ".join(ours), V.combine(cases),
                    why_of(cases, "slopes"), "; ".join(intervals))


def near_base_row(runs: pd.DataFrame) -> ClaimRow:
    """Fig. 5: at the sweep's :data:`SMALL_LRS` smallest learning rates, ES's reward (its best configuration, the
    choice corrected for) lies above every GRPO configuration's and above the base model's: Welch t over seeds per
    comparison; holds when every interval lies above 0, does not hold when one lies below at Holm's bound."""
    claim = BY_KEY["grpo_near_base_es_shifts"]
    paper = "Fig. 5: distributions only; GRPO near the base model, ES shifted up"
    sweep = _grpo_sweep(runs)
    es = runs[runs["algorithm"] == "es"] if not runs.empty else runs
    base = runs[runs["algorithm"] == "base"] if not runs.empty else runs
    if sweep.empty or es.empty or base.empty:
        missing = [w for w, d in (("the GRPO learning-rate sweep", sweep), ("ES", es), ("the base model", base))
                   if d.empty]
        return ClaimRow(claim, None, claim.title, paper, "not run", V.untestable(f"{', '.join(missing)} not run"),
                        "not run")
    small = sorted(sweep["learning_rate"].astype(float).unique())[:SMALL_LRS]
    grpo = sweep[sweep["learning_rate"].astype(float).isin(small)]
    configs = [(k, g["reward_norm"].astype(float).to_numpy())
               for k, g in grpo.groupby([grpo["beta"].astype(float), grpo["learning_rate"].astype(float)])]
    es_by = {m: g["reward_norm"].astype(float).to_numpy() for m, g in es.groupby("method")}
    top = max(es_by, key=lambda m: es_by[m].mean())
    a = es_by[top]
    family = (len(configs) + 1) * len(es_by)  # every comparison, times the choice of ES's configuration
    base_r = base["reward_norm"].astype(float).to_numpy()
    cases, intervals = [], []
    for name, b in [("base model", base_r)] + [(f"GRPO beta {k[0]:g} lr {k[1]:g}", r) for k, r in configs]:
        iv, _ = welch_gap(a, b, family) if b.size > 1 else _one_sample(a, float(b.mean()), family)
        label = f"ES {top} - {name}"
        if math.isnan(iv.lo):
            cases.append((name, V.untestable(f"{label}: fewer than two seeds")))
            continue
        intervals.append(f"{label}: {iv.text(3)}")
        cases.append((name, above_zero(f"{label}: {iv.text(3)}", iv, f"below 0 (Holm over {family})")))
    ours = (f"reward: base {base_r.mean():.2f}, ES {top} {a.mean():.2f}, GRPO at lr "
            f"{', '.join(f'{x:g}' for x in small)} {min(r.mean() for _, r in configs):.2f}-"
            f"{max(r.mean() for _, r in configs):.2f}")
    return ClaimRow(claim, None, claim.title, paper, ours, V.combine(cases), why_of(cases, "comparisons"),
                    "; ".join(intervals))


def _one_sample(a: np.ndarray, value: float, family: int) -> tuple[Interval, float]:
    """mean(a) - ``value`` with a one-sample t interval over ``a``'s seeds (the base model: one evaluation)."""
    from scipy import stats

    diff = float(a.mean() - value)
    if a.size < 2:
        return Interval(diff, math.nan, math.nan, "fewer than two seeds"), math.nan
    se = float(a.std(ddof=1) / math.sqrt(a.size))
    if se == 0:
        return Interval(diff, diff, diff, "no spread over seeds"), math.nan
    q, q_family = stats.t.ppf([(1 + V.LEVEL) / 2, 1 - (1 - V.LEVEL) / 2 / max(1, family)], a.size - 1)
    return Interval(diff, diff - q * se, diff + q * se, f"one-sample t over {a.size} seeds, 95%",
                    diff + q_family * se), math.nan
