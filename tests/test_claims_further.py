"""The claims beyond Table 1's and Table 2's headline rows: v1's smallest-model claim, RL's sensitivity to its grid,
Table 2's KL spread, the GRPO learning-rate sweep (Fig. 4a, Fig. 5), ESSA's Fig. 8 accuracy and its sweeps'
convergence speed. Each rule is driven by evidence drawn the way runs produce it (binomial test problems, seeds
spread around a mean, noisy training steps), with the case that must fail and, for the rules that can only hold or
stay open, many draws under no effect."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from claims_fixture import ESSA_MODEL, essa_run, lr_sweep_fixture, rising_reward, table2_kl_fixture
from esrepro.report import verdicts as V
from esrepro.report.claims import conciseness_sweep as CS
from esrepro.report.claims import essa_convergence as EC
from esrepro.report.claims import rl_grid as RG
from esrepro.report.claims import small_models as SM
from esrepro.report.claims.evidence import Evals, load_conciseness, load_essa

MODEL = "qwen2.5-0.5b-instruct"


# --- v1: the smallest model -------------------------------------------------------------------------------------------
def _small(rng: np.random.Generator, accs: dict[str, float], n: int = 2000) -> Evals:
    return Evals.from_outcomes({("countdown", "test", MODEL, m): {0: rng.random(n) < a / 100}
                                for m, a in accs.items()})


def test_the_smallest_model_is_found_by_the_registrys_sizes():
    from esrepro.planning.claim_plan import size_of, smallest

    assert size_of("0.5B") == 5e8 and size_of("1M") == 1e6 and size_of("") is None
    sizes = {"qwen2.5-7b-instruct": "7B", "llama-3.2-1b-instruct": "1B", MODEL: "0.5B", "odd": ""}
    assert smallest(list(sizes), sizes) == MODEL
    assert smallest(["odd", "x"], {}) == "odd" and smallest([], {}) is None


def test_v1s_numbers_hold_and_es_below_the_base_model_does_not():
    rng = np.random.default_rng(3)
    paper = {"base": 0.1, "ppo": 0.3, "grpo8": 0.3, "grpo30": 0.3, "es": 14.4}
    row = SM.small_model_row(_small(rng, paper), {}, {MODEL: "Qwen2.5-0.5B"}, MODEL, "countdown", "test")
    assert row.outcome.verdict == V.HOLDS, row.outcome.reason
    assert "Qwen2.5-0.5B" in row.ours and row.interval.count("(problems)") == 4
    below = SM.small_model_row(_small(rng, {**paper, "es": 0.0, "base": 6.0}), {}, {}, MODEL, "countdown", "test")
    assert below.outcome.verdict == V.FAILS and "Original" in below.outcome.reason
    missing = SM.small_model_row(_small(rng, {k: v for k, v in paper.items() if k != "grpo30"}), {}, {}, MODEL,
                                 "countdown", "test")
    assert missing.outcome.verdict == V.HOLDS and "not testable: GRPO-z (30)" in missing.why
    assert SM.small_model_row(_small(rng, paper), {}, {}, None, "countdown", "test").outcome.verdict == V.UNTESTABLE


# --- RL's sensitivity to its grid ------------------------------------------------------------------------------------
def _grid(root: Path, rng: np.random.Generator, means: dict[str, float], steps: int = 40, sd: float = 0.08
          ) -> Path:
    """A grid-trained method's run: per cell a log of ``steps`` noisy batch rewards around its mean, and the
    selection record beside the kept run."""
    run = root / "runs" / "countdown" / MODEL / "grpo8" / "seed0"
    for cell, mean in means.items():
        d = run.parent / "grid" / cell / "seed0"
        d.mkdir(parents=True)
        (d / "log.jsonl").write_text("".join(json.dumps({"step": i, "reward_mean": float(mean + sd * e)}) + "\n"
                                             for i, e in enumerate(rng.standard_normal(steps))))
    run.mkdir(parents=True)
    record = {"winner": max(means, key=means.get), "cells": [{"cell": c, "run": f"grid/{c}"} for c in means]}
    (run / "selection.json").write_text(json.dumps(record))
    return run / "selection.json"


def test_a_grid_whose_cells_differ_is_sensitive_and_equal_cells_are_rarely_called_so(tmp_path):
    rng = np.random.default_rng(0)
    sel = _grid(tmp_path / "apart", rng, {"lr1e-6_b0.001": 0.05, "lr1e-5_b0.001": 0.45, "lr1e-6_b0.005": 0.04,
                                          "lr1e-5_b0.005": 0.40})
    row = RG.sensitivity_row(RG.load_grids([sel]), {MODEL: "Qwen2.5-0.5B"})
    assert row.outcome.verdict == V.HOLDS, row.outcome.reason
    assert "(lr1e-5_b0.001 - lr1e-6_b0.00" in row.interval and "over 4 cells" in row.ours
    called = 0
    for i in range(100):  # no effect: every cell at 0.3, the best and worst chosen by the noise
        sel = _grid(tmp_path / f"equal{i}", rng, {f"c{k}": 0.3 for k in range(4)})
        out = RG.sensitivity_row(RG.load_grids([sel]), {}).outcome
        assert out.verdict in (V.HOLDS, V.NOT_RESOLVED)  # a largest gap is never against the claim
        called += out.verdict == V.HOLDS
    assert called <= 5, called
    one = _grid(tmp_path / "one", rng, {"only": 0.3})
    assert RG.sensitivity_row(RG.load_grids([one]), {}).outcome.verdict == V.UNTESTABLE


def test_a_grid_cell_without_its_log_is_named(tmp_path):
    sel = _grid(tmp_path, np.random.default_rng(1), {"a": 0.1, "b": 0.2})
    (sel.parent.parent / "grid" / "b" / "seed0" / "log.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="grid cell 'b'"):
        RG.load_grids([sel])


# --- Table 2's KL spread ---------------------------------------------------------------------------------------------
def test_kl_spread_far_apart_holds_and_inverted_does_not(tmp_path):
    rng = np.random.default_rng(4)
    held = CS.kl_stability_row(load_conciseness(table2_kl_fixture(tmp_path / "a", rng, 0.01, 0.8)), {}, 0.85)
    assert held.outcome.verdict == V.HOLDS, held.outcome.reason
    inverted = CS.kl_stability_row(load_conciseness(table2_kl_fixture(tmp_path / "b", rng, 0.8, 0.005)), {}, 0.85)
    assert inverted.outcome.verdict == V.FAILS, inverted.outcome.reason
    cut = CS.kl_stability_row(load_conciseness(table2_kl_fixture(tmp_path / "c", rng, 0.01, 0.8)), {}, 0.95)
    assert cut.outcome.verdict == V.UNTESTABLE


# --- GRPO's learning-rate sweep --------------------------------------------------------------------------------------
def test_reward_and_kl_rising_with_the_learning_rate_hold_and_a_falling_kl_does_not(tmp_path):
    rng = np.random.default_rng(6)
    runs = load_conciseness(lr_sweep_fixture(tmp_path / "a", rng, rising_reward, lambda b, lr: 2 * rising_reward(b, lr)))
    row = CS.lr_trend_row(runs)
    assert row.outcome.verdict == V.HOLDS, row.outcome.reason
    assert row.interval.count("KL at beta") == 4 and "beta 0: 2e-06" in row.ours
    falls = CS.lr_trend_row(load_conciseness(lr_sweep_fixture(tmp_path / "b", rng, rising_reward,
                                                    lambda b, lr: 1.0 - 1e5 * (lr - 2e-6))))
    assert falls.outcome.verdict == V.FAILS and "KL at beta" in falls.outcome.reason


def test_flat_slopes_are_rarely_refuted(tmp_path):
    rng = np.random.default_rng(7)
    refuted = 0
    for i in range(30):
        runs = load_conciseness(lr_sweep_fixture(tmp_path / f"f{i}", rng, lambda b, lr: 0.6, lambda b, lr: 0.3))
        refuted += CS.lr_trend_row(runs).outcome.verdict == V.FAILS
    assert refuted <= 1, refuted


def test_es_above_grpo_at_small_learning_rates_holds_and_grpo_above_es_does_not(tmp_path):
    rng = np.random.default_rng(8)
    runs = load_conciseness(lr_sweep_fixture(tmp_path / "a", rng, rising_reward, lambda b, lr: 0.3))
    row = CS.near_base_row(runs)
    assert row.outcome.verdict == V.HOLDS, row.outcome.reason
    assert "lr 3e-06" in row.interval and "lr 4e-06" not in row.interval and "base model" in row.interval
    above = load_conciseness(lr_sweep_fixture(tmp_path / "b", rng, lambda b, lr: 0.97, lambda b, lr: 0.3))
    assert CS.near_base_row(above).outcome.verdict == V.FAILS
    no_sweep = runs[runs["algorithm"] != "grpo"]
    assert CS.near_base_row(no_sweep).outcome.verdict == V.UNTESTABLE


# --- ESSA: Fig. 8's accuracy, the sweeps' speed ----------------------------------------------------------------------
def _essa(root: Path, runs: list[tuple[str, str, list[tuple[float, float]], dict]]) -> tuple:
    rng = np.random.default_rng(0)
    for method, algo, curve, extra in runs:
        essa_run(root, "gsm8k", ESSA_MODEL, method, algo, curve, rng, **extra)
    return load_essa(sorted(root.glob("runs/*/*/*/seed0/manifest.json")))


def test_essa_ending_higher_holds_and_ending_lower_does_not(tmp_path):
    grpo = ("essa_grpo", "verl_grpo", [(0.0, 0.62), (1500.0, 0.70), (3060.0, 0.78)], {})
    runs, curves = _essa(tmp_path / "a", [("essa_ref", "essa", [(0.0, 0.62), (900.0, 0.80), (1800.0, 0.88)], {}),
                                          grpo])
    assert EC.fig8_accuracy_row(runs, curves, {}).outcome.verdict == V.HOLDS
    runs, curves = _essa(tmp_path / "b", [("essa_ref", "essa", [(0.0, 0.62), (900.0, 0.66), (1800.0, 0.68)], {}),
                                          grpo])
    lower = EC.fig8_accuracy_row(runs, curves, {})
    assert lower.outcome.verdict == V.FAILS and "-10.0" in lower.outcome.reason


def test_sweep_speed_holds_when_the_generations_agree_and_never_refutes(tmp_path):
    def curve(step: float) -> list[tuple[float, float]]:
        return [(60.0 * i, min(0.85, 0.6 + step * i)) for i in range(12)]

    pops = [("essa_ref", "essa", curve(0.04), {}), ("essa_pop96", "essa", curve(0.02), {"population": 96}),
            ("essa_pop400", "essa", curve(0.03), {"population": 400}),
            ("essa_pop608", "essa", curve(0.01), {"population": 608})]
    runs, curves = _essa(tmp_path / "a", pops)
    row = EC.speed_row(runs, curves, "essa_population_speed", {})
    assert row.outcome.verdict == V.HOLDS, row.outcome.reason
    assert "192: " in row.ours and "608: " in row.ours
    pops[3] = ("essa_pop608", "essa", curve(0.08), {"population": 608})  # the largest fastest: against the claim
    runs, curves = _essa(tmp_path / "b", pops)
    out = EC.speed_row(runs, curves, "essa_population_speed", {}).outcome
    assert out.verdict == V.NOT_RESOLVED and "no interval" in out.reason
    ranks = [("essa_ref", "essa", curve(0.04), {}), ("essa_rank8", "essa", curve(0.05), {"rank": 8}),
             ("essa_rank64", "essa", curve(0.02), {"rank": 64})]
    runs, curves = _essa(tmp_path / "c", ranks)
    assert EC.speed_row(runs, curves, "essa_rank_speed", {}).outcome.verdict == V.HOLDS
    assert EC.speed_row(runs, curves, "essa_quantised_speed", {}).outcome.verdict == V.UNTESTABLE


def test_generations_to_a_level_and_the_readings():
    import pandas as pd

    c = pd.Series([0.6, 0.7, 0.8, 0.79], index=[0, 1, 2, 3])
    assert EC.generations_to(c, 0.75) == 2.0 and EC.generations_to(c, 0.9) is None
    assert EC.speed_case({96: 5.0, 192: 3.0, 400: 4.0}, "population")[0] is True
    assert EC.speed_case({96: 3.0, 192: 3.0, 400: 4.0}, "population")[0] is False  # tied with the smallest
    assert EC.speed_case({"native": 5.0, "int8": 4.0, "int4": 5.0}, "precision")[0] is True
    assert EC.speed_case({"native": 5.0, "int8": 6.0}, "precision")[0] is False
    assert EC.speed_case({8: 1.0, 16: 2.0}, "rank")[0] is None


def test_fig8_without_the_held_out_count_never_refutes(tmp_path):
    """Point estimates only (no held-out problem count, so no interval): ESSA ending lower stays open."""
    runs, curves = _essa(tmp_path, [("essa_ref", "essa", [(0.0, 0.62), (900.0, 0.66), (1800.0, 0.68)], {}),
                                    ("essa_grpo", "verl_grpo", [(0.0, 0.62), (1500.0, 0.70), (3060.0, 0.78)], {})])
    for manifest in tmp_path.glob("runs/*/*/*/seed0/manifest.json"):
        m = json.loads(manifest.read_text())
        m["settings"]["val_examples"] = 0
        manifest.write_text(json.dumps(m))
    out = EC.fig8_accuracy_row(runs, curves, {}).outcome
    assert out.verdict == V.NOT_RESOLVED and "no interval" in out.reason


# --- v1's sample share ----------------------------------------------------------------------------------------------
def test_v1s_share_divides_by_rls_budget_and_reads_v1s_baselines_only():
    """PPO reaches its best (40%) at 20 of its 100 samples; ES reaches 40% at 15: 0.15 of PPO's budget (under 0.2),
    though 0.75 of the samples PPO needed. GRPO-v (not in v1) far ahead is not read; GRPO-z (8) never rises."""
    import pandas as pd

    from esrepro.report.claims import countdown as CD

    pts = [("es", 0.0, 10.0), ("es", 15.0, 40.0), ("es", 100.0, 55.0), ("ppo", 0.0, 10.0), ("ppo", 20.0, 40.0),
           ("ppo", 100.0, 38.0), ("grpo8", 0.0, 10.0), ("grpo8", 100.0, 9.0), ("grpov", 0.0, 10.0),
           ("grpov", 100.0, 90.0)]
    df = pd.DataFrame(pts, columns=["method", "samples", "accuracy"]).assign(model="m", n=500.0)
    row = CD.sample_share_v1(df, {"m": "M"})
    assert row.outcome.verdict == V.HOLDS, row.outcome.reason
    assert "M PPO-z: 0.15" in row.ours and "M GRPO-z (8): no gain over its start" in row.ours
    assert "GRPO-v" not in row.ours and "not testable: M GRPO-z (8)" in row.outcome.reason
    flat = CD.sample_share_v1(df[df["method"].isin(["es", "grpo8"])], {})
    assert flat.outcome.verdict == V.UNTESTABLE and "rises above its start" in flat.outcome.reason
