"""A saved LoRA adapter is the same bytes on every run: peft writes ``target_modules`` from a set, whose order
follows Python's hash seed, so ``esrepro.models.loading.save_adapter`` sorts it (the adapter folder's sha256 is
recorded in manifests and compared with the golden files)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SAVE = """
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM
from esrepro.models.loading import save_adapter
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1))
peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
save_adapter(peft, sys.argv[1], base_model="results/models/tiny/base")
"""


@pytest.mark.slow
def test_a_saved_adapter_is_the_same_bytes_under_any_hash_seed(tmp_path):
    configs = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"seed{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", SAVE, str(out)], env=env, check=True, timeout=300)
        configs.append((out / "adapter_config.json").read_bytes())
        assert (out / "adapter_model.safetensors").is_file()
    assert configs[0] == configs[1] == configs[2]
    text = configs[0].decode()
    assert '"base_model_name_or_path": "results/models/tiny/base"' in text
    assert text.index('"k_proj"') < text.index('"o_proj"') < text.index('"q_proj"') < text.index('"v_proj"')
