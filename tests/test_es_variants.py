"""Low-rank ES beside full-rank ES, beyond the papers: which configurations plan it, the es_variants table from
evaluations drawn as real ones are (independent per-problem outcomes, two seeds) and the claims table's
row on the extension config's paper-scale paths (low-rank ES keeps 80% of the control arm's gain), including the rank
that must fail and the control arm that gains nothing."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from esrepro.report import verdicts as V

ROOT = Path(__file__).resolve().parents[1]
CLAIM = "Low-rank ES keeps full-rank ES's gain at equal budget"


@lru_cache(maxsize=3)
def _pipeline(config: str):
    from esrepro.config import read_config
    from esrepro.planning.load import load_pipeline

    return load_pipeline(read_config(ROOT / "config" / config, root=ROOT), f"config/{config}", root=ROOT)


def _eval(root: Path, model: str, method: str, accuracy: float, n: int, rng: np.random.Generator,
          seed: int = 0, difficulty: np.ndarray | None = None) -> float:
    """An evaluation of ``n`` Countdown test problems, each right with probability ``accuracy`` (%): independently,
    or (``difficulty``: a standard normal per problem, shared by the methods evaluated on the same problems) through a
    probit whose latent is 0.8 difficulty plus 0.6 fresh noise, so a hard problem is hard for every method, as in
    real evaluations, and each method's share right is still ``accuracy``. Returns the accuracy drawn (%)."""
    from scipy.stats import norm

    d = root / "eval" / "countdown" / model / method / f"seed{seed}" / "test"
    d.mkdir(parents=True)
    if difficulty is None:
        right = rng.random(n) < accuracy / 100
    else:
        right = 0.8 * difficulty + 0.6 * rng.standard_normal(n) < norm.ppf(accuracy / 100)
    (d / "metrics.json").write_text(json.dumps({"task": "countdown", "split": "test", "model": model,
                                                "method": method, "seed": seed, "accuracy": float(right.mean()),
                                                "n": n}))
    (d / "responses.jsonl").write_text("".join(json.dumps({"id": i, "correct": bool(c), "response": ""}) + "\n"
                                               for i, c in enumerate(right)))
    return 100.0 * float(right.mean())


