"""The analysis report: a papermill-parameterised notebook, executed and rendered to HTML.

:func:`execute_report` runs ``workflow/notebooks/analysis.ipynb`` in a kernel of *this*
interpreter (no user-level ``jupyter kernelspec install`` needed, none consulted) and writes
the executed notebook and a self-contained HTML page (images embedded), both atomically and
without timestamps. The helpers below are what the notebook itself calls, so its logic is
importable and tested: per-task summaries of the evaluation metrics, and "ours beside the
paper" views of the result tables.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from esrepro.io import atomic_path, read_json, write_text

PathLike = str | os.PathLike

#: The kernel name papermill asks for. It is resolved to this interpreter by a kernelspec
#: written into a temporary JUPYTER_PATH entry (searched before the user's and the venv's),
#: so the executed notebook's metadata keeps the portable name ``python3``.
KERNEL_NAME = "python3"
KERNEL_DISPLAY_NAME = "Python 3 (ipykernel)"

#: Per-cell and per-notebook papermill fields that hold wall-clock times.
_TIME_FIELDS = ("start_time", "end_time", "duration")

_OURS = re.compile(r"^(?P<label>.+) \(ours\)$")
_PAPER = re.compile(r"^(?P<label>.+) \(paper\)$")


# --------------------------------------------------------------------------- execution
@contextlib.contextmanager
def venv_kernel() -> Iterator[str]:
    """A ``python3`` kernelspec that launches ``sys.executable``, visible only inside the block.

    The spec lives in a temporary directory prepended to ``JUPYTER_PATH`` (which Jupyter
    searches before the user's and ``sys.prefix``'s data directories); nothing is installed.
    The kernel also gets a private ``IPYTHONDIR``, so no user IPython profile or startup
    script can change what the notebook prints.
    """
    with tempfile.TemporaryDirectory(prefix="esrepro-kernel-") as tmp:
        spec_dir = Path(tmp) / "kernels" / KERNEL_NAME
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": KERNEL_DISPLAY_NAME,
            "language": "python",
            "env": {"IPYTHONDIR": str(Path(tmp) / "ipython"), "MPLBACKEND": "Agg", "PYDEVD_DISABLE_FILE_VALIDATION": "1"},
            "metadata": {"debugger": False},
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join([tmp, *([old] if old else [])])
        try:
            yield KERNEL_NAME
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


def scrub(nb: Any, input_path: str, output_path: str) -> Any:
    """Drop wall-clock times and random ids from an executed notebook (papermill's and nbclient's)."""
    meta = nb.metadata.get("papermill")
    if meta is not None:
        for key in _TIME_FIELDS:
            meta.pop(key, None)
        meta["input_path"] = input_path
        meta["output_path"] = output_path
    if "kernelspec" in nb.metadata:
        nb.metadata["kernelspec"]["display_name"] = KERNEL_DISPLAY_NAME
    for cell in nb.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell["id"] = "injected-parameters"  # papermill gives it a random id
        cell.metadata.pop("execution", None)
        for key in _TIME_FIELDS:
            cell.metadata.get("papermill", {}).pop(key, None)
    return nb


def to_html(nb: Any, title: str, show_code: bool = False) -> str:
    """Render an executed notebook as one HTML page; images are embedded as data URIs."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", embed_images=True, exclude_input=not show_code,
                            exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    return body


def execute_report(notebook: PathLike, out_ipynb: PathLike, out_html: PathLike, parameters: dict,
                   *, cwd: PathLike | None = None, timeout: int = 600, show_code: bool = False) -> None:
    """Execute ``notebook`` with papermill ``parameters``; write the notebook and its HTML.

    The kernel is this interpreter (see :func:`venv_kernel`); relative paths in
    ``parameters`` are relative to ``cwd`` (default: the current directory). A failing
    cell raises papermill's ``PapermillExecutionError`` (with the cell's traceback) and
    writes nothing. Both outputs are written atomically, without timestamps.
    """
    import nbformat
    import papermill

    with venv_kernel() as kernel:
        nb = papermill.execute_notebook(
            str(notebook), None, parameters=dict(parameters), kernel_name=kernel, language="python",
            progress_bar=False, log_output=False, request_save_on_cell_execute=False,
            cwd=None if cwd is None else str(cwd), start_timeout=120, execution_timeout=timeout,
        )
    nb = scrub(nb, str(notebook), str(out_ipynb))
    html = to_html(nb, Path(out_ipynb).stem, show_code=show_code)
    with atomic_path(out_ipynb) as tmp:
        nbformat.write(nb, str(tmp))
    write_text(out_html, html)


