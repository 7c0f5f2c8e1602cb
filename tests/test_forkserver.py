"""The preloaded interpreter (esrepro.runtime.forkserver): real servers, real `esrepro` commands, real signals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from esrepro.runtime import forkserver

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
#: A server that loads nothing: forking and relaying are what these tests check, not the 5 s of imports.
LIGHT = "import sys; from esrepro.runtime.forkserver import serve; sys.exit(serve(sys.argv[1], int(sys.argv[2]), (), None))"


def job_env(sock: Path | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
    env.pop(forkserver.SOCKET_ENV, None)
    env.pop("PYTEST_CURRENT_TEST", None)  # pytest changes it between a fixture's set-up and the test
    if sock is not None:
        env[forkserver.SOCKET_ENV] = str(sock)
    return env


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def server(tmp_path):
    """A light server whose parent is this test process; yields (socket path, process, log path)."""
    sock, log = tmp_path / "s.sock", tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", LIGHT, str(sock), str(os.getpid())], env=job_env(),
                                stdout=out, stderr=subprocess.STDOUT)
    wait_for(lambda: "serving" in log.read_text())
    yield sock, proc, log
    if proc.poll() is None:
        proc.terminate()
        proc.wait(30)


def esrepro(args: list[str], env: dict[str, str], cwd: Path = REPO, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "esrepro"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120, **kw)


def test_no_server_named_runs_here(monkeypatch):
    monkeypatch.delenv(forkserver.SOCKET_ENV, raising=False)
    assert forkserver.delegate(["options"]) is None


@pytest.mark.slow
def test_a_job_in_the_server_prints_and_exits_as_a_fresh_command(server, tmp_path):
    sock, proc, log = server
    fresh = esrepro(["options", "--markdown"], job_env())
    forked = esrepro(["options", "--markdown"], job_env(sock))
    assert forked.returncode == fresh.returncode == 0
    assert forked.stdout == fresh.stdout and forked.stderr == ""
    bad = esrepro(["validate", str(tmp_path / "missing.yaml")], job_env(sock))
    assert bad.returncode == esrepro(["validate", str(tmp_path / "missing.yaml")], job_env()).returncode != 0
    assert "missing.yaml" in bad.stdout + bad.stderr and "starting fresh" not in bad.stderr
    # the job ran in the job's folder, with the job's environment
    out = tmp_path / "here"
    (out / "schemas").mkdir(parents=True)
    made = esrepro(["options", "--schema-dir", "schemas"], job_env(sock), cwd=out)
    assert made.returncode == 0 and any((out / "schemas").iterdir())
    proc.terminate()
    proc.wait(30)
    assert forkserver.summary(log.read_text()) == {"served": 3, "declined": 0, "reasons": {}}


def test_another_environment_runs_fresh_and_says_why(server):
    sock, proc, log = server
    for _ in range(2):
        done = esrepro(["options", "--markdown"], job_env(sock, OMP_NUM_THREADS="7"))
        assert done.returncode == 0 and done.stdout.startswith("# Configuration options")
        assert "declined this job: another environment (OMP_NUM_THREADS='7')" in done.stderr
    assert "declined" in esrepro(["options", "--markdown"], job_env(sock, ESREPRO_ANYTHING="1")).stderr
    proc.terminate()
    proc.wait(30)
    counts = forkserver.summary(log.read_text())  # the server's log ends with its counts and the reasons
    assert counts == {"served": 0, "declined": 3, "reasons": {"another environment (OMP_NUM_THREADS='7')": 2,
                                                               "another environment (ESREPRO_ANYTHING='1')": 1}}
    assert forkserver.note(counts) is None  # a few declined jobs are not worth a warning in Snakemake's log
    many = forkserver.note({**counts, "declined": 4}, log)
    assert "declined 4" in many and "2 x another environment (OMP_NUM_THREADS='7')" in many and str(log) in many


def test_shell_variables_do_not_decide_and_the_job_keeps_its_own(tmp_path):
    """What a shell or an activated venv sets (PS1, SHLVL, ...) never declines a job, which still sees its own values."""
    (tmp_path / "envdump.py").write_text("import json, os\n\ndef main(argv):\n    print(json.dumps(dict(os.environ)))\n"
                                         "    return 0\n")
    pythonpath = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    sock, log = tmp_path / "s.sock", tmp_path / "server.log"
    code = LIGHT.replace("(), None)", "(), None, 'envdump:main')")  # a server whose jobs print their environment
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code, str(sock), str(os.getpid())],
                                env=job_env(PYTHONPATH=pythonpath), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "serving" in log.read_text())
        shell = {"PS1": "(venv) $ ", "PS2": "> ", "PROMPT_COMMAND": "true", "SHLVL": "3", "_": "/usr/bin/env",
                 "OLDPWD": "/", "TERM": "dumb", "VIRTUAL_ENV": str(BIN.parent), "MAKEFLAGS": "-j2", "MAKELEVEL": "1"}
        for name in shell:
            assert not forkserver.decides(name), name
        for name in ("OMP_NUM_THREADS", "PYTHONHASHSEED", "HF_HUB_OFFLINE", "MKL_CBWR", "ESREPRO_DETERMINISTIC",
                     "TRANSFORMERS_OFFLINE", "CUDA_VISIBLE_DEVICES", "LC_ALL", "HOME", "TORCH_HOME"):
            assert forkserver.decides(name), name
        assert not forkserver.decides(forkserver.SOCKET_ENV)
        env = job_env(sock, PYTHONPATH=pythonpath, **shell)
        env.pop("TMPDIR", None)
        done = esrepro(["anything"], env)
        assert done.returncode == 0 and "declined" not in done.stderr, done.stderr
        seen = json.loads(done.stdout)
        assert {k: seen.get(k) for k in shell} == shell and "TMPDIR" not in seen  # the job's own values
        declined = esrepro(["anything"], {**env, "OMP_NUM_THREADS": "7"})  # a variable that decides: runs fresh
        assert "declined this job: another environment (OMP_NUM_THREADS='7')" in declined.stderr
    finally:
        proc.terminate()
        proc.wait(30)
    assert forkserver.summary(log.read_text())["served"] == 1


def test_an_unreachable_server_runs_fresh(tmp_path):
    done = esrepro(["options", "--markdown"], job_env(tmp_path / "nobody.sock"))
    assert done.returncode == 0 and "not available" in done.stderr


def _blocked_job(sock: Path, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """A job that blocks: `esrepro validate` opening a FIFO nobody writes to."""
    fifo = tmp_path / "blocks.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([str(BIN / "esrepro"), "validate", str(fifo)], env=env or job_env(sock), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, fifo


def _children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if p.status() != psutil.STATUS_ZOMBIE]


def test_a_killed_command_ends_its_job(server, tmp_path):
    sock, proc, _ = server
    job, _ = _blocked_job(sock, tmp_path)
    wait_for(lambda: len(_children(proc.pid)) == 1)
    child = _children(proc.pid)[0]
    assert os.getpgid(child.pid) == os.getpgid(job.pid)  # in its command's group, as a fresh command would be
    job.kill()  # as Snakemake cancelling the job
    job.wait(30)
    psutil.wait_procs([child], timeout=forkserver.GRACE_S + 5)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert proc.poll() is None  # the server goes on serving
    assert esrepro(["options", "--markdown"], job_env(sock)).returncode == 0


def test_a_stopped_server_fails_its_running_jobs_and_ends_them(server, tmp_path):
    sock, proc, log = server
    job, _ = _blocked_job(sock, tmp_path)
    wait_for(lambda: len(_children(proc.pid)) == 1)
    child = _children(proc.pid)[0]
    proc.terminate()
    assert proc.wait(30) == 0
    _, err = job.communicate(timeout=30)
    assert job.returncode == 1 and "ended before this job did" in err
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert not sock.exists()


def test_the_server_ends_with_its_parent(tmp_path):
    sock, log = tmp_path / "s.sock", tmp_path / "server.log"
    parent_code = (f"import os, subprocess, sys, time\n"
                   f"p = subprocess.Popen([sys.executable, '-c', {LIGHT!r}, {str(sock)!r}, str(os.getpid())],"
                   f" stdout=open({str(log)!r}, 'wb'), stderr=subprocess.STDOUT, start_new_session=True)\n"
                   f"print(p.pid, flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=job_env(), stdout=subprocess.PIPE, text=True)
    server_pid = int(parent.stdout.readline())
    wait_for(lambda: "serving" in log.read_text())
    parent.kill()  # as a Snakemake killed with SIGKILL: no onerror hook runs
    parent.wait(30)
    wait_for(lambda: not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE,
             timeout_s=10)
    assert not sock.exists() and forkserver.summary(log.read_text())["served"] == 0


@pytest.mark.slow
def test_start_loads_the_libraries_and_stop_ends_it(tmp_path, monkeypatch):
    monkeypatch.delenv(forkserver.SOCKET_ENV, raising=False)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    log = tmp_path / "logs/forkserver.log"
    sock = forkserver.start(log)
    try:
        assert os.environ[forkserver.SOCKET_ENV] == str(sock)
        env = {**os.environ, **{k: "1" for k in forkserver.THREAD_VARS}}  # as Snakemake sets them for a 1-thread job
        started = time.monotonic()
        done = esrepro(["options", "--markdown"], env)  # waits for the server to load, then runs in it
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert time.monotonic() - started < 120
        assert "modules in" in log.read_text() and "torch" in forkserver.PRELOAD
    finally:
        counts = forkserver.stop()
    assert forkserver.SOCKET_ENV not in os.environ and not sock.exists()
    assert counts == {"served": 1, "declined": 0, "reasons": {}} == forkserver.summary(log.read_text())


def test_loading_that_starts_a_thread_is_refused(monkeypatch):
    monkeypatch.setattr(os, "listdir", lambda p: ["1", "2"] if p == "/proc/self/task" else [])
    with pytest.raises(RuntimeError, match="started 1 thread"):
        forkserver.preload((), None)