# --- what plans it ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_default_and_the_extension_plan_low_rank_es_and_the_paper_config_does_not():
    from esrepro.planning.claim_plan import ClaimPlan
    from esrepro.planning.jobs import ES_VARIANTS, TABLE1, plan_jobs
    from esrepro.planning.plan import ExtrasPlan, Plan
    from esrepro.planning.specs import claims_spec, es_variants_spec

    for config, models in (("config.yaml", 1), ("paper_eggroll.yaml", 7)):
        p = _pipeline(config)
        plan = Plan(p)
        assert ExtrasPlan(plan).es_variants() == ["eggroll1", "eggroll4", "eslinear"]
        assert "results/tables/es_variants.csv" in [t.removeprefix("work/paper_eggroll/") for t in plan.table_targets()]
        spec = es_variants_spec(p)
        assert len(spec["runs"]) == 4 * models
        for model in p.train_models("countdown"):
            runs = [r for r in spec["runs"] if r["model"] == model]
            assert [(r["rank"], r["noise_on"]) for r in runs] == [(None, "all"), (1, "linear"), (4, "linear"),
                                                                  (None, "linear")]
            assert len({(r["samples"], r["population"], r["iterations"], r["sigma"], r["alpha"]) for r in runs}) == 1
        assert claims_spec(p)["es_variants"] == {"eggroll1": "EGGROLL (rank 1)", "eggroll4": "EGGROLL (rank 4)"}
        assert claims_spec(p)["es_controls"] == {"eslinear": "ES, linear projections only"}
        assert "eggroll_matches_es" in ClaimPlan(plan).rows()
        jobs = plan_jobs(p)
        trains = [j for j in jobs if j.rule == "train" and j.wildcards.get("task") == "countdown"]
        assert {j.group for j in trains if j.wildcards["method"] in ("eggroll1", "eggroll4", "eslinear")} == \
            {ES_VARIANTS}
        assert ("countdown", "tiny" if models == 1 else "qwen2.5-3b-instruct", "eslinear", 0) not in \
            ExtrasPlan(plan).es_runs()  # not the papers' ES: no parameter-shift figure
        assert {j.group for j in trains if j.wildcards["method"] == "es" and j.wildcards["seed"] == 0} == {TABLE1}
        assert [j.group for j in jobs if j.rule == "es_variants_table"] == [ES_VARIANTS]
    # the default runs them at ES's seeds
    p = _pipeline("config.yaml")
    seeds = {meth: sorted(s for _, m, s in Plan(p).train_runs("countdown") if m == meth)
             for meth in ("es", "eggroll1", "eggroll4", "eslinear", "grpo8")}
    assert seeds["eggroll1"] == seeds["eggroll4"] == seeds["eslinear"] == seeds["es"] == [0, 1, 2]
    assert seeds["grpo8"] == [0, 1]  # the stability block's seeds for every other method
    egg = _pipeline("paper_eggroll.yaml")  # every arm four seeds on the stability model, one elsewhere
    for meth in ("es", "eggroll1", "eggroll4", "eslinear"):
        runs = [(m, s) for m, me, s in Plan(egg).train_runs("countdown") if me == meth]
        assert sorted(s for m, s in runs if m == "qwen2.5-3b-instruct") == [0, 1, 2, 3]
        assert {s for m, s in runs if m != "qwen2.5-3b-instruct"} == {0}
    paper = _pipeline("paper.yaml")
    assert ExtrasPlan(Plan(paper)).es_variants() == []
    assert not any("es_variants" in t for t in Plan(paper).table_targets())
    assert "eggroll_matches_es" not in ClaimPlan(Plan(paper)).rows()
    assert es_variants_spec(paper)["runs"] == [] and claims_spec(paper)["es_variants"] == {}


# --- the table -------------------------------------------------------------------------------------------------------
def test_the_table_sets_each_rank_beside_full_rank_es(tmp_path):
    from esrepro.planning.specs import es_variants_spec
    from esrepro.report.es_variants import build_es_variants_table

    spec = es_variants_spec(_pipeline("config.yaml"))
    rng = np.random.default_rng(11)
    drawn: dict[str, list[float]] = {}
    paths = []
    for method, acc in (("es", 24.0), ("eggroll1", 21.0), ("eggroll4", 25.0), ("eslinear", 23.0)):
        for seed in (0, 1):
            drawn.setdefault(method, []).append(_eval(tmp_path, "tiny", method, acc, 200, rng, seed))
            paths.append(tmp_path / "eval/countdown/tiny" / method / f"seed{seed}/test/metrics.json")
    base = _eval(tmp_path, "tiny", "base", 12.0, 200, rng)
    paths.append(tmp_path / "eval/countdown/tiny/base/seed0/test/metrics.json")
    df = build_es_variants_table(paths, spec, {"tiny": {"display": "tiny (1M)"}}, tmp_path / "es_variants")
    assert list(df["Method"]) == ["ES", "EGGROLL (rank 1)", "EGGROLL (rank 4)", "ES, linear projections only"]
    assert list(df["Rank"]) == ["full", "1", "4", "full"] and set(df["Samples"]) == {768} and set(df["Seeds"]) == {2}
    for (_, row), method in zip(df.iterrows(), ("es", "eggroll1", "eggroll4", "eslinear"), strict=True):
        assert row["Model"] == "tiny (1M)" and row["Original"] == pytest.approx(base)
        assert row["Accuracy"] == pytest.approx(np.mean(drawn[method]))
        assert row["Accuracy std"] == pytest.approx(np.std(drawn[method], ddof=1))
        expected = np.mean(drawn[method]) - np.mean(drawn["es"])
        assert math.isnan(row["Δ vs ES"]) if method == "es" else row["Δ vs ES"] == pytest.approx(expected)
    md = (tmp_path / "es_variants.md").read_text()
    assert "EGGROLL (rank 4)" in md and "±" in md and "Neither paper runs low-rank ES" in md
    assert "\\begin{tabular}" in (tmp_path / "es_variants.tex").read_text()
    assert len(pd.read_csv(tmp_path / "es_variants.csv")) == 4
    # a rank not evaluated keeps its row, blank, and no difference is made up for it
    df = build_es_variants_table(paths[:4] + paths[6:], spec, {}, tmp_path / "partial")
    row = df.set_index("Method").loc["EGGROLL (rank 4)"]
    assert row["Seeds"] == 0 and math.isnan(row["Accuracy"]) and math.isnan(row["Δ vs ES"])


