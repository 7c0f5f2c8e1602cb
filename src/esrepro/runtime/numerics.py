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

numpy (CMA-ES, z-scored rewards) dispatches its own way: its ufuncs (exp, log, power) to
AVX2 / AVX-512 loops by the CPU's features, and the OpenBLAS it bundles (``linalg``) to a kernel
per CPU family. Two more variables pin those:

- ``NPY_ENABLE_CPU_FEATURES=SSE2``: numpy's baseline loops only (no dispatched AVX2 / AVX-512);
- ``OPENBLAS_CORETYPE=Nehalem``: OpenBLAS's kernels for x86-64-v2, numpy's own minimum.

One kind of kernel no variable pins: oneMKL's vector math, which ATen calls for ``sqrt`` and
``pow(x, 0.5)`` on CPU tensors (measured too: float32 ``atan`` and ``gelu``, float64 ``tan`` and
``asin``). Its ``COMPATIBLE`` branch is not IEEE sqrt (it differs from numpy's correctly rounded
one), and its bits change under qemu-user with any CPU model, while ``MKL_CBWR=AVX2`` there gives
the IEEE result: the signature of an approximate instruction (``rsqrtps``), whose last bits the
x86 specification leaves to the implementation, so Intel and AMD processors differ. Tiny-scale
code therefore takes no such op on a tensor: AdamW is torch's fused implementation
(:func:`adamw`, :data:`TRAINER_OPTIM`), which computes its own, correctly rounded square root,
and :func:`sqrt` rounds correctly on CPU. TRL's GRPO takes one inside itself, for the standard
deviation that scales its advantages: esrepro's GRPO hands it :func:`nanstd` instead
(:func:`portable_trl`). ``tests/test_cross_cpu.py`` runs the training steps
natively and under qemu-user with an AMD and an Intel CPU model and compares their bits.

