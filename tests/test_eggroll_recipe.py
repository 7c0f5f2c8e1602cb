"""EGGROLL's own recipe as options of (low-rank) ES: antithetic pairs, centred fitness, the sigma / √N step.

The references are typed here from the authors' code (ESHyperscale/HyperscaleES at b77f7d6,
``src/hyperscalees/noiser/eggroll.py``), not taken from the library: thread i draws noise number i // 2 and
perturbs by +sigma for even i, -sigma for odd i (``get_lora_update_params``, ``get_nonlora_update_params``); the
fitness is (s - mean of the group) / sqrt(var(all scores) + 1e-5) (``convert_fitnesses``); the update is
lr * √N * mean_i(f_i * (±sigma) eps_{i // 2}) (``_simple_full_update`` / ``_simple_lora_update`` and
``_do_update`` under SGD). Only the drawing convention is shared with the library: a seed's noise comes from the
generator of (seed, tensor), the low-rank factors from one (n + m) x r block of it, B its first n rows.
Rewards are drawn as a Countdown run produces them: each member's mean over prompts of 0.1 x format + answer.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from esrepro.es.strategy import ESStrategy
from esrepro.perturb.lowrank import factors, lowrank_update_, member_noise, update_delta
from esrepro.perturb.noise import MIRROR_BIT, member_seed, mirror, noise_like, tensor_seed
from esrepro.perturb.ops import update_

SHAPES = [(7, 5), (16, 3), (4, 4)]
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _rewards(rng: np.random.Generator, n: int, prompts: int = 16) -> list[float]:
    """Mean Countdown rewards of ``n`` members over ``prompts`` problems (0.1 format + 1 answer each)."""
    fmt = rng.random((n, prompts)) < rng.uniform(0.3, 0.9)
    ans = fmt & (rng.random((n, prompts)) < rng.uniform(0.1, 0.5))
    return (0.1 * fmt + ans).mean(axis=1).tolist()


def _typed_noise(shape, seed: int, k: int, variant: str) -> torch.Tensor:
    """The standard normal noise of tensor k under an unmirrored seed: randn from the generator of (seed, k)."""
    g = torch.Generator().manual_seed(tensor_seed(seed, k, variant))
    return torch.randn(shape, generator=g, dtype=torch.float32)


def _typed_factors(shape, seed: int, k: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = shape
    g = torch.Generator().manual_seed(tensor_seed(seed, k, "iid"))
    z = torch.randn((n + m, r), generator=g, dtype=torch.float32)
    return z[n:], z[:n]


def _authors_fitness(scores: np.ndarray, group_size: int) -> np.ndarray:
    """convert_fitnesses, typed: centred within each group, divided by the sqrt of all scores' variance + 1e-5."""
    groups = scores.reshape(-1, group_size)
    return ((groups - groups.mean(axis=1, keepdims=True)) / np.sqrt(scores.var() + 1e-5)).ravel()


# --- antithetic noise ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["iid", "correlated"])
@pytest.mark.parametrize("run_seed", [0, 3, 11])
def test_a_mirrored_members_full_rank_noise_is_exactly_minus_its_partners(variant, run_seed):
    for it in range(2):
        for base in ESStrategy(6, 1e-3, 5e-4, run_seed, antithetic=True).ask(it)[::2]:
            assert base < MIRROR_BIT
            for k, shape in enumerate(SHAPES):
                eps = noise_like(shape, "cpu", base, k, variant)
                assert torch.equal(eps, _typed_noise(shape, base, k, variant))
                assert torch.equal(noise_like(shape, "cpu", mirror(base), k, variant), -eps)


@pytest.mark.parametrize("rank", [1, 3])
@pytest.mark.parametrize("run_seed", [0, 5])
def test_a_mirrored_members_low_rank_noise_is_exactly_minus_its_partners(rank, run_seed):
    for base in ESStrategy(4, 1e-3, 5e-4, run_seed, antithetic=True).ask(1)[::2]:
        for k, shape in enumerate(SHAPES):
            A, B = _typed_factors(shape, base, k, rank)
            Am, Bm = factors(shape, "cpu", mirror(base), k, rank, "iid")
            assert torch.equal(Am, -A) and torch.equal(Bm, B), "mirror: A negated, B shared"
            E = member_noise(shape, "cpu", base, k, rank, "iid")
            assert torch.allclose(E, A @ B.T / math.sqrt(rank), rtol=0, atol=1e-6)
            assert torch.equal(member_noise(shape, "cpu", mirror(base), k, rank, "iid"), -E)


