"""Result tables: our metrics next to the paper's published numbers.

Numbers stay numeric in every DataFrame built here; formatting (one decimal,
``mean ± std``, blanks for missing values) happens only in :func:`write_table`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from esrepro.io import read_json, write_json, write_text
from esrepro.settings.methods import with_former_names

#: Method key -> column label, in table order: the ES paper v2's Table 1 (Original, its RL columns, ES; the "-z" runs
#: on TinyZero / GRPO-Zero, the "-v" runs on VERL; App. A.2).
METHOD_COLUMNS: dict[str, str] = {
    "base": "Original",
    "ppo": "PPO-z",
    "grpo8": "GRPO-z (8)",
    "grpo30": "GRPO-z (30)",
    "grpov": "GRPO-v",
    "drgrpov": "Dr.GRPO-v",
    "es": "ES",
}

#: The RL columns of Table 1, whose best per model is its "Best RL" column.
RL_COLUMNS: tuple[str, ...] = ("ppo", "grpo8", "grpo30", "grpov", "drgrpov")

#: Labels for method keys that are not table columns (e.g. Dr.GRPO on TRL, the ESSA study's runs).
METHOD_LABELS: dict[str, str] = {**METHOD_COLUMNS, "drgrpo": "Dr.GRPO", "grpo": "GRPO", "essa": "ESSA",
                                  "eggroll1": "EGGROLL (rank 1)", "eggroll4": "EGGROLL (rank 4)",
                                  "eslinear": "ES, linear projections only"}

#: Fields every metrics file must have.
REQUIRED_FIELDS: tuple[str, ...] = ("task", "split", "model", "method", "seed", "accuracy")

#: Suffix of a column holding the standard deviation of the column it extends.
STD_SUFFIX = " std"

TABLE1_KEY = "table1_countdown"

PathLike = str | os.PathLike


def load_metrics(paths: Iterable[PathLike]) -> pd.DataFrame:
    """Read evaluation-metrics JSON files into one DataFrame (one row per file).

    A ``path`` column records where each row came from. Raises ``ValueError``
    naming the file when a required field is missing or accuracy is not a
    fraction in [0, 1].
    """
    rows: list[dict[str, Any]] = []
    for path in paths:
        record = read_json(path)
        if not isinstance(record, dict):
            raise ValueError(f"{path}: metrics file must hold a JSON object")
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        if missing:
            raise ValueError(f"{path}: metrics file is missing field(s) {', '.join(missing)}")
        acc = record["accuracy"]
        if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not 0.0 <= acc <= 1.0:
            raise ValueError(f"{path}: accuracy must be a fraction in [0, 1], got {acc!r}")
        rows.append({**record, "path": str(path)})
    columns = list(REQUIRED_FIELDS) + ["path"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows)
    return df[columns + [c for c in df.columns if c not in columns]]


def load_published(path: PathLike) -> dict[str, Any]:
    """Load ``config/published.yaml``."""
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _table_block(published: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """Return one table's block from a whole published document (or the block itself)."""
    if "tables" in published:
        return published["tables"].get(key, {}) or {}
    return published


def _ours_col(label: str) -> str:
    return f"{label} (ours)"


def _paper_col(label: str) -> str:
    return f"{label} (paper)"


