"""Where each HF parameter lives inside vLLM's model, for Qwen2 and Llama, on every tensor-parallel rank.

ES noise is defined on the transformers (HF) parameters: tensor ``k`` of
``model.named_parameters()`` under member seed ``s`` gets ``noise_like(shape_k, s, k)``.
vLLM holds the same numbers in another layout: q/k/v fused into ``qkv_proj`` and
gate/up into ``gate_up_proj`` (stacked along the output dim), every linear layer split
across tensor-parallel ranks, the vocabulary padded. This module maps between the two
so a vLLM worker can apply exactly the HF noise to its own shard: the noise of a vLLM
parameter is the HF noise of each constituent, generated with the HF tensor's full
shape and then sliced the way the weights are sliced (zero in vocabulary padding).

Facts about vLLM are those of the version pinned in ``pyproject.toml`` (``vllm==0.32.0``; Qwen2 at
tensor-parallel sizes 1 and 2 is also checked against the running engine by tests/test_vllm_engine.py):

- ``vllm/model_executor/models/{qwen2,llama}.py``: ``hf_to_vllm_mapper`` stacks
  ``.q_proj/.k_proj/.v_proj`` into ``.qkv_proj`` (shards "q", "k", "v") and
  ``.gate_proj/.up_proj`` into ``.gate_up_proj`` (shards 0, 1); ``o_proj`` and ``down_proj``
  are ``RowParallelLinear``; ``lm_head`` is ``ParallelLMHead``, tied to
  ``model.embed_tokens`` when ``tie_word_embeddings``; Qwen2's head size is
  ``hidden_size // num_attention_heads``, Llama's ``config.head_dim`` or that.
- ``vllm/model_executor/layers/linear.py`` (``QKVParallelLinear``) and
  ``vllm/model_executor/parameter.py`` (``load_qkv_weight``): rank ``r`` holds query heads
  ``[r*H/tp, (r+1)*H/tp)`` and, when ``tp >= num_kv_heads``, one KV head, number
  ``r // (tp / num_kv_heads)`` (replicated), otherwise ``num_kv_heads / tp`` of them.
- ``vllm/model_executor/layers/vocab_parallel_embedding.py``: ``DEFAULT_VOCAB_PADDING_SIZE = 64``;
  the padded vocabulary is split evenly and rank ``r`` holds HF rows
  ``[min(r*S, V), min((r+1)*S, V))`` followed by zero rows up to ``S``.
- Row-parallel biases and norms are replicated on every rank.

Written by hand because vLLM offers only the loading direction (HF -> its layout, inside a
running engine); ES needs both directions, and noise, without a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from esrepro.perturb.lowrank import is_lowrank_target, member_noise, update_delta
from esrepro.perturb.noise import NoiseVariant, noise_like
from esrepro.perturb.ops import NoiseFn, perturb_, update_

#: ``DEFAULT_VOCAB_PADDING_SIZE`` in vLLM 0.32.0.
VOCAB_PADDING = 64
SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


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


def _divide(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(f"{what} ({total}) is not divisible by tensor-parallel size {parts}")
    return total // parts


def _vllm_head_dim(config, model_type: str) -> int:
    """Head size as vLLM 0.32.0 computes it (Qwen2 ignores ``config.head_dim``)."""
    default = config.hidden_size // config.num_attention_heads
    if model_type == "llama":
        return getattr(config, "head_dim", None) or default
    return default


_PROJ = re.compile(r"^(model\.layers\.\d+\.(?:self_attn|mlp))\.(q|k|v|o|gate|up|down)_proj\.(weight|bias)$")
_NORM = re.compile(r"^model\.(?:layers\.\d+\.(?:input_layernorm|post_attention_layernorm)|norm)\.weight$")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def build_layout(config, tp_size: int = 1, hf: Sequence[HFTensor] | None = None) -> VLLMLayout:
    """The vLLM layout of the HF model described by ``config`` (a ``transformers`` config) at ``tp_size``.

    ``hf`` (the HF parameters) defaults to :func:`hf_parameters` of ``config``.
    """
    model_type = config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} has no vLLM layout; supported: {SUPPORTED_MODEL_TYPES}")
    if tp_size < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {tp_size}")
    hf = tuple(hf) if hf is not None else hf_parameters(config)
    num_heads = config.num_attention_heads
    num_kv = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = _vllm_head_dim(config, model_type)
    heads_per_rank = _divide(num_heads, tp_size, "num_attention_heads")
    if tp_size >= num_kv:
        kv_per_rank, kv_replicas = 1, _divide(tp_size, num_kv, "(replicated) num_key_value_heads")
    else:
        kv_per_rank, kv_replicas = _divide(num_kv, tp_size, "num_key_value_heads"), 1
    vocab = config.vocab_size
    padded_vocab = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    vocab_per_rank = _divide(padded_vocab, tp_size, f"padded vocabulary ({vocab} padded to {VOCAB_PADDING})")

    ranks: list[list[ShardSpec]] = []
    for rank in range(tp_size):
        grouped: dict[str, list[Piece]] = {}
        shapes: dict[str, tuple[int, ...]] = {}

        def put(name: str, shape: tuple[int, ...], piece: Piece) -> None:
            grouped.setdefault(name, []).append(piece)
            shapes[name] = shape

        for t in hf:
            if t.name in _VOCAB:
                if t.shape[0] != vocab:
                    raise ValueError(f"{t.name} has {t.shape[0]} rows but config.vocab_size is {vocab}")
                start = min(rank * vocab_per_rank, vocab)
                end = min((rank + 1) * vocab_per_rank, vocab)
                put(t.name, (vocab_per_rank, *t.shape[1:]), Piece(t, 0, start, 0, end - start))
            elif _NORM.match(t.name):
                put(t.name, t.shape, Piece(t, 0, 0, 0, t.shape[0]))
            elif m := _PROJ.match(t.name):
                prefix, proj, kind = m.groups()
                if proj in ("q", "k", "v"):
                    heads = num_heads if proj == "q" else num_kv
                    if t.shape[0] != heads * head_dim:
                        raise ValueError(
                            f"{t.name} has {t.shape[0]} output rows; vLLM expects {heads} heads x {head_dim}"
                        )
                    q_rows, kv_rows = heads_per_rank * head_dim, kv_per_rank * head_dim
                    if proj == "q":
                        src, dst, rows = rank * q_rows, 0, q_rows
                    else:
                        src = (rank // kv_replicas) * kv_rows
                        dst, rows = q_rows + (kv_rows if proj == "v" else 0), kv_rows
                    total = q_rows + 2 * kv_rows
                    put(f"{prefix}.qkv_proj.{kind}", (total, *t.shape[1:]), Piece(t, 0, src, dst, rows))
                elif proj in ("gate", "up"):
                    rows = _divide(t.shape[0], tp_size, f"{t.name} output size")
                    dst = 0 if proj == "gate" else rows
                    put(f"{prefix}.gate_up_proj.{kind}", (2 * rows, *t.shape[1:]), Piece(t, 0, rank * rows, dst, rows))
                elif kind == "weight":  # o_proj / down_proj: row-parallel, input dim split
                    cols = _divide(t.shape[1], tp_size, f"{t.name} input size")
                    put(t.name, (t.shape[0], cols), Piece(t, 1, rank * cols, 0, cols))
                else:  # row-parallel bias: replicated
                    put(t.name, t.shape, Piece(t, 0, 0, 0, t.shape[0]))
            else:
                raise ValueError(f"HF parameter {t.name!r} of {model_type} has no known vLLM counterpart")
        ranks.append([ShardSpec(n, shapes[n], tuple(ps)) for n, ps in grouped.items()])
    return VLLMLayout(model_type, tp_size, hf, tuple(tuple(r) for r in ranks))


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
    covered: dict[str, list[tuple[int, int]]] = {}
    for rank, value in enumerate(per_rank):
        spec = layout.spec(name, rank)
        if tuple(value.shape) != spec.shape:
            raise ValueError(f"{name} on rank {rank} has shape {tuple(value.shape)}, layout expects {spec.shape}")
        for pc in spec.pieces:
            dst = out.get(pc.hf.name)
            if dst is None:
                dst = out[pc.hf.name] = torch.empty(pc.hf.shape, dtype=value.dtype, device=value.device)
            part = value.narrow(pc.dim, pc.dst, pc.length)
            seen = covered.setdefault(pc.hf.name, [])
            if (pc.src, pc.length) in seen:
                if check_replicas and not torch.equal(dst.narrow(pc.dim, pc.src, pc.length), part):
                    span = f"{pc.src}:{pc.src + pc.length}"
                    raise ValueError(f"replicas of {pc.hf.name} [{span} along dim {pc.dim}] differ on rank {rank}")
                continue
            dst.narrow(pc.dim, pc.src, pc.length).copy_(part)
            seen.append((pc.src, pc.length))
    for hf_name, spans in covered.items():
        t = next(p.hf for p in layout.spec(name, 0).pieces if p.hf.name == hf_name)
        dim = next(p.dim for p in layout.spec(name, 0).pieces if p.hf.name == hf_name)
        if sum(n for _, n in spans) != t.shape[dim]:
            raise ValueError(f"{hf_name}: ranks cover {sum(n for _, n in spans)} of {t.shape[dim]} along dim {dim}")
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


def lowrank_shard(spec: ShardSpec) -> bool:
    """Whether vLLM parameter ``spec`` takes low-rank noise: its HF pieces are all linear projection weights
    (:func:`esrepro.perturb.lowrank.is_lowrank_target`), or none of them are (else the layout is inconsistent)."""
    hits = {is_lowrank_target(pc.hf.name) for pc in spec.pieces}
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
                            rank: int, variant: NoiseVariant) -> None:
    """W += sigma * E(seed) on one rank's low-rank shards, each piece's E its HF tensor's (whole, then sliced)."""
    for p, spec in zip(params, specs, strict=True):
        if lowrank_shard(spec):
            gen = torch.Generator(device=p.device)
            e = _shard_of(spec, lambda t: member_noise(t.shape, p.device, seed, t.index, rank, variant, gen), p.device)
            p.add_(e.to(p.dtype), alpha=sigma)


def lowrank_update_shards_(params: Sequence[torch.Tensor], specs: Sequence[ShardSpec], seeds: Sequence[int],
                           weights: Sequence[float], alpha: float, rank: int, variant: NoiseVariant,
                           masters: Sequence[torch.Tensor] | None = None) -> None:
    """W += alpha / N * sum_i w_i E_i on one rank's low-rank shards (:func:`esrepro.perturb.lowrank.update_delta` of
    each piece's HF tensor, sliced); with ``masters`` the step goes to the float32 masters first."""
    for j, (p, spec) in enumerate(zip(params, specs, strict=True)):
        if not lowrank_shard(spec):
            continue
        delta = _shard_of(spec, lambda t: update_delta(t.shape, p.device, seeds, weights, alpha, t.index, rank,
                                                       variant), p.device)
        if masters is not None:
            masters[j].add_(delta)
            p.copy_(masters[j])
        else:
            p.add_(delta.to(p.dtype))
