"""This pipeline's own question beside the ES paper's Table 1: does low-rank ES (EGGROLL, arXiv 2511.16652) keep
full-rank ES's gain at an equal sample budget? Decided per model and rank against the control arm, full-rank ES
whose noise perturbs the same linear projections (``noise_on: linear``), so that rank alone separates the two.

Low-rank ES L keeps at least :data:`KEPT_SHARE` of the control arm C's gain over the base model B when
L - B >= s (C - B), that is when the contrast D = L - s C - (1 - s) B is positive. D is tested per problem (the
arms' and the base model's outcomes on the same test problems, bootstrapped) and, where each arm has two seeds or
more, over seeds (Welch: L's seeds against s C + (1 - s) B over C's). Neither EGGROLL nor ES v2 states a margin; a
share of the gain scales with it, where a fixed margin in points says nothing when the gain is small.
"""

from __future__ import annotations

from collections.abc import Mapping

from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import BY_KEY
from esrepro.report.claims.evidence import Evals
from esrepro.report.claims.rows import ClaimRow, fmt, why_of
from esrepro.report.verdicts import FAILS, HOLDS, NOT_RESOLVED, Interval, Outcome

NO_PAPER = "neither paper runs low-rank ES; EGGROLL's published runs are on RWKV models, none of Table 1's"
#: The share of the control arm's gain over the base model that low-rank ES must keep.
KEPT_SHARE = 0.8
BASE = "base"


def kept_gain_contrast(low: Mapping[str, float], control: Mapping[str, float], base: Mapping[str, float],
                       share: float = KEPT_SHARE) -> list[float]:
    """Per test problem answered by all three: D = L - share C - (1 - share) B (correctness averaged over seeds)."""
    ids = sorted(set(low) & set(control) & set(base))
    return [low[i] - share * control[i] - (1 - share) * base[i] for i in ids]


def kept_gain_outcome(label: str, boot: Interval, seeds: Interval | None) -> Outcome:
    """Holds when every interval on D lies above 0. Does not hold when the interval that covers the claim's noise
    lies below 0 at Holm's bound: the seed interval where there is one (training's run-to-run spread and the test
    problems'), else the problems' (one seed: the verdict is about those checkpoints). Not resolved otherwise."""
    parts = [f"{label}: {boot.text()} (problems)"] + ([f"{seeds.text()} (seeds)"] if seeds is not None else [])
    intervals = [boot] + ([seeds] if seeds is not None else [])
    decides = seeds if seeds is not None else boot
    if all(iv.lo > 0 for iv in intervals):
        return Outcome(HOLDS, "; ".join(parts) + ": above 0")
    if decides.against < 0:
        holm = " (Holm over the claim's cases)" if decides.refute_hi is not None else ""
        return Outcome(FAILS, "; ".join(parts) + f": below 0{holm}")
    return Outcome(NOT_RESOLVED, "; ".join(parts) + f": the estimate is {'above' if boot.estimate > 0 else 'at or below'}"
                   " 0 and the interval includes it")


def _case(evals: Evals, task: str, split: str, model: str, low: str, control: str, name: str,
          family: int) -> tuple[Outcome, str]:
    """One model and rank: the contrast's outcome, and its interval's text."""
    for method, what in ((low, name), (control, "the control arm"), (BASE, "the base model")):
        if not evals.seeds(task, split, model, method):
            return V.untestable(f"{what} not evaluated on {task}/{split}"), ""
    per = {m: evals.per_problem(task, split, model, m) for m in (low, control, BASE)}
    gain = [per[control][i] - per[BASE][i] for i in sorted(set(per[control]) & set(per[BASE]))]
    diffs = kept_gain_contrast(per[low], per[control], per[BASE])
    if not diffs or not gain:
        return V.untestable("no per-problem results (responses.jsonl) to pair"), ""
    gained = V.bootstrap_margin([gain])
    if gained.lo <= 0:
        return Outcome(NOT_RESOLVED, f"the control arm's gain over the base model is not established: "
                       f"{gained.text()} (problems)"), f"control gain {gained.text()} (problems)"
    boot = V.bootstrap_margin([diffs], family=family)
    base = evals.mean(task, split, model, BASE)
    control_seeds = [KEPT_SHARE * c + (1 - KEPT_SHARE) * base for c in evals.seeds(task, split, model, control)]
    seeds = V.seed_interval(evals.seeds(task, split, model, low), control_seeds, family=family)
    label = f"{name} - {KEPT_SHARE:g} control - {1 - KEPT_SHARE:g} base"
    outcome = kept_gain_outcome(label, boot, seeds)
    evals.margins.append({"comparison": f"{label} ({model})", "estimate": boot.estimate, "problems_lo": boot.lo,
                          "problems_hi": boot.hi, "seeds_lo": seeds.lo if seeds else float("nan"),
                          "seeds_hi": seeds.hi if seeds else float("nan"), "null": 0.0, "rule": outcome.verdict})
    return outcome, f"{boot.text()} (problems)" + (f"; {seeds.text()} (seeds)" if seeds else "")


def matches_row(evals: Evals, display: Mapping[str, str], variants: Mapping[str, str], controls: Mapping[str, str],
                task: str, split: str) -> ClaimRow:
    """Every model run with the control arm (the first of ``controls``, method key -> label) and each low-rank method
    of ``variants``: low-rank ES keeps at least :data:`KEPT_SHARE` of the control arm's gain over the base model, for
    every model and rank (refuted under Holm over the model-rank cases)."""
    claim = BY_KEY["eggroll_matches_es"]
    if not controls:
        return ClaimRow(claim, None, claim.title, NO_PAPER, "no control arm",
                        V.untestable("no control arm (ES with noise_on: linear) trains beside low-rank ES"),
                        "no control arm to compare with")
    control = next(iter(controls))
    models = sorted(set(evals.models(task, split, control)) | set(evals.models(task, split, "es")))
    cases, ours, intervals = [], [], []
    family = len(models) * max(1, len(variants))
    for model in models:
        name = display.get(model, model)
        parts = [f"{lab} {fmt(evals.mean(task, split, model, m))}"
                 for m, lab in (("base", "base"), (control, "control"), *variants.items())]
        for method, lab in variants.items():
            out, text = _case(evals, task, split, model, method, control, lab, family)
            cases.append((f"{name} {lab}", out))
            if text:
                intervals.append(f"{name} {lab}: {text}")
        ours.append(f"{name}: " + ", ".join(parts))
    outcome = V.combine(cases) if cases else V.untestable(f"no control-arm evaluations on {task}/{split}")
    return ClaimRow(claim, None, claim.title, NO_PAPER, "; ".join(ours) or "not run", outcome,
                    why_of(cases, "model-rank pairs"), "; ".join(intervals))
