"""The ESSA study's figures and summary table (Korotyshova et al., arXiv 2507.04453).

- Fig. 4 (``population_figure``): held-out accuracy of the CMA-ES mean against generations,
  one line per population, and the maximum against population (with the test accuracy of
  the final checkpoint).
- Fig. 7 (``rank_figure``): the same maxima and test accuracy against the LoRA rank.
- Fig. 2 (``engines_figure``): training seconds until the held-out accuracy first reaches
  the target, against the number of engines (and seconds per generation).
- Fig. 9 (``precision_figure``): held-out accuracy against generations per inference
  precision, and test accuracy per precision.
- Fig. 8 (``wallclock_figure``): ESSA against the GRPO baseline from the same SFT start,
  held-out accuracy against summed training seconds.
- Fig. 6 (``scaling_figure``): held-out accuracy against training seconds on the scaling task
  (PRM800K at paper scale, ESSA alone on 8 GPUs as the paper's left panel), ESSA at each GPU count
  given and the GRPO baseline where the config has one, with the time to near-optimal accuracy.
- The resampling runs (``resample``, the paper's Sec. 5.4: 100 of the fitness problems drawn per
  generation instead of all of them) are rows of the summary table
  (``problems_per_generation``).

Where the ESSA paper contradicts itself on a figure's setting (Fig. 2's population, Fig. 4's
rank, the rank lists), a line under the figure says which reading the runs take
(:data:`PAPER_READINGS`).

Inputs are run directories (``log.jsonl`` and ``manifest.json``; see
:mod:`esrepro.essa.train` and :mod:`esrepro.steps.essa`) and ``metrics.json`` of their
evaluations. "Accuracy" is each run's ``fitness`` measure (accuracy unless the config
scores the task's reward); held-out curves need ``val_examples`` > 0, else the
population mean reward on the generation's problems is plotted instead (labelled so).
The reference run (``essa_ref``) joins every sweep at its own value. Numbers are means
over seeds; every figure writes the plotted numbers as CSV beside it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from esrepro.io import read_json, read_jsonl, write_text
from esrepro.report.figures import save_figure, write_frame_csv

PathLike = str | os.PathLike
REF = "essa_ref"
GRPO = "essa_grpo"
ESSA_COLORS = ("C0", "C1", "C2", "C4", "C5", "C6", "C7", "C8", "C9")  # C3 is GRPO's
SWEEP_SETTING = {"populations": "population", "ranks": "rank", "engines": "engines", "precisions": "precision",
                 "resample": "problems_per_generation"}
#: Where the ESSA paper contradicts itself on a figure's setting, and the reading these runs take (a line under the
#: figure, with the values the runs shown used).
PAPER_READINGS = {
    "engines": ("population", "ESSA paper, Fig. 2: the text gives population 192, the caption 640; this "
                "reproduction's paper-scale runs take the text's 192, the population the paper fixes for its "
                "GPU-count, rank and precision experiments."),
    "populations": ("rank", "ESSA paper, Fig. 4: the text gives LoRA rank 16, the caption 32; this reproduction's "
                    "paper-scale runs take the text's 16, the rank its other sweeps share."),
    "ranks": ("rank", "ESSA paper: Sec. 4.3 lists LoRA ranks 8, 16, 32, 64 and Sec. 5.3 (Fig. 7) 4, 8, 32, 64; "
              "this reproduction's paper-scale runs take both lists (4, 8, 16, 32, 64)."),
}


# --- loading ----------------------------------------------------------------------------------


def _run_labels(run_dir: Path) -> dict:
    manifest = read_json(run_dir / "manifest.json")
    s = manifest["settings"]
    essa = manifest.get("essa", {})
    base = manifest.get("essa_baseline", {})
    return {
        "task": s.get("task"), "model": s["model"], "method": s["method"], "seed": int(manifest.get("seed", 0)),
        "algorithm": s.get("algorithm", s["method"]), "population": s.get("population"), "rank": s.get("rank"),
        "engines": manifest.get("engines", s.get("engines")), "precision": s.get("precision"),
        "fitness": s.get("fitness", base.get("fitness")),
        "problems_per_generation": (s.get("resample_per_step") or s.get("fitness_examples"))
        if s.get("algorithm") == "essa" else None,
        "covariance": s.get("covariance"),
        "val_reward_sft": essa.get("val_reward_sft", base.get("val_reward_sft")),
        "run_dir": str(run_dir),
    }


def load_curves(run_dirs: Iterable[PathLike]) -> pd.DataFrame:
    """One row per logged generation (ESSA) or step (GRPO): labels, iteration, elapsed seconds, scores."""
    rows = []
    for d in map(Path, run_dirs):
        labels = _run_labels(d)
        for r in read_jsonl(d / "log.jsonl"):
            rows.append({**labels, "iteration": int(r["iteration"]), "elapsed_seconds": r.get("elapsed_seconds"),
                         "seconds_total": r.get("seconds_total", r.get("seconds")),
                         "val_reward": r.get("val_reward"), "reward_mean": r.get("reward_mean")})
    return pd.DataFrame(rows)


def load_runs(run_dirs: Iterable[PathLike], metrics: Iterable[PathLike] = ()) -> pd.DataFrame:
    """One row per run: labels, final and best held-out score, training seconds, test accuracy (if evaluated)."""
    tests = {}
    for path in metrics:
        m = read_json(path)
        tests[(m.get("task"), m["model"], m["method"], int(m["seed"]))] = m["accuracy"]
    rows = []
    for d in map(Path, run_dirs):
        labels = _run_labels(d)
        log = read_jsonl(d / "log.jsonl")
        val = [r["val_reward"] for r in log if r.get("val_reward") is not None]
        rows.append({
            **labels,
            "iterations": len(log),
            "val_final": val[-1] if val else None,
            "val_max": max(val) if val else None,
            "reward_mean_final": log[-1].get("reward_mean") if log else None,
            "train_seconds": log[-1].get("elapsed_seconds") if log else None,
            "seconds_per_iteration": float(np.mean([r.get("seconds_total", r.get("seconds")) or 0 for r in log]))
            if log else None,
            "test_accuracy": tests.get((labels["task"], labels["model"], labels["method"], labels["seed"])),
        })
    return pd.DataFrame(rows)


def base_accuracy(metrics: Iterable[PathLike]) -> dict[tuple[str | None, str], float]:
    """Test accuracy of each model's base (method ``base``), by (task, model)."""
    out = {}
    for path in metrics:
        m = read_json(path)
        if m["method"] == "base":
            out[(m.get("task"), m["model"])] = m["accuracy"]
    return out


