"""Prompts get BOS exactly when the tokenizer's template adds one; generation stops at every EOS id."""

from __future__ import annotations

import shutil

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import GenerationConfig, PreTrainedTokenizerFast

from esrepro.backends.hf import HFBackend
from esrepro.models.tokens import adds_special_tokens, prompt_ids

WORDS = ["<s>", "</s>", "hello", "world", "again"]


def _tokenizer(bos_template: bool) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: Llama-style (a post-processor prepends <s>) or Qwen-style (no BOS at all)."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos_template:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def test_llama_style_prompts_get_bos_once():
    tok = _tokenizer(bos_template=True)
    assert prompt_ids(tok, "hello world") == [0, 2, 3]
    # a prompt a chat template rendered already starts with BOS: no second one
    assert prompt_ids(tok, "<s> hello world") == [0, 2, 3]
    assert adds_special_tokens(tok, ["hello"]) and not adds_special_tokens(tok, ["<s> hello"])


def test_qwen_style_prompts_get_no_bos():
    tok = _tokenizer(bos_template=False)
    assert prompt_ids(tok, "hello world") == [2, 3]


def test_the_tiny_tokenizer_adds_nothing(tiny_model_dir):
    backend = HFBackend(tiny_model_dir)
    text = "Using the numbers [1 2 3]"
    plain = backend.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert prompt_ids(backend.tokenizer, text) == plain
    assert backend._encode([text])["input_ids"][0].tolist() == plain


def test_generation_stops_at_a_second_eos_id(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    backend = HFBackend(model_dir)
    prompt = "Using the numbers [3 4], make 7."
    enc = backend._encode([prompt])
    full = backend.model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=backend.tokenizer.pad_token_id,
                                  eos_token_id=backend.eos_ids)[0, enc["input_ids"].shape[1]:].tolist()
    # the first token the model emits (not its EOS) becomes a second EOS id
    k = 0
    second = full[k]
    assert len(full) == 12 and second != backend.tokenizer.eos_token_id
    config = GenerationConfig.from_pretrained(model_dir) if (model_dir / "generation_config.json").exists() \
        else GenerationConfig()
    config.eos_token_id = [backend.tokenizer.eos_token_id, second]
    config.save_pretrained(model_dir)
    stopping = HFBackend(model_dir)
    assert second in stopping.eos_ids
    out = stopping.generate([prompt], 12)[0]
    assert out == backend.tokenizer.decode(full[: k + 1], skip_special_tokens=True)  # up to and with the EOS
    assert len(out) < len(backend.generate([prompt], 12)[0])
