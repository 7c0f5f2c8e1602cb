"""Starting or joining Ray: a job joins the cluster its SLURM allocation started, else starts one of its own."""

from __future__ import annotations

import os
import sys


def ensure_ray(num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """``ray.init`` once per process: ``address="auto"`` when ``RAY_ADDRESS`` names a running cluster
    (scripts/ray-slurm starts one across a job's nodes), else a local single-node Ray.

    Workers get this process's import path, so a source checkout runs the same code in every actor.
    """
    import ray

    if ray.is_initialized():
        return
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", runtime_env={"env_vars": env}, log_to_driver=False)
    else:
        # address="local": a Ray of this job's own, even when another job on the machine left one running
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                 runtime_env={"env_vars": env}, log_to_driver=False, configure_logging=False)
