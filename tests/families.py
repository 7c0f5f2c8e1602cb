"""Small random-weight models of decoder families other than the papers' (Qwen2, Llama), built from transformers
configs, with the tokenizer the tests already use (conftest.make_model_dir's byte-level BPE).

Each family keeps what sets it apart: Qwen3's per-head q/k norms and explicit head size, Mistral's untied head,
Gemma 3's sliding-window layers, q/k norms, scaled embeddings and extra norms, OLMo 2's q/k norms over whole
projections and post-norms (vLLM 0.32 serves it through its transformers backend), Phi-3's fused ``qkv_proj`` and
``gate_up_proj``. Heads are 32 wide, the smallest vLLM's CPU attention runs.
"""

from __future__ import annotations

from pathlib import Path

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=256)
FAMILIES: dict[str, dict] = {
    "qwen3": dict(head_dim=32, tie_word_embeddings=True),
    "mistral": dict(head_dim=32, tie_word_embeddings=False, sliding_window=None),
    "gemma3_text": dict(head_dim=32, sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                        query_pre_attn_scalar=32),
    "olmo2": dict(tie_word_embeddings=False),
    "phi3": dict(tie_word_embeddings=False),
}


def make_family_dir(path: Path, model_type: str, seed: int = 0, **overrides) -> Path:
    """Save a random-init causal LM of ``model_type`` (:data:`FAMILIES`' config keys, then ``overrides``) and the
    tests' tokenizer into ``path``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from esrepro.models.loading import save_tokenizer
    from esrepro.models.tiny import train_tokenizer

    corpus = [f"Using the numbers [{a} {b}], make {a + b}. <think> {a} + {b} </think>\n<answer>{a} + {b}</answer>"
              for a in range(1, 40) for b in range(1, 12)]
    tok = train_tokenizer(corpus, vocab_size=320)
    eos = tok.eos_token_id
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), bos_token_id=eos, eos_token_id=eos,
                                  pad_token_id=eos, **{**COMMON, **FAMILIES.get(model_type, {}), **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    save_tokenizer(tok, path)
    return path
