"""A preloaded interpreter for local runs: each ``esrepro`` job is forked from a process that has torch loaded.

A tiny-scale job spends about 5 s of CPU importing torch, transformers and PEFT and a few seconds
working; the embedded default runs some 170 of them on two cores. Under a local Snakemake run the
Snakefile starts one server (:func:`start`, from its ``onstart`` hook) that imports those libraries
once and listens on a Unix socket named by ``$ESREPRO_FORKSERVER``. The ``esrepro`` command a job
runs (:func:`delegate`, first thing in ``esrepro.cli.main``) hands the server its arguments, working
folder, environment and standard streams; the server forks a child that runs the verb exactly as the
command would, and the command exits with the child's status. Snakemake still starts, orders and
tracks every job; only the interpreter's start-up is shared, as in ``multiprocessing``'s forkserver
(whose preload serves one program's workers, not separate commands, so it cannot be used here).

What keeps a forked job equal to a fresh one, or else runs it fresh:

* the server refuses a job whose interpreter (``sys.prefix``, version) differs from its own, or whose value of a
  variable that decides differs (:func:`decides`): the variables that the libraries it has loaded read, at import
  or later, and that can change a job's numbers or what its imports do. Those are named in :data:`DECIDING` and
  :data:`DECIDING_PREFIXES`: Python's own (``PYTHON*``), the thread and kernel variables of torch, OpenMP, MKL,
  OpenBLAS, oneDNN and numpy (read when torch loads; esrepro.runtime.numerics), CUDA's, the caches and switches of
  transformers, the hub client, tokenizers, PEFT, TRL, accelerate, vLLM and Ray, esrepro's own (``ESREPRO_*``), and
  the locale, home, time zone and dynamic loader (read once by the interpreter or the libraries it loaded). A
  declined job runs in its own process, as it would without a server, and says why. Every other variable never
  decides: the shell's (``PS1``, ``PS2``, ``PROMPT_COMMAND``, ``SHLVL``, ``_``, ``PWD``, ``OLDPWD``, ``TERM``, a
  venv's ``VIRTUAL_ENV``; Snakemake runs each job through a non-interactive bash, which drops or resets some of
  them), ``PATH`` (looked up by a job's subprocesses, which see the job's own) and the temporary folder. A
  list of what decides, rather than of what may differ, is the choice that lets an activated venv, ``make`` or
  any shell start the run, and the forked job still runs with its own environment, every variable included
  (:meth:`_Server.become_job`); what the list must not miss is a variable read once, at import, by a module the
  server preloads, which a forked job would not read again (a new library's, when it joins :data:`PRELOAD`);
* the server never runs a torch operation and refuses to serve if loading started a thread (a forked
  OpenMP pool would hang the child);
* the child takes the job's environment, folder, streams and ``sys.argv``, the default signal handlers
  and the command's process group, and exits through the interpreter's exit handlers.

Nothing outlives its owner: the server and its children are in Snakemake's process group, so a kill of
the group (Ctrl-C, SIGKILL to the group) reaches them as it reaches fresh jobs; a command that is killed
alone (Snakemake cancelling the job) closes its connection and the server stops the child (SIGTERM, then
SIGKILL after :data:`GRACE_S`); the server ends when the Snakemake process that started it is gone (:func:`stop`
from the ``onsuccess``/``onerror`` hooks, or its parent's death otherwise), stopping any child left.
If the server goes away mid-job, the command fails with a message rather than reporting success.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

#: The socket of the server a job may use (set by :func:`start` for the jobs Snakemake starts).
SOCKET_ENV = "ESREPRO_FORKSERVER"
#: Variables whose value decides whether a job may run in the server (with :data:`DECIDING_PREFIXES`): read once by
#: the interpreter or by a preloaded library (the locale sets the interpreter's text encoding at start-up; the hub
#: client reads ``HOME`` and ``XDG_CACHE_HOME`` for its cache folders when it loads; the dynamic loader its
#: variables when torch's libraries load; ``TZ`` the time functions).
DECIDING = frozenset({"HOME", "XDG_CACHE_HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ",
                      "LD_PRELOAD", "LD_LIBRARY_PATH", "MALLOC_ARENA_MAX", "CUBLAS_WORKSPACE_CONFIG"})
#: Prefixes of the deciding variables: Python; torch and its kernels (OpenMP, Intel's OpenMP, MKL, OpenBLAS,
#: GotoBLAS, Accelerate's vecLib, numexpr, oneDNN, ATen, Triton); numpy; CUDA and NCCL; transformers, the hub client,
#: tokenizers, safetensors, datasets, PEFT, TRL, accelerate, vLLM, Ray; esrepro (less :data:`SOCKET_ENV`).
DECIDING_PREFIXES = ("PYTHON", "TORCH", "PYTORCH_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GOTO_",
                     "VECLIB_", "NUMEXPR_", "DNNL_", "ONEDNN_", "ATEN_", "NPY_", "NUMPY_", "CUDA_", "CUDNN_",
                     "NCCL_", "NVIDIA_", "TRANSFORMERS_", "HF_", "HUGGINGFACE_", "TOKENIZERS_", "SAFETENSORS_",
                     "DATASETS_", "PEFT_", "TRL_", "ACCELERATE_", "VLLM_", "RAY_", "TRITON_", "ESREPRO_")
#: The variables Snakemake sets to a job's thread count; the server is started with them at 1, the
#: thread count of every tiny-scale job (a job with more threads differs, and runs fresh).
THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
#: What the server loads before it serves: the libraries whose import dominates a tiny job, then every
#: esrepro module but those under :data:`NOT_PRELOADED`. pandas (the report modules) is left out: it loads
#: pyarrow, whose allocator starts a thread; TRL too (it loads pyarrow through datasets). Jobs import them. The one
#: model family named: Qwen2's modeling module, the tiny default's architecture (any other is imported by its job).
PRELOAD = ("torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "peft", "math_verify")
NOT_PRELOADED = ("esrepro.report", "esrepro.runtime.forkserver")
#: What a forked child runs with the job's arguments (``module:function``, resolved in the child).
ENTRY = "esrepro.cli:main"
#: Seconds between SIGTERM and SIGKILL for a child whose command went away, and between the server's looks.
GRACE_S = 5.0
POLL_S = 0.25
#: More declined jobs than this in one run, and the Snakefile's hooks name them in Snakemake's log (:func:`note`).
DECLINED_NOTE = 3
_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!i")

_server: subprocess.Popen | None = None
_log: tuple[Path, int] | None = None  # the server's log and its size when the server started


def decides(name: str) -> bool:
    """Whether a variable's value decides if a job may run in the server (:data:`DECIDING`, :data:`DECIDING_PREFIXES`)."""
    return name != SOCKET_ENV and (name in DECIDING or name.startswith(DECIDING_PREFIXES))


