"""KL(fine-tuned || base): estimators are zero for identical models, k3 is never negative,
and on a small model k1 and k3 agree with the exact KL within sampling error."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from esrepro.kl import (
    ESTIMATORS,
    KLSettings,
    exact_kl,
    k1,
    k3,
    kl_on_prompts,
    per_token_estimates,
    sample_responses,
    sequence_sums,
    token_logprobs,
)
from esrepro.models.loading import load_model, load_tokenizer

PROMPTS = ["Using the numbers [3 4], make 7.", "Using the numbers [12 5], make 17. <think>"]


def test_estimators_are_zero_for_identical_distributions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 50, generator=g) * 4
    tokens = torch.randint(0, 50, (3, 5), generator=g)
    est = per_token_estimates(logits, logits.clone(), tokens)
    for name in ESTIMATORS:
        assert torch.equal(est[name], torch.zeros_like(est[name])), name


def test_k3_is_never_negative():
    g = torch.Generator().manual_seed(1)
    lp_ft = -torch.rand(10_000, generator=g) * 30
    lp_base = -torch.rand(10_000, generator=g) * 30
    tiny = lp_ft + torch.randn(10_000, generator=g) * 1e-7  # differences near machine precision
    for other in (lp_base, tiny, lp_ft):
        assert (k3(lp_ft, other) >= 0).all()
        assert (k3(lp_ft.double(), other.double()) >= 0).all()
    # k1 is not: it can be negative for single tokens
    assert (k1(lp_ft, lp_base) < 0).any()


def test_exact_kl_matches_torch_and_is_nonnegative():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 7, 30, generator=g), torch.randn(4, 7, 30, generator=g)
    ref = F.kl_div(F.log_softmax(b, -1), F.log_softmax(a, -1), log_target=True, reduction="none").sum(-1)
    assert torch.allclose(exact_kl(a, b), ref, atol=1e-5)
    assert (exact_kl(a, b) >= 0).all()


def test_token_logprobs_and_sequence_sums():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
    lp = token_logprobs(logits, torch.tensor([[0, 2]]))
    assert torch.allclose(lp, torch.log(torch.tensor([[0.5, 0.8]])))
    assert sequence_sums(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[True, True, False]])).item() == 3.0


def _perturbed_copy(model_dir, sigma: float, seed: int = 0):
    model = load_model(model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * sigma)
    return model


def test_identical_models_give_zero_kl(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    a, b = load_model(tiny_model_dir), load_model(tiny_model_dir)
    out = kl_on_prompts(a, b, tok, PROMPTS, KLSettings(n_samples=6, max_new_tokens=10, seed=3))
    for name in ESTIMATORS:
        assert out["summary"][name] == 0.0 and out["summary"][f"{name}_per_token"] == 0.0
        assert all(r[name] == 0.0 for r in out["responses"])
    assert out["summary"]["n_responses"] == 12 and len(out["prompts"]) == 2


def test_sampling_masks_after_end_of_sequence(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    eos = tok.eos_token_id
    ids = tok(PROMPTS[0], add_special_tokens=False)["input_ids"]
    tokens, mask = sample_responses(model, ids, 32, 12, {eos}, tok.pad_token_id, seed=0, temperature=3.0)
    assert tokens.shape[0] == 32 and tokens.shape[1] <= 12
    for row, m in zip(tokens.tolist(), mask.tolist(), strict=True):
        if eos in row:
            stop = row.index(eos)
            assert all(m[: stop + 1]) and not any(m[stop + 1 :])
        else:
            assert all(m)


def test_same_seed_same_numbers(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    base, ft = load_model(tiny_model_dir), _perturbed_copy(tiny_model_dir, 0.02)
    s = KLSettings(n_samples=4, max_new_tokens=8, seed=7)
    one = kl_on_prompts(ft, base, tok, PROMPTS, s)
    two = kl_on_prompts(ft, base, tok, PROMPTS, s)
    assert one == two
    other = kl_on_prompts(ft, base, tok, PROMPTS, KLSettings(n_samples=4, max_new_tokens=8, seed=8))
    assert other["responses"] != one["responses"]


def test_single_token_exact_kl_is_the_next_token_kl(tiny_model_dir):
    """With one new token the exact estimate is not random: it is KL of the next-token distributions."""
    tok = load_tokenizer(tiny_model_dir)
    base, ft = load_model(tiny_model_dir), _perturbed_copy(tiny_model_dir, 0.05)
    out = kl_on_prompts(ft, base, tok, PROMPTS[:1], KLSettings(n_samples=3, max_new_tokens=1, seed=0))
    ids = torch.tensor([tok(PROMPTS[0], add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        ref = exact_kl(ft(input_ids=ids).logits[0, -1], base(input_ids=ids).logits[0, -1]).item()
    assert all(r["exact"] == pytest.approx(ref, rel=1e-4) for r in out["responses"])


def test_k1_and_k3_agree_with_exact_within_sampling_error(tiny_model_dir):
    """All three are unbiased for the sequence KL: their paired differences average to zero."""
    tok = load_tokenizer(tiny_model_dir)
    base, ft = load_model(tiny_model_dir), _perturbed_copy(tiny_model_dir, 0.03, seed=1)
    out = kl_on_prompts(ft, base, tok, PROMPTS, KLSettings(n_samples=300, max_new_tokens=6, seed=11, batch_size=100))
    rows = out["responses"]
    exact = out["summary"]["exact"]
    assert exact > 0.01  # the perturbation moves the distribution measurably
    for name in ("k1", "k3"):
        diffs = [r[name] - r["exact"] for r in rows]
        mean = sum(diffs) / len(diffs)
        se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
        assert abs(mean) < 4 * se + 1e-6, (name, mean, se, exact)
        assert abs(out["summary"][name] - exact) < 4 * se + 1e-6
    assert all(r["k3"] >= 0 and r["exact"] >= 0 for r in rows)
