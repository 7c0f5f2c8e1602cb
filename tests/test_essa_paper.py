"""The ESSA study at the paper's settings: config/paper.yaml's runs, the resampling run, the GPU sweep's nodes,
the published timings, the CMA-ES covariance choice and how the report shows them (no training here)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from esrepro.config import load_yaml
from esrepro.planning.load import load_pipeline

MODEL, TASK = "qwen2.5-math-7b", "gsm8k"


@pytest.fixture(scope="module")
def paper():
    return load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=REPO)


def test_paper_runs_follow_the_paper(paper):
    """Main runs score all 880 fitness problems at population 192; Sec. 5.4's 100 per generation is its own run."""
    methods = list(paper.essa_methods())
    assert methods == ["essa_ref", "essa_pop96", "essa_pop400", "essa_pop608", "essa_rank4", "essa_rank8",
                       "essa_rank32", "essa_rank64", "essa_eng16", "essa_eng32", "essa_eng64", "essa_eng128",
                       "essa_int8", "essa_int4", "essa_resample100", "essa_grpo"]
    for method in methods[:-1]:
        s = paper.method_settings(MODEL, TASK, method)
        assert (s.fitness_examples, s.covariance) == (880, "separable")
        assert s.resample_per_step == (100 if method == "essa_resample100" else None), method
        assert s.population == {"essa_pop96": 96, "essa_pop400": 400, "essa_pop608": 608}.get(method, 192), method
    assert [v for v, _ in paper.essa_sweep("engines")] == [16, 32, 64, 128]
    assert paper.essa_sweep("resample") == [(100, "essa_resample100")]


def test_figures_6_and_9_are_planned_as_the_paper_ran_them(paper):
    """ESSA Fig. 6: Llama-3.1-8B on PRM800K on 8 GPUs and Qwen2.5-32B on GSM8K on 16 GPUs, ESSA alone at
    population 192; Fig. 9: Qwen2.5-32B on GSM8K at BF16, INT8 and INT4; the other sweeps on Qwen2.5-Math-7B."""
    from esrepro.planning.cluster import train_job

    runs = {(t, m, meth) for t in paper.essa_tasks() for m, meth, _ in paper.essa_runs(t)}
    assert {(m, meth) for t, m, meth in runs if t == "prm800k"} == {("llama-3.1-8b", "essa_ref")}
    big = {meth for t, m, meth in runs if (t, m) == ("gsm8k", "qwen2.5-32b")}
    assert big == {"essa_ref", "essa_int8", "essa_int4"}
    assert {m for t, m, meth in runs if meth.startswith(("essa_pop", "essa_rank", "essa_eng", "essa_resample"))
            or meth == "essa_grpo"} == {MODEL}
    for task, model, methods, gpus in (("prm800k", "llama-3.1-8b", ["essa_ref"], 8),
                                       (TASK, "qwen2.5-32b", ["essa_ref", "essa_int8", "essa_int4"], 16)):
        for method in methods:
            s = paper.method_settings(model, task, method)
            res = train_job(paper, task, model, method)
            assert s.population == 192 and (s.engines or res.gpu) == gpus == res.nodes * res.gpu, (model, method)
    precisions = {meth: paper.method_settings("qwen2.5-32b", TASK, meth).precision for meth in big}
    assert precisions == {"essa_ref": "native", "essa_int8": "int8", "essa_int4": "int4"}
    assert paper.model("qwen2.5-32b").dtype == "bfloat16"
    assert paper.model("llama-3.1-8b").hub_id == "meta-llama/Llama-3.1-8B"
    assert paper.model("qwen2.5-32b").hub_id == "Qwen/Qwen2.5-32B"
    sft = paper.method_settings("llama-3.1-8b", "prm800k", "essa_ref").sft_examples
    assert sft == 3600  # ESSA Sec. 4.1: 3,600 SFT + 8,400 alignment


def test_essa_settings_defaults_are_the_papers_main_setting():
    from esrepro.settings.methods import ESSASettings

    s = ESSASettings()
    assert (s.resample_per_step, s.population, s.covariance, s.fitness_examples) == (None, 192, "separable", 880)
    for field in ("resample_per_step", "population", "covariance"):
        assert "paper" in ESSASettings.model_fields[field].description


