"""Shared fixtures: a tiny randomly initialised Qwen2 model with a locally trained tokenizer;
a copy of the repository for tests that run Snakemake. Under pytest-xdist (`make test`, `make check`): the longest
files are handed out first, and each worker computes on one thread (docs/testing.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "es-at-scale"

#: The files that take longest on the 2-core CI machine, longest first (docs/testing.md's profile). pytest-xdist
#: hands out whole files (``--dist loadfile``) in collection order: these go first, so that none of them starts
#: last and leaves the other core idle at the end.
LONGEST_FIRST = ("test_pipeline.py", "test_pinned_models.py", "test_rehearsal_slice.py", "test_ppo_scale.py",
                 "test_slurm.py", "test_rehearsal_rl.py", "test_es_engines.py", "test_faults.py", "test_cross_cpu.py")


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker, torch and every process a test starts use one OpenMP thread unless told otherwise
    (Snakemake's jobs and the tests that set a thread count still are). Two workers on two cores, each with
    OpenMP's default team of one thread per core, spin-wait on each other's cores: two tiny models' training runs
    side by side then take 9.3 s each, 2.2 times as long as one after the other (2.1 s each alone), where two
    one-thread runs side by side take 3.6 s each. Set before any test imports torch, which reads it once."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the files of :data:`LONGEST_FIRST` first (a stable sort: the rest keep pytest's order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_report_header() -> str:
    """The CPU the tests ran on (golden outputs must hold on every x86-64 CPU) and ATen's kernel level on it."""
    import platform

    import torch

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return (f"cpu: {model or 'unknown'} ({platform.machine()}, {torch.get_num_threads()} threads), "
            f"ATen kernels: {torch.backends.cpu.get_cpu_capability()}")


def kill_once_resumable(cmd: list[str], env: dict, run_dir: Path, key: str, at_least: int = 1,
                        timeout: float = 300) -> int:
    """Run a training command and SIGKILL it as soon as its resume state (``<run_dir>/resume/state.json``)
    records ``at_least`` completed steps under ``key`` (``completed_iterations``, ``completed_generations``);
    the steps the state holds after the kill."""
    import json
    import signal
    import time

    proc = subprocess.Popen(cmd, env=env)
    state = run_dir / "resume" / "state.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if state.exists() and json.loads(state.read_text())[key] >= at_least:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "training finished (or failed) before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return json.loads(state.read_text())[key]


def copy_repo(dest: Path) -> Path:
    """The repository's files (tracked and untracked, not ignored) without results."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


SMALL_ARCH = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
}


def make_model_dir(path: Path, arch: dict = SMALL_ARCH, seed: int = 0) -> Path:
    """Save a random-init Qwen2 LM and a byte-level BPE tokenizer into ``path``."""
    from esrepro.models.tiny import build_model, train_tokenizer

    corpus = [f"Using the numbers [{a} {b}], make {a + b}. <think> {a} + {b} </think>\n<answer>{a} + {b}</answer>"
              for a in range(1, 40) for b in range(1, 12)]
    tok = train_tokenizer(corpus, vocab_size=320)
    model = build_model(arch, len(tok), tok.eos_token_id, seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("tiny_model"))


def skip_or_fail_in_ci(reason: str) -> None:
    """Skip a test whose tool is missing here, but fail it in CI (CI=true), where `make test` installs every tool:
    a missing tool there is a broken set-up, not a reason to skip."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def sandbox() -> None:
    """ARC's program sandbox (bubblewrap) works here; else skip (fail under CI=true): `make test` installs it."""
    from esrepro.tasks.sandbox import SandboxUnavailable, probe

    try:
        probe()
    except SandboxUnavailable as exc:
        skip_or_fail_in_ci(str(exc))

