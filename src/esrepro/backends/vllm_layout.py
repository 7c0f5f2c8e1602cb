"""Where each HF parameter lives inside vLLM's model, on every tensor-parallel rank, and ES noise on that layout.

ES noise is defined on the transformers (HF) parameters: tensor ``k`` of
``model.named_parameters()`` under member seed ``s`` gets ``noise_like(shape_k, s, k)``.
vLLM holds the same numbers in another layout: projections stacked into packed parameters
(q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``, or a checkpoint's fused tensor split
across ranks), every linear layer split across tensor-parallel ranks, the vocabulary padded.
A :class:`VLLMLayout` says, for each rank, which box of which HF tensor fills which part of
which vLLM parameter (:class:`Piece`), so a vLLM worker applies exactly the HF noise to its own
shard: the noise of a vLLM parameter is the HF noise of each constituent, generated with the
HF tensor's full shape and then sliced the way the weights are sliced (zero in padding).

The layout is not typed per architecture: each rank reads its own off vLLM's model class by
pushing marked tensors through the class's ``load_weights`` (:mod:`esrepro.backends.vllm_probe`),
and the engine assembles the ranks' answers. This module is plain torch (tested without vLLM):
conversions both ways, shard noise, perturbation and update of one rank's shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Mapping, Sequence

import torch

from esrepro.perturb.lowrank import member_noise, update_delta
from esrepro.perturb.noise import NoiseVariant, noise_like
from esrepro.perturb.ops import NoiseFn, perturb_, update_


@dataclass(frozen=True)
class HFTensor:
    """One HF parameter: its name, its index ``k`` in ``named_parameters()`` order, its shape."""

    name: str
    index: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Piece:
    """HF tensor ``hf`` rows ``[src, src+length)`` along ``dim`` land at ``[dst, dst+length)`` of a shard."""

    hf: HFTensor
    dim: int
    src: int
    dst: int
    length: int


@dataclass(frozen=True)
class ShardSpec:
    """One vLLM parameter on one rank: its name, shape, and the HF pieces filling it (zero elsewhere)."""

    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class VLLMLayout:
    """The HF parameters of a model and, for each tensor-parallel rank, its vLLM parameters."""

    model_type: str
    tp_size: int
    hf: tuple[HFTensor, ...]
    ranks: tuple[tuple[ShardSpec, ...], ...]

    def shards(self, rank: int) -> tuple[ShardSpec, ...]:
        """The vLLM parameters of ``rank``, ordered by the HF index of their first piece."""
        if not 0 <= rank < self.tp_size:
            raise ValueError(f"rank {rank} outside tensor-parallel size {self.tp_size}")
        return self.ranks[rank]

    def spec(self, name: str, rank: int = 0) -> ShardSpec:
        """The spec of vLLM parameter ``name`` on ``rank``."""
        for s in self.shards(rank):
            if s.name == name:
                return s
        raise KeyError(f"no vLLM parameter {name!r} in the {self.model_type} layout")


def hf_parameters(config) -> tuple[HFTensor, ...]:
    """The HF model's parameters in ``named_parameters()`` order, from a model built on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return tuple(HFTensor(n, k, tuple(p.shape)) for k, (n, p) in enumerate(model.named_parameters()))


def to_vllm(hf_state: Mapping[str, torch.Tensor], layout: VLLMLayout, rank: int) -> dict[str, torch.Tensor]:
    """The vLLM parameters of ``rank`` built from HF tensors (zero in vocabulary padding)."""
    out: dict[str, torch.Tensor] = {}
    for spec in layout.shards(rank):
        first = _hf_tensor(hf_state, spec.pieces[0].hf)
        shard = torch.zeros(spec.shape, dtype=first.dtype, device=first.device)
        for pc in spec.pieces:
            src = _hf_tensor(hf_state, pc.hf)
            shard.narrow(pc.dim, pc.dst, pc.length).copy_(src.narrow(pc.dim, pc.src, pc.length))
        out[spec.name] = shard
    return out


def _hf_tensor(hf_state: Mapping[str, torch.Tensor], t: HFTensor) -> torch.Tensor:
    if t.name not in hf_state:
        raise KeyError(f"HF tensor {t.name!r} missing from the state")
    x = hf_state[t.name]
    if tuple(x.shape) != t.shape:
        raise ValueError(f"HF tensor {t.name!r} has shape {tuple(x.shape)}, layout expects {t.shape}")
    return x


