"""Picklable recipes of an engine and of the scoring, built inside whichever process evaluates members."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence


@dataclass(frozen=True)
class EngineSpec:
    """How to build one engine: backend, model, device, generation batch and the ES weight options."""

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
    gpu_memory_utilization: float = 0.8

    def build(self) -> Any:
        """The engine (this process sets torch's thread count first)."""
        import torch

        torch.set_num_threads(max(1, self.threads))
        weights = dict(noise=self.noise, restore=self.restore, master_weights=self.master_weights)
        if self.backend == "hf":
            from esrepro.backends.hf import HFEngine

            return HFEngine(self.model_dir, dtype=self.dtype, device=self.device, batch_size=self.batch_size,
                            chat=self.chat, max_prompt_tokens=self.max_prompt_tokens, **weights)
        if self.backend == "vllm":
            from esrepro.backends.vllm_engine import VLLMEngine

            return VLLMEngine(self.model_dir, dtype=self.dtype, tensor_parallel_size=self.tensor_parallel_size,
                              chat=self.chat, max_prompt_tokens=self.max_prompt_tokens,
                              gpu_memory_utilization=self.gpu_memory_utilization, **weights)
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
