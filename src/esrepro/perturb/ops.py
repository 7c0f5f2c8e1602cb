"""In-place ES operations on a list of parameter tensors: perturb, restore, update.

Each works tensor by tensor and regenerates noise from seeds, so peak extra memory is
one tensor's noise (plus one float32 accumulator during the update), never a
full-model noise buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from esrepro.perturb.noise import NoiseVariant, tensor_noise


@dataclass(frozen=True)
class Update:
    """theta += alpha / N * sum_n weights_n * eps(seeds_n): all an engine needs to follow the run."""

    seeds: tuple[int, ...]
    weights: tuple[float, ...]
    alpha: float


#: The float32 noise eps_k(seed) of parameter ``k`` (the tensor ``p``), drawn with ``gen``: ``noise(k, p, seed, gen)``.
#: By default the whole tensor's (:func:`~esrepro.perturb.noise.tensor_noise`); a tensor-parallel shard passes its
#: part of the whole tensor's noise (:func:`esrepro.backends.vllm_layout.shard_noise`).
NoiseFn = Callable[[int, torch.Tensor, int, torch.Generator], torch.Tensor]


def _whole_tensor_noise(variant: NoiseVariant) -> NoiseFn:
    return lambda k, p, seed, gen: tensor_noise(p, seed, k, variant, gen)


def perturb_(params: Sequence[torch.Tensor], seed: int, sigma: float, variant: NoiseVariant,
             noise: NoiseFn | None = None) -> None:
    """theta_k += sigma * eps_k(seed) for every tensor k, in place (``noise``: eps_k, see :data:`NoiseFn`)."""
    noise = noise or _whole_tensor_noise(variant)
    gen = None
    for k, p in enumerate(params):
        gen = gen if gen is not None and gen.device == p.device else torch.Generator(device=p.device)
        p.add_(noise(k, p, seed, gen).to(p.dtype), alpha=sigma)


def restore_subtract_(params: Sequence[torch.Tensor], seed: int, sigma: float, variant: NoiseVariant) -> None:
    """theta_k -= sigma * eps_k(seed): the paper's restore; not exact in finite precision."""
    perturb_(params, seed, -sigma, variant)


def snapshot(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of the parameters, for exact restore."""
    return [p.detach().clone() for p in params]


def restore_exact_(params: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> None:
    """Copy saved values back (bit-exact); ``saved`` may be float32 masters of low-precision params."""
    for p, s in zip(params, saved, strict=True):
        p.copy_(s)


def zscore(rewards: Sequence[float]) -> np.ndarray:
    """(r - mean) / (std + 1e-8) in float32 with the population std, as the authors do."""
    r = np.asarray(rewards, dtype=np.float32)
    return (r - r.mean()) / (r.std() + np.float32(1e-8))


def centred(rewards: Sequence[float]) -> np.ndarray:
    """(r - mean) / sqrt(var + 1e-5) in float32, with the population variance: EGGROLL's fitness shaping.

    The authors' ``EggRoll.convert_fitnesses`` (ESHyperscale/HyperscaleES at b77f7d6,
    ``src/hyperscalees/noiser/eggroll.py``) subtracts the mean of each group of ``group_size`` scores (their LLM
    runs: the generations of one prompt) and divides by sqrt(var(all scores) + 1e-5). Here every member is scored on
    the same prompts, so the group is the whole population and a member's score is its mean reward.
    """
    r = np.asarray(rewards, dtype=np.float32)
    return (r - r.mean()) / np.sqrt(r.var() + np.float32(1e-5))


def update_(
    params: Sequence[torch.Tensor],
    seeds: Sequence[int],
    weights: Sequence[float],
    alpha: float,
    variant: NoiseVariant,
    masters: Sequence[torch.Tensor] | None = None,
    noise: NoiseFn | None = None,
) -> None:
    """theta_k += alpha / N * sum_n w_n * eps_k(seed_n), tensor by tensor, seed by seed.

    The sum is accumulated in float32. With ``masters`` (float32 copies of low-precision
    parameters) the step is applied to the masters and the parameters are set from them,
    so steps smaller than a bf16 ulp are not rounded away. ``noise``: eps_k (:data:`NoiseFn`).
    """
    noise = noise or _whole_tensor_noise(variant)
    n = len(seeds)
    if n != len(weights):
        raise ValueError(f"{n} seeds but {len(weights)} weights")
    scale = alpha / n
    for k, p in enumerate(params):
        gen = torch.Generator(device=p.device)
        acc = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        for seed, w in zip(seeds, weights, strict=True):
            acc.add_(noise(k, p, seed, gen), alpha=float(w))
        acc.mul_(scale)
        if masters is not None:
            masters[k].add_(acc)
            p.copy_(masters[k])
        else:
            p.add_(acc.to(p.dtype))
