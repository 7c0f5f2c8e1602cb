"""The plan check: every GPU job of a config built with its real arguments at its real world size, and its memory per
GPU counted (:mod:`esrepro.models.memory`), on a CPU, before anything is submitted (``esrepro plan-check CONFIG``; the
pre-flight of a real run; ``make dry-run-paper``).

A job's arguments come from the functions the job itself calls: the process count from :func:`esrepro.planning.cluster.layout`,
RL shares from :func:`esrepro.rl.shares.per_process` (GRPO: :func:`esrepro.rl.grpo_parallel.process_batch` through
:func:`esrepro.rl.grpo.grpo_config_kwargs`, whose keys are checked against TRL's ``GRPOConfig``; the FSDP plugin's
from :func:`esrepro.rl.grpo_parallel.fsdp_kwargs` with the decoder class read by
:func:`~esrepro.rl.grpo_parallel.decoder_layer_classes` from the model's config), the policy's and reference's load
arguments from :func:`esrepro.rl.grpo._policy`, PPO's loading from :func:`esrepro.rl.ppo.sharded_load`, vLLM's
engine arguments as :mod:`esrepro.es.train`, :mod:`esrepro.essa.train` and TRL's colocated engine set them, and the
``generate`` batches of ESSA's transformers engines, evaluation and KL. Models are configs written to a scratch
folder (no weights) and counted on the meta device.

A job that cannot be built, or whose peak does not fit an H100 with the margin, is a :class:`Failure` naming the job
(rule and wildcards), the field and the numbers.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esrepro.models import memory as M
from esrepro.models.architecture import cached_meta_model, entry_config, entry_config_facts, facts_key
from esrepro.models.memory import GiB, Phase
from esrepro.pipeline import ESSA_GRPO, Pipeline
from esrepro.planning.resume_cost import job_settings
from esrepro.planning.rl_memory import Evaluation, grpo_phases, ppo_phases
from esrepro.rl import phases as PH
from esrepro.settings.methods import ES_ALGORITHMS, EggrollSettings, lora_rank_slot
from esrepro.train.periodic import RL_EVAL_BATCH, generation_length

#: The rules whose jobs hold GPUs and are checked.
RULES = ("train", "train_cell", "essa_grpo", "evaluate", "kl")


@dataclass
class JobCheck:
    """One job: its label, GPUs and processes, the phases of one process's memory, and what is wrong."""

    rule: str
    wildcards: dict
    kind: str  # the job class: algorithm, backend, precision
    gpus: int
    processes: int
    phases: list[Phase] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    host_bytes: int = 0  # the node's host memory the job asks for (mem_mb)
    engine: M.VLLMFit | None = None  # its vLLM engine's budget per GPU, where it runs one

    @property
    def label(self) -> str:
        w = self.wildcards
        parts = [w.get(k) for k in ("task", "model", "method", "cell") if w.get(k)]
        return f"{self.rule} {'/'.join(parts)}"

    @property
    def peak(self) -> Phase | None:
        return M.peak(self.phases) if self.phases else None

    def message(self) -> str:
        return f"{self.label} ({self.gpus} GPUs, {self.processes} processes): " + "; ".join(self.problems)


class Failure(ValueError):
    """The plan check failed: every failing job's message."""


# --- models without weights ----------------------------------------------------------------------------------------
_DIRS: dict[str, Path] = {}
_TMP: tempfile.TemporaryDirectory | None = None


def config_dir(entry) -> Path:
    """A folder holding the model's ``config.json`` (no weights; :func:`esrepro.models.architecture.entry_config`),
    for the functions that read a model folder."""
    import hashlib

    global _TMP
    key = hashlib.sha256(facts_key(entry_config_facts(entry)).encode()).hexdigest()[:16]
    if key not in _DIRS:
        if _TMP is None:
            _TMP = tempfile.TemporaryDirectory(prefix="esrepro-plan-")
        folder = Path(_TMP.name) / key
        entry_config(entry).save_pretrained(folder)
        _DIRS[key] = folder
    return _DIRS[key]


def _gib(parts: dict[str, float]) -> dict[str, int]:
    return {k: int(v) for k, v in parts.items() if v}


