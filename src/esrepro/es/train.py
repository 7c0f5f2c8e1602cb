"""The ES trainer: the population evaluator (one engine, or several as Ray actors), the ES loop,
kept snapshots and resume state. It trains ``es`` (full-rank noise) and ``eggroll`` (low-rank noise, the
engines' ``rank``) alike: only the engines differ."""

from __future__ import annotations

import shutil
from pathlib import Path

from esrepro import paths as P
from esrepro.population.placement import (
    GPU_MEMORY_UTILIZATION,
    engine_count,
    engines_per_gpu,
    ray_placement,
    visible_gpus,
)
from esrepro.settings.methods import EggrollSettings, ESSettings
from esrepro.train.context import TrainContext, TrainOutcome


def lowrank_options(cfg: ESSettings) -> dict:
    """The engine options of a method's noise scheme: an ``eggroll`` method's rank (on vLLM, member adapters per
    batch: by default the whole population); an ``es`` method's noise targets where they are not every parameter."""
    if isinstance(cfg, EggrollSettings):
        return {"rank": cfg.rank, "max_loras": cfg.max_loras or cfg.population}
    return {"noise_on": cfg.noise_on} if cfg.noise_on != "all" else {}


def make_evaluator(ctx: TrainContext):
    """A serial evaluator for one engine, a Ray evaluator for several (``settings.engines``)."""
    import torch

    from esrepro.backends.spec import EngineSpec
    from esrepro.population.evaluators import RayEvaluator, SerialEvaluator
    from esrepro.population.spec import Scoring

    cfg = ctx.settings
    threads = torch.get_num_threads()
    engines = engine_count(cfg.engines, ctx.device, cfg.tensor_parallel_size)
    on_gpu = ctx.device.startswith("cuda")
    sharing = engines_per_gpu(engines, visible_gpus() if on_gpu else 0, cfg.tensor_parallel_size)
    spec = EngineSpec(model_dir=str(ctx.model_dir), backend=cfg.backend, dtype=ctx.dtype, device=ctx.device,
                      batch_size=cfg.batch_size, chat=ctx.chat, noise=cfg.noise, restore=cfg.restore,
                      master_weights=cfg.master_weights, threads=threads,
                      tensor_parallel_size=cfg.tensor_parallel_size, generation=cfg.generation,
                      max_prompt_tokens=cfg.max_prompt_tokens,
                      gpu_memory_utilization=cfg.gpu_memory_utilization or GPU_MEMORY_UTILIZATION / sharing,
                      kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, call_timeout=cfg.call_timeout,
                      **lowrank_options(cfg))
    scoring = Scoring(task=ctx.task.name, examples=ctx.examples, max_new_tokens=cfg.max_new_tokens,
                      options=dict(ctx.task.options))
    if engines == 1:
        return SerialEvaluator(spec, scoring)
    spec, per_engine = ray_placement(spec, engines, on_gpu, cfg.tensor_parallel_size)
    return RayEvaluator(spec, scoring, engines, per_engine, start_timeout=cfg.start_timeout,
                        call_timeout=cfg.call_timeout)


def train_es(ctx: TrainContext) -> TrainOutcome:
    """Run ES on ``ctx``'s model; resumes from ``<run>/resume`` when a killed run left state there."""
    from esrepro.es.loop import run_es
    from esrepro.io import atomic_path
    from esrepro.rl.budget import es_sample_budget
    from esrepro.train.periodic import clear_periodic, periodic_of, write_periodic
    from esrepro.train.resume import clear_state, has_state

    cfg = ctx.settings
    evaluator = make_evaluator(ctx)
    resume = ctx.run_dir / P.RESUME
    fresh = not has_state(resume)
    if fresh:
        shutil.rmtree(ctx.run_dir / P.SNAPSHOTS, ignore_errors=True)  # a fresh start keeps no stale snapshots
        clear_periodic(ctx.run_dir)
    periodic = periodic_of(cfg, ctx.task, ctx.eval_examples)
    per_iteration = cfg.population * (cfg.prompts_per_iteration or cfg.train_examples)  # samples per iteration
    if periodic is not None and fresh:
        periodic.point(0, 0, evaluator.generate)  # the base model; a resume restores it from the state

    def after_iteration(row: dict) -> None:
        # weights after iteration row["iteration"]; the final weights go to checkpoint/ instead
        done = row["iteration"] + 1
        if cfg.keep_every and done % cfg.keep_every == 0 and done < cfg.iterations:
            with atomic_path(ctx.run_dir / P.SNAPSHOTS / P.snapshot_name(done), is_dir=True) as tmp:
                evaluator.save(tmp)
        if periodic is not None and periodic.due(done):
            periodic.point(done, done * per_iteration, evaluator.generate)

    extra = {"periodic_eval": periodic.rows} if periodic is not None else None
    log = run_es(evaluator, cfg, resume, seed=ctx.seed, on_iteration=after_iteration, extra=extra)
    if periodic is not None:
        write_periodic(ctx.run_dir, periodic.rows)

    def finish() -> None:
        evaluator.close()
        clear_state(resume)

    return TrainOutcome(log=log, save=lambda path: evaluator.save(Path(path)),
                        extra={"budget": {"sample_budget": es_sample_budget(cfg.as_dict())},
                               "engines": evaluator.engines, "backend": cfg.backend,
                               "decoding": evaluator.decoding(), "noise_device": evaluator.noise_device()},
                        finish=finish)