def table1(
    metrics: pd.DataFrame,
    published: Mapping[str, Any],
    models: Mapping[str, Mapping[str, Any]],
    task: str = "countdown",
    split: str = "test",
    *,
    include: Iterable[str] = (),
    methods: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Build Table 1: accuracy (%) per model, ours beside the paper's, per method.

    Rows: models of the registry ``models`` (in its order) that have metrics for
    ``task``/``split`` or are listed in ``include``; models with metrics but no
    registry entry follow, sorted, labelled by their key. The index is the model
    key; ``Model`` holds the display name. For each method of ``methods``
    (default :data:`METHOD_COLUMNS`) there are the columns ``"{label} (ours)"``
    (mean over seeds), ``"{label} (ours) std"`` (sample std, only with more
    than one seed) and ``"{label} (paper)"``; then ``"Best RL (paper)"`` and
    ``"Best RL method (paper)"``: the best of the paper's RL columns (:data:`RL_COLUMNS`;
    the first on ties). Missing values are NaN, never 0.
    ``published`` is the whole published document or its ``table1_countdown`` block.
    """
    methods = dict(METHOD_COLUMNS if methods is None else methods)
    block = _table_block(published, TABLE1_KEY)
    paper_models: Mapping[str, Mapping[str, Any]] = block.get("models", {}) or {}

    sel = metrics
    if len(sel):
        sel = sel[(sel["task"] == task) & (sel["split"] == split)]
        dup = sel.duplicated(subset=["model", "method", "seed"], keep=False)
        if dup.any():
            paths = ", ".join(sel.loc[dup, "path"].astype(str)) if "path" in sel else ""
            raise ValueError(f"duplicate (model, method, seed) metrics for {task}/{split}: {paths}")
    present = set(sel["model"]) if len(sel) else set()
    wanted = present | set(include)
    keys = [k for k in models if k in wanted] + sorted(wanted - set(models))

    stats = pd.DataFrame(columns=["mean", "std"])
    if len(sel):
        pct = sel.assign(pct=pd.to_numeric(sel["accuracy"]) * 100.0)
        stats = pct.groupby(["model", "method"])["pct"].agg(["mean", "std", "count"])

    def ours(model: str, method: str) -> tuple[float, float]:
        if (model, method) not in stats.index:
            return math.nan, math.nan
        row = stats.loc[(model, method)]
        std = float(row["std"]) if row["count"] > 1 else math.nan
        return float(row["mean"]), std

    records = []
    for key in keys:
        rec: dict[str, Any] = {"Model": (models.get(key) or {}).get("display", key)}
        for method, label in methods.items():
            mean, std = ours(key, method)
            rec[_ours_col(label)] = mean
            rec[_ours_col(label) + STD_SUFFIX] = std
            paper = (paper_models.get(key) or {}).get(method)
            rec[_paper_col(label)] = math.nan if paper is None else float(paper)
        rl = {m: float(v) for m, v in (paper_models.get(key) or {}).items() if m in RL_COLUMNS and v is not None}
        m = max(rl, key=lambda k: (rl[k], -RL_COLUMNS.index(k))) if rl else None
        rec["Best RL (paper)"] = rl[m] if m is not None else math.nan
        rec["Best RL method (paper)"] = METHOD_LABELS.get(m, m) if m is not None else None
        records.append(rec)

    columns = ["Model"]
    for label in methods.values():
        columns += [_ours_col(label), _ours_col(label) + STD_SUFFIX, _paper_col(label)]
    columns += ["Best RL (paper)", "Best RL method (paper)"]
    df = pd.DataFrame(records, columns=columns, index=pd.Index(keys, name="model"))
    numeric = [c for c in columns if c not in ("Model", "Best RL method (paper)")]
    df[numeric] = df[numeric].astype("float64")
    return df


# ---------------------------------------------------------------------------
# Writing

_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX special characters in plain text."""
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in str(text))


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _fmt(value: Any, decimals: int = 1) -> str:
    if _is_missing(value):
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.{decimals}f}"
    return str(value)