def test_the_step_writes_the_table_and_its_manifest(tmp_path):
    from esrepro.planning.specs import es_variants_spec
    from esrepro.steps.report import es_variants_table

    rng = np.random.default_rng(3)
    paths = []
    for method in ("base", "es", "eggroll1", "eggroll4"):
        _eval(tmp_path, "tiny", method, 20.0, 50, rng)
        paths.append(str(tmp_path / "eval/countdown/tiny" / method / "seed0/test/metrics.json"))
    out = tmp_path / "tables" / "es_variants"
    es_variants_table(paths, str(ROOT / "config" / "models.yaml"), es_variants_spec(_pipeline("config.yaml")),
                      str(out), note=["Scale: tiny"])
    manifest = json.loads(out.with_name("es_variants.manifest.json").read_text())
    assert set(paths) <= set(manifest["inputs"]) and manifest["settings"]["spec"]["task"] == "countdown"
    assert "Scale: tiny" in out.with_name("es_variants.md").read_text()


# --- the claim -------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _claim_spec() -> tuple[dict, list[str]]:
    from esrepro.planning.claim_plan import ClaimPlan
    from esrepro.planning.plan import Plan
    from esrepro.planning.specs import claims_spec

    p = _pipeline("paper_eggroll.yaml")
    return claims_spec(p, ["eggroll_matches_es"]), ClaimPlan(Plan(p)).files("eggroll_matches_es")


def _claim(root: Path, accuracies: dict[str, float], scale: str = "paper") -> pd.Series:
    """The claims table's low-rank row on the extension config's paths, every Table 1 model evaluated on 2,000
    problems at ``accuracies`` (% by method), problem difficulty shared by a model's methods (:func:`_eval`)."""
    from esrepro.report.claims.table import claim_rows, claims_table

    p = _pipeline("paper_eggroll.yaml")
    rng = np.random.default_rng(5)
    results = root / "work" / "paper_eggroll" / "results"
    for model in p.train_models("countdown"):
        difficulty = rng.standard_normal(2000)
        for method, acc in accuracies.items():
            _eval(results, model, method, acc, 2000, rng, difficulty=difficulty)
    spec, files = _claim_spec()
    inputs = [str(root / f) for f in files]
    display = {m: p.model(m).display for m in p.train_models("countdown")}
    rows = claim_rows(results, inputs, {}, display, spec, only=["eggroll_matches_es"])
    return claims_table(rows, scale).set_index("Claim").loc[CLAIM]


def test_equal_accuracy_at_every_rank_holds(tmp_path):
    row = _claim(tmp_path, {"base": 40.0, "eslinear": 60.0, "es": 60.0, "eggroll1": 60.0, "eggroll4": 60.0})
    assert row["Verdict"] == V.HOLDS, row["Reason"]
    assert "This pipeline's question" in row["Where"] and row["Reproduced"] == "no paper number"
    assert row["Interval"].count("EGGROLL (rank 1)") == 7 and "(problems)" in row["Interval"]


