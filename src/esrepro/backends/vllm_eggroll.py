"""Low-rank ES (EGGROLL) on vLLM: every member a LoRA adapter, a whole population scored in one ``generate`` call.

Member ``seed`` perturbs each linear projection W by sigma A Bᵀ / √r (:mod:`esrepro.perturb.lowrank`): that is a
rank-r LoRA adapter (:func:`esrepro.perturb.adapter.write_member_adapter`: lora_A = Bᵀ, lora_B = A, scaling
sigma / √r). The workers draw each member's factors and write its adapter, on their weights' device, by the
generator that the update draws them again with, so the update moves along the noise that was scored (CUDA's
``randn`` gives other numbers than the CPU's for one seed). :class:`EggrollVLLMEngine` is the ES vLLM engine
(:class:`esrepro.backends.vllm_engine.VLLMEngine`) built with LoRA slots: its members are written as adapters
and generated under together through the multi-LoRA piece ESSA's candidates use
(:class:`esrepro.backends.vllm_lora.AdapterBatch`), so the base weights are never perturbed; only the update
changes them, pushed into vLLM's workers as seeds and weights exactly as ES pushes its update (the workers
regenerate the factors of each of their shards, :func:`esrepro.backends.vllm_layout.lowrank_update_shards_`).
Checksums, checkpoints and resume files are the ES engine's (HF layout), so a run
resumes on either backend.

Numerics: vLLM computes ``W h + (sigma / √r) A (Bᵀ h)`` in the model's dtype where the transformers engine
writes ``W + sigma A Bᵀ / √r`` into the weights; both are the member's weights to float rounding
(tests/test_eggroll_vllm.py compares their greedy outputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from esrepro.backends.vllm_engine import VLLMEngine, encode_prompt, greedy_params
from esrepro.backends.vllm_layout import hf_parameters
from esrepro.backends.vllm_lora import AdapterBatch, lora_llm_kwargs
from esrepro.models.architecture import linear_weight_names, meta_model
from esrepro.perturb.adapter import Target


def lowrank_targets(model_dir: str | Path) -> list[Target]:
    """(name, index, shape) of the HF weights that take low-rank noise (the decoder blocks' linear layers,
    :func:`esrepro.models.architecture.linear_weight_names`), indexed as ``named_parameters()`` is."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    wanted = linear_weight_names(meta_model(config))
    return [(t.name, t.index, t.shape) for t in hf_parameters(config) if t.name in wanted]


class EggrollVLLMEngine(VLLMEngine):
    """The ES vLLM engine whose members are LoRA adapters of rank ``rank`` (``max_loras`` of them per batch; None: 1,
    the training step passes the method's ``max_loras`` or its population).

    ``prepare_members`` / ``load_members`` / ``generate_members`` / ``release_members`` score many members in one
    ``generate`` call (:meth:`esrepro.population.worker.PopulationWorker.members` uses them); ``perturb`` /
    ``restore`` carry one member's adapter for :meth:`generate`, leaving the weights as they are. As no member is
    written into the weights, the workers keep no exact-restore copy of them whatever ``restore`` says (float32
    masters with ``master_weights``, as ES keeps them).
    """

    def __init__(self, model_dir: str | Path, *, rank: int, max_loras: int | None = None, noise: str = "iid",
                 restore: str = "subtract", **engine: Any) -> None:
        self.rank, self.variant = int(rank), noise
        self.max_loras = int(max_loras or 1)
        del restore  # no member is ever written into the weights: the workers keep no exact-restore copy
        super().__init__(model_dir, noise=noise, lowrank=self.rank, restore="subtract",
                         **lora_llm_kwargs(self.max_loras, self.rank), **engine)
        # the targets as the workers read them off the model (a class vLLM serves through transformers is rebuilt
        # only inside a vLLM config once an engine holds it)
        self.targets = [(t.name, t.index, t.shape) for t in self.layout.hf if t.name in self.linear_weights]
        self.adapters = AdapterBatch(self.llm, prefix="eggroll_vllm_")
        self._current: tuple[int, float, Any] | None = None  # (seed, sigma, request) of the carried member

    # --- many members in one call -------------------------------------------------------------

    def prepare_members(self, seeds: Sequence[int], sigma: float) -> list[Any]:
        """Have the workers write each member's adapter (:meth:`write_member_adapter`); their LoRA requests."""
        def writer(seed: int) -> Callable[[Path], None]:
            return lambda path: self.write_member_adapter(path, int(seed), float(sigma))

        return [self.adapters.add(f"m{int(seed)}", writer(seed)) for seed in seeds]

    def write_member_adapter(self, path: str | Path, seed: int, sigma: float) -> None:
        """Member ``seed``'s adapter, written into ``path`` by the workers: its factors are drawn on the device of the
        weights, by the generator that the update regenerates them with
        (:meth:`esrepro.backends.vllm_engine.ESWorkerExtension.es_write_member_adapter`)."""
        written = self._rpc("es_write_member_adapter", str(path), self.targets, int(seed), float(sigma), self.rank,
                            self.variant, str(self.model_dir))
        if sum(bool(w) for w in written) != 1:
            raise RuntimeError(f"expected one rank to write member {seed}'s adapter, got {written}")

    def load_members(self, requests: Sequence[Any]) -> None:
        """Have vLLM load the members' adapters before :meth:`generate_members` (so that generating no longer includes
        loading them): the first ``max_loras`` of them, as many as its adapter cache holds; any beyond are loaded by
        vLLM during the generation, as they would be without this step."""
        self.adapters.load(list(requests)[:self.max_loras])

    def generate_members(self, requests: Sequence[Any], prompts: list[str], max_new_tokens: int) -> list[list[str]]:
        """Greedy continuations of ``prompts`` under every member's adapter, in one ``LLM.generate`` call; per
        member, the responses in prompt order."""
        ids = []
        for p in prompts:  # truncations counted per member, as the ES engine counts them per generate call
            row, cut = encode_prompt(self.tokenizer, p, self.chat, self.max_prompt_tokens)
            self.truncated += cut * len(requests)
            ids.append(row)
        params = greedy_params(max_new_tokens, self.stop_ids, self.decoding)
        per_member = self.adapters.generate(requests, ids, params)
        self.generated_tokens += sum(len(r) for rows in per_member for r in rows)
        return [self.tokenizer.batch_decode(rows, skip_special_tokens=True) for rows in per_member]

    def release_members(self, requests: Sequence[Any]) -> None:
        """Drop the members' adapters from vLLM and disk."""
        self.adapters.release(requests)

    # --- one member at a time (the ES engine's interface) ------------------------------------

    def perturb(self, seed: int, sigma: float) -> None:
        """Carry member ``seed``'s adapter for :meth:`generate` (the weights are not touched)."""
        if self._current is not None:
            raise RuntimeError(f"member {self._current[0]} is still carried; restore first")
        self._current = (int(seed), float(sigma), self.prepare_members([seed], sigma)[0])

    def restore(self, seed: int, sigma: float) -> None:
        """Drop member ``seed``'s adapter."""
        if self._current is None or self._current[:2] != (int(seed), float(sigma)):
            raise RuntimeError(f"restore({seed}, {sigma}) but the carried member is {self._current and self._current[:2]}")
        request, self._current = self._current[2], None
        self.release_members([request])

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations under the carried member's adapter, else the base weights."""
        if self._current is None:
            return super().generate(prompts, max_new_tokens)
        return self.generate_members([self._current[2]], prompts, max_new_tokens)[0]

    def close(self) -> None:
        self.adapters.close()
