"""A claim's row as the rules build it, and what every row builder shares: the comparison of two methods' accuracy
(rule 2), the short words a table cell can hold, and whether this run reproduces the paper's numbers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from esrepro.report import verdicts as V
from esrepro.report.claims.catalogue import Claim, row_id
from esrepro.report.claims.evidence import Evals
from esrepro.report.verdicts import FAILS, HOLDS, NOT_RESOLVED, UNTESTABLE, Outcome

#: Method labels as the papers print them (v2 Table 1, Fig. 2).
METHOD_LABELS = {"base": "Original", "ppo": "PPO-z", "grpo8": "GRPO-z (8)", "grpo30": "GRPO-z (30)",
                 "grpov": "GRPO-v", "drgrpov": "Dr.GRPO-v", "es": "ES", "esckpt2": "ES (ckpt 2)",
                 "esckpt3": "ES (ckpt 3)"}
#: Two-sided 95% normal quantile.
Z95 = 1.959963984540054
YES, NO, NO_NUMBER, NOT_RUN = "yes", "no", "no paper number", "not run"


@dataclass
class ClaimRow:
    """One row of the claims table before the scale gate: the claim, the paper's and this run's evidence in short
    words, whether this run reproduces the paper's numbers, the interval, the rule's outcome and a short why."""

    claim: Claim
    model: str | None
    title: str
    paper: str
    ours: str
    outcome: Outcome
    why: str
    interval: str = ""
    reproduced: str = NO_NUMBER
    reproduced_detail: str = ""
    wall: str = ""
    seeds: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return row_id(self.claim.key, self.model)


def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


#: What a row decided on one training seed per arm certifies (docs/claims.md, "Seeds").
ONE_SEED = "one seed: certifies these checkpoints, not run-to-run spread"
NO_SEEDS = "no trained run"


def _count(counts: Sequence[int]) -> str:
    lo, hi = min(counts), max(counts)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def seeds_text(arms: Mapping[str, Sequence[int]]) -> str:
    """The Seeds cell: the training seeds of each arm (:func:`esrepro.report.claims.evidence.arm_seeds`), one number
    when every arm has as many ("3 seeds each"), else per arm ("ES 3, PPO-z 1"; more than three arms alike are
    counted), and what a single seed means."""
    if not arms:
        return NO_SEEDS
    counts = {method: _count(c) for method, c in arms.items()}
    values = list(dict.fromkeys(counts.values()))
    if len(values) == 1:
        n = values[0]
        text = f"{n} seed{'' if n == '1' else 's'}" + (" each" if len(counts) > 1 else "")
    else:
        groups = []
        for n in sorted(values, key=lambda v: -int(v.split("-")[-1])):
            names = [label(m) for m, c in counts.items() if c == n]
            groups.append(", ".join(f"{m} {n}" for m in names) if len(names) <= 3 else f"{len(names)} arms {n} each")
        text = ", ".join(groups)
    single = min(min(c) for c in arms.values()) == 1
    return f"{text} ({ONE_SEED})" if single else text


def why_of(cases: Sequence[tuple[str, Outcome]], unit: str) -> str:
    """A short sentence over a claim's cases: how many hold, and the names of those that do not."""
    if not cases:
        return "nothing to test"
    parts = []
    for verdict, word in ((FAILS, "does not hold"), (NOT_RESOLVED, "not resolved"), (UNTESTABLE, "not testable")):
        names = [k for k, o in cases if o.verdict == verdict]
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            parts.append(f"{word}: {', '.join(names[:3])}{more}")
    held = sum(o.verdict == HOLDS for _, o in cases)
    tested = sum(o.verdict != UNTESTABLE for _, o in cases)
    lead = [f"holds for {held} of {len(cases)} {unit}"] if tested else []
    return "; ".join([*lead, *parts])


