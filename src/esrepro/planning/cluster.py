"""A job's cluster layout: the registry resources it takes, what the SLURM executor plugin is asked for,
and, for a train job spanning nodes, the Ray cluster it runs under (scripts/ray-slurm).

PPO and GRPO jobs run one training process per GPU under torchrun (:func:`torchrun`). ES methods take the
registry's ``train_es`` resources where the model has them (the population
engines' layout, e.g. two nodes for a 7B model), other methods ``train``; an ESSA run with more
engines than that entry's GPUs takes as many such nodes as its engines need. A job on several nodes
(or with ``ray_cluster``) runs under scripts/ray-slurm, which starts a Ray cluster across its
nodes for the ES engines to join. For the SLURM executor plugin (2.8.0) such a job asks for one
task per node (``nodes``, ``tasks``) and sets ``mpi``, so the plugin's job step runs the shell
command directly on the first node instead of inside ``srun -n1`` (ray-slurm starts its own
steps); its GPUs go per node as ``gres`` (the plugin's ``gpu`` becomes ``--gpus``, a total that
SLURM may split unevenly); ``tasks_per_gpu: 0`` keeps the plugin from turning tasks into
``--ntasks-per-gpu``.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from esrepro.essa.sft_launch import PROCESSES_ENV
from esrepro.pipeline import Pipeline
from esrepro.rl.shares import largest_world
from esrepro.settings.methods import ES_ALGORITHMS, GRPO_ALGORITHMS
from esrepro.settings.registry import Resources

#: Snakemake resources every rule passes on from the registry.
RESOURCES = ("gpu", "gpu_model", "cpus_per_gpu", "cpus_per_task", "mem_mb", "runtime", "nodes")
#: Algorithms whose training runs as one process per GPU under torchrun (gradients exchanged between them).
DATA_PARALLEL = ("ppo", *GRPO_ALGORITHMS)
#: A train job's resources: the above and what a multi-node job needs.
TRAIN_RESOURCES = (*RESOURCES, "gres", "tasks", "tasks_per_gpu", "mpi")


def train_resources_key(p: Pipeline, task: str, model: str, method: str) -> str:
    """The registry resources entry of a train job: for an ES method ``train_es_<task>`` where the model has one (a
    task whose ES runs need a layout of their own), else ``train_es`` where it has one; else ``train``."""
    resources = p.model(model).resources
    if p.algorithm_of(task, method).name in ES_ALGORITHMS:
        for key in (f"train_es_{task}", "train_es"):
            if key in resources:
                return key
    return "train"


def rl_job(p: Pipeline, model: str, settings: dict, rule: str = "train") -> Resources:
    """The resources of an RL job (``settings``: the run's method settings): the registry's ``rule`` entry, on one
    node with as many processes (and GPUs) as share its per-step batch evenly, at most the entry's.

    The settings' batch is a total per optimiser step whatever the world size (esrepro.rl.budget), so a
    batch of 60 completions on an 8-GPU entry runs as 6 processes of 10, not as 8 processes of 7.5. The counts
    allowed are those the training itself accepts (esrepro.rl.shares.admits: GRPO's ``process_batch`` divides the
    accumulation steps or the micro-batch, PPO's ``shares`` the prompts and mini-batch), so 15 x 4 = 60 completions
    run as 5 processes (15 x 4 / 5 = 3 x 4), not 6, which neither 15 nor 4 can be divided by.
    """
    res = p.resources(model, rule)
    if res.nodes > 1:
        return res  # the launcher needs every node's processes: the batch must divide over all of them
    most = res.training_processes()
    world = largest_world(settings, most)
    if world == most:
        return res
    return res.model_copy(update={"processes": world, "gpu": world if res.gpu else 0})


def train_job(p: Pipeline, task: str, model: str, method: str) -> Resources:
    """The registry resources of one train job; an RL run's follow :func:`rl_job`; an ESSA run asking for more
    engines than the entry's GPUs gets as many nodes of that entry as its engines need (one engine per GPU,
    e.g. 128 engines: 16 nodes x 8 GPUs)."""
    name = p.algorithm_of(task, method).name
    if name in DATA_PARALLEL:
        return rl_job(p, model, p.method_settings(model, task, method).as_dict(), train_resources_key(p, task, model,
                                                                                                     method))
    res = p.resources(model, train_resources_key(p, task, model, method))
    if name != "essa" or not res.gpu:
        return res
    engines = p.method_settings(model, task, method).engines
    if engines and engines > res.nodes * res.gpu:
        return res.model_copy(update={"nodes": math.ceil(engines / res.gpu)})
    return res


def layout(p: Pipeline, task: str, model: str, method: str, cell: str | None = None) -> Resources:
    """A train job's resources (:func:`train_job`; one grid ``cell``'s with ``cell``: :func:`rl_job`)."""
    if cell is None:
        return train_job(p, task, model, method)
    return rl_job(p, model, p.method_settings(model, task, method, cell).as_dict())


def on_ray_cluster(res: Resources) -> bool:
    """Whether a job runs under scripts/ray-slurm (several nodes, or ``ray_cluster``)."""
    return res.nodes > 1 or res.ray_cluster


def slurm_resource(res: Resources, key: str) -> Any:
    """One Snakemake resource of a train job (None leaves it out)."""
    several = res.nodes > 1
    if key in ("gpu", "gpu_model") and several:
        return None
    if key == "gres":
        if not (several and res.gpu):
            return None
        return f"gpu:{res.gpu_model}:{res.gpu}" if res.gpu_model else f"gpu:{res.gpu}"
    if key == "tasks":
        return res.nodes if several else None
    if key == "tasks_per_gpu":
        return 0 if several and res.gpu else None
    if key == "mpi":
        return "srun" if several else None
    return getattr(res, key)


def ray_layout(p: Pipeline, task: str, model: str, method: str) -> str:
    """A train job's layout in words, e.g. "2 nodes x 4 GPUs: 8 vllm engines, tp 1"."""
    res = train_job(p, task, model, method)
    nodes = f"{res.nodes} node{'s' if res.nodes > 1 else ''}"
    per_node = f"{res.gpu} GPUs" if res.gpu else f"{res.threads()} CPUs"
    settings = p.method_settings(model, task, method)
    if settings.algorithm == "essa":
        engines = settings.engines or (res.nodes * res.gpu if res.gpu else 1)
        return f"{nodes} x {per_node}: {engines} {settings.backend} engines"
    if settings.algorithm not in ES_ALGORITHMS:
        return f"{nodes} x {per_node}"
    tp = settings.tensor_parallel_size
    engines = settings.engines or (res.nodes * res.gpu // tp if res.gpu else 1)
    return f"{nodes} x {per_node}: {engines} {settings.backend} engines" + (f", tp {tp}" if res.gpu else "")


#: The rendezvous ports of multi-node torchrun jobs (on each job's first node): RDZV_PORT_BASE + SLURM_JOB_ID mod
#: RDZV_PORTS, i.e. 20000-29999, below Linux's ephemeral range (32768-60999) from which other programs' outgoing
#: connections take theirs. Two jobs sharing a first node get different ports unless their ids differ by a multiple
#: of 10,000 (a fixed port, torchrun's 29500, made the second job's rendezvous fail or join the first's).
RDZV_PORT_BASE = 20000
RDZV_PORTS = 10000


def rdzv_port(job_id: int) -> int:
    """The rendezvous port of the multi-node job ``job_id`` (what :func:`torchrun`'s shell expression computes)."""
    return RDZV_PORT_BASE + job_id % RDZV_PORTS


def torchrun(res: Resources) -> str:
    """The torchrun prefix of a data-parallel job: ``res.training_processes()`` per node; none for one process.

    One node: ``torchrun --standalone`` (a free port of its own). Several: one torchrun per node, started by ``srun``
    (the executor plugin runs the job's command on its first node, :func:`slurm_resource`), meeting at the first
    node's c10d rendezvous on the job's own port (:func:`rdzv_port` of ``$SLURM_JOB_ID``, computed by the shell).
    """
    per_node = res.training_processes()
    if res.nodes == 1 and per_node == 1:
        return ""
    common = f"--nproc-per-node {per_node} --no-python"
    if res.nodes == 1:
        return f"torchrun --standalone --nnodes 1 {common} "
    head = '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"'
    return (f"srun --nodes {res.nodes} --ntasks-per-node 1 --kill-on-bad-exit=1 torchrun --nnodes {res.nodes} "
            f"{common} --rdzv-backend c10d --rdzv-id \"$SLURM_JOB_ID\" --rdzv-endpoint {head}:$(({RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORTS})) ")


def launcher(p: Pipeline, task: str, model: str, method: str, ray_slurm: str) -> str:
    """The command prefix a train job runs under: torchrun for PPO and GRPO (one process per GPU),
    ``ray_slurm`` for ES and ESSA engines on a Ray cluster across nodes, else none; an ESSA job on several GPUs
    also sets ``$ESREPRO_TRAIN_PROCESSES`` for its SFT."""
    res = train_job(p, task, model, method)
    name = p.algorithm_of(task, method).name
    if name in DATA_PARALLEL:
        return torchrun(res)

    # ESSA's LoRA SFT starts its own torchrun, one process per GPU of the job's first node (esrepro.essa.sft_launch)
    sft = res.training_processes()
    if p.cfg.rehearsal is not None:  # the rehearsal's ESSA SFT: at most rehearsal.processes (its RL jobs: the paper's)
        sft = min(sft, p.cfg.rehearsal.processes)
    env = f"{PROCESSES_ENV}={sft} " if name == "essa" and sft > 1 else ""
    if not on_ray_cluster(res):
        return env
    return f"{env}{shlex.quote(ray_slurm)} --cluster --layout {shlex.quote(ray_layout(p, task, model, method))} -- "


def rl_launcher(p: Pipeline, model: str, settings: dict) -> str:
    """The torchrun prefix of an RL job outside ``train`` (a grid cell, the ESSA study's GRPO baseline)."""
    return torchrun(rl_job(p, model, settings))
