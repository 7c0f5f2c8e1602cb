"""The vLLM layout read off vLLM's own model classes (esrepro.backends.vllm_probe), run for real on vLLM's CPU build.

Two checks. On Qwen2 and Llama the probe must find exactly the layout written by hand from vLLM's source
(tests/vllm_reference_layout.py): two readings that must agree. On five families that are neither (Qwen3-1.7B,
Mistral-7B-v0.3, Gemma-3-1B-IT, OLMo-2-7B, Phi-3-mini with its fused projections: their hub config.json files,
tests/test_model_configs.py, as the rehearsal replicates them at toy size, random weights), the ES vLLM engine must
hold the transformers engine's weights (equal checksums) and generate its greedy tokens, through perturb, restore
and update, at tensor-parallel sizes 1 and 2; and low-rank ES, its members scored as LoRA adapters in one vLLM call,
must generate what the transformers engine generates with each member written into its weights, and update to the
same weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SMALL_ARCH, make_model_dir
from families import make_family_dir
from test_model_configs import MODELS

pytestmark = pytest.mark.vllm

if os.environ.get("ESREPRO_REQUIRE_VLLM"):
    import vllm  # noqa: F401  (make test: a missing vLLM fails, it never skips)
else:
    vllm = pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test)")

JOB = Path(__file__).with_name("vllm_family_job.py")


def _vllm_run(model_dir: Path, tp: int) -> dict:
    """tests/vllm_family_job.py on ``model_dir`` at tensor-parallel size ``tp``, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run([sys.executable, str(JOB), str(model_dir), str(tp)], capture_output=True, text=True,
                          env=env, timeout=900)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"vLLM job failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(line[len("RESULT "):])


def _hf_steps(model_dir: Path) -> list:
    from esrepro.backends.hf import HFEngine

    sys.path.insert(0, str(JOB.parent))
    from vllm_family_job import es_steps

    return es_steps(HFEngine(model_dir, dtype="float32"))


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_the_probe_finds_the_hand_written_layout_of_qwen2_and_llama(model_type, tmp_path):
    from transformers import AutoConfig

    from vllm_reference_layout import build_layout

    if model_type == "qwen2":
        model_dir = make_model_dir(tmp_path / "m", dict(SMALL_ARCH, hidden_size=64, intermediate_size=128))
    else:  # Llama: untied head, two KV heads of 32 (vLLM's CPU attention needs 32 at least), no biases
        model_dir = make_family_dir(tmp_path / "m", "llama", num_attention_heads=4, num_key_value_heads=2,
                                    head_dim=32, tie_word_embeddings=False, hidden_size=96)
    want_steps = _hf_steps(model_dir)
    for tp in (1, 2):
        got = _vllm_run(model_dir, tp)
        want = build_layout(AutoConfig.from_pretrained(model_dir), tp)
        for rank in range(tp):
            assert _canonical(got["layout"][rank]) == _canonical(
                [[s.name, list(s.shape), [[p.hf.name, list(p.hf.shape), p.dim, p.src, p.dst, p.length] for p in s.pieces]]
                 for s in want.shards(rank)]), (tp, rank)
        assert got["es"] == [list(x) for x in want_steps], tp


def _canonical(specs: list) -> dict:
    """``[name, shape, [[hf name, hf shape, dim, src, dst, length], ...]]`` per parameter as ``{name: (shape,
    pieces)}``, a piece that is a whole tensor filling a whole parameter written as such (either reading may name
    any dimension for it)."""
    out = {}
    for name, shape, pieces in specs:
        canon = []
        for hf, hf_shape, dim, src, dst, length in pieces:
            whole = list(hf_shape) == list(shape) and src == dst == 0 and length == shape[dim]
            canon.append((hf, "whole") if whole else (hf, dim, src, dst, length))
        out[name] = (list(shape), sorted(canon, key=repr))
    return out


@pytest.mark.parametrize("key", sorted(MODELS))
def test_both_es_engines_agree_on_every_family(key, tmp_path):
    """ES and low-rank ES on vLLM (its layout probed from the model class) equal the transformers engine, on the
    rehearsal's replica of the hub model (its config.json at toy size)."""
    from esrepro.backends.hf import HFEngine
    from esrepro.models.architecture import linear_weight_names
    from esrepro.rehearsal.replicas import build_replica
    from vllm_family_job import ALPHA, MEMBERS, NEW, PROMPTS, RANK, SIGMA, WEIGHTS

    hub_id, _, _, config, *_ = MODELS[key]
    model_dir = tmp_path / key
    build_replica(key, {"hub_id": hub_id, "dtype": "float32", "config": config}, model_dir)
    model_type = config["model_type"]
    want = _hf_steps(model_dir)
    assert want[1] != want[0] and want[3] != want[0], "the noise should change the weights (test too weak)"
    runs = {tp: _vllm_run(model_dir, tp) for tp in (1, 2)}
    for tp, got in runs.items():
        assert got["model_type"] == model_type and len(got["layout"]) == tp
        for step, (g, w) in enumerate(zip(got["es"], want, strict=True)):
            assert g[0] == w[0], f"tp {tp}, step {step}: checksums differ"
            assert g[1] == w[1], f"tp {tp}, step {step}: greedy outputs differ"
    members = runs[1]["lowrank"]
    lowrank = HFEngine(model_dir, dtype="float32", rank=RANK)
    assert members["targets"] == sorted(linear_weight_names(lowrank.model))
    if model_type == "phi3":  # the fused projections are the targets, as the checkpoint's tensors are
        assert {n.rsplit(".", 2)[-2] for n in members["targets"]} == {"qkv_proj", "o_proj", "gate_up_proj",
                                                                      "down_proj"}
    changed = 0
    for seed, scored in zip(MEMBERS, members["members"], strict=True):
        lowrank.perturb(seed, SIGMA)
        written = lowrank.generate(PROMPTS, NEW)
        lowrank.restore(seed, SIGMA)
        assert scored == written, f"member {seed}: its adapter and its written weights generate differently"
        changed += scored != want[0][1]
    assert changed, "no member changed the outputs (test too weak)"
    lowrank.apply_update(MEMBERS, WEIGHTS, ALPHA)
    assert members["updated"] == [lowrank.checksum(), lowrank.generate(PROMPTS, NEW)]
