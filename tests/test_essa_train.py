"""ESSA in the pipeline: a 3-generation run that holds its fitness and resumes bit-identically after a kill,
quantised precisions refused on CPU, config errors naming file and field, the Ray candidate evaluator
matching the serial one, the study's methods and figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import REPO, kill_once_resumable
from esrepro.essa.strategy import CMAStrategy

E = "work/essa_tiny/"  # config/essa_tiny.yaml's workspace: its data and results

SPEC = {
    "algorithm": "essa", "sft_examples": 32, "fitness_examples": 16, "val_examples": 8, "resample_per_step": 8,
    "rank": 4, "lora_alpha": 8, "sft_epochs": 2, "sft_learning_rate": 0.01, "sft_prompts_per_step": 8,
    "population": 6, "iterations": 3, "sigma0": 0.32, "max_new_tokens": 40, "batch_size": 16,
    "resume_every": 1, "fitness": "reward", "engines": 1,
}
GENERATOR = {"min_numbers": 3, "max_numbers": 3, "max_number": 20, "max_target": 100}
ENV = {**os.environ, "TQDM_DISABLE": "1"}
os.environ.setdefault("TQDM_DISABLE", "1")  # the warm start's progress bar too


@pytest.fixture(scope="module")
def countdown_model(tmp_path_factory) -> Path:
    """A ~100k-parameter Qwen2 with a Countdown tokenizer, warm-started until it answers in the task's format
    (so the reward is not zero everywhere and a broken candidate would show)."""
    from esrepro.models.tiny import build_model, sft, train_tokenizer
    from esrepro.tasks.countdown import CountdownTask, generate_problems, sft_completion

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("countdown_model")
    task = CountdownTask()
    problems = generate_problems(600, seed=123, **GENERATOR)
    tok = train_tokenizer([t for p in problems for t in (task.prompt(p), sft_completion(p))], vocab_size=400)
    arch = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 256}
    model = build_model(arch, len(tok), tok.eos_token_id, 0)
    sft(model, tok, [(task.prompt(p), sft_completion(p)) for p in problems], epochs=3, learning_rate=1e-2,
        batch_size=16, seed=0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from esrepro.tasks.countdown import prepare

    out = tmp_path_factory.mktemp("countdown_data")
    prepare(out, {"kind": "generated", "n_train": 56, "n_test": 8, **GENERATOR}, seed=0)
    return out


def _train_cmd(model_dir: Path, data_dir: Path, out: Path, spec: dict = SPEC, method: str = "essa_ref") -> list[str]:
    return [sys.executable, "-m", "esrepro.cli", "train", "--method", method, "--task", "countdown",
            "--model", "test", "--model-dir", str(model_dir), "--data-dir", str(data_dir),
            "--spec", json.dumps(spec), "--seed", "3", "--out", str(out), "--threads", "1"]


def _log(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight_run(countdown_model, data_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("essa") / "straight"
    subprocess.run(_train_cmd(countdown_model, data_dir, run), check=True, env=ENV, timeout=600)
    return run


@pytest.mark.slow
def test_three_generations_hold_fitness(straight_run, countdown_model):
    log = _log(straight_run)
    manifest = json.loads((straight_run / "manifest.json").read_text())
    assert [r["generation"] for r in log] == [0, 1, 2]
    sft_score = manifest["essa"]["val_reward_sft"]
    assert sft_score > 0, "the SFT model scores nothing: the test could not see a broken candidate"
    assert log[-1]["val_reward"] >= sft_score  # the CMA-ES mean holds or improves the held-out fitness
    best = [r["best_reward"] for r in log]
    assert best == sorted(best) and best[0] >= max(log[0]["rewards"])
    for r in log:
        assert len(r["rewards"]) == SPEC["population"] and len(r["problems"]) == SPEC["resample_per_step"]
        assert {"seconds_ask_tell", "seconds_rebuild", "seconds_generation", "elapsed_seconds"} <= set(r)
    # the run directory: merged weights of the CMA mean, its peft adapter and the CMA-ES state beside them
    assert (straight_run / "adapter" / "adapter_model.safetensors").exists()
    strategy = CMAStrategy.from_state((straight_run / "cma_state.npz").read_bytes())
    assert strategy.generation == 3
    assert not (straight_run / "resume").exists() and (straight_run / "sft" / "space.safetensors").exists()
    weights = load_file(str(straight_run / "checkpoint" / "model.safetensors"))
    base = load_file(str(countdown_model / "model.safetensors"))
    changed = [k for k in weights if not torch.equal(weights[k], base[k])]
    assert changed and all(k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))
                           for k in changed)
    assert manifest["settings"]["population"] == 6 and manifest["essa"]["solution"] == "cma_mean"
    assert manifest["settings"]["covariance"] == strategy.covariance == "separable"


@pytest.mark.slow
def test_killed_run_resumes_bit_identically(straight_run, countdown_model, data_dir, tmp_path):
    killed = tmp_path / "killed"
    done = kill_once_resumable(_train_cmd(countdown_model, data_dir, killed), ENV, killed, "completed_generations")
    assert 1 <= done < SPEC["iterations"]
    assert not (killed / "checkpoint").exists()
    sft_before = (killed / "sft" / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns

    rerun = subprocess.run(_train_cmd(countdown_model, data_dir, killed), check=True, env=ENV, timeout=600,
                           capture_output=True, text=True)
    assert (f"ESSA: resuming from the state in {killed / 'resume'}: {done} of {SPEC['iterations']} generations done"
            in rerun.stdout)
    assert (killed / "sft" / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns == sft_before  # kept
    a = load_file(str(straight_run / "checkpoint" / "model.safetensors"))
    b = load_file(str(killed / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("adapter/adapter_model.safetensors", "sft/adapter/adapter_model.safetensors", "sft/space.safetensors"):
        assert (straight_run / name).read_bytes() == (killed / name).read_bytes(), name
    sa = CMAStrategy.from_state((straight_run / "cma_state.npz").read_bytes()).state_dict()
    sb = CMAStrategy.from_state((killed / "cma_state.npz").read_bytes()).state_dict()
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)
    fields = ("rewards", "problems", "val_reward", "best_reward", "sigma")
    assert [[r.get(f) for f in fields] for r in _log(straight_run)] == [[r.get(f) for f in fields] for r in _log(killed)]
    assert not (killed / "resume").exists()


@pytest.mark.slow
def test_full_covariance_run_resumes_bit_identically(straight_run, countdown_model, data_dir, tmp_path):
    """covariance: full (cmaes.CMA) end to end: a killed run ends as the uninterrupted one, the manifest and the
    saved CMA-ES state say full, and the search differs from the separable run's."""
    spec = {**SPEC, "covariance": "full"}
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(_train_cmd(countdown_model, data_dir, straight, spec), check=True, env=ENV, timeout=600)
    kill_once_resumable(_train_cmd(countdown_model, data_dir, killed, spec), ENV, killed, "completed_generations")
    subprocess.run(_train_cmd(countdown_model, data_dir, killed, spec), check=True, env=ENV, timeout=600)
    assert (straight / "cma_state.npz").read_bytes() == (killed / "cma_state.npz").read_bytes()
    fields = ("rewards", "problems", "val_reward", "best_reward", "sigma")
    assert [[r.get(f) for f in fields] for r in _log(straight)] == [[r.get(f) for f in fields] for r in _log(killed)]
    assert CMAStrategy.from_state((straight / "cma_state.npz").read_bytes()).covariance == "full"
    assert json.loads((straight / "manifest.json").read_text())["settings"]["covariance"] == "full"
    assert [r["sigma"] for r in _log(straight)] != [r["sigma"] for r in _log(straight_run)]


