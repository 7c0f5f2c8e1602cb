"""The ES paper v2's tables (arXiv 2509.24372v2): accuracy per training task, the math table beside the published RL baselines,
the puzzle table (Sudoku, ARC-AGI: Original vs ES) and cross-run stability (mean and std over seeds).

Every table holds numbers (percent; NaN where there is none) and is written by
:func:`esrepro.report.tables.write_table` (csv, md, tex) with the paper's numbers beside ours
where ``config/published.yaml`` has them. Published blocks are found by their ``task``:
a block's ``models.<model>.<method>`` is the paper's number for that model and method on that
task; the math block (``task: math``) lists ``benchmarks`` and ``baselines``, published RL
models each with its source.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from esrepro.report.tables import METHOD_COLUMNS, METHOD_LABELS, STD_SUFFIX, load_metrics, load_published, write_table

PathLike = str | os.PathLike

#: Display names of the math sets, in the v2 table's order.
MATH_SETS: dict[str, str] = {"math500": "MATH500", "minerva": "Minerva", "olympiad_bench": "OlympiadBench",
                             "aime24": "AIME24", "amc23": "AMC23"}
TASK_LABELS: dict[str, str] = {**MATH_SETS, "countdown": "Countdown", "sudoku": "Sudoku", "arc": "ARC-AGI",
                               "gsm8k": "GSM8K", "conciseness": "Conciseness", "math_train": "MATH (train)",
                               "prm800k": "PRM800K"}


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def method_order(methods: Iterable[str]) -> list[str]:
    """Table 1's order (base first), then any other method, sorted."""
    present = set(methods)
    return [m for m in METHOD_COLUMNS if m in present] + sorted(present - set(METHOD_COLUMNS))


def published_blocks(published: Mapping[str, Any], task: str) -> list[Mapping[str, Any]]:
    """Every table block of ``published`` whose ``task`` is ``task``."""
    return [b for b in (published.get("tables") or {}).values() if isinstance(b, Mapping) and b.get("task") == task]


def paper_value(published: Mapping[str, Any], task: str, model: str, method: str) -> float:
    """The paper's accuracy (%) for (task, model, method), NaN when none is recorded (the notebook's lookup)."""
    from esrepro.report.notebook import _paper_value

    return _paper_value(published, task, model, method)


def accuracy_stats(metrics: pd.DataFrame) -> pd.DataFrame:
    """Mean, sample std (NaN with one seed), count, min and max of accuracy (%) per (task, model, method)."""
    if metrics.empty:
        return pd.DataFrame(columns=["mean", "std", "count", "min", "max"])
    pct = metrics.assign(pct=pd.to_numeric(metrics["accuracy"]) * 100.0)
    out = pct.groupby(["task", "model", "method"])["pct"].agg(["mean", "std", "count", "min", "max"])
    out.loc[out["count"] < 2, "std"] = math.nan
    return out


def _display(models: Mapping[str, Mapping[str, Any]], key: str) -> str:
    return (models.get(key) or {}).get("display", key)


#: (test set, model, method) -> what the cell of ours says instead of a number (a run this machine could not do).
NotRunCells = Mapping[tuple[str, str, str], str]


def _ours(stats: pd.DataFrame, not_run: NotRunCells, task: str, model: str, method: str) -> tuple[Any, float]:
    """The cell of ours (mean accuracy %, a not-run text, or NaN) and its std."""
    if (task, model, method) in stats.index:
        row = stats.loc[(task, model, method)]
        return float(row["mean"]), float(row["std"])
    return not_run.get((task, model, method), math.nan), math.nan


