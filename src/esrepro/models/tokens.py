"""How prompts become token ids: BOS exactly when the tokenizer's template adds one, and every EOS id.

Llama tokenizers prepend ``<|begin_of_text|>`` through their post-processor (as the
authors' transformers and vLLM runs do: both tokenize with special tokens); Qwen's add
nothing. A prompt already rendered by a chat template starts with the BOS token itself,
and then no second one is added.
"""

from __future__ import annotations

from typing import Any, Sequence


def adds_special_tokens(tokenizer: Any, texts: Sequence[str]) -> bool:
    """Whether to let the tokenizer add its special tokens (BOS) to ``texts``: not when they already start with BOS."""
    bos = getattr(tokenizer, "bos_token", None)
    return not (bos and texts and all(t.startswith(bos) for t in texts))


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of one prompt, BOS as the tokenizer's template says."""
    return tokenizer(text, add_special_tokens=adds_special_tokens(tokenizer, [text]))["input_ids"]
