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
