"""The paper's Figure 6 (v1; Figure 7 in v2): test accuracy against training-sample evaluations.

One panel per model, one line per method (ES and every RL method), mean over seeds with a
± std band where there are several. The x axis counts training-sample evaluations (the
paper's "Number of Sample Evaluations", up to 3.0 x 10^6 = 500 ES iterations x N = 30 x 200
training prompts), so ES and RL are compared at equal cost.

Input: one ``periodic_eval.jsonl`` per run, one JSON object per evaluation point::

    {"iteration": int, "samples": int, "accuracy": float, "reward": float, "split": str, "n": int}

(``samples``: training-sample evaluations so far; ``accuracy``: a fraction; ``n``: evaluated
examples). :func:`read_periodic_eval` checks every row and names file, line and field on error.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from esrepro.report.figures import method_color, save_figure, write_frame_csv
from esrepro.report.tables import METHOD_LABELS

PathLike = str | os.PathLike
RunKey = tuple[str, str, int]  # (model, method, seed)

PERIODIC_EVAL = "periodic_eval.jsonl"
#: field -> accepted Python types (bool is never accepted for a number)
ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "iteration": (int,), "samples": (int,), "accuracy": (int, float), "reward": (int, float),
    "split": (str,), "n": (int,),
}
CURVE_COLUMNS = ("model", "method", "samples", "accuracy", "accuracy_std", "seeds")


def _check_row(row: object, where: str) -> dict:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [f for f in ROW_FIELDS if f not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    for field, types in ROW_FIELDS.items():
        v = row[field]
        if isinstance(v, bool) or not isinstance(v, types):
            want = " or ".join(t.__name__ for t in types)
            raise ValueError(f"{where}: field {field!r} must be {want}, got {v!r}")
    if row["iteration"] < 0 or row["samples"] < 0:
        raise ValueError(f"{where}: iteration and samples must be >= 0, got {row['iteration']}, {row['samples']}")
    if not 0.0 <= row["accuracy"] <= 1.0:
        raise ValueError(f"{where}: field 'accuracy' must be a fraction in [0, 1], got {row['accuracy']!r}")
    if not math.isfinite(row["reward"]):
        raise ValueError(f"{where}: field 'reward' must be finite, got {row['reward']!r}")
    if row["n"] <= 0 or not row["split"]:
        raise ValueError(f"{where}: field 'n' must be > 0 and 'split' non-empty, got n={row['n']!r}, "
                         f"split={row['split']!r}")
    return row


def read_periodic_eval(path: PathLike) -> list[dict]:
    """Read and check a ``periodic_eval.jsonl``; rows sorted by (split, samples).

    Raises ``ValueError`` naming the file and line for invalid JSON, a missing field, a
    wrongly typed or out-of-range value, or two rows of the same split and iteration.
    """
    rows, seen = [], {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
            row = _check_row(row, where)
            key = (row["split"], row["iteration"])
            if key in seen:
                raise ValueError(f"{where}: iteration {row['iteration']} of split {row['split']!r} "
                                 f"already given on line {seen[key]}")
            seen[key] = lineno
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no evaluation rows")
    return sorted(rows, key=lambda r: (r["split"], r["samples"], r["iteration"]))


_RUN_PATH = re.compile(r"(?P<model>[^/\\]+)[/\\](?P<method>[^/\\]+)[/\\]seed(?P<seed>\d+)[/\\][^/\\]+$")


def run_key_from_path(path: PathLike) -> RunKey:
    """(model, method, seed) from a run path ``.../{model}/{method}/seed{s}/periodic_eval.jsonl``."""
    m = _RUN_PATH.search(str(Path(path)))
    if not m:
        raise ValueError(f"{path}: cannot read model/method/seed from the path; expected "
                         f".../<model>/<method>/seed<s>/{PERIODIC_EVAL}, or pass labels explicitly")
    return m["model"], m["method"], int(m["seed"])


def _select_split(rows: list[dict], split: str | None, where: str) -> list[dict]:
    splits = sorted({r["split"] for r in rows})
    if split is None:
        if len(splits) > 1:
            raise ValueError(f"{where}: rows of several splits ({', '.join(splits)}); choose one with split=")
        return rows
    out = [r for r in rows if r["split"] == split]
    if not out:
        raise ValueError(f"{where}: no rows of split {split!r} (splits here: {', '.join(splits)})")
    return out


def mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Mean and sample std over seeds of (samples, accuracy) curves.

    Curves on one shared grid of ``samples`` are averaged point by point. Otherwise each is
    linearly interpolated onto the union of the grids, restricted to where all curves are
    defined (from the largest first point to the smallest last point). Returns
    (samples, mean, std, number of seeds); std is NaN for a single seed.
    """
    if not curves:
        raise ValueError("mean_curve: no curves")
    grids = [x for x, _ in curves]
    if all(len(g) == len(grids[0]) and np.array_equal(g, grids[0]) for g in grids):
        grid = grids[0].astype(float)
        ys = np.stack([y for _, y in curves])
    else:
        lo, hi = max(g[0] for g in grids), min(g[-1] for g in grids)
        if lo > hi:
            raise ValueError(f"mean_curve: the seeds' sample ranges do not overlap ({lo} > {hi})")
        grid = np.unique(np.concatenate(grids)).astype(float)
        grid = grid[(grid >= lo) & (grid <= hi)]
        ys = np.stack([np.interp(grid, x.astype(float), y) for x, y in curves])
    std = ys.std(axis=0, ddof=1) if len(curves) > 1 else np.full(len(grid), np.nan)
    return grid, ys.mean(axis=0), std, len(curves)


