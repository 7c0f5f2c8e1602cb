"""Same numbers everywhere: the CPU numerics a tiny-scale job runs with.

PyTorch's CPU wheels pick their kernels by the instruction set of the CPU they run on:
ATen's vectorised kernels (reductions, softmax, norms, elementwise ops) dispatch to
AVX-512, AVX2 or the baseline build, and Intel oneMKL's sgemm (every fp32 ``Linear``)
to its AVX-512 / AVX2 / SSE code paths. Each path sums in another order, so the same
job gives other weights on another CPU. Two environment variables pin both to the
path every x86-64 CPU has:

- ``ATEN_CPU_CAPABILITY=default``: ATen's baseline kernels (no AVX2 / AVX-512 builds);
- ``MKL_CBWR=COMPATIBLE``: oneMKL's conditional numerical reproducibility on its SSE2
  branch. oneMKL documents this branch as the one that holds on non-Intel CPUs too; a
  named branch such as ``AVX2`` falls back to automatic dispatch on AMD and on CPUs
  without it.

Both are read when the libraries start, so they must be in the environment before
``torch`` is imported. The Snakefile sets ``ESREPRO_NUMERICS`` from the config's
``scale`` (:func:`set_scale`: ``portable`` for tiny, ``native`` for paper, whose GPU
kernels these variables do not touch), and every ``esrepro`` command applies it before
any verb imports torch (:func:`apply`). ``ESREPRO_NUMERICS=portable esrepro ...`` does
the same by hand. Every manifest records what was in effect (:func:`record`).

On ARM (aarch64 wheels: OpenBLAS / Arm Compute Library, no MKL) ``MKL_CBWR`` is inert
and ``ATEN_CPU_CAPABILITY=default`` selects ATen's NEON baseline rather than SVE; the
BLAS kernels still differ from x86-64 ones, so ARM runs are not bit-identical to
x86-64 golden outputs.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, MutableMapping

#: The switch: ``portable`` applies :data:`PORTABLE`; ``native`` (or unset) leaves the libraries' own dispatch.
MODE_ENV = "ESREPRO_NUMERICS"
MODES = ("portable", "native")
#: What ``portable`` sets (measured: the smallest set that gives bit-identical tiny builds and ES runs
#: across AVX-512 / AVX2 settings and 1 or 2 threads; see docs/provenance.md).
PORTABLE: dict[str, str] = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
#: Every variable that shapes CPU numerics; each manifest records those that are set.
RECORDED = (MODE_ENV, *PORTABLE, "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
            "MKL_DYNAMIC", "OMP_DYNAMIC", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE")


def mode_for(scale: str) -> str:
    """``portable`` for the tiny scale (CPU jobs, golden outputs), ``native`` for the paper's."""
    return "portable" if scale == "tiny" else "native"


def mode(environ: MutableMapping[str, str] | None = None) -> str:
    """The mode asked for in ``environ`` (``native`` when unset); an unknown value is an error naming the variable."""
    value = (os.environ if environ is None else environ).get(MODE_ENV, "native").strip().lower() or "native"
    if value not in MODES:
        raise ValueError(f"${MODE_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def environment(chosen: str, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) as a job in mode ``chosen`` sees it."""
    env = dict(os.environ if environ is None else environ)
    env[MODE_ENV] = chosen
    if chosen == "portable":
        env.update(PORTABLE)
    return env


def set_scale(scale: str, environ: MutableMapping[str, str] | None = None) -> str:
    """Set the mode of ``scale`` (and, for portable, its variables) in ``environ``: what every job inherits."""
    environ = os.environ if environ is None else environ
    chosen = mode_for(scale)
    environ.update(environment(chosen, {}))
    return chosen


def apply(environ: MutableMapping[str, str] | None = None, reexec: bool = False) -> bool:
    """In portable mode, put :data:`PORTABLE` into ``environ`` before torch is imported; True when something changed.

    Called first thing by the ``esrepro`` command. If torch was already imported (its kernels
    already chosen) and ``reexec`` is set (the console script, not an in-process call), the
    process re-executes itself with the new environment.
    """
    environ = os.environ if environ is None else environ
    if mode(environ) != "portable":
        return False
    missing = {k: v for k, v in PORTABLE.items() if environ.get(k) != v}
    if not missing:
        return False
    environ.update(missing)
    if reexec and "torch" in sys.modules and environ is os.environ:  # too late for ATen and MKL to read them
        os.execv(sys.executable, [sys.executable, "-m", "esrepro.cli", *sys.argv[1:]])
    return True


def _blas() -> str | None:
    import torch

    for part in torch.__config__.show().replace(",", " ").split():
        if part.startswith("BLAS_INFO="):
            return part.split("=", 1)[1]
    return None


def record() -> dict[str, Any]:
    """What the manifest records: the mode, the numerics variables set, and the kernels torch chose."""
    import torch

    return {
        "mode": mode(),
        "env": {k: os.environ[k] for k in RECORDED if k in os.environ},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "blas": _blas(),
    }
