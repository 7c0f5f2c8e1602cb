"""The ES paper's Countdown claims: ES improves every base model and beats every RL baseline (v2 Table 1,
Sec. 4.1), ES is ahead of RL throughout training (v2 App. A.5, Fig. 7) and v1's sample-efficiency figure
(v1 Sec. 4.1)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import BY_KEY, V1_RL
from esrepro.report.claims.evidence import Evals
from esrepro.report.claims.rows import (
    Z95,
    ClaimRow,
    accuracy_gap,
    binomial_diff_se,
    compare,
    fmt,
    label,
    reproduced_of,
    why_of,
)
from esrepro.report.verdicts import FAILS, HOLDS, NOT_RESOLVED, Outcome

#: The RL methods of v2 Table 1, in its column order.
RL_METHODS = ("ppo", "grpo8", "grpo30", "grpov", "drgrpov")
#: v1 Sec. 4.1: ES needs under this share of RL's training samples to reach RL's level "in most cases".
V1_SAMPLE_SHARE = 0.2


def _paper(published: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    return ((published.get("tables") or {}).get("table1_countdown") or {}).get("models") or {}


def improves_base(evals: Evals, published: Mapping[str, Any], display: Mapping[str, str], task: str,
                  split: str) -> ClaimRow:
    """ES over the original model, every model of Table 1 run with ES."""
    paper = _paper(published)
    cases, ours, intervals, checks = [], [], [], []
    models = evals.models(task, split, "es")
    for m in models:
        name = display.get(m, m)
        out, text = compare(evals, [(task, split)], (m, "es"), (m, "base"), f"ES - Original on {name}",
                            family=len(models))
        cases.append((name, out))
        ours.append(f"{name} {fmt(evals.mean(task, split, m, 'base'))} -> {fmt(evals.mean(task, split, m, 'es'))}")
        intervals.append(f"{name}: {text}" if text else "")
        for meth in ("base", "es"):
            if (paper.get(m) or {}).get(meth) is not None:
                checks.append((f"{name} {label(meth)} {fmt(evals.mean(task, split, m, meth))} vs "
                               f"{paper[m][meth]:g}", accuracy_gap(evals.mean(task, split, m, meth),
                                                                      paper[m][meth],
                                                                      evals.problems_count(task, split, m, meth))))
    paper_text = "; ".join(f"{display.get(m, m)} {v['base']:g} -> {v['es']:g}" for m, v in paper.items()
                           if v.get("base") is not None and v.get("es") is not None)
    outcome = V.combine(cases) if cases else V.untestable(f"no ES evaluation on {task}/{split}")
    rep, detail = reproduced_of(checks)
    return ClaimRow(BY_KEY["es_improves_base"], None, BY_KEY["es_improves_base"].title,
                    paper_text or "not in published.yaml", "; ".join(ours) or "no ES evaluation", outcome,
                    why_of(cases, "models"), "; ".join(i for i in intervals if i), rep, detail)


def beats_rl(evals: Evals, published: Mapping[str, Any], display: Mapping[str, str], model: str, task: str,
             split: str) -> ClaimRow:
    """ES over every RL baseline of one model (v2 Sec. 4.1: "across all tested models", one row per model)."""
    claim = BY_KEY["es_beats_rl"]
    name = display.get(model, model)
    p = _paper(published).get(model) or {}
    cases, ours, intervals, checks = [], [f"ES {fmt(evals.mean(task, split, model, 'es'))}"], [], []
    family = sum(bool(evals.seeds(task, split, model, rl)) for rl in RL_METHODS)
    for rl in RL_METHODS:
        if not evals.seeds(task, split, model, rl):
            cases.append((label(rl), V.untestable(f"{label(rl)} not run")))
            continue
        out, text = compare(evals, [(task, split)], (model, "es"), (model, rl), f"ES - {label(rl)} on {name}",
                            family=family)
        cases.append((label(rl), out))
        ours.append(f"{label(rl)} {fmt(evals.mean(task, split, model, rl))}")
        intervals.append(f"ES - {label(rl)}: {text}")
    for meth in ("es", *RL_METHODS):
        if p.get(meth) is not None:
            checks.append((f"{label(meth)} {fmt(evals.mean(task, split, model, meth))} vs {p[meth]:g}",
                           accuracy_gap(evals.mean(task, split, model, meth), p[meth],
                                           evals.problems_count(task, split, model, meth))))
    rl_paper = {k: p[k] for k in RL_METHODS if p.get(k) is not None}
    if p.get("es") is not None and rl_paper:
        best = max(rl_paper, key=rl_paper.get)
        paper_text = f"ES {p['es']:g}; best RL {label(best)} {rl_paper[best]:g} ({p['es'] - rl_paper[best]:+.1f})"
    else:
        paper_text = "not in the paper's Table 1"
    outcome = V.combine(cases)
    if outcome.verdict in (FAILS, NOT_RESOLVED):
        outcome = Outcome(outcome.verdict, f"{name}: {outcome.reason}")
    rep, detail = reproduced_of(checks)
    return ClaimRow(claim, model, f"{claim.title}: {name}", paper_text, ", ".join(ours), outcome,
                    why_of(cases, "baselines"), "; ".join(intervals), rep, detail)


# --- curves: accuracy against training samples ---------------------------------------------------------------------
def _at(curve: pd.DataFrame, samples: float) -> float | None:
    """A mean curve's accuracy at ``samples`` (linear between its points; None outside its range)."""
    x, y = curve["samples"].to_numpy(float), curve["accuracy"].to_numpy(float)
    if len(x) == 0 or samples < x[0] - 1e-9 or samples > x[-1] + 1e-9:
        return None
    return float(np.interp(samples, x, y))