def param_to_hf(
    name: str, per_rank: Sequence[torch.Tensor], layout: VLLMLayout, check_replicas: bool = True
) -> dict[str, torch.Tensor]:
    """The HF tensors composing vLLM parameter ``name``, from its value on every rank (rank order).

    Regions held by several ranks (replicated KV heads, norms, row-parallel biases) are taken
    from the lowest rank; with ``check_replicas`` the other copies must be bit-identical.
    """
    if len(per_rank) != layout.tp_size:
        raise ValueError(f"{name}: {len(per_rank)} rank values for tensor-parallel size {layout.tp_size}")
    out: dict[str, torch.Tensor] = {}
    covered: dict[str, tuple[int, torch.Tensor]] = {}  # HF name -> (dim, which of its rows along dim are filled)
    for rank, value in enumerate(per_rank):
        spec = layout.spec(name, rank)
        if tuple(value.shape) != spec.shape:
            raise ValueError(f"{name} on rank {rank} has shape {tuple(value.shape)}, layout expects {spec.shape}")
        for pc in spec.pieces:
            dst = out.get(pc.hf.name)
            if dst is None:
                dst = out[pc.hf.name] = torch.empty(pc.hf.shape, dtype=value.dtype, device=value.device)
            part = value.narrow(pc.dim, pc.dst, pc.length)
            dim, mask = covered.setdefault(pc.hf.name, (pc.dim, torch.zeros(pc.hf.shape[pc.dim], dtype=torch.bool)))
            if dim != pc.dim:
                raise ValueError(f"{pc.hf.name}: pieces cut along dims {dim} and {pc.dim}")
            seen = mask[pc.src:pc.src + pc.length]
            if bool(seen.any()):  # held by an earlier rank too (replicated heads, norms, biases): the lowest rank's
                idx = seen.nonzero().flatten()
                have = dst.narrow(pc.dim, pc.src, pc.length).index_select(pc.dim, idx.to(dst.device))
                if check_replicas and not torch.equal(have, part.index_select(pc.dim, idx.to(part.device))):
                    span = f"{pc.src}:{pc.src + pc.length}"
                    raise ValueError(f"replicas of {pc.hf.name} [{span} along dim {pc.dim}] differ on rank {rank}")
                new = (~seen).nonzero().flatten()
                if len(new):
                    dst.narrow(pc.dim, pc.src, pc.length).index_copy_(
                        pc.dim, new.to(dst.device), part.index_select(pc.dim, new.to(part.device)))
            else:
                dst.narrow(pc.dim, pc.src, pc.length).copy_(part)
            seen.fill_(True)
    for hf_name, (dim, mask) in covered.items():
        if not bool(mask.all()):
            t = out[hf_name]
            raise ValueError(f"{hf_name}: ranks cover {int(mask.sum())} of {t.shape[dim]} along dim {dim}")
    return out


def to_hf(vllm_states_per_rank: Sequence[Mapping[str, torch.Tensor]], layout: VLLMLayout) -> dict[str, torch.Tensor]:
    """HF tensors, in HF ``named_parameters()`` order, from every rank's vLLM parameters."""
    if len(vllm_states_per_rank) != layout.tp_size:
        raise ValueError(f"{len(vllm_states_per_rank)} rank states for tensor-parallel size {layout.tp_size}")
    got: dict[str, torch.Tensor] = {}
    for spec in layout.shards(0):
        per_rank = []
        for rank, state in enumerate(vllm_states_per_rank):
            if spec.name not in state:
                raise KeyError(f"vLLM parameter {spec.name!r} missing from rank {rank}'s state")
            per_rank.append(state[spec.name])
        got.update(param_to_hf(spec.name, per_rank, layout))
    return {t.name: got[t.name] for t in layout.hf}


