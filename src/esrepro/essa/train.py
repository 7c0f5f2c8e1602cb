"""The ESSA trainer: LoRA SFT (kept in ``<run>/sft/`` so a resume does not redo it), the singular value
space saved once, CMA-ES over a population evaluator, and the run's checkpoint.

Run directory (besides ``checkpoint/``, ``log.jsonl`` and ``manifest.json``, which the
``train`` step writes):

- ``sft/adapter/``: the SFT LoRA adapter (peft), its TRL log and summary;
  ``sft/space.safetensors``: the factorisation every engine loads; ``sft/sft.json``;
- ``adapter/``: the final solution as a peft adapter (rank and alpha of the SFT adapter);
- ``cma_state.npz``: the final CMA-ES state (mean, step size, per-coordinate scales or the
  full covariance, RNG, best candidate), loadable with :meth:`esrepro.essa.strategy.CMAStrategy.from_state`;
- ``resume/`` while the run is under way.

The checkpoint is the CMA-ES *mean* after the last generation, merged into the weights,
not the best candidate seen: each candidate's reward comes from a finite set of problems
(the fixed fitness subset, or ``resample_per_step`` drawn from it), so the best of thousands
of candidates is biased upwards (a winner's curse), while the mean is the distribution's estimate of the optimum, the
solution CMA-ES reports; the best candidate stays in ``cma_state.npz`` (``best_x``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from esrepro import paths as P
from esrepro.io import atomic_path, read_json, sha256_file, write_json
from esrepro.settings.methods import without_default_lora_targets
from esrepro.train.context import TrainContext, TrainOutcome
from esrepro.train.resume import clear_state, has_state

SFT = "sft"  # the SFT cache inside the run directory
SFT_ADAPTER = "adapter"
SPACE = "space.safetensors"
SFT_RECORD = "sft.json"
ADAPTER = "adapter"  # the final solution as a peft adapter, beside checkpoint/
#: ESSASettings fields the SFT adapter and the space depend on.
SFT_FIELDS = ("sft_examples", "rank", "lora_alpha", "sft_epochs", "sft_learning_rate", "sft_prompts_per_step",
              "fraction", "selection")


def sft_key(ctx: TrainContext) -> dict:
    """What the SFT cache must have been made with (``lora_targets`` only when it is not the default
    ``attention``: the key a cache had before the setting)."""
    cfg = ctx.settings.as_dict()
    return without_default_lora_targets({**{k: cfg[k] for k in SFT_FIELDS}, "lora_targets": cfg["lora_targets"],
                                         "seed": ctx.seed, "base_model": str(ctx.model_dir), "task": ctx.task.name,
                                         "chat": ctx.chat})


def ensure_sft(ctx: TrainContext, pairs: list[tuple[str, str]], reuse: bool) -> dict:
    """LoRA-SFT the base on ``pairs`` into ``<run>/sft/`` and save the singular value space there.

    With ``reuse`` (a resume) a complete cache made with the same settings is kept as it is.
    Returns the cache's record (settings, SFT summary, space size, seconds). The SFT runs in
    ``$ESREPRO_TRAIN_PROCESSES`` processes (one per GPU; :mod:`esrepro.essa.sft_launch`).
    """
    from esrepro.essa.lora import load_lora
    from esrepro.essa.sft_launch import SFTJob, run_sft, sft_dtype, sft_processes
    from esrepro.essa.svd import SingularValueSpace

    cfg = ctx.settings
    root = ctx.run_dir / SFT
    record_file = root / SFT_RECORD
    if reuse and record_file.exists():
        record = read_json(record_file)
        if record["key"] == sft_key(ctx) and (root / SPACE).exists():
            verify_sft(root, record)  # the resume state was made from these bytes: refuse any others
            return record
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    job = SFTJob(model_dir=str(ctx.model_dir), pairs=list(pairs), rank=cfg.rank, alpha=cfg.lora_alpha,
                 epochs=cfg.sft_epochs, learning_rate=cfg.sft_learning_rate, batch_size=cfg.sft_prompts_per_step,
                 seed=ctx.seed, out_dir=str(root / SFT_ADAPTER), dtype=sft_dtype(ctx.dtype, ctx.device),
                 targets=cfg.lora_targets if isinstance(cfg.lora_targets, str) else list(cfg.lora_targets))
    summary = run_sft(job, sft_processes())
    t1 = time.perf_counter()
    space = SingularValueSpace.build(load_lora(ctx.model_dir, root / SFT_ADAPTER), cfg.fraction, cfg.selection)
    space.save(root / SPACE)
    record = {
        "key": sft_key(ctx),
        "summary": summary,
        "space": {"dim": space.dim, "modules": len(space.names), "fraction": space.fraction,
                  "selection": space.selection},
        "adapter_sha256": sha256_file(root / SFT_ADAPTER / "adapter_model.safetensors"),
        "space_sha256": sha256_file(root / SPACE),
        "seconds_sft": t1 - t0,
        "seconds_svd": time.perf_counter() - t1,
    }
    write_json(record_file, record)
    _free_accelerator()
    return record


def verify_sft(root: Path, record: dict | None = None) -> None:
    """Check the SFT cache in ``root`` against the hashes its ``sft.json`` recorded.

    Raises IntegrityError naming the file and both hashes, or FileNotFoundError naming
    a missing file.
    """
    from esrepro.provenance.manifest import IntegrityError

    record_file = root / SFT_RECORD
    record = read_json(record_file) if record is None else record
    for rel, key in ((f"{SFT_ADAPTER}/adapter_model.safetensors", "adapter_sha256"), (SPACE, "space_sha256")):
        path, want = root / rel, record.get(key)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (recorded in {record_file})")
        if want and (got := sha256_file(path)) != want:
            raise IntegrityError(f"{path}: sha256 {got} does not match {want} recorded in {record_file}")


def _free_accelerator() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_essa_evaluator(ctx: TrainContext, examples: list[dict]):
    """A serial evaluator for one engine, a Ray evaluator for several; every engine holds the SFT model."""
    import torch

    from esrepro.essa.spec import ESSAEngineSpec
    from esrepro.population.evaluators import RayEvaluator, SerialEvaluator
    from esrepro.population.placement import (
        GPU_MEMORY_UTILIZATION,
        engine_count,
        engines_per_gpu,
        ray_placement,
        visible_gpus,
    )
    from esrepro.population.spec import IndexedScoring

    cfg = ctx.settings
    root = ctx.run_dir / SFT
    threads = torch.get_num_threads()
    engines = engine_count(cfg.engines, ctx.device)
    on_gpu = ctx.device.startswith("cuda")
    sharing = engines_per_gpu(engines, visible_gpus() if on_gpu else 0)
    spec = ESSAEngineSpec(base_dir=str(ctx.model_dir.resolve()), adapter_dir=str((root / SFT_ADAPTER).resolve()),
                          space_path=str((root / SPACE).resolve()), precision=cfg.precision, dtype=ctx.dtype,
                          device=ctx.device, batch_size=essa_generate_batch(ctx, cfg), chat=ctx.chat,
                          threads=threads,
                          backend=cfg.backend,
                          gpu_memory_utilization=cfg.gpu_memory_utilization or GPU_MEMORY_UTILIZATION / sharing,
                          kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, max_loras=cfg.max_loras,
                          max_model_len=(context_length(ctx, examples, cfg.max_new_tokens)
                                         if cfg.backend == "vllm" else None))
    scoring = IndexedScoring(task=ctx.task.name, examples=examples, max_new_tokens=cfg.max_new_tokens,
                             fitness=cfg.fitness, options=dict(ctx.task.options))
    if engines == 1:
        return SerialEvaluator(spec, scoring)
    spec, per_engine = ray_placement(spec, engines, ctx.device.startswith("cuda"))
    return RayEvaluator(spec, scoring, engines, per_engine, start_timeout=cfg.start_timeout,
                        call_timeout=cfg.call_timeout)


def essa_generate_batch(ctx: TrainContext, cfg) -> int:
    """The transformers engines' ``generate`` batch: ``batch_size``, or on a GPU the largest that fits it beside the
    base in its precision (:func:`esrepro.models.memory.runtime_generate_batch`, the plan check's rule: Qwen2.5-32B at INT8
    holds about 90 sequences of 1,536 tokens, not 200). Candidates are scored greedily, each prompt on its own (left
    padding and the attention mask): the batch changes the time, not the scores (up to the float rounding of
    differently shaped matmuls)."""
    if cfg.backend != "hf":
        return cfg.batch_size
    from esrepro.models import memory

    return memory.runtime_generate_batch(ctx.model_dir, cfg.batch_size, memory.prompt_tokens(ctx.task.name),
                                         cfg.max_new_tokens, ctx.device, cfg.precision)


def context_length(ctx: TrainContext, examples: list[dict], max_new_tokens: int) -> int:
    """The sequence length a vLLM engine must hold: the longest prompt (as the engine encodes it) plus
    ``max_new_tokens``. vLLM otherwise sizes its KV cache for the model's whole context (131,072 tokens for
    Qwen2.5-32B and Llama-3.1-8B: 32 GiB of bf16 KV cache for the 32B), which a GPU holding a 32B model has
    not got."""
    from esrepro.backends.vllm_engine import encode_prompt
    from esrepro.models.loading import load_tokenizer

    tok = load_tokenizer(ctx.model_dir)
    longest = max(len(encode_prompt(tok, ctx.task.prompt(e), ctx.chat, None)[0]) for e in examples)
    return longest + max_new_tokens


def _prompt_formatter(ctx: TrainContext):
    """Prompts as the engines will see them (wrapped in the chat template for chat models)."""
    if not ctx.chat:
        return lambda text: text
    from esrepro.models.loading import load_tokenizer

    tok = load_tokenizer(ctx.model_dir)
    return lambda text: tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)


def train_essa(ctx: TrainContext) -> TrainOutcome:
    """Run ESSA on ``ctx``'s model and task; resumes from ``<run>/resume`` when a killed run left state there."""
    from esrepro.essa.data import essa_sample_budget, sft_completion, split_examples
    from esrepro.essa.engine import check_precision
    from esrepro.essa.export import save_adapter
    from esrepro.essa.loop import Problems, run_essa
    from esrepro.essa.svd import SingularValueSpace
    from esrepro.population.evaluators import EngineMismatch

    cfg = ctx.settings
    check_precision(cfg.precision, ctx.device)  # before any work
    run = ctx.run_dir
    resume = run / P.RESUME
    resuming = has_state(resume)
    if not resuming:
        shutil.rmtree(run / P.SNAPSHOTS, ignore_errors=True)  # a fresh start keeps no stale snapshots
    splits = split_examples(ctx.examples, cfg.sft_examples, cfg.fitness_examples, cfg.val_examples)
    fmt = _prompt_formatter(ctx)
    pairs = [(fmt(ctx.task.prompt(e)), sft_completion(ctx.task.name, e)) for e in splits.sft]
    sft = ensure_sft(ctx, pairs, reuse=resuming)
    space = SingularValueSpace.load(run / SFT / SPACE)

    evaluator = make_essa_evaluator(ctx, splits.fitness + splits.val)
    sums = evaluator.checksums()
    if len(set(sums)) != 1:
        evaluator.close()
        raise EngineMismatch(f"the {len(sums)} engines hold different SFT weights (checksums {sorted(set(sums))})")
    n_fit = len(splits.fitness)
    problems = Problems(fitness=list(range(n_fit)), val=list(range(n_fit, n_fit + len(splits.val))))

    def keep_snapshot(row: dict, strategy) -> None:
        done = row["generation"] + 1
        if cfg.keep_every and done % cfg.keep_every == 0 and done < cfg.iterations:
            evaluator.save_candidate(strategy.mean, run / P.SNAPSHOTS / P.snapshot_name(done))

    log, strategy, meta = run_essa(evaluator, cfg, space.x0, problems, resume, seed=ctx.seed,
                                   key_extra={"sft_adapter_sha256": sft["adapter_sha256"]},
                                   on_generation=keep_snapshot)
    solution = strategy.mean
    save_adapter(space, solution, run / SFT / SFT_ADAPTER, run / ADAPTER)
    with atomic_path(run / P.CMA_STATE) as tmp:
        tmp.write_bytes(strategy.to_bytes())
    best_x, best_reward = strategy.best
    summary = sft["summary"]
    extra = {
        "engines": evaluator.engines,
        "backend": cfg.backend,
        "precision": cfg.precision,
        "checksum_sft": sums[0],
        "budget": {"sample_budget": essa_sample_budget(cfg.as_dict())},
        "essa": {
            "solution": "cma_mean",
            "space_dim": sft["space"]["dim"],
            "adapted_modules": sft["space"]["modules"],
            "sft_loss_before": summary["loss_before"],
            "sft_loss_after": summary["loss_after"],
            "sft_steps": summary["steps"],
            "sft_adapter_sha256": sft["adapter_sha256"],
            "seconds_sft": sft["seconds_sft"],
            "seconds_svd": sft["seconds_svd"],
            "val_reward_sft": meta["val_reward_sft"],
            "best_reward": best_reward,
            "final_sigma": strategy.sigma,
            "adapter": str(run / ADAPTER),
            "adapter_sha256": sha256_file(run / ADAPTER / "adapter_model.safetensors"),
            "cma_state": str(run / P.CMA_STATE),
            "cma_state_sha256": sha256_file(run / P.CMA_STATE),
            "checkpoint_note": ("candidate merged into the registry-dtype weights it was scored with"
                                if cfg.precision == "native" else
                                f"candidate adapter merged into the unquantised base (scored on a {cfg.precision} base)"),
        },
    }

    def finish() -> None:
        evaluator.close()
        clear_state(resume)

    return TrainOutcome(log=log, save=lambda path: evaluator.save_candidate(solution, Path(path)), extra=extra,
                        finish=finish)


def read_sft_record(run_dir: str | Path) -> dict:
    """The SFT record of a finished ESSA run (``<run>/sft/sft.json``)."""
    path = Path(run_dir) / SFT / SFT_RECORD
    if not path.exists():
        raise FileNotFoundError(f"no ESSA SFT record at {path} (is {run_dir} an ESSA run?)")
    return read_json(path)
