"""The picklable recipe of one ES engine (transformers or vLLM), built inside whichever process evaluates members."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class EngineSpec:
    """How to build one engine: backend, model, device, generation batch and path, and the ES weight options
    (the noise scheme included: full-rank, or low-rank of ``rank``)."""

    model_dir: str
    backend: Literal["hf", "vllm"] = "hf"
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 32
    chat: bool = False
    max_prompt_tokens: int | None = None
    noise: str = "iid"
    restore: str = "exact"
    master_weights: str | None = None
    threads: int = 1
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85  # vllm: this engine's share of its GPU (already divided among sharers)
    kv_cache_memory_bytes: int | None = None  # vllm: KV cache bytes instead of the share (CPU build: 256 MiB)
    generation: str = "default"  # the hf backend's generation path (esrepro.backends.hf)
    call_timeout: float | None = None  # vllm: seconds a call into its workers may take
    rank: int | None = None  # None: full-rank ES noise; r: low-rank (EGGROLL) noise of rank r (esrepro.perturb.lowrank)
    max_loras: int | None = None  # vllm with rank: member adapters in one batch (None: all of a call's members)
    noise_on: str = "all"  # full-rank noise on every parameter (all) or on the decoder blocks' linear weights (linear)

    def build(self) -> Any:
        """The engine (this process sets torch's thread count first)."""
        import torch

        torch.set_num_threads(max(1, self.threads))
        weights = dict(noise=self.noise, restore=self.restore, master_weights=self.master_weights)
        if self.backend == "hf":
            from esrepro.backends.hf import HFEngine

            return HFEngine(self.model_dir, dtype=self.dtype, device=self.device, batch_size=self.batch_size,
                            chat=self.chat, max_prompt_tokens=self.max_prompt_tokens, generation=self.generation,
                            rank=self.rank, noise_on=self.noise_on, **weights)
        if self.backend == "vllm" and self.rank is not None:
            from esrepro.backends.vllm_eggroll import EggrollVLLMEngine

            return EggrollVLLMEngine(self.model_dir, rank=self.rank, max_loras=self.max_loras, dtype=self.dtype,
                                     tensor_parallel_size=self.tensor_parallel_size, chat=self.chat,
                                     max_prompt_tokens=self.max_prompt_tokens, device=self.device,
                                     gpu_memory_utilization=self.gpu_memory_utilization,
                                     kv_cache_memory_bytes=self.kv_cache_memory_bytes, call_timeout=self.call_timeout,
                                     **weights)
        if self.backend == "vllm":
            from esrepro.backends.vllm_engine import VLLMEngine

            return VLLMEngine(self.model_dir, dtype=self.dtype, tensor_parallel_size=self.tensor_parallel_size,
                              chat=self.chat, max_prompt_tokens=self.max_prompt_tokens, device=self.device,
                              gpu_memory_utilization=self.gpu_memory_utilization,
                              kv_cache_memory_bytes=self.kv_cache_memory_bytes, call_timeout=self.call_timeout,
                              noise_on=self.noise_on, **weights)
        raise ValueError(f"unknown backend {self.backend!r}; expected hf or vllm")
