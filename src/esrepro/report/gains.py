"""The paper's Figure 5 (v1; Figure 6 in v2): accuracy improvement over the base model, per model and method.

The paper's bars are the accuracy of a fine-tuned model minus that of its base model, in
percentage points (its y axis reads "Accuracy Improvement (%)"; for Qwen2.5-0.5B, base 0.1 %,
the PPO / GRPO (8) / GRPO (30) bars read 0.2 %, 0.2 %, 0.4 %: exactly Table 1's differences).
The text calls them "relative improvements", but a ratio to a 0.1 % base would be thousands of
percent, so ``kind="points"`` (the default) reproduces the figure. ``kind="relative"`` gives
``(acc - base) / base`` in percent; where the base accuracy is 0 that ratio is undefined: the
value is NaN, no bar is drawn, the bar's place reads "n/a (base 0)", and the CSV says why.

Input: evaluation ``metrics.json`` files (``task, split, model, method, seed, accuracy`` as a
fraction, ``n``). Accuracies are averaged over seeds first; the error bar is the sample std of
the method's accuracy over its seeds (the base model is greedy, hence deterministic).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from esrepro.report.figures import method_color, save_figure, write_frame_csv
from esrepro.report.tables import METHOD_LABELS, load_metrics

PathLike = str | os.PathLike
GainKind = Literal["points", "relative"]

#: Methods drawn as bars, in the paper's order (the base model is the reference, not a bar).
GAIN_METHODS: tuple[str, ...] = ("es", "ppo", "grpo8", "grpo30", "grpov", "drgrpov")

GAIN_COLUMNS = ("model", "method", "seeds", "base_accuracy", "accuracy", "accuracy_std",
                "improvement", "improvement_std", "kind", "note")


def improvement_table(
    metrics: pd.DataFrame,
    task: str = "countdown",
    split: str = "test",
    methods: Sequence[str] = GAIN_METHODS,
    models: Sequence[str] | None = None,
    kind: GainKind = "points",
) -> pd.DataFrame:
    """One row per (model, method): mean accuracy over seeds (%), the base's, and the improvement.

    ``improvement`` is ``acc - base`` in percentage points (``kind="points"``) or
    ``100 * (acc - base) / base`` (``kind="relative"``, NaN with a ``note`` when base is 0).
    ``improvement_std`` is the method's sample std over seeds on the same scale (NaN with one
    seed). Models: ``models`` in that order (those without metrics are skipped), else every
    model with metrics, sorted. A model with method metrics but no base metrics is an error.
    """
    if kind not in ("points", "relative"):
        raise ValueError(f"kind must be 'points' or 'relative', got {kind!r}")
    sel = metrics[(metrics["task"] == task) & (metrics["split"] == split)] if len(metrics) else metrics
    present = list(dict.fromkeys(sel["model"])) if len(sel) else []
    order = [m for m in models if m in present] if models is not None else sorted(present)
    rows = []
    for model in order:
        own = sel[sel["model"] == model]
        base = own[own["method"] == "base"]["accuracy"]
        fine = own[own["method"].isin(methods)]
        if fine.empty:
            continue
        if base.empty:
            raise ValueError(f"model {model!r}: metrics for {', '.join(sorted(set(fine['method'])))} on "
                             f"{task}/{split} but none for the base model; the improvement needs them")
        base_acc = 100.0 * float(base.mean())
        for method in methods:
            accs = 100.0 * own[own["method"] == method]["accuracy"].astype(float)
            if accs.empty:
                continue
            acc, std = float(accs.mean()), float(accs.std()) if len(accs) > 1 else math.nan
            note = ""
            if kind == "points":
                gain, gain_std = acc - base_acc, std
            elif base_acc == 0.0:
                gain, gain_std = math.nan, math.nan
                note = "base accuracy 0: relative improvement undefined"
            else:
                gain, gain_std = 100.0 * (acc - base_acc) / base_acc, 100.0 * std / base_acc
            rows.append({"model": model, "method": method, "seeds": len(accs), "base_accuracy": base_acc,
                         "accuracy": acc, "accuracy_std": std, "improvement": gain,
                         "improvement_std": gain_std, "kind": kind, "note": note})
    return pd.DataFrame(rows, columns=list(GAIN_COLUMNS))


def _fmt_gain(value: float, kind: GainKind) -> str:
    if kind == "points":
        return f"{value:+.1f}"
    return f"{value:+.0f}%" if abs(value) >= 100 else f"{value:+.1f}%"


def gains_figure(
    table: pd.DataFrame,
    out_stem: PathLike,
    title: str = "Countdown: accuracy improvement over the base model",
    display: Mapping[str, str] | None = None,
) -> list[Path]:
    """Grouped bars (groups: models; bars: methods) of ``improvement_table``'s output, labelled with values."""
    if table.empty:
        raise ValueError("gains_figure: no (model, method) rows to plot")
    display = display or {}
    kind: GainKind = table["kind"].iloc[0]
    models = list(dict.fromkeys(table["model"]))
    methods = [m for m in dict.fromkeys(table["method"])]
    width = 0.8 / len(methods)
    fig = Figure(figsize=(min(16.0, max(7.0, 0.34 * len(models) * len(methods) + 2.5)), 5.0),
                 layout="constrained")
    ax = fig.add_subplot()
    finite = table["improvement"].replace([np.inf, -np.inf], np.nan).dropna()
    span = float(finite.abs().max()) if len(finite) else 1.0
    span = span if span > 0 else 1.0
    for j, method in enumerate(methods):
        sub = table[table["method"] == method].set_index("model")
        xs, ys, errs = [], [], []
        for i, model in enumerate(models):
            if model not in sub.index:
                continue
            x = i - 0.4 + width * (j + 0.5)
            row = sub.loc[model]
            if math.isnan(row["improvement"]):
                ax.text(x, 0.01 * span, f"n/a ({row['note'].split(':')[0]})" if row["note"] else "n/a",
                        rotation=90, ha="center", va="bottom", fontsize="x-small", color="0.3")
                continue
            err = 0.0 if math.isnan(row["improvement_std"]) else row["improvement_std"]
            xs.append(x)
            ys.append(row["improvement"])
            errs.append(err)
            up = row["improvement"] >= 0
            ax.annotate(_fmt_gain(row["improvement"], kind), (x, row["improvement"] + (err if up else -err)),
                        xytext=(0, 3 if up else -3), textcoords="offset points",
                        ha="center", va="bottom" if up else "top", fontsize="x-small", rotation=90)
        if xs:
            ax.bar(xs, ys, width=width * 0.95, color=method_color(method, j),
                   label=METHOD_LABELS.get(method, method),
                   yerr=errs if any(e > 0 for e in errs) else None, capsize=2,
                   error_kw={"elinewidth": 0.8, "ecolor": "0.2"})
    base = table.drop_duplicates("model").set_index("model")["base_accuracy"]
    ax.set_xticks(range(len(models)),
                  [f"{display.get(m, m)}\n(base {base[m]:.1f}%)" for m in models], fontsize="small")
    ax.set_xlim(-0.5, len(models) - 0.5)
    ax.axhline(0.0, color="0.2", linewidth=0.8)
    tops = (table["improvement"] + table["improvement_std"].fillna(0.0)).replace([np.inf, -np.inf], np.nan).dropna()
    top = max(0.0, float(tops.max())) if len(tops) else span
    ax.set_ylim(top=top + 0.22 * (top - ax.get_ylim()[0]))
    ax.set_ylabel("accuracy improvement over base (percentage points)" if kind == "points"
                  else "relative improvement over base (% of base accuracy)")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    seeds = sorted(set(table["seeds"]))
    fig.legend(loc="outside lower center", fontsize="small", ncols=min(len(methods), 6),
              title=(f"mean over seeds ({', '.join(map(str, seeds))} per bar); error bars: ± std over seeds"
                     if max(seeds) > 1 else "one seed per bar"),
              title_fontsize="x-small")
    return save_figure(fig, out_stem)


def build_gains(
    metric_paths: Iterable[PathLike],
    out_stem: PathLike,
    task: str = "countdown",
    split: str = "test",
    kind: GainKind = "points",
    methods: Sequence[str] = GAIN_METHODS,
    models: Sequence[str] | None = None,
    display: Mapping[str, str] | None = None,
) -> list[Path]:
    """Load ``metrics.json`` files, write ``{out_stem}.png``, ``.pdf`` and ``.csv`` (the plotted table)."""
    table = improvement_table(load_metrics(metric_paths), task, split, methods, models, kind)
    paths = gains_figure(table, out_stem, display=display,
                         title=f"{task.capitalize()} ({split}): accuracy improvement over the base model")
    return [*paths, write_frame_csv(table, Path(f"{out_stem}.csv"))]
