"""Run grading calls under a hard time limit, from any thread.

math-verify's own timeout uses ``signal.alarm``: it only works in the main thread
and cannot interrupt long C-level work (big-integer arithmetic inside sympy, for
example). Here each call instead runs in one of a few persistent worker
processes, and the caller waits for the reply with ``poll(timeout)`` on a pipe,
which works in any thread. A call that overruns is stopped for certain: its
worker gets ``SIGKILL``, a replacement is started at once, and the caller gets a
:class:`CallResult` with ``timed_out=True`` (never an exception). A worker that
dies (segfault, out of memory) is replaced the same way and the call reports
``error``.

Why ``subprocess`` rather than ``multiprocessing`` or ``concurrent.futures``:

* a worker is a fresh ``python -c`` interpreter started by ``fork+exec``, which is
  safe from a multi-threaded parent (a trainer with CUDA, tokenizer or vLLM
  threads), unlike a bare ``fork``;
* ``spawn``/``forkserver`` re-import the parent's ``__main__`` module in every
  worker; for a pipeline's entry script that can mean importing torch in each
  grading worker. A worker here imports only ``preload`` and what its calls need;
* killing one worker does not break the other workers (a
  ``ProcessPoolExecutor`` becomes unusable once one of its processes is killed).

The limit counts from when a ready worker received the call: waiting for a free
worker, or for a replacement to finish its imports, is not counted. Each worker
optionally caps its address space (``memory_limit_mb``) so a hostile input cannot
exhaust the host's memory. Functions passed to :meth:`GradingPool.call` must be
importable by module and name (module-level functions; not from ``__main__``);
workers get the parent's ``sys.path``.
"""

from __future__ import annotations

import atexit
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Sequence

#: Default limit in seconds of one grading call (the authors give math-verify 1 s).
DEFAULT_TIMEOUT_S = 1.0
#: Default cap on a worker's address space.
DEFAULT_MEMORY_LIMIT_MB = 4096
#: Seconds a new worker may take to import ``preload`` and report ready.
STARTUP_TIMEOUT_S = 120.0

_WORKER_CMD = "from esrepro.tasks.timeout import _worker_main; _worker_main()"


@dataclass(frozen=True)
class CallResult:
    """The outcome of one call: ``value`` when ``ok``; else ``timed_out`` or ``error``."""

    ok: bool
    value: Any = None
    timed_out: bool = False
    error: str | None = None
    elapsed_s: float = 0.0


