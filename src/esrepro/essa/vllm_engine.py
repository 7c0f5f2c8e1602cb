"""An ESSA engine on vLLM: the base model loaded once, every candidate a LoRA adapter, candidates batched.

The transformers engine (:class:`~esrepro.essa.engine.ESSAEngine`) merges the SFT adapter into
the base and scores one candidate at a time (apply in place, generate, restore). Here vLLM
holds the *unmerged* base, and a candidate ``x`` is the peft adapter
``space.adapter_factors(x)`` (:func:`esrepro.essa.export.save_adapter`: the SFT adapter's
config, rank and scaling, the candidate's singular values); vLLM serves many adapters in one
batch (``LLM(enable_lora=True)``, one ``LoRARequest`` per prompt), so all of an engine's
candidates are generated in one ``LLM.generate`` call (:meth:`ESSAVLLMEngine.prepare_candidates`,
:meth:`~ESSAVLLMEngine.generate_candidates`, :meth:`~ESSAVLLMEngine.release_candidates`, which
:meth:`esrepro.population.worker.PopulationWorker.candidates` uses when an engine has them).

Numerics: the transformers engine computes ``(W_base + dW_sft + dW_x) h`` with the merged
weight rounded to the dtype; vLLM computes ``W_base h + scaling B'(A' h)`` in the LoRA dtype
(the model's). Both equal the candidate's weights to float rounding, not bit for bit, so a
greedy token can flip where two logits are within rounding of each other. tests/test_essa_vllm.py
measures it on the tiny model: none in float32, a few percent of responses in bfloat16.

The adapters are served by the multi-LoRA piece ES's low-rank members share
(:class:`esrepro.backends.vllm_lora.AdapterBatch`, whose docstring lists the vLLM API used). An adapter holds the
modules the SFT adapted, read off the architecture (the setting ``lora_targets``,
:func:`esrepro.essa.lora.lora_target_modules`), under the transformers model's names; vLLM maps them onto its own
layers through the model class's ``packed_modules_mapping`` (``vllm/lora/model_manager.py``,
``_register_packed_modules``, lines 825-836), so any model class with vLLM LoRA support serves them as they are.
Qwen2, Qwen3 and Llama pack q, k and v into ``qkv_proj`` and gate and up into ``gate_up_proj``
(``vllm/model_executor/models/qwen2.py`` lines 462-465, ``qwen3.py`` 284-287, ``llama.py`` 475-478): their q, k,
v and o adapters are packed into those layers' slices. Phi-3's checkpoint is fused already and its mapping names
``qkv_proj`` and ``gate_up_proj`` as themselves (``phi3.py`` lines 11-18): its ``qkv_proj`` adapter is one slice of
vLLM's ``QKVParallelLinearWithLoRA`` (``vllm/lora/layers/column_parallel_linear.py`` lines 388 and 440-450).

Quantised bases (ESSA Sec. 4.3 and Fig. 9: INT8/INT4 through bitsandbytes, inference on vLLM). vLLM 0.32.0 has no
bitsandbytes in its core: ``quantization="bitsandbytes"`` is not among ``QuantizationMethods``
(``vllm/model_executor/layers/quantization/__init__.py``, lines 15-49) nor ``load_format="bitsandbytes"`` among
``LoadFormats`` (``vllm/model_executor/model_loader/__init__.py``, lines 33-49), and ``ModelConfig`` refuses it
("Unknown quantization method", ``vllm/config/model.py`` lines 1451-1455): vLLM 0.28.0 moved it to the
vllm-project's out-of-tree ``vllm-bnb-plugin`` (vllm-project/vllm#43529), which vLLM loads through its
``vllm.general_plugins`` entry point in every process (``vllm/engine/arg_utils.py`` line 906,
``vllm/v1/worker/worker_base.py`` line 276) and which registers the quantisation and the loader again
(``vllm_bnb_plugin/__init__.py`` lines 59-70, release 0.0.3). What that plugin serves:

- 4-bit: an unquantised checkpoint quantised as it loads, NF4 with double quantisation
  (``bitsandbytes_loader.py``, ``_unquantized_generator``: ``quantize_4bit(..., compress_statistics=True,
  quant_type="nf4")``), any tensor-parallel size, CUDA graphs on. ``int4`` runs here with
  :func:`quantization_llm_kwargs`.
- 8-bit: only a checkpoint saved already quantised (its ``config.json`` ``quantization_config`` with
  ``load_in_8bit``; the loader's in-flight path quantises to 4 bits only, lines 245-257 and 382-490), not under
  tensor parallelism (lines 600-605), in eager mode (``__init__.py`` lines 14-25). ``int8`` stays on the
  transformers engine, which quantises LLM.int8() as it loads.
- LoRA: vLLM's LoRA layers wrap any quantised linear layer, calling its method's ``apply`` and adding the
  adapter's product (``vllm/lora/layers/base_linear.py`` lines 190-211; the adapters' device from the layer's
  ``weight``, ``vllm/lora/layers/utils.py`` lines 45-53, which bitsandbytes' packed weight is); the model needs a
  ``packed_modules_mapping`` (plugin loader lines 580-590), which every model class with vLLM LoRA support has
  (above). Neither vLLM's nor the plugin's tests run LoRA over a bitsandbytes base; tests/test_essa_vllm.py
  does, on vLLM's CPU build with bitsandbytes' CPU backend (0.50.2 quantises and multiplies NF4 on a CPU), and
  checks the engine's arguments against vLLM's own validation. The paper's runs use bitsandbytes' CUDA kernels,
  which no test here reaches.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from esrepro.backends.vllm_lora import LORA_RANKS, AdapterBatch, lora_llm_kwargs, lora_rank_slot

__all__ = ["ESSAVLLMEngine", "LORA_RANKS", "essa_llm_kwargs", "lora_rank_slot", "quantization_llm_kwargs"]

#: The precisions this engine serves (:func:`quantization_llm_kwargs`).
VLLM_PRECISIONS = ("native", "int4")
#: The module vLLM 0.32.0 needs for a bitsandbytes base (the vllm-project's ``vllm-bnb-plugin``).
BNB_PLUGIN = "vllm_bnb_plugin"


def quantization_llm_kwargs(precision: str) -> dict:
    """vLLM's arguments for the base in ``precision``: none for ``native`` (the registry dtype); ``int4``: the base
    quantised by bitsandbytes as it loads (NF4, the vllm-bnb-plugin's in-flight path). ``int8`` is refused: the
    plugin reads 8-bit weights only from a checkpoint saved quantised (module docstring)."""
    if precision == "native":
        return {}
    if precision == "int4":
        return {"quantization": "bitsandbytes", "load_format": "bitsandbytes"}
    if precision == "int8":
        raise ValueError("ESSA setting precision: int8 runs on the hf backend only: vLLM's bitsandbytes plugin "
                         "quantises to 8 bits only checkpoints saved already quantised, not a base as it loads")
    raise ValueError(f"ESSA setting precision: {precision!r} is not one of {', '.join(VLLM_PRECISIONS)} "
                     "(the vllm backend)")


def essa_llm_kwargs(base_dir: str | Path, *, rank: int, precision: str = "native", dtype: str = "float32",
                    tensor_parallel_size: int = 1, seed: int = 0, gpu_memory_utilization: float = 0.85,
                    max_loras: int = 16, **llm_kwargs: Any) -> dict:
    """The arguments :class:`ESSAVLLMEngine` gives ``vllm.LLM`` (and ``vllm.engine.arg_utils.EngineArgs``): the
    base, its dtype and precision, and LoRA slots for ``max_loras`` adapters of rank up to ``rank``."""
    return dict(model=str(base_dir), dtype=dtype, tensor_parallel_size=tensor_parallel_size, seed=seed,
                gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=False, skip_tokenizer_init=True,
                **lora_llm_kwargs(max_loras, rank), **quantization_llm_kwargs(precision), **llm_kwargs)


class ESSAVLLMEngine:
    """The SFT model of an ESSA run on vLLM: the interface of :class:`~esrepro.essa.engine.ESSAEngine`
    (``apply`` / ``generate`` / ``restore``, ``checksum``, ``save_candidate``, ``synchronize``, ``noise_device``,
    ``decoding``), plus batched candidates.

    ``max_loras``: adapters vLLM holds in one batch (its LoRA slots; more candidates per call are scheduled in turn).
    ``precision``: ``native`` (the base in the registry dtype) or ``int4`` (bitsandbytes NF4 through the
    vllm-bnb-plugin; on a GPU for the paper, on the CPU build for the tests); ``int8`` runs on the transformers
    engine (module docstring).
    """

    def __init__(self, base_dir: str | Path, adapter_dir: str | Path, space_path: str | Path, *,
                 precision: str = "native", dtype: str = "float32", device: str = "cpu", chat: bool = False,
                 max_prompt_tokens: int | None = None, seed: int = 0, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.85, kv_cache_memory_bytes: int | None = None,
                 max_loras: int = 16, call_timeout: float | None = None, batch_size: int | None = None,
                 **llm_kwargs: Any) -> None:
        from esrepro.backends.vllm_engine import platform_llm_kwargs, stop_token_ids
        from esrepro.essa.lora import ADAPTER_WEIGHTS
        from esrepro.essa.svd import SingularValueSpace
        from esrepro.models.decoding import model_greedy_rule
        from esrepro.models.loading import DTYPES, load_tokenizer

        del batch_size, call_timeout  # vLLM schedules its own batches; the engine core runs in this process
        quantization_llm_kwargs(precision)  # refuses int8 and unknown precisions before anything loads
        if precision != "native":  # CUDA, or vLLM's CPU build on bitsandbytes' CPU backend (the tests)
            from importlib.util import find_spec

            if find_spec(BNB_PLUGIN) is None or find_spec("bitsandbytes") is None:
                raise ValueError(f"ESSA setting precision: {precision} on the vllm backend needs bitsandbytes and "
                                 "vLLM's bitsandbytes plugin (pip install 'esrepro[vllm,quant]')")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
        self.base_dir, self.adapter_dir, self.space_path = Path(base_dir), Path(adapter_dir), Path(space_path)
        if not (self.base_dir / "config.json").exists():
            raise FileNotFoundError(f"no model in {self.base_dir} (missing config.json)")
        if not (self.adapter_dir / ADAPTER_WEIGHTS).exists():
            raise FileNotFoundError(f"no LoRA adapter in {self.adapter_dir} (missing {ADAPTER_WEIGHTS})")
        self.precision, self.dtype, self.device = precision, dtype, device
        self.space = SingularValueSpace.load(self.space_path)
        rank = max(s.rank for s in self.space.svds.values())
        platform_llm_kwargs(device, kv_cache_memory_bytes, llm_kwargs)
        from vllm import LLM

        self.tokenizer = load_tokenizer(self.base_dir)
        self.stop_ids = stop_token_ids(self.base_dir, self.tokenizer)
        self.decoding = model_greedy_rule(self.base_dir)
        self.chat, self.max_prompt_tokens = chat, max_prompt_tokens
        self.truncated = 0
        self.generated_tokens = 0
        self.max_loras = int(max_loras)
        self.llm = LLM(**essa_llm_kwargs(self.base_dir, rank=rank, precision=precision, dtype=dtype,
                                         tensor_parallel_size=tensor_parallel_size, seed=seed,
                                         gpu_memory_utilization=gpu_memory_utilization, max_loras=self.max_loras,
                                         **llm_kwargs))
        self.adapters = AdapterBatch(self.llm, prefix="essa_vllm_")
        self._sft = self.adapters.request("sft", self.adapter_dir)  # id 1, never released
        self._current: Any = None  # the applied candidate's request (None: the SFT adapter)

    # --- the ESSAEngine interface -------------------------------------------------------------

    def noise_device(self) -> str:
        """Where candidates come from: the driver's numpy CMA-ES (this engine draws no noise); the device type."""
        from esrepro.runtime.devices import noise_device

        return noise_device("cuda" if self.device.startswith("cuda") else "cpu")

    def synchronize(self) -> None:
        """Nothing is queued once ``LLM.generate`` returns (it returns finished outputs)."""

    def token_count(self) -> int:
        """Tokens generated since this engine was built."""
        return self.generated_tokens

    def apply(self, x: np.ndarray) -> None:
        """Carry candidate x (replacing any earlier one): its adapter is written and used by :meth:`generate`."""
        self.restore()
        self._current = self.prepare_candidates([x])[0]

    def restore(self) -> None:
        """Back to the SFT adapter (the candidate's adapter is dropped from vLLM and disk)."""
        if self._current is not None:
            current, self._current = self._current, None
            self.release_candidates([current])

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations of ``prompts`` under the applied candidate (else the SFT adapter)."""
        return self.generate_candidates([self._current or self._sft], prompts, max_new_tokens)[0]

    def checksum(self) -> str:
        """sha256 over what every engine of a run must share: the base's safetensors, the SFT adapter's weights and
        the saved space (bytes of the files; not the transformers engine's merged-weights checksum)."""
        from esrepro.essa.lora import ADAPTER_WEIGHTS

        h = hashlib.sha256()
        files = sorted(self.base_dir.glob("*.safetensors")) + [self.adapter_dir / ADAPTER_WEIGHTS, self.space_path]
        for f in files:
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()

    def save_candidate(self, x: np.ndarray, path: str | Path) -> None:
        """Write candidate x as a transformers checkpoint: its adapter merged into the base in the engine's dtype
        (native: what vLLM scored, to float rounding; int4: the unquantised base, as the transformers engine writes
        its quantised runs), :func:`esrepro.essa.export.save_merged_from_base`."""
        from esrepro.essa.export import save_merged_from_base

        save_merged_from_base(self.space, np.asarray(x, dtype=np.float64), self.adapter_dir, self.base_dir, path,
                              dtype=self.dtype)

    # --- batched candidates -------------------------------------------------------------------

    def prepare_candidates(self, xs: Sequence[np.ndarray]) -> list[Any]:
        """Write each candidate's adapter (:func:`~esrepro.essa.export.save_adapter`); their LoRA requests."""
        from esrepro.essa.export import save_adapter

        def writer(x: np.ndarray):
            return lambda path: save_adapter(self.space, np.asarray(x, dtype=np.float64), self.adapter_dir, path)

        return [self.adapters.add("c", writer(x)) for x in xs]

    def generate_candidates(self, requests: Sequence[Any], prompts: list[str], max_new_tokens: int) -> list[list[str]]:
        """Greedy continuations of ``prompts`` under every candidate (``prepare_candidates``), in one
        ``LLM.generate`` call; per candidate, the responses in prompt order."""
        from esrepro.backends.vllm_engine import encode_prompt, greedy_params

        ids = []
        for p in prompts:
            row, cut = encode_prompt(self.tokenizer, p, self.chat, self.max_prompt_tokens)
            self.truncated += cut * len(requests)
            ids.append(row)
        params = greedy_params(max_new_tokens, self.stop_ids, self.decoding)
        per_adapter = self.adapters.generate(requests, ids, params)
        self.generated_tokens += sum(len(r) for rows in per_adapter for r in rows)
        return [self.tokenizer.batch_decode(rows, skip_special_tokens=True) for rows in per_adapter]

    def release_candidates(self, requests: Sequence[Any]) -> None:
        """Drop the candidates' adapters from vLLM and delete their folders."""
        self.adapters.release(requests)

    def close(self) -> None:
        self.adapters.close()