def test_a_mirrored_members_vllm_adapter_negates_lora_b_only(tiny_model_dir, tmp_path):
    """The adapter vLLM scores a member with: mirror s holds lora_B = -A and lora_A = Bᵀ of s, so its update
    sigma lora_B lora_A / √r is minus s's."""
    from safetensors.torch import load_file

    from esrepro.backends.vllm_eggroll import lowrank_targets
    from esrepro.perturb.adapter import ADAPTER_WEIGHTS, write_member_adapter

    targets, base = lowrank_targets(tiny_model_dir), member_seed(9, 2, 1)
    plus = load_file(str(write_member_adapter(tmp_path / "p", targets, base, 0.1, 2, "iid") / ADAPTER_WEIGHTS))
    minus = load_file(str(write_member_adapter(tmp_path / "m", targets, mirror(base), 0.1, 2, "iid")
                          / ADAPTER_WEIGHTS))
    assert plus.keys() == minus.keys() and len(plus) >= 2
    for key, t in plus.items():
        assert torch.equal(minus[key], -t if key.endswith("lora_B.weight") else t), key


def test_mirroring_refuses_a_seed_that_already_uses_bit_30():
    with pytest.raises(ValueError, match="2\\*\\*30"):
        mirror(MIRROR_BIT + 1)


@pytest.mark.parametrize("rank", [None, 2])
def test_the_hf_engine_perturbs_a_mirrored_member_by_minus_its_partner(tiny_model_dir, rank):
    """In place on a tiny transformers model: W(mirror s) - W0 == -(W(s) - W0), full-rank and low-rank."""
    from esrepro.backends.hf import HFEngine

    sigma = 0.05
    engine = HFEngine(tiny_model_dir, rank=rank, restore="exact")
    w0 = {n: p.detach().clone() for n, p in engine.named_parameters()}
    base = member_seed(2, 0, 0)

    def delta(seed: int) -> dict[str, torch.Tensor]:
        engine.perturb(seed, sigma)
        out = {n: p.detach() - w0[n] for n, p in engine.named_parameters()}
        engine.restore(seed, sigma)
        return out

    plus, minus = delta(base), delta(mirror(base))
    moved = 0
    for name in w0:
        assert torch.allclose(minus[name], -plus[name], rtol=0, atol=1e-6), name
        moved += bool(plus[name].abs().max() > 1e-4)
    assert moved >= 4, "the member should move several tensors (test too weak)"


# --- the update ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rng_seed", [0, 1, 2])
def test_antithetic_pairs_with_equal_rewards_cancel(rng_seed):
    rng = np.random.default_rng(rng_seed)
    strategy = ESStrategy(8, 1e-2, 5e-3, rng_seed, antithetic=True, fitness="centred", step="sigma_sqrt_n")
    seeds = strategy.ask(0)
    pair_rewards = _rewards(rng, 4)
    rewards = [r for r in pair_rewards for _ in range(2)]
    update = strategy.tell(seeds, rewards)
    assert max(abs(w) for w in update.weights) > 0.1, "the weights must not vanish themselves (test too weak)"

    params = [torch.randn(s, generator=torch.Generator().manual_seed(rng_seed)) for s in SHAPES]
    before = [p.clone() for p in params]
    update_(params, update.seeds, update.weights, update.alpha, "iid")
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True)), "full rank: exactly no change"

    targets = list(range(len(params)))
    lowrank_update_(params, targets, update.seeds, update.weights, update.alpha, 2, "iid")
    for p, b in zip(params, before, strict=True):
        assert torch.allclose(p, b, rtol=0, atol=1e-7)
    unequal = strategy.tell(seeds, _rewards(rng, 8))  # the same seeds, rewards that differ within pairs: it moves
    lowrank_update_(params, targets, unequal.seeds, unequal.weights, unequal.alpha, 2, "iid")
    assert any(not torch.allclose(p, b, rtol=0, atol=1e-5) for p, b in zip(params, before, strict=True))