# --------------------------------------------------------------------------- helpers the notebook calls
def load_eval_metrics(eval_dir: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """Every evaluation ``metrics.json`` (all under ``eval_dir``, or the files given) as rows.

    Columns: task, split, model, method, seed, n, accuracy, then any other metric
    (mean_reward, truncated_prompts, ...) and ``path``. Sorted by task, model, method, seed.
    """
    if isinstance(eval_dir, (str, os.PathLike)):
        paths = sorted(Path(eval_dir).rglob("metrics.json"))
    else:
        paths = sorted(Path(p) for p in eval_dir)
    rows = []
    for path in paths:
        rec = read_json(path)
        if isinstance(rec, dict) and {"task", "model", "method", "accuracy"} <= set(rec):
            rows.append({**rec, "path": path.as_posix()})
    first = ["task", "split", "model", "method", "seed", "n", "accuracy"]
    if not rows:
        return pd.DataFrame(columns=[*first, "path"])
    df = pd.DataFrame(rows)
    cols = [c for c in first if c in df.columns]
    df = df[cols + sorted(c for c in df.columns if c not in cols and c != "path") + ["path"]]
    return df.sort_values(["task", "model", "method", "seed"], kind="stable").reset_index(drop=True)


def _paper_value(published: Mapping[str, Any] | None, task: str, model: str, method: str) -> float:
    """The paper's accuracy (%) for (task, model, method) from any published table of that task."""
    for block in ((published or {}).get("tables") or {}).values():
        if not isinstance(block, Mapping) or block.get("task") != task or block.get("metric", "accuracy") != "accuracy":
            continue
        value = ((block.get("models") or {}).get(model) or {}).get(method)
        if value is not None:
            return float(value)
    return math.nan


def task_summary(runs: pd.DataFrame, display: Mapping[str, str] | None = None,
                 published: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per (task, model, method): accuracy (%) mean and std over seeds, the paper's value.

    Columns: task, split, model (display name), method, seeds, n, accuracy %,
    accuracy % std (blank with one seed), paper %, and mean reward when the runs have it.
    """
    columns = ["task", "split", "model", "method", "seeds", "n", "accuracy %", "accuracy % std", "paper %"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    display = display or {}
    out = []
    for (task, model, method), grp in runs.groupby(["task", "model", "method"], sort=False):
        pct = pd.to_numeric(grp["accuracy"]) * 100.0
        row = {
            "task": task,
            "split": ",".join(sorted(set(map(str, grp["split"])))) if "split" in grp else "",
            "model": display.get(model, model),
            "method": method,
            "seeds": len(grp),
            "n": int(pd.to_numeric(grp["n"]).sum()) if "n" in grp else math.nan,
            "accuracy %": float(pct.mean()),
            "accuracy % std": float(pct.std()) if len(grp) > 1 else math.nan,
            "paper %": _paper_value(published, task, model, method),
        }
        if "mean_reward" in grp and grp["mean_reward"].notna().any():
            row["mean reward"] = float(pd.to_numeric(grp["mean_reward"]).mean())
        out.append(row)
    df = pd.DataFrame(out)
    return df[columns + [c for c in df.columns if c not in columns]]


def eval_summary(runs: pd.DataFrame, decimals: int = 3) -> dict[str, dict[str, dict[str, float]]]:
    """``{task: {model: {method: accuracy_percent}}}``, mean over seeds: the DVC metrics shape."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    if runs.empty:
        return out
    for (task, model, method), grp in runs.groupby(["task", "model", "method"], sort=True):
        pct = float(pd.to_numeric(grp["accuracy"]).mean()) * 100.0
        out.setdefault(task, {}).setdefault(model, {})[method] = round(pct, decimals)
    return out


def ours_vs_paper(table: pd.DataFrame) -> pd.DataFrame:
    """A result table's ``"X (ours)"`` / ``"X (paper)"`` column pairs as rows: model, method, ours, paper.

    Columns: Model, Method, ours, ours std, paper, ours - paper. Rows where neither number
    exists are dropped; non-numeric paper columns (e.g. a method name) are skipped.
    """
    labels: list[str] = []
    for col in table.columns:
        m = _OURS.match(str(col)) or _PAPER.match(str(col))
        if m and m["label"] not in labels and pd.api.types.is_numeric_dtype(table[col]):
            labels.append(m["label"])
    names = table["Model"] if "Model" in table.columns else table.iloc[:, 0]
    rows = []
    for i in range(len(table)):
        for label in labels:
            def get(col: str) -> float:
                if col not in table.columns:
                    return math.nan
                v = pd.to_numeric(table[col].iloc[i], errors="coerce")  # noqa: B023 - get() runs in this iteration
                return math.nan if pd.isna(v) else float(v)

            ours, std, paper = get(f"{label} (ours)"), get(f"{label} (ours) std"), get(f"{label} (paper)")
            if math.isnan(ours) and math.isnan(paper):
                continue
            rows.append({"Model": names.iloc[i], "Method": label, "ours": ours, "ours std": std, "paper": paper,
                         "ours - paper": ours - paper})
    return pd.DataFrame(rows, columns=["Model", "Method", "ours", "ours std", "paper", "ours - paper"])


def fmt(df: pd.DataFrame, decimals: int = 1) -> pd.DataFrame:
    """Numbers as text with ``decimals`` places, blanks for missing values (for display only)."""
    def cell(v: Any) -> Any:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, float):
            return f"{v:.{decimals}f}"
        return v

    return df.apply(lambda col: col.map(cell))


def folder_of(key: str, fallback: str):
    """For a Snakemake rule: a params function giving the deepest folder that holds all of the
    rule's ``key`` inputs (``fallback`` when there are none), i.e. the notebook's ``*_dir``."""

    def folder(wildcards: Any, input: Any) -> str:
        files = [str(f) for f in input[key]]
        if not files:
            return fallback
        return os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])

    return folder
