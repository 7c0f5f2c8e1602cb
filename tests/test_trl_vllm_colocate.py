"""TRL 1.16's colocated vLLM (GRPO's ``vllm_mode: colocate``) with the pinned vLLM 0.32, one release above the range
TRL 1.16 declares (0.22-0.31): TRL's own weight sync reaches into vLLM's engine, and a generation after it shows the
trained weights. Runs on vLLM's CPU build (tests/trl_colocate_job.py says what it changes there and why)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SMALL_ARCH, make_model_dir

pytestmark = pytest.mark.vllm

if os.environ.get("ESREPRO_REQUIRE_VLLM"):
    import vllm  # noqa: F401  (make test: a missing vLLM fails, it never skips)
else:
    vllm = pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test)")

#: Head size 32: the smallest vLLM's CPU attention supports.
ARCH = dict(SMALL_ARCH, hidden_size=64, intermediate_size=128)


def test_trl_colocated_sync_moves_the_trained_weights_into_vllm(tmp_path):
    model_dir = make_model_dir(tmp_path / "policy", ARCH)
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("trl_colocate_job.py")), str(model_dir),
                           str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["vllm_before"] == r["policy_before"]  # the engine starts from the policy's checkpoint
    assert r["policy_after"] != r["policy_before"]  # the step changed what the policy generates
    assert r["vllm_after"] == r["policy_after"]  # and TRL's sync carried it into vLLM
    import vllm as v

    if v.__version__ == "0.32.0":  # the pin: TRL warns that it is above its tested range
        assert any("0.31.0" in w for w in r["version_warnings"])
