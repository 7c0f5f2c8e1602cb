"""The claims table: its verdict rules on drawn evidence, and a paper-scale results folder whose numbers are the
papers' own (config/published.yaml), with per-problem outcomes drawn independently per method (as real evaluations
produce them) and, for contrast, nested ("the first k problems right"). Rows read only the files their rules
declare (esrepro.planning.claim_plan), through the paper configuration's own plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from claims_fixture import N_COUNTDOWN, PUBLISHED, ROOT, paper_fixture
from claims_fixture import eval_run as _eval
from claims_fixture import inputs as _inputs
from claims_fixture import kl_run as _kl
from claims_fixture import pipeline as _pipeline
from claims_fixture import spec as _spec
from claims_fixture import table as _table
from esrepro.report import verdicts as V

ES_BEATS = "ES beats every RL baseline"


# --- the rules -------------------------------------------------------------------------------------------------------
def test_margin_rule_separates_confirmation_from_refutation():
    rng = np.random.default_rng(7)
    a, b = rng.random(2000) < 0.60, rng.random(2000) < 0.40  # independent outcomes, 20 points apart
    ahead = V.bootstrap_margin([a.astype(float) - b])
    assert ahead.lo > 0 and V.margin_outcome("A - B", ahead).verdict == V.HOLDS
    behind = V.bootstrap_margin([b.astype(float) - a])
    out = V.margin_outcome("A - B", behind)
    assert out.verdict == V.FAILS and "below 0" in out.reason
    c = rng.random(2000) < 0.40  # the same accuracy, drawn again: a margin within the noise of 2,000 problems
    close = V.bootstrap_margin([c.astype(float) - b])
    out = V.margin_outcome("A - B", close)
    assert close.lo < 0 < close.hi and out.verdict == V.NOT_RESOLVED and "includes" in out.reason
    # non-inferiority: the null moves to -d
    assert V.margin_outcome("A - B", close, null=-5.0).verdict == V.HOLDS
    assert V.margin_outcome("A - B", behind, null=-5.0).verdict == V.FAILS
    # the seed interval also has to clear the null: two seeds far apart do not confirm
    wide = V.seed_interval([30.0, 10.0], [12.0, 11.0])
    assert wide is not None and wide.lo < 0 < wide.hi
    assert V.margin_outcome("A - B", ahead, wide).verdict == V.NOT_RESOLVED
    assert V.seed_interval([30.0], [12.0, 11.0]) is None


def test_bootstrap_is_reproducible_and_stratified():
    a = np.r_[np.ones(10), np.zeros(90)]
    assert V.bootstrap_margin([a]) == V.bootstrap_margin([a])
    assert V.bootstrap_margin([a, np.zeros(50)]).estimate == pytest.approx(5.0)


def test_ratio_rule_combine_and_gate():
    iv = V.std_ratio_interval(0.062, 4, 0.004, 4)  # the paper's Table 2: 15.5x over four seeds each
    assert iv.estimate == pytest.approx(15.5) and V.ratio_outcome("GRPO / ES", iv).verdict == V.HOLDS
    assert V.ratio_outcome("GRPO / ES", V.std_ratio_interval(0.01, 2, 0.008, 2)).verdict == V.NOT_RESOLVED
    assert V.ratio_outcome("GRPO / ES", V.std_ratio_interval(0.001, 8, 0.05, 8)).verdict == V.FAILS
    assert V.std_ratio_interval(0.06, 1, 0.004, 4) is None
    cases = [("m1", V.Outcome(V.HOLDS, "ok")), ("m2", V.Outcome(V.NOT_RESOLVED, "close")),
             ("m3", V.untestable("not run"))]
    out = V.combine(cases)
    assert out.verdict == V.NOT_RESOLVED and "m2" in out.reason and "m1" not in out.reason and "m3" in out.reason
    assert V.combine(cases + [("m4", V.Outcome(V.FAILS, "below"))]).verdict == V.FAILS
    assert V.combine([("m", V.untestable("not run"))]).verdict == V.UNTESTABLE
    final, measured = V.gate(V.Outcome(V.HOLDS, "x"), "tiny")
    assert final.verdict == V.UNTESTABLE and measured == V.HOLDS and "tiny scale" in final.reason
    assert V.gate(V.Outcome(V.FAILS, "x"), "paper") == (V.Outcome(V.FAILS, "x"), V.FAILS)


# --- a paper-scale results folder from the published numbers -------------------------------------------------------


def _rooted(tmp_path: Path) -> Path:
    """The fixture's results folder at the configuration's own path (results/ under tmp_path)."""
    return tmp_path / "results"


def test_a_faithful_run_with_independent_outcomes_gets_no_does_not_hold(tmp_path):
    df = _table(paper_fixture(_rooted(tmp_path))).set_index("Claim")
    assert (df["Verdict"] != V.FAILS).all(), df[df["Verdict"] == V.FAILS]["Reason"].to_dict()
    beats = df[df.index.str.startswith(ES_BEATS)]
    assert len(beats) == 7  # one row per Table 1 model
    # the paper's close margins are within the noise of 2,000 problems: not resolved, each with its interval
    for model, baseline in (("Qwen2.5-0.5B-Instruct", "Dr.GRPO-v"), ("Llama-3.2-1B-Instruct", "GRPO-v")):
        row = df.loc[f"{ES_BEATS}: {model}"]
        assert row["Verdict"] == V.NOT_RESOLVED, row["Reason"]
        assert baseline in row["Why"] and f"ES - {baseline}" in row["Interval"]
    for model in ("Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct", "Llama-3.1-8B-Instruct"):
        assert df.loc[f"{ES_BEATS}: {model}", "Verdict"] == V.HOLDS
    for claim in ("ES improves every base model", "GRPO with small beta hacks the reward; ES does not",
                  "ES lifts Sudoku from near zero", "ES lifts ARC-AGI from near zero",
                  "ESSA reaches 0.80 in under half GRPO's time", "ESSA needs fewer training problems than GRPO",
                  "ESSA's time to 0.76 falls as GPUs are added", "ESSA improves accuracy over training"):
        assert df.loc[claim, "Verdict"] == V.HOLDS, (claim, df.loc[claim, "Reason"])
    # GRPO's high betas sit left of every ES point: not compared, and the front rule is not refuted by them
    front = df.loc["ES's reward-KL front lies above GRPO's"]
    assert front["Verdict"] in (V.HOLDS, V.NOT_RESOLVED) and "left of every ES point" in front["This run"]
    # the paper's numbers reproduce themselves wherever the paper gives one
    numbered = df[df["Reproduced"].isin(["yes", "no"])]
    assert len(numbered) >= 10 and (numbered["Reproduced"] == "yes").all(), numbered["Reproduced, detail"].to_dict()
    assert df.loc["ES's reward varies less over seeds than GRPO's", "Reproduced"] in ("yes", "no")
    # claims whose numbers are not published or not planned are not testable, each with its reason
    for claim in ("ES is ahead of RL throughout training", "ES is competitive with the RL checkpoints on math",
                  "ESSA with INT8 and INT4 does at least as well as BF16", "ESSA beats GRPO by 22.5% on IFEval (v3)"):
        assert df.loc[claim, "Verdict"] == V.UNTESTABLE and df.loc[claim, "Reason"]
    assert "not planned" in df.loc["ESSA beats GRPO by 22.5% on IFEval (v3)", "Reason"]


def test_nested_outcomes_make_every_paper_margin_hold(tmp_path):
    """"The first k right": every disagreement favours the better method, so even the close margins clear 0."""
    df = _table(paper_fixture(_rooted(tmp_path), nested=True)).set_index("Claim")
    beats = df[df.index.str.startswith(ES_BEATS)]
    assert (beats["Verdict"] == V.HOLDS).all(), beats["Reason"].to_dict()


@pytest.mark.parametrize("nested, es", [(True, 40.0), (False, 36.0)])
@pytest.mark.slow
def test_es_clearly_below_a_baseline_does_not_hold_and_names_model_and_baseline(tmp_path, nested, es):
    """Qwen2.5-3B's ES below the paper's Dr.GRPO-v 43.8 on 2,000 problems: 40.0 with nested outcomes (every
    disagreement against ES), 36.0 with independent draws (a deficit well outside the noise of one draw)."""
    df = _table(paper_fixture(_rooted(tmp_path), nested=nested, table1_override={"qwen2.5-3b-instruct": {"es": es}})) \
        .set_index("Claim")
    row = df.loc[f"{ES_BEATS}: Qwen2.5-3B-Instruct"]
    assert row["Verdict"] == V.FAILS, row["Reason"]
    assert "Qwen2.5-3B-Instruct" in row["Reason"] and "Dr.GRPO-v" in row["Reason"] and "Dr.GRPO-v" in row["Why"]
    assert "GRPO-z (8)" not in row["Why"]  # ES is still above the baselines it beats
    assert row["Reproduced"] == "no" and f"ES {es:.0f}" in row["Reproduced, detail"]
    assert df.loc[f"{ES_BEATS}: Qwen2.5-7B-Instruct", "Verdict"] == V.HOLDS


@pytest.mark.slow
def test_the_learning_rate_sweep_beside_the_study_does_not_enter_the_hacking_rule(tmp_path):
    """App. A.4: at small learning rates GRPO stays close to the base model (no hacking). Those runs sit beside the
    study's in kl/conciseness/, but the hacking rule reads only the study's runs; the sweep's own row reads them."""
    root = paper_fixture(_rooted(tmp_path))
    sweep = list(dict.fromkeys(m for _, m, _ in _pipeline().study_runs("conciseness_lr")))
    for method in sweep:
        beta = float(method.split("_lr")[0].removeprefix("grpo_beta"))
        for s in range(4):
            _kl(root, "qwen2.5-7b-instruct", method, s, "grpo", {"beta": beta, "learning_rate": 2e-6},
                [(200, 0.6, 0.1), (1000, 0.7, 0.3)], words=True)
    df = _table(root).set_index("Claim")
    hack = df.loc["GRPO with small beta hacks the reward; ES does not"]
    assert hack["Verdict"] == V.HOLDS and "4/8" in hack["This run"], hack["This run"]
    assert df.loc["ES's front lies above GRPO's over learning rates", "Verdict"] != V.UNTESTABLE
    # no small-beta study run hacks: "sometimes" is a rate above 0, which no count of runs refutes
    for r in (root / "kl" / "conciseness" / "qwen2.5-7b-instruct").glob("grpo_beta0*/seed*/samples.jsonl"):
        if "_lr" not in r.parts[-3]:
            r.write_text(json.dumps({"id": "p", "sample": 0, "response": "Short words.", "reward": 0}) + "\n")
    hack = _table(root).set_index("Claim").loc["GRPO with small beta hacks the reward; ES does not"]
    assert hack["Verdict"] == V.NOT_RESOLVED and "no GRPO run" in hack["Reason"] and "upper bound" in hack["Reason"]
    # and the case that must fail: an ES run hacks
    es = next((root / "kl" / "conciseness" / "qwen2.5-7b-instruct").glob("es_sigma*/seed0/samples.jsonl"))
    es.write_text(json.dumps({"id": "p", "sample": 0, "response": "?! .. ))</> ;;", "reward": 0}) + "\n")
    hack = _table(root).set_index("Claim").loc["GRPO with small beta hacks the reward; ES does not"]
    assert hack["Verdict"] == V.FAILS and "ES hacks" in hack["Reason"]