def time_to_target(curve: pd.DataFrame, target: float) -> float | None:
    """Summed training seconds at the first held-out score >= ``target`` (None if never reached)."""
    hit = curve[(curve["val_reward"].notna()) & (curve["val_reward"] >= target)].sort_values("iteration")
    return None if hit.empty else float(hit["elapsed_seconds"].iloc[0])


# --- helpers -------------------------------------------------------------------------------------


def _score(curves: pd.DataFrame) -> tuple[str, str]:
    """The curve column to plot and its label: held-out score when logged, else the population mean."""
    if curves["val_reward"].notna().any():
        return "val_reward", "held-out accuracy of the mean"
    return "reward_mean", "population mean reward (no held-out problems)"


def _sweep_runs(runs: pd.DataFrame, key: str, methods: Sequence[str]) -> pd.DataFrame:
    """The reference and a sweep's runs, with the swept value as ``value``."""
    sub = runs[runs["method"].isin([REF, *methods])].copy()
    sub["value"] = sub[SWEEP_SETTING[key]]
    return sub


def _fmt(value) -> str:
    """A swept value as a label: 8 not 8.0."""
    return f"{value:g}" if isinstance(value, (int, float, np.number)) else str(value)


def _title(ax, model: str, what: str) -> None:
    ax.set_title(f"{model}\n{what}", fontsize=9)


