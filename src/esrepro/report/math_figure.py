"""The ES paper v2's Figure 2: pass@1 on five math benchmarks of the base model, three RL checkpoints and three ES
checkpoints, as grouped bars per benchmark, ours beside the paper's.

The bars are the published block's ``figure.bars`` (``config/published.yaml``, ``math_v2``), in its legend order,
each a run: a registry model (the released RL checkpoints, evaluated only) or, without one, the math runs' own
model, and a method (``base``, ``es``, a continuation, a kept snapshot). Ours: mean over seeds of that run's
accuracy on each benchmark (± sample std with several seeds); a bar with no evaluation (e.g. a hub checkpoint not
run at the tiny scale) is left out and the CSV says so. The paper's numbers: a value whose bar is determined
(``figure.assigned``) is drawn on its bar; a value whose benchmark only is determined (``figure.benchmark_values``)
is drawn across its benchmark's group, as the paper's labels lost their bars' positions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from esrepro.report.figures import save_figure, write_frame_csv
from esrepro.report.tables import load_metrics, load_published

PathLike = str | os.PathLike

#: Fig. 2's benchmark order and labels.
FIG2_BENCHMARKS: dict[str, str] = {"aime24": "AIME 2024", "minerva": "Minerva Math", "olympiad_bench": "OlympiadBench",
                                   "amc23": "AMC", "math500": "MATH500"}

FIG2_COLUMNS = ("benchmark", "bar", "label", "model", "method", "seeds", "ours", "ours_std", "paper", "note")


def figure_block(published: Mapping[str, Any]) -> Mapping[str, Any]:
    """The published math block's ``figure`` (Fig. 2's bars and values); a clear error when there is none."""
    for _key, block in (published.get("tables") or {}).items():
        if isinstance(block, Mapping) and block.get("task") == "math" and block.get("figure"):
            return block["figure"]
    raise ValueError("config/published.yaml has no math block with a `figure` (v2 Fig. 2's bars)")


def fig2_frame(metrics: pd.DataFrame, figure: Mapping[str, Any], model: str,
               benchmarks: Sequence[str] | None = None, display: str | None = None) -> pd.DataFrame:
    """One row per (benchmark, bar): ours (mean and sample std over seeds, %) and the paper's determined value; then
    one row per paper value whose benchmark only is determined (``bar`` empty).

    ``model``: the math runs' model (a bar without ``model`` is its run); ``benchmarks``: the sets drawn (default:
    Fig. 2's five, in its order); ``display``: that model's name, which labels its base-model bar when it is not the
    paper's (e.g. the tiny model).
    """
    sets = list(benchmarks or FIG2_BENCHMARKS)
    assigned = figure.get("assigned") or {}
    rows: list[dict[str, Any]] = []
    for bench in sets:
        for bar in figure["bars"]:
            who, method = bar.get("model") or model, bar["method"]
            sel = metrics[(metrics["task"] == bench) & (metrics["model"] == who) & (metrics["method"] == method)] \
                if len(metrics) else metrics
            acc = pd.to_numeric(sel["accuracy"]) * 100.0 if len(sel) else pd.Series(dtype=float)
            paper = (assigned.get(bar["key"]) or {}).get(bench, math.nan)
            note = "" if len(acc) else "not evaluated in this run"
            label = bar["label"]
            if not bar.get("model") and method == "base" and display and display != label:
                label = f"{display} (base; paper: {label})"
            rows.append({"benchmark": bench, "bar": bar["key"], "label": label, "model": who, "method": method,
                         "seeds": int(len(acc)), "ours": float(acc.mean()) if len(acc) else math.nan,
                         "ours_std": float(acc.std()) if len(acc) > 1 else math.nan, "paper": float(paper),
                         "note": note})
        for value in (figure.get("benchmark_values") or {}).get(bench, []):
            rows.append({"benchmark": bench, "bar": "", "label": "(bar not determined)", "model": "", "method": "",
                         "seeds": 0, "ours": math.nan, "ours_std": math.nan, "paper": float(value),
                         "note": "the paper's value on this benchmark; which bar it labels is not determined"})
    return pd.DataFrame(rows, columns=list(FIG2_COLUMNS))


def fig2_figure(df: pd.DataFrame, figure: Mapping[str, Any], title: str = "") -> Figure:
    """Grouped bars per benchmark (ours), the paper's values as black marks: on their bar where determined, across
    the benchmark's group where only the benchmark is."""
    bars = [b["key"] for b in figure["bars"]]
    labels = {b["key"]: b["label"] for b in figure["bars"]}
    labels.update({r["bar"]: r["label"] for _, r in df[df["bar"] != ""].iterrows()})
    sets = list(dict.fromkeys(df["benchmark"]))
    fig = Figure(figsize=(max(8.0, 2.0 * len(sets)), 5.2))
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(len(bars), 1)
    paper_bar_drawn = paper_group_drawn = False
    for j, bench in enumerate(sets):
        sub = df[df["benchmark"] == bench]
        for i, key in enumerate(bars):
            row = sub[sub["bar"] == key]
            if row.empty:
                continue
            x = j - 0.4 + width * (i + 0.5)
            ours, std, paper = (float(row.iloc[0][c]) for c in ("ours", "ours_std", "paper"))
            if not math.isnan(ours):
                ax.bar(x, ours, width=width * 0.95, color=f"C{i}", label=labels[key] if j == 0 else None,
                       yerr=None if math.isnan(std) else std, capsize=2)
                ax.text(x, ours + 0.5, f"{ours:.1f}", ha="center", va="bottom", fontsize=6, rotation=90)
            elif j == 0:
                ax.bar(x, 0.0, width=width * 0.95, color=f"C{i}", label=f"{labels[key]} (not run)")
            if not math.isnan(paper):
                ax.plot([x - width / 2, x + width / 2], [paper, paper], color="black", lw=1.5,
                        label=None if paper_bar_drawn else "paper (v2 Fig. 2)")
                paper_bar_drawn = True
        for value in sub[sub["bar"] == ""]["paper"]:
            ax.plot([j - 0.4, j + 0.4], [value, value], color="black", lw=0.8, ls="--",
                    label=None if paper_group_drawn else "paper (v2 Fig. 2), bar not determined")
            paper_group_drawn = True
    missing = [labels[k] for k in bars if df[df["bar"] == k]["ours"].isna().all()]
    if missing:  # bars this run does not evaluate (at the tiny scale: the RL checkpoints, 7B hub models)
        ax.text(0.99, 0.98, "not run in this configuration:\n" + "\n".join(missing), transform=ax.transAxes,
                ha="right", va="top", fontsize=7, color="0.3")
    ax.set_xticks(range(len(sets)))
    ax.set_xticklabels([FIG2_BENCHMARKS.get(s, s) for s in sets])
    ax.set_ylabel("pass@1 (%)")
    ax.set_ylim(0, 100)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, ncol=3, loc="lower center", frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.15, 1, 1))
    return fig


def build_fig2(metric_paths: Iterable[PathLike], published_path: PathLike, model: str, out_stem: PathLike,
               title: str = "", benchmarks: Sequence[str] | None = None, display: str | None = None) -> pd.DataFrame:
    """Load the math evaluations, write Fig. 2 (``{out_stem}.png``, ``.pdf``) and its plotted numbers (``.csv``)."""
    figure = figure_block(load_published(published_path))
    df = fig2_frame(load_metrics(metric_paths), figure, model, benchmarks, display)
    save_figure(fig2_figure(df, figure, title), out_stem)
    write_frame_csv(df, Path(f"{out_stem}.csv"))
    return df


__all__ = ["FIG2_BENCHMARKS", "build_fig2", "fig2_figure", "fig2_frame", "figure_block"]
