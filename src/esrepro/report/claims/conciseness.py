"""The ES paper's conciseness claims (v2 Sec. 4.2, Table 2, Fig. 1; App. A.4, Fig. 4b): ES's reward-KL front lies
above GRPO's, GRPO at small beta hacks the reward while ES does not, and ES's reward varies less over seeds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import BY_KEY
from esrepro.report.claims.rows import NO, NOT_RUN, YES, ClaimRow, mean_gap, reproduced_of
from esrepro.report.conciseness import PAPER_KL, checkpoint_points, hacked_runs, paper_rows
from esrepro.report.verdicts import (
    FAILS,
    HOLDS,
    LEVEL,
    NOT_RESOLVED,
    Interval,
    Outcome,
)

#: GRPO's "small" KL penalties: the betas whose runs the ES paper says hacked (v2 Sec. 4.2, Table 2: 0 and 0.01).
SMALL_BETA = 0.01

Point = tuple[float, float]  # (KL, normalised reward)


def staircase(es: Sequence[Point], kl: float) -> float | None:
    """ES's front reward at ``kl``: the best reward of an ES point with no more KL (None: every ES point has more)."""
    rewards = [r for k, r in es if k <= kl + 1e-12]
    return max(rewards) if rewards else None


def front_gaps(es: Sequence[Point], grpo: Sequence[Point]) -> tuple[list[tuple[Point, float]], list[Point]]:
    """For each point of GRPO's Pareto front within ES's KL range (KL at least ES's smallest), ES's front reward
    there minus the point's; and the front points left of every ES point (not compared)."""
    from esrepro.report.conciseness import pareto_front

    front = [grpo[i] for i in pareto_front([k for k, _ in grpo], [r for _, r in grpo])]
    gaps, left = [], []
    for k, r in front:
        top = staircase(es, k)
        if top is None:
            left.append((k, r))
        else:
            gaps.append(((k, r), top - r))
    return gaps, left


def _config_points(runs: pd.DataFrame) -> dict[tuple[str, str], dict[int, np.ndarray]]:
    """Per configuration (algorithm, method) and seed: its checkpoints' (iteration, KL, reward) rows."""
    pts = checkpoint_points(runs)
    out: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for (algo, method, seed), g in pts.groupby(["algorithm", "method", "seed"]):
        out.setdefault((algo, method), {})[int(seed)] = g.sort_values("iteration")[["iteration", "kl", "reward"]] \
            .to_numpy(float)
    return out


def _mean_points(configs: dict[tuple[str, str], dict[int, np.ndarray]], algo: str
                 ) -> list[tuple[Point, np.ndarray]]:
    """Each configuration's checkpoints averaged over its seeds (the iterations every seed has), with the rewards of
    its seeds at that checkpoint."""
    out = []
    for key, seeds in configs.items():
        if key[0] != algo:
            continue
        chosen = [seeds[s] for s in sorted(seeds)]
        iters = set.intersection(*(set(a[:, 0]) for a in chosen))
        for it in sorted(iters):
            rows = np.array([a[a[:, 0] == it][0] for a in chosen])
            out.append(((float(rows[:, 1].mean()), float(rows[:, 2].mean())), rows[:, 2]))
    return out


def welch_gap(a: np.ndarray, b: np.ndarray, family: int) -> tuple[Interval, float]:
    """mean(a) - mean(b) over seeds with its 95% Welch t interval, and the one-sided p-value of "a at least b" (NaN
    with fewer than two seeds on a side); ``refute_hi`` at level 1 - 0.05 / ``family``."""
    from scipy import stats

    diff = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return Interval(diff, math.nan, math.nan, "fewer than two seeds"), math.nan
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(diff, diff, diff, "no spread over seeds"), 0.0 if diff < 0 else 1.0
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    q, q_family = stats.t.ppf([(1 + LEVEL) / 2, 1 - (1 - LEVEL) / 2 / max(1, family)], df)
    return (Interval(diff, diff - q * se, diff + q * se, f"Welch t over seeds ({a.size} and {b.size}), 95%",
                     diff + q_family * se), float(stats.t.cdf(diff / se, df)))