def compare(evals: Evals, strata: Sequence[tuple[str, str]], a: tuple[str, str], b: tuple[str, str],
            name: str, null: float = 0.0, family: int = 1) -> tuple[Outcome, str]:
    """Rule 2 on the margin A - B ((model, method) each) over test sets ``strata`` ((task, split) pairs): the outcome
    and the interval's text. Not testable when a side has no evaluation, or no per-problem results on a set.
    ``family``: the claim's number of cases (refuted under Holm, rule 5 of :mod:`esrepro.report.verdicts`)."""
    for task, split in strata:
        for model, method in (a, b):
            if not evals.seeds(task, split, model, method):
                return V.untestable(f"{name}: {label(method)} of {model} not evaluated on {task}/{split}"), ""
    diffs = [_paired(evals.per_problem(t, s, *a), evals.per_problem(t, s, *b)) for t, s in strata]
    if any(len(d) == 0 for d in diffs):
        return V.untestable(f"{name}: no per-problem results (responses.jsonl) to pair"), ""
    boot = V.bootstrap_margin(diffs, family=family)
    seeds = None
    if len(strata) == 1:
        (t, s), = strata
        seeds = V.seed_interval(evals.seeds(t, s, *a), evals.seeds(t, s, *b), family=family)
    text = f"{boot.text()} (problems)" + (f"; {seeds.text()} (seeds)" if seeds else "")
    outcome = V.margin_outcome(name, boot, seeds, null=null)
    evals.margins.append({"comparison": name, "estimate": boot.estimate, "problems_lo": boot.lo,
                          "problems_hi": boot.hi, "seeds_lo": seeds.lo if seeds else math.nan,
                          "seeds_hi": seeds.hi if seeds else math.nan, "null": null, "rule": outcome.verdict})
    return outcome, text


def _paired(a: Mapping[str, float], b: Mapping[str, float]) -> list[float]:
    return [a[i] - b[i] for i in sorted(set(a) & set(b))]


def binomial_diff_se(p: float, q: float, n: int) -> float:
    """The standard error of the difference of two independent binomial proportions ``p`` and ``q`` (fractions), each
    estimated on ``n`` problems."""
    return math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def accuracy_gap(ours: float, paper: float, n: int | None) -> float | None:
    """How far this run's accuracy (%) lies from the paper's, in standard errors of the difference of two independent
    binomial estimates on ``n`` problems (None: ``n`` unknown)."""
    if not n or math.isnan(ours):
        return None
    p, q = ours / 100.0, paper / 100.0
    se = binomial_diff_se(p, q, n)
    return abs(p - q) / se if se > 0 else (0.0 if abs(p - q) < 1e-9 else math.inf)


def mean_gap(ours: float, ours_std: float, ours_n: int, paper: float, paper_std: float, paper_n: int) -> float:
    """How far two means over seeds lie apart, in standard errors of their difference (each std over its seeds)."""
    se = math.sqrt((ours_std if ours_n > 1 and not math.isnan(ours_std) else 0.0) ** 2 / ours_n
                   + paper_std ** 2 / paper_n)
    return abs(ours - paper) / se if se > 0 else (0.0 if abs(ours - paper) < 1e-9 else math.inf)


def joint_z(k: int) -> float:
    """The two-sided normal quantile that keeps ``k`` comparisons within 95% together (Bonferroni: each at
    1 - 0.05 / k), so a faithful run's row of many numbers is not called unreproduced by chance."""
    from scipy.stats import norm

    return float(norm.ppf(1 - 0.025 / max(1, k)))


def reproduced_of(checks: Sequence[tuple[str, float | bool | None]]) -> tuple[str, str]:
    """The Reproduced cell and its detail from (what, gap) checks: a gap in standard errors (:func:`accuracy_gap`,
    :func:`mean_gap`), judged against :func:`joint_z` of the row's numbers, or a yes/no match. ``yes`` when every
    checked number agrees, ``no`` naming those that do not; ``not run`` when nothing could be checked."""
    if not checks:
        return NO_NUMBER, ""
    tested = [(k, v) for k, v in checks if v is not None]
    if not tested:
        return NOT_RUN, "; ".join(k for k, _ in checks)
    numeric = [v for _, v in tested if not isinstance(v, bool)]
    z = joint_z(len(numeric))
    off = [k for k, v in tested if (v is False) or (not isinstance(v, bool) and v > z)]
    if off:
        return NO, f"outside 95% (jointly, z {z:.2f}): " + "; ".join(off)
    return YES, f"{len(tested)} of {len(checks)} numbers within 95% (jointly, z {z:.2f})"