def test_quantised_precision_refused_on_cpu(countdown_model, data_dir, tmp_path):
    from esrepro.essa.engine import ESSAEngine, check_precision
    from esrepro.steps.train import train

    for precision in ("int8", "int4"):
        with pytest.raises(ValueError, match=rf"precision: {precision} needs a CUDA GPU .* runs on cpu"):
            check_precision(precision, "cpu")
        with pytest.raises(ValueError, match="precision"):
            ESSAEngine(countdown_model, tmp_path / "no_adapter", tmp_path / "no_space", precision=precision)
    with pytest.raises(ValueError, match="precision: int8 needs a CUDA GPU"):
        train("countdown", "test", str(countdown_model), str(data_dir), {**SPEC, "precision": "int8"}, "essa_int8",
              str(tmp_path / "run"), device="cpu")
    assert not (tmp_path / "run" / "sft").exists()  # refused before any work
    check_precision("native", "cpu")


# --- configuration ---------------------------------------------------------------------------------


def _pipeline(mutate):
    from esrepro.planning.load import load_pipeline

    cfg = yaml.safe_load((REPO / "config" / "essa_tiny.yaml").read_text())
    mutate(cfg)
    return load_pipeline(cfg, "config/essa_tiny.yaml", root=REPO)


@pytest.mark.parametrize("mutate,expected", [
    (lambda c: c["studies"]["essa"].update(settings={"population": 1}),
     "config/essa_tiny.yaml: studies.essa.settings.population: 1: Input should be greater than or equal to 2"),
    (lambda c: c["defaults"]["essa"].update(fraction=1.5),
     "config/essa_tiny.yaml: defaults.essa.fraction: 1.5: Input should be less than or equal to 1"),
    (lambda c: c["defaults"]["essa"].update(train_examples=10),
     "config/essa_tiny.yaml: defaults.essa.train_examples: train_examples is sft_examples + fitness_examples"),
    (lambda c: c["defaults"]["essa"].update(resample_per_step=100),
     "config/essa_tiny.yaml: defaults.essa.resample_per_step: resample_per_step (100) exceeds fitness_examples"),
    (lambda c: (c.update(device="cpu"), c["studies"]["essa"].update(precisions=["int8"])),
     "config/essa_tiny.yaml: studies.essa.precisions.precision: int8 needs a CUDA GPU (bitsandbytes), but device is cpu"),
    (lambda c: c["data"]["countdown"]["source"].update(n_train=100),
     "config/essa_tiny.yaml: studies.essa: method essa_ref (model tiny) reads 144 training problems"),
    (lambda c: c["studies"]["essa"].update(models=["nope"]),
     "config/essa_tiny.yaml: studies.essa.models.0: 'nope' is not in the registry"),
    (lambda c: c["studies"]["essa"]["grpo"].pop("keep_every"),
     "config/essa_tiny.yaml: studies.essa.grpo.keep_every: required"),
    (lambda c: c.setdefault("defaults", {}).setdefault("grpo", {}).update(eval_every=2),  # Figure 6's setting
     "config/essa_tiny.yaml: studies.essa: method essa_grpo (model tiny): eval_every: 2: the baseline scores its "
     "held-out curve every keep_every steps"),
    (lambda c: c["studies"]["essa"].update(ranks=[4, 4]),
     "config/essa_tiny.yaml: studies.essa.ranks: values must be distinct and positive"),
    (lambda c: c["studies"]["essa"].update(resample=[32]),
     "config/essa_tiny.yaml: studies.essa.resample.resample_per_step: resample_per_step (32) exceeds fitness_examples"),
    (lambda c: c["defaults"]["essa"].update(covariance="diagonal"),
     "config/essa_tiny.yaml: defaults.essa.covariance: 'diagonal': Input should be 'separable' or 'full'"),
    (lambda c: c["defaults"]["essa"].update(lora_targets=[]),
     "config/essa_tiny.yaml: defaults.essa.lora_targets: lora_targets is an empty list"),
    (lambda c: c["studies"]["essa"].update(settings={"lora_targets": "q_proj"}),
     "config/essa_tiny.yaml: studies.essa.settings.lora_targets: lora_targets 'q_proj' is neither attention nor all"),
    (lambda c: c["studies"]["essa"]["scaling"].update(task="countdown"),
     "config/essa_tiny.yaml: studies.essa.scaling: its task must differ from the study's (countdown)"),
    (lambda c: c["studies"]["essa"]["scaling"]["grpo"].update(train_examples=2),
     "config/essa_tiny.yaml: studies.essa.scaling: method essa_grpo (model tiny): train_examples: 2 training problems, "
     "but one verl_grpo step draws 4 distinct problems"),
    (lambda c: c["studies"]["essa"]["scaling"]["grpo"].update(train_examples=8),
     "config/essa_tiny.yaml: studies.essa.scaling: method essa_grpo (model tiny) reads 16 training problems"),
    (lambda c: c["evaluate"].pop("prm800k"),
     "config/essa_tiny.yaml: studies.essa.scaling.task: no evaluate.prm800k entry"),
    (lambda c: c["studies"]["essa"]["scaling"].update(models=["nope"]),
     "config/essa_tiny.yaml: studies.essa.scaling.models.0: 'nope' is not in the registry"),
])
def test_config_errors_name_file_and_field(mutate, expected):
    from esrepro.settings.layers import ConfigError

    with pytest.raises(ConfigError) as err:
        _pipeline(mutate)
    assert any(p.startswith(expected) for p in err.value.problems), err.value.problems


