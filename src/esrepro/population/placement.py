"""Where a run's engines go: how many (one per GPU of the job or of the Ray cluster it joins), how they share
GPUs, and the Ray resources each actor asks for. ES and ESSA lay out their engines alike."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any


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