def pareto_test(runs: pd.DataFrame) -> tuple[Outcome, str, str]:
    """The front rule on a run's checkpoints: at each GRPO front point within ES's KL range, the gap of ES's front
    (the best ES checkpoint at no more KL) over it, with a Welch t interval over the two checkpoints' seeds. Holds
    when every gap's 95% interval lies above 0 (an intersection-union test); does not hold when Holm's procedure
    over the compared front points finds a GRPO point above ES's front; not resolved otherwise. The KL of each point
    is its mean over seeds (its spread is not modelled). (outcome, this run, interval)."""
    configs = _config_points(runs)
    es_l, grpo_l = _mean_points(configs, "es"), _mean_points(configs, "grpo")
    es, grpo = [p for p, _ in es_l], [p for p, _ in grpo_l]
    if not es or not grpo:
        return V.untestable("ES or GRPO not run"), "not run", ""
    gaps, left = front_gaps(es, grpo)
    ours = f"{len(es)} ES and {len(grpo)} GRPO points; {len(gaps) + len(left)} GRPO front points"
    if left:
        ours += f", {len(left)} left of every ES point (not compared)"
    if not gaps:
        return V.untestable("every GRPO front point lies left of ES's smallest KL"), ours, ""
    seeds_of = dict(grpo_l)
    tested = []
    for (k, r), _ in gaps:
        top, top_rewards = max(((p, rw) for p, rw in es_l if p[0] <= k + 1e-12), key=lambda t: t[0][1])
        iv, pvalue = welch_gap(top_rewards, seeds_of[(k, r)], len(gaps))
        tested.append(((k, r), iv, pvalue))
    rejected = V.holm([pv for _, _, pv in tested])
    ours += f"; smallest gap {min(iv.estimate for _, iv, _ in tested):+.3f}"
    method = f"reward, Welch t over seeds per point; Holm over {len(tested)} points"

    def text(iv: Interval) -> str:
        if math.isnan(iv.lo):
            return f"{iv.estimate:+.3f} (fewer than two seeds: no interval)"
        return f"{iv.estimate:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}] ({method})"

    against = [t for t, hit in zip(tested, rejected, strict=True) if hit]
    (k, r), iv, _ = min(against or tested, key=lambda t: t[1].estimate)
    where = f"ES front - GRPO front point at KL {k:.3f} (GRPO reward {r:.3f}): {text(iv)}"
    if against:
        return Outcome(FAILS, f"{where}: below 0"), ours, text(iv)
    if all(not math.isnan(t[1].lo) and t[1].lo > 0 for t in tested):
        return Outcome(HOLDS, f"every gap above 0; the smallest, {where}"), ours, text(iv)
    return Outcome(NOT_RESOLVED, f"{where}: not every gap's interval lies above 0, and Holm rejects no point"), \
        ours, text(iv)


def _paper_pareto(prow: Sequence[Mapping[str, Any]]) -> str:
    es = [(r["kl"], r["reward"]) for r in prow if r["algorithm"] == "es"]
    grpo = [(r["kl"], r["reward"]) for r in prow if r["algorithm"] == "grpo"]
    if not es or not grpo:
        return "not in published.yaml"
    gaps, left = front_gaps(es, grpo)
    if not gaps:
        return "Table 2's GRPO rows lie left of its ES rows"
    return f"Table 2 rows: smallest gap {min(g for _, g in gaps):+.3f} over {len(gaps)} GRPO front points"


def _final(runs: pd.DataFrame, algo: str, key: str, value: float) -> pd.DataFrame:
    sub = runs[runs["algorithm"] == algo]
    return sub[[not pd.isna(v) and math.isclose(float(v), float(value), rel_tol=1e-9, abs_tol=1e-12)
                for v in sub[key]]]


