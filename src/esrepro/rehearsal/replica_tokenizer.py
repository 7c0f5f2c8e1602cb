"""A replica's tokenizer: a small byte-level BPE trained deterministically on a built-in text, with the pre-tokenizer,
special tokens (in the real id order, after the BPE vocabulary), chat template and ``tokenizer_config.json`` class of
its facts (:func:`esrepro.models.tokenizer_families.facts_for`: a family's where its tokenizer is documented to differ, else
generic)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from esrepro.models.tokenizer_families import BPE_VOCAB, Facts

_TEXT = """\
Let x be a real number such that 3x + 5 = 20. Then 3x = 15, so x = 5. The answer is \\boxed{5}.
Using the numbers [19, 36, 55, 7], create an equation that equals 65. <think> 55 + 36 - 19 - 7 = 65 </think>
<answer> 55 + 36 - 19 - 7 </answer>
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
How many clips did Natalia sell altogether in April and May? 48 / 2 = 24 and 48 + 24 = 72. #### 72
The sum of the interior angles of a polygon with n sides is 180(n - 2) degrees.
If f(x) = x^2 - 4x + 4, then f(x) = (x - 2)^2 and its minimum value is 0.
Find the remainder when 2^{10} is divided by 7. Since 2^3 = 8 = 1 (mod 7), 2^{10} = 2 (mod 7).
The probability of rolling a sum of 7 with two fair dice is 6/36 = 1/6.
Solve the system: x + y = 10 and x - y = 2. Adding gives 2x = 12, so x = 6 and y = 4.
The area of a circle of radius r is \\pi r^2; with r = 3 it is 9\\pi.
"""


def corpus(seed: int = 0) -> list[str]:
    """The fixed training text: worked maths lines and generated arithmetic, the same for every call."""
    rng = random.Random(f"replica-corpus-{seed}")
    lines = _TEXT.splitlines()
    for _ in range(400):
        a, b = rng.randint(0, 999), rng.randint(1, 99)
        op = rng.choice("+-*/")
        value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 3)}[op]
        lines.append(f"Compute {a} {op} {b}. The result is {value}.")
    return lines


def train_tokenizer(facts: Facts, seed: int = 0) -> Tokenizer:
    """The replica's ``tokenizers`` object: BPE on :func:`corpus`, then the facts' added tokens."""
    tok = Tokenizer(models.BPE())
    if facts.nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(facts.split_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in facts.specials])
    if facts.plain_added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in facts.plain_added])
    if facts.add_bos:
        bos = facts.bos_token
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_config(facts: Facts, tok: Tokenizer, model_max_length: int) -> dict:
    """``tokenizer_config.json`` as the real repository writes it (the class transformers loads, the specials);
    ``model_max_length``: the model's context (its config's ``max_position_embeddings``)."""
    added = {}
    for token in facts.specials + facts.plain_added:
        added[str(tok.token_to_id(token))] = {"content": token, "lstrip": False, "normalized": False,
                                              "rstrip": False, "single_word": False,
                                              "special": token in facts.specials}
    cfg: dict = {"added_tokens_decoder": added, "bos_token": facts.bos_token, "eos_token": facts.eos_token,
                 "clean_up_tokenization_spaces": False, "model_max_length": model_max_length,
                 "tokenizer_class": facts.tokenizer_class, **facts.tokenizer_config}
    if facts.chat_template is not None:
        cfg["chat_template"] = facts.chat_template
    return cfg


def write_tokenizer(facts: Facts, out: Path, model_max_length: int, seed: int = 0) -> Tokenizer:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` (and, as the facts' repository carries them,
    ``vocab.json``/``merges.txt`` or ``special_tokens_map.json``) into ``out``; the tokenizer."""
    tok = train_tokenizer(facts, seed)
    tok.save(str(out / "tokenizer.json"), pretty=True)
    _dump(out / "tokenizer_config.json", tokenizer_config(facts, tok, model_max_length))
    if facts.vocab_files:
        tok.model.save(str(out))
    if facts.special_tokens_map:
        tokens = {"bos_token": facts.bos_token, "eos_token": facts.eos_token}
        if facts.pad_token and "pad_token" in facts.tokenizer_config:
            tokens["pad_token"] = facts.pad_token
        _dump(out / "special_tokens_map.json", tokens)
    return tok


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
