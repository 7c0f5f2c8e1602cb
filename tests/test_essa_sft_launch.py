"""ESSA's LoRA SFT on one process per GPU: two launched processes (gloo on CPU) train with the same total batch
and the same optimiser steps as one, and the process count comes from $ESREPRO_TRAIN_PROCESSES."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import make_model_dir
from esrepro.essa.lora import SUMMARY, sft_lora
from esrepro.essa.sft_launch import PROCESSES_ENV, SFTJob, run_sft, sft_dtype, sft_processes

PAIRS = [(f"Using the numbers [{a} {b}], make {a + b}.", f" <answer>{a} + {b}</answer>")
         for a in range(1, 9) for b in range(1, 5)]  # 32 pairs
SFT = dict(rank=4, alpha=8.0, epochs=2, learning_rate=0.05, batch_size=8, seed=0)


@pytest.mark.slow
def test_two_processes_train_the_same_total_batch_and_steps(tmp_path):
    torch.set_num_threads(1)
    model_dir = make_model_dir(tmp_path / "base")
    one = sft_lora(model_dir, PAIRS, out_dir=tmp_path / "one", **SFT)
    job = SFTJob(model_dir=str(model_dir), pairs=PAIRS, out_dir=str(tmp_path / "two"), **SFT)
    two = run_sft(job, processes=2, timeout=300)
    assert two == json.loads((tmp_path / "two" / SUMMARY).read_text())
    assert (one["world_size"], one["per_process_batch_size"]) == (1, 8)
    assert (two["world_size"], two["per_process_batch_size"]) == (2, 4)
    assert one["total_batch_size"] == two["total_batch_size"] == SFT["batch_size"]
    assert one["steps"] == two["steps"] == SFT["epochs"] * math.ceil(len(PAIRS) / SFT["batch_size"])
    assert two["loss_after"] < two["loss_before"]  # the launched group trained
    assert one["lora_dtypes"] == two["lora_dtypes"] == ["float32"] and one["autocast"] is None
    assert (tmp_path / "two" / "adapter_model.safetensors").exists()


def test_uneven_split_names_the_field(tmp_path):
    job = SFTJob(model_dir=str(make_model_dir(tmp_path / "base")), pairs=PAIRS, out_dir=str(tmp_path / "out"),
                 **{**SFT, "batch_size": 7})
    with pytest.raises(ValueError, match="sft_prompts_per_step: 7 per optimiser step cannot be split evenly over 2"):
        run_sft(job, processes=2, timeout=300)


def test_process_count_and_dtype(monkeypatch):
    monkeypatch.delenv(PROCESSES_ENV, raising=False)
    assert sft_processes() == 1
    monkeypatch.setenv(PROCESSES_ENV, "8")
    assert sft_processes() == 8
    monkeypatch.setenv(PROCESSES_ENV, "0")
    with pytest.raises(ValueError, match=PROCESSES_ENV):
        sft_processes()
    assert sft_dtype("bfloat16", "cuda") == "bfloat16" and sft_dtype("bfloat16", "cpu") == "float32"