def test_study_methods_and_layers():
    from esrepro.planning.plan import Plan

    p = _pipeline(lambda c: None)
    assert list(p.essa_methods()) == ["essa_ref", "essa_pop16", "essa_rank4", "essa_eng2", "essa_resample8",
                                      "essa_grpo"]
    ref = p.method_settings("tiny", "countdown", "essa_ref")
    pop = p.method_settings("tiny", "countdown", "essa_pop16")
    assert (ref.population, pop.population, pop.rank, ref.train_examples) == (8, 16, 8, 144)
    resample = p.method_settings("tiny", "countdown", "essa_resample8")
    assert (ref.resample_per_step, resample.resample_per_step) == (None, 8)
    assert p.method_settings("tiny", "countdown", "essa_eng2").engines == 2
    grpo = p.method_settings("tiny", "countdown", "essa_grpo")
    # ESSA Sec. 4.4 ran its GRPO baseline on VERL: GRPO with VERL's semantics (esrepro.settings.methods.VERL_DEFAULTS)
    assert grpo.algorithm == "verl_grpo" and grpo.train_examples == ref.fitness_examples
    assert grpo.sample_budget == ref.iterations * ref.population * ref.fitness_examples
    plan = Plan(p)
    assert "essa_grpo" not in plan.methods_regex(rl=False) and plan.essa_grpo_regex() == "essa_grpo"
    assert plan.essa_figures() == [E + "results/figures/essa_population", E + "results/figures/essa_rank",
                                   E + "results/figures/essa_engines", E + "results/figures/essa_wallclock",
                                   E + "results/figures/essa_scaling"]
    assert E + "results/eval/countdown/tiny/essa_grpo/seed0/test/metrics.json" in plan.final_targets()
    # the scaling runs (ESSA Fig. 6): their own task, the scaling block's settings over the study's
    assert p.essa_tasks() == ["countdown", "prm800k"]
    assert list(p.essa_methods("prm800k")) == ["essa_ref", "essa_eng2", "essa_grpo"]
    scale = p.method_settings("tiny", "prm800k", "essa_eng2")
    assert (scale.engines, scale.sft_examples, scale.fitness_examples, scale.population) == (2, 4, 4, 8)
    assert [l.block for l in p.method_layers("tiny", "prm800k", "essa_eng2")][-2:] == \
        ["models.tiny.methods.essa", "studies.essa.scaling.engines"]
    scale_grpo = p.method_settings("tiny", "prm800k", "essa_grpo")
    assert (scale_grpo.train_examples, scale_grpo.keep_every, scale_grpo.learning_rate) == (4, 4, 1.0e-4)
    assert scale_grpo.sample_budget == 8 * 8 * 4  # the scaling reference run's generations x population x fitness
    assert scale_grpo.per_device_train_batch_size == 16  # 4 problems x 4 completions: every step sees all 4
    assert plan.essa_ref_run("tiny", 0, "prm800k") == E + "results/runs/prm800k/tiny/essa_ref/seed0"
    assert E + "results/runs/prm800k/tiny/essa_grpo/seed0" in plan.essa_inputs()["runs"]
    assert E + "data/prepared/prm800k" in plan.datasets()


