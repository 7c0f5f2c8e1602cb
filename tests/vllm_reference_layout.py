"""A second, independent reading of vLLM 0.32's weight layout for Llama-style models (Qwen2, Llama), written by hand
from its source: the layout the probe (esrepro.backends.vllm_probe) must find on vLLM's own model classes.

The library reads every architecture's layout off vLLM itself; the tests keep this hand-written one for two uses:
the layout machinery (conversions, shard noise, sharded ES state) is tested in the main environment, where vLLM is
not installed, on layouts of Qwen2 and Llama at tensor-parallel sizes 1 and 2; and tests/test_vllm_probe.py checks
that the probe, run on vLLM's classes, finds exactly this layout for both (two readings that must agree).

Facts (vllm==0.32.0): ``vllm/model_executor/models/{qwen2,llama}.py`` stack q/k/v into ``qkv_proj`` and gate/up into
``gate_up_proj``; ``o_proj``/``down_proj`` are row-parallel; ``lm_head`` is tied to ``embed_tokens`` when
``tie_word_embeddings``; Qwen2's head size is ``hidden_size // num_attention_heads``, Llama's ``config.head_dim``.
``QKVParallelLinear``: rank r holds query heads [r*H/tp, (r+1)*H/tp) and, when tp >= num_kv_heads, KV head
r // (tp / num_kv_heads) (replicated), else num_kv_heads / tp of them. ``VocabParallelEmbedding`` pads the
vocabulary to a multiple of 64 and splits it evenly. Row-parallel biases and norms are replicated.
"""

from __future__ import annotations

import re
from typing import Sequence

from esrepro.backends.vllm_layout import HFTensor, Piece, ShardSpec, VLLMLayout, hf_parameters

#: ``DEFAULT_VOCAB_PADDING_SIZE`` in vLLM 0.32.0.
VOCAB_PADDING = 64
SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


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
            grouped.setdefault(name, []).append(piece)  # noqa: B023 - put() runs in this iteration only
            shapes[name] = shape  # noqa: B023

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