def _display_frame(df: pd.DataFrame, pm: str, decimals: int = 1) -> tuple[pd.DataFrame, list[bool]]:
    """Format ``df`` as strings; fold ``"{col} std"`` columns into ``col`` as ``mean{pm}std``.

    Returns the frame and, per column, whether it is numeric (for alignment).
    """
    out: dict[str, list[str]] = {}
    numeric: list[bool] = []
    for col in df.columns:
        if str(col).endswith(STD_SUFFIX) and str(col)[: -len(STD_SUFFIX)] in df.columns:
            continue
        std_col = f"{col}{STD_SUFFIX}"
        cells = []
        for i in range(len(df)):
            cell = _fmt(df[col].iloc[i], decimals)
            if std_col in df.columns and cell and not _is_missing(df[std_col].iloc[i]):
                cell = f"{cell}{pm}{_fmt(df[std_col].iloc[i], decimals)}"
            cells.append(cell)
        out[str(col)] = cells
        numeric.append(pd.api.types.is_numeric_dtype(df[col]))
    return pd.DataFrame(out, columns=list(out)), numeric


def to_markdown(df: pd.DataFrame, caption: str = "", notes: Sequence[str] = (), decimals: int = 1) -> str:
    """Render ``df`` as a Markdown pipe table with the caption above and notes below."""
    shown, numeric = _display_frame(df, " ± ", decimals)
    align = ["right" if n else "left" for n in numeric]
    # disable_numparse keeps "0.0" from turning into "0" and keeps blanks blank.
    body = shown.to_markdown(index=False, disable_numparse=True, colalign=align)
    parts = [f"**{caption}**", ""] if caption else []
    parts.append(body)
    for note in notes:
        parts += ["", note]
    return "\n".join(parts) + "\n"


_GROUPED = re.compile(r"^(?P<group>.+) \((?P<sub>[^()]+)\)$")


def _latex_header(columns: list[str]) -> list[str]:
    """Header rows; adjacent ``"G (a)"``, ``"G (b)"`` columns share a spanning ``G`` heading."""
    parsed = [_GROUPED.match(c) for c in columns]
    runs: list[tuple[str | None, list[int]]] = []
    for i, m in enumerate(parsed):
        group = m["group"] if m else None
        if group is not None and runs and runs[-1][0] == group:
            runs[-1][1].append(i)
        else:
            runs.append((group, [i]))
    if not any(len(idx) > 1 for g, idx in runs if g is not None):
        return [" & ".join(latex_escape(c) for c in columns) + r" \\"]
    top, rules, bottom = [], [], []
    for group, idx in runs:
        if len(idx) > 1:
            top.append(rf"\multicolumn{{{len(idx)}}}{{c}}{{{latex_escape(group)}}}")
            rules.append(rf"\cmidrule(lr){{{idx[0] + 1}-{idx[-1] + 1}}}")
            bottom += [latex_escape(parsed[i]["sub"]) for i in idx]
        else:
            top.append("")
            bottom.append(latex_escape(columns[idx[0]]))
    return [" & ".join(top) + r" \\", " ".join(rules), " & ".join(bottom) + r" \\"]


