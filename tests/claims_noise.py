"""The claims' rules under a real run's noise: faithful runs (the papers' numbers, drawn as a run draws them) and
clear refutations, each drawn many times, and how often each rule says "does not hold".

The noise of one draw, stated:

- **test problems**: each problem right or wrong independently at the method's accuracy (binomial), on the papers'
  test sets (Countdown 2,000 problems, Sudoku and ARC-AGI 200), one training seed per method as in the paper
  configuration (``seeds: [0]``);
- **checkpoint curves** (ES against RL over training, v2 Fig. 7): each evaluation point binomial on 500 test
  problems (the paper configuration's ``eval_limit``), six points per curve, ES's margin rising from +1 point at
  the first point after the start to +10;
- **ESSA's runs**: each run's wall-clock times scaled by one log-normal factor (standard deviation 0.15 of the
  logarithm), each logged held-out accuracy moved by a normal draw of standard deviation 0.01;
- **Table 2's runs**: four seeds per configuration, normal around the paper's mean with its standard deviation;
  a configuration the paper marks hacked hacks in each seed with chance 1/2;
- **low-rank ES beside its control arm** (this pipeline's own question): three training seeds per arm, each seed's
  accuracy moved by a normal draw of standard deviation 2 points (training's run-to-run spread), on 2,000 Countdown
  problems whose difficulty every method shares (a probit of 0.8 difficulty + 0.6 fresh noise); the base model one
  evaluation.

The clear refutations are stated with each case (:data:`CASES`); a case without one reports no power.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from claims_fixture import (
    ESSA_MODEL,
    N_COUNTDOWN,
    Noise,
    conciseness_fixture,
    display,
    essa_fixture,
    lr_sweep_fixture,
    published,
    rising_reward,
    spec,
    table2_kl_fixture,
)
from esrepro.report import verdicts as V
from esrepro.report.claims import conciseness as C
from esrepro.report.claims import conciseness_sweep as CS
from esrepro.report.claims import countdown as CD
from esrepro.report.claims import es_variants as EV
from esrepro.report.claims import essa as E
from esrepro.report.claims import essa_convergence as EC
from esrepro.report.claims import math_puzzles as MP
from esrepro.report.claims import small_models as SM
from esrepro.report.claims.catalogue import V1_RL
from esrepro.report.claims.evidence import Evals, load_conciseness, load_essa

#: ESSA's noise (wall-clock times and held-out accuracies).
ESSA_NOISE = Noise(time_log_sd=0.15, val_sd=0.01)
#: Test problems per point of a checkpoint curve, and the samples at RL's evaluation points (the first: the start).
CURVE_N = 500
CURVE_SAMPLES = (0.0, 2e5, 4e5, 6e5, 8e5, 1e6)
#: ES's margin over each RL method at those points (faithful: ahead throughout, close at first).
CURVE_MARGIN = (0.0, 1.0, 4.0, 7.0, 10.0, 10.0)
#: A clear refutation of a margin claim: ES this many points below (6 points: 3.8 standard errors of a difference
#: on 2,000 problems; 3 points, 1.9, is also reported).
DEFICIT = 6.0

Verdicts = dict[str, tuple[str, str]]  # claim -> (verdict of the faithful draw, verdict of the refuted draw)


@dataclass(frozen=True)
class Case:
    """A claim of the calibration, with its clear refutation in words ("" where none is defined)."""

    claim: str
    refutation: str


def _outcomes(acc: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.random(n) < acc / 100


def table1(rng: np.random.Generator, models: list[str] | None = None, deficit: float = DEFICIT,
           suffix: str = "") -> Verdicts:
    """Table 1 (ES over the base model, and over every RL baseline per model): the papers' accuracies. Refuted: ES
    ``deficit`` points below the best RL baseline (each model's row), and on the model with the best base accuracy
    ``deficit`` points below the base model (the row over every model)."""
    pub_all, names = published(), display()
    pub = pub_all["tables"]["table1_countdown"]["models"]
    models = models or list(pub)

    def build(es_of: Callable[[str, dict[str, float]], float]) -> Evals:
        outcomes: dict[tuple[str, str, str, str], dict[int, np.ndarray]] = {}
        for m in models:
            row = {**pub[m], "es": es_of(m, pub[m])}
            for method, acc in row.items():
                outcomes[("countdown", "test", m, method)] = {0: _outcomes(acc, N_COUNTDOWN, rng)}
        return Evals.from_outcomes(outcomes)

    faithful = build(lambda m, row: row["es"])
    below_rl = build(lambda m, row: max(row[k] for k in CD.RL_METHODS if k in row) - deficit)
    top = max(models, key=lambda m: pub[m]["base"])  # the model whose base accuracy leaves room below it
    below_base = build(lambda m, row: row["base"] - deficit if m == top else row["es"])
    out: Verdicts = {f"ES improves every base model{suffix}": (
        CD.improves_base(faithful, pub_all, names, "countdown", "test").outcome.verdict,
        CD.improves_base(below_base, pub_all, names, "countdown", "test").outcome.verdict)}
    for m in models:
        out[f"ES beats every RL baseline: {names.get(m, m)}{suffix}"] = (
            CD.beats_rl(faithful, pub_all, names, m, "countdown", "test").outcome.verdict,
            CD.beats_rl(below_rl, pub_all, names, m, "countdown", "test").outcome.verdict)
    return out


def table1_3(rng: np.random.Generator) -> Verdicts:
    """:func:`table1` with ES 3 points below (1.9 standard errors of a difference on 2,000 problems)."""
    return table1(rng, deficit=3.0, suffix=" (3 points)")


def puzzles(rng: np.random.Generator) -> Verdicts:
    """Sudoku and ARC-AGI (v2 Table 3) on 200 problems; refuted, the base model at 15% (not near zero)."""
    pub = published()
    names = display()
    out: Verdicts = {}
    for task, (block, _key, name) in MP.PUZZLES.items():
        got = []
        for refuted in (False, True):
            outcomes = {}
            for m, row in pub["tables"][block]["models"].items():
                base = 15.0 if refuted else row["base"]
                es = max(row["es"], base + 10) if refuted else row["es"]
                outcomes[(task, "test", m, "base")] = {0: _outcomes(base, 200, rng)}
                outcomes[(task, "test", m, "es")] = {0: _outcomes(es, 200, rng)}
            got.append(MP.puzzle_row(Evals.from_outcomes(outcomes), pub, names, task).outcome.verdict)
        out[f"ES lifts {name} from near zero"] = (got[0], got[1])
    return out


def curves(rng: np.random.Generator) -> Verdicts:
    """ES against the five RL methods over training on one model (:data:`CURVE_MARGIN`); refuted, one RL method
    overtakes ES by 12 points over its last three points."""
    got = []
    for refuted in (False, True):
        rows = []
        rl_curve = [20.0 + 20.0 * i / (len(CURVE_SAMPLES) - 1) for i in range(len(CURVE_SAMPLES))]
        es_curve = [r + d for r, d in zip(rl_curve, CURVE_MARGIN, strict=True)]
        for s, acc in zip(CURVE_SAMPLES, es_curve, strict=True):
            rows.append(("m", "es", s, 100 * rng.binomial(CURVE_N, acc / 100) / CURVE_N))
        for k, rl in enumerate(CD.RL_METHODS):
            for i, (s, acc) in enumerate(zip(CURVE_SAMPLES, rl_curve, strict=True)):
                if refuted and k == 0 and i >= len(CURVE_SAMPLES) - 3:
                    acc = es_curve[i] + 12.0
                rows.append(("m", rl, s, acc if i == 0 else 100 * rng.binomial(CURVE_N, acc / 100) / CURVE_N))
        df = pd.DataFrame(rows, columns=["model", "method", "samples", "accuracy"]).assign(n=float(CURVE_N))
        got.append(CD.ahead_throughout(df, {}).outcome.verdict)
    return {"ES is ahead of RL throughout training": (got[0], got[1])}


#: ESSA's clear refutations: curves replaced by (task, model, method). Where a refutation is about times, both runs
#: reach the target well clear of the held-out noise (0.85 against 0.80; 0.80 against 0.76).
_GRPO_CLEAR = {("gsm8k", ESSA_MODEL, "essa_grpo"): ((0.0, 0.62), (1500.0, 0.70), (3060.0, 0.85))}
ESSA_SLOW = {**_GRPO_CLEAR, ("gsm8k", ESSA_MODEL, "essa_resample100"): ((0.0, 0.62), (1500.0, 0.74), (3672.0, 0.85))}
ESSA_SHORT = {**_GRPO_CLEAR, ("gsm8k", ESSA_MODEL, "essa_resample100"): ((0.0, 0.62), (600.0, 0.70), (1440.0, 0.72))}
ESSA_RISING = {("gsm8k", ESSA_MODEL, "essa_ref"): ((0.0, 0.62), (600.0, 0.70), (17400.0, 0.80)),
               **{("gsm8k", ESSA_MODEL, f"essa_eng{e}"): ((0.0, 0.62), (17400.0 * (e / 8) ** 0.75, 0.80))
                  for e in (16, 32, 64, 128)}}
ESSA_FALLING = {("prm800k", "llama-3.1-8b", "essa_ref"): ((0.0, 0.30), (9000.0, 0.20))}


def essa(rng: np.random.Generator) -> Verdicts:
    """ESSA's rows on its runs with :data:`ESSA_NOISE`; refuted: :data:`ESSA_SLOW`, :data:`ESSA_SHORT`,
    :data:`ESSA_RISING`, :data:`ESSA_FALLING`."""
    pub, names = published(), display()
    grpo_target, target = 0.80, 0.76
    rows: dict[str, list[str]] = {}
    for refuted in (False, True):
        with tempfile.TemporaryDirectory() as d:
            def load(override: Mapping | None, tag: str) -> tuple[pd.DataFrame, pd.DataFrame]:
                root = Path(d) / tag
                problems = np.random.default_rng(int(rng.integers(2**31)))
                essa_fixture(root, problems, ESSA_NOISE, rng, dict(override or {}))
                return load_essa(sorted(root.glob("runs/*/*/*/seed0/manifest.json")))

            runs, cur = load(ESSA_SLOW if refuted else None, "fast")
            rows.setdefault("ESSA reaches 0.80 in under half GRPO's time", []).append(
                E.faster_row(runs, cur, pub, grpo_target, names).outcome.verdict)
            if refuted:
                runs, cur = load(ESSA_SHORT, "short")
            rows.setdefault("ESSA needs fewer training problems than GRPO", []).append(
                E.data_row(runs, cur, grpo_target, names).outcome.verdict)
            if refuted:
                runs, cur = load(ESSA_RISING, "rising")
            rows.setdefault("ESSA's time to 0.76 falls as GPUs are added", []).append(
                E.engines_row(runs, cur, pub, target, names).outcome.verdict)
            if refuted:
                runs, cur = load(ESSA_FALLING, "falling")
            fig6 = runs[runs["method"] == "essa_ref"]
            fig6 = fig6[fig6["model"] != ESSA_MODEL]
            rows.setdefault("ESSA improves accuracy over training", []).append(
                E.improves_row(fig6, cur, names).outcome.verdict)
    return {k: (v[0], v[1]) for k, v in rows.items()}


#: The front's clear refutation: GRPO at beta 0.0464 steadily above ES's front (reward 0.98, std 0.01 over seeds).
GRPO_ABOVE = {0.0464: {"reward": 0.98, "reward_std": 0.01}}


def conciseness(rng: np.random.Generator) -> Verdicts:
    """Table 2's front, hacking and stability rows (four seeds a configuration); refuted: :data:`GRPO_ABOVE` (the
    front), an ES run hacks (hacking). The stability rule has no clear refutation here."""
    pub = published()
    got: dict[str, list[str]] = {}
    for refuted in (False, True):
        with tempfile.TemporaryDirectory() as d:
            root = conciseness_fixture(Path(d) / "results", rng, hacks=rng, grpo=GRPO_ABOVE if refuted else None)
            if refuted:
                es = sorted((root / "kl" / "conciseness" / "qwen2.5-7b-instruct").glob("es_sigma*/seed0"))[0]
                text = (es / "samples.jsonl").read_text().replace("The answer is short.", "?! .. ))</> ;;")
                (es / "samples.jsonl").write_text(text)
            runs = load_conciseness(sorted(str(p) for p in root.glob("kl/conciseness/*/*/seed*/kl.json")))
            got.setdefault("ES's reward-KL front lies above GRPO's", []).append(
                C.pareto_row(runs, pub).outcome.verdict)
            got.setdefault("GRPO with small beta hacks the reward; ES does not", []).append(
                C.hacking_row(runs, pub, 0.2).outcome.verdict)
            got.setdefault("ES's reward varies less over seeds than GRPO's", []).append(
                C.stability_row(runs, pub, spec()["reward_cutoff"]).outcome.verdict)
    return {k: (v[0], v[1]) for k, v in got.items()}


#: Low-rank ES's calibration: the base model's and the control arm's Countdown accuracy (%), training's spread over
#: seeds (points), seeds per arm, and the share of the control's gain a faithful and a refuted low-rank run keep (the
#: faithful one at the claim's boundary, 80%: the hardest faithful case).
LOWRANK_BASE, LOWRANK_CONTROL, LOWRANK_SEED_SD, LOWRANK_SEEDS = 20.0, 50.0, 2.0, 3
LOWRANK_KEPT, LOWRANK_REFUTED = EV.KEPT_SHARE, 0.4


def _lowrank_evals(rng: np.random.Generator, kept: float) -> Evals:
    from scipy.stats import norm

    difficulty = rng.standard_normal(N_COUNTDOWN)

    def seeds(acc: float, n: int, spread: float) -> dict[int, np.ndarray]:
        out = {}
        for seed in range(n):
            p = float(np.clip(acc + spread * rng.standard_normal(), 0.5, 99.5)) / 100
            out[seed] = 0.8 * difficulty + 0.6 * rng.standard_normal(N_COUNTDOWN) < norm.ppf(p)
        return out

    low = LOWRANK_BASE + kept * (LOWRANK_CONTROL - LOWRANK_BASE)
    key = ("countdown", "test", "qwen2.5-3b-instruct")
    return Evals.from_outcomes({(*key, "base"): seeds(LOWRANK_BASE, 1, 0.0),
                                (*key, "eslinear"): seeds(LOWRANK_CONTROL, LOWRANK_SEEDS, LOWRANK_SEED_SD),
                                (*key, "eggroll1"): seeds(low, LOWRANK_SEEDS, LOWRANK_SEED_SD),
                                (*key, "eggroll4"): seeds(low, LOWRANK_SEEDS, LOWRANK_SEED_SD)})


def lowrank(rng: np.random.Generator) -> Verdicts:
    """Low-rank ES keeps the control arm's gain (ranks 1 and 4 on one model, :data:`LOWRANK_SEEDS` seeds an arm):
    faithful at the boundary, keeping :data:`LOWRANK_KEPT` of the gain; refuted, keeping :data:`LOWRANK_REFUTED`."""
    variants, controls = {"eggroll1": "EGGROLL (rank 1)", "eggroll4": "EGGROLL (rank 4)"}, {"eslinear": "control"}
    verdicts = [EV.matches_row(_lowrank_evals(rng, kept), display(), variants, controls, "countdown",
                               "test").outcome.verdict for kept in (LOWRANK_KEPT, LOWRANK_REFUTED)]
    return {"Low-rank ES keeps full-rank ES's gain": (verdicts[0], verdicts[1])}


#: Fig. 8's clear refutation: ESSA's resampled run ends at 0.70, GRPO at 0.81.
ESSA_ENDS_LOW = {("gsm8k", ESSA_MODEL, "essa_resample100"): ((0.0, 0.62), (600.0, 0.66), (1440.0, 0.70))}


def further(rng: np.random.Generator) -> Verdicts:
    """The rows beyond the headline ones: v1's smallest model (no clear refutation: RL's 0.3% leaves no room
    below), Table 2's KL spread (refuted: ES's KL std 0.8 over seeds, GRPO's 0.005), GRPO's reward and KL against
    the learning rate (refuted: KL falls), ES above GRPO at small learning rates (refuted: GRPO at 0.97) and ESSA's
    Fig. 8 accuracy (refuted: :data:`ESSA_ENDS_LOW`)."""
    pub, names = published(), display()
    small = "qwen2.5-0.5b-instruct"
    row = pub["tables"]["table1_countdown"]["models"][small]
    evals = Evals.from_outcomes({("countdown", "test", small, m): {0: _outcomes(row[m], N_COUNTDOWN, rng)}
                                 for m in ("base", *V1_RL, "es")})
    out: Verdicts = {"ES improves the smallest model, where RL does not (v1)": (
        SM.small_model_row(evals, pub, names, small, "countdown", "test").outcome.verdict, V.HOLDS)}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        faithful = load_conciseness(sorted(str(p) for p in conciseness_fixture(root / "t2", rng).glob(
            "kl/conciseness/*/*/seed*/kl.json")))
        inverted = load_conciseness(table2_kl_fixture(root / "inv", rng, 0.8, 0.005))
        out["ES's KL varies less over seeds than GRPO's"] = (
            CS.kl_stability_row(faithful, pub, spec()["reward_cutoff"]).outcome.verdict,
            CS.kl_stability_row(inverted, pub, 0.85).outcome.verdict)
        sweep = load_conciseness(lr_sweep_fixture(root / "lr", rng, rising_reward,
                                                  lambda b, lr: 2 * rising_reward(b, lr)))
        falling = load_conciseness(lr_sweep_fixture(root / "fall", rng, rising_reward,
                                                    lambda b, lr: 1.0 - 1e5 * (lr - 2e-6)))
        above = load_conciseness(lr_sweep_fixture(root / "above", rng, lambda b, lr: 0.97, lambda b, lr: 0.3))
        out["GRPO's reward and KL rise with its learning rate"] = (CS.lr_trend_row(sweep).outcome.verdict,
                                                                   CS.lr_trend_row(falling).outcome.verdict)
        out["GRPO at small learning rates stays near the base reward; ES moves it up"] = (
            CS.near_base_row(sweep).outcome.verdict, CS.near_base_row(above).outcome.verdict)
        verdicts = []
        for tag, curves in (("fig8", None), ("low", ESSA_ENDS_LOW)):
            essa_fixture(root / tag, np.random.default_rng(int(rng.integers(2**31))), ESSA_NOISE, rng, curves)
            runs, cur = load_essa(sorted((root / tag).glob("runs/*/*/*/seed0/manifest.json")))
            verdicts.append(EC.fig8_accuracy_row(runs, cur, names).outcome.verdict)
        out["ESSA ends above GRPO's accuracy"] = (verdicts[0], verdicts[1])
    return out


#: Each claim's clear refutation (claims not named here have none: their power is not reported).
REFUTATIONS = {
    "ES improves every base model": f"ES {DEFICIT:g} points below the base model on one model (of 7)",
    "ES beats every RL baseline": f"ES {DEFICIT:g} points below the model's best RL baseline",
    "ES lifts Sudoku from near zero": "the base model at 15%",
    "ES lifts ARC-AGI from near zero": "the base model at 15%",
    "ES is ahead of RL throughout training": "one RL method 12 points above ES at its last three points",
    "ESSA reaches 0.80 in under half GRPO's time": "ESSA reaches 0.85 at 1.2x GRPO's time",
    "ESSA needs fewer training problems than GRPO": "ESSA's resampled run stops at 0.72, GRPO reaches 0.85",
    "ESSA's time to 0.76 falls as GPUs are added": "the time to 0.80 rises as GPUs^0.75 (8 to 128 GPUs)",
    "ESSA improves accuracy over training": "Llama-3.1-8B's accuracy falls 10 points over training",
    "GRPO with small beta hacks the reward; ES does not": "an ES run hacks",
    "ES's reward-KL front lies above GRPO's": "GRPO at beta 0.0464 at reward 0.98 (std 0.01), above ES's 0.919",
    "ES's KL varies less over seeds than GRPO's": "ES's KL std 0.8 over seeds, GRPO's 0.005",
    "GRPO's reward and KL rise with its learning rate": "KL falls by 0.3 over the sweep's learning rates",
    "GRPO at small learning rates stays near the base reward; ES moves it up": "GRPO at reward 0.97, ES at 0.92",
    "ESSA ends above GRPO's accuracy": "ESSA's resampled run ends at 0.70, GRPO at 0.81",
    "Low-rank ES keeps full-rank ES's gain": f"low-rank ES keeps {LOWRANK_REFUTED:.0%} of the control arm's gain "
                                             f"({LOWRANK_BASE:g}% to {LOWRANK_CONTROL:g}%; 3 seeds an arm)",
}
GROUPS: dict[str, Callable[[np.random.Generator], Verdicts]] = {
    "table1": table1, "puzzles": puzzles, "curves": curves, "essa": essa, "conciseness": conciseness,
    "variants": lowrank, "further": further}
#: Each group's stream of draws (fixed numbers, so that adding a group leaves the others' draws as they were).
GROUP_STREAMS = {"conciseness": 0, "curves": 1, "essa": 2, "puzzles": 3, "table1": 4, "variants": 5, "further": 6}


def refutation_of(claim: str) -> str:
    """The clear refutation of ``claim`` in words ("": none defined); "(3 points)" rows: ES 3 points below."""
    found = next((v for k, v in REFUTATIONS.items() if claim.startswith(k)), "")
    return found.replace(f"{DEFICIT:g} points", "3 points") if claim.endswith("(3 points)") else found


def calibrate(draws: int, seed: int = 0, groups: Mapping[str, Callable[[np.random.Generator], Verdicts]] | None = None
              ) -> pd.DataFrame:
    """Each claim over ``draws`` faithful and refuted draws: false refutations (faithful draws the rule says "does
    not hold"), their rate, and the power (refuted draws it says "does not hold"; NaN where no clear refutation is
    defined)."""
    counts: dict[str, list[int]] = {}
    for name, group in (groups or GROUPS).items():
        rng = np.random.default_rng([seed, GROUP_STREAMS.get(name, 99)])
        for _ in range(draws):
            for claim, (faithful, refuted) in group(rng).items():
                c = counts.setdefault(claim, [0, 0])
                c[0] += faithful == V.FAILS
                c[1] += refuted == V.FAILS
    rows = []
    for claim, (false, hits) in counts.items():
        ref = refutation_of(claim)
        rows.append({"claim": claim, "draws": draws, "false refutations": false, "rate": false / draws,
                     "clear refutation": ref or "none defined", "power": hits / draws if ref else float("nan")})
    return pd.DataFrame(rows)