# --- RL ------------------------------------------------------------------------------------------------------------


def fsdp_plugin(kw: dict, decoder_layer: str) -> str | None:
    """accelerate's FSDP plugin as transformers builds it from the ``fsdp_config`` of ``kw`` (its own
    ``TrainingArguments._process_fsdp_args``, then ``FullyShardedDataParallelPlugin``): None when it builds and wraps
    the model's decoder layer class, else what is wrong."""
    import os
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    saved = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING")
    try:
        args = TrainingArguments._process_fsdp_args(SimpleNamespace(
            fsdp=kw["fsdp"], fsdp_config=dict(kw["fsdp_config"]), gradient_checkpointing=kw["gradient_checkpointing"]))
        plugin = FullyShardedDataParallelPlugin(**args)
    except (ValueError, TypeError, KeyError) as exc:
        return f"accelerate's FSDP plugin from fsdp_config {kw.get('fsdp_config')}: {exc}"
    finally:
        if saved is None:
            os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
        else:
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = saved
    if plugin.fsdp_version != 2 or decoder_layer not in (plugin.transformer_cls_names_to_wrap or []):
        return (f"accelerate's FSDP plugin (fsdp_version {plugin.fsdp_version}, transformer_layer_cls_to_wrap "
                f"{plugin.transformer_cls_names_to_wrap}) does not wrap the model's decoder layer {decoder_layer}")
    return None


def rl_evaluation(settings: dict, task: str) -> Evaluation | None:
    """An RL job's periodic evaluation as its trainer runs it (esrepro.train.periodic: ``eval_batch_size`` prompts
    per call, the task's prompts, ``generation_length`` new tokens); None without ``eval_every``."""
    from types import SimpleNamespace


    if settings.get("eval_every") is None:
        return None
    return Evaluation(int(settings.get("eval_batch_size") or RL_EVAL_BATCH), M.prompt_tokens(task),
                      generation_length(SimpleNamespace(eval_max_new_tokens=settings.get("eval_max_new_tokens"),
                                                        max_new_tokens=settings["max_new_tokens"])))


