"""The claims table: its verdict rules on constructed evidence, and a paper-scale results folder assembled from the
papers' published numbers alone (config/published.yaml)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from esrepro.report import verdicts as V
from esrepro.report.claims import claim_rows, claims_table
from esrepro.steps import registry_entries

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "config" / "published.yaml"
N_COUNTDOWN = 2000  # the paper's Countdown test set


def _published() -> dict:
    return yaml.safe_load(PUBLISHED.read_text())


def _display() -> dict[str, str]:
    return {k: v["display"] for k, v in registry_entries(ROOT / "config" / "models.yaml").items()}


# --- the rules -------------------------------------------------------------------------------------------------------
def test_margin_rule_holds_fails_and_reaches_zero():
    ahead = np.r_[np.ones(40), np.zeros(160)]  # A right on 40 more problems of 200
    boot = V.bootstrap_margin([ahead])
    assert boot.estimate == pytest.approx(20.0) and boot.lo > 0
    assert V.margin_outcome("A - B", boot).verdict == V.HOLDS
    behind = V.bootstrap_margin([-ahead])
    assert V.margin_outcome("A - B", behind).verdict == V.FAILS
    assert "below 0" in V.margin_outcome("A - B", behind).reason
    tied = V.bootstrap_margin([np.r_[np.ones(3), -np.ones(2), np.zeros(195)]])
    out = V.margin_outcome("A - B", tied)
    assert out.verdict == V.FAILS and "reaches 0" in out.reason
    # the seed interval also has to clear 0: two seeds far apart do not show the margin
    wide = V.seed_interval([30.0, 10.0], [12.0, 11.0])
    assert wide is not None and wide.lo < 0
    assert V.margin_outcome("A - B", boot, wide).verdict == V.FAILS
    assert V.seed_interval([30.0], [12.0, 11.0]) is None  # fewer than 2 seeds: no interval


def test_bootstrap_is_reproducible_and_stratified():
    a = np.r_[np.ones(10), np.zeros(90)]
    assert V.bootstrap_margin([a]) == V.bootstrap_margin([a])
    two = V.bootstrap_margin([a, np.zeros(50)])  # the mean over sets, not over pooled problems
    assert two.estimate == pytest.approx(5.0)


def test_ratio_rule_and_combine_and_gate():
    iv = V.std_ratio_interval(0.062, 4, 0.004, 4)  # the paper's Table 2: 15.5x over four seeds each
    assert iv.estimate == pytest.approx(15.5) and iv.lo > 1
    assert V.ratio_outcome("GRPO / ES", iv).verdict == V.HOLDS
    assert V.ratio_outcome("GRPO / ES", V.std_ratio_interval(0.01, 2, 0.008, 2)).verdict == V.FAILS
    assert V.std_ratio_interval(0.06, 1, 0.004, 4) is None
    fails = V.combine([("m1", V.Outcome(V.HOLDS, "ok")), ("m2", V.Outcome(V.FAILS, "ES below PPO")),
                       ("m3", V.untestable("not run"))])
    assert fails.verdict == V.FAILS and "m2" in fails.reason and "m1" not in fails.reason and "m3" in fails.reason
    assert V.combine([("m", V.untestable("not run"))]).verdict == V.UNTESTABLE
    final, measured = V.gate(V.Outcome(V.HOLDS, "x"), "tiny")
    assert final.verdict == V.UNTESTABLE and measured == V.HOLDS and "tiny scale" in final.reason
    assert V.gate(V.Outcome(V.FAILS, "x"), "paper") == (V.Outcome(V.FAILS, "x"), V.FAILS)


# --- a paper-scale results folder from the published numbers -------------------------------------------------------
def _eval(root: Path, task: str, model: str, method: str, accuracy: float, n: int, seed: int = 0) -> None:
    """An evaluation with ``accuracy`` (%) of ``n`` problems: the first round(accuracy * n / 100) right."""
    d = root / "eval" / task / model / method / f"seed{seed}" / "test"
    d.mkdir(parents=True)
    k = round(accuracy * n / 100)
    (d / "metrics.json").write_text(json.dumps({"task": task, "split": "test", "model": model, "method": method,
                                                "seed": seed, "accuracy": k / n, "n": n}))
    (d / "responses.jsonl").write_text("".join(json.dumps({"id": i, "correct": i < k, "response": ""}) + "\n"
                                               for i in range(n)))


def _kl(root: Path, model: str, method: str, seed: int, algorithm: str, hyper: dict, reward: float, kl: float,
        words: bool) -> None:
    d = root / "kl" / "conciseness" / model / method / f"seed{seed}"
    d.mkdir(parents=True)
    raw = (reward - 1.0) * 2000.0  # the paper's normalised reward 1 + R/2000
    point = {"iteration": 1000, "k3": kl, "k1": kl, "exact": kl, "reward": raw, "reward_sampled": raw}
    (d / "kl.json").write_text(json.dumps({"model": model, "method": method, "seed": seed, "algorithm": algorithm,
                                           "hyper": hyper, "reward": raw, "reward_sampled": raw, "k1": kl, "k3": kl,
                                           "exact": kl, "checkpoints": [point]}))
    text = "The answer is short." if words else "?! .. ))</> ;;"
    (d / "samples.jsonl").write_text("".join(json.dumps({"id": "p", "sample": i, "response": text, "reward": raw})
                                             + "\n" for i in range(20)))


def _essa_run(root: Path, method: str, algorithm: str, engines: int | None, curve: list[tuple[float, float]]) -> None:
    d = root / "runs" / "gsm8k" / "qwen2.5-math-7b" / method / "seed0"
    d.mkdir(parents=True)
    settings = {"task": "gsm8k", "model": "qwen2.5-math-7b", "method": method, "algorithm": algorithm}
    manifest = {"settings": settings, "seed": 0}
    if algorithm == "essa":
        settings.update(population=192, rank=16, precision="native", engines=engines)
        manifest.update(essa={"val_reward_sft": 0.6}, engines=engines)
    else:
        manifest["essa_baseline"] = {"val_reward_sft": 0.6}
    (d / "manifest.json").write_text(json.dumps(manifest))
    (d / "log.jsonl").write_text("".join(json.dumps({"iteration": i, "elapsed_seconds": t, "val_reward": v,
                                                     "reward_mean": v}) + "\n" for i, (t, v) in enumerate(curve)))


def paper_fixture(root: Path, table1_override: dict | None = None) -> Path:
    """A results folder whose numbers are the papers' (config/published.yaml) and nothing else."""
    pub = _published()["tables"]
    for model, row in pub["table1_countdown"]["models"].items():
        for method, acc in {**row, **((table1_override or {}).get(model, {}))}.items():
            _eval(root, "countdown", model, method, acc, N_COUNTDOWN)
    for key, task in (("puzzles_sudoku", "sudoku"), ("puzzles_arc", "arc")):
        for model, row in pub[key]["models"].items():
            for method, acc in row.items():
                _eval(root, task, model, method, acc, 200)
    t2 = pub["table2_conciseness"]
    _kl(root, "qwen2.5-7b-instruct", "base", 0, "base", {}, 0.5, 0.0, words=True)
    for r in t2["rows"]:
        algo = r["algorithm"]
        hyper = {"sigma": r["sigma"], "alpha": r["alpha"]} if algo == "es" else \
            {"beta": r["beta"], "learning_rate": r["learning_rate"]}
        method = f"es_sigma{r['sigma']:g}" if algo == "es" else f"grpo_beta{r['beta']:g}"
        d = r["reward_std"] * math.sqrt(3) / 2  # four seeds m +- d: sample std reward_std
        for seed, sign in enumerate((1, -1, 1, -1)):
            _kl(root, r["model"], method, seed, algo, hyper, r["reward"] + sign * d, r["kl"], words=not r["hacked"])
    # ESSA: Fig. 8 (ESSA over 0.80 within 25 minutes on 8 GPUs, GRPO after 50) and Fig. 2 (290 minutes to 0.76 on 8
    # GPUs, under 80 on 128), as curves of held-out accuracy against seconds
    _essa_run(root, "essa_ref", "essa", 8, [(600.0, 0.70), (1440.0, 0.81), (17400.0, 0.81)])
    _essa_run(root, "essa_grpo", "verl_grpo", None, [(1500.0, 0.70), (3060.0, 0.81)])
    _essa_run(root, "essa_eng128", "essa", 128, [(300.0, 0.70), (1300.0, 0.77)])
    return root