def test_a_rank_that_keeps_half_the_gain_does_not_hold_and_is_named(tmp_path):
    # control gains 20 points; rank 4 keeps 10 of them (50%), rank 1 keeps 19 (95%)
    row = _claim(tmp_path, {"base": 40.0, "eslinear": 60.0, "es": 60.0, "eggroll1": 59.0, "eggroll4": 50.0})
    assert row["Verdict"] == V.FAILS, row["Reason"]
    assert "EGGROLL (rank 4)" in row["Reason"] and "does not hold" in row["Why"]
    assert "EGGROLL (rank 1)" not in row["Why"].split("does not hold")[1]


def test_a_control_arm_that_gains_nothing_leaves_the_claim_open_whatever_low_rank_does(tmp_path):
    row = _claim(tmp_path, {"base": 50.0, "eslinear": 50.0, "es": 60.0, "eggroll1": 30.0, "eggroll4": 50.0})
    assert row["Verdict"] == V.NOT_RESOLVED, row["Reason"]
    assert "control arm's gain over the base model is not established" in row["Reason"]


def test_without_the_control_arm_or_the_base_model_nothing_is_decided(tmp_path):
    row = _claim(tmp_path, {"base": 40.0, "es": 60.0, "eggroll1": 60.0, "eggroll4": 30.0})
    assert row["Verdict"] == V.UNTESTABLE and "the control arm not evaluated" in row["Reason"]
    row = _claim(tmp_path / "nobase", {"eslinear": 60.0, "es": 60.0, "eggroll1": 60.0, "eggroll4": 30.0})
    assert row["Verdict"] == V.UNTESTABLE and "the base model not evaluated" in row["Reason"]


def test_seeds_decide_a_refutation_where_each_arm_has_several():
    """Training's spread over seeds: a low-rank run below the bound on paired problems alone (one checkpoint each,
    4,000 problems) but within the seeds' spread is not refuted with three seeds an arm; far below it, it is."""
    from esrepro.report.claims import es_variants as EV
    from esrepro.report.claims.evidence import Evals

    rng = np.random.default_rng(8)
    difficulty = rng.standard_normal(4000)

    def arm(accs):
        from scipy.stats import norm
        return {s: 0.8 * difficulty + 0.6 * rng.standard_normal(difficulty.size) < norm.ppf(a / 100)
                for s, a in enumerate(accs)}

    def verdict(low):
        key = ("countdown", "test", "m")
        evals = Evals.from_outcomes({(*key, "base"): arm([20.0]), (*key, "eslinear"): arm([46.0, 50.0, 54.0]),
                                     (*key, "eggroll1"): arm(low)})
        return EV.matches_row(evals, {}, {"eggroll1": "rank 1"}, {"eslinear": "control"}, "countdown",
                              "test").outcome
    spread = verdict([38.0, 42.0, 46.0])  # D = 42 - 40 - 4 = -2 on average, seeds 4 points apart
    assert spread.verdict == V.NOT_RESOLVED and "(seeds)" in spread.reason, spread.reason
    assert "-" in spread.reason.split("(problems)")[0]
    far = verdict([28.0, 30.0, 32.0])  # keeps a third of the gain
    assert far.verdict == V.FAILS, far.reason


def test_a_rank_not_run_leaves_the_claim_untested_and_below_paper_scale_only_the_rule_is_shown(tmp_path):
    row = _claim(tmp_path, {"base": 40.0, "eslinear": 60.0, "es": 60.0, "eggroll1": 60.0})
    assert "not testable: " in row["Why"] and "(not testable: " in row["Reason"]
    assert "EGGROLL (rank 4)" in row["Why"].split("not testable: ")[1]
    tiny = _claim(tmp_path / "tiny", {"base": 40.0, "eslinear": 60.0, "es": 60.0, "eggroll1": 60.0,
                                      "eggroll4": 60.0}, scale="tiny")
    assert tiny["Verdict"] == V.UNTESTABLE and tiny["Rule on this run"] == V.HOLDS
