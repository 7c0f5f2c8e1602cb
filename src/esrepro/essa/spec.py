"""The picklable recipe of one ESSA engine (transformers or vLLM), built inside whichever process scores candidates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class ESSAEngineSpec:
    """How to build one ESSA engine: the base model, the SFT adapter and the saved singular value space.

    Every engine merges the same SFT adapter into the same base (``precision: native``) or
    keeps it unmerged on a bitsandbytes-quantised base (``int8``/``int4``, CUDA only), and
    loads the same saved factorisation, so candidates (flat vectors) are all that travels. The adapted modules are
    the SFT adapter's own (its ``adapter_config.json``: the setting ``lora_targets``, read off the model at the SFT).
    """

    base_dir: str
    adapter_dir: str
    space_path: str
    precision: Literal["native", "int8", "int4"] = "native"
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 32
    chat: bool = False
    max_prompt_tokens: int | None = None
    threads: int = 1
    backend: Literal["hf", "vllm"] = "hf"
    gpu_memory_utilization: float = 0.85  # vllm: this engine's share of its GPU
    kv_cache_memory_bytes: int | None = None  # vllm: KV cache bytes instead of the share (CPU build: 256 MiB)
    max_loras: int = 16  # vllm: candidate adapters in one batch
    max_model_len: int | None = None  # vllm: the longest prompt plus max_new_tokens (None: the model's context)

    def build(self) -> Any:
        """The engine (this process sets torch's thread count first)."""
        import torch

        torch.set_num_threads(max(1, self.threads))
        if self.backend == "vllm":
            from esrepro.essa.vllm_engine import ESSAVLLMEngine

            return ESSAVLLMEngine(self.base_dir, self.adapter_dir, self.space_path, precision=self.precision,
                                  dtype=self.dtype, device=self.device, chat=self.chat,
                                  max_prompt_tokens=self.max_prompt_tokens,
                                  gpu_memory_utilization=self.gpu_memory_utilization,
                                  kv_cache_memory_bytes=self.kv_cache_memory_bytes, max_loras=self.max_loras,
                                  **({"max_model_len": self.max_model_len} if self.max_model_len else {}))
        if self.backend != "hf":
            raise ValueError(f"unknown backend {self.backend!r}; expected hf or vllm")
        from esrepro.essa.engine import ESSAEngine

        return ESSAEngine(self.base_dir, self.adapter_dir, self.space_path, precision=self.precision,
                          dtype=self.dtype, device=self.device, batch_size=self.batch_size, chat=self.chat,
                          max_prompt_tokens=self.max_prompt_tokens)