# --- accuracy per training task ---------------------------------------------------------------------------------
def train_tasks_table(metrics: pd.DataFrame, published: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]],
                      sets: Mapping[str, str], not_run: NotRunCells | None = None) -> pd.DataFrame:
    """One row per (training task, test set, model): each method's accuracy (ours, std, paper).

    ``sets`` maps each test set to the training task whose runs it evaluates; rows follow its order. ``not_run``:
    the text of the cells of runs left out (e.g. ``not run: no sandbox on this machine``), which get rows too.
    """
    not_run = not_run or {}
    stats = accuracy_stats(metrics)
    methods = method_order([*(metrics["method"] if len(metrics) else []), *(m for _, _, m in not_run)])
    runs = {(t, mm) for t, mm, _ in [*stats.index, *not_run]}
    records = []
    for test_set, train_task in sets.items():
        present = [m for m in models if (test_set, m) in runs]
        present += sorted({mm for t, mm in runs if t == test_set} - set(present))
        for model in present:
            rec: dict[str, Any] = {"Training task": TASK_LABELS.get(train_task, train_task),
                                   "Test set": TASK_LABELS.get(test_set, test_set), "Model": _display(models, model)}
            for method in methods:
                label = method_label(method)
                rec[f"{label} (ours)"], rec[f"{label} (ours){STD_SUFFIX}"] = _ours(stats, not_run, test_set, model,
                                                                                  method)
                rec[f"{label} (paper)"] = paper_value(published, test_set, model, method)
            records.append(rec)
    df = pd.DataFrame(records)
    if df.empty:
        return df
    keep = [c for c in df.columns if not c.endswith("(paper)") or df[c].notna().any()]
    return df[keep]


def build_train_tasks_table(metric_paths: Iterable[PathLike], published_path: PathLike,
                            models: Mapping[str, Mapping[str, Any]], sets: Mapping[str, str], out_stem: PathLike,
                            notes: Sequence[str] = (), not_run: NotRunCells | None = None) -> pd.DataFrame:
    """Load metrics, build :func:`train_tasks_table` and write it (csv, md, tex)."""
    df = train_tasks_table(load_metrics(metric_paths), load_published(published_path), models, sets, not_run)
    caption = "Test accuracy (%) of every training task's runs on its test sets: ours, and the paper's where published"
    write_table(df, out_stem, caption, ["Ours: mean over seeds (± sample std with more than one seed); paper columns "
                                        "appear where config/published.yaml has a number.", *notes])
    return df


# --- the math table -------------------------------------------------------------------------------------------------
def _math_block(published: Mapping[str, Any]) -> Mapping[str, Any]:
    blocks = published_blocks(published, "math")
    return blocks[0] if blocks else {}


def math_table(metrics: pd.DataFrame, published: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]]
               ) -> pd.DataFrame:
    """Rows: the runs of v2 Fig. 2's bars (ours, in its legend order and labels), any other run, the paper's own
    numbers, then the published RL baselines of the secondary reference.

    Columns: ``Model``, ``Method``, ``Source``, one column per math set (accuracy %, ours: mean over
    seeds with ``... std``), and ``Average`` (of the five, when all five are there).
    """
    stats = accuracy_stats(metrics)
    sets = [s for s in MATH_SETS if len(metrics) and s in set(metrics["task"])] or list(MATH_SETS)
    labels = [MATH_SETS[s] for s in sets]
    block = _math_block(published)
    records: list[dict[str, Any]] = []

    def add(model: str, method: str, source: str, values: Mapping[str, float], stds: Mapping[str, float]) -> None:
        rec: dict[str, Any] = {"Model": model, "Method": method, "Source": source}
        for s, label in zip(sets, labels, strict=True):
            rec[label] = values.get(s, math.nan)
            rec[f"{label}{STD_SUFFIX}"] = stds.get(s, math.nan)
        vals = [rec[label] for label in labels]
        rec["Average"] = sum(vals) / len(vals) if vals and not any(math.isnan(v) for v in vals) else math.nan
        records.append(rec)

    def add_ours(model: str, method: str, label: str) -> None:
        vals = {s: float(stats.loc[(s, model, method)]["mean"]) for s in sets if (s, model, method) in stats.index}
        stds = {s: float(stats.loc[(s, model, method)]["std"]) for s in sets if (s, model, method) in stats.index}
        add(_display(models, model), label, "ours", vals, stds)

    runs = list(dict.fromkeys((mm, m) for _, mm, m in stats.index))
    # v2 Fig. 2's rows first, in its legend order (a bar without a model: the math runs' own model), labelled as it is
    bars = (block.get("figure") or {}).get("bars") or []
    own = {b["model"] for b in bars if b.get("model")}
    done: set[tuple[str, str]] = set()
    for bar in bars:
        for model, method in runs:
            if method == bar["method"] and (model == bar["model"] if bar.get("model") else model not in own):
                add_ours(model, method, bar["label"])
                done.add((model, method))
    keys = list(dict.fromkeys(m for m, _ in runs))
    keys = [k for k in models if k in keys] + sorted(set(keys) - set(models))
    for model in keys:
        for method in method_order(m for mm, m in runs if mm == model and (mm, m) not in done):
            add_ours(model, method, method_label(method))
    prov = block.get("provenance") or {}
    for model, by_method in (block.get("benchmark_models") or {}).items():
        for method, values in (by_method or {}).items():
            add(_display(models, model), method_label(method),
                f"paper (arXiv {prov.get('arxiv', '?')}{prov.get('version', '')})", values or {}, {})
    for base in block.get("baselines") or []:
        add(base["name"], method_label(base["method"]), base.get("source", "published"), base.get("values") or {}, {})
    return pd.DataFrame(records)