def shard_noise(
    spec: ShardSpec,
    seed: int,
    variant: NoiseVariant,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Float32 noise for one rank's vLLM parameter: each constituent's HF noise, sliced like its weights.

    Each HF tensor's noise is generated with its full shape (``noise_like(shape, seed, k)``),
    exactly as the HF backend does, then the rank's slice is taken; vocabulary padding gets zero.
    """
    device = torch.device(device)
    if len(spec.pieces) == 1 and spec.pieces[0].hf.shape == spec.shape:  # the whole HF tensor, as is
        return noise_like(spec.shape, device, seed, spec.pieces[0].hf.index, variant, generator)
    out = torch.zeros(spec.shape, dtype=torch.float32, device=device)
    for pc in spec.pieces:
        if pc.length == 0:
            continue
        full = noise_like(pc.hf.shape, device, seed, pc.hf.index, variant, generator)
        out.narrow(pc.dim, pc.dst, pc.length).copy_(full.narrow(pc.dim, pc.src, pc.length))
    return out


def _shard_noise_of(specs: Sequence[ShardSpec], params: Sequence[torch.Tensor], variant: NoiseVariant) -> NoiseFn:
    """The :data:`~esrepro.perturb.ops.NoiseFn` of one rank's shards: parameter k's part of its whole tensor's noise."""
    if len(specs) != len(params):
        raise ValueError(f"{len(params)} parameters but {len(specs)} shard specs")
    return lambda k, p, seed, gen: shard_noise(specs[k], seed, variant, p.device, gen)


def perturb_shards_(
    params: Sequence[torch.Tensor], specs: Sequence[ShardSpec], seed: int, sigma: float, variant: NoiseVariant
) -> None:
    """theta += sigma * eps(seed) on one rank's vLLM parameters, in place (``perturb.ops.perturb_`` on shards)."""
    perturb_(params, seed, sigma, variant, noise=_shard_noise_of(specs, params, variant))


def update_shards_(
    params: Sequence[torch.Tensor],
    specs: Sequence[ShardSpec],
    seeds: Sequence[int],
    weights: Sequence[float],
    alpha: float,
    variant: NoiseVariant,
    masters: Sequence[torch.Tensor] | None = None,
) -> None:
    """theta += alpha / N * sum_n w_n * eps(seed_n) on one rank's shards (``perturb.ops.update_`` on shards).

    Accumulates in float32 seed by seed; with ``masters`` (float32 copies of the shards) the
    step goes to the masters and the parameters are set from them.
    """
    update_(params, seeds, weights, alpha, variant, masters, noise=_shard_noise_of(specs, params, variant))


# --- low-rank (EGGROLL) noise on shards -----------------------------------------------------------


def lowrank_shard(spec: ShardSpec, targets: AbstractSet[str]) -> bool:
    """Whether vLLM parameter ``spec`` takes low-rank noise: its HF pieces are all ``targets`` (the decoder blocks'
    linear weights, :func:`esrepro.models.architecture.linear_weight_names`), or none of them are (else the layout
    is inconsistent)."""
    hits = {pc.hf.name in targets for pc in spec.pieces}
    if len(hits) != 1:
        raise ValueError(f"vLLM parameter {spec.name} mixes low-rank targets and other tensors")
    return hits.pop()


def _shard_of(spec: ShardSpec, full, device: torch.device) -> torch.Tensor:
    """One rank's shard of the float32 tensors ``full(hf_tensor)`` of its pieces, sliced like its weights."""
    if len(spec.pieces) == 1 and spec.pieces[0].hf.shape == spec.shape:
        return full(spec.pieces[0].hf)
    out = torch.zeros(spec.shape, dtype=torch.float32, device=device)
    for pc in spec.pieces:
        if pc.length:
            out.narrow(pc.dim, pc.dst, pc.length).copy_(full(pc.hf).narrow(pc.dim, pc.src, pc.length))
    return out


def lowrank_perturb_shards_(params: Sequence[torch.Tensor], specs: Sequence[ShardSpec], seed: int, sigma: float,
                            rank: int, variant: NoiseVariant, targets: AbstractSet[str]) -> None:
    """W += sigma * E(seed) on one rank's low-rank shards (those of ``targets``), each piece's E its HF tensor's
    (whole, then sliced)."""
    for p, spec in zip(params, specs, strict=True):
        if lowrank_shard(spec, targets):
            gen = torch.Generator(device=p.device)
            # B023: _shard_of calls the noise function at once, in this iteration (no late binding)
            e = _shard_of(spec,
                          lambda t: member_noise(t.shape, p.device, seed, t.index, rank, variant, gen),  # noqa: B023
                          p.device)
            p.add_(e.to(p.dtype), alpha=sigma)


def lowrank_update_shards_(params: Sequence[torch.Tensor], specs: Sequence[ShardSpec], seeds: Sequence[int],
                           weights: Sequence[float], alpha: float, rank: int, variant: NoiseVariant,
                           targets: AbstractSet[str], masters: Sequence[torch.Tensor] | None = None) -> None:
    """W += alpha / N * sum_i w_i E_i on one rank's low-rank shards (those of ``targets``;
    :func:`esrepro.perturb.lowrank.update_delta` of each piece's HF tensor, sliced); with ``masters`` the step goes
    to the float32 masters first."""
    for j, (p, spec) in enumerate(zip(params, specs, strict=True)):
        if not lowrank_shard(spec, targets):
            continue
        # B023: _shard_of calls the update function at once, in this iteration (no late binding)
        delta = _shard_of(spec, lambda t: update_delta(t.shape, p.device, seeds, weights, alpha,  # noqa: B023
                                                       t.index, rank, variant), p.device)
        if masters is not None:
            masters[j].add_(delta)
            p.copy_(masters[j])
        else:
            p.add_(delta.to(p.dtype))
