"""The embedded tiny default model: a local byte-level BPE tokenizer and a ~1M-parameter
causal LM (Qwen2's architecture unless the build names another ``model_type``), warm-started by a short SFT on
Countdown-format text.

Everything is built from generated data, offline, deterministically from the
registry entry's ``build`` block. The SFT is a plain PyTorch loop rather than
TRL's SFTTrainer: it is a 1M-parameter warm start, not a method under study, and a
short loop with an explicit seed is fully deterministic on CPU and starts in
milliseconds (TRL and accelerate add seconds of import and a dataset pipeline).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerFast
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from esrepro.io import atomic_path, write_json, write_jsonl
from esrepro.models.architecture import build_config_facts
from esrepro.models.loading import save_tokenizer
from esrepro.models.warm_start import GENERATOR_OPTIONS, fresh_countdown
from esrepro.runtime import numerics

EOS = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``.

    Digits are split one per token (as Qwen2's pre-tokenizer does); every other span is
    left whole (no GPT-2 word regex), so BPE merges the fixed prompt template into a few
    long tokens. The authors' 400-character Countdown prompt becomes ~25 tokens instead
    of ~140, which makes SFT and generation on 2 CPU cores several times faster.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def build_model(architecture: dict, vocab_size: int, eos_id: int, seed: int) -> PreTrainedModel:
    """A freshly initialised causal LM of the build's architecture (:func:`build_config_facts`), seeded."""
    facts = build_config_facts(architecture, vocab_size, eos_id)
    config = AutoConfig.for_model(facts.pop("model_type"), **facts)
    torch.manual_seed(seed)
    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)](config)


def _encode_pairs(
    tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str]], max_len: int,
    max_prompt_tokens: int | None = None,
) -> list[tuple[list[int], list[int]]]:
    """Token ids and labels (prompt masked with -100) for (prompt, completion) pairs; with ``max_prompt_tokens``
    a prompt keeps only its last tokens, as evaluation truncates long prompts."""
    out = []
    for prompt, completion in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if max_prompt_tokens is not None:
            p = p[-max_prompt_tokens:]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = (p + c)[:max_len]
        labels = ([-100] * len(p) + c)[:max_len]
        out.append((ids, labels))
    return out


def sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    pairs: list[tuple[str, str]],
    epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    log: Callable[[dict], None] | None = None,
    groups: list[int] | None = None,
    max_prompt_tokens: int | None = None,
) -> list[float]:
    """Supervised fine-tuning on completions (prompt tokens masked); returns per-step losses.

    ``groups`` (one label per pair, e.g. its task) makes every batch hold pairs of one group only, so
    short formats are not padded to the longest (v2's mixed warm start); the batches' order is shuffled.
    """
    encoded = _encode_pairs(tokenizer, pairs, model.config.max_position_embeddings, max_prompt_tokens)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    order = _grouped_order(groups, batch_size) if groups is not None else _shuffled_order(len(encoded), batch_size)
    steps_per_epoch = order(None)
    total = epochs * steps_per_epoch
    opt = numerics.adamw(model.parameters(), lr=learning_rate, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, total // 20)) * 0.5 * (1 + math.cos(math.pi * s / total))
    )
    pad = tokenizer.pad_token_id
    losses: list[float] = []
    model.train()
    model.requires_grad_(True)
    with tqdm(total=total, desc="tiny SFT", unit="step") as bar:
        for epoch in range(epochs):
            for idx in order(rng):
                batch = [encoded[i] for i in idx]
                width = max(len(ids) for ids, _ in batch)
                input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
                labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
                mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
                loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                value = loss.item()
                losses.append(value)
                if log:
                    log({"epoch": epoch, "step": len(losses) - 1, "loss": value})
                bar.set_postfix(loss=f"{value:.3f}")
                bar.update()
    model.eval()
    model.requires_grad_(False)
    return losses


def _shuffled_order(n: int, batch_size: int) -> Callable:
    """An epoch's batches: the pairs shuffled, then cut into batches (``order(None)``: batches per epoch)."""
    steps = math.ceil(n / batch_size)

    def order(rng: random.Random | None):
        if rng is None:
            return steps
        ix = list(range(n))
        rng.shuffle(ix)
        return [ix[b * batch_size : (b + 1) * batch_size] for b in range(steps)]

    return order


def _grouped_order(groups: list, batch_size: int) -> Callable:
    """An epoch's batches of one group each: every group shuffled and cut into batches, then the batches shuffled
    (``order(None)``: batches per epoch)."""
    by_group: dict = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)

    def order(rng: random.Random | None):
        if rng is None:
            return sum(math.ceil(len(ix) / batch_size) for ix in by_group.values())
        batches = []
        for g in sorted(by_group, key=str):
            ix = list(by_group[g])
            rng.shuffle(ix)
            batches += [ix[b:b + batch_size] for b in range(0, len(ix), batch_size)]
        rng.shuffle(batches)
        return batches

    return order


