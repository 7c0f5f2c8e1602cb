"""GRPO-z (the ES paper v2's GRPO-Zero baseline, App. A.2) on TRL: GRPO-Zero's loss sums the token losses of a step
and divides by every token the step generated (TRL's dapo), where TRL's grpo loss takes each completion's token mean;
the settings map to that GRPOConfig, and TRL's loss on a real tiny model is GRPO-Zero's."""

from __future__ import annotations

import pytest
import torch

from esrepro.rl.grpo import grpo_config_kwargs
from esrepro.settings.methods import GRPOSettings
from test_verl_grpo import _logps, _tiny, _trainer, unequal_micro_batch


def test_grpo_z_maps_to_trls_dapo_loss_with_std_scaled_advantages():
    s = GRPOSettings(algorithm="grpo_zero", per_device_train_batch_size=4, gradient_accumulation_steps=64).as_dict()
    kw = grpo_config_kwargs(s, steps=10, seed=0, output_dir="x", on_cpu=False, world_size=8,
                            fsdp_layers=["Qwen2DecoderLayer"])
    assert (kw["loss_type"], kw["scale_rewards"]) == ("dapo", "group")
    with pytest.raises(ValueError, match="grpo_zero means loss_type dapo"):
        GRPOSettings(algorithm="grpo_zero", loss_type="grpo")


def test_trl_loss_is_grpo_zeros_aggregation(tiny_model_dir, tmp_path):
    """One micro-batch of 4 completions of unequal lengths out of a step that generated twice as many tokens: TRL's
    loss is the micro-batch's token losses summed over all the step's generated tokens (GRPO-Zero's normaliser), not
    the mean of each completion's token mean (TRL's grpo)."""
    torch.manual_seed(0)
    s = _tiny("grpo_zero", beta=0.0)
    trainer = _trainer(tiny_model_dir, s, tmp_path, lambda completions, **kw: [0.0] * len(completions))
    model = trainer.model.eval()  # eval: the normaliser is the batch's tokens as given (no accumulation rescale)
    prompt_ids, prompt_mask, completion_ids, completion_mask, advantages = unequal_micro_batch(model.config.vocab_size)
    step_tokens = 2 * completion_mask.sum()  # the other half of the step's tokens are in another micro-batch
    with torch.no_grad():
        logp = _logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": advantages, "num_items_in_batch": step_tokens}
    trl_loss = trainer._compute_loss(model, inputs)
    mask = completion_mask.float()
    per_token = -advantages.unsqueeze(1) * torch.exp(logp - logp)  # on policy: ratio 1, clipping inactive
    want = (per_token * mask).sum() / step_tokens
    assert trl_loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
    assert trl_loss.item() != pytest.approx(((per_token * mask).sum(-1) / mask.sum(-1)).mean().item(), rel=1e-3)
