"""The tiny model's checkpoint: exact reload, and the tokenizer class trap."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from esrepro.models.loading import load_model, load_tokenizer

TEXT = "Using the numbers [44 19 35], create an equation that equals 98.\n<think> 44 + 19 </think>\n<answer>(44 + 19) + 35</answer>"


def test_tokenizer_loads_with_the_ids_it_was_trained_with(tiny_model_dir):
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    tok = load_tokenizer(tiny_model_dir)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert ids == raw.encode(TEXT).ids
    assert tok.decode(ids) == TEXT


def test_auto_tokenizer_next_to_a_qwen2_config_changes_ids(tiny_model_dir):
    """The trap load_tokenizer avoids: if this starts failing, transformers changed, and
    the explicit class in load_tokenizer may no longer be needed."""
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert auto(TEXT, add_special_tokens=False)["input_ids"] != raw.encode(TEXT).ids


def test_checkpoint_reloads_bit_identically(tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir)
    model.save_pretrained(tmp_path)
    again = load_model(tmp_path)
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_load_model_names_missing_directory(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="missing config.json"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing tokenizer_config.json"):
        load_tokenizer(tmp_path)
