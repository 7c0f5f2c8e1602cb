"""The layout probe (esrepro.backends.vllm_probe) on loaders written here: what it reads off a model's own weight
loading, and what it refuses. The probe on vLLM's real model classes is tests/test_vllm_probe.py (vLLM's CPU build).

Each loader below does what a vLLM layer's weight loader does (stacking projections into one packed parameter,
taking one tensor-parallel rank's slice, padding a vocabulary) or one thing ES could not follow (a transpose, a
scale, a tensor left out, a cut along two dimensions).
"""

from __future__ import annotations

import pytest
import torch

from esrepro.backends.vllm_layout import HFTensor, Piece, VLLMLayout, shard_noise, to_hf, to_vllm
from esrepro.backends.vllm_probe import LayoutError, probe_shards
from esrepro.perturb.noise import noise_like

HIDDEN, Q, KV, VOCAB, PADDED = 8, 8, 4, 10, 16


def hf_tensors() -> tuple[HFTensor, ...]:
    shapes = [("embed.weight", (VOCAB, HIDDEN)), ("q.weight", (Q, HIDDEN)), ("k.weight", (KV, HIDDEN)),
              ("v.weight", (KV, HIDDEN)), ("o.weight", (HIDDEN, Q)), ("norm.weight", (HIDDEN,))]
    return tuple(HFTensor(n, k, s) for k, (n, s) in enumerate(shapes))


class PackedModel(torch.nn.Module):
    """A rank of a tensor-parallel model as vLLM lays it out: q/k/v stacked into ``qkv`` (the rank's query rows, its
    key and value rows), ``o`` cut along its input, the vocabulary padded and split, the norm whole."""

    def __init__(self, rank: int = 0, tp: int = 1, transform=None, skip: str | None = None) -> None:
        super().__init__()
        self.rank, self.tp, self.transform, self.skip = rank, tp, transform, skip
        with torch.device("meta"):
            self.embed = torch.nn.Parameter(torch.empty(PADDED // tp, HIDDEN, dtype=torch.float64))
            self.qkv = torch.nn.Parameter(torch.empty((Q + 2 * KV) // tp, HIDDEN, dtype=torch.float64))
            self.o = torch.nn.Parameter(torch.empty(HIDDEN, Q // tp, dtype=torch.float64))
            self.norm = torch.nn.Parameter(torch.empty(HIDDEN, dtype=torch.float64))

    def load_weights(self, weights):
        r, tp = self.rank, self.tp
        for name, w in weights:
            if name == self.skip:
                continue
            if self.transform is not None:
                w = self.transform(w)
            if name == "embed.weight":
                rows = PADDED // tp
                start, end = min(r * rows, VOCAB), min((r + 1) * rows, VOCAB)
                self.embed.data[: end - start].copy_(w[start:end])
                self.embed.data[end - start:].fill_(0)
            elif name in ("q.weight", "k.weight", "v.weight"):
                q, kv = Q // tp, KV // tp
                offset, size = {"q.weight": (0, q), "k.weight": (q, kv), "v.weight": (q + kv, kv)}[name]
                self.qkv.data.narrow(0, offset, size).copy_(w.narrow(0, r * size, size))
            elif name == "o.weight":
                cols = Q // tp
                self.o.data.copy_(w.narrow(1, r * cols, cols))
            elif name == "norm.weight":
                self.norm.data.copy_(w)
            else:
                raise KeyError(name)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_probe_reads_packing_slicing_and_padding_off_the_loader(tp):
    hf = hf_tensors()
    layout = VLLMLayout("packed", tp, hf, tuple(probe_shards(PackedModel(r, tp), hf) for r in range(tp)))
    qkv = layout.spec("qkv", tp - 1)
    q, kv = Q // tp, KV // tp
    r = tp - 1
    assert [(p.hf.name, p.dim, p.src, p.dst, p.length) for p in qkv.pieces] == [
        ("q.weight", 0, r * q, 0, q), ("k.weight", 0, r * kv, q, kv), ("v.weight", 0, r * kv, q + kv, kv)]
    # cut along its input on two ranks; whole on one (a whole tensor is one piece along dim 0)
    whole = Piece(hf[4], 0, 0, 0, HIDDEN)
    assert layout.spec("o", r).pieces == ((Piece(hf[4], 1, r * (Q // tp), 0, Q // tp),) if tp == 2 else (whole,))
    embed = layout.spec("embed", r).pieces[0]
    assert (embed.src, embed.dst, embed.length) == (min(r * PADDED // tp, VOCAB), 0, VOCAB - r * PADDED // tp
                                                    if tp == 2 else VOCAB)
    # what the loader itself writes, the layout rebuilds: HF -> every rank -> HF, bit for bit
    torch.manual_seed(0)
    state = {t.name: torch.randn(t.shape) for t in hf}
    ranks = []
    for rank in range(tp):
        model = PackedModel(rank, tp)
        model.to_empty(device="cpu")
        model.load_weights(list(state.items()))
        got = to_vllm(state, layout, rank)
        assert all(torch.equal(got[n], getattr(model, n).data.float()) for n in got)
        ranks.append(got)
    back = to_hf(ranks, layout)
    assert all(torch.equal(back[t.name], state[t.name]) for t in hf)
    # and a shard's noise is the HF tensor's noise, sliced as the weights are
    eps = shard_noise(layout.spec("o", r), 5, "iid", "cpu")
    assert torch.equal(eps, noise_like(hf[4].shape, "cpu", 5, 4, "iid").narrow(1, r * (Q // tp), Q // tp))


@pytest.mark.parametrize("transform, what", [
    (lambda w: w.t() if w.dim() == 2 and w.shape[0] == w.shape[1] else w, "permutes"),
    (lambda w: w * 2.0, "permutes, scales"),
    (lambda w: w.to(torch.float32), "moved or cast"),
])
def test_a_loader_that_transforms_what_it_copies_is_refused_naming_the_tensor(transform, what):
    with pytest.raises(LayoutError, match=rf"model_type 'toy'.*HF tensor \S+ .*{what}"):
        probe_shards(PackedModel(transform=transform), hf_tensors(), where="model_type 'toy'")


def test_a_tensor_the_loader_skips_is_refused_naming_it():
    with pytest.raises(LayoutError, match=r"HF tensor norm.weight \(8,\) lands in no vLLM parameter"):
        probe_shards(PackedModel(skip="norm.weight"), hf_tensors())


def test_a_tensor_the_loader_does_not_know_is_refused_with_the_loaders_reason():
    hf = (*hf_tensors(), HFTensor("extra.weight", 6, (2, 2)))
    with pytest.raises(LayoutError, match=r"refused HF tensor extra.weight .*KeyError"):
        probe_shards(PackedModel(), hf)


class TwoCuts(torch.nn.Module):
    """A loader that cuts a tensor along both dimensions (a 2-D block of it): ES's pieces cut along one."""

    def __init__(self) -> None:
        super().__init__()
        with torch.device("meta"):
            self.w = torch.nn.Parameter(torch.empty(2, 2, dtype=torch.float64))

    def load_weights(self, weights):
        for _, w in weights:
            self.w.data.copy_(w[1:3, 1:3])


def test_a_block_cut_along_two_dimensions_is_refused():
    with pytest.raises(LayoutError, match=r"w\.weight.*cut along dimensions \[0, 1\]"):
        probe_shards(TwoCuts(), (HFTensor("w.weight", 0, (4, 4)),))
