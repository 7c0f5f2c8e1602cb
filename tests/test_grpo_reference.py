"""GRPO's reference model under FSDP is never whole on a process's device: built on the meta device and loaded
sharded before TRL starts its colocated vLLM engine (TRL 1.16 starts the engine first and shards the reference
after). Runs TRL's trainer with the colocated engine of vLLM's CPU build in 2 gloo processes under torchrun
(tests/grpo_reference_job.py says what it changes there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SMALL_ARCH, make_model_dir
from esrepro.config import load_yaml
from esrepro.planning.load import load_pipeline
from esrepro.rl import phases as PH
from esrepro.rl.grpo import shards_reference

#: Head size 32: the smallest vLLM's CPU attention supports.
ARCH = dict(SMALL_ARCH, hidden_size=64, intermediate_size=128, max_position_embeddings=512)


def test_full_policies_under_fsdp_with_a_kl_term_shard_their_reference():
    assert shards_reference({"beta": 0.04}, fsdp=True, adapter=False)
    assert not shards_reference({"beta": 0.0}, fsdp=True, adapter=False)  # no reference at all
    assert not shards_reference({"beta": 0.04}, fsdp=False, adapter=False)  # DDP: whole on each process
    assert not shards_reference({"beta": 0.04}, fsdp=True, adapter=True)  # a peft policy's reference is an adapter


def test_every_large_paper_grpo_job_with_a_kl_term_shards_its_reference():
    paper = load_pipeline(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=REPO)
    from esrepro.planning.resume_cost import rl_runs
    from esrepro.planning.scaling import model_parameters

    checked = 0
    for task, model, method in rl_runs(paper):
        s = paper.method_settings(model, task, method).as_dict()
        if s.get("algorithm") == "ppo" or model_parameters(paper, model) < 7e9 or not float(s.get("beta") or 0):
            continue
        assert s.get("sharding") == "fsdp" and shards_reference(s, fsdp=True, adapter=False), (model, method)
        checked += 1
    assert checked


def _run(tmp_path: Path, model_dir: Path, order: str) -> list[dict]:
    out = tmp_path / order
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nnodes", "1",
                           "--nproc-per-node", "2", str(Path(__file__).with_name("grpo_reference_job.py")),
                           str(model_dir), str(out), order], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.vllm
@pytest.mark.slow
def test_the_reference_is_a_shard_when_the_colocated_engine_starts(tmp_path):
    pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm")
    model_dir = make_model_dir(tmp_path / "policy", ARCH)
    sharded = _run(tmp_path, model_dir, "sharded")
    for r in sharded:
        at = r["at_engine_start"]
        assert at["devices"] == ["cpu"] and all(at["dtensor"])  # loaded, and every parameter a shard
        assert at["held"] < 0.6 * at["whole"]  # half of the reference (2 processes), not the whole
        assert r["kl"] == r["kl"] and r["kl"] >= 0  # the sharded reference's forward gave the step's KL
        # the phases the process ran are the ones the memory model counts, in its order (accelerate runs CPU
        # processes without FSDP: no policy sharding here)
        assert r["phases"] == _order(r, "sharded")
        assert r["phases"].index(PH.SHARD_REFERENCE) < r["phases"].index(PH.START_VLLM)
    assert sum(r["at_engine_start"]["held"] for r in sharded) == sharded[0]["at_engine_start"]["whole"]
    # TRL's own order, for contrast: the reference whole on every process when the engine starts
    for r in _run(tmp_path, model_dir, "trl"):
        at = r["at_engine_start"]
        assert not any(at["dtensor"]) and at["held"] == at["whole"]
        assert r["phases"] == _order(r, "whole") and PH.SHARD_REFERENCE not in r["phases"]


def _order(record: dict, reference: str) -> list[str]:
    return PH.grpo_order(use_vllm=True, fsdp=False, reference=reference, old_logps=PH.trl_old_logps(record["config"]),
                         periodic=False, resume=False)