All four are read when the libraries start, so they must be in the environment before
``torch`` or ``numpy`` is imported. The Snakefile sets ``ESREPRO_NUMERICS`` from the config's
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
#: across AVX-512 / AVX2 settings and 1 or 2 threads, and numpy's ufuncs and linalg natively and under qemu's
#: AMD and Intel CPU models; see docs/provenance.md).
PORTABLE: dict[str, str] = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                            "NPY_ENABLE_CPU_FEATURES": "SSE2", "OPENBLAS_CORETYPE": "Nehalem"}
#: Every variable that shapes CPU numerics; each manifest records those that are set.
RECORDED = (MODE_ENV, *PORTABLE, "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
            "MKL_DYNAMIC", "OMP_DYNAMIC", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NPY_DISABLE_CPU_FEATURES")
#: transformers' ``optim`` for its ``Trainer`` (TRL's GRPO and SFT trainers): torch's fused AdamW (:func:`adamw`).
TRAINER_OPTIM = "adamw_torch_fused"
#: The CPU flags (``/proc/cpuinfo``) that ATen, oneMKL, oneDNN, numpy and OpenBLAS dispatch on; manifests record them.
DISPATCH_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512dq", "avx512cd", "avx512bw",
                  "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                  "amx_bf16", "amx_int8", "amx_tile")


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

    Called first thing by the ``esrepro`` command. If torch or numpy was already imported (its
    kernels already chosen) and ``reexec`` is set (the console script, not an in-process call),
    the process re-executes itself with the new environment.
    """
    environ = os.environ if environ is None else environ
    if mode(environ) != "portable":
        return False
    missing = {k: v for k, v in PORTABLE.items() if environ.get(k) != v}
    if not missing:
        return False
    environ.update(missing)
    loaded = "torch" in sys.modules or "numpy" in sys.modules
    if reexec and loaded and environ is os.environ:  # too late for ATen, MKL, numpy and OpenBLAS to read them
        os.execv(sys.executable, [sys.executable, "-m", "esrepro.cli", *sys.argv[1:]])
    return True


def _blas() -> str | None:
    import torch

    for part in torch.__config__.show().replace(",", " ").split():
        if part.startswith("BLAS_INFO="):
            return part.split("=", 1)[1]
    return None


def cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU: vendor, model name, family / model / stepping and the :data:`DISPATCH_FLAGS` it has.

    Read from ``/proc/cpuinfo`` (or the text ``cpuinfo``); elsewhere only ``platform.processor()``.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return {"model_name": platform.processor() or None}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: every core of a machine is the same model
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {
        "vendor": fields.get("vendor_id"),
        "model_name": fields.get("model name") or platform.processor() or None,
        "family_model_stepping": "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping")),
        "flags": " ".join(f for f in DISPATCH_FLAGS if f in flags),
    }


def describe_cpu(record: dict[str, Any] | None) -> str:
    """One line for a recorded :func:`cpu`: ``model name (vendor, family/model/stepping; flags)``."""
    if not record:
        return "not recorded"
    return (f"{record.get('model_name') or 'unknown model'} ({record.get('vendor') or 'unknown vendor'}, "
            f"family/model/stepping {record.get('family_model_stepping', '?')}; {record.get('flags') or 'no flags'})")


def numpy_dispatch() -> list[str]:
    """The SIMD targets numpy dispatches to on this CPU now (none in portable mode)."""
    from numpy._core import _multiarray_umath as umath

    return [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)]


def adamw(params: Any, lr: float, weight_decay: float) -> Any:
    """torch's AdamW in its fused implementation, whose square root is correctly rounded on every CPU.

    The default (foreach) and single-tensor implementations take ``torch.sqrt`` of the second moment,
    which on CPU is oneMKL's vector math: other bits on Intel than on AMD processors (module docstring).
    The fused one is also the faster one on GPUs.
    """
    import torch

    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)


def sqrt(t: Any) -> Any:
    """The correctly rounded square root of tensor ``t`` (no autograd): on CPU through numpy's IEEE square root
    (ATen's is oneMKL's vector math, whose bits depend on the CPU; a dtype numpy lacks, such as bfloat16, goes
    through float64 and back), elsewhere ``torch.sqrt``."""
    import numpy as np
    import torch

    if t.device.type != "cpu":
        return torch.sqrt(t)
    x = t.detach()
    if x.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.sqrt(x.numpy()))
    return torch.from_numpy(np.sqrt(x.to(torch.float64).numpy())).to(x.dtype)


def nanstd(tensor: Any, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> Any:
    """TRL's ``nanstd`` (GRPO's reward standard deviation, per group or over the batch: NaNs ignored, Bessel's
    correction, NaN for a single value) with a correctly rounded square root (:func:`sqrt`). TRL's takes
    ``torch.sqrt``: oneMKL's vector math on CPU, whose bits follow the CPU (16 groups of 8 rewards, the tiny
    GRPO runs' shape, already give other bits under qemu's AMD model), and with them every std-scaled advantage.
    """
    import torch

    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    std = sqrt(variance * correction)
    if keepdim:
        return std
    if dim is None:
        return std.squeeze()
    return std.squeeze(dim) if isinstance(dim, int) else std.squeeze(tuple(dim))


def portable_trl() -> None:
    """Make TRL's GRPO trainer scale its advantages by :func:`nanstd` (its module's own name for the function it
    calls), so that GRPO's advantages, and everything after them, are the same bits on every CPU."""
    from trl.trainer import grpo_trainer

    grpo_trainer.nanstd = nanstd


def record() -> dict[str, Any]:
    """What the manifest records: the mode, the numerics variables set, the kernels torch and numpy chose, the CPU."""
    import torch

    return {
        "mode": mode(),
        "env": {k: os.environ[k] for k in RECORDED if k in os.environ},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "numpy_dispatch": numpy_dispatch(),
        "machine": platform.machine(),
        "blas": _blas(),
        "cpu": cpu(),
    }
