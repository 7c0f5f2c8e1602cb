"""The rules that turn evidence into a verdict on a paper's claim, and the intervals they read.

A verdict is one of :data:`HOLDS`, :data:`NOT_RESOLVED`, :data:`FAILS` ("does not hold") or :data:`UNTESTABLE` ("not
testable"), always with a reason. The vocabulary keeps confirmation and refutation apart: a claim **holds** when the
evidence confirms it (its interval clears the claim's null), is **not resolved** when the interval still includes the
null, and **does not hold** when the evidence is against it (the interval lies wholly on the far side of the null).
The rules, in the order :mod:`esrepro.report.claims` applies them:

1. **Not testable** when the evidence is not there: a method or model the claim compares was not run or not
   evaluated, a spread is asked for with fewer than two seeds, a sweep has fewer values than the claim needs.
2. **Margins** (``A beats B``; ``A is within d of B``): the margin is A's accuracy minus B's, in points. Its 95%
   interval is a paired percentile bootstrap over the test problems (:func:`bootstrap_margin`: each problem's
   correctness averaged over the method's seeds, problems resampled with replacement, 2,000 resamples, a fixed
   generator seed, so the table is reproducible); where both methods have two or more seeds, also a Welch
   t interval over seeds (:func:`seed_interval`). The null is 0 for "beats" and -d for "within d" (non-inferiority).
   **Holds** when the lower end of every interval is above the null, **does not hold** when the upper end of an
   interval is below it, **not resolved** otherwise (the reason says on which side the estimate lies).
3. **Ratios of spreads** (``A varies less than B``): the ratio of B's standard deviation over seeds to A's, with
   the 95% interval of a ratio of two normal standard deviations (:func:`std_ratio_interval`, F distribution);
   **holds** when its lower end is above 1, **does not hold** when its upper end is below 1, else not resolved.
4. **Orders and thresholds** without a sampling model (time to a target, sweeps): the rule is stated with the claim
   (:mod:`esrepro.report.claims`) and applied to the point estimates: it may say holds, and the reason says that no
   interval backs it, but **never does not hold**: a point estimate against the claim is not resolved, with the
   estimates in the reason. A refutation needs an interval wholly against the claim (a trend fitted over GPU
   counts, a binomial bound on an accuracy or on a count of runs, a stated spread of wall-clock times).
5. **Several cases** (every model, baseline, benchmark, evaluation point): a claim over k cases holds when every
   case's own 95% interval clears the null (an intersection-union test: its level is each case's), and does not
   hold when Holm's procedure over the k cases rejects a case's null. Holm rejects some case exactly when the
   smallest one-sided p-value is below 0.025 / k, so the margin rules check each case's interval at the two-sided
   level 1 - 0.05 / k (:func:`refute_z`, ``family`` below): a faithful run is refuted with chance at most 2.5%,
   however many cases the claim has.
6. **Scale**: a verdict on a paper's claim needs the paper's scale, which the configuration states (its
   ``scale`` field: ``paper``, ``tiny`` or ``rehearsal``). At any other scale the verdict is "not testable" and the
   rule's outcome on the run's own numbers is kept beside it (:func:`gate`): a 1M-parameter model on generated data,
   or a random-weight replica, does not test a claim about 0.5B-32B models on the papers' data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

HOLDS = "holds"
NOT_RESOLVED = "not resolved"
FAILS = "does not hold"
UNTESTABLE = "not testable"
VERDICTS = (HOLDS, NOT_RESOLVED, FAILS, UNTESTABLE)

#: Resamples and generator seed of every bootstrap (fixed: the same results give the same table).
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
LEVEL = 0.95

#: Why a paper's claim is not tested at a scale other than the paper's (the configuration's ``scale``).
SCALE_REASONS = {
    "tiny": "tiny scale: ~1M-parameter models built locally and generated or embedded data, not the papers' "
            "0.5B-32B models and data",
    "rehearsal": "rehearsal: random-weight replicas of the papers' models on labelled stand-in data",
}


@dataclass(frozen=True)
class Outcome:
    """A rule's verdict on some evidence, with the reason in words."""

    verdict: str
    reason: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


@dataclass(frozen=True)
class Interval:
    """A point estimate and its interval, with the method in words."""

    estimate: float
    lo: float
    hi: float
    method: str

    #: the upper end that refutes: the interval's at the claim's Holm-adjusted level (None: ``hi``, one case)
    refute_hi: float | None = None

    @property
    def against(self) -> float:
        """The upper end a refutation reads (``refute_hi`` where the claim has several cases, else ``hi``)."""
        return self.hi if self.refute_hi is None else self.refute_hi

    def text(self, digits: int = 1) -> str:
        return f"{self.estimate:+.{digits}f} [{self.lo:+.{digits}f}, {self.hi:+.{digits}f}]"


