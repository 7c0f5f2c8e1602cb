"""Loading a checkpoint directory (built or fetched) into a tokenizer and a causal LM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from esrepro.io import read_json, reading, write_text

FAST_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in ``path``.

    A tokenizer we built ourselves is saved by ``PreTrainedTokenizerFast`` (which
    transformers 5 records as ``TokenizersBackend``) and is loaded through that
    class explicitly:
    ``AutoTokenizer`` next to a qwen2 ``config.json`` returns Qwen2's tokenizer
    class, whose pre-tokenizer differs and silently changes token ids (folders
    this pipeline writes name the generic class for AutoTokenizer too:
    :func:`save_tokenizer`; this also loads folders written before they did).
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
    save_tokenizer(tokenizer, path)


#: The module and class that a saved tokenizer's ``auto_map`` names when it must (:func:`save_tokenizer`).
AUTO_TOKENIZER_MODULE, AUTO_TOKENIZER_CLASS = "tokenization_esrepro", "SavedTokenizer"
_AUTO_TOKENIZER_CODE = f'''"""The tokenizer saved in this folder, exactly as its tokenizer.json defines it.

transformers' AutoTokenizer loads a folder whose config.json is a qwen2 one through Qwen2's tokenizer class, whose own
pre-tokenizer replaces the one in tokenizer.json and splits text into other tokens than the model was trained on. The
folder's tokenizer_config.json names this class in its auto_map, so AutoTokenizer.from_pretrained(folder) loads
tokenizer.json as saved, with or without trust_remote_code=True (without it, transformers takes the
tokenizer_class, TokenizersBackend, instead of this module: the same tokenizer). Written by esrepro.models.loading.
"""

from transformers import PreTrainedTokenizerFast


class {AUTO_TOKENIZER_CLASS}(PreTrainedTokenizerFast):
    """tokenizer.json's normalizer, pre-tokenizer, model and decoder, unchanged."""
'''


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, path: str | Path) -> None:
    """Save ``tokenizer`` into ``path`` (after the model's config.json) so transformers' ``AutoTokenizer`` loads it as
    :func:`load_tokenizer` does: the same class of pipeline, the same ids.

    A tokenizer we built ourselves is a generic fast tokenizer (its pipeline all in tokenizer.json); beside a qwen2
    config.json, AutoTokenizer would load it through Qwen2's class, which rebuilds the pre-tokenizer. Where it would
    pick such another class, the folder's tokenizer_config.json gets an ``auto_map`` naming a generic subclass
    written beside it (:data:`AUTO_TOKENIZER_MODULE`); tokenizer.json, and with it every id, is unchanged.
    """
    import json

    path = Path(path)
    tokenizer.save_pretrained(path)
    cfg_file = path / "tokenizer_config.json"
    cfg = read_json(cfg_file)
    ours = {"AutoTokenizer": [None, f"{AUTO_TOKENIZER_MODULE}.{AUTO_TOKENIZER_CLASS}"]}
    if cfg.get("auto_map") == ours:  # carried over from the folder this tokenizer was loaded from: decide afresh
        del cfg["auto_map"]
        write_text(cfg_file, json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    (path / f"{AUTO_TOKENIZER_MODULE}.py").unlink(missing_ok=True)
    if type(tokenizer).__name__ not in FAST_TOKENIZER_CLASSES or not (path / "config.json").exists():
        return
    if type(AutoTokenizer.from_pretrained(path)).__name__ in FAST_TOKENIZER_CLASSES:
        return
    cfg["auto_map"] = ours
    write_text(cfg_file, json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    write_text(path / f"{AUTO_TOKENIZER_MODULE}.py", _AUTO_TOKENIZER_CODE)


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
