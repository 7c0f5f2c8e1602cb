"""Run in a process of its own by tests/test_vllm_probe.py (vLLM's CPU build): the ES vLLM engine on one model at one
tensor-parallel size through perturb, restore and update, and at size 1 low-rank ES with its members as LoRA
adapters; prints one JSON line: the layout the engine probed, checksums and greedy outputs.

A process of its own: vLLM's transformers backend (OLMo 2's in vLLM 0.32) rebases the transformers model class it
serves, after which the transformers engine could no longer run that class in the same process.
"""

from __future__ import annotations

import json
import os
import sys

PROMPTS = [f"Using the numbers [{a} {b}], make" for a in range(1, 9) for b in (2, 5)]
NEW = 10
KV = 32 * 2**20
#: The engines' context at most: replicas keep their real model's (40,960 tokens for Qwen3), whose one sequence would
#: not fit KV; the prompts and responses here take a few dozen tokens. A model with a shorter context keeps its own.
MAX_LEN = 512
SIGMA, RANK, ALPHA = 0.1, 2, 0.05
MEMBERS = [11, 12, 13]
WEIGHTS = [1.0, -0.5, 0.25]


def es_steps(engine) -> list:
    """Checksums and greedy outputs of the base, a member, the restored base and the updated weights."""
    out = [(engine.checksum(), engine.generate(PROMPTS, NEW))]
    engine.perturb(7, 0.2)
    out.append((engine.checksum(), engine.generate(PROMPTS, NEW)))
    engine.restore(7, 0.2)
    out.append((engine.checksum(), engine.generate(PROMPTS, NEW)))
    engine.apply_update([3, 4, 5], [1.0, -0.5, 0.25], 0.1)
    out.append((engine.checksum(), engine.generate(PROMPTS, NEW)))
    return out


def main() -> None:
    model_dir, tp = sys.argv[1], int(sys.argv[2])
    with open(os.path.join(model_dir, "config.json")) as f:
        max_len = min(MAX_LEN, int(json.load(f).get("max_position_embeddings", MAX_LEN)))
    if tp > 1:  # one NUMA node: each rank bound to cores of its own (as tests/test_vllm_engine.py does)
        cpus = sorted(os.sched_getaffinity(0))
        half = max(1, len(cpus) // 2)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            ",".join(map(str, part)) for part in (cpus[:half], cpus[half:2 * half] or cpus[:half]))
    from esrepro.backends.vllm_eggroll import EggrollVLLMEngine
    from esrepro.backends.vllm_engine import VLLMEngine

    engine = VLLMEngine(model_dir, dtype="float32", device="cpu", tensor_parallel_size=tp, kv_cache_memory_bytes=KV,
                        call_timeout=300, max_model_len=max_len)
    layout = [[[s.name, list(s.shape), [[p.hf.name, list(p.hf.shape), p.dim, p.src, p.dst, p.length] for p in s.pieces]]
               for s in engine.layout.shards(r)] for r in range(tp)]
    result = {"es": es_steps(engine), "model_type": engine.layout.model_type, "layout": layout}
    if tp == 1:
        lowrank = EggrollVLLMEngine(model_dir, rank=RANK, max_loras=len(MEMBERS), dtype="float32", device="cpu",
                                    kv_cache_memory_bytes=KV, max_model_len=max_len)
        handles = lowrank.prepare_members(MEMBERS, SIGMA)
        members = lowrank.generate_members(handles, PROMPTS, NEW)
        lowrank.release_members(handles)
        lowrank.apply_update(MEMBERS, WEIGHTS, ALPHA)
        result["lowrank"] = {"members": members, "updated": (lowrank.checksum(), lowrank.generate(PROMPTS, NEW)),
                             "targets": sorted(name for name, _, _ in lowrank.targets)}
        lowrank.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
