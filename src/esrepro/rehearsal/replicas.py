"""Random-weight replicas of the registry's hub models: the real model's config (its architecture class, rope, layer
kinds, norms) at toy size (:func:`esrepro.planning.rehearsal_registry.replica_config`), its tokenizer's special tokens, chat
template and end-of-sequence ids (:mod:`esrepro.models.tokenizer_families`), written in the hub repository's layout.

The weights are random (seeded): a replica exercises the code paths of a real download, load and generation,
never its results. The same ``seed`` writes the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from esrepro.io import atomic_path
from esrepro.models.memory import entry_facts
from esrepro.models.tokenizer_families import LARGE_PARAMS, Facts
from esrepro.planning.rehearsal_registry import replica_config, replica_facts, replica_tokens
from esrepro.rehearsal.replica_tokenizer import write_tokenizer

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

CARD = """\
---
library_name: transformers
tags: [random-weights, offline-rehearsal]
---
# {hub_id} (random-weight replica)

A random-weight replica of `{hub_id}` for an offline rehearsal of the pipeline: the same architecture class
(`{architecture}`), config semantics, tokenizer special tokens, chat template and end-of-sequence ids as the
real model, at toy size ({layers} layers, hidden size {hidden}, vocabulary {vocab}). Its weights are random
(seed {seed}); it is not the model and it knows nothing.
"""


def build_replica(name: str, entry: Any, out_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """Write a replica of registry model ``name`` (its ``entry``: a ModelEntry, or a dict with hub_id, dtype,
    config and optionally chat_template) into ``out_dir`` atomically; a summary (hub_id, architecture,
    vocab_size, files)."""
    source = SimpleNamespace(**entry) if isinstance(entry, dict) else entry
    _, facts = replica_facts(name, source)
    hub_id, dtype = source.hub_id, getattr(source, "dtype", None)
    if dtype not in DTYPES:
        raise ValueError(f"model {name!r}: unknown dtype {dtype!r}")
    config = replica_config(name, source)
    params = entry_facts(source, name).params
    with atomic_path(out_dir, is_dir=True) as tmp:
        tok = write_tokenizer(facts, tmp, int(config.get("max_position_embeddings") or 2048), seed)
        ids, vocab = replica_tokens(facts)
        trained = {t: tok.token_to_id(t) for t in ids}
        if trained != ids or vocab < tok.get_vocab_size(with_added_tokens=True):
            raise RuntimeError(f"model {name!r}: the replica tokenizer's ids {trained} are not the ids its config "
                               f"states {ids} (esrepro.planning.rehearsal_registry.replica_tokens)")
        _write_weights(config, tmp, seed, DTYPES[dtype])
        _dump(tmp / "config.json", config)
        _dump(tmp / "generation_config.json", generation_config(facts, ids, params))
        if facts.original_folder:
            _write_original(config, tmp / "original", seed)
        architecture = (config.get("architectures") or [config["model_type"]])[0]
        (tmp / "README.md").write_text(CARD.format(
            hub_id=hub_id, architecture=architecture, layers=config["num_hidden_layers"],
            hidden=config["hidden_size"], vocab=vocab, seed=seed), encoding="utf-8")
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    return {"model": name, "hub_id": hub_id, "architecture": architecture, "vocab_size": vocab,
            "dtype": dtype, "seed": seed, "files": files}


def generation_config(facts: Facts, ids: dict[str, int], params: int) -> dict[str, Any]:
    """``generation_config.json``: the real model's eos semantics mapped to the replica's ids, and its sampling
    defaults (those of its size: ``params``, the real model's parameter count)."""
    eos = [ids[t] for t in facts.generation_eos]
    out = {"bos_token_id": ids[facts.config_bos], "eos_token_id": eos[0] if len(eos) == 1 else eos,
           **facts.generation, **(facts.generation_large if params >= LARGE_PARAMS else {})}
    if facts.pad_token:
        out["pad_token_id"] = ids[facts.pad_token]
    return dict(sorted(out.items()))


def _write_weights(config: dict[str, Any], out: Path, seed: int, dtype: torch.dtype) -> None:
    """Random weights from ``config`` (read back through transformers, as a download is), saved as safetensors."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _dump(out / "config.json", config)
    parsed = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(parsed, dtype=torch.float32).to(dtype)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)  # written from the real model's semantics instead


def _write_original(config: dict[str, Any], out: Path, seed: int) -> None:
    """The ``original/`` folder of Meta's repositories (a consolidated checkpoint and its params), small: a
    download without allow-patterns fetches it, which shows in the downloaded files."""
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 1)
    dim, vocab = config["hidden_size"], config["vocab_size"]
    state = {"tok_embeddings.weight": torch.randn(vocab, dim, generator=g).to(torch.bfloat16),
             "norm.weight": torch.ones(dim, dtype=torch.bfloat16)}
    torch.save(state, out / "consolidated.00.pth")
    params = {"dim": dim, "n_layers": config["num_hidden_layers"], "n_heads": config["num_attention_heads"],
              "n_kv_heads": config["num_key_value_heads"], "vocab_size": vocab, "norm_eps": config.get("rms_norm_eps"),
              "rope_theta": config.get("rope_theta"), "use_scaled_rope": True}
    _dump(out / "params.json", params)


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