def test_the_front_rule_compares_over_es_kl_range():
    from esrepro.report.claims.conciseness import front_gaps

    es = [(0.3, 0.89), (0.8, 0.92)]
    grpo = [(0.01, 0.70), (0.05, 0.78), (0.9, 0.87), (1.4, 0.91)]  # high betas left of ES, low reward
    gaps, left = front_gaps(es, grpo)
    assert left == [(0.01, 0.70), (0.05, 0.78)] and min(g for _, g in gaps) == pytest.approx(0.01)
    gaps, _ = front_gaps(es, grpo + [(1.5, 0.95)])  # a GRPO point above ES's front
    assert min(g for _, g in gaps) < 0


def test_below_the_papers_scale_nothing_is_tested_and_the_measured_outcome_is_kept(tmp_path):
    df = _table(paper_fixture(_rooted(tmp_path)), scale="tiny").set_index("Claim")
    assert set(df["Verdict"]) == {V.UNTESTABLE}
    assert df.loc["ES improves every base model", "Rule on this run"] == V.HOLDS
    assert "tiny scale" in df.loc["ES improves every base model", "Reason"]
    assert df.loc["ES improves every base model", "Reproduced"] == "not compared (tiny scale)"


def test_a_row_reads_only_its_declared_runs(tmp_path):
    """A results folder with evaluations no row declares (an extra model and method): no row reads them."""
    root = paper_fixture(_rooted(tmp_path))
    _eval(root, "countdown", "qwen2.5-7b-instruct", "es_other", 99.0, N_COUNTDOWN, np.random.default_rng(3))
    _eval(root, "countdown", "some-model", "es", 99.0, N_COUNTDOWN, np.random.default_rng(4))
    df = _table(root).set_index("Claim")
    assert "some-model" not in " ".join(df["This run"]) and "99" not in df.loc["ES improves every base model",
                                                                                 "This run"]