def fingerprint(prefix: str, version: str, environ: dict[str, str]) -> dict[str, Any]:
    """What must be equal between the server and a job: the interpreter and the variables that decide (:func:`decides`)."""
    return {"prefix": os.path.realpath(prefix), "version": version,  # a venv reached through a link is the same
            "env": {k: v for k, v in sorted(environ.items()) if decides(k)}}


def difference(mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """A short reason why a job with fingerprint ``theirs`` cannot run in a server of ``mine``; None if it can."""
    for key in ("prefix", "version"):
        if mine[key] != theirs[key]:
            return f"another interpreter ({key} {theirs[key]!r}, server {mine[key]!r})"
    names = sorted(k for k in set(mine["env"]) | set(theirs["env"]) if mine["env"].get(k) != theirs["env"].get(k))
    if names:
        shown = ", ".join(f"{k}={theirs['env'].get(k, '(unset)')!r}" for k in names[:3])
        return f"another environment ({shown}{', ...' if len(names) > 3 else ''})"
    return None


# ----------------------------------------------------------------------------------------------- the command


def delegate(argv: Sequence[str]) -> int | None:
    """Run ``esrepro argv`` in the server named by ``$ESREPRO_FORKSERVER``; its exit status, or None to run here.

    None when no server is named, when it cannot be reached, or when it declines the job (a note on
    stderr says why). SIGTERM or SIGINT to this command ends the child too (the server sees the
    connection close).
    """
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, [b"J"], [0, 1, 2])
        payload = json.dumps({"argv": list(argv), "cwd": os.getcwd(), "pgid": os.getpgrp(), "prefix": sys.prefix,
                              "version": sys.version, "environ": dict(os.environ)}).encode()
        conn.sendall(_HEADER.pack(len(payload)) + payload)
        reply = _read(conn, 1)
        reason = _read_message(conn).decode() if reply == b"R" else "it closed the connection"
    except OSError as exc:
        conn.close()
        print(f"esrepro: the preloaded interpreter at {path} is not available ({exc}); starting fresh",
              file=sys.stderr)
        return None
    if reply != b"S":
        conn.close()
        print(f"esrepro: the preloaded interpreter declined this job: {reason}; starting fresh", file=sys.stderr)
        return None
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # end here; the closed connection ends the child
        signal.signal(sig, lambda signum, _: os._exit(128 + signum))
    try:
        status = _read(conn, _STATUS.size)
    except OSError:
        status = b""
    if len(status) != _STATUS.size:
        print(f"esrepro: the preloaded interpreter at {path} ended before this job did", file=sys.stderr)
        return 1
    return _STATUS.unpack(status)[0]


