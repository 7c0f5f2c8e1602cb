"""Picklable recipes of an engine and of the scoring, built inside whichever process evaluates members."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence


@dataclass(frozen=True)
class EngineSpec:
    """How to build one engine: backend, model, device, generation batch and path, and the ES weight options."""

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

    def build(self) -> Any:
        """The engine (this process sets torch's thread count first)."""
        import torch

        torch.set_num_threads(max(1, self.threads))
        weights = dict(noise=self.noise, restore=self.restore, master_weights=self.master_weights)
        if self.backend == "hf":
            from esrepro.backends.hf import HFEngine

            return HFEngine(self.model_dir, dtype=self.dtype, device=self.device, batch_size=self.batch_size,
                            chat=self.chat, max_prompt_tokens=self.max_prompt_tokens, generation=self.generation,
                            **weights)
        if self.backend == "vllm":
            from esrepro.backends.vllm_engine import VLLMEngine

            return VLLMEngine(self.model_dir, dtype=self.dtype, tensor_parallel_size=self.tensor_parallel_size,
                              chat=self.chat, max_prompt_tokens=self.max_prompt_tokens, device=self.device,
                              gpu_memory_utilization=self.gpu_memory_utilization,
                              kv_cache_memory_bytes=self.kv_cache_memory_bytes, call_timeout=self.call_timeout,
                              **weights)
        raise ValueError(f"unknown backend {self.backend!r}; expected hf or vllm")


@dataclass(frozen=True)
class Scoring:
    """What a member is scored on: the task (name and options), the training examples, the generation length."""

    task: str
    examples: list[dict]
    max_new_tokens: int
    options: dict = field(default_factory=dict)

    def build(self) -> tuple[list[str], Callable[..., float]]:
        """(prompts, mean reward of the responses to them); ``mean_reward(responses, batch)`` scores the responses
        to the prompts ``batch`` (indices; None: all of them, in order)."""
        from esrepro.tasks import get_task

        task = get_task(self.task, **self.options)
        prompts = [task.prompt(e) for e in self.examples]

        def mean_reward(responses: list[str], batch: Sequence[int] | None = None) -> float:
            import numpy as np

            examples = self.examples if batch is None else [self.examples[i] for i in batch]
            return float(np.mean([task.score(r, e).reward for r, e in zip(responses, examples, strict=True)]))

        return prompts, mean_reward


# --- ESSA -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ESSAEngineSpec:
    """How to build one ESSA engine: the base model, the SFT adapter and the saved singular value space.

    Every engine merges the same SFT adapter into the same base (``precision: native``) or
    keeps it unmerged on a bitsandbytes-quantised base (``int8``/``int4``, CUDA only), and
    loads the same saved factorisation, so candidates (flat vectors) are all that travels.
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
                                  kv_cache_memory_bytes=self.kv_cache_memory_bytes, max_loras=self.max_loras)
        if self.backend != "hf":
            raise ValueError(f"unknown backend {self.backend!r}; expected hf or vllm")
        from esrepro.essa.engine import ESSAEngine

        return ESSAEngine(self.base_dir, self.adapter_dir, self.space_path, precision=self.precision,
                          dtype=self.dtype, device=self.device, batch_size=self.batch_size, chat=self.chat,
                          max_prompt_tokens=self.max_prompt_tokens)


def score_examples(task: Any, examples: list[dict], responses: list[str], fitness: str) -> list[float]:
    """Per-example scores: the task's reward, or 1/0 for correct/wrong (``fitness: accuracy``)."""
    scores = [task.score(r, e) for r, e in zip(responses, examples, strict=True)]
    if fitness == "accuracy":
        return [1.0 if s.correct else 0.0 for s in scores]
    if fitness == "reward":
        return [float(s.reward) for s in scores]
    raise ValueError(f"fitness must be 'accuracy' or 'reward', got {fitness!r}")


@dataclass(frozen=True)
class IndexedScoring:
    """Candidates are scored on chosen examples of a fixed list (a generation's resampled subset, held-out ones)."""

    task: str
    examples: list[dict]
    max_new_tokens: int
    fitness: Literal["accuracy", "reward"] = "accuracy"
    options: dict = field(default_factory=dict)

    def build(self) -> tuple[list[str], Callable[[list[str], list[int]], list[float]]]:
        """(prompts of every example, per-example scores of the responses to the examples at ``indices``)."""
        from esrepro.tasks import get_task

        task = get_task(self.task, **self.options)
        prompts = [task.prompt(e) for e in self.examples]

        def scores(responses: list[str], indices: list[int]) -> list[float]:
            return score_examples(task, [self.examples[i] for i in indices], responses, self.fitness)

        return prompts, scores