SETTINGS = dict(reward_cutoff=0.85, hacking_margin=0.2, essa_target=0.76)


def _table(root: Path, scale: str = "paper") -> pd.DataFrame:
    return claims_table(claim_rows(root, _published(), _display(), **SETTINGS), scale)


def test_the_papers_numbers_support_their_claims(tmp_path):
    df = _table(paper_fixture(tmp_path)).set_index("Claim")
    supported = ["ES improves every base model", *[c for c in df.index if c.startswith("ES beats every RL")],
                 "ES's reward-KL Pareto front dominates GRPO's", "GRPO with small beta hacks the reward; ES does not",
                 "ES's reward varies less over seeds than GRPO's", "ES lifts Sudoku from near zero",
                 "ES lifts ARC-AGI from near zero", "ESSA reaches the target accuracy sooner than GRPO (wall clock)",
                 "ESSA's time to the target falls as engines (GPUs) are added"]
    assert len([c for c in df.index if c.startswith("ES beats every RL")]) == 7  # one row per Table 1 model
    for claim in supported:
        assert df.loc[claim, "Verdict"] == V.HOLDS, (claim, df.loc[claim, "Reason"])
    # claims whose numbers the papers do not publish are not testable from them, each with its reason
    for claim in ("ES needs fewer training samples than RL to reach RL's best accuracy",
                  "ES is competitive with the RL checkpoints on math",
                  "ESSA with INT8 and INT4 inference does at least as well as BF16"):
        assert df.loc[claim, "Verdict"] == V.UNTESTABLE and df.loc[claim, "Reason"]


