"""KL(fine-tuned || base), as the paper measures it, with Schulman's estimators and the exact value.

For each held-out prompt, ``n`` responses are sampled from the fine-tuned model
(pure ancestral sampling from its softmax at ``temperature``: no top-k, top-p or
repetition penalty, whatever the model's ``generation_config`` says), and each
response is scored under both models. Per response token t, with
``d_t = log p_base(y_t | y_<t) - log p_ft(y_t | y_<t)``:

- ``k1 = -d_t``: unbiased, can be negative;
- ``k3 = (exp(d_t) - 1) - d_t``: unbiased, never negative, lower variance
  (Schulman, "Approximating KL divergence", 2020);
- ``exact = sum_v p_ft(v | y_<t) (log p_ft(v | y_<t) - log p_base(v | y_<t))``:
  the full-vocabulary KL of the next-token distributions at the sampled prefix
  (cheap at evaluation time: both models' logits are there anyway).

Each is summed over the response's tokens (the end-of-sequence token included:
stopping is part of the distribution), giving three unbiased estimates of the
sequence-level KL(ft || base); they are averaged over the ``n`` responses and then
over the prompts. Sampling uses a generator seeded by (seed, prompt index), so a
seed gives identical numbers.

The estimators are pure functions of log-probabilities and logits; :func:`kl_on_prompts`
does the sampling and scoring.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from esrepro.models.responses import eos_token_ids, response_mask
from esrepro.models.tokens import prompt_ids
from esrepro.settings.pipeline import KLSettings

ESTIMATORS = ("k1", "k3", "exact")


# --- estimators (pure) --------------------------------------------------------------
def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[..., tokens]`` in float32: the log-probability of each token."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def k1(logp_ft: torch.Tensor, logp_base: torch.Tensor) -> torch.Tensor:
    """Schulman's k1 per token: ``log p_ft - log p_base`` (tokens sampled from the fine-tuned model)."""
    return logp_ft - logp_base


