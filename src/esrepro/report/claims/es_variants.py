"""This pipeline's own question beside the ES paper's Table 1: does low-rank ES (EGGROLL, arXiv 2511.16652) match
full-rank ES at an equal sample budget? Decided as non-inferiority per model and rank, with the math claims' margin
(neither EGGROLL nor ES v2 states one)."""

from __future__ import annotations

from collections.abc import Mapping

from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import BY_KEY
from esrepro.report.claims.evidence import Evals
from esrepro.report.claims.math_puzzles import COMPETITIVE_MARGIN
from esrepro.report.claims.rows import ClaimRow, compare, fmt, why_of

NO_PAPER = "neither paper runs low-rank ES; EGGROLL's published runs are on RWKV models, none of Table 1's"


def matches_row(evals: Evals, display: Mapping[str, str], variants: Mapping[str, str], task: str,
                split: str) -> ClaimRow:
    """Every model run with full-rank ES and each low-rank method of ``variants`` (method key -> label): the margin
    low-rank - full-rank clears -:data:`COMPETITIVE_MARGIN` points (rule 2), for every model and rank."""
    claim = BY_KEY["eggroll_matches_es"]
    cases, ours, intervals = [], [], []
    family = len(evals.models(task, split, "es")) * max(1, len(variants))
    for model in evals.models(task, split, "es"):
        name = display.get(model, model)
        parts = [f"ES {fmt(evals.mean(task, split, model, 'es'))}"]
        for method, lab in variants.items():
            key = f"{name} {lab}"
            if not evals.seeds(task, split, model, method):
                cases.append((key, V.untestable(f"{lab} not run on {name}")))
                continue
            out, text = compare(evals, [(task, split)], (model, method), (model, "es"), f"{lab} - ES on {name}",
                                null=-COMPETITIVE_MARGIN, family=family)
            cases.append((key, out))
            parts.append(f"{lab} {fmt(evals.mean(task, split, model, method))}")
            intervals.append(f"{key}: {text}")
        ours.append(f"{name}: " + ", ".join(parts))
    outcome = V.combine(cases) if cases else V.untestable(f"no ES and low-rank ES evaluations on {task}/{split}")
    return ClaimRow(claim, None, claim.title, NO_PAPER, "; ".join(ours) or "not run", outcome,
                    why_of(cases, "model-rank pairs"), "; ".join(intervals))