def _se(acc_a: float, acc_b: float, n: float) -> float:
    """The standard error (points) of the difference of two accuracies on ``n`` problems each."""
    if not n or math.isnan(n):
        return math.nan
    return 100 * binomial_diff_se(acc_a / 100, acc_b / 100, n)


def ahead_throughout(curves: pd.DataFrame, display: Mapping[str, str]) -> ClaimRow:
    """ES's test-accuracy curve above each RL method's at every RL evaluation point after the start. Holds when ES
    is above by more than 1.96 binomial standard errors at every point (an intersection-union test); does not hold
    when Holm's procedure over every point of every model-method pair rejects "ES at or above RL" at some point
    (one-sided normal p-values), so a single early dip within the noise of many points refutes nothing."""
    from scipy.stats import norm

    claim = BY_KEY["es_ahead_throughout"]
    cases, ours = [], []
    pairs: list[tuple[str, list[tuple[float, float, float]]]] = []
    for model in sorted(set(curves[curves["method"] == "es"]["model"])):
        es = curves[(curves["model"] == model) & (curves["method"] == "es")].sort_values("samples")
        for rl in RL_METHODS:
            c = curves[(curves["model"] == model) & (curves["method"] == rl)].sort_values("samples")
            if c.empty:
                continue
            key = f"{display.get(model, model)} {label(rl)}"
            points = []
            for r in c.iloc[1:].itertuples(index=False):  # the start is the base model for both
                e = _at(es, r.samples)
                if e is not None:
                    points.append((r.samples, e - r.accuracy, _se(e, r.accuracy, min(r.n, float(es["n"].min())))))
            pairs.append((key, points))
    pvalues = [float(norm.cdf(d / se)) if se and not math.isnan(se) else (0.0 if se == 0 and d < 0 else math.nan)
               for _, points in pairs for _, d, se in points]
    rejected = iter(V.holm(pvalues))
    for key, points in pairs:
        if not points:
            cases.append((key, V.untestable("no evaluation point after the start within ES's samples")))
            continue
        worst = min(points, key=lambda t: t[1] / t[2] if t[2] and not math.isnan(t[2]) else t[1])
        flags = [next(rejected) for _ in points]
        against = [pt for pt, f in zip(points, flags, strict=True) if f]
        unresolved = [pt for pt in points if math.isnan(pt[2]) or pt[1] <= Z95 * pt[2]]
        ours.append(f"{key}: {len(points)} points, smallest gap {worst[1]:+.1f} at {worst[0]:g} samples")
        if against:
            cases.append((key, Outcome(FAILS, f"ES below at {against[0][0]:g} samples ({against[0][1]:+.1f} "
                                              f"points; Holm over {len(pvalues)} points)")))
        elif unresolved:
            within = [pt for pt in unresolved if math.isnan(pt[2]) or abs(pt[1]) <= Z95 * pt[2]]
            text = f"within two standard errors at {len(within)} of {len(points)} points"
            below = len(unresolved) - len(within)
            if below:
                text += (f"; below by more at {below} point{'s' * (below > 1)}, not beyond Holm's bound over "
                         f"{len(pvalues)} points")
            cases.append((key, Outcome(NOT_RESOLVED, text)))
        else:
            cases.append((key, Outcome(HOLDS, f"ES above at all {len(points)} points")))
    outcome = V.combine(cases) if cases else V.untestable("no test-accuracy curves of ES and an RL method "
                                                          "(periodic evaluation not run)")
    return ClaimRow(claim, None, claim.title, "Fig. 7's curves; their numbers are not published",
                    "; ".join(ours) or "no curves", outcome, why_of(cases, "model-method pairs"),
                    "binomial standard error of each point's difference (test problems per point)")