def _models(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["model"]))


def _axes(n: int, cols: int, width: float = 5.0, height: float = 3.6):
    fig = Figure(figsize=(width * cols, height * n))
    axes = fig.subplots(n, cols, squeeze=False)
    return fig, axes


def paper_reading(runs: pd.DataFrame, key: str) -> str | None:
    """The line under a sweep's figure saying how the paper contradicts itself on it and which reading the runs
    take, with the values of the setting the runs shown used (None when the paper is consistent there)."""
    if key not in PAPER_READINGS:
        return None
    column, text = PAPER_READINGS[key]
    used = [_fmt(v) for v in sorted(set(runs[column].dropna()))] if column in runs else []
    return text + (f" Runs shown: {column} {', '.join(used)}." if used else "")


def _caption(fig: Figure, note: str | None, rows: int) -> float:
    """Write ``note`` under the figure; returns the share of the height it takes."""
    if not note:
        return 0.0
    import textwrap

    text = textwrap.fill(note, 150)
    fig.text(0.01, 0.005, text, fontsize=6.5, va="bottom")
    return min(0.3, 0.03 * (text.count("\n") + 1) / rows)


def _finish(fig: Figure, out_stem: PathLike, table: pd.DataFrame, bottom: float = 0.0) -> list[Path]:
    fig.tight_layout(rect=(0.0, bottom, 1.0, 1.0))
    paths = save_figure(fig, out_stem)
    paths.append(write_frame_csv(table, f"{out_stem}.csv"))
    return paths


def _curve_panel(ax, curves: pd.DataFrame, runs: pd.DataFrame, key_label: str, x: str = "iteration") -> pd.DataFrame:
    """One line per swept value (mean over seeds); returns the plotted numbers."""
    col, ylabel = _score(curves)
    plotted = []
    for value, group in runs.groupby("value", sort=True):
        c = curves[curves["run_dir"].isin(group["run_dir"]) & curves[col].notna()]
        mean = c.groupby("iteration")[[col, "elapsed_seconds"]].mean().reset_index()
        ax.plot(mean[x], mean[col], marker="o", markersize=3, label=f"{key_label} {_fmt(value)}")
        plotted.append(mean.assign(value=value))
    ax.set_xlabel("generation" if x == "iteration" else "training seconds")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return pd.concat(plotted, ignore_index=True) if plotted else pd.DataFrame()


def _maxima_panel(ax, runs: pd.DataFrame, xlabel: str, log_x: bool = False) -> pd.DataFrame:
    """Best held-out score and final test accuracy against the swept value (mean over seeds)."""
    agg = runs.groupby("value", sort=True)[["val_max", "test_accuracy"]].mean().reset_index()
    xs = agg["value"].astype(float)
    if agg["val_max"].notna().any():
        ax.plot(xs, agg["val_max"], marker="o", label="max held-out accuracy")
    if agg["test_accuracy"].notna().any():
        ax.plot(xs, agg["test_accuracy"], marker="s", label="test accuracy (final)")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{v:g}" for v in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8)
    return agg


# --- figures ------------------------------------------------------------------------------------


def _sweep_figure(runs: pd.DataFrame, curves: pd.DataFrame, methods: Sequence[str], out_stem: PathLike,
                  key: str, column: str, xlabel: str, what: tuple[str, str],
                  display: dict[str, str] | None = None) -> list[Path]:
    """One sweep's figure: per model, accuracy per generation for each value, and the best accuracy per value."""
    sub = _sweep_runs(runs, key, methods)
    models = _models(sub)
    fig, axes = _axes(len(models), 2)
    tables = []
    for i, model in enumerate(models):
        r = sub[sub["model"] == model]
        name = (display or {}).get(model, model)
        tables.append(_curve_panel(axes[i][0], curves, r, column).assign(model=model, panel="curve"))
        _title(axes[i][0], name, what[0])
        tables.append(_maxima_panel(axes[i][1], r, xlabel, log_x=True).assign(model=model, panel="maximum"))
        _title(axes[i][1], name, what[1])
    bottom = _caption(fig, paper_reading(sub, key), len(models))
    return _finish(fig, out_stem, pd.concat(tables, ignore_index=True), bottom)