def _table2_checks(runs: pd.DataFrame, prow: Sequence[Mapping[str, Any]]) -> list[tuple[str, bool | None]]:
    """Each Table 2 row's reward and KL against this run's configuration of the same sigma or beta (mean and std
    over seeds, the final weights)."""
    checks = []
    for r in prow:
        key, value = ("sigma", r["sigma"]) if r["algorithm"] == "es" else ("beta", r["beta"])
        g = _final(runs, r["algorithm"], key, value) if not runs.empty else pd.DataFrame()
        name = f"{'ES sigma' if key == 'sigma' else 'GRPO beta'} {value:g}"
        if g.empty:
            checks.append((f"{name} not run", None))
            continue
        for col, paper, std in (("reward_norm", r["reward"], r["reward_std"]), (PAPER_KL, r["kl"], r["kl_std"])):
            vals = g[col].astype(float)
            ours = float(vals.mean())
            sd = float(vals.std()) if len(vals) > 1 else math.nan
            checks.append((f"{name} {'reward' if col == 'reward_norm' else 'KL'} {ours:.3f} vs {paper:g}",
                           mean_gap(ours, sd, len(vals), paper, std, 4)))
    return checks


def pareto_row(runs: pd.DataFrame, published: Mapping[str, Any], key: str = "es_pareto") -> ClaimRow:
    """ES's front above GRPO's (Fig. 1; with the learning-rate sweep's GRPO runs, App. A.4 Fig. 4b)."""
    claim = BY_KEY[key]
    prow = paper_rows(published)
    outcome, ours, interval = pareto_test(runs) if not runs.empty else (V.untestable("not run"), "not run", "")
    checks = _table2_checks(runs, prow) if key == "es_pareto" else []
    rep, detail = reproduced_of(checks)
    why = {"holds": "ES's front above at every compared KL", "not resolved": "the smallest gap's interval includes 0",
           "does not hold": "a GRPO front point above ES's front"}.get(outcome.verdict, outcome.reason)
    return ClaimRow(claim, None, claim.title, _paper_pareto(prow) if key == "es_pareto" else
                    "Fig. 4b's points are not published", ours, outcome, why, interval, rep, detail)


def hacking_row(runs: pd.DataFrame, published: Mapping[str, Any], hacking_margin: float) -> ClaimRow:
    """Some GRPO run at beta <= 0.01 hacks the reward and no ES run does (v2 Sec. 4.2: "sometimes"). An ES run that
    hacks refutes; no small-beta GRPO run hacking does not (a rate above 0 is never refuted by a count of runs)."""
    claim = BY_KEY["grpo_small_beta_hacks"]
    prow = paper_rows(published)
    marked = [f"beta {r['beta']:g}" for r in prow if r.get("hacked")]
    paper_text = (f"GRPO hacks at {', '.join(marked)}; ES does not" if marked else "no hacking mark") if prow \
        else "not in published.yaml"
    if runs.empty:
        return ClaimRow(claim, None, claim.title, paper_text, "not run", V.untestable("not run"), "not run")
    runs = runs.assign(hacked=hacked_runs(runs, hacking_margin))
    base = runs[runs["algorithm"] == "base"]["nonword"]
    small = runs[(runs["algorithm"] == "grpo") & (runs["beta"].astype(float) <= SMALL_BETA)]
    es = runs[runs["algorithm"] == "es"]
    ours = f"hacking runs: GRPO beta <= {SMALL_BETA:g} {int(small['hacked'].sum())}/{len(small)}, " \
           f"ES {int(es['hacked'].sum())}/{len(es)}"
    if base.empty or base.isna().all():
        outcome = V.untestable("no base-model samples to compare the non-word share with")
    elif small.empty or es.empty:
        outcome = V.untestable("no GRPO run with beta <= 0.01" if small.empty else "no ES run")
    elif es["hacked"].any():
        outcome = Outcome(FAILS, f"ES hacks: {', '.join(sorted(set(es[es['hacked']]['method'])))}")
    elif not small["hacked"].any():  # "sometimes": no count of runs refutes a rate above 0
        upper = V.clopper_pearson(0, len(small))[1]
        outcome = Outcome(NOT_RESOLVED, f"no GRPO run at beta <= {SMALL_BETA:g} hacks ({len(small)} runs): the "
                                        f"hacking rate's exact 95% upper bound is {upper:.2f}, so \"sometimes\" is "
                                        "neither confirmed nor refuted")
    else:
        outcome = Outcome(HOLDS, f"{int(small['hacked'].sum())} of {len(small)} GRPO runs at beta <= "
                                 f"{SMALL_BETA:g} hack; no ES run of {len(es)} does (counts, no interval)")
    checks = []
    for r in prow:
        key, value = ("sigma", r["sigma"]) if r["algorithm"] == "es" else ("beta", r["beta"])
        g = _final(runs, r["algorithm"], key, value)
        name = f"{'ES sigma' if key == 'sigma' else 'GRPO beta'} {value:g}"
        checks.append((f"{name} {'hacks' if r.get('hacked') else 'does not hack'} in the paper",
                       None if g.empty else bool(g["hacked"].any()) == bool(r.get("hacked"))))
    rep, detail = reproduced_of(checks)
    why = {HOLDS: "small-beta GRPO hacks, ES does not"}.get(outcome.verdict, outcome.reason)
    return ClaimRow(claim, None, claim.title, paper_text, ours, outcome, why,
                    f"per run: non-word share above the base model's by more than {hacking_margin:g}; no interval",
                    rep, detail)


