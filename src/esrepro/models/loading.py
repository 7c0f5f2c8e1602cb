"""Loading a checkpoint directory (built or fetched) into a tokenizer and a causal LM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from esrepro.io import read_json, reading

FAST_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in ``path``.

    A tokenizer we built ourselves is saved by ``PreTrainedTokenizerFast`` (which
    transformers 5 records as ``TokenizersBackend``) and is loaded through that
    class explicitly:
    ``AutoTokenizer`` next to a qwen2 ``config.json`` returns Qwen2's tokenizer
    class, whose pre-tokenizer differs and silently changes token ids.
    """
    path = Path(path)
    cfg_file = path / "tokenizer_config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"no tokenizer in {path} (missing tokenizer_config.json)")
    cls = read_json(cfg_file).get("tokenizer_class")
    if cls in FAST_TOKENIZER_CLASSES:
        tok = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    """Load the causal LM saved in ``path`` in ``dtype``, in eval mode, gradients off."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    if not (Path(path) / "config.json").exists():
        raise FileNotFoundError(f"no model in {path} (missing config.json)")
    with reading(path, "the model"):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def save_checkpoint(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> None:
    """Save weights (safetensors) and tokenizer into ``path``: every trainer's checkpoint goes through here."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def save_adapter(model: torch.nn.Module, path: str | Path, base_model: str | Path | None = None, **kwargs: Any) -> None:
    """Save a peft model's adapter into ``path`` with a reproducible ``adapter_config.json``: peft writes
    ``target_modules`` from a set, in an order that changes with Python's hash seed, so it is sorted here (and
    ``base_model_name_or_path`` set to ``base_model`` when given). ``kwargs`` go to ``save_pretrained``."""
    import json

    model.save_pretrained(str(path), **kwargs)
    config_file = Path(path) / "adapter_config.json"
    config = json.loads(config_file.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    if base_model is not None:
        config["base_model_name_or_path"] = str(base_model)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