def population_figure(runs: pd.DataFrame, curves: pd.DataFrame, methods: Sequence[str], out_stem: PathLike,
                      display: dict[str, str] | None = None) -> list[Path]:
    """ESSA Fig. 4: accuracy against generations per population; maximum accuracy against population."""
    return _sweep_figure(runs, curves, methods, out_stem, "populations", "population", "population",
                         ("accuracy per generation, per population", "best accuracy against population"), display)


def rank_figure(runs: pd.DataFrame, curves: pd.DataFrame, methods: Sequence[str], out_stem: PathLike,
                display: dict[str, str] | None = None) -> list[Path]:
    """ESSA Fig. 7: accuracy against LoRA rank (and the curves per rank)."""
    return _sweep_figure(runs, curves, methods, out_stem, "ranks", "rank", "LoRA rank",
                         ("accuracy per generation, per LoRA rank", "accuracy against LoRA rank"), display)


def engines_figure(runs: pd.DataFrame, curves: pd.DataFrame, methods: Sequence[str], target: float,
                   out_stem: PathLike, display: dict[str, str] | None = None,
                   published_target: float | None = None) -> list[Path]:
    """ESSA Fig. 2: training seconds to reach ``target`` held-out accuracy against engines; seconds per generation."""
    sub = _sweep_runs(runs, "engines", methods)
    sub["time_to_target"] = [time_to_target(curves[curves["run_dir"] == d], target) for d in sub["run_dir"]]
    models = _models(sub)
    fig, axes = _axes(len(models), 2)
    rows = []
    for i, model in enumerate(models):
        name = (display or {}).get(model, model)
        r = sub[sub["model"] == model]
        agg = r.groupby("value", sort=True).agg(time_to_target=("time_to_target", "mean"),
                                                reached=("time_to_target", lambda s: int(s.notna().sum())),
                                                seeds=("seed", "count"), train_seconds=("train_seconds", "mean"),
                                                seconds_per_generation=("seconds_per_iteration", "mean"),
                                                val_max=("val_max", "mean")).reset_index()
        xs = agg["value"].astype(float)
        ax = axes[i][0]
        hit = agg[agg["reached"] == agg["seeds"]]
        ax.plot(hit["value"].astype(float), hit["time_to_target"], marker="o", label=f"reached {target:g}")
        miss = agg[agg["reached"] < agg["seeds"]]
        if not miss.empty:
            ax.scatter(miss["value"].astype(float), miss["train_seconds"], marker="x", color="C3",
                       label=f"not reached by every seed (run length shown; best {miss['val_max'].max():.3g})")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{v:g}" for v in xs])
        ax.set_xlabel("engines")
        ax.set_ylabel("training seconds")
        _title(ax, name, f"training seconds to held-out accuracy {target:g}"
               + (f" (the paper's GSM8K target: {published_target:g})" if published_target is not None else ""))
        ax.legend(fontsize=8)
        ax2 = axes[i][1]
        ax2.plot(xs, agg["seconds_per_generation"], marker="s")
        ax2.set_xticks(list(xs))
        ax2.set_xticklabels([f"{v:g}" for v in xs])
        ax2.set_xlabel("engines")
        ax2.set_ylabel("seconds per generation")
        _title(ax2, name, "seconds per CMA-ES generation")
        rows.append(agg.assign(model=model, target=target))
    bottom = _caption(fig, paper_reading(sub, "engines"), len(models))
    return _finish(fig, out_stem, pd.concat(rows, ignore_index=True), bottom)