def build_math_table(metric_paths: Iterable[PathLike], published_path: PathLike,
                     models: Mapping[str, Mapping[str, Any]], out_stem: PathLike, notes: Sequence[str] = ()
                     ) -> pd.DataFrame:
    """Load metrics, build :func:`math_table` and write it (csv, md, tex)."""
    published = load_published(published_path)
    df = math_table(load_metrics(metric_paths), published, models)
    block = _math_block(published)
    default = ["Accuracy (%) with greedy decoding, the last \\boxed{} graded by math-verify. Ours: mean over seeds "
               "(± sample std with more than one seed)."]
    if block.get("note"):
        default.append(str(block["note"]))
    write_table(df, out_stem, "Math reasoning: ES and the base model (ours) beside the published RL baselines",
                [*default, *notes])
    return df


# --- the puzzle table ------------------------------------------------------------------------------------------------
def puzzle_table(metrics: pd.DataFrame, published: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]],
                 tasks: Sequence[str] = ("sudoku", "arc"), not_run: NotRunCells | None = None) -> pd.DataFrame:
    """v2 Table 3's layout: one row per (puzzle, base model), each method's accuracy (%) ours (± std) and the
    paper's in columns (Original = the base model).

    Each puzzle has its own models (v2: ARC-AGI on Qwen2.5-14B-Instruct, Sudoku on a 3B model): a row for every
    model of ours on that puzzle and every model the paper reports it for (ours blank without a run), so the
    published numbers are always in the table. ``not_run``: the text of the cells of runs left out (e.g. ``not run:
    no sandbox on this machine``), whose puzzles and models get rows too."""
    not_run = not_run or {}
    stats = accuracy_stats(metrics)
    ours = [*stats.index, *not_run]
    present = [t for t in tasks if any(t == tt for tt, _, _ in ours)]
    methods = method_order({m for t, _, m in ours if t in present}
                           | {m for t in present for b in published_blocks(published, t)
                              for v in (b.get("models") or {}).values() for m in (v or {})})
    records = []
    for task in present:
        keys = list(dict.fromkeys(m for t, m, _ in ours if t == task))
        keys += [m for b in published_blocks(published, task) for m in (b.get("models") or {}) if m not in keys]
        for model in [k for k in models if k in keys] + sorted(set(keys) - set(models)):
            rec: dict[str, Any] = {"Task": TASK_LABELS.get(task, task), "Model": _display(models, model)}
            for method in methods:
                label = "Original" if method == "base" else method_label(method)
                rec[f"{label} (ours)"], rec[f"{label} (ours){STD_SUFFIX}"] = _ours(stats, not_run, task, model, method)
                rec[f"{label} (paper)"] = paper_value(published, task, model, method)
            records.append(rec)
    return pd.DataFrame(records)