def _read(conn: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes, or fewer if the peer closed the connection."""
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _read_message(conn: socket.socket) -> bytes:
    size = _read(conn, _HEADER.size)
    if len(size) != _HEADER.size:
        raise ConnectionError("connection closed before the message")
    body = _read(conn, _HEADER.unpack(size)[0])
    if len(body) != _HEADER.unpack(size)[0]:
        raise ConnectionError("connection closed inside the message")
    return body


def _send_message(conn: socket.socket, kind: bytes, body: bytes) -> None:
    conn.sendall(kind + _HEADER.pack(len(body)) + body)


# -------------------------------------------------------------------------------------------- the Snakefile


def start(log: str | Path, threads: int = 1) -> Path | None:
    """Start the server for this Snakemake process's local jobs and name it in ``$ESREPRO_FORKSERVER``.

    Its own output goes to ``log``. The server environment is this process's, with Snakemake's thread
    variables at ``threads`` (what a job of that many threads sees). Returns once the socket is bound (jobs that
    connect then wait while it loads); the socket path, or None on a system without ``fork`` or Unix sockets.
    """
    global _server
    if not hasattr(os, "fork") or not hasattr(socket, "AF_UNIX"):
        return None
    stop()
    folder = Path(tempfile.mkdtemp(prefix="esrepro-fs-"))
    path = folder / "jobs.sock"
    env = {**os.environ, **{k: str(threads) for k in THREAD_VARS}, SOCKET_ENV: str(path)}
    global _log
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        _log = (Path(log), out.tell())
        _server = subprocess.Popen(
            [sys.executable, "-m", "esrepro.runtime.forkserver", str(path), str(os.getpid())],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # in Snakemake's process group: a kill of the group (Ctrl-C, a test's SIGKILL) takes it along
    deadline = time.monotonic() + 30.0  # it binds before loading: the first jobs queue for it, not load their own
    while not path.exists() and _server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.environ[SOCKET_ENV] = str(path)
    return path


def stop(timeout_s: float = 30.0, warn: Callable[[str], Any] | None = None) -> dict[str, Any] | None:
    """Stop the server :func:`start` started (it stops its children first) and forget its socket.

    Returns what it counted (:func:`summary` of its log since it started), or None when none was started or it
    wrote no summary; ``warn`` (Snakemake's logger) gets :func:`note`'s line when many jobs were declined."""
    global _server, _log
    path = os.environ.pop(SOCKET_ENV, None)
    if _server is not None:
        if _server.poll() is None:
            _server.terminate()
            try:
                _server.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _server.kill()
                _server.wait()
        _server = None
    if path:
        Path(path).unlink(missing_ok=True)
        try:
            Path(path).parent.rmdir()
        except OSError:
            pass
    if _log is None:
        return None
    log, offset = _log
    _log = None
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            counts = summary(f.read().decode(errors="replace"))
    except OSError:
        return None
    if warn is not None and (line := note(counts, log)):
        warn(line)
    return counts


_STOPPED = "esrepro forkserver: stopped; served {served} jobs, declined {declined}"
_REASON = "esrepro forkserver: declined {count}: {reason}"


def summary(log: str) -> dict[str, Any] | None:
    """The last run's counts in a server log's text: ``{"served", "declined", "reasons": {reason: count}}``, or None."""
    import re

    found = None
    for line in log.splitlines():
        if m := re.fullmatch(r"esrepro forkserver: stopped; served (\d+) jobs, declined (\d+)", line.strip()):
            found = {"served": int(m.group(1)), "declined": int(m.group(2)), "reasons": {}}
        elif found is not None and (m := re.fullmatch(r"esrepro forkserver: declined (\d+): (.*)", line.strip())):
            found["reasons"][m.group(2)] = int(m.group(1))
    return found


def note(counts: dict[str, Any] | None, log: str | Path = "the preloaded interpreter's log") -> str | None:
    """A line for Snakemake's log when more than :data:`DECLINED_NOTE` jobs were declined (their reasons), else None."""
    if not counts or counts["declined"] <= DECLINED_NOTE:
        return None
    reasons = "; ".join(f"{n} x {r}" for r, n in sorted(counts["reasons"].items(), key=lambda kv: -kv[1])[:3])
    return (f"the preloaded interpreter (esrepro.runtime.forkserver) served {counts['served']} jobs and declined "
            f"{counts['declined']}, which loaded torch themselves and ran slower: {reasons} (see {log})")


# ----------------------------------------------------------------------------------------------- the server


def preload(modules: Sequence[str] = PRELOAD, package: str | None = "esrepro") -> int:
    """Import ``modules`` and ``package``'s modules (less :data:`NOT_PRELOADED`); returns how many were loaded.

    Raises RuntimeError if loading started a thread: a forked child would lack it (an OpenMP pool would hang).
    """
    import importlib
    import pkgutil

    for name in modules:
        importlib.import_module(name)
    loaded = len(modules)
    if package:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.startswith(NOT_PRELOADED) or info.name.endswith("__main__"):
                continue
            importlib.import_module(info.name)
            loaded += 1
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        raise RuntimeError(f"loading the modules started {threads - 1} thread(s); forking would be unsafe")
    return loaded


def serve(path: str | Path, parent: int | None = None, modules: Sequence[str] = PRELOAD,
          package: str | None = "esrepro", entry: str = ENTRY) -> int:
    """Preload (:func:`preload`), then fork one child per job that connects to ``path`` until told to stop.

    A child calls ``entry`` ("module:function") with the job's arguments. Stops on SIGTERM or SIGINT, or once
    ``parent`` (a pid) is no longer this process's parent; children still running are stopped.
    """
    before = dict(os.environ)  # what a job's environment must equal; loading may add to it (transformers does)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))  # jobs that connect while the modules load wait for them instead of loading their own
    listener.listen(64)
    try:
        started = time.time()
        loaded = preload(modules, package)
    except BaseException:
        listener.close()
        Path(path).unlink(missing_ok=True)
        raise
    print(f"esrepro forkserver: loaded {loaded} modules in {time.time() - started:.1f} s; serving {path}", flush=True)
    loading = {k: os.environ.get(k) for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
    return _Server(Path(path), listener, fingerprint(sys.prefix, sys.version, before), loading, entry).run(parent)


class _Server:
    """The serving loop: one process, no threads (it forks), polling every :data:`POLL_S`."""

    def __init__(self, path: Path, listener: socket.socket, mine: dict, loading: dict[str, str | None],
                 entry: str):
        self.path, self.listener, self.mine, self.entry = path, listener, mine, entry
        self.loading = loading  # variables loading set (None: removed), applied over a job's as its imports would
        self.selector = selectors.DefaultSelector()
        self.jobs: dict[int, _Job] = {}
        self.stopping = False
        self.served = self.declined = 0
        self.reasons: Counter[str] = Counter()

    def run(self, parent: int | None) -> int:
        def request_stop(*_: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        try:
            while not self.stopping and (parent is None or os.getppid() == parent):
                for key, _ in self.selector.select(POLL_S):
                    if key.fileobj is self.listener:
                        self.accept()
                    else:  # the command's end of a running job closed: the job is cancelled
                        self.cancel(key.fileobj)
                self.reap()
                self.escalate()
        finally:
            self.selector.close()
            self.listener.close()
            self.path.unlink(missing_ok=True)
            self.stop_all()
            print(_STOPPED.format(served=self.served, declined=self.declined), flush=True)
            for reason, count in self.reasons.most_common():
                print(_REASON.format(count=count, reason=reason), flush=True)
        return 0

    def accept(self) -> None:
        """Take one connection: fork its job, decline it, or drop a broken one."""
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        conn.settimeout(10.0)
        fds: list[int] = []
        try:
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            request = json.loads(_read_message(conn))
            if len(fds) != 3:
                raise ConnectionError(f"{len(fds)} file descriptors instead of 3")
            reason = difference(self.mine, fingerprint(request["prefix"], request["version"], request["environ"]))
            if reason:
                _send_message(conn, b"R", reason.encode())
                self.declined += 1
                self.reasons[reason] += 1
                for fd in fds:
                    os.close(fd)
                conn.close()
                return
            conn.sendall(b"S")
        except (OSError, ValueError, KeyError) as exc:
            print(f"esrepro forkserver: dropped a connection: {exc!r}", flush=True)
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.become_job(request, fds, conn)  # never returns
        for fd in fds:
            os.close(fd)
        conn.settimeout(None)
        self.jobs[pid] = _Job(pid, conn)
        self.selector.register(conn, selectors.EVENT_READ)
        self.served += 1

    def become_job(self, request: dict, fds: list[int], conn: socket.socket) -> None:
        """In the child: the job's streams, folder, environment and arguments; run the entry; exit with its status."""
        status = 1
        try:
            self.selector.close()
            self.listener.close()
            conn.close()
            for job in self.jobs.values():
                job.conn.close()
            try:  # the command's process group, where a fresh command would be: a signal to the group reaches it
                os.setpgid(0, int(request["pgid"]))
            except (OSError, ValueError, KeyError):  # the command is in another session: a group of its own
                os.setpgid(0, 0)
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["environ"])
            tempfile.tempdir = None  # the job's temporary folder, should loading have asked for the server's
            for k, v in self.loading.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            sys.argv = ["esrepro", *request["argv"]]
            import importlib

            module, name = self.entry.split(":")
            status = getattr(importlib.import_module(module), name)(request["argv"])
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - the traceback goes to the job's log, as a fresh command's would
            import traceback

            traceback.print_exc()
            status = 1
        finally:
            try:
                import atexit

                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status if isinstance(status, int) else 1)

    def cancel(self, conn: Any) -> None:
        """The command of a job went away (or wrote, which it never does): SIGTERM the job (SIGKILL follows)."""
        self.selector.unregister(conn)
        job = next((j for j in self.jobs.values() if j.conn is conn), None)
        if job is None:
            conn.close()
            return
        _signal_job(job.pid, signal.SIGTERM)
        job.kill_at = time.monotonic() + GRACE_S

    def reap(self) -> None:
        """Collect finished children and send each command its job's exit status."""
        while self.jobs:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is None:
                continue
            status = os.waitstatus_to_exitcode(raw)
            if status < 0:  # killed by a signal: report it as a shell does
                status = 128 - status
            try:
                self.selector.unregister(job.conn)
            except (KeyError, ValueError):
                pass
            try:
                job.conn.sendall(_STATUS.pack(status))
            except OSError:
                pass
            job.conn.close()

    def escalate(self) -> None:
        """SIGKILL a cancelled job still running :data:`GRACE_S` after its SIGTERM."""
        now = time.monotonic()
        for job in self.jobs.values():
            if job.kill_at is not None and now >= job.kill_at:
                _signal_job(job.pid, signal.SIGKILL)
                job.kill_at = None

    def stop_all(self) -> None:
        """Stop every running job and what it started (:func:`esrepro.runtime.lifeline.stop_all`, which collects them).

        Their commands get no status: they fail, saying the server ended before their job did.
        """
        import psutil

        from esrepro.runtime.lifeline import stop_all

        running = []
        for job in self.jobs.values():
            try:
                running.append(psutil.Process(job.pid))
            except psutil.NoSuchProcess:
                pass
        stop_all(running, GRACE_S)
        for job in self.jobs.values():
            job.conn.close()
        self.jobs.clear()


class _Job:
    """A child the server forked, and the connection of the command waiting for it."""

    def __init__(self, pid: int, conn: socket.socket):
        self.pid, self.conn = pid, conn
        self.kill_at: float | None = None


def _signal_job(pid: int, sig: int) -> None:
    """Signal a child: its process group if it leads one, else the child alone (it is in its command's group,
    which may hold Snakemake itself). The helpers a verb starts end with it (esrepro.runtime.lifeline)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
