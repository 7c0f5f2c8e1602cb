"""What GRPO holds of its reference model when TRL starts the colocated vLLM engine, on vLLM's CPU build:
``torchrun ... grpo_reference_job.py MODEL_DIR OUT_DIR ORDER`` (ORDER: ``sharded``, this pipeline's FSDP path,
or ``trl``, TRL's own order: the reference loaded whole and sharded only after the engine started).

Every process builds the GRPO trainer through :func:`esrepro.rl.grpo.make_trainer` with ``beta > 0`` and TRL's
colocated vLLM engine (a real in-process ``LLM`` per process, TRL's ``external_launcher`` over the gloo group), and
records, at the moment TRL constructs its ``VLLMGeneration``, each reference parameter's device, whether it is a
DTensor shard, and the elements this process holds against the whole model's. Then one optimiser step runs (the
sharded reference's forward gives the step's KL). The phases the process enters are traced (esrepro.rl.phase_trace).
Each process writes ``OUT_DIR/rank<RANK>.json``.

vLLM's CPU build packs linear weights after loading, which TRL's weight sync cannot reach; the packing is turned
off as in tests/trl_colocate_job.py. The CPU path of esrepro.rl.grpo turns vLLM and FSDP off (accelerate runs CPU
processes without FSDP), so this job passes ``use_vllm`` and the sharded reference to ``make_trainer`` itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, as TRL's colocation runs it


def main() -> None:
    import torch
    import vllm.model_executor.layers.utils as vllm_utils

    def keep_weights(layer: torch.nn.Module, remove_weight: bool) -> None:  # noqa: ARG001 - vLLM's signature
        layer.cpu_linear = torch.nn.functional.linear

    vllm_utils.dispatch_cpu_unquantized_gemm = keep_weights

    import trl.trainer.grpo_trainer as grpo_trainer
    from torch.distributed.tensor import DTensor
    from transformers import TrainerCallback

    from esrepro.models.loading import load_tokenizer
    from esrepro.rl.grpo import _dataset, grpo_config_kwargs, make_trainer
    from esrepro.rl.phase_trace import PhaseTrace
    from esrepro.rl.reward import trl_reward_func
    from esrepro.runtime.distributed import init_process_group, world
    from esrepro.tasks.countdown import CountdownTask, generate_problems

    model_dir, out, order = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    here = world()
    init_process_group("cpu", 120)
    torch.set_num_threads(1)
    record: dict = {}
    trace = PhaseTrace()
    tracing = trace.installed()  # before the probe below subclasses TRL's engine class
    tracing.__enter__()

    class Probe(grpo_trainer.VLLMGeneration):
        def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003 - TRL's signature
            trainer = sys._getframe(1).f_locals["self"]  # GRPOTrainer.__init__, constructing its engine
            ref = trainer.ref_model
            params = list(ref.parameters())
            record["at_engine_start"] = {
                "devices": sorted({p.device.type for p in params}),
                "dtensor": [isinstance(p, DTensor) for p in params],
                "held": sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params
                            if p.device.type != "meta"),
                "whole": sum(p.numel() for p in params),
                "policy": sum(p.numel() for p in trainer.model.parameters()),
            }
            super().__init__(*args, **kwargs)

    grpo_trainer.VLLMGeneration = Probe

    class KL(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001 - TRL callback signature
            if logs and "kl" in logs:
                record["kl"] = logs["kl"]

    settings = dict(algorithm="grpo", loss_type="grpo", scale_rewards="group", beta=0.1, num_generations=2,
                    learning_rate=1e-3, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8,
                    per_device_train_batch_size=4, gradient_accumulation_steps=1, epsilon=0.2, num_iterations=1,
                    lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, bf16=False,
                    gradient_checkpointing=False, disable_dropout=True, mask_truncated_completions=False,
                    importance_sampling_level="token", train_examples=4)
    kw = grpo_config_kwargs(settings, steps=1, seed=0, output_dir=str(out / f"trainer{here.rank}"), on_cpu=True,
                            world_size=here.world_size)
    kw.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_max_model_length=512)
    task = CountdownTask()
    tok = load_tokenizer(model_dir)
    tok.padding_side = "left"
    trainer = make_trainer(model_dir, None, "float32", kw, device="cpu", fsdp=False,
                           sharded_reference=order == "sharded", resumable=False,
                           reward_funcs=[trl_reward_func(task)],
                           train_dataset=_dataset(task, generate_problems(4, seed=0), False),
                           processing_class=tok, callbacks=[KL()])
    trainer.train()
    tracing.__exit__(None, None, None)
    record["phases"] = trace.order
    record["config"] = {k: kw.get(k) for k in ("gradient_accumulation_steps", "steps_per_generation", "use_vllm",
                                               "num_iterations")}
    (out / f"rank{here.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