def test_quantised_precision_runs_engines():
    """A study on vLLM engines scores its INT4 run there (vLLM's bitsandbytes plugin quantises a base to 4 bits as
    it loads) and keeps its INT8 run on the transformers backend (the plugin reads 8-bit weights only from a
    checkpoint saved quantised)."""
    def vllm_study(c):
        c["studies"]["essa"].setdefault("settings", {})["backend"] = "vllm"
        c["studies"]["essa"]["precisions"] = ["int8", "int4"]

    p = _pipeline(vllm_study)
    assert p.method_settings("tiny", "countdown", "essa_ref").backend == "vllm"
    assert p.method_settings("tiny", "countdown", "essa_pop16").backend == "vllm"
    for method, precision, backend in (("essa_int8", "int8", "hf"), ("essa_int4", "int4", "vllm")):
        s = p.method_settings("tiny", "countdown", method)
        assert (s.precision, s.backend) == (precision, backend)


# --- the Ray evaluator ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_ray_candidate_evaluator_matches_serial(straight_run, countdown_model, data_dir):
    from esrepro.essa.spec import ESSAEngineSpec
    from esrepro.essa.svd import SingularValueSpace
    from esrepro.population.evaluators import RayEvaluator, SerialEvaluator
    from esrepro.population.ray_session import ensure_ray
    from esrepro.population.spec import IndexedScoring

    examples = [json.loads(x) for x in (data_dir / "train.jsonl").read_text().splitlines()][32:48]
    sft = straight_run / "sft"
    spec = ESSAEngineSpec(str(countdown_model), str(sft / "adapter"), str(sft / "space.safetensors"), batch_size=16)
    scoring = IndexedScoring("countdown", examples, max_new_tokens=40, fitness="reward")
    space = SingularValueSpace.load(sft / "space.safetensors")
    xs = CMAStrategy(space.x0, 0.32, 5, seed=7).ask()
    problems = [0, 3, 5, 8, 9, 12]
    serial = SerialEvaluator(spec, scoring)
    want, _ = serial.candidate_rewards(xs, problems)
    ensure_ray(num_cpus=2)
    ray_eval = RayEvaluator(spec, scoring, engines=2, per_engine={"num_cpus": 1})
    try:
        got, seconds = ray_eval.candidate_rewards(xs, problems)
        assert got == want
        assert set(ray_eval.checksums()) == set(serial.checksums())
        assert {"apply", "generation", "restore", "wall"} <= set(seconds)
    finally:
        ray_eval.close()


# --- the figures --------------------------------------------------------------------------------------


def test_essa_report_from_a_run(straight_run, tmp_path):
    from esrepro.steps.report import essa_report

    stems = {"table": str(tmp_path / "summary"), "wallclock": str(tmp_path / "wallclock"),
             "populations": str(tmp_path / "population")}
    essa_report([str(straight_run)], [], str(REPO / "config" / "published.yaml"), str(REPO / "config" / "models.yaml"),
                {"target_accuracy": 0.05, "sweeps": {"populations": []}, "stems": stems})
    for stem in stems.values():
        assert Path(f"{stem}.manifest.json").exists()
    assert (tmp_path / "wallclock.png").stat().st_size > 0 and (tmp_path / "population.pdf").exists()
    text = (tmp_path / "summary.md").read_text()
    assert "essa_ref" in text and "time_to_target" in text
