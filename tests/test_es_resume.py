"""An ES run killed mid-way and restarted ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import kill_once_resumable
from esrepro.backends.spec import EngineSpec
from esrepro.es.loop import ResumeMismatch, run_es
from esrepro.population.evaluators import SerialEvaluator
from esrepro.population.spec import Scoring
from esrepro.settings.methods import ESSettings
from esrepro.tasks.countdown import prepare

SPEC = {
    "iterations": 8, "population": 4, "sigma": 0.05, "alpha": 0.05, "train_examples": 6,
    "max_new_tokens": 10, "batch_size": 6, "noise": "iid", "restore": "subtract",
    "master_weights": None, "resume_every": 2,
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("countdown")
    prepare(out, {"kind": "generated", "n_train": 6, "n_test": 6}, seed=0)
    return out


def _train_cmd(model_dir: Path, data_dir: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "esrepro.cli", "train", "--method", "es", "--task", "countdown",
            "--model", "test", "--model-dir", str(model_dir), "--data-dir", str(data_dir),
            "--spec", json.dumps(SPEC), "--seed", "3", "--out", str(out), "--threads", "1"]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoint" / "model.safetensors"))


@pytest.mark.slow
def test_killed_run_resumes_bit_identically(tiny_model_dir, data_dir, tmp_path):
    env = {**os.environ, "TQDM_DISABLE": "1"}
    straight = tmp_path / "straight"
    subprocess.run(_train_cmd(tiny_model_dir, data_dir, straight), check=True, env=env, timeout=600)

    killed = tmp_path / "killed"
    done = kill_once_resumable(_train_cmd(tiny_model_dir, data_dir, killed), env, killed, "completed_iterations", 2)
    assert 2 <= done < SPEC["iterations"]
    assert not (killed / "checkpoint").exists()

    rerun = subprocess.run(_train_cmd(tiny_model_dir, data_dir, killed), check=True, env=env, timeout=600,
                           capture_output=True, text=True)
    assert (f"ES: resuming from the state in {killed / 'resume'}: {done} of {SPEC['iterations']} iterations done"
            in rerun.stdout)
    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(a[k], base[k]) for k in a), "training did not change the weights"
    log_a = [json.loads(x) for x in (straight / "log.jsonl").read_text().splitlines()]
    log_b = [json.loads(x) for x in (killed / "log.jsonl").read_text().splitlines()]
    assert [r["rewards"] for r in log_a] == [r["rewards"] for r in log_b]
    assert len(log_b) == SPEC["iterations"]
    assert not (killed / "resume").exists()
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["settings"]["population"] == 4 and manifest["seed"] == 3


def test_resume_with_other_settings_is_refused(tiny_model_dir, data_dir, tmp_path):
    examples = [json.loads(x) for x in (data_dir / "train.jsonl").read_text().splitlines()][:1]
    evaluator = SerialEvaluator(EngineSpec(str(tiny_model_dir)), Scoring("countdown", examples, 2))
    cfg = ESSettings(iterations=2, population=2, sigma=0.01, alpha=0.01, max_new_tokens=2, resume_every=1)
    run_es(evaluator, cfg, tmp_path / "state", progress=False)
    other = ESSettings(iterations=2, population=2, sigma=0.02, alpha=0.01, max_new_tokens=2, resume_every=1)
    with pytest.raises(ResumeMismatch, match="delete"):
        run_es(evaluator, other, tmp_path / "state", progress=False)


def test_resume_on_another_noise_device_is_refused_unless_allowed(tiny_model_dir, data_dir, tmp_path):
    """A state written on another GPU variant (CUDA's noise follows the SM count) is refused, naming the option
    that continues it; with the option the run resumes and finishes."""
    examples = [json.loads(x) for x in (data_dir / "train.jsonl").read_text().splitlines()][:1]
    evaluator = SerialEvaluator(EngineSpec(str(tiny_model_dir)), Scoring("countdown", examples, 2))
    cfg = ESSettings(iterations=3, population=2, sigma=0.01, alpha=0.01, max_new_tokens=2, resume_every=1)
    state = tmp_path / "state"
    run_es(evaluator, ESSettings(**{**cfg.model_dump(), "iterations": 2}), state, progress=False)
    meta = json.loads((state / "state.json").read_text())
    meta["noise_device"], meta["config"]["iterations"] = "NVIDIA H100 PCIe (114 SMs)", 3
    (state / "state.json").write_text(json.dumps(meta))
    with pytest.raises(ResumeMismatch, match=r"H100 PCIe \(114 SMs\).*resume_on_other_gpu: true"):
        run_es(evaluator, cfg, state, progress=False)
    log = run_es(evaluator, ESSettings(**{**cfg.model_dump(), "resume_on_other_gpu": True}), state, progress=False)
    assert len(log) == 3
