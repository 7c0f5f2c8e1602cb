"""ES noise, perturbation, restore and the decomposed update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from esrepro.models.loading import load_model
from esrepro.perturb.noise import member_seed, tensor_noise, tensor_seed
from esrepro.perturb.ops import perturb_, restore_exact_, restore_subtract_, snapshot, update_, zscore


def _params(model_dir, dtype="float32"):
    model = load_model(model_dir, dtype=dtype)
    return model, [p.data for p in model.parameters()]


def test_member_seeds_are_pure_and_distinct():
    seeds = [member_seed(7, it, n) for it in range(20) for n in range(30)]
    assert seeds == [member_seed(7, it, n) for it in range(20) for n in range(30)]
    assert len(set(seeds)) == len(seeds)
    assert member_seed(7, 0, 0) != member_seed(8, 0, 0)
    assert all(0 <= s < 2**30 for s in seeds)


def test_iid_noise_differs_per_tensor_correlated_does_not():
    p = torch.zeros(4, 5)
    a, b = tensor_noise(p, 123, 0, "iid"), tensor_noise(p, 123, 1, "iid")
    assert not torch.equal(a, b)
    assert torch.equal(a, tensor_noise(p, 123, 0, "iid"))
    c, d = tensor_noise(p, 123, 0, "correlated"), tensor_noise(p, 123, 1, "correlated")
    assert torch.equal(c, d)
    # the correlated variant is exactly the authors' reseeding with the member seed
    g = torch.Generator().manual_seed(123)
    assert torch.equal(c, torch.randn((4, 5), generator=g))
    assert tensor_seed(5, 3, "correlated") == 5
    with pytest.raises(ValueError, match="noise variant"):
        tensor_seed(5, 3, "nope")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_perturb_then_exact_restore_is_bit_identical(tiny_model_dir, dtype):
    _, params = _params(tiny_model_dir, dtype)
    before = [p.clone() for p in params]
    saved = snapshot(params)
    for s in range(5):
        perturb_(params, member_seed(0, 0, s), 0.01, "iid")
        assert any(not torch.equal(p, b) for p, b in zip(params, before, strict=True))
        restore_exact_(params, saved)
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))


def test_subtract_restore_drifts_in_bfloat16_only_slightly_in_float32(tiny_model_dir):
    drift = {}
    for dtype in ("float32", "bfloat16"):
        _, params = _params(tiny_model_dir, dtype)
        before = [p.float().clone() for p in params]
        for s in range(50):
            perturb_(params, s, 0.001, "iid")
            restore_subtract_(params, s, 0.001, "iid")
        drift[dtype] = max(float((p.float() - b).abs().max()) for p, b in zip(params, before, strict=True))
    assert drift["float32"] < 1e-6
    assert drift["bfloat16"] > 10 * drift["float32"]


def test_zscore_matches_authors_formula():
    r = [0.1, 0.5, 0.5, 1.1]
    a = np.asarray(r, dtype=np.float32)
    assert np.array_equal(zscore(r), (a - a.mean()) / (a.std() + 1e-8))
    assert np.allclose(zscore([0.3] * 4), 0.0)


@pytest.mark.parametrize("variant", ["iid", "correlated"])
def test_decomposed_update_equals_dense_reference(tiny_model_dir, variant):
    _, params = _params(tiny_model_dir)
    theta0 = torch.cat([p.flatten() for p in params]).clone()
    seeds = [member_seed(3, 1, n) for n in range(6)]
    z = zscore([0.0, 0.2, 1.1, 0.7, 0.1, 0.4]).tolist()
    alpha = 0.05
    # dense reference: materialise every member's full-model noise vector
    eps = torch.stack([torch.cat([tensor_noise(p, s, k, variant).flatten() for k, p in enumerate(params)]) for s in seeds])
    expected = theta0 + alpha / len(seeds) * (torch.tensor(z, dtype=torch.float32) @ eps)
    update_(params, seeds, z, alpha, variant)
    got = torch.cat([p.flatten() for p in params])
    assert not torch.equal(got, theta0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_fp32_masters_keep_updates_smaller_than_a_bf16_ulp(tiny_model_dir):
    results = {}
    for use_masters in (False, True):
        _, params = _params(tiny_model_dir, "bfloat16")
        start = [p.float().clone() for p in params]
        masters = [p.float().clone() for p in params] if use_masters else None
        for it in range(20):
            update_(params, [member_seed(0, it, n) for n in range(4)], [1.0, -1.0, 0.5, -0.5], 1e-5, "iid", masters)
        results[use_masters] = sum(int((p.float() != s).sum()) for p, s in zip(params, start, strict=True))
    assert results[True] > results[False]


def test_update_rejects_mismatched_lengths(tiny_model_dir):
    _, params = _params(tiny_model_dir)
    with pytest.raises(ValueError, match="3 seeds but 2 weights"):
        update_(params, [1, 2, 3], [0.1, 0.2], 0.1, "iid")