def stability_row(runs: pd.DataFrame, published: Mapping[str, Any], reward_cutoff: float | None) -> ClaimRow:
    """GRPO's largest reward std over seeds over ES's smallest, among configurations above the cut-off (rule 3),
    with the F interval widened for the choice of that pair among all GRPO-ES pairs (Bonferroni)."""
    claim = BY_KEY["es_stable_across_runs"]
    prow = paper_rows(published)
    stated = (((published.get("tables") or {}).get("table2_conciseness") or {}).get("std_ratio"))
    p_es = [r for r in prow if r["algorithm"] == "es"]
    p_grpo = [r for r in prow if r["algorithm"] == "grpo"]
    paper_text = "not in published.yaml"
    if p_es and p_grpo:
        g = max(p_grpo, key=lambda r: r["reward_std"])
        e = min(p_es, key=lambda r: r["reward_std"])
        paper_text = f"{stated}x (GRPO std {g['reward_std']:g} / ES std {e['reward_std']:g}, 4 seeds each)"
    if runs.empty:
        return ClaimRow(claim, None, claim.title, paper_text, "not run", V.untestable("not run"), "not run")
    per = []
    for (algo, method), g in runs[runs["algorithm"].isin(["es", "grpo"])].groupby(["algorithm", "method"]):
        r = g["reward_norm"].astype(float)
        per.append({"algo": algo, "method": method, "mean": float(r.mean()), "n": len(r),
                    "std": float(r.std()) if len(r) > 1 else math.nan})
    kept = [p for p in per if reward_cutoff is None or p["mean"] > reward_cutoff]
    es_k = [p for p in kept if p["algo"] == "es" and p["n"] > 1]
    gr_k = [p for p in kept if p["algo"] == "grpo" and p["n"] > 1]
    interval, ours = "", f"{len(kept)} of {len(per)} configurations above the cut-off {reward_cutoff}"
    rep, detail = NOT_RUN, ""
    if any(p["n"] < 2 for p in per) and not (es_k and gr_k):
        outcome = V.untestable("fewer than 2 seeds per configuration")
    elif not (es_k and gr_k):
        outcome = V.untestable(f"no ES or no GRPO configuration above the reward cut-off {reward_cutoff}")
    else:
        g = max(gr_k, key=lambda p: p["std"])
        e = min(es_k, key=lambda p: p["std"])
        iv = V.std_ratio_interval(g["std"], g["n"], e["std"], e["n"], pairs=len(gr_k) * len(es_k))
        if iv is None:
            outcome = V.untestable("ES's smallest std is 0: no ratio")
        else:
            outcome = V.ratio_outcome(f"GRPO {g['method']} std / ES {e['method']} std", iv)
            interval = f"{iv.estimate:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}] ({iv.method})"
            ours += f"; ratio {iv.estimate:.1f}x"
            if stated is not None:
                rep = YES if iv.lo <= float(stated) <= iv.hi else NO
                detail = f"the paper's {stated}x {'inside' if rep == YES else 'outside'} [{iv.lo:.1f}, {iv.hi:.1f}]"
    why = {HOLDS: "the ratio's interval lies above 1", "not resolved": "the ratio's interval includes 1",
           FAILS: "the ratio's interval lies below 1"}.get(outcome.verdict, outcome.reason)
    return ClaimRow(claim, None, claim.title, paper_text, ours, outcome, why,
                    interval or "F interval of the std ratio (needs 2+ seeds)", rep, detail)
