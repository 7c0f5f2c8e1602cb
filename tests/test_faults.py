"""Fault injection on the tiny scale: corrupted inputs, cut files, kills at random points.

Each case ends one of two ways: refused, with one line naming the file (and both hashes,
or the JSON line), or resumed as if nothing happened; and after any kill no process of
the job is left 10 s later.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import make_model_dir
from test_essa_train import ENV, SPEC, _train_cmd, countdown_model, data_dir  # noqa: F401 (fixtures)

HEX = "[0-9a-f]{64}"
LEFTOVER_S = 10.0


# ------------------------------------------------------------------ helpers

def flip_byte(path: Path, offset: int) -> None:
    """Flip one bit of ``path`` at ``offset`` (from the end when negative), keeping its times."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def esrepro(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esrepro.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a refused command printed (no traceback)."""
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode != 0 and lines, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return lines[-1]


def family(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def kill_and_check(proc: subprocess.Popen, sig: int = signal.SIGKILL, seen: list[psutil.Process] = ()) -> None:
    """Kill ``proc`` with ``sig``; every process of it (seen now or before) must be gone within 10 s."""
    procs = {p.pid: p for p in [*seen, *family(proc.pid)]}
    proc.send_signal(sig)
    proc.wait()
    _, alive = psutil.wait_procs(list(procs.values()), timeout=LEFTOVER_S)
    names = [(p.pid, cmd(p)[:120]) for p in alive if p.is_running()]
    for p in alive:
        p.kill()
    assert not names, f"left behind after {LEFTOVER_S} s: {names}"


def built_model(out: Path) -> Path:
    """A small model directory with its producer's manifest, as build-tiny leaves one."""
    from esrepro.io import write_json
    from esrepro.provenance.manifest import build_manifest, now

    make_model_dir(out)
    write_json(out / "manifest.json", build_manifest("build_model", {}, {}, now(), outputs={"model": out}))
    return out


def prepared_data(out: Path) -> Path:
    """Prepared Countdown data with its manifest, as prepare-data leaves it."""
    spec = {"source": {"kind": "generated", "n_train": 40, "n_test": 8, "min_numbers": 3, "max_numbers": 3,
                       "max_number": 20, "max_target": 100}, "seed": 0}
    done = esrepro("prepare-data", "--task", "countdown", "--spec", json.dumps(spec), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return built_model(tmp_path_factory.mktemp("faults") / "base")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return prepared_data(tmp_path_factory.mktemp("faults") / "countdown")


def _evaluate(model: Path, data: Path, out: Path) -> subprocess.CompletedProcess:
    spec = {"split": "test", "limit": 4, "max_new_tokens": 4, "batch_size": 4}
    return esrepro("evaluate", "--task", "countdown", "--model", "tiny", "--method", "base", "--model-dir", str(model),
                   "--data-dir", str(data), "--spec", json.dumps(spec), "--out", str(out))


# ------------------------------------------------------------------ corrupted inputs are refused

@pytest.mark.slow
def test_flipped_weight_byte_with_kept_mtime_is_refused(model_dir: Path, prepared: Path, tmp_path: Path) -> None:
    model = built_model(tmp_path / "model")
    weights = model / "model.safetensors"
    assert _evaluate(model, prepared, tmp_path / "ok").returncode == 0
    flip_byte(weights, -3)
    line = error_line(_evaluate(model, prepared, tmp_path / "bad"))
    assert line.startswith(f"esrepro evaluate: error: {model}: sha256 ")
    assert f"recorded in {model}/manifest.json" in line and len(set(re.findall(HEX, line))) == 2
    assert not (tmp_path / "bad" / "metrics.json").exists()


@pytest.mark.slow
def test_edited_training_line_is_refused(model_dir: Path, prepared: Path, tmp_path: Path) -> None:
    data = prepared_data(tmp_path / "data")
    train = data / "train.jsonl"
    st = train.stat()
    lines = train.read_text().splitlines(keepends=True)
    lines[5] = lines[5].replace('"target": ', '"target": 1', 1)
    train.write_text("".join(lines))
    os.utime(train, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = esrepro("train", "--method", "es", "--task", "countdown", "--model", "tiny", "--model-dir", str(model_dir),
                   "--data-dir", str(data), "--spec", json.dumps({"algorithm": "es", "iterations": 1}),
                   "--out", str(tmp_path / "run"))
    line = error_line(proc)
    assert line.startswith(f"esrepro train: error: {train}: sha256 ") and f"recorded in {data}/manifest.json" in line
    assert not (tmp_path / "run" / "checkpoint").exists()


# ------------------------------------------------------------------ errors name the file (and the line)

@pytest.mark.slow
def test_cut_jsonl_names_file_and_line(prepared: Path, model_dir: Path, tmp_path: Path) -> None:
    from esrepro.io import read_jsonl

    data = tmp_path / "data"
    data.mkdir()
    text = (prepared / "test.jsonl").read_text()
    (data / "test.jsonl").write_text(text[: text.index("\n", len(text) // 2) - 12])  # the last line cut
    n = (data / "test.jsonl").read_text().count("\n") + 1
    with pytest.raises(ValueError, match=f"^{data}/test.jsonl:{n}: not valid JSON: "):
        read_jsonl(data / "test.jsonl")
    line = error_line(_evaluate(model_dir, data, tmp_path / "out"))
    assert f"{data}/test.jsonl:{n}: not valid JSON" in line


@pytest.mark.parametrize("where", ["header", "length"])
@pytest.mark.slow
def test_corrupt_safetensors_header_is_one_line(model_dir: Path, prepared: Path, tmp_path: Path, where: str) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / "manifest.json").unlink()  # no record to check against: the loader itself must name the file
    flip_byte(model / "model.safetensors", 12 if where == "header" else 7)
    line = error_line(_evaluate(model, prepared, tmp_path / "out"))
    assert line.startswith(f"esrepro evaluate: error: {model}: cannot read the model: ")


def test_invalid_resume_and_sft_records_name_the_file(tmp_path: Path) -> None:
    from esrepro.es.loop import _load_state
    from esrepro.essa.train import read_sft_record, verify_sft
    from esrepro.settings.methods import ESSettings

    state = tmp_path / "resume"
    state.mkdir()
    (state / "state.json").write_text('{"completed_iterations": 2,\n "config": {,}}\n')
    with pytest.raises(ValueError, match=f"^{state}/state.json:2: not valid JSON"):
        _load_state(state, ESSettings(), 0, evaluator=None)
    sft = tmp_path / "run" / "sft"
    sft.mkdir(parents=True)
    (sft / "sft.json").write_text('{"key": ')
    for call in (lambda: read_sft_record(tmp_path / "run"), lambda: verify_sft(sft)):
        with pytest.raises(ValueError, match=f"^{sft}/sft.json:1: not valid JSON"):
            call()


# ------------------------------------------------------------------ kills leave nothing behind

BUSY_GRADER = """
from esrepro.tasks.math import verify_answer

if __name__ == "__main__":
    print("grading", flush=True)
    verify_answer("2^{2^{40}}", ["5"], timeout_s=600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_owner_of_a_busy_grader_leaves_no_process(tmp_path: Path, sig: int) -> None:
    script = tmp_path / "busy.py"
    script.write_text(BUSY_GRADER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout.readline().strip() == "grading"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until a worker is busy on the power tower
        if any(p.cpu_percent(0.2) > 50 for p in family(proc.pid)[1:] if p.is_running()):
            break
    else:
        pytest.fail("no grading worker got busy")
    kill_and_check(proc, sig)


def _wait_for(pred, proc: subprocess.Popen, timeout: float = 300,
              commands: list[str] | None = None) -> list[psutil.Process]:
    """Poll until ``pred()``; returns every process of ``proc`` seen meanwhile (their command lines into
    ``commands``)."""
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and not pred():
        for p in family(proc.pid):
            if p.pid not in seen:
                seen[p.pid] = p
                if commands is not None:
                    commands.append(cmd(p))
        time.sleep(0.05)
    assert proc.poll() is None, "the job finished before it could be killed"
    return list(seen.values())


def _generations(run: Path) -> int:
    state = run / "resume" / "state.json"
    try:
        return json.loads(state.read_text())["completed_generations"]
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.slow
def test_essa_kills_at_random_points_and_a_corrupted_sft_cache(countdown_model, data_dir, tmp_path):  # noqa: F811
    """Kills during start-up leave nothing; a cache changed between kill and resume is refused; intact, it resumes."""
    run = tmp_path / "run"
    rng = random.Random(20)
    for delay in sorted(rng.uniform(0.2, 4.0) for _ in range(2)):  # start-up: imports, model load, SFT
        proc = subprocess.Popen(_train_cmd(countdown_model, data_dir, run), env=ENV, stderr=subprocess.DEVNULL)
        end = time.monotonic() + delay
        seen = _wait_for(lambda: time.monotonic() > end, proc)  # noqa: B023 - polled within this iteration
        kill_and_check(proc, seen=seen)
    proc = subprocess.Popen(_train_cmd(countdown_model, data_dir, run), env=ENV, stderr=subprocess.DEVNULL)
    seen = _wait_for(lambda: _generations(run) >= 1, proc)
    kill_and_check(proc, seen=seen)
    assert 1 <= _generations(run) < SPEC["iterations"]

    adapter = run / "sft" / "adapter" / "adapter_model.safetensors"
    space = run / "sft" / "space.safetensors"
    for path in (adapter, space):
        kept = path.read_bytes()
        flip_byte(path, -5)
        line = error_line(esrepro(*_train_cmd(countdown_model, data_dir, run)[3:]))
        assert line.startswith(f"esrepro train: error: {path}: sha256 ") and f"recorded in {run}/sft/sft.json" in line
        path.write_bytes(kept)
    kept = adapter.read_bytes()
    adapter.unlink()
    line = error_line(esrepro(*_train_cmd(countdown_model, data_dir, run)[3:]))
    assert line == f"esrepro train: error: {adapter}: missing (recorded in {run}/sft/sft.json)"
    adapter.write_bytes(kept)

    done = esrepro(*_train_cmd(countdown_model, data_dir, run)[3:], timeout=600)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((run / "manifest.json").read_text())
    from esrepro.io import sha256_file

    assert manifest["essa"]["sft_adapter_sha256"] == sha256_file(adapter)
    assert not (run / "resume").exists()


@pytest.mark.slow
def test_killed_two_engine_essa_leaves_no_ray_process(countdown_model, data_dir, tmp_path):  # noqa: F811
    """SIGKILL of a run with two Ray engines, once its engines are up: Ray's daemons and agents go too."""
    run = tmp_path / "run"
    spec = {**SPEC, "algorithm": "essa", "engines": 2}
    command = _train_cmd(countdown_model, data_dir, run, spec=spec, method="essa_eng2")
    proc = subprocess.Popen(command, env=ENV, stderr=subprocess.DEVNULL)
    commands: list[str] = []
    seen = _wait_for(lambda: _generations(run) >= 1, proc, commands=commands)
    assert any("raylet" in c for c in commands) and any("runtime_env" in c for c in commands), commands
    kill_and_check(proc, seen=seen)


# ------------------------------------------------------------------ a killed forced rerun is redone

@pytest.mark.slow
def test_killed_forced_rerun_is_redone_by_a_plain_run(tmp_path: Path) -> None:
    """Snakemake does not redo a missing intermediate once its dependents are up to date; the run's outputs are
    targets of ``rule all``, so a run whose outputs a killed ``-R`` deleted (only ``resume/`` left) is redone."""
    from conftest import copy_repo

    repo = copy_repo(tmp_path / "repo")
    env = {**ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{ENV.get('PATH', '')}"}

    def snakemake(*args: str) -> str:
        done = subprocess.run([str(Path(sys.executable).parent / "snakemake"), *args], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout + done.stderr

    # every output in place and up to date, without running anything
    for line in snakemake("--summary").splitlines()[1:]:
        out = repo / line.split("\t")[0]
        if "." in out.name:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.touch()
        else:  # a directory() output: checkpoints, prepared data, models
            out.mkdir(parents=True, exist_ok=True)
    snakemake("--cores", "1", "--touch")
    assert "Nothing to be done" in snakemake("-n")

    run = repo / "results/runs/countdown/tiny/es/seed0"
    shutil.rmtree(run / "checkpoint")
    (run / "log.jsonl").unlink()
    (run / "manifest.json").unlink()
    (run / "resume").mkdir()
    plan = snakemake("-n")
    assert "rule train:" in plan and "Missing output files: results/runs/countdown/tiny/es/seed0/" in plan
    assert "rule evaluate:" in plan
