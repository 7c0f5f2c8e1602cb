"""A training job killed mid-run resumes from its checkpoint when Snakemake is rerun.

The whole Snakemake process group is SIGKILLed once ``<run>/resume/state.json`` records a
completed checkpoint; the rerun (``rerun-incomplete`` in the default profile) must continue
from that checkpoint, not from scratch, and end bit-identical to an uninterrupted run.
The helpers here (small settings, repository copy, Snakemake runner) are shared with
tests/test_slurm.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import copy_repo
from esrepro.config import read_config

BIN = Path(sys.executable).parent
RUN = "results/runs/countdown/tiny/es/seed0"
TRAIN_TARGET = f"{RUN}/log.jsonl"
SMALL_CONFIG = "small_config.yaml"
SMALL_REGISTRY = "small_models.yaml"

# A smaller warm start than the registry's (100 SFT steps instead of 500): enough for the format
# reward to vary between ES members, so every iteration moves the weights. (50 steps at lr 0.01
# left this machine's model without a single formatted answer: the reward was 0 for every member.)
SMALL_SFT = {"problems": 1600, "epochs": 2, "learning_rate": 0.005}
# ES: 3 iterations, a checkpoint after each; sigma large enough for reward variance.
SMALL_ES = {"iterations": 3, "resume_every": 1, "population": 4, "train_examples": 8,
            "sigma": 0.05, "alpha": 0.05}


def write_small_settings(repo: Path, eval_limit: int = 20) -> str:
    """Write a reduced copy of config/config.yaml (and of the registry it names) into ``repo``.

    ``--config`` cannot carry these: Snakemake parses nested ``--config`` values as strings,
    which the schema rejects, and a registry entry is not config. The copy points its
    ``registry`` key at the reduced registry; resources stay the registry's.
    """
    config = read_config(repo / "config/config.yaml", root=repo)  # what it extends resolved: the copy stands alone
    registry = yaml.safe_load((repo / config.get("registry", "config/models.yaml")).read_text())
    registry["models"]["tiny"]["build"]["sft"].update(SMALL_SFT)
    config["registry"] = SMALL_REGISTRY
    config["defaults"]["es"].update(SMALL_ES)
    # Countdown's ES run alone: the RL baselines, the other tasks and the studies are not what these tests are about
    config["train"] = {"countdown": {"methods": ["es"]}}
    config["evaluate"] = {"countdown": config["evaluate"]["countdown"]}
    config["kl"] = {}
    config["studies"] = {}
    config["report"] = {"extras": []}
    config.pop("stability")
    config["data"] = {"countdown": config["data"]["countdown"]}
    for key in ("eval_every", "eval_limit"):  # no periodic evaluation (Figure 6's)
        config["defaults"]["es"].pop(key)
    config["evaluate"]["countdown"]["limit"] = eval_limit
    (repo / SMALL_REGISTRY).write_text(yaml.safe_dump(registry, sort_keys=False))
    (repo / SMALL_CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    return SMALL_CONFIG


BUILT = ("data/prepared/countdown", "results/models/tiny/base")


def built_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session keeps the small settings' prepared data and base model.

    Building the warm start is the slowest step and not what these tests are about: the
    first test to build it (under SLURM or not) leaves a copy here for the others.
    """
    return tmp_path_factory.getbasetemp() / "small-tiny-built"


def reuse_built(cache: Path, repo: Path) -> bool:
    """Copy the cached data and model into ``repo`` (mtimes kept, so Snakemake reuses them)."""
    if not all((cache / p / ".snakemake_timestamp").exists() for p in BUILT):
        return False
    for p in BUILT:
        shutil.copytree(cache / p, repo / p)
    return True


