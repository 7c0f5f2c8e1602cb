"""The ES paper's claim that RL is sensitive to its hyperparameters (v2 Sec. 4.1, App. A.2 Table 4): read on the RL
baselines' own grids, whose cells this pipeline trains and selects from (:mod:`esrepro.rl.select`).

Per model and grid-trained RL method, the best cell's final training reward minus the worst cell's, with a Welch
interval over the two cells' last-quarter steps (the steps the selection scores) whose lower end is taken at level
1 - 0.05 / pairs, for choosing the best and worst of the cells. A largest gap cannot be negative, so the claim is
never refuted: it holds when every case's gap clears 0 and stays open otherwise.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esrepro import paths as P
from esrepro.io import read_json, read_jsonl
from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import BY_KEY
from esrepro.report.claims.rows import ClaimRow, label, why_of
from esrepro.report.verdicts import HOLDS, NOT_RESOLVED, Interval, Outcome

PathLike = str | os.PathLike


def tail_rewards(log: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """The ``reward_mean`` of a run's last quarter of steps (at least one), the steps its selection score averages."""
    k = max(1, math.ceil(len(log) / 4))
    return np.asarray([float(r["reward_mean"]) for r in log[-k:]], dtype=float)


def load_grids(selections: Sequence[PathLike]) -> list[dict[str, Any]]:
    """Per declared ``selection.json``: task, model, method and seed (from its run directory) and each cell's name
    and last-quarter step rewards, read from the cell's log beside the run (``.../<method>/grid/<cell>/seedN``)."""
    out = []
    for path in sorted(map(Path, selections)):
        rec = read_json(path)
        run = path.parent
        cells = {}
        for c in rec.get("cells", []):
            log = run.parent / "grid" / c["cell"] / run.name / P.TRAIN_LOG
            if not log.is_file():
                raise FileNotFoundError(f"{path}: grid cell {c['cell']!r} has no training log at {log}")
            cells[c["cell"]] = tail_rewards(read_jsonl(log))
        task, model, method = run.parts[-4:-1]
        out.append({"task": task, "model": model, "method": method, "seed": run.name, "cells": cells})
    return out


def gap_interval(best: np.ndarray, worst: np.ndarray, pairs: int) -> Interval:
    """mean(best) - mean(worst), Welch's t interval at 95% and its lower end at level 1 - 0.05 / ``pairs`` (the
    choice of the pair among all cells' pairs); NaN ends with fewer than two steps on a side."""
    from scipy import stats

    diff = float(best.mean() - worst.mean())
    if best.size < 2 or worst.size < 2:
        return Interval(diff, math.nan, math.nan, "fewer than two steps")
    va, vb = best.var(ddof=1) / best.size, worst.var(ddof=1) / worst.size
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(diff, diff, diff, "no spread over steps")
    df = (va + vb) ** 2 / (va ** 2 / (best.size - 1) + vb ** 2 / (worst.size - 1))
    q = float(stats.t.ppf(1 - (1 - V.LEVEL) / 2 / max(1, pairs), df))
    return Interval(diff, diff - q * se, diff + q * se,
                    f"Welch t over the cells' last-quarter steps ({best.size} and {worst.size}), "
                    f"Bonferroni over {pairs} pairs")


def sensitivity_row(grids: Sequence[Mapping[str, Any]], display: Mapping[str, str]) -> ClaimRow:
    """Per model and RL method with a grid of two or more cells: the best cell's final training reward above the
    worst's (:func:`gap_interval`)."""
    claim = BY_KEY["rl_sensitive_hyperparameters"]
    cases, ours, intervals = [], [], []
    for g in grids:
        name = f"{display.get(g['model'], g['model'])} {label(g['method'])}"
        cells = g["cells"]
        if len(cells) < 2:
            cases.append((name, V.untestable("one grid cell")))
            continue
        scores = {c: float(r.mean()) for c, r in cells.items()}
        best, worst = max(scores, key=scores.get), min(scores, key=scores.get)
        k = len(cells)
        iv = gap_interval(cells[best], cells[worst], k * (k - 1) // 2)
        ours.append(f"{name}: {scores[worst]:.3f}-{scores[best]:.3f} over {k} cells")
        if math.isnan(iv.lo):
            cases.append((name, V.untestable("fewer than two logged steps in a cell")))
            continue
        intervals.append(f"{name}: {iv.text(3)} ({best} - {worst})")
        verdict = HOLDS if iv.lo > 0 else NOT_RESOLVED
        cases.append((name, Outcome(verdict, f"best - worst cell {iv.text(3)}"
                                    + ("" if verdict == HOLDS else ": the interval includes 0"))))
    outcome = V.combine(cases) if cases else V.untestable("no RL method trained over a hyperparameter grid")
    return ClaimRow(claim, None, claim.title, "Table 4 ticks the kept cell per model; per-cell rewards not published",
                    ("final training reward, worst-best cell: " + "; ".join(ours)) if ours else "not run", outcome,
                    why_of(cases, "model-method grids"), "; ".join(intervals))