def test_each_row_names_its_jobs_cost_and_target():
    from esrepro.planning.claim_cost import claim_costs, markdown

    costs = {c.row: c for c in claim_costs(_pipeline())}
    assert costs["es_lifts_sudoku"].gpu_hours < costs["es_beats_rl.qwen2.5-7b-instruct"].gpu_hours
    assert all(c.jobs > 0 and c.target == f"results/claims/{row}.csv" for row, c in costs.items())
    table = markdown(list(costs.values()))
    hours = [float(line.split("|")[5].replace(",", "")) for line in table.splitlines()[2:]]
    assert hours == sorted(hours)  # cheapest first
    spec = _spec()
    assert spec["claims"]["es_lifts_arc"]["gpu_hours"] == pytest.approx(costs["es_lifts_arc"].gpu_hours, abs=1e-3)


def test_one_claims_target_builds_only_its_jobs():
    """`snakemake -n results/claims/es_lifts_sudoku.csv` on the tiny default: the Sudoku runs and nothing else."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "results/claims/es_lifts_sudoku.csv"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] not in ("total", "job"):
            jobs[parts[0]] = int(parts[1])
    assert jobs.get("claim") == 1 and jobs.get("train") == 1 and jobs.get("evaluate") == 2, jobs
    assert not {"kl", "train_cell", "claims", "table1_countdown"} & set(jobs), jobs


def test_the_step_writes_the_table_and_its_manifest(tmp_path):
    from esrepro.steps.report import claims

    results = paper_fixture(_rooted(tmp_path))
    out = tmp_path / "tables" / "claims"
    out.parent.mkdir()
    figure = tmp_path / "figures" / "claims_margins"
    figure.parent.mkdir()
    inputs = [str(tmp_path / f) for f in _inputs() if (tmp_path / f).is_file()]  # the runs the fixture made
    claims(str(results), str(PUBLISHED), str(ROOT / "config" / "models.yaml"), _spec(), str(out), inputs=inputs,
           figure=str(figure))
    for ext in (".csv", ".md", ".tex", ".manifest.json"):
        assert Path(f"{out}{ext}").is_file()
    for ext in (".png", ".pdf", ".manifest.json"):
        assert Path(f"{figure}{ext}").is_file()
    margins = pd.read_csv(f"{figure}.csv")
    assert "ES - Dr.GRPO-v on Qwen2.5-3B-Instruct" in set(margins["comparison"])
    df = pd.read_csv(f"{out}.csv")
    assert list(df.columns)[:2] == ["Claim", "Where"] and set(df["Verdict"]) <= set(V.VERDICTS)
    md = Path(f"{out}.md").read_text()
    # a table a person can read: short cells, each model named once per row
    for line in md.splitlines():
        if line.startswith("| ES beats every RL baseline"):
            assert line.count("Qwen2.5-3B-Instruct") <= 1 or "Qwen2.5-3B-Instruct" not in line
            assert len(line) < 600, line
    assert "\\begin{longtable}" in Path(f"{out}.tex").read_text()
    only = tmp_path / "tables" / "one"
    claims(str(results), str(PUBLISHED), str(ROOT / "config" / "models.yaml"), _spec(), str(only), inputs=inputs,
           only=["es_lifts_arc"])
    assert list(pd.read_csv(f"{only}.csv")["Id"]) == ["es_lifts_arc"]
    with pytest.raises(ValueError, match="scale"):
        claims(str(results), str(PUBLISHED), str(ROOT / "config" / "models.yaml"), {}, str(out))
    with pytest.raises(ValueError, match="no row 'nope'"):
        claims(str(results), str(PUBLISHED), str(ROOT / "config" / "models.yaml"), _spec(), str(only), inputs=inputs,
               only=["nope"])


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
    claims("results", str(PUBLISHED), str(ROOT / "config" / "models.yaml"), _spec("config.yaml"),
           "results/tables/claims", inputs=_inputs("config.yaml"))
    df = pd.read_csv("results/tables/claims.csv")
    assert set(df["Verdict"]) == {V.UNTESTABLE}  # the tiny scale tests no claim of the papers
    assert (df["Reason"].str.len() > 0).all()
    kept = snapshot(tmp_path, tmp_path / "golden")
    assert "results/tables/claims.csv" in kept and "results/tables/claims.md" in kept
    block = readme_results(tmp_path / "golden")
    assert "| ES improves every base model |" in block and "| Claim | Paper | This run | Verdict | Seeds |" in block
    assert block.count("| not testable") == len(df)


@pytest.mark.slow
def test_measured_seconds_stay_in_their_own_column(tmp_path):
    """ESSA's wall-clock claim: GRPO as fast as ESSA does not hold at the paper's scale; below it, the seconds and the
    rule's outcome on them stay in the seconds column, so the rest of the table is the same whatever the times."""
    from esrepro.provenance.golden import _rows

    claim = "ESSA reaches 0.80 in under half GRPO's time"
    slow, fast = paper_fixture(tmp_path / "slow" / "results"), paper_fixture(tmp_path / "fast" / "results")
    grpo_log = fast / "runs/gsm8k/qwen2.5-math-7b/essa_grpo/seed0/log.jsonl"
    grpo_log.write_text("".join(json.dumps({"iteration": i, "elapsed_seconds": t, "val_reward": v}) + "\n"
                                 for i, (t, v) in enumerate([(0.0, 0.62), (300.0, 0.70), (900.0, 0.81)])))
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
def test_the_rule_reads_what_its_rows_declare(config, scale):
    """The claims rule's inputs (esrepro.planning.claim_plan.ClaimPlan.all_files) and settings (esrepro.planning.specs.claims_spec)
    for the default and the paper's configuration: every row's files, and nothing from the learning-rate sweep in
    the hacking row."""
    from esrepro.planning.claim_plan import ClaimPlan
    from esrepro.planning.plan import Plan

    pipeline = _pipeline(config)
    plan = Plan(pipeline)
    claims = ClaimPlan(plan)
    spec = _spec(config)
    assert spec["scale"] == scale and spec["task"] == "countdown" and spec["essa_target"] is not None
    assert set(spec["claims"]) == set(claims.rows())
    inputs = claims.all_files()
    assert all(p.replace("metrics.json", "responses.jsonl") in inputs for p in inputs if p.endswith("metrics.json"))
    assert set(plan.conciseness_kl()) <= set(inputs)
    hacking = claims.files("grpo_small_beta_hacks")
    assert hacking and not any("_lr" in f for f in hacking)
    assert any("_lr" in f for f in claims.files("es_pareto_lr"))
    assert any(p.endswith("/essa_grpo/seed0/log.jsonl") for p in claims.files("essa_faster_than_grpo"))
    assert "results/tables/claims.csv" in plan.table_targets()
    if scale == "paper":
        assert spec["essa_grpo_target"] == 0.80 and spec["essa_target"] == 0.76
        assert any("essa_resample100" in f for f in claims.files("essa_faster_than_grpo"))


def test_the_docs_hold_the_claims_wording_rules_and_costs():
    """docs/claims.md sets each claim's wording beside its rule and the paper config's costs, cheapest first; the
    README shows the cheapest claims."""
    from esrepro.planning.claim_cost import claim_costs, markdown
    from esrepro.report.claims.catalogue import markdown as catalogue

    docs = (ROOT / "docs" / "claims.md").read_text()
    costs = claim_costs(_pipeline())
    assert catalogue() in docs, "docs/claims.md's claims table is stale: paste catalogue.markdown() into it"
    assert markdown(costs) in docs, \
        "docs/claims.md's cost table is stale: paste `esrepro claim-costs config/paper.yaml`"
    assert markdown(costs, limit=6) in (ROOT / "README.md").read_text(), \
        "README's cheapest claims are stale: paste the first 6 rows of `esrepro claim-costs config/paper.yaml`"
