"""Starting or joining Ray: a job joins the cluster its SLURM allocation started, else starts one of its own."""

from __future__ import annotations

import os
import sys


def joins_cluster() -> bool:
    """Whether :func:`ensure_ray` joins a running cluster: ``RAY_ADDRESS`` is set (scripts/ray-slurm sets it
    to the cluster it started across the job's nodes)."""
    return bool(os.environ.get("RAY_ADDRESS"))


def ensure_ray(num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """``ray.init`` once per process: ``address="auto"`` when ``RAY_ADDRESS`` names a running cluster
    (scripts/ray-slurm starts one across a job's nodes), else a local single-node Ray with ``num_cpus`` and
    ``num_gpus`` (ignored when joining: the cluster's nodes declared theirs).

    Workers get this process's import path, so a source checkout runs the same code in every actor.
    """
    import ray

    if ray.is_initialized():
        return
    env = job_env()
    if joins_cluster():
        ray.init(address="auto", runtime_env={"env_vars": env}, log_to_driver=False)
    else:
        # address="local": always a cluster of this job's own, never one another job started on the node;
        # its daemons and agents are stopped even if this process is killed
        from esrepro.runtime.lifeline import reap_on_exit

        reap_on_exit()
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                 runtime_env={"env_vars": env}, log_to_driver=False, configure_logging=False)


def job_env() -> dict[str, str]:
    """Environment variables every actor of this job gets: this process's import path, so a source checkout runs
    the same code in every actor."""
    return {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def cluster_resources() -> dict[str, float]:
    """Total resources of the cluster named by ``RAY_ADDRESS`` (``CPU``, ``GPU``, ...), joining it first."""
    import ray

    if not joins_cluster():
        raise RuntimeError("RAY_ADDRESS is not set: there is no running Ray cluster to join")
    ensure_ray()
    return dict(ray.cluster_resources())
