"""The v2 math experiment (Sec. 4.3, App. A.6, Fig. 2): the paper config's ES checkpoints and RL checkpoints, a run
that starts from another run's kept snapshot, and the Figure 2 builder."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO
from esrepro.config import read_config, workflow_config
from esrepro.planning.load import load_pipeline
from esrepro.planning.plan import ExtrasPlan, Plan
from esrepro.settings.layers import ConfigError

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
MATH_SETS = ("aime24", "minerva", "olympiad_bench", "amc23", "math500")
RL_CHECKPOINTS = {"simplerl-zero-7b": "hkust-nlp/Qwen-2.5-Math-7B-SimpleRL-Zero",
                  "open-reasoner-zero-7b": "Open-Reasoner-Zero/Open-Reasoner-Zero-7B",
                  "oat-zero-7b": "sail/Qwen2.5-Math-7B-Oat-Zero"}


def _pipeline(*files):
    raw, source = workflow_config(list(files), {})
    return load_pipeline(raw, source, REPO)


# --- the paper config -------------------------------------------------------------------------------------------
def test_paper_config_runs_the_math_experiment_as_v2_states():
    p = _pipeline("config/paper.yaml")
    plan = Plan(p)
    model = "qwen2.5-math-7b"
    assert p.train_models("math_train") == [model]
    es = p.method_settings(model, "math_train", "es")
    # Sec. 4.3: sigma 0.001, alpha = sigma/2, N = 30, at most 3,000 tokens per response; App. A.6: ESCHKPT-1 at 336
    assert (es.sigma, es.alpha, es.population, es.max_new_tokens) == (1e-3, 5e-4, 30, 3000)
    assert es.alpha == es.sigma / 2 and es.iterations == 336 and es.start_from is None
    # App. A.6: ESCHKPT-2 = the 160-iteration snapshot plus 10 updates at alpha = sigma/4
    cont = p.method_settings(model, "math_train", "esckpt2")
    assert cont.algorithm == "es" and cont.iterations == 10 and cont.alpha == cont.sigma / 4 == es.sigma / 4
    assert (cont.start_from.method, cont.start_from.iteration) == ("es", 160)
    assert (cont.population, cont.max_new_tokens, cont.prompts_per_iteration) == (30, 3000, es.prompts_per_iteration)
    run = "results/runs/math_train/qwen2.5-math-7b/es/seed0"
    assert plan.start_dir("math_train", model, "esckpt2", 0) == f"{run}/checkpoints/iter000160"
    assert plan.start_input("math_train", model, "esckpt2", 0) == f"{run}/manifest.json"
    # App. A.6: ESCHKPT-3 = the 192-iteration snapshot, kept by the same run
    ref = p.snapshots("math_train")["esckpt3"]
    assert (ref.method, ref.iteration) == ("es", 192)
    assert 160 % es.keep_every == 0 and 192 % es.keep_every == 0
    assert plan.checkpoint_of("math500", model, "esckpt3", 0) == f"{run}/checkpoints/iter000192"
    assert plan.checkpoint_of("math500", model, "es", 0) == f"{run}/checkpoint"
    # Fig. 2's seven bars on each of the five sets: the base, three released RL checkpoints evaluated only, three ES
    expected = {(model, "base", 0), *((m, "base", 0) for m in RL_CHECKPOINTS), (model, "es", 0),
                (model, "esckpt2", 0), (model, "esckpt3", 0)}
    for task in MATH_SETS:
        assert set(plan.runs(task)) == expected, task
        assert p.eval_settings(task).max_new_tokens == 3000
    for key, hub in RL_CHECKPOINTS.items():
        entry = p.model(key)
        assert (entry.hub_id, entry.revision, entry.chat_template) == (hub, "main", False)  # the Qwen-Math prompt
        assert key not in {m for m, _, _ in plan.train_runs("math_train")}
    assert ExtrasPlan(plan).math_figure_model() == model


@pytest.mark.slow
def test_paper_dry_run_plans_fig2():
    from esrepro.rehearsal.report import dag_jobs

    stats = dag_jobs(["config/paper.yaml"], SNAKEMAKE, REPO, targets=["results/figures/math_fig2.png"])
    # 7 bars x 5 sets; ES and its continuation; the base model and the three RL checkpoints fetched
    assert stats["evaluate"] == 35 and stats["train"] == 2 and stats["fetch_model"] == 4, stats
    assert stats["math_figure"] == 1


def test_tiny_config_scales_the_three_checkpoints_down():
    p = _pipeline("config/config.yaml")
    plan = Plan(p)
    es = p.method_settings("tiny-v2", "math_train", "es")
    cont = p.method_settings("tiny-v2", "math_train", "esckpt2")
    assert cont.alpha == es.alpha / 2 and cont.iterations == 1 and cont.start_from.iteration < es.iterations
    assert p.eval_models("math_train") == []  # the RL checkpoints are 7B hub models, not run at this scale
    assert {meth for _, meth, _ in plan.runs("math500")} == {"base", "es", "esckpt2", "esckpt3"}


# --- validation -------------------------------------------------------------------------------------------------
def _config(**math_train) -> dict:
    cfg = read_config(REPO / "config" / "config.yaml", REPO)
    cfg["train"]["math_train"] = {"models": ["tiny-v2"], "methods": ["es", "esckpt2"], **math_train}
    return cfg


@pytest.mark.parametrize("block, message", [
    ({"es": {"keep_every": 4}, "esckpt2": {"algorithm": "es", "start_from": {"method": "es", "iteration": 2}}},
     "keeps no snapshot at iteration 2"),
    ({"es": {"keep_every": 1}, "esckpt2": {"algorithm": "es", "start_from": {"method": "esx", "iteration": 2}}},
     "'esx' is not in train.math_train.methods"),
    ({"es": {"keep_every": 1}, "esckpt2": {"algorithm": "es", "start_from": {"method": "es", "iteration": 9}}},
     "past the last iteration"),
    ({"es": {"keep_every": 1, "start_from": {"method": "esckpt2", "iteration": 1}},
      "esckpt2": {"algorithm": "es", "start_from": {"method": "es", "iteration": 2}}}, "cycle"),
    ({"es": {"keep_every": 1}, "esckpt2": {"algorithm": "es"}, "snapshots": {"es3": {"method": "es", "iteration": 7}}},
     "past the last iteration"),
    ({"es": {"keep_every": 1}, "esckpt2": {"algorithm": "es"}, "eval_models": ["nope-7b"]}, "not in the registry"),
])
def test_bad_starts_and_snapshots_are_refused_naming_the_field(block, message):
    with pytest.raises(ConfigError, match=message):
        load_pipeline(_config(**block), "config/config.yaml", REPO)


# --- a run that starts from a kept snapshot, for real -------------------------------------------------------------
# conciseness: a length reward, so that every member scores differently and every iteration updates the weights
BASE_SPEC = {"population": 4, "sigma": 0.5, "alpha": 0.05, "train_examples": 2, "max_new_tokens": 8,
             "batch_size": 2, "noise": "iid", "restore": "exact", "master_weights": None}


def _start_config(alpha: float) -> dict:
    return {"scale": "tiny", "models": ["tiny"], "seeds": [0],
            "data": {"conciseness": {"source": {"kind": "generated"}}},
            "evaluate": {"conciseness": {}}, "report": {"table1": {"task": "conciseness"}},
            "train": {"conciseness": {"methods": ["es", "escont"],
                                    "es": {**BASE_SPEC, "iterations": 3, "keep_every": 1},
                                    "escont": {**BASE_SPEC, "algorithm": "es", "iterations": 1, "alpha": alpha,
                                               "start_from": {"method": "es", "iteration": 2}}}}}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_continuation_starts_from_the_snapshot(tiny_model_dir, tmp_path, monkeypatch):
    from esrepro.planning.specs import method_spec
    from esrepro.provenance.manifest import sha256_tree
    from esrepro.steps.train import train
    from esrepro.tasks import prepare_task

    monkeypatch.setenv("TQDM_DISABLE", "1")
    data = tmp_path / "data"
    prepare_task("conciseness", data, {"kind": "generated"}, 0)
    p = load_pipeline(_start_config(alpha=0.025), "test.yaml", REPO)
    plan = Plan(p)
    root = tmp_path / "ws"

    def run(pipeline, method: str, out: Path) -> dict:
        start = plan.start_dir("conciseness", "tiny", method, 0)
        model_dir = tiny_model_dir if start.startswith("results/models/") else root / start
        train("conciseness", "tiny", str(model_dir), str(data), method_spec(pipeline, "tiny", "conciseness", method),
              method, str(out), seed=0, device="cpu")
        return json.loads((out / "manifest.json").read_text())

    source = root / plan.start_input("conciseness", "tiny", "escont", 0).rsplit("/", 1)[0]
    run(p, "es", source)
    snapshot = root / plan.start_dir("conciseness", "tiny", "escont", 0)
    assert snapshot == source / "checkpoints" / "iter000002" and snapshot.is_dir()

    half = run(p, "escont", tmp_path / "half")
    # the manifest records the start: its settings, and the snapshot's hash in place of the base model's
    assert half["settings"]["start_from"] == {"method": "es", "iteration": 2}
    assert half["settings"]["alpha"] == 0.025 and "base_model" not in half["inputs"]
    assert half["inputs"]["start_checkpoint"]["sha256"] == sha256_tree(snapshot)
    log = [json.loads(line) for line in (tmp_path / "half" / "log.jsonl").read_text().splitlines()]
    src_log = [json.loads(line) for line in (source / "log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["iteration"] == 0 and log[0]["seeds"] == src_log[0]["seeds"]

    # the same start at the source's alpha moves the weights exactly twice as far: the continuation's update is
    # alpha-scaled from the snapshot (from the base model or another snapshot, the step differs)
    full = run(load_pipeline(_start_config(alpha=0.05), "test.yaml", REPO), "escont", tmp_path / "full")
    assert full["inputs"]["start_checkpoint"]["sha256"] == half["inputs"]["start_checkpoint"]["sha256"]
    w0, wh, wf = (_weights(d) for d in (snapshot, tmp_path / "half" / "checkpoint", tmp_path / "full" / "checkpoint"))
    moved = [k for k in w0 if not torch.equal(w0[k], wf[k])]
    assert moved
    base = _weights(tiny_model_dir)
    assert any(not torch.equal(base[k], w0[k]) for k in moved)  # the snapshot is not the base model
    for k in moved:
        torch.testing.assert_close(2 * (wh[k] - w0[k]), wf[k] - w0[k], rtol=1e-4, atol=1e-6)
    final = _weights(source / "checkpoint")
    assert any(not torch.equal(final[k], wh[k]) for k in moved)  # not the source run's own later weights


# --- the Figure 2 builder ------------------------------------------------------------------------------------------
def _metrics(tmp_path: Path, rows: list[tuple[str, str, str, int, float]]) -> list[str]:
    paths = []
    for i, (task, model, method, seed, acc) in enumerate(rows):
        path = tmp_path / f"m{i}.json"
        path.write_text(json.dumps({"task": task, "split": "test", "model": model, "method": method, "seed": seed,
                                    "accuracy": acc, "n": 10}))
        paths.append(str(path))
    return paths


def test_fig2_builder_draws_ours_beside_the_papers_determined_values(tmp_path):
    from esrepro.report.math_figure import build_fig2

    rows = [(s, "m7", "base", 0, 0.1) for s in MATH_SETS]
    rows += [(s, "m7", "es", seed, acc) for s in MATH_SETS for seed, acc in ((0, 0.4), (1, 0.5))]
    rows += [("math500", "m7", "esckpt3", 0, 0.8), ("math500", "oat-zero-7b", "base", 0, 0.75)]
    out = tmp_path / "fig2"
    df = build_fig2(_metrics(tmp_path, rows), REPO / "config" / "published.yaml", "m7", out, title="t")
    for ext in ("png", "pdf", "csv"):
        assert (tmp_path / f"fig2.{ext}").stat().st_size > 0
    table = list(csv.DictReader((tmp_path / "fig2.csv").open()))
    bars = [r for r in table if r["bar"]]
    assert len(bars) == 35 and [r["benchmark"] for r in bars[::7]] == list(MATH_SETS)
    got = {(r["benchmark"], r["bar"]): r for r in bars}
    assert float(got[("aime24", "base")]["ours"]) == pytest.approx(10.0)
    assert float(got[("minerva", "eschkpt1")]["ours"]) == pytest.approx(45.0)
    assert float(got[("minerva", "eschkpt1")]["ours_std"]) == pytest.approx(math.sqrt(50.0))
    assert got[("math500", "eschkpt3")]["method"] == "esckpt3" and float(got[("math500", "eschkpt3")]["ours"]) == 80.0
    assert float(got[("math500", "oat_zero")]["ours"]) == 75.0 and got[("math500", "oat_zero")]["model"] == "oat-zero-7b"
    assert got[("aime24", "simplerl_zero")]["ours"] == "" and "not evaluated" in got[("aime24", "simplerl_zero")]["note"]
    assert all(r["paper"] == "" for r in bars)  # no value's bar is determined
    # the values whose benchmark alone is determined, one row each
    loose = sorted((r["benchmark"], float(r["paper"])) for r in table if not r["bar"])
    assert loose == [("math500", 78.0), ("math500", 78.0), ("minerva", 33.1), ("olympiad_bench", 17.5)]
    assert len(df) == len(table)


def test_fig2_values_fit_the_benchmark_sizes():
    """The published block's determined values are k/n of their benchmark (its stated method), and only of it."""
    from esrepro.report.math_figure import figure_block
    from esrepro.report.tables import load_published

    fig = figure_block(load_published(REPO / "config" / "published.yaml"))
    assert len(fig["values"]) == 35 and [b["key"] for b in fig["bars"]][0] == "base"

    def fits(value: float, n: int) -> bool:
        return any(round(100 * k / n, 1) == value for k in range(n + 1))

    for bench, values in fig["benchmark_values"].items():
        for v in values:
            assert v in fig["values"]
            assert [b for b, n in fig["sizes"].items() if fits(v, n)] == [bench], (bench, v)
    # AMC's values are of 83 problems, not 40: seven of the 35 fit 83, only six fit 40
    assert sum(fits(v, 83) for v in fig["values"]) >= 7 > sum(fits(v, 40) for v in fig["values"])


