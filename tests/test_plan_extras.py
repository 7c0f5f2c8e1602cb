"""The report extras' wiring: which runs, evaluations, tables and figures the configs ask for; a task added to
`train:` gets runs, evaluations and a table row without code changes; the paper's DAG lists the math, puzzle
and stability jobs; the per-task tables; config errors name file and field."""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_repo
from esrepro.config import ConfigError, load_yaml, read_config
from esrepro.io import write_json
from esrepro.planning.load import load_pipeline
from esrepro.planning.plan import ExtrasPlan, Plan

BIN = Path(sys.executable).parent


def _plan(cfg: dict | str, root: Path = REPO) -> Plan:
    data = read_config(REPO / "config" / cfg, root=REPO) if isinstance(cfg, str) else cfg
    return Plan(load_pipeline(data, "config/test.yaml" if isinstance(cfg, dict) else f"config/{cfg}", root=root))


def _dry_run(repo: Path, configfile: str, *extra: str) -> str:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", *extra, "--configfile", configfile], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


def _stats(out: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", out, re.M)}


# --- the embedded default -------------------------------------------------------------------------------------------
def test_default_plan_lists_every_extras_output():
    plan = _plan("config.yaml")
    extras = ExtrasPlan(plan)
    targets = plan.table_targets()
    for stem in ("results/figures/gains_countdown", "results/figures/sample_curves_countdown",
                 "results/figures/sample_curves_math_train", "results/figures/param_shift_countdown",
                 "results/figures/param_shift_arc", "results/figures/param_shift_conciseness",
                 plan.paths.LR_SWEEP, plan.paths.LR_DISTRIBUTIONS):
        assert f"{stem}.png" in targets and f"{stem}.pdf" in targets, stem
    for stem in (plan.paths.MATH_TABLE, plan.paths.PUZZLE_TABLE, plan.paths.TRAIN_TASKS, plan.paths.TABLE1,
                 plan.paths.TABLE3, plan.paths.STABILITY):
        assert f"{stem}.csv" in targets and f"{stem}.tex" in targets, stem
    # MATH training's runs are evaluated on the five math sets (base and ES of the trained model)
    assert "results/eval/amc23/tiny-v2/es/seed0/test/metrics.json" in extras.math_metrics()
    assert "results/eval/math500/tiny-v2/base/seed0/test/metrics.json" in extras.math_metrics()
    assert not any("/math_train/" in m for m in plan.eval_metrics())  # math_train itself: evaluated via the sets
    # Figure 6: every Countdown run evaluates periodically, ES, the RL methods and low-rank ES alike, the stability
    # seeds too
    assert extras.periodic_runs("countdown") == COUNTDOWN_RUNS
    # Figures 3-4: the sweep's GRPO runs (beta x learning rate), the base model and the conciseness study's ES runs
    kl = extras.lr_sweep_kl()
    assert "results/kl/conciseness/tiny/grpo_beta0.1_lr0.0003/seed0/kl.json" in kl
    assert "results/kl/conciseness/tiny/es_sigma0.005/seed1/kl.json" in kl and len(kl) == 1 + 4 + 4
    # Figures 7-9: one histogram per ES run: Countdown's three seeds, the study's four, math, Sudoku, ARC
    assert len(extras.es_runs()) == 3 + 4 + 3
    # tiny-v2 is warm-started on the math and puzzle formats, their prepared rows excluded
    assert plan.build_inputs("tiny-v2") == [f"data/prepared/{t}" for t in ("math_train", "sudoku", "arc")]
    assert plan.build_inputs("tiny") == ["data/prepared/countdown"]
    assert plan.p.all_models() == ["tiny", "tiny-v2"]


#: Every Countdown run of the default: Table 1's methods at seed 0, then the stability seeds.
COUNTDOWN_RUNS = ([f"results/runs/countdown/tiny/{m}/seed0"
                   for m in ("es", "ppo", "grpo8", "grpo30", "grpov", "drgrpov", "eggroll1", "eggroll4", "eslinear")]
                  + [f"results/runs/countdown/tiny/{m}/seed{s}"
                     for m in ("es", "grpo8", "grpov", "eggroll1", "eggroll4", "eslinear")
                     for s in ((1,) if m.startswith("grpo") else (1, 2))])


def test_a_task_added_to_train_gets_runs_evaluations_and_a_table_row(tmp_path):
    cfg = read_config(REPO / "config" / "config.yaml", root=REPO)
    cfg["data"]["gsm8k"] = {"source": {"kind": "generated", "n_train": 32, "n_test": 20}}
    cfg["train"]["gsm8k"] = {"methods": ["es", "grpo8"]}  # no evaluate.gsm8k entry, no code change
    plan = _plan(cfg)
    runs = plan.train_runs("gsm8k")
    assert ("tiny", "es", 0) in runs and ("tiny", "grpo8", 0) in runs
    metrics = [f"results/eval/gsm8k/tiny/{m}/seed0/test/metrics.json" for m in ("base", "es", "grpo8")]
    assert all(m in plan.eval_metrics() for m in metrics)
    assert all(m in ExtrasPlan(plan).train_task_metrics() for m in metrics)
    assert plan.p.eval_sets_of("gsm8k") == ["gsm8k"]
    assert "results/runs/gsm8k/tiny/grpo8/seed0/selection.json" in plan.all_selections()  # Table 3
    assert "results/figures/sample_curves_gsm8k.png" in plan.table_targets()
    # the DAG has them
    repo = copy_repo(tmp_path / "repo")
    (repo / "config" / "added.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = _dry_run(repo, "config/added.yaml")
    for path in ("results/runs/gsm8k/tiny/es/seed0/checkpoint",
                 "results/runs/gsm8k/tiny/grpo8/seed0/selection.json", *metrics, "results/param_shift/gsm8k/tiny/es/seed0/histogram.json"):
        assert path in out, path
    table_job = next(block for block in out.split("\n\n") if "rule train_tasks_table:" in block)
    assert all(m in table_job for m in metrics)
    # and the table has its row: the table step on those evaluations, with the plan's test-set mapping
    from esrepro.report.task_tables import build_train_tasks_table

    files = []
    for i, (task, method, acc) in enumerate([("gsm8k", "base", 0.1), ("gsm8k", "es", 0.3), ("gsm8k", "grpo8", 0.2),
                                              ("countdown", "base", 0.05)]):
        files.append(tmp_path / f"m{i}.json")
        write_json(files[-1], {"task": task, "split": "test", "model": "tiny", "method": method, "seed": 0,
                               "accuracy": acc, "n": 20})
    sets = {s: t for t in cfg["train"] for s in plan.p.eval_sets_of(t)}
    df = build_train_tasks_table(files, REPO / "config/published.yaml", {"tiny": {"display": "tiny"}}, sets,
                                 tmp_path / "train_tasks")
    row = df[df["Test set"] == "GSM8K"].iloc[0]
    assert (row["Original (ours)"], row["ES (ours)"], row["GRPO-z (8) (ours)"]) == pytest.approx((10.0, 30.0, 20.0))
    assert "GSM8K" in (tmp_path / "train_tasks.md").read_text()


def test_default_dry_run(tmp_path):
    out = _dry_run(copy_repo(tmp_path / "repo"), "config/config.yaml", "-p")
    stats = _stats(out)
    # the commands hand each verb every input: Figure 6 of Countdown reads every run's points
    from esrepro.cli import build_parser

    line = next(x.removeprefix("Shell command: ") for x in out.splitlines()
                if "esrepro sample-curves" in x and "--task countdown" in x)
    parser, _ = build_parser("sample-curves")
    args = parser.parse_args(shlex.split(line.split(" > ")[0])[1:])
    assert args.periodic == [f"{run}/periodic_eval.jsonl" for run in COUNTDOWN_RUNS]
    # ES on Countdown (3 seeds), low-rank ES at ranks 1 and 4 and its control arm beside it (3 seeds each), MATH (and
    # Fig. 2's continuation), Sudoku and ARC; the conciseness study's 4 ES and 8 GRPO runs, the learning-rate sweep's
    # 4; the ESSA study's 7 (reference, population, rank, engines, resampling, scaling x 2)
    assert stats["train"] == 3 + 9 + 4 + 4 + 8 + 4 + 7
    # Table 1's 5 RL methods (GRPO-z (8): 2 learning rates; GRPO-v, Dr.GRPO-v: one cell) and seed 1 of GRPO-z (8)
    # and GRPO-v
    assert stats["train_cell"] == 9 and stats["select_rl"] == 7
    assert stats["param_shift_histogram"] == 10 and stats["param_shift_figure"] == 5
    assert stats["sample_curves"] == 4 and stats["gains"] == 1 and stats["essa_grpo"] == 2
    for rule in ("math_table", "math_figure", "puzzle_table", "train_tasks_table", "lr_sweep", "lr_distributions",
                 "stability_table", "table1_countdown", "table2_conciseness", "table3_rl_hyperparameters", "essa_report",
                 "es_variants_table"):
        assert stats[rule] == 1, rule
    assert stats["build_tiny"] == 2  # tiny and tiny-v2
    # the ESSA reference runs, whose SFT start the GRPO baselines wait for, are scheduled before the short jobs
    ref_jobs = [b for b in out.split("\n\n") if "rule train:" in b and "method=essa_ref," in b]
    assert len(ref_jobs) == 2 and all("priority: 1" in b for b in ref_jobs)


def test_the_essa_reference_runs_start_first():
    """The GRPO baseline waits for its reference run's SFT start: that chain is scheduled before the short jobs."""
    plan = _plan("config.yaml")
    assert plan.train_priority("essa_ref") == 1
    assert {plan.train_priority(m) for m in ("es", "essa_pop16", "essa_eng2", "es_sigma0.005", "grpo_beta0")} == {0}


# --- the paper's DAG ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_paper_dry_run_lists_math_puzzle_and_stability_jobs(tmp_path):
    out = _dry_run(copy_repo(tmp_path / "repo"), "config/paper.yaml")
    stats = _stats(out)
    # the seven Table 1 models, Qwen2.5-Math-7B, ARC-AGI's Qwen2.5-14B-Instruct (v2 Table 3), ESSA's Qwen2.5-32B and
    # Llama-3.1-8B (base models), and v2 Fig. 2's three released RL checkpoints (evaluated only)
    assert stats["fetch_model"] == 14
    assert "results/models/qwen2.5-math-7b/base" in out
    assert "results/runs/math_train/qwen2.5-math-7b/es/seed0/checkpoint" in out
    for s in ("math500", "minerva", "olympiad_bench", "aime24", "amc23"):
        assert f"results/eval/{s}/qwen2.5-math-7b/es/seed0/test/metrics.json" in out
    for task, model in (("sudoku", "qwen2.5-3b-instruct"), ("arc", "qwen2.5-14b-instruct")):
        assert f"results/runs/{task}/{model}/es/seed0/checkpoint" in out
        assert f"results/eval/{task}/{model}/es/seed0/test/metrics.json" in out
    for seed in (1, 2, 3):  # stability: more seeds of every Countdown method for Qwen2.5-3B-Instruct
        assert f"results/runs/countdown/qwen2.5-3b-instruct/es/seed{seed}/checkpoint" in out
        assert f"results/runs/countdown/qwen2.5-3b-instruct/grpo30/seed{seed}/selection.json" in out
    assert "results/runs/countdown/qwen2.5-7b-instruct/es/seed1" not in out
    for rule in ("math_table", "math_figure", "puzzle_table", "stability_table", "train_tasks_table", "gains",
                 "sample_curves", "lr_sweep", "lr_distributions"):
        assert stats[rule] == 1, rule
    assert "es_variants_table" not in stats  # low-rank ES is config/paper_eggroll.yaml's, not the papers' run
    assert stats["param_shift_histogram"] == 7 + 3 + 3 + 12  # Countdown ES (+ stability seeds), math/puzzles, study
    # v2 Table 4's (beta, lr) cells; GRPO-v's one cell; conciseness GRPO with group 30; the lr x beta sweep
    assert "results/runs/countdown/qwen2.5-0.5b-instruct/grpo8/grid/lr1e-05_beta0.005/seed0" in out
    assert "results/runs/countdown/qwen2.5-3b-instruct/grpov/grid/default/seed3" in out  # stability seeds too
    assert "results/runs/countdown/qwen2.5-0.5b-instruct/grpo8/grid/lr1e-05_beta0_pbs15_ga8_len1024" not in out
    assert "results/kl/conciseness/qwen2.5-7b-instruct/grpo_beta1_lr0.000005/seed3/kl.json" in out
    # the math run follows the authors' recipe
    p = _plan("paper.yaml").p
    es = p.method_settings("qwen2.5-math-7b", "math_train", "es")
    assert (es.prompts_per_iteration, es.max_new_tokens, es.population, es.sigma, es.alpha) == (1024, 3000, 30, 1e-3,
                                                                                               5e-4)
    g = p.method_settings("qwen2.5-7b-instruct", "conciseness", "grpo_beta0.01")
    assert g.num_generations == 30


# --- config errors --------------------------------------------------------------------------------------------------
def _refused(edit) -> list[str]:
    cfg = copy.deepcopy(read_config(REPO / "config" / "config.yaml", root=REPO))
    edit(cfg)
    with pytest.raises(ConfigError) as err:
        load_pipeline(cfg, "config/config.yaml", root=REPO)
    return err.value.problems


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["train"]["sudoku"].update(models=["nope"]), "train.sudoku.models.0: 'nope' is not in the registry"),
    (lambda c: c.update(stability={"task": "countdown", "models": ["tiny-v2"], "methods": ["es", "essa"],
                                   "seeds": [0, 1]}), "stability.methods: 'essa' is not in train.countdown.methods"),
    (lambda c: c.update(stability={"task": "sudoku", "models": ["tiny"], "methods": ["es"], "seeds": [0, 1]}),
     "stability.models: 'tiny' is not trained on sudoku"),
    (lambda c: c.update(stability=None), "report.extras: stability needs a stability block"),
    (lambda c: c["studies"].pop("conciseness_lr"), "report.extras: lr_sweep needs studies.conciseness_lr"),
    (lambda c: c["train"]["math_train"]["es"].update(prompts_per_iteration=100),
     "train.math_train.es.prompts_per_iteration: prompts_per_iteration \\(100\\) is more than train_examples"),
    (lambda c: c["studies"]["conciseness_lr"].update(es=copy.deepcopy(c["studies"]["conciseness"]["es"])),
     "method es_sigma0.005 on conciseness is also a method of studies"),
])
def test_tasks_config_errors_name_file_and_field(edit, message):
    problems = _refused(edit)
    assert any(re.search(message, p) for p in problems), problems
    assert all(p.startswith("config/") for p in problems)


