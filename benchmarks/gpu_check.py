"""The paper-scale training paths on one GPU, in minutes, with random weights and no download.

Builds a model with Qwen2.5-0.5B's configuration (random weights, a small local tokenizer) and runs, on the
device given (``--device cuda``):

[1] noise: CUDA's normal kernel draws element i from Philox subsequence i only while one pass of its grid covers
    the tensor (SMs x threads per SM elements); above that the bits depend on the SM count. Shown below the
    bound as a prefix test (the first half of a draw equals a draw of half the size), with the cost of drawing
    a 0.5B model's noise in chunks within the bound against one call per tensor (ES's way).
[2] mixed precision: one AdamW step at lr 1e-6 under bf16 autocast on float32 master weights against the same
    step on bf16 weights: the share of weights that moved.
[3] GRPO (TRL's GRPOTrainer, two steps) and [4] PPO (esrepro.rl.ppo, one step) from a bf16 registry model
    through the trainers' own mixed-precision path (``--sharding ddp`` or ``fsdp``, the latter under torchrun):
    seconds per step, peak GPU memory, the returned policy's dtype, and from the resume state written after
    step 1 the master weights' dtype and the share of them that moved from the base.
[6] memory against the model, phase by phase (esrepro.planning.rl_memory, as the plan check counts it; the phases as
    esrepro.rl.phase_trace observes them in the run): GRPO with beta > 0 under FSDP with one process (the reference
    built and sharded as on 8 GPUs, a rollout serving two optimiser steps, periodic evaluation, a resume state), and
    PPO loading and sharding as the 8-GPU job does, each phase's torch.cuda.max_memory_allocated against its
    prediction for the same shapes and the ratio (the CUDA context, which the allocator does not count, left out).
    Without vLLM's GPU build GRPO rolls out with transformers generate: the colocated engine's start and rollout
    (and its share beside every later phase) stay unmeasured, as the output says. Run under torchrun:
    torchrun --standalone --nproc-per-node 1 benchmarks/gpu_check.py --only memory
[5] ES on the transformers engine: seconds per iteration, ES against pure inference on the same engine, the
    perturb + restore + update share (benchmarks/es_engine.py, the device synchronised around each section),
    then two short runs from one seed compared bit for bit.
[7] low-rank ES on vLLM (``--only lowrank``; vLLM's GPU build): benchmarks/eggroll_speed.py's measurement at
    N = 30 and 256 (its own process): an eggroll iteration's phases (adapter preparation, loading, generation,
    grading, release, update) against pure inference of the same sequences on a plain vLLM engine (no LoRA,
    prefix cache off), and whether eggroll is within 10 % of inference at N = 256.

    python benchmarks/gpu_check.py --device cuda --json gpu_check.json
    python benchmarks/gpu_check.py --device cpu --shape tiny      # the same code paths, CPU-sized
    python benchmarks/gpu_check.py --device cuda --only lowrank   # [7], with vLLM's GPU build

Needs torch, transformers, peft, TRL (and datasets) and esrepro's own dependencies; vLLM's GPU build only for [6]'s
colocated-engine phases and for [7].
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def _es_engine():
    spec = importlib.util.spec_from_file_location("es_engine", REPO / "benchmarks" / "es_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clock(device: str) -> float:
    """The time once the device's queued work is done."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def moved_share(before: dict[str, torch.Tensor], after: Iterable[tuple[str, torch.Tensor]]) -> dict:
    """Share of the weights (elements) of ``after`` (name, tensor) that differ from ``before``, and the largest
    change."""
    changed = total = 0
    largest = 0.0
    for name, p in after:
        key = name.removeprefix("module.")
        if key not in before:
            continue
        b = before[key].to(p.device, torch.float32)
        diff = (p.detach().float() - b).abs()
        changed += int((diff > 0).sum())
        total += diff.numel()
        largest = max(largest, float(diff.max()))
    return {"moved_share": changed / max(1, total), "largest_change": largest}


# --- [1] noise ------------------------------------------------------------------------------------------------
#: A chunk size within one pass of CUDA's normal kernel on every H100 (114 to 132 SMs of 2,048 threads).
CHUNK = 1 << 17


