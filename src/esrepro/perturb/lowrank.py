"""Low-rank noise (EGGROLL): a member perturbs each weight matrix by E = A Bᵀ / √r, regenerated from its seed.

"Evolution Strategies at the Hyperscale" (EGGROLL, Sarkar et al., arXiv 2511.16652 v1, Algorithm 1) replaces
the full-rank Gaussian noise of a weight matrix W (m x n) by a rank-r product E = A Bᵀ / √r, with A (m x r)
and B (n x r) standard normal; the 1/√r keeps every entry of E at unit variance whatever r. The update is
ES's: theta += alpha / N * sum_i w_i E_i with the members' normalised rewards w_i (Algorithm 1's update with
its E_i; here with 1/sigma folded into alpha, as the ES paper does, arXiv 2509.24372 v2 Algorithm 1). Summed
over N members the update has rank up to N r although each member's E_i has rank r.

Read line by line against those equations: :func:`factors` draws A_i, B_i; :func:`member_noise` is
E_i = A_i B_iᵀ / √r; :func:`lowrank_perturb_` writes W + sigma E_i; :func:`update_delta` is
alpha / N * sum_i w_i E_i; :func:`lowrank_update_` adds it to the (float32 master) weights.

Which tensors: the weights of the linear layers inside the decoder blocks, read off the model's architecture
(:func:`esrepro.models.architecture.linear_weight_names`: q, k, v, o, gate, up and down in Llama-style models,
the fused qkv and gate-up projections where a checkpoint fuses them, as Phi-3's does). Every other parameter (norms, biases, embeddings) takes no noise and is
never updated. The authors' code offers full-rank noise for non-matrix parameters or none
(``freeze_nonlora`` in ``noiser/eggroll.py`` of their HyperscaleES repository; its LLM post-training runs set
it); none is what the method's point needs here: a member that differs from the base only by
low-rank products of its linear layers is a LoRA adapter, so a whole population is scored in one batched
generation over one copy of the base (:mod:`esrepro.backends.vllm_eggroll`), which a per-member norm or
bias would forbid. The embedding is a lookup, not a matrix product, and vLLM serves no adapter on it.

Factors are drawn as the authors draw them: one standard normal block of (n + m) x r from the tensor's
generator, its first n rows B and the rest A (their ``get_lora_update_params``). The generator is keyed as
ES keys a tensor's noise (:func:`esrepro.perturb.noise.tensor_seed`: (member seed, tensor index), or the
member seed alone with ``correlated``), so nothing random is stored.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from esrepro.perturb.noise import NoiseVariant, noise_source, tensor_seed


def check_rank(rank: int, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse a rank outside [1, min(m, n)] of the smallest target matrix, naming the setting and the tensor."""
    if not shapes:
        raise ValueError("eggroll setting rank: the model has no linear layer weights in its decoder blocks to "
                         "perturb")
    name, shape = min(shapes.items(), key=lambda kv: min(kv[1]))
    if not 1 <= rank <= min(shape):
        raise ValueError(f"eggroll setting rank: {rank} is outside [1, {min(shape)}], the smaller side of "
                         f"{name} {tuple(shape)} (a rank-r product A Bᵀ needs r <= min(m, n))")


def factors(shape: Sequence[int], device: torch.device | str, seed: int, index: int, rank: int,
            variant: NoiseVariant, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B), float32 standard normal, A (m x r) and B (n x r), of tensor ``index`` (shape (m, n)) under ``seed``.

    A mirrored seed (:func:`esrepro.perturb.noise.mirror`) gets its partner's factors with A negated, so its
    A Bᵀ is exactly minus the partner's (the authors' antithetic pair: ±sigma on one draw of A and B).
    """
    m, n = int(shape[0]), int(shape[1])
    device = torch.device(device)
    gen = generator if generator is not None else torch.Generator(device=device)
    source, negate = noise_source(seed)
    gen.manual_seed(tensor_seed(source, index, variant))
    z = torch.randn((n + m, rank), generator=gen, dtype=torch.float32, device=device)
    return (z[n:].neg() if negate else z[n:]), z[:n]


def member_noise(shape: Sequence[int], device: torch.device | str, seed: int, index: int, rank: int,
                 variant: NoiseVariant, generator: torch.Generator | None = None) -> torch.Tensor:
    """E = A Bᵀ / √r (float32, m x n): member ``seed``'s noise of tensor ``index``."""
    A, B = factors(shape, device, seed, index, rank, variant, generator)
    return (A @ B.T) / math.sqrt(rank)


def update_delta(shape: Sequence[int], device: torch.device | str, seeds: Sequence[int], weights: Sequence[float],
                 alpha: float, index: int, rank: int, variant: NoiseVariant,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """alpha / N * sum_i w_i A_i B_iᵀ / √r (float32, m x n) for tensor ``index``.

    Computed as one product of the stacked factors, [w_1 A_1 ... w_N A_N] [B_1 ... B_N]ᵀ (m x Nr times
    Nr x n), the contraction the authors' update makes (their ``_simple_lora_update``): no member's E_i is
    formed, only the update itself.
    """
    n = len(seeds)
    if n != len(weights):
        raise ValueError(f"{n} seeds but {len(weights)} weights")
    device = torch.device(device)
    gen = generator if generator is not None else torch.Generator(device=device)
    a_cols, b_cols = [], []
    for seed, w in zip(seeds, weights, strict=True):
        A, B = factors(shape, device, seed, index, rank, variant, gen)
        a_cols.append(A * float(w))
        b_cols.append(B)
    return (torch.cat(a_cols, dim=1) @ torch.cat(b_cols, dim=1).T) * (alpha / (n * math.sqrt(rank)))


def lowrank_perturb_(params: Sequence[torch.Tensor], targets: Sequence[int | None], seed: int, sigma: float,
                     rank: int, variant: NoiseVariant) -> None:
    """W_k += sigma * E_k(seed) for every target tensor (``targets[k]``: its HF index, None: left alone), in place."""
    gen = None
    for p, k in zip(params, targets, strict=True):
        if k is None:
            continue
        gen = gen if gen is not None and gen.device == p.device else torch.Generator(device=p.device)
        p.add_(member_noise(p.shape, p.device, seed, k, rank, variant, gen).to(p.dtype), alpha=sigma)


def lowrank_update_(params: Sequence[torch.Tensor], targets: Sequence[int | None], seeds: Sequence[int],
                    weights: Sequence[float], alpha: float, rank: int, variant: NoiseVariant,
                    masters: Sequence[torch.Tensor] | None = None) -> None:
    """W_k += alpha / N * sum_i w_i E_k(seed_i) for every target tensor (:func:`update_delta`, float32); with
    ``masters`` (float32 copies) the step goes to the masters and the parameters are set from them."""
    for j, (p, k) in enumerate(zip(params, targets, strict=True)):
        if k is None:
            continue
        delta = update_delta(p.shape, p.device, seeds, weights, alpha, k, rank, variant)
        if masters is not None:
            masters[j].add_(delta)
            p.copy_(masters[j])
        else:
            p.add_(delta.to(p.dtype))