def untestable(reason: str) -> Outcome:
    return Outcome(UNTESTABLE, reason)


def refute_z(family: int) -> float:
    """The one-sided normal quantile a refutation must pass in a claim over ``family`` cases: 1 - 0.025 / k (Holm's
    first step; 1.96 for one case)."""
    from scipy.stats import norm

    return float(norm.ppf(1 - (1 - LEVEL) / 2 / max(1, family)))


def holm(pvalues: Sequence[float], alpha: float = (1 - LEVEL) / 2) -> list[bool]:
    """Holm's step-down procedure: which of the one-sided ``pvalues`` are rejected with family-wise error at most
    ``alpha`` (NaN: never rejected)."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    out = [False] * len(pvalues)
    for rank, (p, i) in enumerate(order):
        if p > alpha / (len(order) - rank):
            break
        out[i] = True
    return out


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion, ``k`` of ``n``."""
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = 0.0 if k <= 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k >= n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def bootstrap_margin(strata: Sequence[np.ndarray], resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED, family: int = 1) -> Interval:
    """Paired percentile bootstrap of a margin in points: ``strata`` are arrays of per-problem differences (A's
    correctness minus B's on the same problem, each a fraction in [-1, 1]), one array per test set; the margin is the
    mean over test sets of each set's mean difference, x 100. Each set's problems are resampled on their own.
    ``family`` > 1: the claim has that many cases, and ``refute_hi`` is the upper end at level 1 - 0.05 / family."""
    arrays = [np.asarray(s, dtype=float) for s in strata]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError("bootstrap_margin: every test set needs at least one paired problem")
    rng = np.random.default_rng(seed)
    means = np.zeros(resamples)
    for a in arrays:
        idx = rng.integers(0, a.size, size=(resamples, a.size))
        means += a[idx].mean(axis=1)
    means *= 100.0 / len(arrays)
    estimate = 100.0 * float(np.mean([a.mean() for a in arrays]))
    lo, hi = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    n = sum(a.size for a in arrays)
    top = float(np.quantile(means, 1 - (1 - LEVEL) / 2 / family)) if family > 1 else None
    return Interval(estimate, float(lo), float(hi),
                    f"paired bootstrap over {n} test problems ({resamples} resamples), 95% percentile interval", top)


def seed_interval(a: Sequence[float], b: Sequence[float], family: int = 1) -> Interval | None:
    """Welch's 95% t interval of mean(a) - mean(b) over seeds (values in points); None when either has < 2 seeds.
    ``family`` > 1: ``refute_hi`` is the upper end at level 1 - 0.05 / family."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return None
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    diff = float(a.mean() - b.mean())
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(diff, diff, diff, f"Welch t over seeds ({a.size} and {b.size}): no spread")
    from scipy import stats

    test = stats.ttest_ind(a, b, equal_var=False)
    ci = test.confidence_interval(LEVEL)
    top = float(test.confidence_interval(1 - (1 - LEVEL) / family).high) if family > 1 else None
    return Interval(diff, float(ci.low), float(ci.high), f"Welch t over seeds ({a.size} and {b.size}), 95%", top)


def margin_outcome(label: str, boot: Interval, seeds: Interval | None = None, null: float = 0.0) -> Outcome:
    """Rule 2: holds when the lower end of the bootstrap interval (and of the seed interval, where there is one) is
    above ``null`` (0 for "A beats B", -d for "A is within d points of B"); does not hold when the upper end of
    either (at the claim's Holm-adjusted level, :attr:`Interval.against`) is below it; not resolved otherwise. ``label`` names the comparison in the reason (e.g.
    ``"ES - GRPO-v on Qwen2.5-3B"``)."""
    parts = [f"{label}: {boot.text()} (problems)"]
    if seeds is not None:
        parts.append(f"{seeds.text()} (seeds)")
    intervals = [boot] + ([seeds] if seeds is not None else [])
    against = f"{null:+g}" if null else "0"
    if all(iv.lo > null for iv in intervals):
        return Outcome(HOLDS, "; ".join(parts) + f": above {against}")
    family = "" if all(iv.refute_hi is None for iv in intervals) else " (Holm over the claim's cases)"
    if any(iv.against < null for iv in intervals):
        return Outcome(FAILS, "; ".join(parts) + f": below {against}{family}")
    if any(iv.hi < null for iv in intervals):
        return Outcome(NOT_RESOLVED, "; ".join(parts) + f": below {against} at 95%, but not beyond Holm's bound "
                                                         "over the claim's cases")
    side = "above" if boot.estimate > null else "at or below"
    return Outcome(NOT_RESOLVED, "; ".join(parts) + f": the estimate is {side} {against} and the interval includes it")


def combine(outcomes: Sequence[tuple[str, Outcome]]) -> Outcome:
    """A claim over several cases (models, baselines, benchmarks): not testable when no case is; does not hold when
    any testable case does not (naming each); not resolved when any is not resolved (naming each); else holds
    (naming the untestable cases left out)."""
    tested = [(k, o) for k, o in outcomes if o.verdict != UNTESTABLE]
    skipped = [k for k, o in outcomes if o.verdict == UNTESTABLE]
    if not tested:
        return untestable("; ".join(f"{k}: {o.reason}" for k, o in outcomes) or "no case to test")
    tail = f" (not testable: {', '.join(skipped)})" if skipped else ""
    for verdict in (FAILS, NOT_RESOLVED):
        hit = [(k, o) for k, o in tested if o.verdict == verdict]
        if hit:
            return Outcome(verdict, f"{verdict} for " + "; ".join(f"{k} ({o.reason})" for k, o in hit) + tail)
    return Outcome(HOLDS, "holds for " + ", ".join(k for k, _ in tested) + tail)


def tally(outcomes: Sequence[tuple[str, Outcome]]) -> str:
    """The cases' verdicts counted, in a few words ("5 hold, 2 not resolved")."""
    counts = {v: sum(o.verdict == v for _, o in outcomes) for v in VERDICTS}
    words = {HOLDS: "hold", NOT_RESOLVED: "not resolved", FAILS: "do not hold", UNTESTABLE: "not testable"}
    return ", ".join(f"{n} {words[v]}" for v, n in counts.items() if n)


