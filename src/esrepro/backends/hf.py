"""Transformers backend: batched greedy generation with ``model.generate``; :class:`HFEngine` adds ES weight ops."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Sequence

import torch

from esrepro.es.noise import NoiseVariant
from esrepro.es.weights import ESWeights, RestoreMode, hf_checksum
from esrepro.models.loading import load_model, load_tokenizer, save_checkpoint
from esrepro.models.responses import eos_token_ids
from esrepro.models.tokens import adds_special_tokens


class HFBackend:
    """A transformers causal LM and its tokenizer, on one device.

    Prompts are left-padded in batches of ``batch_size``; decoding is greedy
    (``do_sample=False``), so the output is a deterministic function of the weights, and
    stops at every end-of-sequence id of the model's generation config and tokenizer.
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
        self.eos_ids = sorted(eos_token_ids(self.tokenizer, self.model))
        if max_prompt_tokens is not None:
            self.tokenizer.truncation_side = "left"

    @classmethod
    def wrap(cls, model, tokenizer, device: str = "cpu", batch_size: int = 32, chat: bool = False,
             max_prompt_tokens: int | None = None) -> "HFBackend":
        """A backend around an already loaded model and tokenizer (e.g. a policy being trained by RL)."""
        self = cls.__new__(cls)
        self.tokenizer, self.model, self.device = tokenizer, model, device
        self.batch_size, self.chat, self.max_prompt_tokens, self.truncated = batch_size, chat, max_prompt_tokens, 0
        self.tokenizer.padding_side = "left"
        self.eos_ids = sorted(eos_token_ids(self.tokenizer, self.model))
        if max_prompt_tokens is not None:
            self.tokenizer.truncation_side = "left"
        return self

    def format_prompt(self, prompt: str) -> str:
        """The text the model sees for ``prompt`` (wrapped in the chat template when ``chat``)."""
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
            enc = self._encode([self.format_prompt(p) for p in prompts[start : start + self.batch_size]])
            gen = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=tok.pad_token_id,
                eos_token_id=self.eos_ids,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            out.extend(tok.batch_decode(new, skip_special_tokens=True))
        return out

    def _encode(self, texts: list[str]):
        tok = self.tokenizer
        special = adds_special_tokens(tok, texts)
        if self.max_prompt_tokens is None:
            return tok(texts, return_tensors="pt", padding=True, add_special_tokens=special).to(self.device)
        lengths = [len(ids) for ids in tok(texts, add_special_tokens=special)["input_ids"]]
        self.truncated += sum(n > self.max_prompt_tokens for n in lengths)
        return tok(
            texts, return_tensors="pt", padding=True, add_special_tokens=special,
            truncation=True, max_length=self.max_prompt_tokens,
        ).to(self.device)

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters in ``model.named_parameters()`` order (tied weights appear once)."""
        return [(n, p.data) for n, p in self.model.named_parameters()]

    def save(self, path: str | Path) -> None:
        """Save weights (safetensors) and tokenizer into ``path``."""
        save_checkpoint(self.model, self.tokenizer, path)


class HFEngine(HFBackend):
    """An ES engine on transformers: greedy generation plus in-place perturb / restore / update and a checksum."""

    def __init__(self, model_dir: str | Path, *, noise: NoiseVariant = "iid", restore: RestoreMode = "exact",
                 master_weights: Literal["float32"] | None = None, **backend: object) -> None:
        super().__init__(model_dir, **backend)
        self.weights = ESWeights([p for _, p in self.named_parameters()], noise, restore, master_weights)

    def perturb(self, seed: int, sigma: float) -> None:
        """theta += sigma * eps(seed), in place."""
        self.weights.perturb(seed, sigma)

    def restore(self, seed: int, sigma: float) -> None:
        """Undo :meth:`perturb` (exact copy or subtraction, per the restore mode)."""
        self.weights.restore(seed, sigma)

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> None:
        """theta += alpha / N * sum_n w_n * eps(seed_n)."""
        self.weights.apply_update(seeds, weights, alpha)

    def checksum(self) -> str:
        """sha256 of the HF weights (names, dtypes, shapes, bytes)."""
        return hf_checksum(self.named_parameters())

    def save_state(self, path: str | Path) -> None:
        """Write the resume tensors (weights and fp32 masters) to ``path`` (safetensors)."""
        from safetensors.torch import save_file

        save_file(self.weights.state(), str(path))

    def load_state(self, path: str | Path) -> None:
        """Set the weights (and masters) from :meth:`save_state`'s file."""
        from safetensors.torch import load_file

        self.weights.load_state(load_file(str(path)))