def k3(logp_ft: torch.Tensor, logp_base: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 per token: ``r - 1 - log r`` with ``r = p_base / p_ft``; never negative.

    Computed as ``expm1(d) - d`` (accurate for small ``d``) and clamped at 0, where
    it is mathematically, against rounding for ``|d|`` near machine precision.
    """
    d = (logp_base - logp_ft).double()
    return (torch.expm1(d) - d).clamp_min(0.0).to(logp_ft.dtype)


def exact_kl(logits_ft: torch.Tensor, logits_base: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary ``KL(p_ft || p_base)`` per position (last axis = vocabulary), float32."""
    lp_ft = F.log_softmax(logits_ft.float(), dim=-1)
    lp_base = F.log_softmax(logits_base.float(), dim=-1)
    return (lp_ft.exp() * (lp_ft - lp_base)).sum(-1)


def sequence_sums(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum per row of ``values`` over the positions where ``mask`` is true."""
    return (values * mask.to(values.dtype)).sum(-1)


def per_token_estimates(
    logits_ft: torch.Tensor, logits_base: torch.Tensor, tokens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """k1, k3 and exact per position, from both models' logits at the positions that predict ``tokens``."""
    if logits_ft.shape != logits_base.shape:
        raise ValueError(
            f"the two models' logits differ in shape ({tuple(logits_ft.shape)} vs {tuple(logits_base.shape)}): "
            "KL needs the same tokenizer and vocabulary"
        )
    lp_ft, lp_base = token_logprobs(logits_ft, tokens), token_logprobs(logits_base, tokens)
    return {"k1": k1(lp_ft, lp_base), "k3": k3(lp_ft, lp_base), "exact": exact_kl(logits_ft, logits_base)}


# --- sampling and scoring -------------------------------------------------------------
def prompt_seed(seed: int, index: int) -> int:
    """The sampling seed of prompt ``index``: independent of which other prompts are measured."""
    return (seed * 1_000_003 + index * 7_919 + 12_345) % (2**63 - 1)


@torch.no_grad()
def sample_responses(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    n: int,
    max_new_tokens: int,
    eos_ids: set[int],
    pad_id: int,
    seed: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``n`` continuations of one prompt by ancestral sampling; returns (tokens, mask).

    ``tokens`` is ``[n, L]`` (``L <= max_new_tokens``); ``mask`` marks each response's
    tokens up to and including its first end-of-sequence token.
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([list(prompt_ids)] * n, dtype=torch.long, device=device)
    out = model(input_ids=ids, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1, :]
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    steps: list[torch.Tensor] = []
    for t in range(max_new_tokens):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
        steps.append(nxt)
        finished |= torch.isin(nxt, eos)
        if bool(finished.all()) or t == max_new_tokens - 1:
            break
        out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1, :]
    tokens = torch.stack(steps, dim=1)
    return tokens, response_mask(tokens, eos_ids)


@torch.no_grad()
def score_responses(
    model_ft: torch.nn.Module,
    model_base: torch.nn.Module,
    prompt_ids: Sequence[int],
    tokens: torch.Tensor,
    temperature: float = 1.0,
    batch_size: int = 16,
) -> dict[str, torch.Tensor]:
    """Per-token k1, k3 and exact (``[n, L]``) of responses to one prompt, scored under both models."""
    device = tokens.device
    p = len(prompt_ids)
    prompt = torch.tensor(list(prompt_ids), dtype=torch.long, device=device)
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ESTIMATORS}
    for start in range(0, tokens.shape[0], batch_size):
        chunk = tokens[start : start + batch_size]
        full = torch.cat([prompt.expand(chunk.shape[0], -1), chunk], dim=1)
        # logits at positions p-1 .. p+L-2 predict the response tokens (causal: later tokens never matter)
        sl = slice(p - 1, p - 1 + chunk.shape[1])
        lf = model_ft(input_ids=full).logits[:, sl, :] / temperature
        lb = model_base(input_ids=full.to(next(model_base.parameters()).device)).logits[:, sl, :].to(device)
        est = per_token_estimates(lf, lb / temperature, chunk)
        for k in ESTIMATORS:
            parts[k].append(est[k])
    return {k: torch.cat(v, dim=0) for k, v in parts.items()}


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def kl_on_prompts(
    model_ft: torch.nn.Module,
    model_base: torch.nn.Module,
    tokenizer,
    prompts: Sequence[str],
    settings: KLSettings,
    ids: Sequence[str] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """KL(ft || base) over ``prompts``: summary, per-prompt rows and per-response rows.

    Returns ``{"summary": ..., "prompts": [...], "responses": [...]}``. The summary has,
    for each estimator, the mean over prompts of the mean over responses of the
    per-sequence sum (``"k1"``, ``"k3"``, ``"exact"``), its standard error over all
    responses (``"<est>_se"``), and the per-token mean over all response tokens
    (``"<est>_per_token"``). Responses carry their decoded text and token count.
    """
    ids = list(ids) if ids is not None else [str(i) for i in range(len(prompts))]
    eos = eos_token_ids(tokenizer, model_ft)
    if not eos:
        raise ValueError("the tokenizer names no end-of-sequence token")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    prompt_rows, response_rows = [], []
    for i, (pid, text) in enumerate(zip(ids, prompts, strict=True)):
        enc = prompt_ids(tokenizer, text)
        if not enc:
            raise ValueError(f"prompt {pid!r} encodes to no tokens")
        tokens, mask = sample_responses(model_ft, enc, settings.n_samples, settings.max_new_tokens, eos, pad,
                                        prompt_seed(settings.seed, i), settings.temperature)
        per_tok = score_responses(model_ft, model_base, enc, tokens, settings.temperature, settings.batch_size)
        seq_sums = {k: sequence_sums(per_tok[k], mask) for k in ESTIMATORS}
        sums = {k: v.tolist() for k, v in seq_sums.items()}
        lengths = mask.sum(-1).tolist()
        texts = tokenizer.batch_decode([t[m].tolist() for t, m in zip(tokens, mask, strict=True)],
                                       skip_special_tokens=True)
        for j in range(settings.n_samples):
            response_rows.append({"id": pid, "sample": j, "response": texts[j], "tokens": int(lengths[j]),
                                  **{k: float(sums[k][j]) for k in ESTIMATORS}})
        prompt_rows.append({"id": pid, "n": settings.n_samples, "mean_tokens": sum(lengths) / len(lengths),
                            **{k: sum(sums[k]) / len(sums[k]) for k in ESTIMATORS},
                            **{f"{k}_token_sum": float(seq_sums[k].sum()) for k in ESTIMATORS}})
        if progress:
            print(f"kl: prompt {i + 1}/{len(prompts)} {pid}: "
                  + ", ".join(f"{k}={prompt_rows[-1][k]:.4g}" for k in ESTIMATORS), flush=True)
    n_tokens = sum(r["tokens"] for r in response_rows)
    summary: dict[str, Any] = {"n_prompts": len(prompt_rows), "n_responses": len(response_rows),
                               "mean_tokens": n_tokens / len(response_rows) if response_rows else 0.0,
                               "settings": settings.as_dict()}
    for k in ESTIMATORS:
        summary[k] = sum(r[k] for r in prompt_rows) / len(prompt_rows) if prompt_rows else math.nan
        summary[f"{k}_se"] = _mean_se([r[k] for r in response_rows])[1] if response_rows else math.nan
        summary[f"{k}_per_token"] = sum(r[f"{k}_token_sum"] for r in prompt_rows) / n_tokens if n_tokens else 0.0
    for r in prompt_rows:
        for k in ESTIMATORS:
            del r[f"{k}_token_sum"]
    return {"summary": summary, "prompts": prompt_rows, "responses": response_rows}


# --- one checkpoint: greedy reward and KL ---------------------------------------------------
def measure_checkpoint(
    model_dir,
    base_model: torch.nn.Module,
    task,
    examples: list[dict],
    settings: KLSettings,
    *,
    dtype: str = "float32",
    chat: bool = False,
    device: str = "cpu",
    progress: bool = False,
) -> dict[str, Any]:
    """Greedy reward and KL(checkpoint || base) on ``examples``; sampled responses graded too.

    Returns ``{"summary", "prompts", "responses", "eval"}``: ``summary`` adds to the KL
    summary the greedy ``reward`` and ``accuracy`` (as ``esrepro evaluate`` computes
    them) and the mean reward of the sampled responses (``reward_sampled``).
    """
    from esrepro.backends.hf import HFBackend
    from esrepro.evaluate import evaluate

    backend = HFBackend(model_dir, dtype=dtype, device=device, batch_size=settings.batch_size, chat=chat)
    greedy = evaluate(backend, task, examples, settings.eval_max_new_tokens or settings.max_new_tokens,
                      settings.batch_size, progress=False)
    prompts = [backend.format_prompt(task.prompt(e)) for e in examples]
    out = kl_on_prompts(backend.model, base_model, backend.tokenizer, prompts, settings,
                        ids=[e["id"] for e in examples], progress=progress)
    by_id = {e["id"]: e for e in examples}
    for row in out["responses"]:
        s = task.score(row["response"], by_id[row["id"]])
        row["reward"], row["correct"] = s.reward, s.correct
    rewards = [r["reward"] for r in out["responses"]]
    out["summary"].update(
        reward=greedy.metrics["mean_reward"],
        accuracy=greedy.metrics["accuracy"],
        reward_sampled=sum(rewards) / len(rewards) if rewards else math.nan,
    )
    out["eval"] = greedy.responses
    return out