def to_latex(df: pd.DataFrame, caption: str = "", notes: Sequence[str] = (), decimals: int = 1) -> str:
    """Render ``df`` as a booktabs ``tabular`` inside a ``table`` float (hand-built, no jinja2)."""
    shown, numeric = _display_frame(df, " ± ", decimals)
    spec = "".join("r" if n else "l" for n in numeric)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{latex_escape(caption)}}}")
    lines += [rf"\begin{{tabular}}{{{spec}}}", r"\toprule"]
    lines += _latex_header(list(shown.columns))
    lines.append(r"\midrule")
    for row in shown.itertuples(index=False):
        lines.append(" & ".join(latex_escape(c) for c in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if notes:
        lines.append(r"\par\smallskip")
        lines.append(r"{\footnotesize " + r" \\ ".join(latex_escape(n) for n in notes) + "}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def write_table(
    df: pd.DataFrame,
    out_stem: PathLike,
    caption: str,
    notes: Sequence[str] = (),
    decimals: int = 1,
) -> list[Path]:
    """Write ``{out_stem}.csv``, ``.md`` and ``.tex`` atomically; numbers to ``decimals`` decimals.

    The CSV keeps every column (std columns separate, blanks for missing) and the
    index when it is named; Markdown and LaTeX show ``mean ± std`` in one cell,
    omit the index, and carry the caption and ``notes``. Returns the paths written.
    """
    stem = Path(out_stem)
    paths = [stem.with_name(stem.name + ext) for ext in (".csv", ".md", ".tex")]
    csv = df.to_csv(index=df.index.name is not None, float_format=f"%.{decimals}f", lineterminator="\n")
    write_text(paths[0], csv)
    write_text(paths[1], to_markdown(df, caption, notes, decimals))
    write_text(paths[2], to_latex(df, caption, notes, decimals))
    return paths


def build_table1(
    metrics_paths: Iterable[PathLike],
    published_path: PathLike,
    models: Mapping[str, Mapping[str, Any]],
    out_stem: PathLike,
    notes: Sequence[str] = (),
    *,
    task: str = "countdown",
    split: str = "test",
    include: Iterable[str] = (),
) -> pd.DataFrame:
    """Load metrics and published numbers, build Table 1 and write it; returns the table."""
    published = load_published(published_path)
    metrics = load_metrics(metrics_paths)
    df = table1(metrics, published, models, task, split, include=include)
    block = _table_block(published, TABLE1_KEY)
    prov = block.get("provenance", {}) or {}
    caption = f"{task.capitalize()} {split} accuracy (%): this reproduction (ours) and the paper"
    default_notes = []
    if prov:
        default_notes.append(
            f"Paper columns: arXiv {prov.get('arxiv', '?')}{prov.get('version', '')}, "
            f"{prov.get('table', '?')}; best RL: the best of its RL columns. -z: TinyZero (PPO) and GRPO-Zero (GRPO, "
            "groups of 8 and 30) in the paper; -v: VERL with its math-reasoning defaults in the paper, TRL set to "
            "VERL's semantics here."
        )
    default_notes.append("Ours: mean over seeds (± sample std with more than one seed); blank: no run or not reported.")
    write_table(df, out_stem, caption, [*default_notes, *notes])
    write_json(Path(f"{out_stem}.metrics.json"), headline_metrics(metrics, task, split))
    return df


def headline_metrics(metrics: pd.DataFrame, task: str, split: str) -> dict[str, dict[str, float]]:
    """``{model: {method: accuracy_percent}}``, mean over seeds: what ``dvc metrics show`` reads."""
    rows = metrics[(metrics["task"] == task) & (metrics["split"] == split)]
    out: dict[str, dict[str, float]] = {}
    for (model, method), group in rows.groupby(["model", "method"], sort=True):
        out.setdefault(str(model), {})[str(method)] = round(float(group["accuracy"].mean()) * 100, 2)
    return out

# ---------------------------------------------------------------------------
# Table 3: RL hyperparameter selection

TABLE3_COLUMNS = ("Task", "Model", "Method", "Seed", "Grid", "Selected", "Training reward", "Cells", "Steps",
                  "Samples per step")


def _fmt_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _as_shown(r: Mapping[str, Any]) -> dict[str, Any]:
    """A selection record with its settings under the names Table 3 has always shown (FORMER_NAMES)."""
    algorithm = (r.get("settings") or {}).get("algorithm", r["method"])
    grid = with_former_names(algorithm, r.get("grid"))
    if grid.get("cells"):
        grid["cells"] = [with_former_names(algorithm, c) for c in grid["cells"]]
    return {**r, "grid": grid, "settings": with_former_names(algorithm, r.get("settings")),
            "winner_settings": with_former_names(algorithm, r.get("winner_settings"))}


def table3(selections: Sequence[Mapping[str, Any]], models: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (model, method, seed): the grid searched, the selected cell, its training reward.

    ``selections`` are selection records (``selection.json``) with ``model``, ``method`` and
    ``seed`` added. Rows follow the registry's model order, then Table 1's method order.
    """
    order = list(METHOD_COLUMNS)
    tasks = list(dict.fromkeys(r.get("task", "") for r in selections))
    keyed = sorted(selections, key=lambda r: (tasks.index(r.get("task", "")),
                                              list(models).index(r["model"]) if r["model"] in models else len(models),
                                              order.index(r["method"]) if r["method"] in order else len(order),
                                              r["method"], r["seed"]))
    rows = []
    for r in map(_as_shown, keyed):
        grid = dict(r.get("grid") or {})
        extra_cells = grid.pop("cells", None) or []
        settings = r.get("settings") or {}
        budget = r.get("budget") or {}
        grid_text = "; ".join(f"{k} in {{{', '.join(_fmt_value(v) for v in vals)}}}" for k, vals in grid.items())
        if extra_cells:  # v2: explicit cells beside the product (e.g. the authors' GRPO-Zero settings)
            grid_text += ("; " if grid_text else "") + "plus " + "; ".join(
                "{" + ", ".join(f"{k}={_fmt_value(v)}" for k, v in c.items()) + "}" for c in extra_cells)
        varied = set(grid) | {k for c in extra_cells for k in c}
        # names as shown (_as_shown): PPO's KL coefficient is kl_coef here, GRPO's beta
        fixed = ", ".join(f"{k}={_fmt_value(settings[k])}" for k in ("learning_rate", "beta", "actor_learning_rate",
                                                                     "critic_learning_rate", "kl_coef")
                          if k in settings and k not in varied)
        rows.append({
            "Task": r.get("task", ""),
            "Model": (models.get(r["model"]) or {}).get("display", r["model"]),
            "Method": METHOD_LABELS.get(r["method"], r["method"]),
            "Seed": r["seed"],
            "Grid": grid_text or "(none)",
            "Selected": ", ".join(f"{k}={_fmt_value(v)}" for k, v in (r.get("winner_settings") or {}).items())
                        + (("; " if varied else "") + fixed if fixed else ""),
            "Training reward": f"{r['train_reward']:.4f}",
            "Cells": len(r.get("cells", [])),
            "Steps": budget.get("steps"),
            "Samples per step": budget.get("samples_per_step"),
        })
    return pd.DataFrame(rows, columns=list(TABLE3_COLUMNS))


def build_table3(selection_paths: Iterable[PathLike], models: Mapping[str, Mapping[str, Any]],
                 out_stem: PathLike) -> pd.DataFrame:
    """Read every RL run's ``selection.json`` and write ``{out_stem}.csv``, ``.md`` and ``.tex``."""
    records = []
    for path in selection_paths:
        rec = dict(read_json(path))
        parts = Path(path).parts  # results/runs/{task}/{model}/{method}/seed{s}/selection.json
        rec.update(task=parts[-5] if len(parts) >= 5 else "", model=parts[-4], method=parts[-3],
                   seed=int(parts[-2].removeprefix("seed")))
        records.append(rec)
    df = table3(records, models)
    stem = Path(out_stem)
    write_text(stem.with_name(stem.name + ".csv"), df.to_csv(index=False, lineterminator="\n"))
    caption = ("RL hyperparameters: each task's and model's grid and the cell kept (best final training reward)")
    notes = ["Training reward: mean reward over the last quarter of the run's steps (Task.score, the reward ES "
             "optimises). Grids live in the model registry (config/models.yaml, methods.<method>.grid).",
             "The paper (v2 Table 4, App. A.2): PPO-z and GRPO-z over the (KL beta, learning rate) pairs (1e-3, 1e-6), "
             "(1e-3, 1e-5), (5e-3, 1e-6), (5e-3, 1e-5), the best kept per model; GRPO-v and Dr.GRPO-v with VERL's "
             "defaults, no sweep."]
    body = df.astype(str).to_markdown(index=False, disable_numparse=True)
    write_text(stem.with_name(stem.name + ".md"), "\n".join([f"**{caption}**", "", body, "", *notes]) + "\n")
    write_text(stem.with_name(stem.name + ".tex"), to_latex(df.astype(str), caption, notes))
    return df
