"""Which device a job runs on: CUDA when it is there (or when asked for), else the CPU."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ENV = "ESREPRO_DEVICE"


def pick_device(requested: str | None = None) -> str:
    """``requested`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``), else $ESREPRO_DEVICE, else ``auto``.

    ``auto`` is ``cuda`` when torch sees a GPU and ``cpu`` otherwise; asking for CUDA on a
    machine without it is an error naming the setting.
    """
    import torch

    want = (requested or os.environ.get(ENV) or "auto").lower()
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {want!r} asked for (setting device or ${ENV}), but torch sees no CUDA device")
    if want != "cpu" and not want.startswith("cuda"):
        raise ValueError(f"device {want!r}: expected auto, cpu, cuda or cuda:N")
    return want


#: What CUDA noise depends on when a GPU can draw each chunk in one pass (esrepro.perturb.noise.CUDA_NOISE_CHUNK).
CUDA_PORTABLE_NOISE = "cuda (Philox, chunked draws)"


def describe_gpu(device: "torch.device | str") -> str:
    """A GPU's name and count of streaming multiprocessors, e.g. ``NVIDIA H100 80GB HBM3 (132 SMs)``."""
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    return f"{props.name} ({props.multi_processor_count} SMs)"


def noise_device(device: "torch.device | str") -> str:
    """What the ES noise generated on ``device`` depends on: ``cpu``, or on CUDA :data:`CUDA_PORTABLE_NOISE` (the
    same noise on any GPU whose threads cover one chunk, so a resume may move between H100 variants), else the
    GPU's name and SM count (a small GPU, where CUDA's kernel splits a chunk by SM count)."""
    import torch

    from esrepro.perturb.noise import CUDA_NOISE_CHUNK

    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    if props.multi_processor_count * props.max_threads_per_multi_processor >= CUDA_NOISE_CHUNK:
        return CUDA_PORTABLE_NOISE
    return describe_gpu(device)


def synchronize(device: "torch.device | str") -> None:
    """Wait for the work queued on ``device`` (CUDA kernels run asynchronously); nothing to wait for on the CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
