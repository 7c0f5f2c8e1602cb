"""Preloaded by the grading pool's forkserver: it and its workers end when the pool's owner dies.

A worker holds the forkserver's "alive" pipe, so the standard library's forkserver
outlives a killed owner for as long as a worker is busy, and a worker stuck in C code
(big-integer arithmetic) is busy for ever. Here the forkserver watches its parent and
exits once it is gone; each worker asks for SIGKILL when the forkserver dies
(``esrepro.tasks.timeout``), so the kernel ends them all. Imported anywhere else,
this module does nothing.
"""

from __future__ import annotations

import os
import sys

from esrepro.runtime.lifeline import watch_parent

#: The forkserver's pid, as its forked workers inherit it (None outside a forkserver).
FORKSERVER_PID: int | None = None


def _in_forkserver() -> bool:
    """Whether this interpreter is multiprocessing's forkserver, importing its preload."""
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules and FORKSERVER_PID is None


if _in_forkserver():
    FORKSERVER_PID = os.getpid()
    watch_parent()
