"""The Backend seam: batched greedy generation plus in-place access to the parameters.

The ES loop perturbs what ``named_parameters`` returns, calls ``generate``, and
restores; it never knows whether transformers or vLLM sits behind the seam.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch


class Backend(Protocol):
    """What training and evaluation need from a generation engine."""

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations of ``prompts`` (prompt text excluded, special tokens dropped)."""
        ...

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """The model's parameters, in a fixed order, as tensors that may be changed in place."""
        ...

    def save(self, path: str | Path) -> None:
        """Write the current weights and tokenizer as a transformers checkpoint."""
        ...
