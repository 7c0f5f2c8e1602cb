"""PPO's pieces against their defining properties (GAE, ratio clipping, value loss, KL penalty)."""

from __future__ import annotations

import torch

from esrepro.rl.ppo import gae, masked_whiten, policy_loss, token_rewards, value_loss


def test_gae_matches_its_recursion_and_the_lambda_limits():
    torch.manual_seed(0)
    r, v = torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    gamma, lam = 0.9, 0.8
    adv, ret = gae(r, v, mask, gamma, lam)
    for b in range(3):
        n = int(mask[b].sum())
        a_next = 0.0
        for t in reversed(range(n)):
            v_next = float(v[b, t + 1]) if t + 1 < n else 0.0
            delta = float(r[b, t]) + gamma * v_next - float(v[b, t])
            a_next = delta + gamma * lam * a_next
            assert abs(float(adv[b, t]) - a_next) < 1e-5
        assert torch.all(adv[b, n:] == 0) and torch.all(ret[b, n:] == 0)
    # lam = 1, gamma = 1: advantage = sum of future rewards - V_t (Monte Carlo)
    adv1, ret1 = gae(r, v, mask, 1.0, 1.0)
    mc = torch.flip(torch.cumsum(torch.flip(r * mask, [1]), 1), [1]) * mask
    assert torch.allclose(ret1, mc, atol=1e-5) and torch.allclose(adv1, (mc - v) * mask, atol=1e-5)
    # lam = 0: one-step TD error
    adv0, _ = gae(r, v, torch.ones(3, 5), gamma, 0.0)
    td = r + gamma * torch.cat([v[:, 1:], torch.zeros(3, 1)], 1) - v
    assert torch.allclose(adv0, td, atol=1e-6)


def test_policy_loss_clips_the_ratio():
    mask = torch.ones(1, 4)
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.9]]))  # ratios
    loss, clipfrac = policy_loss(logp, old, adv, mask, clip=0.2)
    # positive advantage: min(r, 1.2) -> 1.2, 1.1 ; negative: max(r, 0.8) -> 0.8, 0.9 (as -adv*ratio)
    expect = -(1.2 + 1.1 - 0.8 - 0.9) / 4
    assert abs(float(loss) - expect) < 1e-6
    assert abs(float(clipfrac) - 0.5) < 1e-6
    # clipped tokens carry no gradient
    logp = logp.clone().requires_grad_(True)
    policy_loss(logp, old, adv, mask, clip=0.2)[0].backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 2] == 0 and logp.grad[0, 1] != 0 and logp.grad[0, 3] != 0
    # at ratio 1 the loss is -mean advantage
    assert abs(float(policy_loss(old, old, adv, mask, 0.2)[0])) < 1e-7


def test_value_loss_is_clipped_around_the_old_values():
    mask = torch.ones(1, 2)
    old, ret = torch.zeros(1, 2), torch.tensor([[2.0, 0.0]])
    v = torch.tensor([[1.0, 1.0]])
    # token 0: max((1-2)^2, (0.5-2)^2) = 2.25 ; token 1: max(1, 0.25) = 1
    assert abs(float(value_loss(v, old, ret, mask, clip=0.5)) - 0.5 * (2.25 + 1.0) / 2) < 1e-6
    assert float(value_loss(ret, ret, ret, mask, 0.5)) == 0.0


def test_kl_penalty_only_with_positive_coefficient_and_score_on_the_last_token():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    logp, ref = torch.tensor([[-1.0, -2.0, -0.5, -9.0]]), torch.tensor([[-1.5, -2.0, -1.0, -3.0]])
    r, kl = token_rewards(torch.tensor([1.0]), logp, ref, mask, beta=0.1)
    assert torch.allclose(kl, torch.tensor([[0.5, 0.0, 0.5, 0.0]]))
    assert torch.allclose(r, torch.tensor([[-0.05, 0.0, 1.0 - 0.05, 0.0]]))
    r0, kl0 = token_rewards(torch.tensor([1.0]), logp, None, mask, beta=0.0)
    assert kl0 is None and torch.allclose(r0, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))


def test_whitening_is_zero_mean_unit_variance_on_the_mask():
    x, mask = torch.randn(4, 6), (torch.rand(4, 6) > 0.3).float()
    w = masked_whiten(x, mask)
    n = mask.sum()
    assert abs(float((w * mask).sum() / n)) < 1e-5
    assert abs(float(((w * mask) ** 2).sum() / n) - 1) < 1e-3
    assert torch.all(w[mask == 0] == 0)