def test_resampling_run_is_planned_evaluated_and_reported(paper):
    from esrepro.planning.plan import Plan
    from esrepro.planning.specs import essa_report_spec

    plan = Plan(paper)
    run = plan.essa_run(MODEL, "essa_resample100", 0)
    assert run in plan.essa_inputs()["runs"]
    assert f"results/eval/{TASK}/{MODEL}/essa_resample100/seed0/test/metrics.json" in plan.final_targets()
    assert essa_report_spec(paper)["sweeps"]["resample"] == ["essa_resample100"]
    layer = paper.method_layers(MODEL, TASK, "essa_resample100")[-1]
    assert layer.block == "studies.essa.resample" and layer.values["resample_per_step"] == 100


def test_gpu_sweep_takes_nodes_of_the_registry_entry(paper):
    """One engine per GPU: 128 engines on the 8-GPU nodes of the 7B entry are 16 nodes under scripts/ray-slurm."""
    from esrepro.planning.cluster import launcher, ray_layout, slurm_resource, train_job

    ref = train_job(paper, TASK, MODEL, "essa_ref")
    assert (ref.nodes, ref.gpu) == (1, 8)
    assert launcher(paper, TASK, MODEL, "essa_ref", "ray-slurm") == "ESREPRO_TRAIN_PROCESSES=8 "  # its SFT: 8 processes
    for engines in (16, 32, 64, 128):
        res = train_job(paper, TASK, MODEL, f"essa_eng{engines}")
        assert (res.nodes, res.gpu, res.nodes * res.gpu) == (engines // 8, 8, engines)
        assert slurm_resource(res, "tasks") == res.nodes and slurm_resource(res, "gres") == "gpu:h100:8"
    assert ray_layout(paper, TASK, MODEL, "essa_eng128") == "16 nodes x 8 GPUs: 128 vllm engines"
    assert launcher(paper, TASK, MODEL, "essa_eng128", "ray-slurm").startswith("ESREPRO_TRAIN_PROCESSES=8 ray-slurm --cluster")


def test_published_timings_are_quoted():
    from esrepro.report.essa import published_notes

    lines, target = published_notes(load_yaml(REPO / "config" / "published.yaml"), [MODEL])
    assert target == 0.76
    timings = [line for line in lines if "Sec. 5.1" in line and "minutes" in line]
    assert len(timings) == 2 and "290 minutes on 8 GPUs" in timings[0] and "80 minutes on 128 GPUs" in timings[1]
    assert all("not a model of this run" not in line for line in timings)


def test_covariance_is_part_of_the_resume_key():
    from esrepro.essa.loop import essa_state_key
    from esrepro.settings.methods import ESSASettings

    sep, full = ESSASettings(), ESSASettings(covariance="full")
    assert essa_state_key(sep, 0) != essa_state_key(full, 0)
    assert essa_state_key(full, 0)["covariance"] == "full"
    with pytest.raises(ValueError):
        ESSASettings(covariance="diagonal")


def test_tiny_study_uses_full_covariance_and_a_resampling_run():
    p = load_pipeline(load_yaml(REPO / "config" / "essa_tiny.yaml"), "config/essa_tiny.yaml", root=REPO)
    ref = p.method_settings("tiny", "countdown", "essa_ref")
    resample = p.method_settings("tiny", "countdown", "essa_resample8")
    assert (ref.covariance, ref.resample_per_step, ref.fitness_examples) == ("full", None, 16)
    assert (resample.resample_per_step, resample.population) == (8, ref.population)


# --- the report ------------------------------------------------------------------------------------


def _run(root: Path, method: str, settings: dict, val: list[float], step: float = 10.0) -> str:
    """A run directory as the train step leaves it (manifest and log) for the report to read; ``step`` seconds per
    logged iteration."""
    run = root / settings.get("task", TASK) / settings.get("model", MODEL) / method
    run.mkdir(parents=True)
    full = {"task": TASK, "model": MODEL, "method": method, "algorithm": "essa", "population": 192, "rank": 16,
            "precision": "native", "fitness_examples": 880, "resample_per_step": None, "covariance": "separable",
            **settings}
    (run / "manifest.json").write_text(json.dumps({"settings": full, "seed": 0, "engines": full.get("engines", 8),
                                                   "essa": {"val_reward_sft": 0.5}}))
    rows = [{"iteration": i, "elapsed_seconds": step * (i + 1), "seconds_total": step, "val_reward": v,
             "reward_mean": v} for i, v in enumerate(val)]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(run)


def test_summary_shows_problems_per_generation_and_figures_say_the_papers_reading(tmp_path):
    from esrepro.report import essa as R

    runs = [_run(tmp_path, "essa_ref", {}, [0.6, 0.7]),
            _run(tmp_path, "essa_resample100", {"resample_per_step": 100}, [0.6, 0.65]),
            _run(tmp_path, "essa_eng16", {"engines": 16}, [0.7, 0.8]),
            _run(tmp_path, "essa_rank4", {"rank": 4}, [0.6, 0.62])]
    table, curves = R.load_runs(runs), R.load_curves(runs)
    summary = R.summary_table(table, {}, tmp_path / "summary", 0.76, curves)
    per_gen = dict(zip(summary["method"], summary["problems_per_generation"], strict=True))
    assert per_gen["essa_ref"] == 880 and per_gen["essa_resample100"] == 100
    assert "problems_per_generation" in (tmp_path / "summary.md").read_text()

    note = R.paper_reading(table[table["method"].isin(["essa_ref", "essa_eng16"])], "engines")
    assert "caption 640" in note and note.endswith("Runs shown: population 192.")
    assert R.paper_reading(table, "ranks").endswith("Runs shown: rank 4, 16.")
    assert R.paper_reading(table, "precisions") is None
    paths = R.engines_figure(table, curves, ["essa_eng16"], 0.76, tmp_path / "engines")
    assert all(Path(p).stat().st_size > 0 for p in paths)
    frame = pd.read_csv(tmp_path / "engines.csv")
    assert sorted(frame["value"]) == [8, 16]


def test_scaling_figure_times_each_gpu_count_against_grpo(tmp_path):
    """ESSA Fig. 6: seconds to 0.95 x the best held-out score per GPU count, GRPO's, and the speed-up; the summary
    table keeps the two tasks apart."""
    from esrepro.report import essa as R

    on = {"task": "prm800k", "model": "qwen2.5-32b"}
    runs = [_run(tmp_path, "essa_ref", {**on, "engines": 8}, [0.6, 0.7, 0.8], step=40.0),
            _run(tmp_path, "essa_eng16", {**on, "engines": 16}, [0.6, 0.7, 0.8], step=20.0),
            _run(tmp_path, "essa_grpo", {**on, "algorithm": "grpo"}, [0.5, 0.7, 0.76, 0.8], step=60.0),
            _run(tmp_path, "essa_ref", {}, [0.6, 0.7])]
    table, curves = R.load_runs(runs), R.load_curves(runs)
    scaling = table[table["task"] == "prm800k"]
    R.scaling_figure(scaling, curves[curves["task"] == "prm800k"], tmp_path / "scaling", 0.95,
                     notes=["Paper: a claim"])
    frame = pd.read_csv(tmp_path / "scaling.csv")
    summary = frame[frame["speedup_over_grpo"].notna()].set_index("engines")
    # best 0.8, threshold 0.76: ESSA reaches 0.8 at 120 s (8 GPUs) and 60 s (16 GPUs); GRPO 0.76 at 180 s
    assert summary.loc[8, "seconds_to_threshold"] == 120 and summary.loc[16, "seconds_to_threshold"] == 60
    assert summary.loc[8, "grpo_seconds_to_threshold"] == 180
    assert summary.loc[8, "speedup_over_grpo"] == pytest.approx(1.5) and summary.loc[16, "speedup_over_grpo"] == 3
    assert set(frame["run"].dropna()) == {"ESSA, 8 engines", "ESSA, 16 engines", "GRPO"}
    assert all((tmp_path / f"scaling.{e}").stat().st_size > 0 for e in ("png", "pdf"))

    out = R.summary_table(table, {("prm800k", "qwen2.5-32b"): 0.4}, tmp_path / "summary", 0.76, curves,
                          target_task=TASK)
    rows = out.set_index(["task", "method"])
    assert rows.loc[("prm800k", "essa_ref"), "base_test_accuracy"] == 0.4
    assert pd.isna(rows.loc[("gsm8k", "essa_ref"), "base_test_accuracy"])
    assert pd.isna(rows.loc[("prm800k", "essa_ref"), "time_to_target"])  # the target is the study task's
    assert rows.loc[(TASK, "essa_ref"), "seeds"] == 1

