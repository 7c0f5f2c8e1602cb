"""Hyperparameter selection: keep the grid cell with the best training reward. The ES paper says only that the
best-performing configuration was selected (v2 Sec. 4.1); this criterion is ours (docs/fidelity.md).

The score of a cell is its *final training reward*: the mean of ``reward_mean`` over the
last quarter of its steps (at least one), which smooths the step-to-step noise of sampled
rewards. Ties go to the earlier cell in grid order. The winner's checkpoint and log become
the method's run directory (files hard-linked where the filesystem allows, else copied),
so evaluation and Table 1 read it like any other run.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from esrepro.io import atomic_path, read_json, read_jsonl, write_json


def final_train_reward(log: list[dict]) -> float:
    """Mean ``reward_mean`` over the last quarter of a run's log rows."""
    if not log:
        raise ValueError("empty training log")
    k = max(1, math.ceil(len(log) / 4))
    tail = log[-k:]
    return float(sum(r["reward_mean"] for r in tail) / len(tail))


def choose(scores: dict[str, float]) -> str:
    """The cell with the highest score (first in order on ties)."""
    return max(scores, key=lambda c: (scores[c], -list(scores).index(c)))


def _link_tree(src: Path, dst: Path) -> None:
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


def grid_keys(grid: dict) -> list[str]:
    """The settings a grid varies: its value lists' keys, then those of its explicit ``cells`` (v2)."""
    keys = [k for k in grid if k != "cells"]
    for cell in grid.get("cells", []) or []:
        keys += [k for k in cell if k not in keys]
    return keys


def select_run(cells: dict[str, str | Path], grid: dict, out: str | Path) -> dict:
    """Score every cell's run, materialise the winner into ``out``; returns the selection record."""
    out = Path(out)
    logs = {c: read_jsonl(Path(d) / "log.jsonl") for c, d in cells.items()}
    scores = {c: final_train_reward(rows) for c, rows in logs.items()}
    winner = choose(scores)
    win_dir = Path(cells[winner])
    win_manifest = read_json(win_dir / "manifest.json")
    record = {
        "criterion": "final training reward: mean reward_mean over the last quarter of steps",
        "grid": grid,
        "winner": winner,
        "winner_settings": {k: win_manifest["settings"].get(k) for k in grid_keys(grid)},
        "train_reward": scores[winner],
        "cells": [{"cell": c, "run": str(cells[c]), "train_reward": scores[c], "steps": len(logs[c])}
                  for c in cells],
        "budget": win_manifest.get("budget"),
        "settings": win_manifest["settings"],
    }
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "checkpoint", is_dir=True) as tmp:
        _link_tree(win_dir / "checkpoint", Path(tmp))
    shutil.copyfile(win_dir / "log.jsonl", out / "log.jsonl")
    write_json(out / "selection.json", record)
    return record
