"""Beyond the papers: low-rank ES (EGGROLL, Sarkar et al., arXiv 2511.16652) beside full-rank ES on Table 1's task,
at equal training-sample budgets. One row per model and method: its rank, population, iterations and samples, the
seeds run, the original model's accuracy, the method's test accuracy (mean and std over seeds) and its difference
from full-rank ES's mean. The interval and the verdict of "low-rank ES keeps full-rank ES's gain" are the claims table's
(:mod:`esrepro.report.claims.es_variants`)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from esrepro.report.tables import load_metrics, write_table
from esrepro.report.task_tables import accuracy_stats

PathLike = str | os.PathLike
COLUMNS = ("Model", "Method", "Rank", "Population", "Iterations", "Samples", "Seeds", "Original", "Accuracy",
           "Accuracy std", "Δ vs ES")
CAPTION = "Low-rank ES (EGGROLL) beside full-rank ES at equal sample budgets: test accuracy (%)"


def es_variants_table(metrics: pd.DataFrame, spec: Mapping[str, Any],
                      models: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run of ``spec["runs"]`` (:func:`esrepro.planning.specs.es_variants_spec`): accuracy on ``spec``'s task and
    split, mean and sample std over the seeds evaluated, and the mean's difference from the same model's ES mean
    (blank for ES itself, and where either side has no evaluation). A run with no evaluation keeps its row, blank."""
    task, split = spec["task"], spec["split"]
    stats = accuracy_stats(metrics[metrics["split"] == split])

    def stat(model: str, method: str, column: str) -> float:
        key = (task, model, method)
        return float(stats.loc[key, column]) if key in stats.index else math.nan

    records = []
    for run in spec["runs"]:
        model, method = run["model"], run["method"]
        mean = stat(model, method, "mean")
        seeds = stat(model, method, "count")
        records.append({
            "Model": (models.get(model) or {}).get("display", model), "Method": run["label"],
            "Rank": "full" if run["rank"] is None else str(run["rank"]), "Population": int(run["population"]),
            "Iterations": int(run["iterations"]), "Samples": int(run["samples"]),
            "Seeds": 0 if math.isnan(seeds) else int(seeds), "Original": stat(model, "base", "mean"),
            "Accuracy": mean, "Accuracy std": stat(model, method, "std"),
            "Δ vs ES": mean - stat(model, "es", "mean") if method != "es" else math.nan})
    return pd.DataFrame(records, columns=list(COLUMNS))


def notes_of(spec: Mapping[str, Any]) -> list[str]:
    """The table's notes: what the methods are, the equal budget and where the interval and verdict live."""
    es = [r for r in spec["runs"] if r["rank"] is None]
    sigma = ", ".join(sorted({f"sigma {r['sigma']:g}, alpha {r['alpha']:g}" for r in es})) or "ES's"
    return [
        "Neither paper runs low-rank ES: these rows are this pipeline's question beside ES v2 Table 1. EGGROLL "
        "perturbs each linear projection W of the decoder by A Bᵀ/√r (A, B Gaussian, r the rank; no noise on norms, "
        "biases and embeddings) where ES perturbs every weight; both use " + sigma + ", the same seeds and the same "
        "training problems. Samples: iterations x population x problems per iteration, equal for every row of a "
        "model.",
        "Δ vs ES: this row's mean minus full-rank ES's mean (points). The claims table decides whether low-rank ES "
        "keeps at least 80% of the control arm's gain over the base model, over problems and seeds. EGGROLL's own published runs are on RWKV "
        "models, none of these, so no published number stands beside these rows.",
    ] + ([
        "ES, linear projections only (the control arm): full-rank ES whose noise perturbs the same linear projections "
        "as EGGROLL, each keyed as ES keys it, and nothing else: it differs from EGGROLL by the noise's rank alone, and "
        "from ES by the parameters perturbed."] if any(r["rank"] is None and r.get("noise_on") == "linear"
                                                       for r in spec["runs"]) else [])


def build_es_variants_table(metric_paths: Iterable[PathLike], spec: Mapping[str, Any],
                            models: Mapping[str, Mapping[str, Any]], out_stem: PathLike,
                            notes: Sequence[str] = ()) -> pd.DataFrame:
    """Load metrics, build :func:`es_variants_table` and write it (csv, md, tex)."""
    df = es_variants_table(load_metrics(metric_paths), spec, models)
    write_table(df, out_stem, CAPTION, [*notes_of(spec), *notes])
    return df


__all__ = ["build_es_variants_table", "es_variants_table", "notes_of"]
