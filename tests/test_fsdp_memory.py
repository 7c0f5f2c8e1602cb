"""What FSDP2 holds in a GRPO job's memory, against the memory model's terms (esrepro.models.memory,
esrepro.planning.rl_memory) and the phases the plan check orders (esrepro.rl.phases): accelerate's preparation of
the policy and the sharded reference, run in 2 gloo processes under torchrun (tests/fsdp_memory_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, make_model_dir
from esrepro.models.memory import CHECKPOINT_INPUT_BYTES
from esrepro.rl import phases as PH

WORLD = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = tmp_path_factory.mktemp("fsdp_memory")
    model_dir = make_model_dir(root / "model")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nnodes", "1",
                           "--nproc-per-node", str(WORLD), str(Path(__file__).with_name("fsdp_memory_job.py")),
                           str(model_dir), str(root)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_a_checkpointed_layer_keeps_its_input_in_the_bytes_the_memory_model_counts(job):
    """Under BF16_POLICY the units' outputs are float32, yet each checkpoint keeps a bf16 input: accelerate shards
    the checkpoint wrapper as a unit of its own, whose forward casts the input first."""
    for rank in job:
        assert rank["world"] == WORLD and len(rank["checkpoint_inputs"]) == rank["layers"]
        sizes = {getattr(torch, d.removeprefix("torch.")).itemsize for d in rank["checkpoint_inputs"]}
        assert sizes == {CHECKPOINT_INPUT_BYTES}, rank["checkpoint_inputs"]


def test_the_sharded_reference_keeps_nothing_gathered_after_a_forward(job):
    """The plan check counts the reference's root unit (embeddings, final norm, LM head) gathered only inside the
    reference's forward: after it every parameter is a shard again, on every process (GRPO's and PPO's)."""
    for rank in job:
        assert rank["reference_parameters"] > 0
        assert rank["reference_gathered_after_forward"] == [], rank["reference_gathered_after_forward"]
        assert rank["ppo_reference_gathered_after_forward"] == [], rank["ppo_reference_gathered_after_forward"]


def test_the_trace_sees_the_reference_sharded_once(job):
    """TRL's prepare_fsdp leaves the reference sharded before vLLM started as it is: the trace records one
    "shard reference", where grpo_order puts it; a reference loaded whole is sharded by prepare_fsdp, after vLLM."""
    sharded = PH.grpo_order(use_vllm=True, fsdp=True, reference="sharded", old_logps=False, periodic=False,
                            resume=False)
    whole = PH.grpo_order(use_vllm=True, fsdp=True, reference="whole", old_logps=False, periodic=False,
                          resume=False)
    for rank in job:
        assert rank["phases_sharded_first"] == sharded[:3] == [PH.LOAD, PH.SHARD_REFERENCE, PH.START_VLLM]
        assert rank["phases_trl_order"] == whole[:3] == [PH.LOAD, PH.START_VLLM, PH.SHARD_REFERENCE]