def _f_quantiles(df1: int, df2: int, level: float = LEVEL) -> tuple[float, float]:
    """The lower and upper quantiles of F(df1, df2) bounding the central ``level`` of its law (scipy.stats)."""
    from scipy import stats

    lo, hi = stats.f.ppf([(1 - level) / 2, (1 + level) / 2], df1, df2)
    return float(lo), float(hi)


def std_ratio_interval(std_b: float, n_b: int, std_a: float, n_a: int, pairs: int = 1) -> Interval | None:
    """95% interval of sigma_b / sigma_a from two sample standard deviations over ``n_b`` and ``n_a`` seeds (normal
    samples: (s_b^2/s_a^2) / F has an F(n_b - 1, n_a - 1) law). None with fewer than 2 seeds or a zero std of A.
    ``pairs`` > 1: the pair was chosen among that many after seeing the data (the largest over the smallest), so
    the interval is at level 1 - 0.05 / pairs (Bonferroni: it covers every pair's ratio at once)."""
    if n_a < 2 or n_b < 2 or not std_a > 0 or math.isnan(std_b):
        return None
    ratio2 = (std_b / std_a) ** 2
    level = 1 - (1 - LEVEL) / max(1, pairs)
    f_lo, f_hi = _f_quantiles(n_b - 1, n_a - 1, level)
    what = "95%" if pairs <= 1 else f"{level:.2%} (Bonferroni over {pairs} pairs)"
    return Interval(std_b / std_a, math.sqrt(ratio2 / f_hi), math.sqrt(ratio2 / f_lo),
                    f"F interval of a ratio of standard deviations ({n_b} and {n_a} seeds), {what}")


def ratio_outcome(label: str, interval: Interval) -> Outcome:
    """Rule 3: holds when the interval's lower end is above 1, does not hold when its upper end is below 1."""
    text = f"{label}: {interval.estimate:.2f}x [{interval.lo:.2f}, {interval.hi:.2f}]"
    if interval.lo > 1:
        return Outcome(HOLDS, text + ": above 1")
    if interval.hi < 1:
        return Outcome(FAILS, text + ": below 1")
    return Outcome(NOT_RESOLVED, text + ": the interval includes 1")


def gate(outcome: Outcome, scale: str) -> tuple[Outcome, str]:
    """Rule 6: the verdict on the paper's claim at this ``scale``, and the rule's outcome on the run's numbers
    (the measured column). At the paper's scale the two are the same."""
    if scale == "paper" or outcome.verdict == UNTESTABLE:
        return outcome, outcome.verdict
    why = SCALE_REASONS.get(scale, f"scale {scale!r} is not the paper's")
    return Outcome(UNTESTABLE, f"{why}; the rule on this run's numbers: {outcome.verdict} ({outcome.reason})"), \
        outcome.verdict