def test_fig2_without_a_published_figure_is_a_clear_error(tmp_path):
    from esrepro.report.math_figure import figure_block

    with pytest.raises(ValueError, match="figure"):
        figure_block({"tables": {"math_v2": {"task": "math"}}})


def test_fig2_step_labels_the_runs_own_model_and_writes_its_manifest(tmp_path):
    from esrepro.steps.report import math_figure

    rows = [(s, "tiny-v2", m, 0, 0.25) for s in MATH_SETS for m in ("base", "es", "esckpt2", "esckpt3")]
    out = tmp_path / "out" / "math_fig2"
    out.parent.mkdir()
    math_figure(_metrics(tmp_path, rows), str(REPO / "config/published.yaml"), str(REPO / "config/models.yaml"),
                "tiny-v2", str(out), title="tiny")
    table = list(csv.DictReader(out.with_suffix(".csv").open()))
    base = next(r for r in table if r["bar"] == "base")
    assert base["label"].startswith("tiny-qwen2") and "paper: Qwen2.5-Math-7B" in base["label"]
    assert {r["bar"] for r in table if r["ours"] == ""} == {"simplerl_zero", "open_reasoner_zero", "oat_zero", ""}
    manifest = json.loads((tmp_path / "out" / "math_fig2.manifest.json").read_text())
    assert manifest["settings"]["model"] == "tiny-v2"
