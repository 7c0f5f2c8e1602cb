"""The ESSA paper's convergence claims beside its best-accuracy ones: the population, rank and precision sweeps'
speed (Figs. 4, 7 and 9), and Fig. 8's higher accuracy than GRPO.

Speed is the number of generations until a setting's held-out accuracy (mean over seeds, per logged generation)
first reaches the level every setting of the sweep reaches (the lowest of their best accuracies), so that each
setting is timed to the same accuracy. Figs. 4 and 9 plot accuracy against steps; Fig. 7 against time, which
generations stand in for (every rank runs the same population, so a generation costs about the same). Generations
are single counts with no interval: a rule says holds when they agree with the claim, and not resolved otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import BY_KEY
from esrepro.report.claims.essa import grpo_pairs, sweep, val_count
from esrepro.report.claims.rows import Z95, ClaimRow, binomial_diff_se, why_of
from esrepro.report.verdicts import HOLDS, NOT_RESOLVED, Interval, Outcome

#: The speed rows: the sweep's setting and the claim's reading of it.
SPEED_ROWS = {"essa_population_speed": "population", "essa_rank_speed": "rank", "essa_quantised_speed": "precision"}


def mean_curve(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.Series:
    """Held-out accuracy per generation, the mean over ``runs``' seeds (the generations every seed logged)."""
    c = curves[curves["run_dir"].isin(runs["run_dir"]) & curves["val_reward"].notna()]
    if c.empty:
        return pd.Series(dtype=float)
    seeds = c["run_dir"].nunique()
    g = c.groupby("iteration")["val_reward"]
    return g.mean()[g.count() == seeds].sort_index()


def generations_to(curve: pd.Series, level: float) -> float | None:
    """The first generation whose accuracy reaches ``level`` (None: never)."""
    hit = curve[curve >= level - 1e-12]
    return None if hit.empty else float(hit.index[0])


def _speeds(g: pd.DataFrame, curves: pd.DataFrame, setting: str) -> tuple[dict, float | None]:
    """Per value of ``setting``: generations to the common level; and the level."""
    per = {k: mean_curve(gg, curves) for k, gg in g.groupby(setting)}
    per = {k: c for k, c in per.items() if not c.empty}
    if not per:
        return {}, None
    level = min(float(c.max()) for c in per.values())
    return {k: generations_to(c, level) for k, c in per.items()}, level


def _ordered(speeds: dict, setting: str) -> list:
    if setting == "precision":
        return [k for k in ("native", "int8", "int4") if k in speeds]
    return sorted(speeds, key=float)


def speed_case(speeds: dict, setting: str) -> tuple[bool | None, str]:
    """Whether the generations agree with the claim (None: too few settings), and the reading in words."""
    keys = _ordered(speeds, setting)
    gens = [speeds[k] for k in keys]
    if setting == "precision":
        if "native" not in speeds or len(keys) < 2:
            return None, "BF16 and a quantised precision are not both run"
        quant = [k for k in keys if k != "native"]
        return all(speeds[k] <= speeds["native"] for k in quant), "INT8/INT4 at most BF16's generations"
    if len(keys) < 3:
        return None, f"{len(keys)} {setting} value(s); the claim needs small, moderate and large"
    fastest = min(gens)
    if setting == "population":  # a moderate population fastest: neither the smallest nor the largest alone
        interior = [k for k, v in zip(keys, gens, strict=True) if v == fastest and k not in (keys[0], keys[-1])]
        return bool(interior) and gens[0] > fastest and gens[-1] > fastest, "a moderate population fastest"
    return gens[-1] > min(gens[:-1]), "the largest rank slower than a smaller one"


def speed_row(runs: pd.DataFrame, curves: pd.DataFrame, key: str, display: Mapping[str, str]) -> ClaimRow:
    """One sweep's speed claim (:data:`SPEED_ROWS`), per model: holds when the generations agree, else not resolved
    (single counts, no interval: never refuted)."""
    claim, setting = BY_KEY[key], SPEED_ROWS[key]
    sw = sweep(runs, setting)
    cases, ours = [], []
    for (task, model), g in (sw.groupby(["task", "model"]) if not sw.empty else []):
        name = f"{display.get(model, model)} on {task}"
        speeds, level = _speeds(g, curves, setting)
        if any(v is None for v in speeds.values()):
            cases.append((name, V.untestable("a setting never logged its best accuracy")))
            continue
        ok, reading = speed_case(speeds, setting)
        ours.append(f"{name}, generations to {level:.3f}: "
                    + ", ".join(f"{k}: {int(speeds[k])}" for k in _ordered(speeds, setting)))
        if ok is None:
            cases.append((name, V.untestable(reading)))
        else:
            cases.append((name, Outcome(HOLDS if ok else NOT_RESOLVED,
                                        reading + ("" if ok else ": not so (generation counts, no interval)"))))
    outcome = V.combine(cases) if cases else V.untestable(f"no {setting} sweep run")
    return ClaimRow(claim, None, claim.title, "curves only; no number published", "; ".join(ours) or "not run",
                    outcome, why_of(cases, "models"), "generations to a common accuracy; no interval")


def fig8_accuracy_row(runs: pd.DataFrame, curves: pd.DataFrame, display: Mapping[str, str]) -> ClaimRow:
    """Fig. 8: ESSA's last held-out accuracy (mean over seeds) above GRPO's last: the margin of two proportions on
    the held-out problems with a normal 95% interval (unpaired: per-problem outcomes are not logged), refuted at
    Holm's bound over the models."""
    claim = BY_KEY["essa_fig8_accuracy"]
    pairs = grpo_pairs(runs)
    cases, ours, intervals = [], [], []
    for task, model, essa, grpo in pairs:
        name = f"{display.get(model, model)} on {task}"
        ce, cg = mean_curve(essa, curves), mean_curve(grpo, curves)
        if ce.empty or cg.empty:
            cases.append((name, V.untestable("no held-out evaluation")))
            continue
        e, g = float(ce.iloc[-1]), float(cg.iloc[-1])
        n = min(val_count(essa["run_dir"]), val_count(grpo["run_dir"]))
        diff = 100 * (e - g)
        ours.append(f"{name}: ESSA {e:.3f}, GRPO {g:.3f}")
        if not n:
            cases.append((name, Outcome(HOLDS if diff > 0 else NOT_RESOLVED,
                                        f"last accuracies {e:.3f} and {g:.3f}: held-out problems unknown, no "
                                        "interval")))
            continue
        se = 100 * binomial_diff_se(e, g, n)
        family = len(pairs)
        iv = Interval(diff, diff - Z95 * se, diff + Z95 * se, f"normal interval of two proportions on {n} problems",
                      diff + V.refute_z(family) * se if family > 1 else None)
        cases.append((name, V.margin_outcome(f"ESSA - GRPO last held-out accuracy, {name}", iv)))
        intervals.append(f"{name}: {iv.text()}")
    outcome = V.combine(cases) if cases else V.untestable("the ESSA study's GRPO comparison not run")
    return ClaimRow(claim, None, claim.title, "curves only; ESSA plateaus higher", "; ".join(ours) or "not run",
                    outcome, why_of(cases, "models"), "; ".join(intervals))


__all__ = ["SPEED_ROWS", "fig8_accuracy_row", "generations_to", "mean_curve", "speed_case", "speed_row"]