@pytest.mark.parametrize("rng_seed", [0, 4, 9])
def test_centred_weights_equal_the_authors_formula(rng_seed):
    rng = np.random.default_rng(rng_seed)
    n = 2 * int(rng.integers(2, 16))
    rewards = _rewards(rng, n)
    strategy = ESStrategy(n, 1e-3, 5e-4, 0, antithetic=True, fitness="centred")
    r = np.asarray(rewards, dtype=np.float64)
    by_hand = (r - r.mean()) / np.sqrt(r.var() + 1e-5)
    got = strategy.weights(rewards)
    assert np.allclose(got, by_hand, rtol=1e-5, atol=1e-6)
    assert np.allclose(got, _authors_fitness(r, n), rtol=1e-5, atol=1e-6), "the population is one group"
    z = (r - r.mean()) / (r.std() + 1e-8)
    assert not np.allclose(got, z, rtol=1e-5, atol=0), "centred must differ from the z-score (test too weak)"


def test_centred_weights_shrink_where_rewards_barely_differ():
    """Where the variance is near 1e-5 (one member's format reward on one of 64 prompts) centred weights are damped;
    z-scores are not (they are scale-free)."""
    n = 8
    rewards = [0.5] * n
    rewards[3] += 0.1 / 64
    got = ESStrategy(n, 1e-3, 5e-4, 0, fitness="centred").weights(rewards)
    r = np.asarray(rewards, dtype=np.float64)
    assert np.allclose(got, (r - r.mean()) / np.sqrt(r.var() + 1e-5), rtol=1e-4, atol=1e-6)
    assert abs(got[3]) < 0.5 and abs(ESStrategy(n, 1e-3, 5e-4, 0).weights(rewards)[3]) > 2


