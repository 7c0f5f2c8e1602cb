"""The plan check over config/paper.yaml: every GPU job built with its real arguments and its memory counted on a CPU;
putting back what stopped or overflowed a job (the process count of grpo30, the reference's device map under FSDP,
vLLM's context, ESSA's batch and vLLM share on Qwen2.5-32B, PPO's whole-model loading) makes it fail, naming the job."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from esrepro.config import read_config
from esrepro.models import memory as M
from esrepro.planning import plan_check as pc
from esrepro.planning.load import load_pipeline
from esrepro.planning.resume_cost import job_settings

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "config" / "paper.yaml"


@pytest.fixture(scope="module")
def paper():
    p, checked = pc.check_config(str(PAPER))
    return p, checked


def _job(p, rule: str, task: str, model: str, method: str, cell: str | None = None) -> pc.JobCheck:
    w = {"task": task, "model": model, "method": method, **({"cell": cell} if cell else {})}
    gpus, procs = pc._gpus(p, rule, w)
    s = job_settings(p, model, task, method, cell)
    return pc.JobCheck(rule, w, s.algorithm, gpus, procs, host_bytes=pc._resources(p, rule, w).mem_mb * 10**6)


def test_every_gpu_job_of_the_paper_config_is_built_and_fits(paper):
    p, checked = paper
    assert not pc.failures(checked), "\n".join(j.message() for j in pc.failures(checked))
    rules = {j.rule for j in checked}
    assert {"train", "train_cell", "essa_grpo", "evaluate", "kl"} <= rules
    kinds = {j.kind for j in checked if j.rule != "evaluate"}
    assert {"ppo", "grpo", "verl_grpo", "verl_dr_grpo", "es vllm", "essa vllm", "essa hf int8", "essa vllm int4"} <= kinds
    assert all(j.peak is not None and M.fits(j.peak) for j in checked)
    ppo = next(j for j in checked if j.kind == "ppo" and j.wildcards["model"] == "llama-3.1-8b-instruct")
    assert ppo.processes == 8 and ppo.peak.name == "policy forward and backward"


def test_model_shapes_count_the_hub_models_parameters(paper):
    """Parameter counts of the registry entries' configs built on the meta device equal the hub models' (their model
    cards: 7.62B, 8.03B, 32.8B, 0.49B with tied embeddings)."""
    p, _ = paper
    assert M.entry_facts(p.model("qwen2.5-7b-instruct")).params == 7_615_616_512
    assert M.entry_facts(p.model("llama-3.1-8b-instruct")).params == 8_030_261_248
    assert M.entry_facts(p.model("qwen2.5-32b")).params == 32_763_876_352
    small = M.entry_facts(p.model("qwen2.5-0.5b-instruct"))
    assert small.tied and small.params == 494_032_768 and small.decoder_layer == "Qwen2DecoderLayer"


def test_grpo30_on_six_processes_cannot_be_built(paper):
    """Finding 1: 15 x 4 completions on 6 processes (the old launcher's count) divide neither field."""
    p, _ = paper
    job = _job(p, "train_cell", "countdown", "llama-3.1-8b-instruct", "grpo30", "lr1e-06_beta0.001")
    settings = {**job_settings(p, "llama-3.1-8b-instruct", "countdown", "grpo30", "lr1e-06_beta0.001").as_dict(),
                "per_device_train_batch_size": 15, "gradient_accumulation_steps": 4}
    pc.check_grpo(job, p, settings, world=6)
    assert job.problems and "cannot be built" in job.message()
    assert job.label in job.message() and "per_device_train_batch_size (15)" in job.message()
    ok = _job(p, "train_cell", "countdown", "llama-3.1-8b-instruct", "grpo30", "lr1e-06_beta0.001")
    pc.check_grpo(ok, p, job_settings(p, "llama-3.1-8b-instruct", "countdown", "grpo30",
                                           "lr1e-06_beta0.001").as_dict())
    assert not ok.problems


def test_the_reference_spread_by_device_map_auto_under_fsdp_fails(paper):
    """Finding 2: TRL 1.16 keeps model_init_kwargs' device_map under FSDP; "auto" spreads the beta > 0 reference."""
    p, _ = paper
    job = _job(p, "train_cell", "countdown", "qwen2.5-7b-instruct", "grpo8", "lr1e-06_beta0.001")
    s = job_settings(p, "qwen2.5-7b-instruct", "countdown", "grpo8", "lr1e-06_beta0.001").as_dict()
    pc.check_grpo(job, p, s, init_kwargs={"dtype": "float32", "device_map": "auto"})
    assert "model_init_kwargs.device_map 'auto'" in job.message() and "grpo8/lr1e-06_beta0.001" in job.message()


@pytest.mark.parametrize("model", ["qwen2.5-7b-instruct", "llama-3.1-8b-instruct"])
def test_the_engine_start_counts_the_reference_as_the_code_holds_it(paper, model):
    """TRL 1.16 starts its colocated engine before it shards the reference: the 7-8B jobs shard it first (built on
    the meta device), and the check counts what each order holds then; TRL's own order fails at the engine start."""
    p, _ = paper
    cell = "lr1e-06_beta0.001"
    s = job_settings(p, model, "countdown", "grpo8", cell).as_dict()
    ok = _job(p, "train_cell", "countdown", model, "grpo8", cell)
    pc.check_grpo(ok, p, s)
    assert not ok.problems, ok.message()
    start = next(ph for ph in ok.phases if ph.name == "start vLLM")
    assert "reference shard, float32 (1/8)" in start.parts and "reference loaded whole (float32)" not in start.parts
    names = [ph.name for ph in ok.phases]
    assert names.index("shard reference") < names.index("start vLLM")  # the reference sharded first
    old = _job(p, "train_cell", "countdown", model, "grpo8", cell)
    pc.check_grpo(old, p, s, sharded_reference=False)
    assert "start vLLM: predicted peak" in old.message() and old.label in old.message()
    names = [ph.name for ph in old.phases]
    assert names.index("start vLLM") < names.index("shard reference") < names.index("policy forward and backward")


def test_an_fsdp_plugin_that_wraps_another_layer_fails(paper):
    """accelerate's plugin, as transformers builds it from fsdp_config, must wrap the model's own decoder layer."""
    p, _ = paper
    s = job_settings(p, "qwen2.5-7b-instruct", "countdown", "grpo8", "lr1e-06_beta0.001").as_dict()
    job = _job(p, "train_cell", "countdown", "qwen2.5-7b-instruct", "grpo8", "lr1e-06_beta0.001")
    pc.check_grpo(job, p, s, fsdp_layers=["LlamaDecoderLayer"])
    assert "does not wrap the model's decoder layer Qwen2DecoderLayer" in job.message()


def test_vllm_without_a_context_length_fails(paper):
    """Finding 3: vLLM sizes Llama-3.1-8B's whole 131,072-token window, 16 GiB of KV cache for one sequence."""
    p, _ = paper
    job = _job(p, "train_cell", "countdown", "llama-3.1-8b-instruct", "grpo8", "lr1e-06_beta0.001")
    s = job_settings(p, "llama-3.1-8b-instruct", "countdown", "grpo8", "lr1e-06_beta0.001").as_dict()
    pc.check_grpo(job, p, s, vllm_max_model_length=None)
    assert "vllm_max_model_length None" in job.message() and "131,072 tokens" in job.message()
    assert job.label.startswith("train_cell countdown/llama-3.1-8b-instruct/grpo8")


def test_essa_int8_at_batch_200_on_qwen32b_fails_and_the_fitted_batch_fits(paper):
    """Finding 4: 200 sequences of 1,536 tokens of Qwen2.5-32B's KV cache beside its INT8 base overflow an H100; the
    batch the memory model fits (what the engines use) does not."""
    p, _ = paper
    cfg = job_settings(p, "qwen2.5-32b", "gsm8k", "essa_int8")
    assert cfg.batch_size == 200 and cfg.backend == "hf"
    old = _job(p, "train", "gsm8k", "qwen2.5-32b", "essa_int8")
    pc.check_essa(old, p, cfg, fitted=False)
    assert "batch_size 200" in old.message() and "essa_int8" in old.message()
    m = M.entry_facts(p.model("qwen2.5-32b"))
    kv = 200 * (512 + 1024) * m.kv_bytes_per_token
    assert 70 * M.GiB < kv < 80 * M.GiB  # 0.25 MiB a token
    new = _job(p, "train", "gsm8k", "qwen2.5-32b", "essa_int8")
    pc.check_essa(new, p, cfg)
    assert not new.problems and "generate batch" in new.notes[0]
    batch = int(re.search(r"generate batch (\d+)", new.notes[0]).group(1))
    assert 50 < batch < 200
    assert M.generate_batch(m, M.quantised_weights(m, "int8"), 200, 512, 1024) == batch


def test_essa_qwen32b_at_the_default_vllm_share_fails(paper):
    """Finding 5: 0.85 of an H100 with 16 LoRA slots leaves Qwen2.5-32B no KV cache."""
    p, _ = paper
    cfg = job_settings(p, "qwen2.5-32b", "gsm8k", "essa_ref")
    old = cfg.model_copy(update={"gpu_memory_utilization": None, "max_loras": 16})
    job = _job(p, "train", "gsm8k", "qwen2.5-32b", "essa_ref")
    pc.check_essa(job, p, old)
    assert "gpu_memory_utilization 0.85, max_loras 16" in job.message() and "essa_ref" in job.message()
    ok = _job(p, "train", "gsm8k", "qwen2.5-32b", "essa_ref")
    pc.check_essa(ok, p, cfg)
    assert not ok.problems


def test_essa_lora_targets_the_model_lacks_stop_the_plan(paper):
    """ESSA's LoRA targets are read off the model's meta build before any job: Qwen2.5-32B has no fused qkv_proj
    (Phi-3's), so that list names the setting and the model's own linears; its attention linears pass."""
    p, _ = paper
    cfg = job_settings(p, "qwen2.5-32b", "gsm8k", "essa_ref")
    bad = _job(p, "train", "gsm8k", "qwen2.5-32b", "essa_ref")
    pc.check_essa(bad, p, cfg.model_copy(update={"lora_targets": ("qkv_proj",)}))
    assert "ESSA setting lora_targets" in bad.message() and "named qkv_proj" in bad.message()
    assert "q_proj, k_proj, v_proj, o_proj" in bad.message()
    ok = _job(p, "train", "gsm8k", "qwen2.5-32b", "essa_ref")
    pc.check_essa(ok, p, cfg.model_copy(update={"lora_targets": ("q_proj", "v_proj")}))
    assert not ok.problems, ok.message()


def test_ppo_loading_whole_models_on_every_gpu_fails(paper):
    """Finding 9: float32 actor and critic and the bf16 reference whole on each GPU before sharding (75 GiB for
    Llama-3.1-8B), and the reference unsharded afterwards."""
    p, _ = paper
    s = job_settings(p, "llama-3.1-8b-instruct", "countdown", "ppo", "alr1e-06_kl0.001").as_dict()
    job = _job(p, "train_cell", "countdown", "llama-3.1-8b-instruct", "ppo", "alr1e-06_kl0.001")
    pc.check_ppo(job, p, s, sharded_load=False)
    assert job.problems and "ppo/alr1e-06_kl0.001" in job.message()
    load = next(ph for ph in job.phases if ph.name == "load")
    assert 74 * M.GiB < load.total < 76 * M.GiB and not M.fits(load)
    assert any("reference, bf16 (whole)" in k for ph in job.phases for k in ph.parts)
    assert "over the job's mem_mb" in job.message()  # 8 x 64 GB of float32 CPU copies on a 384 GB node
    ok = _job(p, "train_cell", "countdown", "llama-3.1-8b-instruct", "ppo", "alr1e-06_kl0.001")
    pc.check_ppo(ok, p, s)
    assert not ok.problems and next(ph for ph in ok.phases if ph.name == "load").total < 16 * M.GiB


def test_preflight_stops_a_run_whose_grpo_micro_batch_does_not_fit():
    """The pre-flight of a real run carries the plan check: 64 completions of 1,024 tokens per micro-batch beside the
    colocated engine overflow the 7B/8B GPUs (their activations), and the problem names the jobs."""
    from esrepro.planning.plan import Plan
    from esrepro.planning.preflight import problems

    cfg = read_config(str(PAPER))
    cfg["methods"]["grpo8"].update(per_device_train_batch_size=64, gradient_accumulation_steps=8)
    p = load_pipeline(cfg, str(PAPER))
    found = problems(p, Plan(p), root=REPO, env={"ESREPRO_OFFLINE": "1"}, esrepro=sys.executable + "-missing",
                     jobs={("train_cell", "llama-3.1-8b-instruct")})
    texts = [pr.text for pr in found if pr.text.startswith("plan check")]
    assert texts and all("llama-3.1-8b-instruct/grpo8/" in t and "over the H100" in t for t in texts)


@pytest.mark.slow
def test_the_cli_prints_the_peaks_and_docs_hold_its_table(paper, tmp_path):
    _, checked = paper
    out = tmp_path / "peaks.md"
    run = subprocess.run([sys.executable, "-m", "esrepro.cli", "plan-check", str(PAPER), "--markdown", str(out)],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr
    table = pc.markdown(checked)
    assert table in run.stdout and out.read_text() == table
    assert table in (REPO / "docs" / "scaling.md").read_text()


def _benchmark(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_builds_its_lowrank_es_measurement_on_cpu(tmp_path):
    """benchmarks/gpu_check.py [7]'s CPU side: the arguments it gives benchmarks/eggroll_speed.py parse there as a
    GPU run of both population sizes (bf16, the GPU shared between the inference and training engines), and the
    figures it reads back name the goal's N, its verdict and the phase standing between eggroll and inference."""
    gpu_check, speed = _benchmark("gpu_check"), _benchmark("eggroll_speed")
    args = speed.parse(gpu_check.lowrank_argv("cuda", "qwen2.5-0.5b", 32, 128, tmp_path / "out.json"))
    assert (args.device, args.build_shape, args.populations, args.dtype) == ("cuda", "qwen2.5-0.5b", [30, 256],
                                                                              "bfloat16")
    assert args.no_es and args.json == tmp_path / "out.json" and args.kv_cache_bytes is None
    assert 2 * args.gpu_share < 1 and (args.prompts, args.new_tokens, args.rank) == (32, 128, 1)

    def row(n: int, inference: float, **phases: float) -> dict:
        ph = dict.fromkeys(speed.EGGROLL_PHASES, 0.0) | {"generation": inference} | phases
        return {"population": n, "eggroll": {"seconds": sum(ph.values()), "phases": ph},
                "inference": {"seconds": inference}}

    figures = gpu_check.lowrank_figures(speed.summary([row(30, 1.0, perturb=0.5, load=0.1),
                                                       row(256, 8.0, load=0.3, grading=0.2)]))
    assert figures["goal_population"] == 256 and figures["within_10_percent_at_goal"]
    assert figures["populations"]["30"]["stands_between"] == "adapter preparation"
    assert not figures["populations"]["30"]["within_10_percent"]
    assert figures["populations"]["256"]["eggroll_over_inference"] == pytest.approx(8.5 / 8.0)
    slow = gpu_check.lowrank_figures(speed.summary([row(256, 8.0, generation=10.0, load=0.3)]))
    assert not slow["within_10_percent_at_goal"]
    assert slow["populations"]["256"]["stands_between"] == "generation beyond inference"


def test_gpu_check_builds_its_memory_predictions_on_cpu(tmp_path):
    """benchmarks/gpu_check.py [6]'s CPU side: the settings it trains with and the memory model's phases for them (the
    same functions the plan check calls), in the order the trainers run them, ready to compare phase by phase with
    torch.cuda.max_memory_allocated on a GPU; without vLLM's GPU build the engine's start is named unmeasured."""
    import importlib.util

    from esrepro.rl import phases as PH

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    model_dir = gpu_check._es_engine().build_model("tiny", tmp_path / "tiny")
    assert not gpu_check.has_vllm_gpu()  # no GPU here
    settings = gpu_check.memory_settings(16)
    assert settings["grpo"]["beta"] > 0 and settings["grpo"]["sharding"] == settings["ppo"]["sharding"] == "fsdp"
    grpo = gpu_check.memory_prediction(model_dir, settings["grpo"])
    ppo = gpu_check.memory_prediction(model_dir, settings["ppo"])
    assert grpo["prompt_tokens"] > 10 and 0 < grpo["predicted_gib"] < 1 and 0 < ppo["predicted_gib"] < 1
    assert list(grpo["phases_gib"]) == [PH.LOAD, PH.SHARD_REFERENCE, PH.SHARD_POLICY, PH.EVALUATE, PH.ROLLOUT,
                                        PH.OLD_LOGPS, PH.REFERENCE_FORWARD, PH.POLICY_PASS, PH.SAVE]
    assert list(ppo["phases_gib"]) == list(dict.fromkeys(PH.ppo_order(reference=True, periodic=True, resume=True)))
    assert max(grpo["phases_gib"].values()) == grpo["predicted_gib"]
    # a phase the run never entered is reported unmeasured; one within the bar passes, one 30% over does not
    pred = grpo["phases_gib"]
    seen = {k: v * (1.3 if k == PH.POLICY_PASS else 1.05) for k, v in pred.items() if k != PH.SAVE}
    cmp = gpu_check.compare_phases(pred, seen)
    assert cmp["unmeasured"] == [PH.SAVE] and cmp["phases"][PH.LOAD]["within_bar"]
    assert not cmp["phases"][PH.POLICY_PASS]["within_bar"]
    # the one-process job's phases are the 8-GPU job's at world 1: the reference sharded (a 1/1 share)
    from transformers import AutoConfig

    from esrepro.planning.plan_check import ppo_phases
    from esrepro.rl.ppo import _settings
    from esrepro.rl.shares import per_process

    m = M.facts_from_config(AutoConfig.from_pretrained(str(model_dir)))
    phases = ppo_phases(m, _settings(settings["ppo"]), per_process(settings["ppo"], 1), 1, True, ppo["prompt_tokens"])
    assert any("reference shard" in k for k in phases[0].parts)


def test_a_model_whose_config_transformers_cannot_build_is_named(tmp_path):
    """A registry entry whose config names a model_type transformers does not know stops the run before any job,
    naming the model and the field; its jobs, checked anyway, are named as jobs that cannot be checked."""
    from esrepro.config import load_registry
    from esrepro.settings.layers import ConfigError

    registry = yaml.safe_load((REPO / "config" / "models.yaml").read_text())
    stated = json.loads((REPO / "config" / "model_configs" / "qwen2.5-14b-instruct.json").read_text())
    registry["models"]["qwen2.5-14b-instruct"]["config"] = {**stated, "model_type": "qwen2_5_unknown"}
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(registry))  # the others' config files: the repository's
    cfg = read_config(str(PAPER))
    cfg["registry"] = str(tmp_path / "models.yaml")
    with pytest.raises(ConfigError, match=r"models\.qwen2\.5-14b-instruct\.config\.model_type: model_type "
                                          r"'qwen2_5_unknown'"):
        load_pipeline(cfg, str(PAPER))
    p = load_pipeline(read_config(str(PAPER)), str(PAPER))
    p.registry["qwen2.5-14b-instruct"] = load_registry(tmp_path / "models.yaml", root=REPO)["qwen2.5-14b-instruct"]
    checked = pc.jobs(p, {("train", "qwen2.5-14b-instruct"), ("evaluate", "qwen2.5-14b-instruct")})
    bad = pc.failures(checked)
    assert bad and all("cannot be checked" in j.message() and "qwen2.5-14b-instruct" in j.label
                       and "model_type 'qwen2_5_unknown'" in j.message() for j in bad)
    assert {j.rule for j in bad} == {"train", "evaluate"}
