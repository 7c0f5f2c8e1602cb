"""Models built on the meta device, sharded there by FSDP2 and filled shard by shard: no process ever holds a whole
copy on its device.

PPO loads its actor, critic and reference this way under ``sharding: fsdp`` (esrepro.rl.ppo); GRPO its reference
model (:func:`shard_reference`, through :func:`sharded_reference_trainer`). The main process reads the checkpoint
once on CPU and broadcasts it shard by shard (``set_model_state_dict(broadcast_from_rank0=True)``); the values are
those ``from_pretrained`` gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from esrepro.rl.grpo_parallel import BF16_POLICY
from esrepro.runtime.distributed import world

#: ``model_init_kwargs`` placement that makes transformers build a model on the meta device without reading weights.
META_DEVICE_MAP: dict[str, str] = {"": "meta"}


def rebuild_buffers(model: nn.Module, device: str) -> None:
    """Recompute the non-persistent buffers (rotary ``inv_freq``) that ``to_empty`` left uninitialised: they are not
    in any state dict."""
    for mod in model.modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            fresh = type(mod)(config=mod.config)
            for name, buf in fresh.named_buffers(recurse=False):
                mod._buffers[name] = buf.to(device)


def is_meta(model: nn.Module) -> bool:
    """Whether every parameter of ``model`` is on the meta device (built, not loaded)."""
    return all(p.device.type == "meta" for p in model.parameters())


def shard_reference(ref: nn.Module, model_dir: str | Path, device: str, bf16: bool) -> nn.Module:
    """GRPO's frozen reference, built on the meta device (``ref``), sharded by FSDP2 one unit per decoder layer and at
    the root (so a forward gathers one layer at a time, never the whole model, and every unit, the root's embeddings,
    final norm and LM head too, is sharded again after it), materialised empty on ``device`` and
    filled with ``model_dir``'s weights in ``ref``'s dtype, broadcast from the main process. With ``bf16`` the
    gathered parameters are bf16 and the outputs float32 (the policy's mixed precision,
    esrepro.rl.grpo_parallel.BF16_POLICY). A collective: every process calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    from esrepro.rl.ppo_parallel import _layers

    if not is_meta(ref):
        raise ValueError("shard_reference: the reference must be built on the meta device (META_DEVICE_MAP), "
                         "not loaded whole")
    here = world()
    dtype = next(ref.parameters()).dtype
    ref.eval().requires_grad_(False)
    mesh = init_device_mesh(torch.device(device).type, (here.world_size,))
    policy = MixedPrecisionPolicy(**{k: getattr(torch, v) for k, v in BF16_POLICY.items()}) if bf16 \
        else MixedPrecisionPolicy()
    for layer in _layers(ref):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    # the root too reshards after each forward: torch leaves a root unit gathered for the backward that follows, and
    # a frozen reference has none, so its embeddings, final norm and LM head would stay gathered for the whole run
    fully_shard(ref, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    ref.to_empty(device=device)
    rebuild_buffers(ref, device)
    state: dict[str, torch.Tensor] = {}
    if here.is_main:
        state = dict(AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).state_dict())
    set_model_state_dict(ref, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return ref


def sharded_reference_trainer(base: type, model_dir: str | Path, device: str, bf16: bool) -> type:
    """``base`` (TRL's GRPOTrainer or a subclass) whose reference model is sharded the moment TRL creates it.

    TRL 1.16's ``GRPOTrainer.__init__`` creates the reference (grpo_trainer.py:1003), then starts the colocated
    vLLM engine (:1107), and only then shards the reference (``prepare_fsdp``, :1186). Given ``model_init_kwargs``
    with :data:`META_DEVICE_MAP` (and the policy as a loaded model, so those kwargs make only the reference), TRL
    creates the reference on the meta device, and this class shards and loads it (:func:`shard_reference`) as TRL
    assigns it, before the engine starts: each process then holds its policy and its shard of the reference, never
    the whole reference. TRL's later ``prepare_fsdp`` finds it sharded and leaves it (``prepare_model`` on CPU leaves
    a DTensor-sharded model where it is)."""

    class ShardedReferenceGRPOTrainer(base):
        @property
        def ref_model(self) -> Any:
            return self.__dict__.get("_sharded_ref_model")

        @ref_model.setter
        def ref_model(self, model: Any) -> None:
            if model is not None and is_meta(model):
                model = shard_reference(model, model_dir, device, bf16)
            self.__dict__["_sharded_ref_model"] = model

    return ShardedReferenceGRPOTrainer