@pytest.mark.parametrize("rng_seed", [0, 7])
def test_full_recipe_update_equals_the_authors_equation(rng_seed):
    """theta += lr * √N * mean_i(f_i * s_i * sigma * eps_{i // 2}), thread i's sign s_i = +1 even, -1 odd."""
    rng = np.random.default_rng(rng_seed)
    n, sigma, lr = 10, 0.02, 0.3
    strategy = ESStrategy(n, sigma, lr, rng_seed, antithetic=True, fitness="centred", step="sigma_sqrt_n")
    seeds = strategy.ask(3)
    rewards = _rewards(rng, n)
    update = strategy.tell(seeds, rewards)

    params = [torch.randn(s, generator=torch.Generator().manual_seed(1)) for s in SHAPES]
    w0 = [p.double().clone() for p in params]
    update_(params, update.seeds, update.weights, update.alpha, "iid")
    f = _authors_fitness(np.asarray(rewards, dtype=np.float64), n)
    noise_seeds = seeds[::2]  # the authors' noise number j = i // 2
    for k, (p, base) in enumerate(zip(params, w0, strict=True)):
        mean = sum(f[i] * (1 if i % 2 == 0 else -1) * sigma * _typed_noise(SHAPES[k], noise_seeds[i // 2], k, "iid")
                   .double() for i in range(n)) / n
        expected = base + lr * math.sqrt(n) * mean
        assert torch.allclose(p.double(), expected, rtol=0, atol=1e-6), k
        assert not torch.allclose(p.double(), base, rtol=0, atol=1e-4)


def test_low_rank_recipe_update_equals_the_authors_equation():
    """Low rank: theta += lr * √N * mean_i(f_i * s_i (sigma / √r) A_j B_jᵀ), j = i // 2 (their A carries sigma / √r)."""
    rng = np.random.default_rng(3)
    n, sigma, lr, r = 6, 0.05, 0.2, 2
    strategy = ESStrategy(n, sigma, lr, 8, antithetic=True, fitness="centred", step="sigma_sqrt_n")
    seeds, rewards = strategy.ask(0), _rewards(rng, n)
    update = strategy.tell(seeds, rewards)
    f = _authors_fitness(np.asarray(rewards, dtype=np.float64), n)
    for k, shape in enumerate(SHAPES):
        got = update_delta(shape, "cpu", update.seeds, update.weights, update.alpha, k, r, "iid").double()
        mean = torch.zeros(shape, dtype=torch.float64)
        for i in range(n):
            A, B = _typed_factors(shape, seeds[2 * (i // 2)], k, r)
            mean += f[i] * (1 if i % 2 == 0 else -1) * sigma / math.sqrt(r) * (A.double() @ B.double().T)
        assert torch.allclose(got, lr * math.sqrt(n) * mean / n, rtol=0, atol=1e-6), k


# --- defaults are ES's -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_seed", [0, 42])
def test_defaults_are_todays_seeds_weights_and_step(run_seed):
    rng = np.random.default_rng(run_seed)
    n, alpha = 30, 5e-4
    strategy = ESStrategy(n, 1e-3, alpha, run_seed)
    for it in (0, 7):
        seeds = strategy.ask(it)
        assert seeds == [member_seed(run_seed, it, i) for i in range(n)]
        assert all(s < MIRROR_BIT for s in seeds)
        rewards = _rewards(rng, n)
        update = strategy.tell(seeds, rewards)
        r = np.asarray(rewards, dtype=np.float32)
        z = (r - r.mean()) / (r.std() + np.float32(1e-8))
        assert update.weights == tuple(float(w) for w in z)
        assert update.alpha == alpha and update.seeds == tuple(seeds)


def test_default_settings_keep_todays_spec_resume_key_and_strategy():
    from esrepro.es.loop import _state_key, strategy_of
    from esrepro.settings.methods import RECIPE_FIELDS, EggrollSettings, ESSettings

    for cls in (ESSettings, EggrollSettings):
        cfg = cls()
        assert not set(RECIPE_FIELDS) & set(cfg.as_dict()), "defaults must stay out of the run's spec"
        assert not {*RECIPE_FIELDS, "noise_on"} & set(_state_key(cfg, 0)), "defaults must stay out of the resume key"
        s = strategy_of(cfg, 3)
        assert (s.antithetic, s.fitness, s.step) == (False, "zscore", "alpha_over_n")
    set_ = EggrollSettings(antithetic=True, fitness="centred", step="sigma_sqrt_n")
    assert {k: set_.as_dict()[k] for k in RECIPE_FIELDS} == {"antithetic": True, "fitness": "centred",
                                                             "step": "sigma_sqrt_n"}
    assert set(RECIPE_FIELDS) <= set(_state_key(set_, 0))
    assert _state_key(ESSettings(noise_on="linear"), 0)["noise_on"] == "linear"  # the control arm resumes only itself
    s = strategy_of(set_, 3)
    assert (s.antithetic, s.fitness, s.step) == (True, "centred", "sigma_sqrt_n")


def test_an_odd_population_with_antithetic_fails_naming_population():
    from esrepro.settings.methods import EggrollSettings, ESSettings

    for cls in (ESSettings, EggrollSettings):
        with pytest.raises(ValidationError, match="population"):
            cls(antithetic=True, population=31)
        cls(antithetic=True, population=30)
    with pytest.raises(ValueError, match="population"):
        ESStrategy(5, 1e-3, 5e-4, 0, antithetic=True)


# --- through the loop ------------------------------------------------------------------------------------------


def test_one_eggroll_iteration_with_the_recipe_follows_the_authors_equation(tiny_model_dir, tmp_path):
    """One eggroll iteration through the ES loop with real greedy scoring on a tiny transformers model and every
    recipe option on: members come in mirrored pairs, and every linear projection moves by
    lr * √N * mean_i(f_i * s_i (sigma / √r) A_j B_jᵀ), j = i // 2, typed from the authors' code."""
    import json

    from esrepro.backends.spec import EngineSpec
    from esrepro.es.loop import run_es
    from esrepro.models.loading import load_model
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import Scoring
    from esrepro.settings.methods import EggrollSettings
    from esrepro.tasks.conciseness import prepare

    prepare(tmp_path / "conciseness", {"kind": "generated"}, seed=0)  # a length reward: varies for a random model
    examples = [json.loads(x) for x in (tmp_path / "conciseness" / "train.jsonl").read_text().splitlines()]
    cfg = EggrollSettings(iterations=1, population=6, sigma=0.1, alpha=0.05, rank=2, max_new_tokens=8,
                          train_examples=len(examples), batch_size=8, resume_every=1, antithetic=True,
                          fitness="centred", step="sigma_sqrt_n")
    evaluator = SerialEvaluator(EngineSpec(str(tiny_model_dir), rank=cfg.rank, noise=cfg.noise, restore=cfg.restore),
                                Scoring("conciseness", examples, cfg.max_new_tokens))
    row = run_es(evaluator, cfg, tmp_path / "state", seed=4, progress=False)[0]
    seeds, n, r, sigma = row["seeds"], cfg.population, cfg.rank, cfg.sigma
    assert seeds[1::2] == [s | MIRROR_BIT for s in seeds[::2]]
    rewards = np.asarray(row["rewards"], dtype=np.float64)
    assert rewards.std() > 0, "the members should score differently (test too weak)"
    f = _authors_fitness(rewards, n)
    after = dict(evaluator.worker.engine.named_parameters())
    for k, (name, w0) in enumerate(load_model(tiny_model_dir).named_parameters()):
        if not (name.endswith(".weight") and name.rsplit(".", 2)[-2] in PROJ):
            assert torch.equal(after[name], w0), name
            continue
        mean = torch.zeros(w0.shape, dtype=torch.float64)
        for i in range(n):
            A, B = _typed_factors(w0.shape, seeds[2 * (i // 2)], k, r)
            mean += f[i] * (1 if i % 2 == 0 else -1) * sigma / math.sqrt(r) * (A.double() @ B.double().T)
        expected = w0.double() + cfg.alpha * math.sqrt(n) * mean / n
        got = after[name].double()
        assert torch.allclose(got, expected, rtol=0, atol=1e-7), (name, (got - expected).abs().max())
        assert not torch.equal(after[name], w0)


# --- the parameter-shift figure's random walk ------------------------------------------------------------------


def test_the_random_walk_of_a_recipe_run_matches_its_updates():
    """The walk the parameter-shift figure draws for a run with the recipe: its scale is the per-coordinate std of
    updates applied by the trainer's own path with rewards unrelated to the noise, and by hand
    alpha sigma / √N * sqrt(sum_t sum_j (f_2j - f_2j+1)^2)."""
    from esrepro.report.param_shift import RandomWalk

    rng = np.random.default_rng(0)
    n, sigma, alpha, steps = 8, 0.02, 0.5, 6
    recipe = {"sigma": sigma, "antithetic": True, "fitness": "centred", "step": "sigma_sqrt_n"}
    strategy = ESStrategy(n, sigma, alpha, 1, antithetic=True, fitness="centred", step="sigma_sqrt_n")
    theta = [torch.zeros(400_000)]
    log, by_hand = [], 0.0
    for t in range(steps):
        seeds, rewards = strategy.ask(t), _rewards(rng, n)
        u = strategy.tell(seeds, rewards)
        update_(theta, u.seeds, u.weights, u.alpha, "iid")
        log.append({"rewards": rewards})
        f = _authors_fitness(np.asarray(rewards, dtype=np.float64), n)
        by_hand += float(np.sum((f[0::2] - f[1::2]) ** 2))
    walk = RandomWalk.es_from_log(log, alpha, n, recipe)
    assert walk.scale == pytest.approx(alpha * sigma / math.sqrt(n) * math.sqrt(by_hand), rel=1e-5)
    assert float(theta[0].std()) == pytest.approx(walk.scale, rel=0.01)
    es_walk = RandomWalk.es_from_log(log, alpha, n)
    assert es_walk.scale == pytest.approx(alpha * math.sqrt(steps / n), rel=1e-5)  # ES's, unchanged