def first_reaching(curve: pd.DataFrame, level: float) -> float | None:
    """Samples at the first point of a (samples, accuracy) curve at or above ``level`` (None: never)."""
    hit = curve[curve["accuracy"] >= level - 1e-9].sort_values("samples")
    return None if hit.empty else float(hit["samples"].iloc[0])


def sample_share_v1(curves: pd.DataFrame, display: Mapping[str, str]) -> ClaimRow:
    """v1's claim: to reach an RL method's level (its best accuracy), ES needs under 20% of the training samples the
    RL method was given (its budget, the last point of its curve), in most cases (model and v1 RL method pairs:
    PPO and GRPO with groups of 8 and 30; v1 had no VERL baselines). An RL method that never rises above its start
    sets no level to reach: that pair is left out, and said so."""
    claim = BY_KEY["es_sample_efficiency_v1"]
    shares, ours = [], []
    skipped: list[str] = []
    for model in sorted(set(curves[curves["method"] == "es"]["model"])) if not curves.empty else []:
        es = curves[(curves["model"] == model) & (curves["method"] == "es")]
        for rl in V1_RL:
            c = curves[(curves["model"] == model) & (curves["method"] == rl)]
            if c.empty:
                continue
            key = f"{display.get(model, model)} {label(rl)}"
            start = c.sort_values("samples")["accuracy"].iloc[0]
            best, budget = float(c["accuracy"].max()), float(c["samples"].max())
            if best <= float(start) or budget <= 0:
                skipped.append(key)
                ours.append(f"{key}: no gain over its start")
                continue
            s_es = first_reaching(es, best)
            share = math.inf if s_es is None else s_es / budget
            shares.append((key, share))
            ours.append(f"{key}: {'never' if s_es is None else f'{share:.2f}'}")
    if not shares:
        outcome = V.untestable("no v1 RL method rises above its start" if skipped
                               else "no test-accuracy curves of ES and a v1 RL method (periodic evaluation)")
        why = "nothing to test"
    else:
        under = [k for k, s in shares if s < V1_SAMPLE_SHARE]
        ok = len(under) > len(shares) / 2
        outcome = Outcome(HOLDS if ok else NOT_RESOLVED,  # point estimates: never a refutation
                          f"under {V1_SAMPLE_SHARE:g} of RL's budget in {len(under)} of {len(shares)} cases "
                          "(point estimates, no interval)")
        why = f"under {V1_SAMPLE_SHARE:.0%} in {len(under)} of {len(shares)} cases"
    if skipped and shares:
        outcome = Outcome(outcome.verdict, outcome.reason + f"; not testable: {', '.join(skipped)} (no gain over "
                                                            "its start)")
    return ClaimRow(claim, None, claim.title, "stated in v1's text; the curves' numbers are not published",
                    "; ".join(ours) or "no curves", outcome, why, "mean curves over seeds; no interval")