def precision_figure(runs: pd.DataFrame, curves: pd.DataFrame, methods: Sequence[str], out_stem: PathLike,
                     display: dict[str, str] | None = None) -> list[Path]:
    """ESSA Fig. 9: accuracy against generations per inference precision; test accuracy per precision."""
    sub = _sweep_runs(runs, "precisions", methods)
    models = _models(sub)
    fig, axes = _axes(len(models), 2)
    tables = []
    for i, model in enumerate(models):
        name = (display or {}).get(model, model)
        r = sub[sub["model"] == model]
        tables.append(_curve_panel(axes[i][0], curves, r, "precision").assign(model=model, panel="curve"))
        _title(axes[i][0], name, "accuracy per generation, per precision")
        agg = r.groupby("value", sort=True)[["val_max", "test_accuracy"]].mean().reset_index()
        ax = axes[i][1]
        pos = np.arange(len(agg))
        ax.bar(pos - 0.2, agg["val_max"].fillna(0), width=0.4, label="max held-out accuracy")
        ax.bar(pos + 0.2, agg["test_accuracy"].fillna(0), width=0.4, label="test accuracy (final)")
        ax.set_xticks(list(pos))
        ax.set_xticklabels(list(agg["value"]))
        ax.set_ylabel("accuracy")
        _title(ax, name, "accuracy per precision")
        ax.legend(fontsize=8)
        tables.append(agg.assign(model=model, panel="bars"))
    return _finish(fig, out_stem, pd.concat(tables, ignore_index=True))


def _heldout_curve(runs: pd.DataFrame, curves: pd.DataFrame) -> tuple[list[float], list[float]]:
    """Held-out accuracy against summed training seconds, mean over the runs' seeds, from the SFT start's score."""
    c = curves[curves["run_dir"].isin(runs["run_dir"]) & curves["val_reward"].notna()]
    if c.empty:
        return [], []
    mean = c.groupby("iteration")[["elapsed_seconds", "val_reward"]].mean().reset_index()
    start = runs["val_reward_sft"].dropna()
    xs, ys = list(mean["elapsed_seconds"]), list(mean["val_reward"])
    if not start.empty:
        xs, ys = [0.0, *xs], [float(start.mean()), *ys]
    return xs, ys


def time_to_fraction(xs: Sequence[float], ys: Sequence[float], threshold: float) -> float | None:
    """Seconds at the first point of a curve at or above ``threshold`` (None if never)."""
    return next((float(x) for x, y in zip(xs, ys, strict=True) if y >= threshold), None)


def _note_text(fig: Figure, notes: Sequence[str], rows: int) -> float:
    import textwrap

    if not notes:
        return 0.0
    text = "\n".join(textwrap.fill(n, 130, subsequent_indent="    ") for n in notes)
    fig.text(0.01, 0.005, text, fontsize=6.5, va="bottom")
    return min(0.5, 0.03 + 0.022 * text.count("\n") / rows)


def wallclock_figure(runs: pd.DataFrame, curves: pd.DataFrame, out_stem: PathLike, target: float | None = None,
                     display: dict[str, str] | None = None, notes: Sequence[str] = ()) -> list[Path]:
    """ESSA Fig. 8: held-out accuracy against summed training seconds, ESSA (reference run) against GRPO."""
    sub = runs[runs["method"].isin([REF, GRPO])]
    models = _models(sub)
    fig, axes = _axes(len(models), 1, width=8.0, height=4.0 + (1.2 if notes else 0.0))
    tables = []
    for i, model in enumerate(models):
        ax = axes[i][0]
        name = (display or {}).get(model, model)
        for method, label, color in ((REF, "ESSA", "C5"), (GRPO, "GRPO", "C3")):
            group = sub[(sub["model"] == model) & (sub["method"] == method)]
            xs, ys = _heldout_curve(group, curves)
            if not xs:
                continue
            ax.plot(xs, ys, marker="o", markersize=3, color=color, label=label)
            test = group["test_accuracy"].dropna()
            if not test.empty:
                ax.scatter([xs[-1]], [test.mean()], marker="*", s=80, color=color, label=f"{label}: test accuracy")
            tables.append(pd.DataFrame({"model": model, "method": method, "elapsed_seconds": xs, "val_reward": ys}))
        if target is not None:
            ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"target {target:g}")
        ax.set_xlabel("training seconds (start-up, SFT and held-out scoring excluded)")
        ax.set_ylabel("held-out accuracy")
        _title(ax, name, "ESSA against GRPO from the same SFT start")
        ax.legend(fontsize=8)
    bottom = _note_text(fig, notes, len(models))
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    return _finish(fig, out_stem, table, bottom)


