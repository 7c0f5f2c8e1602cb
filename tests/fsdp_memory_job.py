"""What FSDP2 keeps in memory in a GRPO job, as the pinned accelerate and torch build it, in gloo processes on CPU:
``torchrun ... fsdp_memory_job.py MODEL_DIR OUT_DIR``.

- The policy: accelerate's own FSDP2 preparation (``fsdp2_apply_ac`` then ``fsdp2_prepare_model``, the order of
  ``Accelerator.prepare``) with the plugin esrepro.rl.grpo_parallel asks for (one unit per decoder layer, full
  shard, activation checkpointing inside FSDP, :data:`~esrepro.rl.grpo_parallel.BF16_POLICY`). One training pass
  records the dtype of every tensor a checkpoint keeps for its recompute (the layer's inputs).
- The reference: :func:`esrepro.rl.meta_load.shard_reference` (built on the meta device, sharded, filled), then
  TRL's ``prepare_fsdp`` on it, as ``GRPOTrainer.__init__`` calls it after starting vLLM, and one
  forward without gradients under bf16 autocast, as TRL's GRPOTrainer scores a rollout. It records which of the reference's parameters are still
  gathered (registered unsharded) afterwards, and the phases a trace (esrepro.rl.phase_trace) saw. A second
  reference, loaded whole, goes through TRL's ``prepare_fsdp`` alone (TRL's own order), traced too.
- PPO's reference: sharded as esrepro.rl.ppo shards it (:func:`esrepro.rl.ppo_parallel.wrap`, frozen), one forward
  without gradients, and what stays gathered after it.

Each process writes ``OUT_DIR/rank<RANK>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace


def main() -> None:
    import torch
    import torch.distributed as dist
    import trl.trainer.grpo_trainer as grpo_trainer
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.tensor import DTensor
    from transformers import AutoConfig, AutoModelForCausalLM

    from esrepro.rl import meta_load
    from esrepro.rl import phases as PH
    from esrepro.rl.grpo_parallel import BF16_POLICY, decoder_layer_classes, fsdp_kwargs
    from esrepro.rl.phase_trace import PhaseTrace

    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ids = torch.randint(0, 200, (2, 24))

    fsdp = fsdp_kwargs(decoder_layer_classes(model_dir), gradient_checkpointing=True)["fsdp_config"]
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=fsdp["version"], reshard_after_forward=fsdp["reshard_after_forward"],
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=fsdp["transformer_layer_cls_to_wrap"],
        activation_checkpointing=fsdp["activation_checkpointing"], state_dict_type=fsdp["state_dict_type"],
        mixed_precision_policy={k: getattr(torch, v) for k, v in BF16_POLICY.items()})
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision="bf16",
                                  is_main_process=rank == 0, device=torch.device("cpu"))
    policy = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    policy = fsdp2_prepare_model(accelerator, fsdp2_apply_ac(accelerator, policy))
    saved: list[str] = []
    for module in policy.modules():
        if isinstance(module, CheckpointWrapper):
            def recorded(fn, *args, _checkpoint=module.checkpoint_fn, **kwargs):  # noqa: ANN001, ANN202
                saved.extend(str(t.dtype) for t in (*args, *kwargs.values())
                             if torch.is_tensor(t) and t.is_floating_point())
                return _checkpoint(fn, *args, **kwargs)

            module.checkpoint_fn = recorded
    policy.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # TRL scores under accelerate's autocast (bf16)
        loss = policy(input_ids=ids).logits.float().mean()
    loss.backward()

    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)), dtype=torch.float32)
    with PhaseTrace().installed() as sharded_first:  # as grpo_trainer calls them (the patched names)
        ref = meta_load.shard_reference(ref, model_dir, "cpu", bf16=True)
        sharded_first.enter(PH.START_VLLM)  # TRL starts its engine here
        ref = grpo_trainer.prepare_fsdp(ref, accelerator)
    with PhaseTrace().installed() as trl_order:
        trl_order.enter(PH.START_VLLM)
        grpo_trainer.prepare_fsdp(AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32),
                                  accelerator)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref(input_ids=ids)
    gathered = sorted(name for name, p in ref.named_parameters() if not isinstance(p, DTensor))

    from esrepro.rl import ppo_parallel
    from esrepro.runtime.distributed import world

    ppo_ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval().requires_grad_(False)
    ppo_ref = ppo_parallel.wrap(ppo_ref, "fsdp", world(), "cpu", False, frozen=True)  # as esrepro.rl.ppo shards it
    with torch.no_grad():
        ppo_ref(input_ids=ids)
    ppo_gathered = sorted(name for name, p in ppo_ref.named_parameters() if not isinstance(p, DTensor))

    (out / f"rank{rank}.json").write_text(json.dumps({
        "checkpoint_inputs": saved, "layers": policy.config.num_hidden_layers,
        "reference_gathered_after_forward": gathered, "ppo_reference_gathered_after_forward": ppo_gathered,
        "reference_parameters": len(list(ref.named_parameters())), "world": int(os.environ["WORLD_SIZE"]),
        "phases_sharded_first": sharded_first.order, "phases_trl_order": trl_order.order}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
