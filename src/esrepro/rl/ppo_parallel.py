"""PPO's process-group pieces: per-process batch shares, gradient averaging (DDP or FSDP2), global reductions,
the final weights gathered to rank 0, and the resume state written as shards by every process.

A PPO job on G GPUs runs G processes (:mod:`esrepro.runtime.distributed`). Each rolls out its share of
``prompts_per_step`` and of every mini-batch; gradients are averaged over the processes, so every optimiser
step averages the same micro-batch losses as one process would. With one process every function here is
the identity (no collective is issued), which keeps the one-process computation what it always was.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from torch import nn

from esrepro.rl.shares import Shares, shares  # noqa: F401  (the rule esrepro.planning.cluster.rl_job follows too)
from esrepro.runtime.distributed import World


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the processes (``t`` itself with one process)."""
    dist = _dist()
    if dist is None:
        return t
    out = t.clone()
    dist.all_reduce(out)
    return out


def gather_cat(t: torch.Tensor) -> torch.Tensor:
    """The processes' equal-shaped tensors ``t`` concatenated in rank order along dim 0 (``t`` with one process)."""
    dist = _dist()
    if dist is None:
        return t
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def gather_floats(values: list[float], device: str) -> list[float]:
    """Every process's equally long list of floats, concatenated in rank order (float64: exact for float32s)."""
    if _dist() is None:
        return values
    return gather_cat(torch.tensor(values, dtype=torch.float64, device=device)).tolist()


def gather_objects(obj: Any) -> list[Any]:
    """Every process's picklable ``obj`` in rank order (``[obj]`` with one process)."""
    dist = _dist()
    if dist is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# --- the models over the processes ----------------------------------------------------------------
def _layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM (or of a critic's backbone): FSDP's unit of sharding."""
    for m in model.modules():
        layers = getattr(m, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return list(layers)
    return []


def wrap(model: nn.Module, sharding: str, world: World, device: str, bf16: bool, frozen: bool = False) -> nn.Module:
    """``model`` spread over the processes: DDP (a whole copy on each, gradients all-reduced) or FSDP2
    (``fully_shard`` per decoder layer and at the root: float32 sharded master weights, bf16 compute when
    ``bf16``, float32 gradient reduction). One process: ``model`` itself unless ``sharding`` is fsdp. A ``frozen``
    model (the reference) reshards its root after each forward too: torch keeps a root unit gathered for a backward,
    and a model without one would hold its embeddings and LM head gathered for the rest of the run."""
    if sharding == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(torch.device(device).type, (world.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
            else MixedPrecisionPolicy()
        for layer in _layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=True if frozen else None)
        return model
    if sharding != "ddp":
        raise ValueError(f"sharding: {sharding!r} is neither ddp nor fsdp")
    if not world.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [torch.device(device).index] if device.startswith("cuda") else None
    return DDP(model, device_ids=ids)


def inner(model: nn.Module) -> nn.Module:
    """The module under a DDP wrapper (FSDP2 shards in place: the model itself)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return model.module if isinstance(model, DDP) else model


def no_sync(model: nn.Module, last: bool) -> Any:
    """DDP: skip the gradient all-reduce on all but the last micro-batch of an optimiser step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return model.no_sync() if isinstance(model, DDP) and not last else nullcontext()


def _fsdp_modules(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """FSDP2: hold the parameters unsharded (all-gathered once) for the many forwards of a rollout; other
    models: nothing to do."""
    mods = _fsdp_modules(model)
    for m in mods:
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def sharded(model: nn.Module) -> bool:
    """Whether ``model`` is sharded by FSDP2."""
    return bool(_fsdp_modules(model))


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full, unsharded state dict on CPU (a collective under FSDP: on rank 0 only, empty elsewhere)."""
    if sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in inner(model).state_dict().items()}


def training_state(models: dict[str, tuple[nn.Module, torch.optim.Optimizer]]) -> dict[str, dict]:
    """Each named (model, optimiser)'s weights and optimiser state as torch.distributed.checkpoint saves and loads
    them: under FSDP2 this process's shards (DTensors), under DDP or one process the whole tensors (replicated; DCP
    writes each once). Names: ``<name>`` for weights, ``<name>_optim`` for the optimiser."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out: dict[str, dict] = {}
    for name, (model, opt) in models.items():
        out[name], out[f"{name}_optim"] = get_state_dict(model, opt)
    return out


def save_training_state(models: dict[str, tuple[nn.Module, torch.optim.Optimizer]], folder: str) -> None:
    """Write :func:`training_state` into ``folder`` with torch.distributed.checkpoint: a collective in which every
    process writes its own shard file (``__<rank>_0.distcp``) and rank 0 the metadata; nothing is gathered."""
    import torch.distributed.checkpoint as dcp

    dcp.save(training_state(models), checkpoint_id=folder)


def load_training_state(models: dict[str, tuple[nn.Module, torch.optim.Optimizer]], folder: str) -> None:
    """Load what :func:`save_training_state` wrote into the models and optimisers, each process reading its shards
    (DCP reshards a state written by another number of processes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = training_state(models)
    dcp.load(state, checkpoint_id=folder)
    for name, (model, opt) in models.items():
        set_state_dict(model, opt, model_state_dict=state[name], optim_state_dict=state[f"{name}_optim"])


def autocast(device: str, bf16: bool, model: nn.Module) -> Any:
    """bf16 autocast over float32 weights (CUDA, ``bf16``, and not FSDP, whose policy casts the parameters)."""
    if bf16 and device.startswith("cuda") and not sharded(model):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()
