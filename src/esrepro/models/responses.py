"""Where a generated response ends: its end-of-sequence ids and the mask of its tokens."""

from __future__ import annotations

from typing import Any

import torch


def eos_token_ids(tokenizer: Any, model: Any) -> set[int]:
    """Every end-of-sequence id the model's generation config or the tokenizer names."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(src, "eos_token_id", None)
        if eos is None:
            continue
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return ids


def response_mask(tokens: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """True for each response token up to and including its first end-of-sequence token (``[n, L]``)."""
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=tokens.device)
    is_eos = torch.isin(tokens, eos).long()
    # a position is in the response if no end-of-sequence token came strictly before it
    return (torch.cumsum(is_eos, dim=1) - is_eos) == 0
