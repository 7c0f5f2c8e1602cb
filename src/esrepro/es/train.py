"""The ES trainer: the population evaluator (one engine, or several as Ray actors), the ES loop,
kept snapshots and resume state."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from esrepro import paths as P
from esrepro.train.context import TrainContext, TrainOutcome


def visible_gpus() -> int:
    """GPUs the run's engines can use: every GPU of the Ray cluster the job joins (e.g. all nodes of a multi-node
    job), else this process's."""
    from esrepro.population.ray_session import cluster_resources, joins_cluster

    if joins_cluster():
        return int(cluster_resources().get("GPU", 0))
    import torch

    return torch.cuda.device_count()


def engine_count(requested: int | None, device: str, tensor_parallel_size: int = 1) -> int:
    """Engines for a run: the setting, else one per ``tensor_parallel_size`` of the :func:`visible_gpus` on CUDA,
    else 1."""
    if requested:
        return requested
    if device.startswith("cuda"):
        return max(1, visible_gpus() // tensor_parallel_size)
    return 1


def make_evaluator(ctx: TrainContext):
    """A serial evaluator for one engine, a Ray evaluator for several (``settings.engines``)."""
    import torch

    from esrepro.population.evaluators import RayEvaluator, SerialEvaluator
    from esrepro.backends.spec import EngineSpec
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
                      kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, call_timeout=cfg.call_timeout)
    scoring = Scoring(task=ctx.task.name, examples=ctx.examples, max_new_tokens=cfg.max_new_tokens,
                      options=dict(ctx.task.options))
    if engines == 1:
        return SerialEvaluator(spec, scoring)
    spec, per_engine = ray_placement(spec, engines, on_gpu, cfg.tensor_parallel_size)
    return RayEvaluator(spec, scoring, engines, per_engine, start_timeout=cfg.start_timeout,
                        call_timeout=cfg.call_timeout)


#: The share of a GPU the vLLM engines on it take together when gpu_memory_utilization is not set; the rest holds
#: ES's weight copies and noise buffers.
GPU_MEMORY_UTILIZATION = 0.85


def engines_per_gpu(engines: int, gpus: int, tensor_parallel_size: int = 1) -> int:
    """How many engines share one GPU (1 when each has its own, or on CPU); ValueError for a layout Ray could not
    place: more GPUs per engine than there are, or engines that do not divide evenly over the GPUs they share."""
    if gpus == 0:
        return 1
    if engines * tensor_parallel_size <= gpus:
        return 1
    if tensor_parallel_size > 1:
        raise ValueError(f"{engines} engines x tensor_parallel_size {tensor_parallel_size} need "
                         f"{engines * tensor_parallel_size} GPUs, the job has {gpus}")
    if engines % gpus:
        raise ValueError(f"{engines} engines cannot share {gpus} GPUs evenly (Ray would leave some unplaced): "
                         "use a multiple of the GPU count")
    return engines // gpus


def ray_placement(spec, engines: int, on_gpu: bool, tensor_parallel_size: int = 1) -> tuple[Any, dict]:
    """Start (or join) Ray for ``engines`` actors built from ``spec`` (an engine spec dataclass with ``threads`` and
    ``device``); the spec the actors get and each actor's Ray resources.

    On a cluster the job joined, CPU engines share the cluster's CPUs and the engines' needs are checked against
    what it has; GPU engines share GPUs when there are more engines than GPUs (e.g. 2 engines on 1 GPU).
    """
    from esrepro.population.ray_session import cluster_resources, ensure_ray, joins_cluster

    ensure_ray(num_cpus=None if on_gpu else engines * spec.threads)
    available = cluster_resources() if joins_cluster() else None
    if available is not None and not on_gpu:
        # a cluster's CPUs are the job's real ones (scripts/ray-slurm): the engines share them
        spec = replace(spec, threads=max(1, int(available.get("CPU", 0)) // engines))
    if on_gpu:
        sharing = engines_per_gpu(engines, max(1, visible_gpus()), tensor_parallel_size)
        share = tensor_parallel_size if sharing == 1 else 1 / sharing
        per_engine = {"num_gpus": share, "num_cpus": 1}
        spec = replace(spec, device="cuda")  # each actor sees its own GPU as cuda:0
    else:
        per_engine = {"num_cpus": spec.threads}
    if available is not None:
        for resource, ray_name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            need = engines * per_engine.get(resource, 0)
            if need > available.get(ray_name, 0):
                raise ValueError(f"engines={engines} need {need:g} {ray_name}s, but the Ray cluster at "
                                 f"{os.environ['RAY_ADDRESS']} has {available.get(ray_name, 0):g}: lower the "
                                 "method's engines setting (or tensor_parallel_size), or give the job more")
    return spec, per_engine


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
