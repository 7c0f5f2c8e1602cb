"""The ES paper's v1 claim that ES works on the smallest model, where RL does not (v1 Sec. 4.1: on Qwen2.5-0.5B,
PPO and GRPO 0.3%, ES 14.4%): on the smallest Table 1 model, ES above the original model and above each of v1's RL
baselines (PPO, GRPO with groups of 8 and 30; v1 had no VERL variants)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import BY_KEY, V1_RL
from esrepro.report.claims.evidence import Evals
from esrepro.report.claims.rows import ClaimRow, compare, fmt, label, why_of


def small_model_row(evals: Evals, published: Mapping[str, Any], display: Mapping[str, str], model: str | None,
                    task: str, split: str) -> ClaimRow:
    """ES - Original and ES - each v1 RL baseline on ``model`` clear 0 (rule 2, Holm over the comparisons)."""
    claim = BY_KEY["es_small_models_v1"]
    paper = "Qwen2.5-0.5B: PPO and GRPO 0.3%, ES 14.4% (v1 Table 1)"
    if model is None or not evals.seeds(task, split, model, "es"):
        return ClaimRow(claim, None, claim.title, paper, "not run", V.untestable("ES not evaluated on the smallest "
                                                                                 "Table 1 model"), "not run")
    name = display.get(model, model)
    others = [m for m in ("base", *V1_RL) if evals.seeds(task, split, model, m)]
    cases, intervals = [], []
    for m in ("base", *V1_RL):
        if m not in others:
            cases.append((label(m), V.untestable(f"{label(m)} not run on {name}")))
            continue
        out, text = compare(evals, [(task, split)], (model, "es"), (model, m), f"ES - {label(m)} on {name}",
                            family=len(others))
        cases.append((label(m), out))
        intervals.append(f"ES - {label(m)}: {text}")
    ours = f"{name}: " + ", ".join(f"{label(m)} {fmt(evals.mean(task, split, model, m))}" for m in ("es", *others))
    return ClaimRow(claim, model, claim.title, paper, ours, V.combine(cases), why_of(cases, "comparisons"),
                    "; ".join(intervals))
