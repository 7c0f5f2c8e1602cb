"""GRPO at the paper's scale: batch shares over processes, master-weight precision, FSDP and vLLM wiring, resume.

The multi-process and resume runs go through ``tests/grpo_counting_run.py``, which counts every completion
the task scores in every process: what TRL actually did, not our arithmetic.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from esrepro.rl import trl_resume
from esrepro.rl.grpo import _policy, cpu_overrides, grpo_config_kwargs
from esrepro.rl.grpo_parallel import check_launch, decoder_layer_classes, fsdp_kwargs, process_batch
from esrepro.runtime import numerics
from esrepro.tasks.countdown import prepare
from esrepro.train.resume import ResumeMismatch
from test_rl_trainers import GRPO

HERE = Path(__file__).resolve().parent
RUN = HERE / "grpo_counting_run.py"
BIN = Path(sys.executable).parent


# --- batch shares ----------------------------------------------------------------------------------------------


def test_process_batch_divides_accumulation_first_then_the_micro_batch():
    s = {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 8}
    assert process_batch(s, 1) == {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 8}
    assert process_batch(s, 4) == {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 2}
    assert process_batch({**s, "gradient_accumulation_steps": 2}, 4) == {
        "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}
    for w in (1, 2, 4, 8):  # the paper config's grpo30: 30 x 8 = 240 completions per step on 1 to 8 GPUs
        share = process_batch({"per_device_train_batch_size": 30, "gradient_accumulation_steps": 8}, w)
        assert share["per_device_train_batch_size"] * share["gradient_accumulation_steps"] * w == 240


def test_process_batch_names_the_fields_when_the_processes_cannot_share_it():
    named = r"per_device_train_batch_size \(30\) x gradient_accumulation_steps \(1\).*by 4 training"
    with pytest.raises(ValueError, match=named):
        process_batch({"per_device_train_batch_size": 30, "gradient_accumulation_steps": 1}, 4)


def test_one_process_seeing_several_gpus_is_told_to_run_under_torchrun():
    check_launch(1, 1)
    check_launch(4, 4)
    with pytest.raises(RuntimeError, match="--nproc-per-node 8 --no-python esrepro train"):
        check_launch(1, 8)


# --- master weights -------------------------------------------------------------------------------------------


def test_policy_master_weights_are_float32_whatever_the_registry_dtype(tiny_model_dir):
    assert _policy(tiny_model_dir, None, "bfloat16") == (str(tiny_model_dir),
                                                         {"dtype": torch.float32, "device_map": {"": "cpu"}})


def test_fsdp_processes_load_policy_and_reference_on_their_own_gpu(tiny_model_dir, monkeypatch):
    """TRL 1.16 leaves ``device_map`` unset under FSDP (it sets None for MULTI_GPU and DeepSpeed only), and an unset
    device_map on a GPU machine is ``"auto"``: every GPU the process sees. Rank 1 of 2 under sharding: fsdp loads
    the float32 policy and reference whole on its own GPU instead."""
    from esrepro.rl.grpo import process_device
    from esrepro.runtime.distributed import world

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    here = world()
    _, kwargs = _policy(tiny_model_dir, None, "bfloat16", process_device(False, here.local_rank))
    assert kwargs == {"dtype": torch.float32, "device_map": {"": "cuda:1"}}
    assert process_device(False) == "cuda:0"  # one process: the indexed device the Trainer compares with its own


def test_trl_builds_the_reference_model_from_our_placement(tiny_model_dir, tmp_path, monkeypatch):
    """A real GRPOTrainer with beta > 0 on CPU: the reference model TRL builds gets our model_init_kwargs, device_map
    included (outside DDP and DeepSpeed TRL passes them on unchanged, which is what FSDP relies on)."""
    import trl.trainer.grpo_trainer as grpo_trainer
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from esrepro.models.loading import load_tokenizer

    loads: list[dict] = []
    real = grpo_trainer.create_model_from_path

    def recording(model_id, **kwargs):  # the real loader, its kwargs kept
        loads.append(dict(kwargs))
        return real(model_id, **kwargs)

    monkeypatch.setattr(grpo_trainer, "create_model_from_path", recording)
    policy, init_kwargs = _policy(tiny_model_dir, None, "bfloat16", "cpu")
    settings = {**GRPO, "beta": 0.04}
    cfg = GRPOConfig(**grpo_config_kwargs(settings, steps=1, seed=0, output_dir=str(tmp_path), on_cpu=True),
                     model_init_kwargs=init_kwargs)
    tok = load_tokenizer(tiny_model_dir)
    trainer = GRPOTrainer(model=policy, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], args=cfg,
                          processing_class=tok, train_dataset=Dataset.from_list([{"prompt": "1 2 3"}] * 8))
    assert trainer.ref_model is not None and len(loads) == 2  # the policy, then the reference
    assert all(k["device_map"] == {"": "cpu"} and k["dtype"] == torch.float32 for k in loads)
    assert {p.device.type for p in trainer.ref_model.parameters()} == {"cpu"}


@pytest.mark.parametrize("master", [torch.float32, torch.bfloat16])
def test_an_lr_1e6_step_moves_float32_master_weights_not_bf16_ones(master):
    """The GPU path's scheme (float32 master, bf16 autocast) against pure bf16 weights, with the trainer's AdamW."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64, bias=False)
    with torch.no_grad():  # magnitudes 0.01 to 1, either sign
        layer.weight.copy_(torch.empty(64, 64).uniform_(0.01, 1.0) * torch.randint(0, 2, (64, 64)).mul(2).sub(1))
    layer.to(master)
    before = layer.weight.detach().clone()
    opt = numerics.adamw(layer.parameters(), lr=1e-6, weight_decay=0.0)
    x = torch.randn(8, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = layer(x.to(master)).float().pow(2).mean()
    loss.backward()
    opt.step()
    moved = (layer.weight.detach() != before).float().mean().item()
    assert moved == (1.0 if master == torch.float32 else 0.0)


# --- FSDP and vLLM wiring -------------------------------------------------------------------------------------


def test_fsdp_wiring_shards_each_decoder_layer_and_gathers_the_full_state(tiny_model_dir):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from trl import GRPOConfig

    from esrepro.models.loading import load_model

    layers = decoder_layer_classes(tiny_model_dir)
    assert layers == ["Qwen2DecoderLayer"]
    assert {type(m).__name__ for m in load_model(tiny_model_dir).modules()} >= set(layers)
    settings = {**GRPO, "sharding": "fsdp", "bf16": False}
    kw = grpo_config_kwargs(settings, steps=1, seed=0, output_dir="/tmp/unused", on_cpu=False, fsdp_layers=layers)
    assert kw["gradient_checkpointing"] is False and kw["fsdp_config"]["activation_checkpointing"] is True
    args = GRPOConfig(**{**kw, "use_cpu": True}).fsdp_plugin_args  # TrainingArguments' translation for accelerate
    assert args == {"fsdp_version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                    "transformer_cls_names_to_wrap": "Qwen2DecoderLayer", "cpu_ram_efficient_loading": False,
                    "state_dict_type": "SHARDED_STATE_DICT", "activation_checkpointing": True,
                    "reshard_after_forward": True}
    plugin = FullyShardedDataParallelPlugin(**args)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert fsdp_kwargs(layers, False)["fsdp_config"]["activation_checkpointing"] is False
    on_cpu = grpo_config_kwargs(settings, steps=1, seed=0, output_dir="/tmp/unused", on_cpu=True, fsdp_layers=layers)
    assert "fsdp" not in on_cpu and cpu_overrides(settings)["sharding"] == "ddp"


def test_fsdp_plugin_reduces_in_float32_and_saves_sharded(tiny_model_dir):
    """The plugin the GRPO job's Trainer builds (TrainingArguments' fsdp_plugin_args, then AcceleratorState's
    set_mixed_precision("bf16")) reduces gradients and returns outputs in float32, as PPO does; accelerate's own
    policy, without ours, is bf16 throughout. Resume checkpoints are sharded (DCP, every process its shard)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from trl import GRPOConfig

    from esrepro.rl.grpo_parallel import set_mixed_precision

    layers = decoder_layer_classes(tiny_model_dir)
    settings = {**GRPO, "sharding": "fsdp", "bf16": False}  # bf16 GRPOConfig refuses a CPU; the flag is passed below
    kw = grpo_config_kwargs(settings, steps=1, seed=0, output_dir="/tmp/unused", on_cpu=False, fsdp_layers=layers)

    def plugin(ours: bool) -> FullyShardedDataParallelPlugin:
        cfg = GRPOConfig(**{**kw, "use_cpu": True})
        if ours:
            set_mixed_precision(cfg, True)
        built = FullyShardedDataParallelPlugin(**cfg.fsdp_plugin_args)
        built.set_mixed_precision("bf16")  # what accelerate's AcceleratorState does with mixed_precision="bf16"
        return built

    policy = plugin(True).mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (torch.bfloat16, torch.float32,
                                                                              torch.float32)
    theirs = plugin(False).mixed_precision_policy
    assert (theirs.reduce_dtype, theirs.output_dtype) == (torch.bfloat16, torch.bfloat16)
    assert "SHARDED_STATE_DICT" in str(plugin(True).state_dict_type)
    cfg = GRPOConfig(**{**kw, "use_cpu": True})
    set_mixed_precision(cfg, False)
    assert "mixed_precision_policy" not in cfg.fsdp_plugin_args


def test_vllm_colocate_settings_reach_trl_on_gpu_and_are_forced_off_on_cpu():
    from trl import GRPOConfig

    settings = {**GRPO, "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.35,
                "vllm_tensor_parallel_size": 2, "vllm_enable_sleep_mode": True}
    gpu = grpo_config_kwargs(settings, steps=1, seed=0, output_dir="/tmp/unused", on_cpu=False, prompt_tokens=50)
    assert {k: gpu[k] for k in ("use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size",
                                "vllm_enable_sleep_mode")} == {
        "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.35,
        "vllm_tensor_parallel_size": 2, "vllm_enable_sleep_mode": True}
    assert set(gpu) <= set(GRPOConfig.__dataclass_fields__)  # every key is a GRPOConfig field
    cpu = grpo_config_kwargs(settings, steps=1, seed=0, output_dir="/tmp/unused", on_cpu=True)
    assert cpu["use_vllm"] is False and cpu_overrides(settings)["use_vllm"] is False


# --- resume state ---------------------------------------------------------------------------------------------


def test_resume_state_refuses_other_settings_and_drops_an_interrupted_save(tmp_path):
    key = trl_resume.resume_key({"learning_rate": 1e-6, "resume_every": 5}, seed=0, steps=4, world_size=1)
    assert key == trl_resume.resume_key({"learning_rate": 1e-6, "resume_every": 9}, seed=0, steps=4, world_size=1)
    (tmp_path / "checkpoint-2").mkdir()
    rows = [{"step": 0}, {"step": 1}, {"step": 2}]
    trl_resume.mark_complete(tmp_path / "checkpoint-2", key, 2, rows, {"periodic": [{"iteration": 0}]})
    (tmp_path / "checkpoint-3").mkdir()  # killed while saving: no marker
    periodic: list[dict] = []
    checkpoint, log = trl_resume.open_state(tmp_path, key, {"periodic": periodic})
    assert checkpoint == tmp_path / "checkpoint-2" and log == rows[:2] and periodic == [{"iteration": 0}]
    assert not (tmp_path / "checkpoint-3").exists()
    other = trl_resume.resume_key({"learning_rate": 3e-6}, seed=0, steps=4, world_size=1)
    with pytest.raises(ResumeMismatch, match=f"delete {tmp_path}"):
        trl_resume.open_state(tmp_path, other)


# --- real runs ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def countdown(tmp_path_factory):
    out = tmp_path_factory.mktemp("countdown8")
    prepare(out, {"kind": "generated", "n_train": 8, "n_test": 4}, seed=0)
    return out


def _kwargs(model_dir: Path, data_dir: Path, out: Path, **extra) -> str:
    spec = {**GRPO, "train_examples": 8, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
            **extra}  # 4 completions (2 groups of 2) per optimiser step
    return json.dumps(dict(task="countdown", model="test", model_dir=str(model_dir), data_dir=str(data_dir),
                           spec=spec, method="grpo", out=str(out), seed=0, threads=1))


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent / "src")}


def _count(counts: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in counts.glob("rank*.txt"))


def _rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_score_the_budget_of_one(tiny_model_dir, countdown, tmp_path):
    """torchrun with 2 CPU processes (gloo): as many completions per step and steps as one process; the main
    process alone keeps snapshots and evaluates; resume states are written (and dropped at the end) by both."""
    extra = dict(sample_budget=16, resume_every=1, keep_every=2, eval_every=2, eval_limit=2, eval_max_new_tokens=4)
    one = _kwargs(tiny_model_dir, countdown, tmp_path / "one", **extra)
    two = _kwargs(tiny_model_dir, countdown, tmp_path / "two", **extra)
    subprocess.run([sys.executable, str(RUN), str(tmp_path / "c1"), one], check=True, env=_env(), timeout=300)
    subprocess.run([str(BIN / "torchrun"), "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
                    str(RUN), str(tmp_path / "c2"), two], check=True, env=_env(), timeout=300)
    evaluated = 3 * 2  # 2 test problems at steps 0, 2 and 4, on the main process
    assert _count(tmp_path / "c1") == _count(tmp_path / "c2") == 16 + evaluated  # 4 steps x 4 completions
    assert [len((tmp_path / "c2" / f"rank{r}.txt").read_text().splitlines()) for r in (0, 1)] == [8 + evaluated, 8]
    assert len(_rows(tmp_path / "two" / "periodic_eval.jsonl")) == 3
    assert (tmp_path / "two" / "checkpoints" / "iter000002" / "model.safetensors").exists()
    assert not (tmp_path / "two" / "resume").exists()
    accel = json.loads((tmp_path / "c2" / "accelerate0.json").read_text())
    assert accel["distributed_type"].endswith("MULTI_CPU") and accel["num_processes"] == 2
    assert len(_rows(tmp_path / "two" / "log.jsonl")) == len(_rows(tmp_path / "one" / "log.jsonl")) == 4
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert manifest["per_process"] == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1}
    assert manifest["budget"]["samples_per_step"] == 4 and manifest["budget"]["steps"] == 4


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_uninterrupted_result(tiny_model_dir, countdown, tmp_path):
    """SIGKILL once the state of step 3 exists (in the second pass over the 4 problems: 2 per step), rerun: log,
    periodic rows, snapshots and weights bit-equal."""
    extra = dict(sample_budget=24, train_examples=4, resume_every=1, keep_every=2, eval_every=2, eval_limit=2,
                 eval_max_new_tokens=4)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    subprocess.run([sys.executable, str(RUN), str(tmp_path / "cw"), _kwargs(tiny_model_dir, countdown, whole, **extra)],
                   check=True, env=_env(), timeout=300)
    args = [sys.executable, str(RUN), None, _kwargs(tiny_model_dir, countdown, cut, **extra)]
    args[2] = str(tmp_path / "c1")
    first = subprocess.Popen(args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = cut / "resume" / "checkpoint-3" / trl_resume.MARKER
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert first.poll() is None, "the run ended before its step-3 state existed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    resumed_from = int(trl_resume.last_complete(cut / "resume").name.split("-")[1])
    assert 3 <= resumed_from < 6
    args[2] = str(tmp_path / "c2")
    subprocess.run(args, check=True, env=_env(), timeout=300)
    assert _rows(cut / "log.jsonl") == _rows(whole / "log.jsonl") and len(_rows(whole / "log.jsonl")) == 6
    assert _rows(cut / "periodic_eval.jsonl") == _rows(whole / "periodic_eval.jsonl")
    for rel in ("checkpoint", "checkpoints/iter000002", "checkpoints/iter000004"):
        a, b = load_file(str(whole / rel / "model.safetensors")), load_file(str(cut / rel / "model.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rel
    assert not (cut / "resume").exists() and not (whole / "resume").exists()
    # scored: 6 steps x 4 completions, plus 2 test problems per evaluation (steps 0, 2, 4, 6)
    assert _count(tmp_path / "cw") == 24 + 4 * 2
    later = [s for s in (2, 4, 6) if s > resumed_from]  # the rerun's evaluations
    assert _count(tmp_path / "c2") == (6 - resumed_from) * 4 + 2 * len(later)


def test_a_resume_interval_inside_a_rollout_is_refused():
    kw = dict(steps=8, seed=0, output_dir="/tmp/unused", on_cpu=True, resume=True)
    rollouts = {**GRPO, "updates_per_generation": 4}
    assert grpo_config_kwargs({**rollouts, "resume_every": 8}, **kw)["save_steps"] == 8
    with pytest.raises(ValueError, match=r"resume_every: 6 steps is not a multiple of updates_per_generation \(4\)"):
        grpo_config_kwargs({**rollouts, "resume_every": 6}, **kw)
    assert grpo_config_kwargs({**GRPO, "resume_every": 3}, **kw)["save_steps"] == 3  # one step per rollout: any


@pytest.mark.slow
def test_a_run_killed_inside_a_rollout_resumes_onto_the_same_mini_batch_schedule(tiny_model_dir, countdown,
                                                                                 tmp_path):
    """Rollouts of 2 optimiser steps (GRPO-v's mini-batches, 2 instead of 4), a resume state every rollout; SIGKILL
    once the second rollout was generated and scored (inside it, after the state of step 2): the rerun says where
    it resumes, generates rollouts 2 and 3 only, and its log and weights equal the uninterrupted run's."""
    extra = dict(sample_budget=24, train_examples=4, updates_per_generation=2, resume_every=2)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    subprocess.run([sys.executable, str(RUN), str(tmp_path / "cw"), _kwargs(tiny_model_dir, countdown, whole, **extra)],
                   check=True, env=_env(), timeout=300)
    per_rollout = 2 * 4  # 2 optimiser steps x 4 completions
    assert _count(tmp_path / "cw") == 3 * per_rollout  # 6 steps, 3 rollouts
    args = [sys.executable, str(RUN), str(tmp_path / "c1"), _kwargs(tiny_model_dir, countdown, cut, **extra)]
    first = subprocess.Popen(args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = cut / "resume" / "checkpoint-2" / trl_resume.MARKER
    deadline = time.monotonic() + 300
    while not (marker.exists() and (tmp_path / "c1").is_dir() and _count(tmp_path / "c1") >= 2 * per_rollout):
        assert first.poll() is None, "the run ended before its second rollout was scored"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert trl_resume.last_complete(cut / "resume").name == "checkpoint-2", "not killed inside the second rollout"
    args[2] = str(tmp_path / "c2")
    rerun = subprocess.run(args, check=True, env=_env(), timeout=300, capture_output=True, text=True)
    assert f"GRPO: resuming from the state in {cut / 'resume' / 'checkpoint-2'}: 2 of 6 steps done" in rerun.stdout
    assert _count(tmp_path / "c2") == 2 * per_rollout  # rollouts 2 and 3, each generated once
    rows, rows_whole = _rows(cut / "log.jsonl"), _rows(whole / "log.jsonl")
    assert len(rows_whole) == 6 and rows == rows_whole
    a, b = load_file(str(whole / "checkpoint" / "model.safetensors")), load_file(str(cut / "checkpoint" /
                                                                                     "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_no_resume_state_is_kept_after_the_last_step(tiny_model_dir, tmp_path):
    """A state at the last step would make a rerun train a step beyond the run (the Trainer resumes into one more)."""
    from esrepro.rl.grpo import train_grpo
    from test_rl_trainers import SHORT, LengthTask

    torch.set_num_threads(1)
    _, _, rows = train_grpo(tiny_model_dir, LengthTask(), SHORT, {**GRPO, "resume_every": 1}, steps=2, seed=0,
                            resume_dir=tmp_path)
    assert len(rows) == 2
    assert [p.name for p in sorted(tmp_path.glob("checkpoint-*"))] == ["checkpoint-1"]
    assert trl_resume.last_complete(tmp_path) == tmp_path / "checkpoint-1"


# --- vLLM's context ---------------------------------------------------------------------------------------------


def test_vllm_context_is_the_longest_prompt_plus_the_completion():
    """vLLM left to size its context takes the model's window (131,072 tokens on Llama-3.1-8B): one sequence's KV
    cache alone (16 GiB in bf16) is more than 0.3 of an 80 GB GPU holds beside the weights, and the engine refuses to
    start. GRPO gives it the longest prompt plus max_new_tokens; a setting of its own is kept; none is an error."""
    settings = {**GRPO, "use_vllm": True, "vllm_mode": "colocate"}
    kw = grpo_config_kwargs(settings, steps=1, seed=0, output_dir="x", on_cpu=False, prompt_tokens=57)
    assert kw["vllm_max_model_length"] == 57 + GRPO["max_new_tokens"]
    kept = grpo_config_kwargs({**settings, "vllm_max_model_length": 4096}, steps=1, seed=0, output_dir="x",
                              on_cpu=False, prompt_tokens=57)
    assert kept["vllm_max_model_length"] == 4096
    with pytest.raises(ValueError, match="vllm_max_model_length"):
        grpo_config_kwargs(settings, steps=1, seed=0, output_dir="x", on_cpu=False)
    assert grpo_config_kwargs(settings, steps=1, seed=0, output_dir="x", on_cpu=True)["use_vllm"] is False


def test_paper_grpo_jobs_give_vllm_a_context_sized_from_their_prompts():
    """Every GRPO-family job of the paper's plan (Table 1's GRPO-z 8/30, GRPO-v, Dr.GRPO-v cells, the conciseness and
    ESSA baselines) at its launched process count: the GRPOConfig arguments of each rollout-by-vLLM run carry a
    context of the longest prompt plus its 1,024 completion tokens (a stated 400-token prompt bound here; the run
    measures its own prompts), far below the 32,768-131,072-token windows of the paper's models."""
    from conftest import REPO
    from esrepro.config import load_yaml
    from esrepro.planning import preflight
    from esrepro.planning.cluster import rl_job
    from esrepro.planning.load import load_pipeline
    from esrepro.planning.plan import Plan
    from esrepro.settings.methods import GRPO_ALGORITHMS

    paper = load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=REPO)
    seen: dict[str, int] = {}
    for _, task, model, method, cell in preflight._training_jobs(paper, Plan(paper)):
        settings = paper.method_settings(model, task, method, cell).as_dict()
        if settings["algorithm"] not in GRPO_ALGORITHMS:
            continue
        world = rl_job(paper, model, settings).training_processes()
        kw = grpo_config_kwargs(settings, steps=1, seed=0, output_dir="x", on_cpu=False, world_size=world,
                                fsdp_layers=["DecoderLayer"], prompt_tokens=400)
        if kw["use_vllm"]:
            assert kw["vllm_mode"] == "colocate" and kw["vllm_gpu_memory_utilization"] <= 0.3, (task, model, method)
            assert kw["vllm_max_model_length"] == 400 + settings["max_new_tokens"] <= 8192, (task, model, method)
            seen[settings["algorithm"]] = seen.get(settings["algorithm"], 0) + 1
    # Table 1's Countdown cells roll out with vLLM: GRPO-z (8) and (30) 28 cells each, GRPO-v and Dr.GRPO-v 7 each
    assert seen == {"grpo_zero": 56, "verl_grpo": 7, "verl_dr_grpo": 7}, seen


def test_longest_prompt_tokens_counts_as_trl_encodes(tiny_model_dir):
    """Without a chat template TRL encodes prompts with the tokenizer's own call; with one, the template tokenizes."""
    from esrepro.models.loading import load_tokenizer
    from esrepro.rl.grpo import longest_prompt_tokens

    tok = load_tokenizer(tiny_model_dir)
    prompts = ["1 2 3", "1 2 3 4 5 6 7 8 9 10 11 12"]
    assert longest_prompt_tokens(tok, prompts, chat=False) == len(tok(prompts[1])["input_ids"])
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    text = tok.apply_chat_template([{"role": "user", "content": prompts[1]}], tokenize=False,
                                   add_generation_prompt=True)
    assert longest_prompt_tokens(tok, prompts, chat=True) == len(tok(text, add_special_tokens=False)["input_ids"])
