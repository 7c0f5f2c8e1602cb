"""Helper processes that die with the process they serve.

Three tools, from the cheapest:

* :func:`die_with_parent`: the kernel signals this process when its parent dies
  (Linux ``PR_SET_PDEATHSIG``). Reliable only when the parent forked it from a
  thread that lives as long as the parent (the signal follows the forking thread).
* :func:`watch_parent`: a daemon thread that ends this process once its parent is
  gone. Needs the interpreter to run Python now and then (an idle server, not a
  worker stuck in C code).
* :func:`reap_on_exit`: a small sidecar process that, once this process is gone
  (SIGKILL included), stops every process it saw descend from it: Ray's daemons and
  agents, vLLM engine cores, grading workers, whatever re-parented itself to PID 1.
  ``python -m esrepro.runtime.lifeline PID`` is that sidecar.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

PR_SET_PDEATHSIG = 1
#: Seconds between two looks of a watchdog or of the reaper.
POLL_S = 0.25
#: Seconds the reaper waits after SIGTERM before it sends SIGKILL.
TERM_GRACE_S = 2.0

_reaper: subprocess.Popen | None = None
_reaper_lock = threading.Lock()


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies; False where unsupported.

    With ``expected_parent``, a parent that died before the request took effect ends
    this process at once (the signal would never come).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        ok = False
    if ok and expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return ok


def watch_parent(interval_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that ends this process (exit status 1) once its parent is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os._exit(1)

    thread = threading.Thread(target=watch, name="esrepro-watch-parent", daemon=True)
    thread.start()
    return thread


def reap_on_exit() -> subprocess.Popen:
    """Start (once per process) the sidecar that stops this process's descendants after it is gone.

    The sidecar runs in a session of its own, so a kill of this process group does not
    take it along, and holds none of this process's files or pipes.
    """
    global _reaper
    with _reaper_lock:
        if _reaper is None or _reaper.poll() is not None:
            _reaper = subprocess.Popen(
                [sys.executable, "-m", "esrepro.runtime.lifeline", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                close_fds=True, start_new_session=True,
            )
        return _reaper


def descendants(proc: psutil.Process) -> list[psutil.Process]:
    """Every process below ``proc`` now (an empty list once it is gone)."""
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def stop_all(procs: list[psutil.Process], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM ``procs`` and everything below them, then SIGKILL whatever is left after ``grace_s``."""
    seen = {p.pid: p for p in procs}
    for p in list(seen.values()):
        seen.update({c.pid: c for c in descendants(p)})
    alive = [p for p in seen.values() if p.pid != os.getpid()]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def reap(pid: int, interval_s: float = POLL_S) -> None:
    """Watch ``pid`` and its descendants; once it is gone, stop those still running."""
    try:
        target = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    me = os.getpid()
    seen: dict[int, psutil.Process] = {}
    while True:
        try:
            gone = not target.is_running() or target.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            gone = True
        if gone:
            break
        seen = {pid: p for pid, p in seen.items() if p.is_running()}
        seen.update({p.pid: p for p in descendants(target) if p.pid != me})
        time.sleep(interval_s)
    stop_all([p for p in seen.values() if p.is_running()])


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the job must not end the reaper first
    reap(int(sys.argv[1]))