def test_es_below_an_rl_method_does_not_hold_and_names_the_model(tmp_path):
    # Qwen2.5-3B: ES 40.0 against the paper's Dr.GRPO-v 43.8
    df = _table(paper_fixture(tmp_path, {"qwen2.5-3b-instruct": {"es": 40.0}})).set_index("Claim")
    row = df.loc["ES beats every RL baseline: Qwen2.5-3B-Instruct"]
    assert row["Verdict"] == V.FAILS
    assert "Qwen2.5-3B-Instruct" in row["Reason"] and "Dr.GRPO-v" in row["Reason"]
    assert "GRPO-z (8)" not in row["Reason"]  # ES is still above the baselines it beats
    assert df.loc["ES beats every RL baseline: Qwen2.5-7B-Instruct", "Verdict"] == V.HOLDS
    assert df.loc["ES improves every base model", "Verdict"] == V.HOLDS


def test_below_the_papers_scale_nothing_is_tested_and_the_measured_outcome_is_kept(tmp_path):
    df = _table(paper_fixture(tmp_path), scale="tiny").set_index("Claim")
    assert set(df["Verdict"]) == {V.UNTESTABLE}
    assert df.loc["ES improves every base model", "Rule on this run"] == V.HOLDS
    assert "tiny scale" in df.loc["ES improves every base model", "Reason"]


def test_untestable_when_methods_or_seeds_are_missing(tmp_path):
    _eval(tmp_path, "countdown", "qwen2.5-7b-instruct", "base", 31.2, 200)
    _eval(tmp_path, "countdown", "qwen2.5-7b-instruct", "es", 66.8, 200)
    _kl(tmp_path, "m", "base", 0, "base", {}, 0.5, 0.0, words=True)
    _kl(tmp_path, "m", "es_sigma0.001", 0, "es", {"sigma": 0.001, "alpha": 5e-4}, 0.9, 0.3, words=True)
    _kl(tmp_path, "m", "grpo_beta0", 0, "grpo", {"beta": 0.0, "learning_rate": 5e-6}, 0.9, 0.9, words=False)
    df = _table(tmp_path).set_index("Claim")
    assert df.loc["ES improves every base model", "Verdict"] == V.HOLDS
    row = df.loc["ES beats every RL baseline: Qwen2.5-7B-Instruct"]
    assert row["Verdict"] == V.UNTESTABLE and "PPO-z not run" in row["Reason"]
    stab = df.loc["ES's reward varies less over seeds than GRPO's"]
    assert stab["Verdict"] == V.UNTESTABLE and "fewer than 2 seeds" in stab["Reason"]
    assert df.loc["ESSA reaches the target accuracy sooner than GRPO (wall clock)", "Verdict"] == V.UNTESTABLE
    assert df.loc["GRPO with small beta hacks the reward; ES does not", "Verdict"] == V.HOLDS


