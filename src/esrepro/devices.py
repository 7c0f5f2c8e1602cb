"""Which device a job runs on: CUDA when it is there (or when asked for), else the CPU."""

from __future__ import annotations

import os

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
