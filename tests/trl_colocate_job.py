"""TRL 1.16's colocated vLLM weight sync on vLLM's CPU build: ``python trl_colocate_job.py MODEL_DIR OUT_JSON``.

Builds TRL's own ``VLLMGeneration`` in colocate mode (a real in-process vLLM ``LLM`` with TRL's engine arguments)
for the policy in MODEL_DIR, changes every policy weight, calls TRL's ``sync_weights`` (which loads each parameter
through ``llm_engine.model_executor.driver_worker.model_runner.model.load_weights``) and writes the greedy tokens
of vLLM and of the transformers policy before and after, and the warnings TRL gave about the vLLM version.

vLLM's CPU platform, after loading, hands each linear layer a packed copy of its weight and replaces ``weight`` by
an empty Parameter without vLLM's ``weight_loader``, so a later ``load_weights`` cannot reach it; the GPU platform
never packs. Here the packing is turned off (``dispatch_cpu_unquantized_gemm`` computes with ``F.linear`` over
``weight``), which keeps the engine's Parameters as the GPU build keeps them.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, as TRL's colocation runs it


def main() -> None:
    import torch
    import vllm.model_executor.layers.utils as vllm_utils

    def keep_weights(layer: torch.nn.Module, remove_weight: bool) -> None:  # noqa: ARG001 - vLLM's signature
        layer.cpu_linear = torch.nn.functional.linear

    vllm_utils.dispatch_cpu_unquantized_gemm = keep_weights

    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    model_dir, out = sys.argv[1], sys.argv[2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from trl.generation.vllm_generation import VLLMGeneration
        from trl.import_utils import is_vllm_available

        is_vllm_available()
    version_warnings = [str(w.message) for w in caught if "vLLM" in str(w.message)]
    accelerator = Accelerator(cpu=True)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    generation = VLLMGeneration(policy, accelerator, tok, mode="colocate", gpu_memory_utilization=0.3,
                                max_model_length=64, max_num_seqs=8, max_completion_length=8)
    prompts = [tok(f"Using the numbers [{a} {b}], make")["input_ids"] for a, b in ((3, 4), (12, 2))]
    greedy = SamplingParams(temperature=0, max_tokens=8)

    def from_vllm() -> list[list[int]]:
        outs = generation.llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def from_policy() -> list[list[int]]:
        return [policy.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, len(p):]
                .tolist() for p in prompts]

    record = {"vllm_before": from_vllm(), "policy_before": from_policy(), "version_warnings": version_warnings}
    with torch.no_grad():  # an optimiser step that moves every weight
        gen = torch.Generator().manual_seed(1)
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    generation.sync_weights()
    record.update(vllm_after=from_vllm(), policy_after=from_policy())
    with open(out, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
