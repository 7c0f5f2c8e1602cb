"""The rehearsal's slice through a real SLURM cluster: one Qwen2 and one Llama replica fetched from the local
mirror, ES on vLLM engines (the CPU build) and GRPO under torchrun on Countdown, their evaluation and KL; then a
base-model evaluation of every other task of the paper DAG (conciseness, GSM8K, PRM800K, the five math sets, Sudoku,
ARC-AGI) and MATH training's prepared data.

Runs in the vLLM environment (`pytest -m vllm`) as root (scripts/slurm-local), as `make test` does."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import copy_repo
from esrepro.rehearsal.run import SLICE_MODELS, WORKSPACE, rehearsal_slice

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "scripts/slurm-local needs root"
    if subprocess.run(["bash", "-c", "command -v slurmctld"], capture_output=True).returncode != 0:
        return "SLURM is not installed (scripts/install-debs slurm)"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed"
    return None


def test_rehearsal_slice_runs_through_slurm(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    repo = copy_repo(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY_", "HF_"))}
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "esrepro.cli", "rehearse", "--slice"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=1500)
    minutes = (time.monotonic() - started) / 60
    assert out.returncode == 0, (out.stdout + out.stderr)[-8000:]
    work = repo / WORKSPACE
    rows = {r["rule"]: r for r in csv.DictReader((work / "results" / "rehearsal_slice.csv").open())}
    for rule in ("fetch_model", "download_data", "prepare_data", "train", "train_cell", "select_rl", "evaluate",
                 "kl"):
        assert rows[rule]["ran"] == "yes", rows
    for target in rehearsal_slice(repo):  # every task's evaluation (or prepared data), each graded problem counted
        assert (repo / target).exists(), target
        if target.endswith("metrics.json"):
            assert json.loads((repo / target).read_text())["n"] > 0, target
    # about 6 min alone on this project's two cores (41 jobs, the rehearsal's own wall clock 5.0 min), 12.9 min
    # beside the rest of the vLLM suite on make test's second worker: 20 leaves room for a busier machine, not for
    # a job that hangs (tests/test_rehearsal.py bounds the slice's number of jobs)
    assert minutes < 20, f"the slice took {minutes:.1f} min"

    for model in SLICE_MODELS:
        base = json.loads((work / f"results/models/{model}/base/manifest.json").read_text())
        assert len(base["resolved"]["commit"]) == 40, base  # the branch resolved through the mirror, and recorded
        es = json.loads((work / f"results/runs/countdown/{model}/es/seed0/manifest.json").read_text())
        assert es["backend"] == "vllm" and es["engines"] == 2 and es["host"]["slurm_job_id"], es
    # the Llama repository is gated: the mirror served it only with the token
    llama = work / f"results/models/{SLICE_MODELS[1]}/base"
    assert not (llama / "original").exists()  # only the files the model needs were downloaded
