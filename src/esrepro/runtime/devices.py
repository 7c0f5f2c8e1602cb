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


def noise_device(device: "torch.device | str") -> str:
    """What the ES noise generated on ``device`` depends on: ``cpu``, or the GPU's name and its count of
    streaming multiprocessors (CUDA's ``randn`` splits work by SM count, so an H100 PCIe and an H100 SXM draw
    other noise from one seed)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    return f"{props.name} ({props.multi_processor_count} SMs)"


def synchronize(device: "torch.device | str") -> None:
    """Wait for the work queued on ``device`` (CUDA kernels run asynchronously); nothing to wait for on the CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