def noise_check(device: str, model_dir: Path) -> dict:
    """Whether noise drawn in chunks that one pass of the kernel covers (bits independent of the SM count) would
    be affordable: a model's noise drawn per tensor in one call, as ES draws it, against drawn in chunks."""
    from transformers import AutoModelForCausalLM

    from esrepro.runtime.devices import noise_device

    out: dict = {"noise_device": noise_device(device), "chunk": CHUNK}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        bound = props.multi_processor_count * props.max_threads_per_multi_processor
        gen = torch.Generator(device=device)
        gen.manual_seed(7)
        whole = torch.randn(bound, generator=gen, device=device)
        gen.manual_seed(7)
        half = torch.randn(bound // 2, generator=gen, device=device)
        # below the bound a draw's element i does not depend on the draw's size, nor so on its grid
        out.update(gpu=props.name, sms=props.multi_processor_count, one_pass_elements=bound,
                   prefix_below_bound=bool(torch.equal(whole[: bound // 2], half)))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    shapes = [p.shape for p in model.parameters()]
    out["tensors"], out["elements"] = len(shapes), sum(p.numel() for p in model.parameters())
    del model
    gen = torch.Generator(device=device)
    for label in ("one_call", "chunked"):
        t0 = clock(device)
        for shape in shapes:
            gen.manual_seed(11)
            if label == "one_call":
                torch.randn(tuple(shape), generator=gen, device=device)
            else:
                flat = torch.empty(int(torch.Size(shape).numel()), device=device)
                for start in range(0, flat.numel(), CHUNK):
                    flat[start:start + CHUNK].normal_(generator=gen)
        out[f"seconds_{label}"] = clock(device) - t0
    print(f"[1] noise on {device}: {json.dumps(out)}", flush=True)
    return out


# --- [2] mixed precision ----------------------------------------------------------------------------------------
def precision_check(device: str, model_dir: Path) -> dict:
    """One AdamW step (lr 1e-6) of the LM loss on a fixed batch: float32 masters under bf16 autocast, and bf16."""
    from transformers import AutoModelForCausalLM

    from esrepro.runtime import numerics

    out = {}
    ids = torch.randint(0, 400, (4, 64), generator=torch.Generator().manual_seed(0)).to(device)
    for label, dtype, autocast in (("float32_master_bf16_autocast", torch.float32, True), ("bf16_weights", torch.bfloat16, False)):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = numerics.adamw(model.parameters(), lr=1e-6, weight_decay=0.0)
        ctx = torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with ctx:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        out[label] = moved_share(before, model.named_parameters())
        del model, opt, before
        reset_peak(device)
    print(f"[2] one AdamW step at lr 1e-6: {json.dumps(out)}")
    return out


# --- [3] GRPO and [4] PPO ---------------------------------------------------------------------------------------
def _problems(n: int) -> list[dict]:
    from esrepro.tasks.countdown import generate_problems

    return generate_problems(n, seed=5)


def _master_after_step_one(state: Path) -> dict[str, torch.Tensor]:
    """The float32 master weights a trainer's resume state holds after its first step."""
    from safetensors.torch import load_file

    if (state / "actor.pt").exists():  # PPO
        return torch.load(state / "actor.pt", map_location="cpu", weights_only=True)
    from esrepro.rl.trl_resume import last_complete  # GRPO: TRL's checkpoint

    checkpoint = last_complete(state)
    if checkpoint is None:
        raise RuntimeError(f"{state}: no complete checkpoint after step 1")
    return load_file(str(checkpoint / "model.safetensors"))


def _rl_figures(device: str, model_dir: Path, rows: list[dict], seconds: float, model: torch.nn.Module,
                state: Path) -> dict:
    """Seconds, peak memory, the returned policy's dtype, and the master weights' dtype and movement after step 1
    (read from the resume state) against the bf16 base."""
    from safetensors.torch import load_file

    before = load_file(str(model_dir / "model.safetensors"))
    master = _master_after_step_one(state)
    dtypes = sorted({str(v.dtype) for v in master.values() if v.is_floating_point()})
    return {"steps": len(rows), "seconds": seconds, "seconds_per_step": [r["seconds"] for r in rows],
            "peak_gib": peak_gib(device), "returned_dtype": str(next(model.parameters()).dtype),
            "master_dtypes_after_step1": dtypes,
            "master_moved_share_after_step1": moved_share(before, master.items())["moved_share"],
            "reward_mean": [r.get("reward_mean") for r in rows]}


def _length_task():
    """Countdown's prompts, rewarded by the response's length in characters (/100): a random-weight model scores 0
    on Countdown in every completion, which leaves GRPO's group advantages, and so its update, at zero."""
    from esrepro.tasks.base import Score
    from esrepro.tasks.countdown import CountdownTask

    class TextLength(CountdownTask):
        def score(self, response: str, example: dict) -> Score:
            return Score(len(response) / 100, False, {})

    return TextLength()


def grpo_check(device: str, model_dir: Path, new_tokens: int, sharding: str) -> dict:
    from esrepro.rl.grpo import train_grpo
    from esrepro.settings.methods import GRPOSettings

    settings = GRPOSettings(algorithm="grpo", loss_type="grpo", scale_rewards="group", num_generations=4,
                            per_device_train_batch_size=16, gradient_accumulation_steps=1, max_new_tokens=new_tokens,
                            learning_rate=1e-6, sample_budget=32, resume_every=1, sharding=sharding).as_dict()
    reset_peak(device)
    with tempfile.TemporaryDirectory(prefix="grpo-state-") as state:
        t0 = clock(device)
        model, _, rows = train_grpo(model_dir, _length_task(), _problems(16), settings, steps=2, seed=0,
                                    dtype="bfloat16", resume_dir=Path(state))
        out = _rl_figures(device, model_dir, rows, clock(device) - t0, model, Path(state))
    out.update(completions_per_step=16, sharding=sharding)
    print(f"[3] GRPO: {json.dumps(out)}", flush=True)
    del model
    reset_peak(device)
    return out


def ppo_check(device: str, model_dir: Path, new_tokens: int, sharding: str) -> dict:
    from esrepro.rl.ppo import train_ppo
    from esrepro.tasks import get_task

    settings = {"prompts_per_step": 16, "mini_batch_size": 16, "micro_batch_size": 8, "max_new_tokens": new_tokens,
                "actor_learning_rate": 1e-6, "critic_learning_rate": 1e-5, "resume_every": 1, "sharding": sharding}
    reset_peak(device)
    with tempfile.TemporaryDirectory(prefix="ppo-state-") as tmp:
        state = Path(tmp) / "resume"
        t0 = clock(device)
        model, _, rows = train_ppo(model_dir, get_task("countdown"), _problems(16), settings, steps=1, seed=0,
                                   dtype="bfloat16", progress=False, resume_dir=state)
        out = _rl_figures(device, model_dir, rows, clock(device) - t0, model, state)
    out["sharding"] = sharding
    print(f"[4] PPO: {json.dumps(out)}", flush=True)
    del model
    reset_peak(device)
    return out


# --- [6] memory against the model, phase by phase ------------------------------------------------------------
#: The measured peak of each phase must be within this share of the predicted one.
MEMORY_BAR = 0.20
#: A rollout serving two optimiser steps (TRL's old log-probabilities), beta > 0 (a reference), FSDP.
MEMORY_GRPO = dict(algorithm="grpo", loss_type="grpo", scale_rewards="group", num_generations=4,
                   per_device_train_batch_size=8, gradient_accumulation_steps=2, updates_per_generation=2,
                   learning_rate=1e-6, beta=0.04, sample_budget=32, sharding="fsdp", resume_every=2)
MEMORY_PPO = dict(algorithm="ppo", prompts_per_step=16, mini_batch_size=16, micro_batch_size=8,
                  actor_learning_rate=1e-6, critic_learning_rate=1e-5, beta=0.001, sharding="fsdp", resume_every=1)
#: Steps of [6]'s runs: GRPO two rollouts (a resume state after the first: none is written after the last step).
MEMORY_STEPS = {"grpo": 4, "ppo": 1}
#: Periodic evaluation in [6]: every step, these many problems, batch 8.
MEMORY_EVAL = {"every": 1, "problems": 16, "batch": 8}
#: Phases of a GRPO job that need vLLM's GPU build (TRL's colocated engine): unmeasured without it.
VLLM_PHASES = ("start vLLM",)


def has_vllm_gpu() -> bool:
    """Whether vLLM's GPU build is importable here (the colocated engine's phases can then be measured)."""
    if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
        return False
    try:
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - a broken install counts as none
        return False
    return bool(current_platform.is_cuda())


def memory_settings(new_tokens: int, use_vllm: bool = False) -> dict[str, dict]:
    """The settings of [6]'s two runs, as their trainers and the memory model read them (``use_vllm``: GRPO's
    rollouts on TRL's colocated engine, when vLLM's GPU build is installed)."""
    from esrepro.settings.methods import GRPOSettings, PPOSettings

    engine = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3) if use_vllm else {}
    return {"grpo": GRPOSettings(**MEMORY_GRPO, **engine, max_new_tokens=new_tokens,
                                 eval_batch_size=MEMORY_EVAL["batch"]).as_dict(),
            "ppo": PPOSettings(**MEMORY_PPO, max_new_tokens=new_tokens, eval_batch_size=MEMORY_EVAL["batch"]).as_dict()}


def memory_prediction(model_dir: Path, settings: dict) -> dict:
    """The memory model's phases for one process of ``settings`` on ``model_dir`` (the longest of [6]'s prompts,
    its periodic evaluation and resume states), GiB, without the CUDA context (the allocator does not count it);
    ``phase`` and ``predicted_gib``: the peak."""
    from esrepro.models import memory as M
    from esrepro.models.loading import load_tokenizer
    from esrepro.planning.plan_check import predict_phases
    from esrepro.planning.rl_memory import Evaluation
    from esrepro.rl.grpo import longest_prompt_tokens

    task = _length_task()
    prompt = longest_prompt_tokens(load_tokenizer(model_dir), [task.prompt(e) for e in _problems(16)], chat=False)
    evaluation = Evaluation(MEMORY_EVAL["batch"], prompt, settings["max_new_tokens"])
    phases = predict_phases(model_dir, settings, 1, prompt, evaluation=evaluation, resume=True)
    allocated = {ph.name: (ph.total - ph.parts.get("CUDA context", 0)) / M.GiB for ph in phases}
    peak = M.peak(phases)
    return {"phase": peak.name, "predicted_gib": allocated[peak.name], "prompt_tokens": prompt,
            "phases_gib": allocated, "parts_gib": {k: v / M.GiB for k, v in peak.parts.items()}}


def compare_phases(predicted: dict[str, float], measured: dict[str, float], bar: float = MEMORY_BAR) -> dict:
    """Each phase's measured peak (GiB) against its prediction: the ratio and whether it is within ``bar``; the
    predicted phases never entered are listed as unmeasured."""
    rows = {}
    for name, want in predicted.items():
        got = measured.get(name)
        ratio = got / want if got is not None and want > 0 else None
        rows[name] = {"predicted_gib": want, "measured_gib": got, "ratio": ratio,
                      "within_bar": ratio is not None and abs(ratio - 1) <= bar}
    return {"phases": rows, "unmeasured": [n for n in predicted if n not in measured],
            "unpredicted": [n for n in measured if n not in predicted]}


def memory_check(device: str, model_dir: Path, new_tokens: int) -> dict:
    """[6]: GRPO (beta > 0) and PPO under FSDP on this one GPU, phase by phase (esrepro.rl.phase_trace): each phase's
    measured peak against the memory model's. Without vLLM's GPU build GRPO rolls out with transformers
    ``generate`` and the colocated engine's phases (VLLM_PHASES, and the engine's share beside every later phase)
    stay unmeasured."""
    from esrepro.rl.grpo import train_grpo
    from esrepro.rl.phase_trace import PhaseTrace
    from esrepro.rl.ppo import train_ppo
    from esrepro.train.periodic import PeriodicEval

    vllm = has_vllm_gpu()
    out: dict = {"vllm_gpu_build": vllm,
                 "unmeasured_without_vllm": [] if vllm else list(VLLM_PHASES) + ["rollout on the colocated engine"]}
    for name, settings in memory_settings(new_tokens, use_vllm=vllm).items():
        predicted = memory_prediction(model_dir, settings)
        periodic = (PeriodicEval(_length_task(), _problems(MEMORY_EVAL["problems"]), MEMORY_EVAL["every"],
                                 new_tokens), 16)
        trace = PhaseTrace(memory=torch.cuda.max_memory_allocated if device.startswith("cuda") else None,
                           reset=torch.cuda.reset_peak_memory_stats if device.startswith("cuda") else None)
        reset_peak(device)
        with tempfile.TemporaryDirectory(prefix=f"{name}-memory-") as state, trace.installed():
            if name == "grpo":
                model, _, _ = train_grpo(model_dir, _length_task(), _problems(16), settings,
                                         steps=MEMORY_STEPS[name], seed=0, dtype="bfloat16", periodic=periodic,
                                         resume_dir=Path(state))
            else:
                model, _, _ = train_ppo(model_dir, _length_task(), _problems(16), settings, steps=MEMORY_STEPS[name],
                                        seed=0, dtype="bfloat16", progress=False, periodic=periodic,
                                        resume_dir=Path(state) / "resume")
        measured = {k: v / 2**30 for k, v in trace.peaks.items()}
        out[name] = {**predicted, "order": trace.order,
                     **compare_phases(predicted["phases_gib"], measured)}
        for phase, row in out[name]["phases"].items():
            print(f"[6] {name} {phase}: measured {row['measured_gib']} GiB, predicted {row['predicted_gib']:.2f} GiB, "
                  f"ratio {row['ratio']}", flush=True)
        del model
        reset_peak(device)
    return out


# --- [5] ES ------------------------------------------------------------------------------------------------------
def es_check(device: str, model_dir: Path, args: argparse.Namespace) -> dict:
    from esrepro.backends.spec import EngineSpec
    from esrepro.es.loop import run_es
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import Scoring
    from esrepro.settings.methods import ESSettings
    from esrepro.tasks.countdown import generate_problems

    bench = _es_engine()
    ns = SimpleNamespace(dtype=None, device=device, population=args.population, iterations=2,
                         new_tokens=args.new_tokens, prompts=args.prompts, batch_size=None, generation="default",
                         noise="correlated", restore="subtract", engines=1, vllm_kv_cache_bytes=None, threads=1,
                         gpu_memory_utilization=0.8)
    timing = bench.es_against_inference(ns, model_dir, "hf")
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    cfg = ESSettings(population=4, iterations=2, max_new_tokens=32, train_examples=8, batch_size=8)
    examples = generate_problems(8, seed=123)
    runs = []
    for _k in range(2):
        spec = EngineSpec(model_dir=str(model_dir), backend="hf", dtype=dtype, device=device, batch_size=8,
                          noise=cfg.noise, restore=cfg.restore, threads=1)
        evaluator = SerialEvaluator(spec, Scoring(task="countdown", examples=examples, max_new_tokens=32))
        with tempfile.TemporaryDirectory() as state:
            log = run_es(evaluator, cfg, Path(state) / "resume", seed=3, progress=False)
        runs.append([(r["rewards"], r["checksum"]) for r in log])
        evaluator.close()
    out = {"timing": {k: timing[k] for k in ("es_seconds_per_iteration", "es_over_inference", "es_overhead_share",
                                             "es_share_outside_generation", "es_tokens_per_s",
                                             "inference_tokens_per_s", "es_seconds")},
           "shape": {"population": args.population, "prompts": args.prompts, "new_tokens": args.new_tokens},
           "two_runs_bit_equal": runs[0] == runs[1], "checksums": [c for _, c in runs[0]]}
    print(f"[5] ES: {json.dumps(out)}")
    return out


# --- [7] low-rank ES on vLLM -------------------------------------------------------------------------------------
#: [7]'s population sizes: the paper's N and the one the goal (within 10 % of inference) is stated at.
LOWRANK_POPULATIONS = (30, 256)


def lowrank_argv(device: str, shape: str, prompts: int, new_tokens: int, out: Path) -> list[str]:
    """benchmarks/eggroll_speed.py's arguments for [7]: the model shape, both population sizes, rank 1, no full-rank
    ES (its N generate calls per iteration at N = 256 would outlast the section), the figures into ``out``."""
    return ["--device", device, "--build-shape", shape, "--populations", *map(str, LOWRANK_POPULATIONS),
            "--rank", "1", "--prompts", str(prompts), "--new-tokens", str(new_tokens), "--iterations", "3",
            "--no-es", "--json", str(out)]


def lowrank_figures(summary: list[dict]) -> dict:
    """[7]'s figures from eggroll_speed's summary: per N the ratio, the phases and what stands between eggroll and
    inference; and whether the goal holds at the largest N."""
    rows = {str(r["population"]): {k: r[k] for k in ("eggroll_seconds", "inference_seconds",
                                                      "eggroll_over_inference", "within_10_percent", "phases",
                                                      "stands_between")} for r in summary}
    largest = max(summary, key=lambda r: r["population"])
    return {"populations": rows, "goal_population": largest["population"],
            "within_10_percent_at_goal": largest["within_10_percent"]}


def lowrank_check(device: str, args: argparse.Namespace) -> dict:
    """[7]: benchmarks/eggroll_speed.py on this device, in a process of its own (vLLM's engines hold the device)."""
    import os
    import subprocess

    if device.startswith("cuda") and not has_vllm_gpu():
        raise RuntimeError("[7] needs vLLM's GPU build (pip install vllm)")
    with tempfile.TemporaryDirectory(prefix="lowrank-") as tmp:
        out = Path(tmp) / "eggroll_speed.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                          os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, str(REPO / "benchmarks" / "eggroll_speed.py"),
               *lowrank_argv(device, args.shape, args.prompts, args.new_tokens, out)]
        subprocess.run(cmd, check=True, cwd=REPO, env=env)
        figures = lowrank_figures(json.loads(out.read_text())["summary"])
    figures["shape"] = {"prompts": args.prompts, "new_tokens": args.new_tokens, "rank": 1}
    print(f"[7] low-rank ES: {json.dumps(figures)}")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=["qwen2.5-0.5b", "medium", "tiny"])
    ap.add_argument("--population", type=int, default=8, help="ES timing: population")
    ap.add_argument("--prompts", type=int, default=32, help="ES timing: prompts per member")
    ap.add_argument("--new-tokens", type=int, default=128, help="new tokens (ES timing, GRPO, PPO)")
    ap.add_argument("--only", default="noise,precision,grpo,ppo,es",
                    help="sections to run, comma-separated (also memory, and lowrank with vLLM's GPU build)")
    ap.add_argument("--sharding", choices=["ddp", "fsdp"], default="ddp",
                    help="GRPO and PPO: ddp, or fsdp (run under torchrun: torchrun --standalone --nproc-per-node 1 "
                    "benchmarks/gpu_check.py --only grpo,ppo --sharding fsdp)")
    ap.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    result: dict = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
                    "torch": torch.__version__, "shape": args.shape}
    sections = {"noise": lambda d: noise_check(args.device, d), "precision": lambda d: precision_check(args.device, d),
                "grpo": lambda d: grpo_check(args.device, d, args.new_tokens, args.sharding),
                "ppo": lambda d: ppo_check(args.device, d, args.new_tokens, args.sharding),
                "es": lambda d: es_check(args.device, d, args),
                "memory": lambda d: memory_check(args.device, d, args.new_tokens),
                "lowrank": lambda d: lowrank_check(args.device, args)}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        model_dir = _es_engine().build_model(args.shape, Path(tmp) / args.shape)
        for name in args.only.split(","):
            t0 = time.perf_counter()
            try:
                result[name] = sections[name](model_dir)
            except Exception as exc:  # report every section, then fail
                traceback.print_exc()
                result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            result[name]["section_seconds"] = time.perf_counter() - t0
            if args.json:
                args.json.write_text(json.dumps(result, indent=1, default=str))
    result["seconds"] = time.perf_counter() - started
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(f"gpu_check: {result['seconds']:.0f} s in all")
    failed = [k for k, v in result.items() if isinstance(v, dict) and "error" in v]
    if failed:
        raise SystemExit(f"sections failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
