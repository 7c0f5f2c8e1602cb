"""Run grading calls under a hard time limit, from any thread.

math-verify's own timeout uses ``signal.alarm``: it only works in the main thread
and cannot interrupt long C-level work (big-integer arithmetic inside sympy, for
example). Here each call instead runs in a :class:`pebble.ProcessPool` worker with a
per-call ``timeout``; waiting on the returned future works in any thread. A call
that overruns is stopped for certain: pebble kills its worker (only that one) and
starts a replacement, and the caller gets a :class:`CallResult` with
``timed_out=True`` (never an exception). A worker that dies (segfault, out of
memory) comes back as ``error`` the same way.

The workers come from multiprocessing's ``forkserver``: a server process, started by
fork+exec (safe from a multi-threaded trainer with CUDA, tokenizer or vLLM threads),
imports the modules in ``preload`` once (:func:`multiprocessing.set_forkserver_preload`
replaces the default ``["__main__"]``, so the server does not import the caller's
entry script), and every worker is forked from that warm server in tens of
milliseconds. Back-to-back time-outs therefore do not wait for a replacement to
re-import sympy, and workers never inherit the caller's modules (torch included).

Caveats of the standard library's forkserver (Python 3.11):

* there is one per process, so its preload is that of the pools created before its
  first worker starts; a pool created later imports its modules in each worker
  (correct, slower to start);
* as with ``spawn``, each worker runs the top level of an entry script started by
  path (as ``__mp_main__``: not its ``if __name__ == "__main__"`` part). For the
  ``esrepro`` console script that is ``from esrepro.cli import main`` (nothing heavy);
  a script that grades must keep its work under that guard, or its workers fail to
  start and every call reports ``error``.

Adjustments to pebble, each in :func:`_start_worker` or :class:`GradingPool`:

* pebble stops a timed-out worker with SIGTERM, waits up to 3 s, then SIGKILLs it; its
  SIGTERM handler is Python-level and waits for C code that does not check for
  signals (``sum`` over a huge range, GMP arithmetic when sympy uses gmpy2), so such
  a time-out took 3 s more. Workers restore the default SIGTERM action (die at once).
* pebble marks the whole pool broken when a worker dies while no call is running on
  it; :class:`GradingPool` then replaces the pool (the calls queued on it report
  ``error``).
* pebble's workers hold the forkserver's "alive" pipe, so a killed owner left the
  forkserver and a busy worker running for ever. The forkserver preloads
  :mod:`esrepro.tasks.forkserver_guard` (it exits once its parent is gone) and each
  worker asks for SIGKILL when the forkserver dies.
* A worker whose ``preload`` or ``initializer`` fails stays up and answers every call
  with that failure, instead of exiting (which pebble treats as a broken pool).

The limit counts from when a worker took the call (pebble checks every 0.1 s):
waiting for a free worker is not counted. Each worker caps its address space
(``memory_limit_mb``) so a hostile input cannot exhaust the host's memory. Functions
passed to :meth:`GradingPool.call` must be picklable by reference (module-level;
not from ``__main__``).
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Sequence

from pebble import ProcessExpired, ProcessFuture, ProcessPool

from esrepro.runtime.lifeline import die_with_parent

#: Default limit in seconds of one grading call (the authors give math-verify 1 s).
DEFAULT_TIMEOUT_S = 1.0
#: Default cap on a worker's address space.
DEFAULT_MEMORY_LIMIT_MB = 4096
#: Default number of worker processes: a correct answer need not queue behind a hostile one.
DEFAULT_WORKERS = 2
#: Seconds :meth:`GradingPool.warm` waits for every worker to report ready.
STARTUP_TIMEOUT_S = 120.0

_CONTEXT = multiprocessing.get_context("forkserver")
#: The forkserver exits when its owner dies (see the guard), whatever the pools preload.
_GUARD = "esrepro.tasks.forkserver_guard"
_forkserver_preload: list[str] = [_GUARD]
_forkserver_lock = threading.Lock()

#: In a worker: why its start-up failed (then every call reports it), else None.
_startup_failure: str | None = None


@dataclass(frozen=True)
class CallResult:
    """The outcome of one call: ``value`` when ``ok``; else ``timed_out`` or ``error``.

    ``elapsed_s`` is how long the caller waited, queueing for a worker included.
    """

    ok: bool
    value: Any = None
    timed_out: bool = False
    error: str | None = None
    elapsed_s: float = 0.0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def _start_worker(memory_limit_mb: int | None, preload: Sequence[str],
                  initializer: Callable[[], Any] | None) -> None:
    """pebble's worker initializer (runs in the worker): signals, memory cap, imports."""
    global _startup_failure
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # SIGKILL when the forkserver dies (it exits once the pool's owner is gone)
    die_with_parent(expected_parent=getattr(sys.modules.get(_GUARD), "FORKSERVER_PID", None))
    if memory_limit_mb:
        try:
            import resource

            limit = int(memory_limit_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):  # not on this platform: run without a cap
            pass
    try:
        for name in preload:
            importlib.import_module(name)
        if initializer is not None:
            initializer()
    except BaseException as exc:
        _startup_failure = _describe(exc)


