"""Many LoRA adapters of one vLLM base, scored in one ``generate`` call: what ESSA's candidates and EGGROLL's
members share.

An engine built with :func:`lora_llm_kwargs` serves any number of peft adapters over one copy of its base:
:class:`AdapterBatch` writes each adapter into a scratch folder, names it by a fresh LoRA id, generates every
prompt under every adapter in one ``LLM.generate`` call (one ``LoRARequest`` per prompt) and drops the adapters
again (from vLLM and from disk).

vLLM 0.32.0 API used (its source, and run on its CPU build by tests/test_essa_vllm.py and tests/test_eggroll_vllm.py):
``LLM(..., enable_lora=True, max_loras=, max_lora_rank=, max_cpu_loras=)`` (``vllm/config/lora.py``:
``max_lora_rank`` one of :data:`LORA_RANKS`; ``max_loras`` adapters share one batch, the scheduler holds back
requests of others), ``LLM.generate(prompts, params, lora_request=[LoRARequest(name, int_id, path), ...])`` one
per prompt (``vllm/entrypoints/llm.py``, ``vllm/lora/request.py``: ids must be >= 1 and unique per adapter),
``LLM.llm_engine.add_lora(request)`` (loads an adapter into the workers' LRU cache of ``max_cpu_loras`` adapters and
activates it; a ``generate`` call under a loaded id only touches it: ``vllm/lora/worker_manager.py``),
``LLM.llm_engine.list_loras()`` / ``remove_lora(id)``; an adapter's scaling is ``lora_alpha / r``, or
``lora_alpha / sqrt(r)`` with ``use_rslora`` (``vllm/lora/peft_helper.py``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from esrepro.settings.methods import LORA_RANKS, lora_rank_slot

__all__ = ["LORA_RANKS", "AdapterBatch", "lora_llm_kwargs", "lora_rank_slot"]


def lora_llm_kwargs(max_loras: int, rank: int) -> dict[str, Any]:
    """``LLM`` arguments of an engine serving up to ``max_loras`` adapters of rank at most ``rank`` in one batch."""
    return {"enable_lora": True, "max_loras": int(max_loras), "max_lora_rank": lora_rank_slot(rank),
            "max_cpu_loras": int(max_loras)}


class AdapterBatch:
    """The LoRA adapters of one vLLM ``LLM``: written, served by id, generated under together, released."""

    def __init__(self, llm: Any, prefix: str = "lora_") -> None:
        self.llm = llm
        self.scratch = Path(tempfile.mkdtemp(prefix=prefix))
        self._next_id = 1

    def request(self, name: str, path: str | Path) -> Any:
        """A LoRA request for the adapter already in ``path`` (kept on :meth:`release`), under a fresh id."""
        from vllm.lora.request import LoRARequest

        lora_id, self._next_id = self._next_id, self._next_id + 1
        return LoRARequest(lora_name=f"{name}-{lora_id}", lora_int_id=lora_id, lora_path=str(path))

    def add(self, name: str, write: Callable[[Path], None]) -> Any:
        """Write an adapter with ``write(folder)`` into a fresh scratch folder; its LoRA request."""
        path = self.scratch / f"{name}-{self._next_id}"
        write(path)
        return self.request(name, path)

    def load(self, requests: Sequence[Any]) -> None:
        """Have vLLM load the adapters now (``add_lora``), so that a ``generate`` call under them finds them loaded
        (left to ``generate``, vLLM loads each adapter when the scheduler first meets its requests)."""
        engine = self.llm.llm_engine
        for r in requests:
            if not engine.add_lora(r):
                raise RuntimeError(f"vLLM did not load the adapter {r.lora_name} from {r.lora_path}")

    def generate(self, requests: Sequence[Any], prompt_ids: Sequence[list[int]], params: Any) -> list[list[list[int]]]:
        """Token ids generated for every prompt under every adapter, in ONE ``LLM.generate`` call; per adapter (in
        ``requests`` order), the rows in prompt order."""
        batch = [{"prompt_token_ids": list(row)} for _ in requests for row in prompt_ids]
        loras = [r for r in requests for _ in prompt_ids]
        outputs = self.llm.generate(batch, params, lora_request=loras, use_tqdm=False)
        rows = [list(o.outputs[0].token_ids) for o in outputs]
        n = len(prompt_ids)
        return [rows[k * n:(k + 1) * n] for k in range(len(requests))]

    def release(self, requests: Sequence[Any]) -> None:
        """Drop the adapters from vLLM, and delete those this batch wrote."""
        engine = self.llm.llm_engine
        loaded = set(engine.list_loras())
        for r in requests:
            if r.lora_int_id in loaded:
                engine.remove_lora(r.lora_int_id)
            path = Path(r.lora_path)
            if path.parent == self.scratch:
                shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __del__(self) -> None:
        scratch = getattr(self, "scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