def build_tiny(build: dict, exclude: Iterable[dict], out_dir: str | Path, data_source: dict | None = None) -> dict:
    """Build the tiny model from a registry ``build`` block into ``out_dir`` (atomically).

    ``exclude`` holds the prepared train/test examples: SFT and tokenizer problems that
    coincide with any of them are dropped, so the warm start never sees evaluation data.
    ``data_source`` is the task's configured data source: its generator options (number
    count and ranges) make the warm-start problems follow the same distribution.
    Returns a summary (parameter count, final SFT loss, problem counts).
    """
    from esrepro.tasks.countdown import CountdownTask, sft_completion

    seed = build["seed"]
    task = CountdownTask()
    exclude = list(exclude)
    options = {k: v for k, v in (data_source or {}).items() if k in GENERATOR_OPTIONS}
    tok_problems = fresh_countdown(build["tokenizer"]["corpus_problems"], seed + 1, data_source or {}, exclude)
    sft_problems = fresh_countdown(build["sft"]["problems"], seed + 2, data_source or {}, exclude)
    # prompts and completions are separate texts: no merge may straddle the boundary
    corpus = [text for p in tok_problems for text in (task.prompt(p), sft_completion(p))]
    pairs = [(task.prompt(p), sft_completion(p)) for p in sft_problems]
    return _warm_start(build, corpus, pairs, out_dir, {"generator_options": options, "sft_problems": len(sft_problems),
                                                       "tokenizer_problems": len(tok_problems)})


def _warm_start(build: dict, corpus: list[str], pairs: list[tuple[str, str]], out_dir: str | Path,
                facts: dict, **sft_options: Any) -> dict:
    """Train the tokenizer on ``corpus``, build the model, fine-tune it on ``pairs`` and save both (atomically) with
    build.json (the build block and a summary holding ``facts``) and sft_log.jsonl; returns the summary."""
    seed = build["seed"]
    tokenizer = train_tokenizer(corpus, build["tokenizer"]["vocab_size"])
    model = build_model(build["architecture"], len(tokenizer), tokenizer.eos_token_id, seed)
    sft_log: list[dict] = []
    s = build["sft"]
    losses = sft(model, tokenizer, pairs, s["epochs"], s["learning_rate"], s["prompts_per_step"], seed,
                 sft_log.append, **sft_options)
    summary = {"parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tokenizer), **facts,
               "sft_steps": len(losses), "sft_final_loss": losses[-1]}
    with atomic_path(out_dir, is_dir=True) as tmp:
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)  # so that transformers' AutoTokenizer loads it as trained
        write_jsonl(tmp / "sft_log.jsonl", sft_log)
        write_json(tmp / "build.json", {"build": build, "summary": summary})
    return summary


# --- v2: a tiny model warm-started on several task formats ---------------------------------
def build_tiny_tasks(build: dict, exclude: dict[str, list[dict]], out_dir: str | Path,
                     data_sources: dict[str, dict] | None = None) -> dict:
    """Build a tiny model whose warm start mixes several formats (``build.sft.tasks: {task: problems}``).

    Like :func:`build_tiny`, with :mod:`esrepro.models.warm_start` drawing each task's pairs:
    ``exclude`` holds each task's prepared rows (never trained on), ``data_sources`` each task's
    configured source (generator options such as Sudoku's blanks). The tokenizer is trained on
    ``tokenizer.corpus_problems`` pairs split across the tasks in the same proportions.
    """
    from esrepro.models.warm_start import mixed_pairs

    seed = build["seed"]
    counts = {t: int(n) for t, n in build["sft"]["tasks"].items()}
    total = sum(counts.values())
    corpus_n = build["tokenizer"]["corpus_problems"]
    corpus_counts = {t: max(10, round(corpus_n * n / total)) for t, n in counts.items()}
    sources = dict(data_sources or {})
    corpus_pairs, _, _ = mixed_pairs(corpus_counts, seed + 1, sources, exclude)
    corpus = [text for pair in corpus_pairs for text in pair]  # prompt and completion apart: no merge straddles them
    pairs, made, groups = mixed_pairs(counts, seed + 2, sources, exclude)
    return _warm_start(build, corpus, pairs, out_dir,
                       {"sft_tasks": made, "sft_problems": len(pairs), "tokenizer_problems": len(corpus_pairs)},
                       groups=groups, max_prompt_tokens=build["sft"].get("max_prompt_tokens"))