def _run_in_worker(fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[str, Any]:
    """Run one call in a worker; its own failures come back as ``("error", text)``."""
    if _startup_failure is not None:
        return "failed", _startup_failure
    try:
        value = fn(*args, **kwargs)
        ForkingPickler.dumps(value)  # an unsendable result is this call's error, not the worker's death
    except BaseException as exc:  # report everything, MemoryError and RecursionError included
        return "error", _describe(exc)
    return "ok", value


def _worker_pid(hold_s: float) -> int:
    """Hold the worker ``hold_s`` seconds and return its pid (for :meth:`GradingPool.warm`)."""
    time.sleep(hold_s)
    return os.getpid()


class GradingPool:
    """A thread-safe pool of ``n_workers`` processes that run calls under a time limit.

    Further callers queue for a free worker. Workers start on first use (or with
    :meth:`warm`); each imports the modules in ``preload`` and then runs
    ``initializer()`` (a picklable module-level function, e.g. one that exercises lazy
    imports) before it takes calls.
    """

    def __init__(
        self,
        n_workers: int = DEFAULT_WORKERS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        preload: Sequence[str] = (),
        memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
        initializer: Callable[[], Any] | None = None,
    ) -> None:
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        _check_limit(timeout_s)
        try:
            ForkingPickler.dumps(initializer)
        except Exception as exc:
            raise ValueError(f"initializer {initializer!r} is not picklable: {_describe(exc)}") from exc
        self.n_workers = n_workers
        self.timeout_s = timeout_s
        self.preload = tuple(preload)
        self.memory_limit_mb = memory_limit_mb
        self.initializer = initializer
        self._pool: ProcessPool | None = None
        self._lock = threading.Lock()
        self._closed = False
        with _forkserver_lock:  # takes effect only if the forkserver is not running yet
            _forkserver_preload.extend(m for m in self.preload if m not in _forkserver_preload)
            _CONTEXT.set_forkserver_preload(list(_forkserver_preload))

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _running_pool(self) -> ProcessPool:
        """The pebble pool, started now or replaced if it broke."""
        with self._lock:
            if self._closed:
                raise RuntimeError("GradingPool is closed")
            if self._pool is not None and not self._pool.active:
                _stop(self._pool)
                self._pool = None
            if self._pool is None:
                self._pool = ProcessPool(
                    max_workers=self.n_workers, context=_CONTEXT, initializer=_start_worker,
                    initargs=(self.memory_limit_mb, self.preload, self.initializer),
                )
            return self._pool

    def _submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict,
                limit: float) -> tuple[ProcessPool, ProcessFuture] | str:
        """Schedule one call; a description of the failure if no running pool takes it."""
        for _ in range(3):
            pool = self._running_pool()
            try:
                return pool, pool.schedule(_run_in_worker, args=(fn, args, kwargs), timeout=limit)
            except RuntimeError as exc:  # the pool broke or was closed since _running_pool
                failure = _describe(exc)
        return f"grading pool did not accept the call: {failure}"

    @staticmethod
    def _outcome(pool: ProcessPool, future: ProcessFuture, limit: float, start: float) -> CallResult:
        """Wait for ``future``; a pool that stops under it makes this call an error."""
        while not wait([future], timeout=0.5).done:
            if not pool.active:
                return CallResult(ok=False, error="grading pool stopped before the call finished",
                                  elapsed_s=time.perf_counter() - start)
        try:
            tag, value = future.result()
        except FutureTimeout:
            return CallResult(ok=False, timed_out=True, error=f"timed out after {limit} s",
                              elapsed_s=time.perf_counter() - start)
        except ProcessExpired as exc:
            return CallResult(ok=False, error=f"grading worker died (exit code {exc.exitcode})",
                              elapsed_s=time.perf_counter() - start)
        except Exception as exc:  # a broken pool, or a reply that could not be unpickled
            return CallResult(ok=False, error=_describe(exc), elapsed_s=time.perf_counter() - start)
        elapsed = time.perf_counter() - start
        if tag == "ok":
            return CallResult(ok=True, value=value, elapsed_s=elapsed)
        if tag == "failed":
            return CallResult(ok=False, error=f"grading worker did not start: {value}", elapsed_s=elapsed)
        return CallResult(ok=False, error=str(value), elapsed_s=elapsed)

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any) -> CallResult:
        """Run ``fn(*args, **kwargs)`` in a worker within ``timeout_s`` (default: the pool's).

        Never raises for the call's own failures: a time-out, an exception in ``fn``, an
        unpicklable call or a dead worker come back as a :class:`CallResult`. Raises
        RuntimeError once the pool is closed, ValueError for a limit that is not > 0.
        """
        limit = self.timeout_s if timeout_s is None else _check_limit(timeout_s)
        start = time.perf_counter()
        try:
            ForkingPickler.dumps((fn, args, kwargs))  # fail here, not in pebble's scheduler thread
        except Exception as exc:
            return CallResult(ok=False, error=f"call not sendable: {_describe(exc)}")
        submitted = self._submit(fn, args, kwargs, limit)
        if isinstance(submitted, str):
            return CallResult(ok=False, error=submitted, elapsed_s=time.perf_counter() - start)
        return self._outcome(*submitted, limit, start)

    def warm(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Start the workers and wait until each has taken a call (timings then exclude start-up).

        Raises RuntimeError if a worker reports a failed start or they are not all ready
        within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            start = time.perf_counter()
            # one short hold each, so that n ready workers take one each
            submitted = [self._submit(_worker_pid, (0.05,), {}, timeout_s) for _ in range(self.n_workers)]
            results = [CallResult(ok=False, error=s) if isinstance(s, str) else self._outcome(*s, timeout_s, start)
                       for s in submitted]
            failed = [r.error for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"grading pool not ready: {failed[0]}")
            if len({r.value for r in results}) == self.n_workers:
                return
        raise RuntimeError(f"grading workers did not all start within {timeout_s} s")

    def close(self) -> None:
        """Stop all workers. Later calls raise RuntimeError."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            _stop(pool)

    def __enter__(self) -> "GradingPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_limit(timeout_s: float) -> float:
    """``timeout_s`` if it is a usable limit (pebble reads 0 or None as "no limit")."""
    if not timeout_s or not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    return timeout_s


def _stop(pool: ProcessPool) -> None:
    """Stop a pebble pool and its workers without running its queued calls."""
    pool.stop()
    try:
        pool.join(timeout=10)
    except (RuntimeError, FutureTimeout):
        pass


_shared: dict[tuple, GradingPool] = {}
_shared_lock = threading.Lock()


def shared_pool(
    n_workers: int = DEFAULT_WORKERS,
    preload: Sequence[str] = (),
    memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
    initializer: Callable[[], Any] | None = None,
) -> GradingPool:
    """The process-wide pool for these settings: created once, closed at exit."""
    key = (n_workers, tuple(preload), memory_limit_mb, initializer)
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None or pool.closed:
            pool = _shared[key] = GradingPool(n_workers=n_workers, preload=preload,
                                              memory_limit_mb=memory_limit_mb, initializer=initializer)
        return pool


def call_with_timeout(fn: Callable[..., Any], *args: Any, timeout_s: float = DEFAULT_TIMEOUT_S,
                      **kwargs: Any) -> CallResult:
    """Run ``fn`` in the default shared pool under ``timeout_s``; see :class:`GradingPool`."""
    return shared_pool().call(fn, *args, timeout_s=timeout_s, **kwargs)


@atexit.register
def _close_shared() -> None:
    for pool in list(_shared.values()):
        pool.close()