def _worker_main() -> None:
    """Worker loop (run in the child): read calls from stdin, reply on the original stdout."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints go to stderr, never into the reply pipe
    sys.stdout = sys.stderr
    inbox = Connection(os.dup(0), writable=False)
    outbox = Connection(out_fd, readable=False)
    try:
        _, sys_path, preload, memory_limit_mb, initializer = inbox.recv()
    except (EOFError, OSError):
        return
    except Exception as exc:  # e.g. the initializer's module is not importable here
        outbox.send(("failed", f"{type(exc).__name__}: {exc}"[:2000]))
        return
    sys.path[:] = list(sys_path)
    if memory_limit_mb:
        try:
            import resource

            limit = int(memory_limit_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):  # not on this platform: run without a cap
            pass
    import importlib

    try:
        for name in preload:
            importlib.import_module(name)
        if initializer is not None:
            initializer()
    except BaseException as exc:
        outbox.send(("failed", f"{type(exc).__name__}: {exc}"[:2000]))
        return
    outbox.send(("ready", os.getpid()))
    while True:
        try:
            fn, args, kwargs = inbox.recv()
        except (EOFError, OSError):  # the parent closed the pipe or died
            return
        except Exception as exc:  # the call could not be unpickled here
            outbox.send(("error", f"{type(exc).__name__}: {exc}"[:2000]))
            continue
        try:
            reply: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # report everything, MemoryError and RecursionError included
            reply = ("error", f"{type(exc).__name__}: {exc}"[:2000])
        try:
            outbox.send(reply)
        except Exception as exc:  # an unpicklable result
            outbox.send(("error", f"result not sendable: {type(exc).__name__}: {exc}"[:2000]))


class _Worker:
    """One worker process and the parent's ends of its pipes."""

    def __init__(self, preload: Sequence[str], memory_limit_mb: int | None,
                 initializer: Callable[[], Any] | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CMD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.tx = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.rx = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.tx.send(("init", list(sys.path), tuple(preload), memory_limit_mb, initializer))
        self.ready = False
        self.failure = "did not report ready in time"

    def wait_ready(self, timeout_s: float) -> bool:
        if not self.ready:
            try:
                if self.rx.poll(timeout_s):
                    tag, info = self.rx.recv()
                    self.ready = tag == "ready"
                    if not self.ready:
                        self.failure = str(info)
            except (EOFError, OSError):
                self.failure = "exited during start-up"
        return self.ready

    def kill(self) -> None:
        for conn in (self.tx, self.rx):
            try:
                conn.close()
            except OSError:
                pass
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass


class GradingPool:
    """A thread-safe pool of worker processes that run calls under a time limit.

    ``n_workers`` calls run at once; further callers wait for a free worker.
    Workers start lazily on first use (or all at once with :meth:`warm`), together
    with ``spares`` standby workers: a worker killed after a time-out is replaced
    by a standby that is normally ready already, and a new standby starts in the
    background, so back-to-back time-outs do not wait for start-up. Each
    imports the modules in ``preload`` and then runs ``initializer()`` (a picklable
    module-level function, e.g. one that exercises lazy imports) before it
    accepts calls.
    """

    def __init__(
        self,
        n_workers: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        preload: Sequence[str] = (),
        memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
        initializer: Callable[[], Any] | None = None,
        spares: int = 1,
    ) -> None:
        if n_workers < 1 or spares < 0:
            raise ValueError("need n_workers >= 1 and spares >= 0")
        self.n_workers = n_workers
        self.timeout_s = timeout_s
        self.preload = tuple(preload)
        self.memory_limit_mb = memory_limit_mb
        self.initializer = initializer
        self.spares = spares
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        self._spare_pool: queue.Queue[_Worker] = queue.Queue()
        self._spares_started = False
        self._lock = threading.Lock()
        self._workers: set[_Worker] = set()
        self._closed = False
        for _ in range(n_workers):
            self._idle.put(None)  # a free slot; its worker is started on first use

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _start(self) -> _Worker:
        worker = _Worker(self.preload, self.memory_limit_mb, self.initializer)
        with self._lock:
            self._workers.add(worker)
        return worker

    def _start_spares(self) -> None:
        with self._lock:
            if self._spares_started:
                return
            self._spares_started = True
        for _ in range(self.spares):
            self._spare_pool.put(self._start())

    def _replacement(self) -> _Worker:
        """A spare (usually ready already) topped up by a new spare, else a new worker."""
        try:
            worker = self._spare_pool.get_nowait()
        except queue.Empty:
            return self._start()
        self._spare_pool.put(self._start())
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._workers.discard(worker)

    def warm(self) -> None:
        """Start every worker and spare and wait until each is ready (timings then exclude start-up)."""
        self._start_spares()
        slots = [self._idle.get() for _ in range(self.n_workers)]
        try:
            for i, worker in enumerate(slots):
                if worker is None:
                    slots[i] = worker = self._start()
                if not worker.wait_ready(STARTUP_TIMEOUT_S):
                    self._discard(worker)
                    slots[i] = None
                    raise RuntimeError(f"a grading worker did not start: {worker.failure}")
        finally:
            for worker in slots:
                self._idle.put(worker)
        spares = []
        while True:
            try:
                spares.append(self._spare_pool.get_nowait())
            except queue.Empty:
                break
        for spare in spares:
            if spare.wait_ready(STARTUP_TIMEOUT_S):
                self._spare_pool.put(spare)
            else:
                self._discard(spare)
                self._spare_pool.put(self._start())

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any) -> CallResult:
        """Run ``fn(*args, **kwargs)`` in a worker within ``timeout_s`` (default: the pool's).

        Never raises for the call's own failures: a time-out, an exception in
        ``fn`` or a dead worker come back as a :class:`CallResult`.
        """
        if self._closed:
            raise RuntimeError("GradingPool is closed")
        limit = self.timeout_s if timeout_s is None else timeout_s
        worker = self._idle.get()
        try:
            if worker is None:
                worker = self._start()
                self._start_spares()
            if not worker.wait_ready(STARTUP_TIMEOUT_S):
                self._discard(worker)
                failure, worker = worker.failure, None
                return CallResult(ok=False, error=f"grading worker failed to start: {failure}")
            start = time.perf_counter()
            try:
                worker.tx.send((fn, args, kwargs))
                if not worker.rx.poll(limit):
                    self._discard(worker)
                    worker = self._replacement()
                    return CallResult(ok=False, timed_out=True, error=f"timed out after {limit} s",
                                      elapsed_s=time.perf_counter() - start)
                tag, value = worker.rx.recv()
            except (EOFError, OSError) as exc:
                self._discard(worker)
                worker = None
                return CallResult(ok=False, error=f"grading worker died: {type(exc).__name__}",
                                  elapsed_s=time.perf_counter() - start)
            except Exception as exc:  # the call could not be pickled, or the reply unpickled
                return CallResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000],
                                  elapsed_s=time.perf_counter() - start)
            except BaseException:  # interrupted mid-call: the worker's state is unknown
                self._discard(worker)
                worker = None
                raise
            elapsed = time.perf_counter() - start
            if tag == "ok":
                return CallResult(ok=True, value=value, elapsed_s=elapsed)
            return CallResult(ok=False, error=str(value), elapsed_s=elapsed)
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        """Kill all workers. Later calls raise RuntimeError."""
        self._closed = True
        with self._lock:
            workers = list(self._workers)
            self._workers.clear()
        for worker in workers:
            worker.kill()

    def __enter__(self) -> "GradingPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: dict[tuple, GradingPool] = {}
_shared_lock = threading.Lock()


def shared_pool(
    n_workers: int = 1,
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