def test_registry_cells_are_checked(tmp_path):
    reg = load_yaml(REPO / "config" / "models.yaml")
    reg["models"]["tiny"]["methods"] = {"grpo8": {"cells": [{"learning_rate": 1e-3, "nope": 1}]}}
    root = tmp_path / "repo"
    (root / "config").mkdir(parents=True)
    shutil.copytree(REPO / "config" / "model_configs", root / "config" / "model_configs")
    (root / "config" / "models.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    (root / "config" / "published.yaml").write_text((REPO / "config" / "published.yaml").read_text())
    with pytest.raises(ConfigError) as err:
        load_pipeline(read_config(REPO / "config" / "config.yaml", root=REPO), "config/config.yaml", root=root)
    assert any("models.tiny.methods.grpo8.cells.0.nope: not a setting of grpo8" in p
               for p in err.value.problems)
    reg["models"]["tiny"]["methods"] = {"grpo8": {"grid": {"learning_rate": [1e-3, 2e-3]},
                                                      "cells": [{"learning_rate": 2e-3}]}}
    (root / "config" / "models.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    with pytest.raises(ConfigError) as err:
        load_pipeline(read_config(REPO / "config" / "config.yaml", root=REPO), "config/config.yaml", root=root)
    assert any("grpo8.cells: a cell repeats another cell of the grid" in p for p in err.value.problems)


# --- the per-task tables -------------------------------------------------------------------------------------------
def _metrics(tmp_path: Path, rows: list[tuple]) -> list[Path]:
    out = []
    for i, (task, model, method, seed, acc) in enumerate(rows):
        out.append(tmp_path / "m" / f"{i}.json")
        write_json(out[-1], {"task": task, "split": "test", "model": model, "method": method, "seed": seed,
                             "accuracy": acc, "n": 100})
    return out


def test_math_table_sets_ours_beside_the_published_rl_baselines(tmp_path):
    from esrepro.report.task_tables import build_math_table

    sets = ("math500", "minerva", "olympiad_bench", "aime24", "amc23")
    rows = [(s, "qwen2.5-math-7b", m, 0, acc) for s in sets for m, acc in (("base", 0.2), ("es", 0.5))]
    df = build_math_table(_metrics(tmp_path, rows), REPO / "config/published.yaml",
                          {"qwen2.5-math-7b": {"display": "Qwen2.5-Math-7B"}}, tmp_path / "math")
    ours = df[df["Source"] == "ours"].set_index("Method")
    assert list(ours.index) == ["Qwen2.5-Math-7B", "ESCHKPT-1"]  # v2 Fig. 2's rows and labels
    assert ours.loc["ESCHKPT-1", "MATH500"] == pytest.approx(50.0)
    assert ours.loc["ESCHKPT-1", "Average"] == pytest.approx(50.0)
    oat = df[df["Model"] == "Oat-Zero-7B"].iloc[0]
    assert (oat["Method"], oat["AIME24"], oat["MATH500"], oat["Average"]) == ("Dr.GRPO", 43.3, 80.0,
                                                                            pytest.approx(51.42))
    assert {"OpenReasoner-Zero-7B (@ 3k)", "SimpleRL-Zero-7B"} <= set(df["Model"])
    assert "2503.20783" in (tmp_path / "math.md").read_text()
    assert "\\begin{tabular}" in (tmp_path / "math.tex").read_text()


def test_puzzle_table_sets_the_papers_sudoku_figure_beside_ours(tmp_path):
    from esrepro.report.task_tables import build_puzzle_table

    rows = [("sudoku", "qwen2.5-3b-instruct", "base", 0, 0.03), ("sudoku", "qwen2.5-3b-instruct", "es", 0, 0.5),
            ("sudoku", "qwen2.5-3b-instruct", "es", 1, 0.6), ("arc", "qwen2.5-3b-instruct", "base", 0, 0.01),
            ("arc", "qwen2.5-3b-instruct", "es", 0, 0.02)]
    df = build_puzzle_table(_metrics(tmp_path, rows), REPO / "config/published.yaml",
                            {"qwen2.5-3b-instruct": {"display": "Qwen2.5-3B-Instruct"},
                             "qwen2.5-14b-instruct": {"display": "Qwen2.5-14B-Instruct"}}, tmp_path / "puzzles")
    table = df.set_index(["Task", "Model"])
    row = table.loc[("Sudoku", "Qwen2.5-3B-Instruct")]
    # v2 Table 3's Sudoku row in the paper columns; App. A.8's text (2% -> 66.5%) in a note, each with its place
    assert (row["Original (paper)"], row["ES (paper)"]) == (2.5, 69.5)
    assert row["ES (ours)"] == pytest.approx(55.0) and row["ES (ours) std"] == pytest.approx(7.0711, 1e-3)
    # v2 Table 3: ARC-AGI's model is Qwen2.5-14B-Instruct; our 3B ARC run has a row of its own, the paper's blank
    ours_3b, paper_14b = table.loc[("ARC-AGI", "Qwen2.5-3B-Instruct")], table.loc[("ARC-AGI", "Qwen2.5-14B-Instruct")]
    assert ours_3b["ES (ours)"] == pytest.approx(2.0) and math.isnan(ours_3b["ES (paper)"])  # blank, never 0
    assert (paper_14b["Original (paper)"], paper_14b["ES (paper)"]) == (0.2, 29.5) and math.isnan(paper_14b["ES (ours)"])
    assert list(df["Task"]) == ["Sudoku", "ARC-AGI", "ARC-AGI"]
    md = (tmp_path / "puzzles.md").read_text()
    assert "69.5" in md and "29.5" in md
    assert ("Sudoku, Qwen2.5-3B-Instruct: the paper columns are v2 Table 3; v2 App. A.8 gives Original 2, ES 66.5 "
            "for the same experiment.") in md


def test_stability_table_reports_spread_over_seeds(tmp_path):
    from esrepro.report.task_tables import build_stability_table

    rows = [("countdown", "tiny", m, s, acc) for m, accs in (("es", (0.30, 0.32, 0.31)), ("grpo8", (0.1, 0.3, 0.2)))
            for s, acc in enumerate(accs)] + [("countdown", "tiny", "base", 0, 0.05)]
    df = build_stability_table(_metrics(tmp_path, rows), {"tiny": {"display": "tiny"}}, tmp_path / "stability")
    assert list(df["Method"]) == ["GRPO-z (8)", "ES"]  # base (one evaluation) has no spread to report
    es = df.set_index("Method").loc["ES"]
    assert (es["Seeds"], es["Mean"], es["Range"]) == (3, pytest.approx(31.0), pytest.approx(2.0))
    assert es["Std"] == pytest.approx(1.0)


def test_table_steps_write_every_format_and_a_manifest_of_their_inputs(tmp_path):
    """The steps behind the math, puzzle, per-task and stability rules: files, and a manifest naming the metrics,
    the registry and (for tables beside the paper's numbers) the published numbers."""
    from esrepro.steps.report import math_table, puzzle_table, stability_table, train_tasks_table

    registry, published = str(REPO / "config/models.yaml"), str(REPO / "config/published.yaml")
    rows = [(t, "tiny-v2", m, s, 0.1 * (s + 1)) for t in ("math500", "sudoku", "arc") for m in ("base", "es")
            for s in ((0,) if m == "base" else (0, 1))]
    metrics = [str(p) for p in _metrics(tmp_path, rows)]
    out = tmp_path / "t"
    math_table(metrics, published, registry, str(out / "math"), note=["n"])
    puzzle_table(metrics, published, registry, str(out / "puzzles"))
    stability_table(metrics, registry, str(out / "stability"))
    train_tasks_table(metrics, published, registry, ["sudoku=sudoku", "arc=arc"], str(out / "train_tasks"))
    for stem, published_input, settings in (("math", True, {"notes": ["n"]}), ("puzzles", True, {"notes": []}),
                                            ("stability", False, {"notes": []}),
                                            ("train_tasks", True, {"sets": {"sudoku": "sudoku", "arc": "arc"},
                                                                   "notes": []})):
        assert all((out / f"{stem}{e}").is_file() for e in (".csv", ".md", ".tex")), stem
        manifest = json.loads((out / f"{stem}.manifest.json").read_text())
        assert manifest["settings"] == settings, stem
        assert ("published" in manifest["inputs"]) == published_input and "registry" in manifest["inputs"], stem
        assert set(metrics) <= set(manifest["inputs"]), stem


def test_table3_names_the_task_and_the_explicit_cells(tmp_path):
    from esrepro.report.tables import build_table3

    sel = tmp_path / "results/runs/math_train/m/grpo8/seed0/selection.json"
    write_json(sel, {"grid": {"learning_rate": [1e-6, 3e-6], "cells": [{"learning_rate": 1e-5, "beta": 0.0}]},
                     "winner": "lr1e-05_beta0", "winner_settings": {"learning_rate": 1e-5, "beta": 0.0},
                     "train_reward": 0.5, "cells": [{}, {}, {}], "settings": {"learning_rate": 1e-5, "beta": 0.0},
                     "budget": {"steps": 3, "samples_per_step": 120}})
    df = build_table3([sel], {"m": {"display": "M"}}, tmp_path / "t3")
    row = df.iloc[0]
    assert row["Task"] == "math_train" and "plus {beta=0, learning_rate=1e-05}" in row["Grid"]
    assert row["Selected"] == "beta=0, learning_rate=1e-05"  # as selection.json holds them (sorted keys)


def test_select_keeps_the_winning_cells_periodic_evaluation(tmp_path):
    from esrepro.steps.train import select

    cells = []
    for name, rewards in (("a", [0.1, 0.1]), ("b", [0.5, 0.9])):
        d = tmp_path / name
        (d / "checkpoint").mkdir(parents=True)
        (d / "checkpoint" / "model.safetensors").write_text(name)
        (d / "log.jsonl").write_text("".join(json.dumps({"reward_mean": r}) + "\n" for r in rewards))
        write_json(d / "manifest.json", {"settings": {"learning_rate": 1.0}, "budget": {}})
        (d / "periodic_eval.jsonl").write_text(json.dumps({"cell": name}) + "\n")
        cells.append(f"{name}={d}")
    out = tmp_path / "run"
    select("countdown", "m", "grpo8", {"learning_rate": [1.0, 2.0]}, cells, str(out))
    assert json.loads((out / "periodic_eval.jsonl").read_text()) == {"cell": "b"}


def test_runs_left_out_say_not_run_in_the_puzzle_and_per_task_tables(tmp_path):
    """A tiny run without a sandbox leaves ARC out: its rows stay in the puzzle and per-task tables, each cell of ours
    saying why, the paper's numbers beside them; the manifest records what was left out."""
    from esrepro.steps.report import puzzle_table, train_tasks_table

    registry, published = str(REPO / "config/models.yaml"), str(REPO / "config/published.yaml")
    rows = [("sudoku", "tiny-v2", m, 0, 0.25) for m in ("base", "es")]
    metrics = [str(p) for p in _metrics(tmp_path, rows)]
    cells = [f"arc:tiny-v2:{m}=not run: no sandbox on this machine" for m in ("base", "es")]
    note = "arc: not run: no sandbox on this machine: ... pip install -e ."
    out = tmp_path / "t"
    puzzle_table(metrics, published, registry, str(out / "puzzles"), note=[note], not_run=cells)
    train_tasks_table(metrics, published, registry, ["sudoku=sudoku", "arc=arc"], str(out / "train_tasks"),
                      note=[note], not_run=cells)
    md = (out / "puzzles.md").read_text()
    [arc] = [line for line in md.splitlines() if line.startswith("| ARC-AGI | tiny-qwen2 math and puzzles")]
    assert arc.count("not run: no sandbox on this machine") == 2 and note in md
    assert "| ARC-AGI | Qwen2.5-14B-Instruct" in md and "29.5" in md  # the paper's row as ever
    assert "| Sudoku  | tiny-qwen2 math and puzzles" in md and "25.0" in md
    [arc] = [line for line in (out / "train_tasks.md").read_text().splitlines() if "| ARC-AGI " in line]
    assert arc.count("not run: no sandbox on this machine") == 2
    csv = (out / "puzzles.csv").read_text()
    assert "not run: no sandbox on this machine" in csv
    manifest = json.loads((out / "puzzles.manifest.json").read_text())
    assert manifest["settings"]["not_run"] == {"arc:tiny-v2:base": "not run: no sandbox on this machine",
                                               "arc:tiny-v2:es": "not run: no sandbox on this machine"}
    with pytest.raises(ValueError, match="--not-run expects TEST_SET:MODEL:METHOD=TEXT"):
        puzzle_table(metrics, published, registry, str(out / "bad"), not_run=["arc:tiny-v2=not run"])
