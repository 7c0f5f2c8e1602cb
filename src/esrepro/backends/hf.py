"""Transformers backend: batched greedy generation; :class:`HFEngine` adds ES weight ops.

Three generation paths, chosen by ``generation`` (greedy, same stop ids, same BOS handling):

- ``default``: ``model.generate`` with a dynamic KV cache, prompts left-padded in batches.
- ``static``: the same batches with a static KV cache that this backend keeps (one per batch
  shape, zeroed before every call) and the forward pass of each decoding step compiled by
  transformers (``torch.compile``: CUDA graphs on CUDA, inductor's C++ kernels on CPU).
  Keeping the cache gives the compiled graphs fixed tensor addresses from call to call.
- ``continuous``: transformers' continuous batching (``init_continuous_batching``: paged
  attention, requests scheduled token by token, so finished responses free their slot). The
  manager is kept between calls (the cache is allocated once, CUDA graphs captured once);
  prefix sharing is off, since a cached prefix block would hold keys and values computed
  with weights ES has since changed.

ES changes the weights in place between calls (perturb, restore, update, load): compiled
graphs and CUDA graphs read the parameters by address, so they see the new values; no KV
state outlives a call. transformers 5.23's facts used here: ``generate(past_key_values=
StaticCache)`` uses a cache it is given (``generation/utils.py``, ``_prepare_cache_for_generation``)
and compiles the decoding forward when the cache is static and the device is CUDA, or any
device when ``compile_config._compile_all_devices`` is set (``_valid_auto_compile_criteria``);
``StaticCache.reset()`` zeroes keys, values and lengths; a continuous batching manager stopped
with ``keep_for_next_session=True`` is returned again by ``init_continuous_batching``; a
freed block stays reusable by content hash only when ``allow_block_sharing`` is on
(``continuous_batching/cache_allocators``); continuous batching drops logits processors it
cannot apply (``cb_logits_processors.py``), which this backend refuses instead.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Literal, Sequence, get_args

import torch

from esrepro.models.architecture import linear_weight_names
from esrepro.models.decoding import greedy_rule
from esrepro.models.loading import load_model, load_tokenizer, save_checkpoint
from esrepro.models.responses import eos_token_ids, response_mask
from esrepro.models.tokens import adds_special_tokens
from esrepro.perturb.lowrank import check_rank, lowrank_perturb_, lowrank_update_
from esrepro.perturb.noise import NoiseVariant, tensor_noise
from esrepro.perturb.ops import NoiseFn, perturb_, update_
from esrepro.perturb.weights import ESWeights, RestoreMode, hf_checksum
from esrepro.runtime.devices import noise_device, synchronize
from esrepro.settings.methods import Generation

GENERATION_MODES: tuple[str, ...] = get_args(Generation)


class HFBackend:
    """A transformers causal LM and its tokenizer, on one device.

    Prompts are left-padded in batches of ``batch_size`` (``continuous``: at most ``batch_size``
    requests run at once); decoding is greedy (``do_sample=False``), so the output is a
    deterministic function of the weights, and stops at every end-of-sequence id of the
    model's generation config and tokenizer. With ``chat=True`` each prompt is wrapped as a
    user turn by the tokenizer's chat template. With ``max_prompt_tokens`` longer prompts
    keep only their last tokens (for models whose context is shorter than a task's prompts);
    ``truncated`` counts them. ``generation`` picks the path (module docstring);
    ``generated_tokens`` counts the tokens generated so far (each response up to and
    including its end-of-sequence token).
    """

    def __init__(
        self,
        model_dir: str | Path,
        dtype: str = "float32",
        device: str = "cpu",
        batch_size: int = 32,
        chat: bool = False,
        max_prompt_tokens: int | None = None,
        generation: Generation = "default",
    ) -> None:
        if generation not in GENERATION_MODES:
            raise ValueError(f"unknown generation {generation!r}; expected one of {', '.join(GENERATION_MODES)}")
        tokenizer = load_tokenizer(model_dir)
        self._attach(self._load_model(model_dir, dtype, device), tokenizer, device, batch_size, chat, max_prompt_tokens,
                     generation)

    def _attach(self, model, tokenizer, device: str, batch_size: int, chat: bool, max_prompt_tokens: int | None,
                generation: Generation) -> None:
        """Set up generation around a loaded model and tokenizer (left padding and truncation, stop ids, caches)."""
        self.tokenizer, self.model, self.device = tokenizer, model, device
        self.tokenizer.padding_side = "left"
        self.batch_size = batch_size
        self.chat = chat
        self.max_prompt_tokens = max_prompt_tokens
        self.generation = generation
        self.truncated = 0
        self.generated_tokens = 0
        self.eos_ids = sorted(eos_token_ids(self.tokenizer, self.model))
        source = f"{getattr(self.model.config, 'name_or_path', '') or 'the model'}: generation_config"
        self.decoding = greedy_rule(self.model.generation_config.to_dict(), source)
        if max_prompt_tokens is not None:
            self.tokenizer.truncation_side = "left"
        self._static_caches: dict[tuple[int, int], object] = {}
        self._continuous_key: tuple[int, int] | None = None  # (requests, tokens per request) the cache holds
        if generation == "static":
            self._compile_config = _compile_config(self.model.device)

    def _load_model(self, model_dir: str | Path, dtype: str, device: str) -> torch.nn.Module:
        """The causal LM to generate with (a subclass may load it otherwise, e.g. with an adapter)."""
        return load_model(model_dir, dtype=dtype, device=device)

    #: transformers' ``synced_gpus`` for every generate call (None: transformers decides, on for a sharded model)
    synced_gpus: bool | None = None

    @classmethod
    def wrap(cls, model, tokenizer, device: str = "cpu", batch_size: int = 32, chat: bool = False,
             max_prompt_tokens: int | None = None, synced_gpus: bool | None = None) -> "HFBackend":
        """A backend around an already loaded model and tokenizer (e.g. a policy being trained by RL)."""
        self = cls.__new__(cls)
        self._attach(model, tokenizer, device, batch_size, chat, max_prompt_tokens, "default")
        self.synced_gpus = synced_gpus
        return self

    def format_prompt(self, prompt: str) -> str:
        """The text the model sees for ``prompt`` (wrapped in the chat template when ``chat``)."""
        if not self.chat:
            return prompt
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )

    def token_count(self) -> int:
        """Tokens generated since this backend was built (callable through a population worker's ``call``)."""
        return self.generated_tokens

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations of ``prompts``, in order."""
        texts = [self.format_prompt(p) for p in prompts]
        if self.generation == "continuous":
            # no_grad, not inference_mode: the manager's thread updates tensors it made here in place
            with torch.no_grad():
                rows = self._generate_continuous(texts, max_new_tokens)
        else:
            with torch.inference_mode():
                rows = self._generate_batched(texts, max_new_tokens)
        self.generated_tokens += sum(len(r) for r in rows)
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def _generation_config(self, max_new_tokens: int):
        """The model's generation config made greedy, with this backend's stop and pad ids (what it applies beyond
        argmax is :attr:`decoding`, checked at load: esrepro.models.decoding)."""
        config = copy.deepcopy(self.model.generation_config)
        config.update(max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
                      pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.eos_ids)
        return config

    def _generate_batched(self, texts: list[str], max_new_tokens: int) -> list[list[int]]:
        """``default`` and ``static``: ``model.generate`` per batch; each row cut after its first end-of-sequence id."""
        batches = [self._encode(texts[s : s + self.batch_size]) for s in range(0, len(texts), self.batch_size)]
        config = self._generation_config(max_new_tokens)
        extra: dict[str, object] = {}
        if self.generation == "static":
            config.compile_config = self._compile_config
            cache_len = max(b["input_ids"].shape[1] for b in batches) + max_new_tokens
        rows: list[list[int]] = []
        for enc in batches:
            if self.generation == "static":
                extra["past_key_values"] = self._static_cache(enc["input_ids"].shape[0], cache_len)
            gen = self.model.generate(**enc, generation_config=config, synced_gpus=self.synced_gpus, **extra)
            new = gen[:, enc["input_ids"].shape[1] :]
            keep = response_mask(new, set(self.eos_ids)).sum(dim=1).tolist()
            rows.extend(row[:n] for row, n in zip(new.tolist(), keep, strict=True))
        return rows

    def _static_cache(self, batch: int, length: int):
        """A zeroed static KV cache for ``batch`` rows of ``length`` tokens: the one kept for that shape, if any.

        Caches of other lengths are dropped (a new prompt set); at most one per batch size is kept.
        """
        from transformers import StaticCache

        if torch._inductor.config.freezing:
            raise RuntimeError("generation 'static' needs torch._inductor.config.freezing off: frozen graphs hold "
                               "the weights as constants and would not see ES perturbations")
        key = (batch, length)
        cache = self._static_caches.get(key)
        if cache is None:
            self._static_caches = {k: c for k, c in self._static_caches.items() if k[1] == length}
            cache = self._static_caches[key] = StaticCache(config=self.model.config, max_cache_len=length)
        else:
            cache.reset()
        return cache

    def _generate_continuous(self, texts: list[str], max_new_tokens: int) -> list[list[int]]:
        """``continuous``: each prompt a request to the kept continuous-batching manager; outputs in prompt order."""
        ids: list[list[int]] = []
        for start in range(0, len(texts), self.batch_size):
            ids.extend(self._token_ids(texts[start : start + self.batch_size]))
        manager = self._continuous_manager(ids, max_new_tokens)
        manager.start()
        results: dict[str, object] = {}
        try:
            request_ids = manager.add_requests(inputs=ids, max_new_tokens=max_new_tokens)
            while len(results) < len(request_ids):
                out = manager.get_result(timeout=1)
                if out is None:
                    if not manager.is_running():
                        break
                    continue
                if out.is_finished():
                    results[out.request_id] = out
        finally:
            manager.stop(block=True, keep_for_next_session=True)
        failed = [f"{r}: {results[r].error if r in results else 'no result'}" for r in request_ids
                  if r not in results or results[r].error is not None]
        if failed:
            self.model.destroy_cached_continuous_batching_manager()
            self._continuous_key = None
            raise RuntimeError(f"continuous batching failed for {len(failed)} of {len(ids)} prompts: {failed[:3]}")
        return [list(results[r].generated_tokens) for r in request_ids]

    def _continuous_manager(self, ids: list[list[int]], max_new_tokens: int):
        """The kept continuous-batching manager; rebuilt when a workload outgrows its cache (sized to hold every
        request of the workload at once: no eviction, no more memory than that)."""
        from transformers import ContinuousBatchingConfig

        concurrent = min(len(ids), self.batch_size)
        tokens = max(len(x) for x in ids) + max_new_tokens
        if self._continuous_key is None or concurrent > self._continuous_key[0] or tokens > self._continuous_key[1]:
            self.model.destroy_cached_continuous_batching_manager()
            self._continuous_key = (concurrent, tokens)
        concurrent, tokens = self._continuous_key
        config = self._generation_config(max_new_tokens)
        self._check_continuous_processors(config)
        page = 256 if self.model.device.type == "cuda" else 32
        cb_config = ContinuousBatchingConfig(
            page_size=page,
            num_blocks=concurrent * (math.ceil(tokens / page) + 1),
            max_requests_per_batch=concurrent,
            allow_block_sharing=False,
            drop_unsupported_processors=False,
        )
        manager = self.model.init_continuous_batching(generation_config=config, continuous_batching_config=cb_config)
        if not manager.warmed_up:
            manager.warmup()
        return manager

    def _check_continuous_processors(self, config) -> None:
        """Refuse logits processors continuous batching cannot apply (e.g. a repetition penalty in the model's
        generation_config.json): it would silently generate other tokens than the batched paths."""
        processors = self.model._get_logits_processor(config)
        unsupported = [type(p).__name__ for p in processors
                       if getattr(p, "supports_continuous_batching", None) is False]
        if unsupported:
            raise ValueError(
                f"generation 'continuous' cannot apply {', '.join(unsupported)} (set by the model's generation "
                "config); use generation 'default' or 'static' for this model"
            )

    def _tokenize(self, texts: list[str], **kwargs):
        """``texts`` through the tokenizer: BOS per its template, left truncation to ``max_prompt_tokens`` (counted)."""
        tok = self.tokenizer
        special = adds_special_tokens(tok, texts)
        if self.max_prompt_tokens is None:
            return tok(texts, add_special_tokens=special, **kwargs)
        lengths = [len(ids) for ids in tok(texts, add_special_tokens=special)["input_ids"]]
        self.truncated += sum(n > self.max_prompt_tokens for n in lengths)
        return tok(texts, add_special_tokens=special, truncation=True, max_length=self.max_prompt_tokens, **kwargs)

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of ``texts``, unpadded."""
        return self._tokenize(texts)["input_ids"]

    def _encode(self, texts: list[str]):
        """``texts`` left-padded into tensors on the model's device."""
        return self._tokenize(texts, return_tensors="pt", padding=True).to(self.device)

    def synchronize(self) -> None:
        """Wait for the model's queued device work (a clock read after it times the work, not its launch)."""
        synchronize(self.model.device)

    def noise_device(self) -> str:
        """The device ES noise for this model is generated on (:func:`esrepro.runtime.devices.noise_device`)."""
        return noise_device(self.model.device)

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters in ``model.named_parameters()`` order (tied weights appear once)."""
        return [(n, p.data) for n, p in self.model.named_parameters()]

    def save(self, path: str | Path) -> None:
        """Save weights (safetensors) and tokenizer into ``path``."""
        save_checkpoint(self.model, self.tokenizer, path)


def _compile_config(device: torch.device):
    """How ``static`` compiles the decoding step: transformers' default on CUDA (inductor, CUDA graphs),
    inductor without CUDA graphs elsewhere (``_compile_all_devices`` is transformers' switch for that)."""
    from transformers import CompileConfig

    if device.type == "cuda":
        return CompileConfig()
    config = CompileConfig(mode="default")
    config._compile_all_devices = True
    return config


def _keyed(indices: Sequence[int], variant: NoiseVariant) -> NoiseFn:
    """The noise of a subset of the parameters, each keyed by its index among all of them (``indices[k]`` for the
    k-th of the subset): the numbers every-parameter ES draws for those tensors."""
    return lambda k, p, seed, gen: tensor_noise(p, seed, indices[k], variant, gen)


class HFEngine(HFBackend):
    """An ES engine on transformers: greedy generation plus in-place perturb / restore / update and a checksum.

    ``rank``: None, full-rank ES noise on every parameter (``noise_on`` "all") or on the decoder blocks' linear
    weights only ("linear", each keyed by its own index as if every parameter were perturbed); r, low-rank (EGGROLL)
    noise of rank r on those linear weights only (:mod:`esrepro.perturb.lowrank`), written into the weights in place
    (W + sigma A Bᵀ / √r) and restored as ES restores.
    """

    def __init__(self, model_dir: str | Path, *, noise: NoiseVariant = "iid", restore: RestoreMode = "exact",
                 master_weights: Literal["float32"] | None = None, rank: int | None = None, noise_on: str = "all",
                 **backend: object) -> None:
        if noise_on not in ("all", "linear"):
            raise ValueError(f"noise_on {noise_on!r}: all or linear")
        super().__init__(model_dir, **backend)
        named = self.named_parameters()
        params = [p for _, p in named]
        if rank is None and noise_on == "linear":
            wanted = linear_weight_names(self.model)
            keep = [k for k, (n, _) in enumerate(named) if n in wanted]
            self.weights = ESWeights(
                params, noise, restore, master_weights,
                perturb_fn=lambda ps, seed, sigma, variant: perturb_(
                    [ps[k] for k in keep], seed, sigma, variant, noise=_keyed(keep, variant)),
                update_fn=lambda ps, seeds, ws, alpha, variant, masters: update_(
                    [ps[k] for k in keep], seeds, ws, alpha, variant,
                    None if masters is None else [masters[k] for k in keep], noise=_keyed(keep, variant)))
        elif rank is None:
            self.weights = ESWeights(params, noise, restore, master_weights)
        else:
            wanted = linear_weight_names(self.model)  # the decoder blocks' linear layers, whatever the architecture
            targets = [k if n in wanted else None for k, (n, _) in enumerate(named)]
            check_rank(rank, {n: tuple(p.shape) for (n, p), k in zip(named, targets, strict=True) if k is not None})
            self.weights = ESWeights(
                params, noise, restore, master_weights,
                perturb_fn=lambda ps, seed, sigma, variant: lowrank_perturb_(ps, targets, seed, sigma, rank, variant),
                update_fn=lambda ps, seeds, ws, alpha, variant, masters: lowrank_update_(
                    ps, targets, seeds, ws, alpha, rank, variant, masters))

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

        from esrepro.io import reading

        with reading(path, "the resume weights"):
            tensors = load_file(str(path))
        self.weights.load_state(tensors)