def scaling_figure(runs: pd.DataFrame, curves: pd.DataFrame, out_stem: PathLike, near_optimal: float,
                   display: dict[str, str] | None = None, notes: Sequence[str] = ()) -> list[Path]:
    """ESSA Fig. 6: held-out accuracy against training seconds for ESSA at each engine count (one engine per GPU)
    and the GRPO baseline; each run's seconds to ``near_optimal`` x the best held-out accuracy any run of the
    model reaches, and GRPO's seconds over ESSA's (the speed-up)."""
    models = _models(runs)
    fig, axes = _axes(len(models), 2, width=6.0, height=4.0 + (1.2 if notes else 0.0))
    curve_rows, summary_rows = [], []
    for i, model in enumerate(models):
        name = (display or {}).get(model, model)
        r = runs[runs["model"] == model]
        essa = r[r["algorithm"] == "essa"].sort_values("engines")
        lines = [(f"ESSA, {int(k)} engines", g, int(k)) for k, g in essa.groupby("engines", sort=True)]
        lines += [("GRPO", r[r["method"] == GRPO], None)] if (r["method"] == GRPO).any() else []
        drawn = [(label, k, *_heldout_curve(g, curves)) for label, g, k in lines]
        best = max((max(ys) for *_, ys in drawn if ys), default=None)
        threshold = near_optimal * best if best else None
        ax = axes[i][0]
        for j, (label, k, xs, ys) in enumerate(drawn):
            if xs:
                color = "C3" if k is None else ESSA_COLORS[j % len(ESSA_COLORS)]
                ax.plot(xs, ys, marker="o", markersize=3, color=color, label=label)
                curve_rows.append(pd.DataFrame({"model": model, "run": label, "engines": k, "elapsed_seconds": xs,
                                                "val_reward": ys}))
        if threshold:
            ax.axhline(threshold, color="grey", linestyle=":", linewidth=1,
                       label=f"near-optimal: {near_optimal:g} x best ({threshold:.3g})")
        ax.set_xlabel("training seconds (start-up, SFT and held-out scoring excluded)")
        ax.set_ylabel("held-out accuracy")
        _title(ax, name, "ESSA per engine count" + (" against GRPO" if (r["method"] == GRPO).any() else ""))
        ax.legend(fontsize=7)
        times = {label: (k, time_to_fraction(xs, ys, threshold) if threshold else None)
                 for label, k, xs, ys in drawn}
        grpo = times.get("GRPO", (None, None))[1]
        ax2 = axes[i][1]
        essa_times = [(k, t) for label, (k, t) in times.items() if k is not None]
        pos = np.arange(len(essa_times))
        ax2.bar(pos, [t or 0.0 for _, t in essa_times], color="C0", label="ESSA")
        for x, (k, t) in zip(pos, essa_times, strict=True):
            speedup = grpo / t if grpo and t else None
            summary_rows.append({"model": model, "run": f"ESSA, {k} engines", "engines": k, "best_val_reward": best,
                                 "threshold": threshold, "seconds_to_threshold": t, "grpo_seconds_to_threshold": grpo,
                                 "speedup_over_grpo": speedup})
            label = "no held-out score above 0" if threshold is None else \
                "not reached" if t is None else (f"{speedup:.2g}x GRPO" if speedup else "")
            ax2.annotate(label, (x, t or 0.0), ha="center", va="bottom", fontsize=7)
        if grpo is not None:
            ax2.axhline(grpo, color="C3", linestyle="--", linewidth=1, label="GRPO")
        ax2.set_xticks(list(pos))
        ax2.set_xticklabels([f"{k}" for k, _ in essa_times])
        ax2.set_xlabel("ESSA engines (one per GPU at paper scale)")
        ax2.set_ylabel("training seconds")
        _title(ax2, name, "seconds to near-optimal held-out accuracy")
        ax2.legend(fontsize=7)
    notes = [f"Near-optimal: the first held-out score at least {near_optimal:g} x the best any run of the model "
             "reaches; the speed-up is GRPO's seconds to it over ESSA's.", *notes]
    bottom = _note_text(fig, notes, len(models))
    table = pd.concat([*curve_rows, pd.DataFrame(summary_rows)], ignore_index=True) if curve_rows else \
        pd.DataFrame(summary_rows)
    return _finish(fig, out_stem, table, bottom)


