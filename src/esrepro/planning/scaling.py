"""Memory and time arithmetic of a training job at the paper's scale (the tables of docs/scaling.md).

A model's parameter count P is that of its registry entry's config, counted on torch's meta device
(:func:`model_parameters`); the entry's ``size`` text is never read.

Memory is per GPU, in GB (1e9 bytes), before activations and the KV cache:

- ES and ESSA engines hold the model in its registry dtype (2 bytes a parameter in bf16) on each GPU.
- GRPO and PPO train float32 master weights with AdamW: 4 (weights) + 4 (gradients) + 8 (two moments) = 16
  bytes a parameter for each trained model (the policy; PPO's critic too), on every process under ``ddp``, a
  1/W share under ``fsdp``; the frozen reference (``beta > 0``) is 2 bytes a parameter for PPO and 4 for GRPO
  (TRL builds it as it builds the policy; sharded under ``fsdp``); GRPO's colocated vLLM (``use_vllm``) takes
  its ``vllm_gpu_memory_utilization`` of the GPU for its bf16 copy and KV cache;
  PPO's rollout under ``fsdp`` gathers the whole policy in bf16 (2 bytes a parameter).

Time is the work of one run at its settings, as upper bounds (every completion runs to ``max_new_tokens``):
generated tokens over the job's GPUs at the decoding throughput below (2P FLOPs a token at the generation
efficiency, at most DECODE_CAP tokens a second per GPU), plus the tokens trained
(prompt + completion) x FLOPs per token over the job's GPUs at the training efficiency. The peak is the H100
SXM's dense bf16 (989 TFLOP/s, NVIDIA's H100 datasheet); the efficiencies are assumptions, stated here and
in docs/scaling.md, to be replaced by measured throughput (benchmarks/gpu_check.py, docs/benchmarks.md).
Small batches are bound by latency instead: an iteration (ES) or optimiser step (RL) decodes its
``max_new_tokens`` one step after another, each step reading the bf16 weights once (the H100 SXM's 3.35 TB/s,
NVIDIA's datasheet, at an assumed half of it), and an ES iteration draws and applies its noise for each member an
engine scores and for the update (6 ms a draw of a 0.5B model on an H100, benchmarks/gpu_check.py [1], doubled for
applying it); an iteration's or step's time is the larger of the two, plus the noise. Every job adds STARTUP
(loading the model, starting engines: assumed).

A job's SLURM runtime follows from its estimate (:func:`schedule`): MARGIN x the estimate, split evenly over as
few attempts as the registry ``runtime`` (the per-attempt ceiling, a site's wall-clock limit) allows, each later
attempt continuing from the previous one's resume state; so a job asks for between 1x and 2x its estimate.

The steps around training (:func:`step_cost`) are estimated the same way: an evaluation's or KL job's generation
through transformers' generate at its batch size (KL: for the final weights and every kept snapshot, with both
models' forward passes over the sampled responses), a download at DOWNLOAD_BYTES_PER_S, checkpoint reads at
READ_BYTES_PER_S; they ask for MARGIN x the estimate in one attempt (:func:`step_minutes`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from esrepro.essa.data import essa_sample_budget
from esrepro.models.memory import entry_facts
from esrepro.pipeline import BASE, ESSA_GRPO, Pipeline
from esrepro.planning.cluster import layout
from esrepro.rl.budget import es_sample_budget, samples_per_step
from esrepro.settings.methods import ES_ALGORITHMS
from esrepro.tasks import split_sizes

PEAK_FLOPS = 989e12  # H100 SXM, bf16 dense
GPU_MEMORY_GB = 80.0  # an H100
TRAIN_EFFICIENCY = 0.35  # share of the peak a training forward + backward reaches (assumed)
GENERATION_EFFICIENCY = {"vllm": 0.25, "hf": 0.05}  # decoding at large batch: vLLM; transformers generate
#: Decoded tokens per second per GPU at most, whatever the model's size: a small model's decoding is bound by
#: scheduling and sampling, not by its FLOPs (assumed; benchmarks/gpu_check.py measures transformers' figure).
DECODE_CAP = {"vllm": 20_000, "hf": 4_000}
PROMPT_TOKENS = 128  # a Countdown / GSM8K prompt with its chat template, about
#: FLOPs per trained token, in units of the parameter count P: forward 2P, backward 4P, and the forward again
#: under gradient checkpointing (2P); a frozen model's forward is 2P.
TRAIN_FLOPS = 8
FORWARD_FLOPS = 2
HBM_BYTES_PER_S = 3.35e12 * 0.5  # H100 SXM memory bandwidth, at an assumed half in a decode step
NOISE_SECONDS_PER_PARAM = 2 * 6e-3 / 0.5e9  # draw and apply one member's noise (benchmarks/gpu_check.py [1])
STARTUP_SECONDS = 600  # loading the model, starting engines and processes (assumed)
#: A training job asks for this multiple of its estimated time (rounded up: :func:`schedule`).
MARGIN = 1.25


def model_parameters(p: Pipeline, model: str) -> float:
    """``model``'s parameter count: a pinned build's own (the count its ``build.json`` records: the model as built,
    its tokenizer's vocabulary included, read without loading torch), else its registry entry's config counted on
    the meta device (:func:`esrepro.models.memory.entry_facts`; a built model's config is its build block). The entry's
    ``size`` is display text only."""
    entry = p.model(model)
    if entry.pinned is not None:
        record = Path(entry.pinned.path) / "build.json"  # relative to the repository, where every step runs
        if record.is_file():
            return float(json.loads(record.read_text(encoding="utf-8"))["summary"]["parameters"])
    return float(entry_facts(entry, model).params)


@dataclass(frozen=True)
class JobCost:
    """One training run's work, memory per GPU and estimated hours on the GPUs its job asks for."""

    model: str
    method: str
    algorithm: str
    gpus: int
    completions: int
    generated_tokens: int  # upper bound: completions x max_new_tokens
    trained_tokens: int  # tokens through a training pass (RL: prompt + completion of every completion)
    memory_gb: dict[str, float]
    hours: float
    runtime_hours: float  # what the job asks for one attempt (:func:`schedule`)
    attempts: int  # attempts at that runtime, each continuing from the previous one's resume state

    @property
    def memory_total_gb(self) -> float:
        return sum(self.memory_gb.values())

    def as_dict(self) -> dict:
        return {**asdict(self), "memory_total_gb": self.memory_total_gb}


def _generation_seconds(tokens: float, params: float, gpus: int, backend: str) -> float:
    per_gpu = min(DECODE_CAP[backend], PEAK_FLOPS * GENERATION_EFFICIENCY[backend] / (FORWARD_FLOPS * params))
    return tokens / (gpus * per_gpu)


def _latency_seconds(rounds: float, tokens: int, params: float) -> float:
    """``rounds`` of decoding ``tokens`` one after another, each step reading the bf16 weights once."""
    return rounds * tokens * 2 * params / HBM_BYTES_PER_S


def _training_seconds(tokens: float, params: float, gpus: int, flops_per_param: float) -> float:
    return tokens * flops_per_param * params / (gpus * PEAK_FLOPS * TRAIN_EFFICIENCY)


def schedule(hours: float, ceiling: int) -> tuple[int, int]:
    """(minutes per attempt, attempts) of a job estimated at ``hours``: MARGIN x the estimate, split evenly over
    the fewest attempts of at most ``ceiling`` minutes, each rounded up to the hour (to 15 or 5 minutes when
    shorter than 4 hours or 1 hour); in all between 1x and 2x the estimate for any job of 20 minutes or more."""
    need = MARGIN * hours * 60
    n = max(1, math.ceil(need / ceiling))
    per = need / n
    step = 60 if per >= 240 else 15 if per >= 60 else 5
    return min(ceiling, max(step, math.ceil(per / step) * step)), n


def job_cost(p: Pipeline, task: str, model: str, method: str, cell: str | None = None) -> JobCost:
    """The arithmetic of one ``task`` x ``model`` x ``method`` training run of the pipeline's config (one grid
    ``cell`` of an RL method with ``cell``)."""
    params = model_parameters(p, model)
    s = p.method_settings(model, task, method, cell).as_dict()
    algo = p.algorithm_of(task, method).name
    res = layout(p, task, model, method, cell)
    gpus = max(1, res.nodes * (res.gpu or 0))
    bf16 = 2 * params / 1e9
    if algo in ES_ALGORITHMS:  # eggroll priced as ES (its members batched in one call on vLLM: an upper bound)
        completions = es_sample_budget(s)
        gen, trained = completions * s["max_new_tokens"], 0
        memory = {"weights (bf16)": bf16}
        engines = s.get("engines") or max(1, gpus // (s.get("tensor_parallel_size") or 1))
        members = math.ceil(s["population"] / engines)  # scored one after another on an engine
        noise = s["iterations"] * (2 * members + s["population"]) * params * NOISE_SECONDS_PER_PARAM
        seconds = max(_generation_seconds(gen, params, gpus, s["backend"]),
                      _latency_seconds(s["iterations"] * members, s["max_new_tokens"], params)) + noise
    elif algo == "essa":
        completions = essa_sample_budget(s)
        gen, trained = completions * s["max_new_tokens"], 0
        memory = {"weights (bf16)": bf16, "LoRA candidates": 0.0}
        seconds = _generation_seconds(gen, params, gpus, s["backend"])
    else:
        completions = int(s["sample_budget"])
        gen = completions * s["max_new_tokens"]
        trained = completions * (PROMPT_TOKENS + s["max_new_tokens"])
        share = gpus if s.get("sharding") == "fsdp" else 1
        trained_models = 2 if algo == "ppo" else 1
        study = p.essa_study()
        if study is not None and method == ESSA_GRPO and study.grpo_trains == "adapter":  # LoRA on a frozen base
            memory = {"frozen base (bf16)": bf16}
        else:
            memory = {"float32 master, gradients, AdamW": 16 * params * trained_models / share / 1e9}
        if s.get("beta", 0) > 0:  # TRL builds GRPO's reference as it builds the policy: float32
            memory["reference (bf16)" if algo == "ppo" else "reference (float32)"] = bf16 * (1 if algo == "ppo"
                                                                                              else 2) / share
        if algo == "ppo":
            if share > 1:
                memory["policy gathered for rollouts (bf16)"] = bf16
            # forward passes for old log-probs, values and the reference, training passes of actor and critic
            flops = 3 * FORWARD_FLOPS + 2 * TRAIN_FLOPS
            backend = "hf"
        else:
            if s.get("use_vllm"):  # the colocated engine's share of an 80 GB GPU: weights and KV cache
                memory["colocated vLLM"] = GPU_MEMORY_GB * (s.get("vllm_gpu_memory_utilization") or 0.3)
            flops = TRAIN_FLOPS + (FORWARD_FLOPS if s.get("beta", 0) > 0 else 0)
            backend = "vllm" if s.get("use_vllm") else "hf"
        steps = max(1, completions // samples_per_step(s))
        rollouts = math.ceil(steps / int(s.get("updates_per_generation") or 1))  # GRPO-v: 4 steps per rollout
        seconds = max(_generation_seconds(gen, params, gpus, backend),
                      _latency_seconds(rollouts, s["max_new_tokens"], params)) + \
            _training_seconds(trained, params, gpus, flops)
    seconds += STARTUP_SECONDS
    minutes, n = schedule(seconds / 3600, res.runtime)
    return JobCost(model=model, method=method, algorithm=algo, gpus=gpus, completions=completions,
                   generated_tokens=gen, trained_tokens=trained,
                   memory_gb={k: round(v, 1) for k, v in memory.items()}, hours=seconds / 3600,
                   runtime_hours=minutes / 60, attempts=n)


def attempts(cost: JobCost) -> int:
    """SLURM attempts a run takes at its runtime (each continues from the previous one's resume state)."""
    return cost.attempts


def markdown_table(costs: list[JobCost]) -> str:
    """docs/scaling.md's table: one row per run."""
    head = ("| model | method | GPUs | completions | generated tokens (max) | trained tokens | memory per GPU, GB "
            "(before activations) | estimated hours | runtime asked, h | attempts |\n"
            "|---|---|---:|---:|---:|---:|---|---:|---:|---:|\n")
    rows = []
    for c in costs:
        mem = "; ".join(f"{k} {v:g}" for k, v in c.memory_gb.items())
        rows.append(f"| {c.model} | {c.method} | {c.gpus} | {c.completions:,} | {c.generated_tokens:.2e} | "
                    f"{c.trained_tokens:.2e} | {c.memory_total_gb:.1f} ({mem}) | {c.hours:.1f} | "
                    f"{c.runtime_hours:g} | {c.attempts} |")
    return head + "\n".join(rows) + "\n"


def table1_costs(p: Pipeline, task: str = "countdown") -> list[JobCost]:
    """The costs of one seed of every ``task`` run of the config (Table 1's models and methods)."""
    return [job_cost(p, task, model, method) for model in p.train_models(task) for method in p.train_methods(task)]


# --- the steps around training: evaluation, KL, downloads, selection, parameter shifts ---------------------------
#: Test-split sizes of the sets prepared from the hub, a URL or a local copy, whose rows only the data can tell
#: (esrepro.tasks.split_sizes gives None): the published counts.
PUBLISHED_SPLITS = {("gsm8k", "test"): 1319, ("gsm8k", "train"): 7473, ("math500", "test"): 500,
                    ("minerva", "test"): 272, ("olympiad_bench", "test"): 675, ("aime24", "test"): 30,
                    ("amc23", "test"): 83, ("prm800k", "test"): 500, ("prm800k", "train"): 12000,
                    ("math_train", "train"): 8523}
DOWNLOAD_BYTES_PER_S = 100e6  # fetching a model from the hub (assumed)
READ_BYTES_PER_S = 1e9  # reading, copying or loading a checkpoint on the cluster's storage (assumed)
STEP_FLOOR_MINUTES = 15  # the least runtime a step asks for
#: The Snakemake rules of the steps with an estimate, and their registry resources entry.
STEP_RULES = {"evaluate": "evaluate", "kl": "kl", "fetch_model": "fetch", "select_rl": "select",
              "param_shift_histogram": "param_shift"}


@dataclass(frozen=True)
class StepCost:
    """One evaluation, KL, download, selection or parameter-shift job: its GPUs, estimated hours and what it asks
    for (one attempt: a step does not resume)."""

    rule: str
    gpus: int
    generated_tokens: int
    hours: float
    runtime_hours: float


def split_rows(p: Pipeline, task: str, split: str, limit: int | None = None) -> int:
    """Rows of ``task``'s prepared ``split`` (at most ``limit``): from its source, else the published count."""
    n = split_sizes(task, p.cfg.data[task].source.model_dump(exclude_none=True)).get(split)
    if n is None:
        if (task, split) not in PUBLISHED_SPLITS:
            raise ValueError(f"{task}: the size of its {split} split is known only once prepared")
        n = PUBLISHED_SPLITS[task, split]
        n_test = p.cfg.data[task].source.n_test if split == "test" else None
        n = min(n, n_test) if n_test else n
    return min(n, limit) if limit else n


def step_minutes(hours: float, ceiling: int) -> int:
    """A step's runtime: MARGIN x its estimate, rounded up as :func:`schedule` does, at least
    STEP_FLOOR_MINUTES, at most the registry's ``ceiling`` (one attempt: a step starts over when retried)."""
    minutes, n = schedule(hours, 10**9)
    return min(ceiling, max(STEP_FLOOR_MINUTES, minutes * n))


def _decoding_seconds(completions: int, max_new_tokens: int, batch_size: int, params: float) -> float:
    """``completions`` generated through transformers' generate, ``batch_size`` at a time, each to ``max_new_tokens``:
    the larger of the throughput bound and the latency of the batches' decode steps."""
    batches = math.ceil(completions / batch_size)
    return max(_generation_seconds(completions * max_new_tokens, params, 1, "hf"),
               _latency_seconds(batches, max_new_tokens, params))


def _load_seconds(p: Pipeline, model: str, copies: int = 1) -> float:
    """Reading ``copies`` checkpoints of ``model`` in its registry dtype."""
    return copies * weight_bytes(p, model) / READ_BYTES_PER_S


def weight_bytes(p: Pipeline, model: str) -> float:
    """A checkpoint's bytes in the registry dtype."""
    return model_parameters(p, model) * (4 if p.model(model).dtype == "float32" else 2)


def run_steps(p: Pipeline, task: str, model: str, method: str, cell: str | None = None) -> int:
    """Iterations (ES, ESSA) or optimiser steps (RL: the sample budget over the completions per step) of a run."""
    s = p.method_settings(model, task, method, cell).as_dict()
    if p.algorithm_of(task, method).name in (*ES_ALGORITHMS, "essa"):
        return int(s["iterations"])
    return max(1, int(s["sample_budget"]) // samples_per_step(s))


def kept_snapshots(p: Pipeline, task: str, model: str, method: str, cell: str | None = None) -> int:
    """Weights a run keeps before its final checkpoint (every ``keep_every`` iterations or steps); an ESSA study's
    GRPO baseline on an adapter keeps adapters only (counted as none)."""
    s = p.method_settings(model, task, method, cell).as_dict()
    study = p.essa_study()
    if method == ESSA_GRPO and study is not None and study.grpo_trains == "adapter":
        return 0
    every = s.get("keep_every")
    return (run_steps(p, task, model, method, cell) - 1) // every if every else 0


def _selected(p: Pipeline, task: str, method: str) -> bool:
    """Whether a run is the best cell of an RL grid that ``select_rl`` keeps (it keeps no snapshots)."""
    return task in p.cfg.train and method in p.train_methods(task) and p.is_rl(task, method)


def evaluate_seconds(p: Pipeline, task: str, model: str) -> tuple[float, int]:
    """(seconds, generated tokens) of a greedy evaluation: the split's prompts x ``max_new_tokens``."""
    s = p.eval_settings(task)
    prompts = split_rows(p, task, s.split, s.limit)
    params = model_parameters(p, model)
    return _decoding_seconds(prompts, s.max_new_tokens, s.batch_size, params), prompts * s.max_new_tokens


def kl_seconds(p: Pipeline, task: str, model: str, method: str) -> tuple[float, int]:
    """(seconds, generated tokens) of a KL job: for the final weights and every kept snapshot, loading them, the
    greedy reward's generation, ``n_samples`` sampled responses a prompt, and both models' forward passes over
    every sampled response (prompt and response tokens)."""
    s = p.kl_settings(task)
    prompts = split_rows(p, task, s.split, s.limit)
    params = model_parameters(p, model)
    checkpoints = 1 if method == BASE or _selected(p, task, method) else 1 + kept_snapshots(p, task, model, method)
    greedy = s.eval_max_new_tokens or s.max_new_tokens
    sampled = prompts * s.n_samples
    one = (_decoding_seconds(prompts, greedy, s.batch_size, params)
           + _decoding_seconds(sampled, s.max_new_tokens, s.batch_size, params)
           + _training_seconds(sampled * (PROMPT_TOKENS + s.max_new_tokens), params, 1, 2 * FORWARD_FLOPS)
           + _load_seconds(p, model))
    return checkpoints * one + _load_seconds(p, model), checkpoints * (prompts * greedy + sampled * s.max_new_tokens)


def _cpu_seconds(p: Pipeline, rule: str, model: str) -> float:
    """A CPU step's time: a download at DOWNLOAD_BYTES_PER_S (``fetch_model``), a checkpoint copied (``select_rl``:
    hard-linked where it can be) or two read (``param_shift_histogram``) at READ_BYTES_PER_S."""
    if rule == "fetch_model":
        return weight_bytes(p, model) / DOWNLOAD_BYTES_PER_S
    return _load_seconds(p, model, 2)  # select: read and write one copy; param_shift: the base and the final weights


def step_cost(p: Pipeline, rule: str, wildcards: dict) -> StepCost:
    """The estimate of one step job (``rule``: a key of :data:`STEP_RULES`; ``wildcards``: its job's) and the
    runtime it asks for (:func:`step_minutes`). GPU steps add STARTUP; CPU steps none."""
    w = wildcards
    res = p.resources(w["model"], STEP_RULES[rule])
    gpus = (res.gpu or 0) * res.nodes
    tokens = 0
    if rule == "evaluate":
        seconds, tokens = evaluate_seconds(p, w["task"], w["model"])
    elif rule == "kl":
        seconds, tokens = kl_seconds(p, w["task"], w["model"], w["method"])
    else:
        seconds = _cpu_seconds(p, rule, w["model"])
    seconds += STARTUP_SECONDS if gpus else 0
    return StepCost(rule=rule, gpus=gpus, generated_tokens=tokens, hours=seconds / 3600,
                    runtime_hours=step_minutes(seconds / 3600, res.runtime) / 60)