def check_grpo(job: JobCheck, p: Pipeline, settings: dict, *, world: int | None = None,
               init_kwargs: dict | None = None, vllm_max_model_length: Any = "built",
               fsdp_layers: list[str] | None = None, sharded_reference: bool | None = None) -> None:
    """GRPO through TRL: GRPOConfig's arguments at the job's world size, accelerate's FSDP plugin, the models' load
    arguments, the colocated vLLM engine, and one process's memory. ``world``, ``init_kwargs``,
    ``vllm_max_model_length``, ``fsdp_layers``, ``sharded_reference``: replace what the job builds (to put an old
    behaviour back; ``sharded_reference`` False: TRL's own order, the reference loaded whole and sharded after the
    colocated engine started)."""
    from trl import GRPOConfig

    from esrepro.rl import grpo
    from esrepro.rl.budget import samples_per_step
    from esrepro.rl.grpo_parallel import decoder_layer_classes

    w = job.wildcards
    entry = p.model(w["model"])
    m = M.entry_facts(entry)
    world = world or job.processes
    job.processes = world
    folder = config_dir(entry)
    fsdp = settings.get("sharding", "ddp") == "fsdp"
    study = p.essa_study()
    adapter = w["method"] == ESSA_GRPO and study is not None and study.grpo_trains == "adapter"
    try:
        layers = (fsdp_layers or decoder_layer_classes(folder)) if fsdp else None
        kw = grpo.grpo_config_kwargs(settings, steps=max(1, int(settings["sample_budget"]) // samples_per_step(settings)),
                                     seed=0, output_dir=str(folder), on_cpu=False, world_size=world,
                                     fsdp_layers=layers, resume=True, prompt_tokens=M.prompt_tokens(w["task"]))
    except ValueError as exc:
        job.problems.append(f"cannot be built: {exc}")
        return
    known = set(GRPOConfig.__dataclass_fields__)
    unknown = sorted(k for k in kw if k not in known)
    if unknown:
        job.problems.append(f"GRPOConfig has no field(s) {', '.join(unknown)} (TRL 1.16)")
    if "fsdp_config" in kw:
        problem = fsdp_plugin(kw, m.decoder_layer)
        if problem:
            job.problems.append(problem)
    if vllm_max_model_length != "built":
        kw["vllm_max_model_length"] = vllm_max_model_length
    reference = grpo.reference_state(settings, fsdp, adapter)
    if sharded_reference is not None and reference != "none":
        reference = "sharded" if sharded_reference else "whole"
    if init_kwargs is None and not adapter:
        init_kwargs = grpo.policy_init_kwargs(grpo.process_device(False, 0))
    beta = float(settings.get("beta", 0))
    if init_kwargs is not None and fsdp:
        where = init_kwargs.get("device_map")
        whole = where is None or (isinstance(where, dict) and set(where) == {""} and str(where[""]).startswith("cuda:"))
        if not whole:
            job.problems.append(
                f"model_init_kwargs.device_map {where!r} under sharding: fsdp: TRL 1.16 clears device_map only for DDP "
                f"and DeepSpeed, so the policy{' and the beta ' + format(beta, 'g') + ' reference' if beta else ''} "
                f"would spread over the node's {job.gpus} GPUs with accelerate's hooks, which FSDP's move breaks; "
                "place the model on the process's own GPU ({'': 'cuda:LOCAL_RANK'})")
    phases, vllm = grpo_phases(m, kw, settings, world, adapter, M.prompt_tokens(w["task"]), reference,
                               rl_evaluation(settings, w["task"]), resume=True)
    if vllm is not None:
        problem = vllm.problem()
        if problem:
            job.problems.append(f"colocated vLLM (vllm_gpu_memory_utilization {kw['vllm_gpu_memory_utilization']:g}, "
                                f"vllm_max_model_length {kw.get('vllm_max_model_length')}): {problem}")
        job.notes.append(f"vLLM KV cache {M.gib(vllm.kv)} GiB: {vllm.sequences} sequences of {vllm.max_model_len:,}")
        job.engine = vllm
    job.phases = phases
    _check_fit(job)


def check_ppo(job: JobCheck, p: Pipeline, settings: dict, *, world: int | None = None,
              sharded_load: bool | None = None) -> None:
    """PPO: the process shares at the job's world size, how it loads and shards its models, and one process's memory.
    ``sharded_load``: replace the loading the job uses (False: every process loads the whole models first)."""
    from esrepro.rl import ppo
    from esrepro.rl.shares import per_process

    w = job.wildcards
    m = M.entry_facts(p.model(w["model"]))
    world = world or job.processes
    job.processes = world
    try:
        share = per_process(settings, world)
    except ValueError as exc:
        job.problems.append(f"cannot be built: {exc}")
        return
    cfg = ppo._settings(settings)
    if sharded_load is None:
        sharded_load = ppo.sharded_load(cfg.sharding)
    job.phases = ppo_phases(m, cfg, share, world, sharded_load, M.prompt_tokens(w["task"]),
                            rl_evaluation(settings, w["task"]), resume=True)
    P = m.params
    if not sharded_load:
        host = world * 8 * P
        job.notes.append(f"{world} float32 CPU copies of actor and critic at once ({M.gib(host)} GiB of host memory)")
        if job.host_bytes and host > job.host_bytes:
            job.problems.append(f"load: {world} processes each read float32 actor and critic on CPU at once, "
                                f"{M.gib(host)} GiB, over the job's mem_mb ({M.gib(job.host_bytes)} GiB)")
    _check_fit(job)


def predict_phases(model_dir: str | Path, settings: dict, world: int, prompt_tokens: int, *,
                   evaluation: Evaluation | None = None, resume: bool = False) -> list[Phase]:
    """The predicted phases of one GRPO or PPO process training the model in ``model_dir`` with ``settings`` (a
    method settings dict) under ``world`` processes on GPUs: what benchmarks/gpu_check.py measures against."""
    from transformers import AutoConfig

    from esrepro.rl import grpo, ppo
    from esrepro.rl.grpo_parallel import decoder_layer_classes
    from esrepro.rl.shares import per_process

    m = M.facts_from_config(AutoConfig.from_pretrained(str(model_dir)))
    if settings["algorithm"] == "ppo":
        cfg = ppo._settings(settings)
        return ppo_phases(m, cfg, per_process(settings, world), world, ppo.sharded_load(cfg.sharding),
                          prompt_tokens, evaluation, resume)
    fsdp = settings.get("sharding", "ddp") == "fsdp"
    kw = grpo.grpo_config_kwargs(settings, steps=1, seed=0, output_dir=str(model_dir), on_cpu=False,
                                 world_size=world, fsdp_layers=decoder_layer_classes(model_dir) if fsdp else None,
                                 resume=False, prompt_tokens=prompt_tokens)
    return grpo_phases(m, kw, settings, world, False, prompt_tokens, grpo.reference_state(settings, fsdp, False),
                       evaluation, resume)[0]


def predict(model_dir: str | Path, settings: dict, world: int, prompt_tokens: int) -> Phase:
    """The peak of :func:`predict_phases`."""
    return M.peak(predict_phases(model_dir, settings, world, prompt_tokens))


# --- population engines ---------------------------------------------------------------------------------------------


def check_es(job: JobCheck, p: Pipeline, cfg) -> None:
    """ES (and eggroll, whose vLLM engines hold a LoRA slot per member of a batch): its engines' layout and vLLM
    arguments as :func:`esrepro.es.train.make_evaluator` builds them, and what ES keeps beside vLLM (the workers' own
    check at start, :meth:`ShardedWeights.transient_bytes`)."""
    from esrepro.population.placement import GPU_MEMORY_UTILIZATION, engines_per_gpu

    m = M.entry_facts(p.model(job.wildcards["model"]))
    tp = cfg.tensor_parallel_size
    engines = cfg.engines or max(1, job.gpus // tp)
    try:
        sharing = engines_per_gpu(engines, job.gpus, tp)
    except ValueError as exc:
        job.problems.append(f"engines: {exc}")
        return
    adapters = isinstance(cfg, EggrollSettings) and cfg.backend == "vllm"  # members never written: no restore copy
    copy = (4 if cfg.master_weights else 2 if cfg.restore == "exact" and not adapters else 0) * m.params // tp
    transient = 4 * m.largest_tensor + 12 * m.largest_tensor // tp
    outside = {"ES weight copy": copy, "ES noise buffers (largest tensor)": transient}
    if cfg.backend == "vllm":
        util = cfg.gpu_memory_utilization or GPU_MEMORY_UTILIZATION / sharing
        # eggroll: every member a LoRA adapter, as many slots as members per batch (esrepro.es.train.lowrank_options)
        slots = (cfg.max_loras or cfg.population) if isinstance(cfg, EggrollSettings) else 0
        fit = M.vllm_fit(m, utilization=util, tp=tp, max_loras=slots,
                         lora_rank_slot=lora_rank_slot(cfg.rank) if slots else 0)
        problem = fit.problem()
        if problem:
            job.problems.append(f"gpu_memory_utilization {util:g}: {problem}")
        job.phases = [Phase("iteration", _gib({"vLLM engine(s)": sharing * fit.budget,
                                               **{k: sharing * v for k, v in outside.items()}}),
                            reserved=sharing * fit.budget)]
        job.notes.append(f"vLLM KV cache {M.gib(fit.kv)} GiB: {fit.sequences} sequences of {fit.max_model_len:,}")
        job.engine = fit
        if not M.fits(job.peak):
            job.problems.append(f"gpu_memory_utilization {util:g} leaves {M.gib(M.GPU_BYTES - sharing * fit.budget)} "
                                f"GiB beside vLLM for {M.gib(sharing * (copy + transient))} GiB of ES weight copies and "
                                f"noise buffers (+{M.MARGIN:.0%})")
    else:
        prompt = M.prompt_tokens(job.wildcards["task"])
        job.phases = [Phase(ph.name, _gib({**ph.parts, **outside}))
                      for ph in M.generate_peak(m, 2 * m.params, cfg.batch_size, prompt, cfg.max_new_tokens)]


def check_essa(job: JobCheck, p: Pipeline, cfg, *, fitted: bool = True) -> None:
    """ESSA: its engines' arguments as :func:`esrepro.essa.train.make_essa_evaluator` builds them (vLLM with LoRA
    slots, on the base in its precision: bf16, or INT4 through vLLM's bitsandbytes plugin; transformers ``generate``
    on a quantised base at the batch :func:`esrepro.models.memory.generate_batch` fits, at most ``batch_size``; ``fitted``
    False: at ``batch_size`` itself)."""
    from esrepro.essa.lora import lora_target_modules  # loads torch
    from esrepro.essa.vllm_engine import quantization_llm_kwargs  # loads torch (through esrepro.backends)
    from esrepro.population.placement import GPU_MEMORY_UTILIZATION, engines_per_gpu

    w = job.wildcards
    m = M.entry_facts(p.model(w["model"]))
    try:  # the LoRA's targets, as the SFT reads them off the model (here its meta build)
        lora_target_modules(cached_meta_model(entry_config_facts(p.model(w["model"]))), cfg.lora_targets)
    except ValueError as exc:
        job.problems.append(str(exc))
        return
    engines = cfg.engines or max(1, job.gpus)
    try:
        sharing = engines_per_gpu(engines, job.gpus)
    except ValueError as exc:
        job.problems.append(f"engines: {exc}")
        return
    prompt = M.prompt_tokens(w["task"])
    context = prompt + cfg.max_new_tokens
    if cfg.backend == "vllm":
        try:
            quantization_llm_kwargs(cfg.precision)
        except ValueError as exc:
            job.problems.append(str(exc))
            return
        util = cfg.gpu_memory_utilization or GPU_MEMORY_UTILIZATION / sharing
        fit = M.vllm_fit(m, utilization=util, max_model_len=context, max_loras=cfg.max_loras,
                         lora_rank_slot=lora_rank_slot(cfg.rank), min_sequences=cfg.max_loras,
                         weight_bytes=M.quantised_weights(m, cfg.precision) / m.params)
        problem = fit.problem()
        if problem:
            job.problems.append(f"gpu_memory_utilization {util:g}, max_loras {cfg.max_loras}: {problem}")
        job.notes.append(f"vLLM KV cache {M.gib(fit.kv)} GiB: {fit.sequences} sequences of {context:,}")
        job.engine = fit
        job.phases = [Phase("generation", _gib({"vLLM engine(s)": sharing * fit.budget}), reserved=sharing * fit.budget)]
        return
    weights = M.quantised_weights(m, cfg.precision)
    batch = M.generate_batch(m, weights, cfg.batch_size, prompt, cfg.max_new_tokens) if fitted else cfg.batch_size
    if sharing > 1:
        job.problems.append(f"engines: {sharing} transformers engines would share a GPU")
    job.phases = M.generate_peak(m, weights, max(batch, 1), prompt, cfg.max_new_tokens)
    if batch < 1:
        job.problems.append(f"precision {cfg.precision}: not one sequence of {context:,} tokens fits beside the "
                            f"{M.gib(weights)} GiB base")
    elif batch < cfg.batch_size:
        job.notes.append(f"generate batch {batch} of batch_size {cfg.batch_size}")
    elif not M.fits(job.peak):
        job.problems.append(f"batch_size {cfg.batch_size} (transformers generate, precision {cfg.precision}): "
                            f"{_over(job.peak)}; the largest batch that fits is "
                            f"{M.generate_batch(m, weights, cfg.batch_size, prompt, cfg.max_new_tokens)}")


# --- evaluation and KL ---------------------------------------------------------------------------------------------


def check_evaluate(job: JobCheck, p: Pipeline, *, fitted: bool = True) -> None:
    """A greedy evaluation: transformers ``generate`` in the registry dtype at the batch
    :func:`esrepro.models.memory.generate_batch` fits, at most the task's ``batch_size`` (``fitted`` False: that itself)."""
    w = job.wildcards
    s = p.eval_settings(w["task"])
    m = M.entry_facts(p.model(w["model"]))
    prompt = eval_prompt_tokens(p, w["task"])
    batch = M.generate_batch(m, 2 * m.params, s.batch_size, prompt, s.max_new_tokens) if fitted else s.batch_size
    job.phases = M.generate_peak(m, 2 * m.params, max(batch, 1), prompt, s.max_new_tokens)
    if batch < 1:
        job.problems.append(f"evaluate.{w['task']}: not one sequence of {prompt + s.max_new_tokens:,} tokens fits")
    elif batch < s.batch_size:
        job.notes.append(f"generate batch {batch} of batch_size {s.batch_size}")
    elif not M.fits(job.peak):
        job.problems.append(f"evaluate.{w['task']}.batch_size {s.batch_size}: {_over(job.peak)}; the largest batch "
                            f"that fits is {M.generate_batch(m, 2 * m.params, s.batch_size, prompt, s.max_new_tokens)}")


def eval_prompt_tokens(p: Pipeline, task: str) -> int:
    """The prompt allowance of an evaluation (its ``max_prompt_tokens`` when set)."""
    s = p.eval_settings(task)
    return min(M.prompt_tokens(task), s.max_prompt_tokens or 10**9)


def check_kl(job: JobCheck, p: Pipeline) -> None:
    """KL: both models in the registry dtype, ``n_samples`` sampled responses of a prompt at once, greedy generation
    at ``batch_size``, and both models' logits over a scoring batch."""
    w = job.wildcards
    s = p.kl_settings(w["task"])
    m = M.entry_facts(p.model(w["model"]))
    prompt = M.prompt_tokens(w["task"])
    seq = prompt + max(s.max_new_tokens, s.eval_max_new_tokens or 0)
    weights = {"fine-tuned and base weights (bf16)": 2 * 2 * m.params, "CUDA context": int(M.CUDA_CONTEXT)}
    job.phases = [Phase("greedy reward", _gib({**weights, "generate KV cache": M.generate_kv(m, s.batch_size, seq)})),
                  Phase("sampling", _gib({**weights, "KV cache": M.generate_kv(m, s.n_samples, seq)})),
                  Phase("scoring", _gib({**weights, "logits of both models (float32)":
                                         2 * s.batch_size * seq * m.vocab * 4,
                                         "forward activations": M.prefill(m, s.batch_size, seq)}))]
    if not M.fits(job.peak):
        job.problems.append(f"kl.{w['task']} (batch_size {s.batch_size}, n_samples {s.n_samples}): {_over(job.peak)}")


def _over(phase: Phase) -> str:
    return (f"predicted peak {M.gib(phase.total)} GiB, {M.gib(phase.with_margin)} GiB with a {M.MARGIN:.0%} margin "
            f"on what is estimated, over the H100's {M.gib(M.GPU_BYTES)} GiB")


# --- every job ------------------------------------------------------------------------------------------------------


def _resources(p: Pipeline, rule: str, w: dict):
    from esrepro.planning import cluster

    if rule in ("evaluate", "kl"):
        return p.resources(w["model"], rule)
    return cluster.layout(p, w["task"], w["model"], w["method"], w.get("cell"))


def _gpus(p: Pipeline, rule: str, w: dict) -> tuple[int, int]:
    """(GPUs, processes) of a job."""
    res = _resources(p, rule, w)
    procs = 1 if rule in ("evaluate", "kl") else res.training_processes() * res.nodes
    return (res.gpu or 0) * res.nodes, procs


def build(p: Pipeline, rule: str, wildcards: dict) -> JobCheck | None:
    """The check of one job (None for a job without GPUs)."""
    w = wildcards
    gpus, procs = _gpus(p, rule, w)
    if not gpus:
        return None
    host = (_resources(p, rule, w).mem_mb or 0) * 10**6
    if rule in ("evaluate", "kl"):
        job = JobCheck(rule, dict(w), rule, gpus, procs)
        (check_evaluate if rule == "evaluate" else check_kl)(job, p)
        return job
    s = job_settings(p, w["model"], w["task"], w["method"], w.get("cell"))
    algo = s.algorithm
    kind = algo + (f" {s.backend}" if algo in (*ES_ALGORITHMS, "essa") else "") + \
        (f" {s.precision}" if algo == "essa" and s.precision != "native" else "")
    job = JobCheck(rule, dict(w), kind, gpus, procs, host_bytes=host)
    if algo in ES_ALGORITHMS:
        check_es(job, p, s)
    elif algo == "essa":
        check_essa(job, p, s)
    elif algo == "ppo":
        check_ppo(job, p, s.as_dict())
    else:
        check_grpo(job, p, s.as_dict())
    _check_fit(job)
    return job


def _check_fit(job: JobCheck) -> None:
    """A problem for every phase of the job that does not fit an H100 with the margin, naming the phase (once)."""
    if any("predicted peak" in pr or "beside vLLM" in pr for pr in job.problems):
        return
    job.problems += [f"{ph.name}: {_over(ph)}" for ph in job.phases if not M.fits(ph)]


def jobs(p: Pipeline, only: set[tuple[str, str | None]] | None = None) -> list[JobCheck]:
    """Every GPU job of the config, checked (the same settings checked once); ``only``: (rule, model) pairs of the
    jobs a run is about to start."""
    from esrepro.planning.jobs import plan_jobs

    seen: dict[str, JobCheck | None] = {}
    out = []
    for j in plan_jobs(p):
        if j.rule not in RULES:
            continue
        w = {k: v for k, v in j.wildcards.items() if k in ("task", "model", "method", "cell")}
        if only is not None and not any(r == j.rule and (m is None or m == w.get("model")) for r, m in only):
            continue
        key = json.dumps([j.rule, w], sort_keys=True)
        if key in seen:
            continue
        try:
            seen[key] = build(p, j.rule, w)
        except (ValueError, KeyError) as exc:  # a model without a known shape, a setting the job would refuse
            gpus, procs = _gpus(p, j.rule, w)
            seen[key] = JobCheck(j.rule, w, "?", gpus, procs, problems=[f"cannot be checked: {exc}"]) if gpus else None
        if seen[key] is not None:
            out.append(seen[key])
    return out


def failures(checked: list[JobCheck]) -> list[JobCheck]:
    return [j for j in checked if j.problems]


def summary(checked: list[JobCheck]) -> list[tuple[str, str, str, int, int, str, float, float]]:
    """One row per job class (rule, model, kind): GPUs, processes, the peak's phase, GiB and GiB with the margin (the
    class's largest)."""
    rows: dict[tuple[str, str, str], tuple] = {}
    for j in checked:
        if j.peak is None:
            continue
        key = (j.rule if j.rule != "train_cell" else "train", j.wildcards["model"], j.kind)
        row = (*key, j.gpus, j.processes, j.peak.name, j.peak.total / GiB, j.peak.with_margin / GiB)
        if key not in rows or row[-1] > rows[key][-1]:
            rows[key] = row
    return sorted(rows.values(), key=lambda r: (r[0], r[1], r[2]))


def markdown(checked: list[JobCheck]) -> str:
    """docs/scaling.md's tables: the predicted peak per GPU of each job class, each RL job class's phases, then what
    each vLLM engine's share holds."""
    head = (f"| rule | model | job | GPUs | processes | peak phase | predicted peak per GPU, GiB | with the "
            f"{M.MARGIN:.0%} margin, GiB |\n|---|---|---|---:|---:|---|---:|---:|\n")
    return head + "".join(f"| {r} | {m} | {k} | {g} | {n} | {ph} | {gb:.1f} | {gm:.1f} |\n"
                          for r, m, k, g, n, ph, gb, gm in summary(checked)) + "\n" + phase_markdown(checked) + \
        "\n" + engine_markdown(checked)


def engine_markdown(checked: list[JobCheck]) -> str:
    """One row per job class with a vLLM engine (the class's engine with the least KV cache): its share of a GPU
    and what fills it, GiB, and the full-context sequences its KV cache holds."""
    rows: dict[tuple[str, str, str], M.VLLMFit] = {}
    for j in checked:
        if j.engine is None:
            continue
        key = (j.rule if j.rule != "train_cell" else "train", j.wildcards["model"], j.kind)
        if key not in rows or j.engine.kv < rows[key].kv:
            rows[key] = j.engine
    head = ("| rule | model | job | vLLM's share | weights | profiling run and sampler warm-up | CUDA graphs, LoRA "
            "slots, context | KV cache | sequences of max_model_len |\n|---|---|---|---:|---:|---:|---:|---:|---|\n")
    return head + "".join(
        f"| {r} | {m} | {k} | {M.gib(e.budget)} | {M.gib(e.weights)} | {M.gib(e.profile)} | "
        f"{M.gib(e.graphs + e.lora + e.context)} | {M.gib(e.kv)} | {e.sequences} of {e.max_model_len:,} |\n"
        for (r, m, k), e in sorted(rows.items()))


#: The job classes whose phases are printed: RL training, one process per GPU (esrepro.rl.phases).
RL_KINDS = ("ppo", "grpo", "dr_grpo", "grpo_zero", "verl_grpo", "verl_dr_grpo")


def rl_jobs(checked: list[JobCheck]) -> list[JobCheck]:
    return [j for j in checked if j.kind in RL_KINDS and j.phases]


def phase_markdown(checked: list[JobCheck]) -> str:
    """Each RL job class's phases in the code's order (esrepro.rl.phases), GiB per GPU with the margin (the class's
    largest job; a dash where the job has no such phase); the peak in bold."""

    names = [PH.LOAD, PH.SHARD_REFERENCE, PH.START_VLLM, PH.SHARD_POLICY, PH.EVALUATE, PH.ROLLOUT, PH.OLD_LOGPS,
             PH.REFERENCE_FORWARD, PH.POLICY_PASS, PH.SAVE]
    rows: dict[tuple[str, str, str], JobCheck] = {}
    for j in rl_jobs(checked):
        key = (j.rule if j.rule != "train_cell" else "train", j.wildcards["model"], j.kind)
        if key not in rows or j.peak.with_margin > rows[key].peak.with_margin:
            rows[key] = j
    out = ("| rule | model | job | " + " | ".join(names) + " |\n|---|---|---|" + "---:|" * len(names) + "\n")
    for key in sorted(rows):
        j = rows[key]
        have = {ph.name: ph for ph in j.phases}
        cells = [("**%.1f**" if have[n] is j.peak else "%.1f") % (have[n].with_margin / GiB) if n in have else "-"
                 for n in names]
        out += f"| {' | '.join(key)} | " + " | ".join(cells) + " |\n"
    return out


def phase_lines(checked: list[JobCheck]) -> list[str]:
    """One line per RL job: its phases in the code's order, predicted GiB per GPU (with the margin)."""
    return [f"{j.label} ({j.gpus} GPUs, {j.processes} processes): " +
            " | ".join(f"{ph.name} {ph.total / GiB:.1f} ({ph.with_margin / GiB:.1f})" for ph in j.phases)
            for j in rl_jobs(checked)]


def check_config(config: str) -> tuple[Pipeline, list[JobCheck]]:
    from esrepro.config import read_config
    from esrepro.planning.load import load_pipeline

    if not Path(config).is_file():
        raise FileNotFoundError(f"{config}: no such config file")
    p = load_pipeline(read_config(config), config)
    return p, jobs(p)


def plan_check(config: str, markdown_out: str | None = None) -> int:
    """The verb ``esrepro plan-check CONFIG``: check every GPU job, print each job class's predicted peak per GPU;
    exit 1 naming every job that cannot be built or does not fit."""
    from esrepro.io import write_text

    _, checked = check_config(config)
    text = markdown(checked)
    print(f"GPU jobs checked: {len(checked)} (an H100: {M.gib(M.GPU_BYTES)} GiB, margin {M.MARGIN:.0%})")
    print(text, end="")
    print(f"\nRL jobs, phase by phase in the code's order: GiB per GPU (with the {M.MARGIN:.0%} margin)")
    print("\n".join(phase_lines(checked)))
    if markdown_out:
        write_text(markdown_out, text)
    bad = failures(checked)
    if bad:
        raise Failure(f"{len(bad)} GPU job(s) cannot start or do not fit:\n" +
                      "\n".join(f"  {j.message()}" for j in bad))
    return 0
