"""Figures: training curves from per-iteration logs.

Uses :class:`matplotlib.figure.Figure` directly (no pyplot, no global figure
state, no GUI backend). Output is deterministic: the same inputs give
byte-identical PNG and PDF files (no timestamps or version strings embedded).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from esrepro.io import atomic_path, read_jsonl, write_text

PathLike = str | os.PathLike

PNG_DPI = 150

# Metadata keys matplotlib would otherwise fill with a timestamp or its version.
_METADATA = {
    "png": {"Software": None},
    "pdf": {"CreationDate": None, "Producer": None, "Creator": None},
}


def save_figure(fig: Figure, out_stem: PathLike, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """Save ``fig`` as ``{out_stem}.{fmt}`` for each format, atomically and deterministically."""
    stem = Path(out_stem)
    paths = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=PNG_DPI, metadata=_METADATA.get(fmt))
        paths.append(path)
    return paths


def training_curves(
    logs: Mapping[str, Sequence[Mapping[str, float]]],
    out_stem: PathLike,
    title: str,
    ylabel: str = "mean training reward",
) -> list[Path]:
    """Plot ``reward_mean`` against ``iteration``, one line per label, min–max band shaded.

    ``logs`` maps a label (e.g. ``"tiny / ES / seed 0"``) to its log records.
    Writes ``{out_stem}.png`` (dpi 150) and ``{out_stem}.pdf``; returns the paths.
    """
    if not logs:
        raise ValueError("training_curves: no logs given")
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (label, records) in enumerate(logs.items()):
        rows = sorted((r for r in records if "iteration" in r and "reward_mean" in r), key=lambda r: r["iteration"])
        color = f"C{i % 10}"
        its = [r["iteration"] for r in rows]
        ax.plot(its, [r["reward_mean"] for r in rows], color=color, linewidth=1.5, label=label)
        band = [r for r in rows if "reward_min" in r and "reward_max" in r]
        if band:
            ax.fill_between(
                [r["iteration"] for r in band],
                [r["reward_min"] for r in band],
                [r["reward_max"] for r in band],
                color=color,
                alpha=0.15,
                linewidth=0,
            )
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small", title="shaded: min–max", title_fontsize="small")
    return save_figure(fig, out_stem)


def build_countdown_curves(
    log_paths: Mapping[str, PathLike],
    out_stem: PathLike,
    title: str = "Countdown: training reward",
) -> list[Path]:
    """Read each ``log.jsonl`` (label -> path) and plot the training curves."""
    logs = {label: read_jsonl(path) for label, path in log_paths.items()}
    paths = training_curves(logs, out_stem, title)
    return [*paths, write_curves_csv(logs, Path(f"{out_stem}.csv"))]


CURVE_COLUMNS = ("iteration", "reward_mean", "reward_min", "reward_max")


def write_curves_csv(logs: Mapping[str, Sequence[Mapping[str, float]]], path: PathLike) -> Path:
    """The plotted points as CSV (label, iteration, reward_mean, ...): what ``dvc plots`` reads."""
    lines = [",".join(("label", *CURVE_COLUMNS))]
    for label, records in logs.items():
        for r in sorted((r for r in records if "iteration" in r and "reward_mean" in r), key=lambda r: r["iteration"]):
            cells = [r.get(c, "") for c in CURVE_COLUMNS]
            quoted = '"' + str(label).replace('"', '""') + '"'
            lines.append(",".join([quoted, *(repr(c) if isinstance(c, float) else str(c) for c in cells)]))
    write_text(path, "\n".join(lines) + "\n")
    return Path(path)
# --- the conciseness study --------------------------------------------------------------
_ALGO_STYLE = {"base": ("black", "*"), "es": ("C0", "o"), "grpo": ("C3", "s"), "dr_grpo": ("C2", "^"),
               "ppo": ("C1", "D")}


def _algo_label(algo: str) -> str:
    from esrepro.report.conciseness import ALGORITHMS

    return ALGORITHMS.get(algo, (algo, None))[0]


def pareto_figure(kl_paths: Sequence[PathLike], out_stem: PathLike, kl: str = "k3") -> list[Path]:
    """Reward against KL(fine-tuned || base), every kept checkpoint of every run, with each method's
    Pareto front (the ES paper's Figure 1: the sampled responses' mean reward, normalised to [0, 1], against
    Schulman's k3); configurations' final means marked and labelled.

    Writes ``{out_stem}.png``, ``.pdf`` and ``.csv`` (the plotted points, :func:`~esrepro.report.conciseness.pareto_table`).
    """
    from esrepro.report.conciseness import load_kl, pareto_table

    table = pareto_table(load_kl(kl_paths), kl)
    points = table[table["point"] == "checkpoint"]
    means = table[table["point"] == "configuration mean"]
    fig = Figure(figsize=(7.0, 4.8), layout="constrained")
    ax = fig.add_subplot()
    for algo in [a for a in _ALGO_STYLE if a in set(points["algorithm"])] + sorted(
            set(points["algorithm"]) - set(_ALGO_STYLE)):
        color, marker = _ALGO_STYLE.get(algo, ("C7", "x"))
        pts = points[points["algorithm"] == algo]
        if algo == "base":
            ax.scatter(pts["kl"], pts["reward"], color=color, marker=marker, s=140, zorder=5, label="base model")
            continue
        ax.scatter(pts["kl"], pts["reward"], color=color, marker=marker, s=14, alpha=0.35, linewidths=0)
        front = pts[pts["pareto_front"]].sort_values("kl", kind="stable")
        ax.step(front["kl"], front["reward"], where="post", color=color, linewidth=1.8,
                label=f"{_algo_label(algo)}: Pareto front")
        ax.scatter(front["kl"], front["reward"], color=color, marker=marker, s=36, zorder=4)
        for row in means[means["algorithm"] == algo].itertuples(index=False):
            ax.annotate(f"{row.value:g}", (row.kl, row.reward), textcoords="offset points", xytext=(4, 4),
                        fontsize="x-small", color=color)
    ax.set_xlabel(f"KL(fine-tuned || base) per response ({kl})")
    ax.set_ylabel("mean reward (sampled responses, held-out prompts)\nnormalised: 0 = −2000, 1 = 0")
    ax.set_title("Conciseness: reward against KL to the base model")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small",
              title="faint: every kept checkpoint; numbers: sigma / beta", title_fontsize="x-small")
    return [*save_figure(fig, out_stem), write_frame_csv(table, Path(f"{out_stem}.csv"))]


def reward_distribution_figure(kl_paths: Sequence[PathLike], out_stem: PathLike) -> list[Path]:
    """Per-response reward distributions of the base model and each ES / GRPO configuration
    (responses sampled on the held-out prompts, pooled over seeds): one panel per method.

    Writes ``{out_stem}.png``, ``.pdf`` and ``.csv`` (the plotted densities,
    :func:`~esrepro.report.conciseness.reward_histograms`).
    """
    import numpy as np

    from esrepro.report.conciseness import reward_histograms, sample_rewards

    table = reward_histograms(sample_rewards(kl_paths))
    panels = list(dict.fromkeys(table["panel"]))
    fig = Figure(figsize=(4.2 * len(panels), 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, algo in zip(axes, panels, strict=True):
        panel = table[table["panel"] == algo]
        i = 0
        for (series_algo, _), sub in panel.groupby(["algorithm", "value"], dropna=False, sort=False):
            edges = np.append(sub["lo"].to_numpy(), sub["hi"].iloc[-1])
            n = sub["n"].iloc[0]
            if series_algo == "base":
                ax.stairs(sub["density"], edges, fill=True, color="0.7", alpha=0.6, label=f"base (n={n})")
                continue
            ax.stairs(sub["density"], edges, linewidth=1.6, color=f"C{i % 10}",
                      label=f"{_algo_label(series_algo)} {sub['value'].iloc[0]:g} (n={n})")
            i += 1
        ax.set_title(_algo_label(algo) if algo != "base" else "base model")
        ax.set_xlabel("reward of a sampled response (normalised: 0 = −2000, 1 = 0)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize="x-small")
    axes[0].set_ylabel("density")
    fig.suptitle("Conciseness: reward distributions (held-out prompts, sampled responses)")
    return [*save_figure(fig, out_stem), write_frame_csv(table, Path(f"{out_stem}.csv"))]


# --- shared helpers of the paper-figure modules (gains, sample_curves, param_shift, lr_sweep) ---
#: One colour per Countdown method, the same in every figure.
METHOD_COLORS: dict[str, str] = {
    "base": "0.35", "es": "C0", "ppo": "C1", "grpo8": "C3", "grpo30": "C4", "grpov": "C6", "drgrpov": "C2",
    "drgrpo": "C8", "grpo": "C3", "dr_grpo": "C2", "essa": "C5",
}


def method_color(method: str, fallback_index: int = 0) -> str:
    """The colour of a method key (``METHOD_COLORS``), else a tab10 colour chosen by ``fallback_index``."""
    return METHOD_COLORS.get(method, f"C{(fallback_index + 5) % 10}")


def write_frame_csv(df, path: PathLike) -> Path:
    """Write a DataFrame of plotted numbers as CSV (no index, full float precision), atomically."""
    write_text(path, df.to_csv(index=False, lineterminator="\n"))
    return Path(path)
