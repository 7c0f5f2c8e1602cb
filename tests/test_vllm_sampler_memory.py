"""vLLM's sampler warm-up, whose peak the memory model counts in every engine's profiling run
(esrepro.models.memory.VLLM_SAMPLER_WARMUP): the pinned vLLM's own ``GPUModelRunner._dummy_sampler_run`` and
``Sampler``, run on the CPU build with the live tensor bytes tracked at every operation."""

from __future__ import annotations

import os
import weakref
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from esrepro.models.memory import VLLM_SAMPLER_WARMUP

pytestmark = pytest.mark.vllm

if os.environ.get("ESREPRO_REQUIRE_VLLM"):
    import vllm  # noqa: F401  (make test: a missing vLLM fails, it never skips)
else:
    vllm = pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test)")


class LiveBytes(TorchDispatchMode):
    """The bytes of the tensors operations made inside the mode that are still alive, and their peak: a storage
    counts while any tensor made on it lives."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[int, list[weakref.ref]]] = {}
        self.peak = 0

    def _now(self) -> int:
        for ptr in [p for p, (_, refs) in self.live.items() if not any(r() is not None for r in refs)]:
            del self.live[ptr]
        return sum(n for n, _ in self.live.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's signature
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.untyped_storage().nbytes():
                ptr = t.untyped_storage().data_ptr()
                nbytes, refs = self.live.get(ptr, (t.untyped_storage().nbytes(), []))
                self.live[ptr] = (nbytes, refs + [weakref.ref(t)])
        self.peak = max(self.peak, self._now())
        return out


def _in_place_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Top-k then top-p masked in place, one row at a time: what vLLM's Triton kernel (``apply_top_k_top_p_triton``,
    taken on CUDA) allocates is one row per streaming multiprocessor, not a copy of the batch."""
    for i in range(logits.shape[0]):
        row = logits[i]
        ordered, index = row.sort(descending=True)
        keep = torch.ones_like(ordered, dtype=torch.bool)
        if k is not None:
            keep[int(k[i]):] = False
        if p is not None:
            probs = ordered.masked_fill(~keep, -float("inf")).softmax(-1)
            keep &= probs.cumsum(-1) - probs <= p[i]
        row.index_put_((index[~keep],), torch.tensor(-float("inf")))
    return logits


def test_the_sampler_warm_up_peaks_at_the_bytes_the_memory_model_counts(monkeypatch):
    """profile_run's sampler warm-up on ``rows`` dummy requests: two sampler calls with top-k and top-p, the second
    with a generator (CUDA's ``forward_native``). Beyond the hidden states it peaks at VLLM_SAMPLER_WARMUP bytes per
    row and vocabulary entry, within half a byte (the per-row parameters and one row's buffers)."""
    import vllm.v1.sample.ops.topk_topp_sampler as topk_topp
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    rows, vocab, hidden = 64, 32_768, 16
    monkeypatch.setattr(topk_topp, "apply_top_k_top_p", _in_place_top_k_top_p)
    sampler = Sampler()
    sampler.topk_topp_sampler.forward = sampler.topk_topp_sampler.forward_native  # CUDA's path for the second call
    head = torch.randn(vocab, hidden, dtype=torch.bfloat16)
    runner = SimpleNamespace(  # what _dummy_sampler_run reads of the runner: the model's LM head in bf16, the sampler
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(multimodal_config=None)),
        model=SimpleNamespace(compute_logits=lambda h: h.to(torch.bfloat16) @ head.T), device=torch.device("cpu"),
        sampler=sampler, speculative_config=None)
    states = torch.randn(rows, hidden, dtype=torch.bfloat16)
    with LiveBytes() as live:
        GPUModelRunner._dummy_sampler_run(runner, states)
    per_entry = live.peak / (rows * vocab)
    print(f"sampler warm-up peak: {per_entry:.3f} bytes per row and vocabulary entry")
    assert abs(per_entry - VLLM_SAMPLER_WARMUP) <= 0.5, f"{per_entry:.2f} bytes per row and vocabulary entry"


def test_the_tracker_sees_a_peak_that_is_freed_again():
    """The case that must be seen: a large temporary freed before the end still sets the peak."""
    x = torch.zeros(1000)
    with LiveBytes() as live:
        y = x + 1
        z = (y * 2).sum()
        del y
        w = x + z
    assert 2 * 4000 <= live.peak <= 2 * 4000 + 4  # y and y * 2 (and the scalar), never y, z and w at once
    assert live._now() == 4000 + 4 and w.numel() == 1000  # y and y * 2 freed: w and z remain