def keep_built(repo: Path, cache: Path) -> None:
    if (cache / BUILT[-1]).exists():
        return
    tmp = cache.with_name(cache.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for p in BUILT:
        shutil.copytree(repo / p, tmp / p)
    tmp.rename(cache)


def snakemake_env(**extra: str) -> dict[str, str]:
    """This interpreter's environment with its bin/ (esrepro, snakemake) first on PATH."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def start_snakemake(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """Snakemake in its own process group (so it and its jobs can be killed together).

    Its output goes to a file (``proc.output``), not a pipe nobody reads while it runs.
    """
    fd, output = tempfile.mkstemp(prefix="snakemake-", suffix=".out", dir=cwd)
    with os.fdopen(fd, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=env or snakemake_env(),
                                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    proc.output = Path(output)
    return proc


def output_of(proc: subprocess.Popen) -> str:
    return proc.output.read_text(errors="replace")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process group started by start_snakemake and wait until it is gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes of group {proc.pid} survived SIGKILL")


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for a started Snakemake; kill its group and fail on timeout or error."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail(f"snakemake ran past {timeout:.0f} s:\n{output_of(proc)[-6000:]}")
    out = output_of(proc)
    assert proc.returncode == 0, out[-6000:]
    return out


def run_snakemake(args: list[str], cwd: Path, timeout: float, env: dict | None = None) -> str:
    return finish(start_snakemake(args, cwd, env), timeout)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def completed_iterations(run: Path) -> int:
    """Iterations in the run's resume checkpoint (0 when there is none yet)."""
    try:
        return json.loads((run / "resume/state.json").read_text())["completed_iterations"]
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet (written atomically)
        return 0


def load_tensors(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model.safetensors"))


def assert_same_tensors(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def learning(log: list[dict]) -> list[int]:
    """Iterations whose member rewards differed (an update that moved the weights)."""
    return [r["iteration"] for r in log if r["reward_std"] > 0]


@pytest.mark.slow
def test_killed_training_resumes_from_its_checkpoint_bit_identically(tmp_path, tmp_path_factory):
    repo = copy_repo(tmp_path)
    config = write_small_settings(repo)
    iterations = SMALL_ES["iterations"]
    # targets go after "--": --configfile takes several values
    profile = ["--profile", "workflow/profiles/default", "--configfile", config]
    run = repo / RUN

    # base model and data first (or this session's copy): the kill must land in training
    cache = built_cache(tmp_path_factory)
    reused = reuse_built(cache, repo)
    out = run_snakemake([*profile, "--", *BUILT], repo, timeout=600)
    assert not reused or "Nothing to be done" in out, out[-3000:]
    keep_built(repo, cache)

    # 1. train, and SIGKILL Snakemake with its job once a checkpoint is on disk
    proc = start_snakemake([*profile, "--", TRAIN_TARGET], repo)
    deadline = time.monotonic() + 300
    try:
        while not 1 <= completed_iterations(run) and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.1)
        done = completed_iterations(run)
        assert proc.poll() is None and done < iterations, (
            f"training finished before it could be killed (checkpoint at {done}/{iterations})")
    finally:
        kill_group(proc)
    done = completed_iterations(run)  # a later checkpoint may have landed before the kill
    assert 1 <= done < iterations
    before = read_log(run / "resume/log.jsonl")
    assert len(before) == done
    assert not (run / "log.jsonl").exists() and not (run / "checkpoint").exists()

    # 2. rerun: a SIGKILLed Snakemake leaves its lock; then rerun-incomplete redoes the job
    run_snakemake([*profile, "--unlock"], repo, timeout=120)
    out = run_snakemake([*profile, "--", TRAIN_TARGET], repo, timeout=600)
    assert "rule train" in out
    resumed = read_log(run / "log.jsonl")
    assert [r["iteration"] for r in resumed] == list(range(iterations))
    # The iterations before the kill come from the checkpoint, not from a second
    # computation: their measured wall times are the first attempt's, to the last digit.
    assert resumed[:done] == before
    assert not (run / "resume").exists()  # cleared once the run finished
    resumed_weights = load_tensors(run / "checkpoint")

    # 3. the same run uninterrupted, from scratch
    shutil.move(run, tmp_path / "resumed_run")
    run_snakemake([*profile, "--", TRAIN_TARGET], repo, timeout=600)
    fresh = read_log(run / "log.jsonl")
    assert_same_tensors(resumed_weights, load_tensors(run / "checkpoint"))
    for a, b in zip(resumed, fresh, strict=True):
        assert (a["seeds"], a["rewards"]) == (b["seeds"], b["rewards"])
    assert fresh[0]["seconds_total"] != resumed[0]["seconds_total"]  # it really ran again

    # not vacuous: ES moved the weights both before and after the checkpoint
    moved = learning(fresh)
    assert any(i < done for i in moved) and any(i >= done for i in moved), [r["rewards"] for r in fresh]