def test_the_step_writes_the_table_and_its_manifest(tmp_path):
    from esrepro.steps.report import claims

    results = paper_fixture(tmp_path / "results")
    out = tmp_path / "tables" / "claims"
    out.parent.mkdir()
    figure = tmp_path / "figures" / "claims_margins"
    figure.parent.mkdir()
    claims(str(results), str(PUBLISHED), str(ROOT / "config" / "models.yaml"),
           {"scale": "paper", **SETTINGS}, str(out), inputs=[], figure=str(figure))
    for ext in (".csv", ".md", ".tex", ".manifest.json"):
        assert Path(f"{out}{ext}").is_file()
    for ext in (".png", ".pdf", ".manifest.json"):
        assert Path(f"{figure}{ext}").is_file()
    margins = pd.read_csv(f"{figure}.csv")
    # every model's ES - base and ES - RL margin of Table 1, and the two puzzles'
    assert len(margins) == 7 * 6 + 2 and (margins["problems_lo"] > 0).all()
    assert "ES - Dr.GRPO-v on Qwen2.5-3B-Instruct" in set(margins["comparison"])
    df = pd.read_csv(f"{out}.csv")
    assert list(df.columns)[:2] == ["Claim", "Where"] and set(df["Verdict"]) <= set(V.VERDICTS)
    assert "holds" in Path(f"{out}.md").read_text()
    tex = Path(f"{out}.tex").read_text()
    assert "\\begin{longtable}" in tex and "Qwen2.5-3B-Instruct" in tex
    with pytest.raises(ValueError, match="scale"):
        claims(str(results), str(PUBLISHED), str(ROOT / "config" / "models.yaml"), {}, str(out))


def test_the_ro_crate_names_the_claims_table_as_its_headline(tmp_path):
    pytest.importorskip("rocrate")
    from esrepro.io import write_text
    from esrepro.provenance.rocrate import export_crate

    root = tmp_path / "repo"
    files = {"Snakefile": "rule all:\n", "config/config.yaml": "models: [tiny]\n", "results/tables/t.csv": "a\n1\n",
             "results/tables/claims.csv": "Claim,Verdict\nx,holds\n"}
    for rel, text in files.items():
        write_text(root / rel, text)
    outputs = ["results/tables/t.csv", "results/tables/claims.csv"]
    path = export_crate(tmp_path / "crate", ["Snakefile"], ["config/config.yaml"], [], outputs, [], root=root,
                        headline="results/tables/claims.csv")
    graph = {e["@id"]: e for e in json.loads(path.read_text())["@graph"]}
    action = graph["#run"] if "#run" in graph else next(e for e in graph.values() if e.get("@type") == "CreateAction")
    assert action["result"][0]["@id"] == "results/tables/claims.csv"
    assert graph["./"]["about"]["@id"] == "results/tables/claims.csv"
    assert "headline" in graph["results/tables/claims.csv"]["description"].lower()
    assert "results/tables/claims.csv" in (tmp_path / "crate" / "README.md").read_text()
    with pytest.raises(ValueError, match="headline"):
        export_crate(tmp_path / "crate2", ["Snakefile"], ["config/config.yaml"], [], outputs[:1], [], root=root,
                     headline="results/tables/claims.csv")


def test_audit_defaults_to_the_claims_table():
    import inspect

    from esrepro.steps.provenance import main_audit

    assert inspect.signature(main_audit).parameters["target"].default == "results/tables/claims.csv"