# --- the summary table -----------------------------------------------------------------------------


def summary_table(runs: pd.DataFrame, base: dict[tuple[str | None, str], float], out_stem: PathLike,
                  target: float | None, curves: pd.DataFrame, notes: Sequence[str] = (),
                  display: dict[str, str] | None = None, target_task: str | None = None) -> pd.DataFrame:
    """One row per (task, model, method): the setting it varies, test accuracy, held-out scores, seconds (means
    over seeds), the base model's test accuracy on the task (``base``: by (task, model)); csv and md, published
    claims listed under the md table. ``time_to_target`` is measured on ``target_task``'s runs only when given
    (the target is that task's)."""
    df = runs.copy()
    if target is not None:
        df["time_to_target"] = [time_to_target(curves[curves["run_dir"] == d], target)
                                if target_task in (None, t) else None
                                for d, t in zip(df["run_dir"], df["task"], strict=True)]
    cols = ["task", "model", "method", "algorithm", "population", "rank", "engines", "precision",
            "problems_per_generation"]
    values = [c for c in ("test_accuracy", "val_reward_sft", "val_max", "val_final", "train_seconds",
                          "seconds_per_iteration", "time_to_target") if c in df]
    agg = df.groupby(cols, dropna=False, sort=False)[values].mean().reset_index()
    agg.insert(2, "seeds", df.groupby(cols, dropna=False, sort=False).size().values)
    agg["base_test_accuracy"] = [base.get((t, m)) for t, m in zip(agg["task"], agg["model"], strict=True)]
    if display:
        agg["model"] = [display.get(m, m) for m in agg["model"]]
    write_frame_csv(agg, f"{out_stem}.csv")
    md = agg.to_markdown(index=False, floatfmt=".4g")
    text = "# ESSA study summary\n\n" + md + "\n"
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    write_text(f"{out_stem}.md", text)
    return agg


def published_notes(published: dict, models: Sequence[str], task: str | None = None) -> tuple[list[str], float | None]:
    """Lines quoting the ESSA paper's claims (config/published.yaml ``essa_*`` tables, those of ``task`` when
    given; a claim about a model outside ``models`` says so) and its target accuracy."""
    lines, target = [], None
    for name, table in published.get("tables", {}).items():
        if not name.startswith("essa") or task not in (None, table.get("task")):
            continue
        prov = table.get("provenance", {})
        target = table.get("target_accuracy", target)
        for claim in table.get("claims", []):
            other = claim.get("model") is not None and claim.get("model") not in models
            lines.append(f"Paper (arXiv {prov.get('arxiv')}, {claim.get('where', prov.get('table'))})"
                         + (f", {claim['model']}, not a model of this run" if other else "") + f": {claim['text']}")
    return lines, target