def also_reported_notes(published: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]],
                        tasks: Sequence[str] = ("sudoku", "arc")) -> list[str]:
    """One note per puzzle block whose numbers another place of the paper gives differently (``also_reported``):
    where the table's paper columns come from, and the other place's numbers."""
    out = []
    for task in tasks:
        for block in published_blocks(published, task):
            for other in block.get("also_reported") or []:
                for model, values in (other.get("models") or {}).items():
                    given = ", ".join(f"{method_label(m)} {float(v):g}" for m, v in values.items())
                    out.append(f"{TASK_LABELS.get(task, task)}, {_display(models, model)}: the paper columns are "
                               f"{block['provenance'].get('version', '')} {block['provenance']['table']}; "
                               f"{other['place']} gives {given} for the same experiment.".replace("  ", " "))
    return out


def build_puzzle_table(metric_paths: Iterable[PathLike], published_path: PathLike,
                       models: Mapping[str, Mapping[str, Any]], out_stem: PathLike, notes: Sequence[str] = (),
                       not_run: NotRunCells | None = None) -> pd.DataFrame:
    """Load metrics, build :func:`puzzle_table` and write it (csv, md, tex)."""
    published = load_published(published_path)
    df = puzzle_table(load_metrics(metric_paths), published, models, not_run=not_run)
    write_table(df, out_stem, "Puzzles: test accuracy (%) before (Original) and after fine-tuning, ours beside the "
                "paper's", ["Sudoku: solved puzzles (Reasoning Gym's score 1.0); ARC-AGI: the model's transform "
                            "program, run in a sandbox, returns the exact output grid (pass@1, greedy, one score per "
                            "test input). Ours: mean over seeds (± sample std with more than one seed); blank: no run "
                            "or not reported.", *also_reported_notes(published, models), *notes])
    return df


# --- cross-run stability ---------------------------------------------------------------------------------------------
def stability_table(metrics: pd.DataFrame, models: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (test set, model, method) with at least two seeds: seeds, mean, std, min, max and range (%)."""
    stats = accuracy_stats(metrics)
    records = []
    tasks = list(dict.fromkeys(t for t, _, _ in stats.index))
    for task in tasks:
        keys = list(dict.fromkeys(m for t, m, _ in stats.index if t == task))
        for model in [k for k in models if k in keys] + sorted(set(keys) - set(models)):
            for method in method_order(m for t, mm, m in stats.index if t == task and mm == model):
                row = stats.loc[(task, model, method)]
                if row["count"] < 2:
                    continue
                records.append({"Test set": TASK_LABELS.get(task, task), "Model": _display(models, model),
                                "Method": method_label(method), "Seeds": int(row["count"]),
                                "Mean": float(row["mean"]), "Std": float(row["std"]), "Min": float(row["min"]),
                                "Max": float(row["max"]), "Range": float(row["max"] - row["min"])})
    return pd.DataFrame(records, columns=["Test set", "Model", "Method", "Seeds", "Mean", "Std", "Min", "Max",
                                          "Range"])


def build_stability_table(metric_paths: Iterable[PathLike], models: Mapping[str, Mapping[str, Any]],
                          out_stem: PathLike, notes: Sequence[str] = ()) -> pd.DataFrame:
    """Load metrics, build :func:`stability_table` and write it (csv, md, tex)."""
    df = stability_table(load_metrics(metric_paths), models)
    write_table(df, out_stem, "Cross-run stability: test accuracy (%) over seeds per method",
                ["Std: sample standard deviation over seeds; Range: max - min. This table is this reproduction's "
                 "own addition: the ES paper (v2) runs no Countdown experiment over several seeds. Its run-to-run "
                 "evidence is Table 2's four conciseness seeds (v2 Sec. 4.2: GRPO's reward standard deviation 15.5x "
                 "ES's), which the conciseness stability table (conciseness_stability) sets beside this run's "
                 "conciseness seeds.", *notes])
    return df


__all__ = ["build_math_table", "build_puzzle_table", "build_stability_table", "build_train_tasks_table",
           "math_table", "paper_value", "puzzle_table", "stability_table", "train_tasks_table"]