def test_golden_keeps_the_claims_table_and_the_readme_shows_it(tmp_path, monkeypatch):
    """On the committed tiny results: the step runs, `esrepro golden` keeps its table, the README block shows it."""
    import shutil

    from esrepro.provenance.golden import readme_results, snapshot
    from esrepro.steps.report import claims

    golden = ROOT / "golden" / "tiny"
    shutil.copytree(golden / "results", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    claims("results", str(PUBLISHED), str(ROOT / "config" / "models.yaml"),
           {"scale": "tiny", "reward_cutoff": 0.85, "hacking_margin": 0.2, "essa_target": 0.125},
           "results/tables/claims", inputs=["results/eval/countdown/tiny/es/seed0/test/metrics.json"])
    df = pd.read_csv("results/tables/claims.csv")
    assert set(df["Verdict"]) == {V.UNTESTABLE}  # the tiny scale tests no claim of the papers
    assert (df["Reason"].str.len() > 0).all()
    kept = snapshot(tmp_path, tmp_path / "golden")
    assert "results/tables/claims.csv" in kept and "results/tables/claims.md" in kept
    block = readme_results(tmp_path / "golden")
    assert "| ES improves every base model | ES v2 Table 1, Sec. 4.1 |" in block
    assert block.count("| not testable |") == len(df)


def test_measured_seconds_stay_in_their_own_column(tmp_path):
    """ESSA's wall-clock claim: GRPO faster than ESSA does not hold at the paper's scale; below it, the seconds and the
    rule's outcome on them stay in the seconds column, so the rest of the table is the same whatever the times."""
    from esrepro.provenance.golden import _rows

    claim = "ESSA reaches the target accuracy sooner than GRPO (wall clock)"
    slow, fast = paper_fixture(tmp_path / "slow"), paper_fixture(tmp_path / "fast")
    grpo_log = fast / "runs/gsm8k/qwen2.5-math-7b/essa_grpo/seed0/log.jsonl"
    grpo_log.write_text("".join(json.dumps({"iteration": i, "elapsed_seconds": t, "val_reward": v}) + "\n"
                                 for i, (t, v) in enumerate([(300.0, 0.70), (900.0, 0.81)])))
    paper = _table(fast).set_index("Claim")
    assert paper.loc[claim, "Verdict"] == V.FAILS and "GRPO 900 s" in paper.loc[claim, "Reason"]
    tables = {}
    for name, root in (("slow", slow), ("fast", fast)):
        _table(root, scale="tiny").to_csv(tmp_path / f"{name}.csv", index=False)
        tables[name] = pd.read_csv(tmp_path / f"{name}.csv").set_index("Claim")
    assert "holds" in tables["slow"].loc[claim, "This run, wall seconds"]
    assert "does not hold" in tables["fast"].loc[claim, "This run, wall seconds"]
    assert _rows(tmp_path / "slow.csv") == _rows(tmp_path / "fast.csv")  # what `esrepro compare` compares


@pytest.mark.parametrize("config, scale", [("config.yaml", "tiny"), ("paper.yaml", "paper")])
def test_the_rule_reads_what_the_table_needs(config, scale):
    """The claims rule's inputs (esrepro.plan.Plan.claims_inputs) and settings (esrepro.specs.claims_spec) for the
    default and the paper's configuration: every evaluation with its per-problem responses, the conciseness study,
    the sample curves, the ESSA runs; and the config's scale."""
    from esrepro.config import read_config
    from esrepro.pipeline.load import load_pipeline
    from esrepro.plan import Plan
    from esrepro.specs import claims_spec

    pipeline = load_pipeline(read_config(ROOT / "config" / config, root=ROOT), f"config/{config}", root=ROOT)
    plan = Plan(pipeline)
    inputs = plan.claims_inputs()
    spec = claims_spec(pipeline)
    assert spec["scale"] == scale and spec["task"] == "countdown" and spec["essa_target"] is not None
    assert spec["reward_cutoff"] == pipeline.studies()["conciseness"].reward_cutoff
    metrics = [p for p in inputs if p.endswith("/metrics.json")]
    assert set(plan.eval_metrics()) <= set(metrics)
    assert all(p.replace("metrics.json", "responses.jsonl") in inputs for p in metrics)
    assert set(plan.conciseness_kl()) <= set(inputs)
    assert "results/figures/sample_curves_countdown.csv" in inputs
    assert any(p.endswith("/essa_ref/seed0/log.jsonl") for p in inputs)
    assert "results/tables/claims.csv" in plan.table_targets()