def curves_table(logs: Mapping[RunKey, Sequence[Mapping]], split: str | None = None) -> pd.DataFrame:
    """Per (model, method): accuracy (%) against samples, mean and std over seeds (:func:`mean_curve`)."""
    groups: dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray]]] = {}
    for (model, method, seed), rows in logs.items():
        rows = _select_split(list(rows), split, f"{model}/{method}/seed{seed}")
        x = np.array([r["samples"] for r in rows], dtype=np.int64)
        if np.any(np.diff(x) <= 0):
            dup = x[1:][np.diff(x) <= 0][0]
            raise ValueError(f"{model}/{method}/seed{seed}: two evaluation points share samples={dup}")
        groups.setdefault((model, method), []).append((x, 100.0 * np.array([r["accuracy"] for r in rows])))
    frames = []
    for (model, method), curves in groups.items():
        grid, mean, std, n = mean_curve(curves)
        frames.append(pd.DataFrame({"model": model, "method": method, "samples": grid, "accuracy": mean,
                                    "accuracy_std": std, "seeds": n}))
    if not frames:
        return pd.DataFrame(columns=list(CURVE_COLUMNS))
    return pd.concat(frames, ignore_index=True)[list(CURVE_COLUMNS)]


def curves_figure(
    table: pd.DataFrame,
    out_stem: PathLike,
    title: str = "Countdown: test accuracy against training-sample evaluations",
    models: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    display: Mapping[str, str] | None = None,
) -> list[Path]:
    """One panel per model; per method the mean accuracy line and a ± std band (when seeds > 1)."""
    if table.empty:
        raise ValueError("curves_figure: no curves to plot")
    display = display or {}
    present = list(dict.fromkeys(table["model"]))
    models = [m for m in models if m in present] if models is not None else sorted(present)
    all_methods = list(dict.fromkeys(table["method"]))
    order = [m for m in (methods or ("es", "ppo", "grpo8", "grpo30", "grpov", "drgrpov")) if m in all_methods]
    order += [m for m in all_methods if m not in order]
    ncols = min(4, len(models))
    nrows = math.ceil(len(models) / ncols)
    fig = Figure(figsize=(max(7.5, 3.9 * ncols), 3.2 * nrows + 0.9), layout="constrained")  # room for the legend
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    handles = {}
    for ax, model in zip(axes, models, strict=False):
        for j, method in enumerate(order):
            sub = table[(table["model"] == model) & (table["method"] == method)].sort_values("samples")
            if sub.empty:
                continue
            color = method_color(method, j)
            (line,) = ax.plot(sub["samples"], sub["accuracy"], color=color, linewidth=1.6,
                              marker="o" if len(sub) <= 12 else None, markersize=3,
                              label=f"{METHOD_LABELS.get(method, method)}")
            handles.setdefault(method, line)
            band = sub.dropna(subset=["accuracy_std"])
            if len(band):
                ax.fill_between(band["samples"], band["accuracy"] - band["accuracy_std"],
                                band["accuracy"] + band["accuracy_std"], color=color, alpha=0.18, linewidth=0)
        seeds = sorted(set(table[table["model"] == model]["seeds"]))
        ax.set_title(f"{display.get(model, model)} (seeds: {'/'.join(map(str, seeds))})", fontsize="medium")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0), useMathText=True)
        ax.set_xlabel("training-sample evaluations")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(True, alpha=0.3)
    for ax in axes[len(models):]:
        ax.set_visible(False)
    fig.legend([handles[m] for m in order if m in handles],
               [METHOD_LABELS.get(m, m) for m in order if m in handles],
               loc="outside lower center", ncols=min(len(handles), 5), fontsize="small",
               title="mean over seeds; shaded: ± std over seeds", title_fontsize="x-small")
    fig.suptitle(title, fontsize="medium")
    return save_figure(fig, out_stem)


def build_sample_curves(
    logs: Mapping[RunKey, PathLike] | Iterable[PathLike],
    out_stem: PathLike,
    split: str | None = None,
    title: str = "Countdown: test accuracy against training-sample evaluations",
    models: Sequence[str] | None = None,
    display: Mapping[str, str] | None = None,
) -> list[Path]:
    """Read ``periodic_eval.jsonl`` files and write ``{out_stem}.png``, ``.pdf`` and ``.csv``.

    ``logs`` maps (model, method, seed) to a file, or lists files whose labels are read from
    their run path (:func:`run_key_from_path`). ``split``: the rows to plot (needed when a
    file holds several splits).
    """
    items = logs.items() if isinstance(logs, Mapping) else ((run_key_from_path(p), p) for p in logs)
    data: dict[RunKey, list[dict]] = {}
    for key, path in items:
        if key in data:
            raise ValueError(f"{path}: run {key} is given twice")
        data[key] = read_periodic_eval(path)
    table = curves_table(data, split)
    paths = curves_figure(table, out_stem, title=title, models=models, display=display)
    return [*paths, write_frame_csv(table, Path(f"{out_stem}.csv"))]
