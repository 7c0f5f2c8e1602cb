"""Transformers backend: batched greedy generation with ``model.generate``."""

from __future__ import annotations

from pathlib import Path

import torch

from esrepro.models.loading import load_model, load_tokenizer, save_checkpoint


class HFBackend:
    """A transformers causal LM and its tokenizer, on one device.

    Prompts are left-padded in batches of ``batch_size``; decoding is greedy
    (``do_sample=False``), so the output is a deterministic function of the weights.
    With ``chat=True`` each prompt is wrapped as a user turn by the tokenizer's chat template.
    With ``max_prompt_tokens`` longer prompts keep only their last tokens (for models
    whose context is shorter than a task's prompts); ``truncated`` counts them.
    """

    def __init__(
        self,
        model_dir: str | Path,
        dtype: str = "float32",
        device: str = "cpu",
        batch_size: int = 32,
        chat: bool = False,
        max_prompt_tokens: int | None = None,
    ) -> None:
        self.tokenizer = load_tokenizer(model_dir)
        self.tokenizer.padding_side = "left"
        self.model = load_model(model_dir, dtype=dtype, device=device)
        self.device = device
        self.batch_size = batch_size
        self.chat = chat
        self.max_prompt_tokens = max_prompt_tokens
        self.truncated = 0
        if max_prompt_tokens is not None:
            self.tokenizer.truncation_side = "left"

    def format_prompt(self, prompt: str) -> str:
        """The text the model sees for ``prompt`` (wrapped in the chat template when ``chat``)."""
        return self._format(prompt)

    def _format(self, prompt: str) -> str:
        if not self.chat:
            return prompt
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )

    @torch.inference_mode()
    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations of ``prompts``, in order."""
        out: list[str] = []
        tok = self.tokenizer
        for start in range(0, len(prompts), self.batch_size):
            chunk = [self._format(p) for p in prompts[start : start + self.batch_size]]
            enc = self._encode(chunk)
            gen = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            out.extend(tok.batch_decode(new, skip_special_tokens=True))
        return out

    def _encode(self, texts: list[str]):
        tok = self.tokenizer
        if self.max_prompt_tokens is None:
            return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        lengths = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
        self.truncated += sum(n > self.max_prompt_tokens for n in lengths)
        return tok(
            texts, return_tensors="pt", padding=True, add_special_tokens=False,
            truncation=True, max_length=self.max_prompt_tokens,
        ).to(self.device)

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters in ``model.named_parameters()`` order (tied weights appear once)."""
        return [(n, p.data) for n, p in self.model.named_parameters()]

    def save(self, path: str | Path) -> None:
        """Save weights (safetensors) and tokenizer into ``path``."""
        save_checkpoint(self.model, self.tokenizer, path)
