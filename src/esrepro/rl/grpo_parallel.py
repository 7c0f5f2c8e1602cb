"""How a GRPO run spreads over a job's training processes (one per GPU): batch shares and FSDP.

TRL's ``GRPOTrainer`` scores ``per_device_train_batch_size x processes x gradient_accumulation_steps``
completions per optimiser step (GRPOConfig's ``generation_batch_size``). The settings give the per-step
total at any world size (``per_device_train_batch_size x gradient_accumulation_steps``, esrepro.rl.budget),
so under W processes :func:`process_batch` divides it: the accumulation steps when W divides them (each
process keeps its micro-batch), else the micro-batch. The run then scores the ES sample budget however
many GPUs it has.

``sharding: fsdp`` shards parameters, gradients and optimiser state over the processes through
accelerate's FSDP2 (:func:`fsdp_kwargs`): one FSDP unit per decoder layer (the model's
``_no_split_modules``), full shard (parameters resharded after the forward), activation checkpointing
from the settings' ``gradient_checkpointing``, and sharded resume checkpoints: with ``SHARDED_STATE_DICT``
accelerate 1.15's ``save_fsdp_model`` / ``save_fsdp_optimizer`` write the policy and AdamW state with
``torch.distributed.checkpoint``, every process its own shard (``pytorch_model_fsdp_0/``, ``optimizer_0/``), the
Trainer writes no gathered ``model.safetensors`` beside them, and ``load_fsdp_model`` / ``load_fsdp_optimizer`` read
them back on resume (the final and kept weights are still gathered whole: ``Accelerator.get_state_dict``).

Mixed precision under FSDP2 (:func:`set_mixed_precision`): accelerate builds the policy from ``bf16`` alone, as
bf16 parameters, bf16 gradient reduction and bf16 outputs. Here, as in PPO (esrepro.rl.ppo_parallel.wrap), the
gathered parameters are bf16 while the gradients are reduced in float32 into the float32 master shards, and each
unit's output (the logits TRL's log-probabilities come from) is float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def process_batch(settings: dict, world_size: int) -> dict[str, int]:
    """Each process's ``per_device_train_batch_size`` and ``gradient_accumulation_steps`` so that the job's
    completions per optimiser step equal the settings' total; an error naming the fields when W cannot share it."""
    per_device = int(settings["per_device_train_batch_size"])
    accumulation = int(settings.get("gradient_accumulation_steps", 1))
    if world_size < 1:
        raise ValueError(f"world size {world_size} must be positive")
    if accumulation % world_size == 0:
        return {"per_device_train_batch_size": per_device, "gradient_accumulation_steps": accumulation // world_size}
    if per_device % world_size == 0:
        return {"per_device_train_batch_size": per_device // world_size, "gradient_accumulation_steps": accumulation}
    raise ValueError(
        f"per_device_train_batch_size ({per_device}) x gradient_accumulation_steps ({accumulation}) completions per "
        f"optimiser step cannot be shared by {world_size} training processes (one per GPU): neither field is a "
        f"multiple of {world_size}; choose one that is, or another GPU count")


def check_launch(world_size: int, visible_gpus: int) -> None:
    """Refuse one process that sees several GPUs: transformers would wrap the policy in ``nn.DataParallel``, which
    TRL's GRPOTrainer refuses; a job on G GPUs runs one process per GPU under torchrun."""
    if world_size == 1 and visible_gpus > 1:
        raise RuntimeError(
            f"one training process sees {visible_gpus} GPUs: run the job as `torchrun --standalone --nnodes 1 "
            f"--nproc-per-node {visible_gpus} --no-python esrepro train ...` (one process per GPU), or make one GPU "
            "visible (CUDA_VISIBLE_DEVICES)")


def decoder_layer_classes(model_dir: str | Path) -> list[str]:
    """The classes FSDP wraps one unit each: the model's ``_no_split_modules`` (its decoder layer), read from
    the architecture the checkpoint's config names."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    names: list[str] = []
    for arch in config.architectures or []:
        cls = getattr(transformers, arch, None)
        names += [n for n in (getattr(cls, "_no_split_modules", None) or []) if n not in names]
    if not names:
        raise ValueError(f"{model_dir}: its architecture {config.architectures} names no _no_split_modules, the "
                         "decoder layer class FSDP wraps; sharding: fsdp needs one (or use sharding: ddp)")
    return names


def fsdp_kwargs(layer_classes: list[str], gradient_checkpointing: bool) -> dict[str, Any]:
    """TrainingArguments for ``sharding: fsdp``: FSDP2 full shard, one unit per decoder layer, activation
    checkpointing inside FSDP (transformers' own ``gradient_checkpointing`` off, as it advises under FSDP)."""
    return {
        "fsdp": True,
        "fsdp_config": {
            "version": 2,
            "reshard_after_forward": True,  # full shard: parameters, gradients and optimiser state sharded
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "transformer_layer_cls_to_wrap": list(layer_classes),
            "state_dict_type": "SHARDED_STATE_DICT",  # resume checkpoints: every process writes its shard
            "activation_checkpointing": bool(gradient_checkpointing),
        },
        "gradient_checkpointing": False,
    }


#: FSDP2's mixed precision under ``bf16`` (accelerate's MixedPrecisionPolicy keys): bf16 compute, float32
#: gradient reduction and outputs.
BF16_POLICY: dict[str, str] = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": "float32"}


def set_mixed_precision(args: Any, bf16: bool) -> None:
    """Give the FSDP2 plugin that the Trainer builds from ``args.fsdp_plugin_args`` (TrainingArguments, e.g.
    GRPOConfig) the policy :data:`BF16_POLICY` when ``bf16``; accelerate keeps a policy it is given and derives one
    (everything in bf16) only when none is. Nothing to do without FSDP."""
    if not bf16 or getattr(args, "fsdp_plugin_args", None) is None:
        return
    import torch

    args.fsdp_plugin_args["mixed_precision_policy"] = {k: getattr(torch, v) for k, v in BF16_POLICY.items()}
