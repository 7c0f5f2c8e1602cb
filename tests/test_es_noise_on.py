"""Full-rank ES with its noise on the decoder blocks' linear projections only (``noise_on: linear``): low-rank ES's
control arm. Each perturbed tensor gets the numbers every-parameter ES draws for it, the others keep the base model's
values, on transformers and on vLLM's tensor-parallel shards alike."""

from __future__ import annotations

import pytest
import torch

from esrepro.perturb.noise import member_seed
from esrepro.settings.layers import ConfigError, validate_block
from esrepro.settings.methods import EggrollSettings, ESSettings


def _linear(engine) -> set[str]:
    from esrepro.models.architecture import linear_weight_names

    return set(linear_weight_names(engine.model))


@pytest.mark.parametrize("restore", ["exact", "subtract"])
def test_linear_noise_is_every_parameter_noise_on_the_projections_and_nothing_elsewhere(tiny_model_dir, restore):
    from esrepro.backends.hf import HFEngine

    every, linear = HFEngine(tiny_model_dir, restore=restore), HFEngine(tiny_model_dir, restore=restore,
                                                                        noise_on="linear")
    base = {n: p.clone() for n, p in linear.named_parameters()}
    targets = _linear(linear)
    assert targets and set(base) - targets  # the tiny model has both kinds
    seed = member_seed(0, 2, 5)
    every.perturb(seed, 0.01)
    linear.perturb(seed, 0.01)
    want, got = dict(every.named_parameters()), dict(linear.named_parameters())
    moved = {n for n in base if not torch.equal(got[n], base[n])}
    assert moved == targets
    assert all(torch.equal(got[n], want[n]) for n in targets)
    linear.restore(seed, 0.01)
    every.restore(seed, 0.01)
    seeds, weights = [member_seed(0, 2, i) for i in range(4)], [0.9, -1.1, 0.3, -0.1]
    every.apply_update(seeds, weights, 0.05)
    linear.apply_update(seeds, weights, 0.05)
    want, got = dict(every.named_parameters()), dict(linear.named_parameters())
    assert all(torch.equal(got[n], want[n]) for n in targets)
    assert all(torch.equal(got[n], base[n]) for n in set(base) - targets)


def test_linear_noise_on_vllm_shards_equals_the_transformers_engines(tiny_model_dir):
    """Each tensor-parallel rank's shards, perturbed and updated, put back into HF layout are the transformers
    engine's bit for bit (sizes 1 and 2; the layout is the hand-written reading of vLLM's, no vLLM)."""
    from transformers import AutoConfig

    from esrepro.backends.hf import HFEngine
    from esrepro.backends.vllm_engine import ShardedWeights
    from esrepro.backends.vllm_layout import to_hf, to_vllm
    from esrepro.models.architecture import linear_weight_names, meta_model
    from vllm_reference_layout import build_layout

    config = AutoConfig.from_pretrained(tiny_model_dir)
    targets = linear_weight_names(meta_model(config))
    engine = HFEngine(tiny_model_dir, noise_on="linear")
    base = {n: p.clone() for n, p in engine.named_parameters()}
    seed = member_seed(3, 1, 2)
    seeds, weights = [member_seed(3, 1, i) for i in range(3)], [0.5, -0.8, 1.3]
    engine.perturb(seed, 0.02)
    perturbed = {n: p.clone() for n, p in engine.named_parameters()}
    engine.restore(seed, 0.02)
    engine.apply_update(seeds, weights, 0.04)
    updated = dict(engine.named_parameters())
    for tp in (1, 2):
        layout = build_layout(config, tp)
        ranks, states = [], []
        for rank in range(tp):
            shards = to_vllm(base, layout, rank)
            state = ShardedWeights(shards, layout, rank, "iid", "exact", None, lowrank=None, lowrank_targets=targets)
            state.perturb(seed, 0.02)
            ranks.append(shards)
            states.append(state)
        got = to_hf(ranks, layout)
        assert all(torch.equal(got[n], perturbed[n]) for n in perturbed), tp
        for state in states:
            state.restore(seed, 0.02)
            state.apply_update(seeds, weights, 0.04)
        got = to_hf(ranks, layout)
        assert all(torch.equal(got[n], updated[n]) for n in updated), tp


def test_the_option_keeps_the_specs_of_runs_that_do_not_set_it():
    assert "noise_on" not in ESSettings().as_dict() and "noise_on" not in EggrollSettings().as_dict()
    assert ESSettings(noise_on="linear").as_dict()["noise_on"] == "linear"
    with pytest.raises(ConfigError, match="noise_on"):
        validate_block(EggrollSettings, {"noise_on": "all"}, "config.yaml")
    with pytest.raises(ValueError, match="noise_on 'embeddings'"):
        from esrepro.backends.hf import HFEngine

        HFEngine.__init__(object.__new__(HFEngine), "unused", noise_on="embeddings")
