"""Writing an ESSA candidate as a checkpoint: a peft LoRA adapter, or merged weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.torch import save_file

from esrepro.essa.lora import ADAPTER_WEIGHTS, PEFT_PREFIX, copy_adapter_config
from esrepro.essa.svd import CandidateApplier, SingularValueSpace
from esrepro.io import atomic_path


def save_adapter(space: SingularValueSpace, x: np.ndarray, sft_adapter_dir: str | Path, out_dir: str | Path) -> None:
    """Write candidate x as a peft LoRA adapter in ``out_dir`` (atomically).

    The config (rank, alpha, targets, base model) is the SFT adapter's; the weights are
    ``space.adapter_factors(x)`` under the SFT adapter's tensor names and dtypes, so peft
    loads the result like the SFT adapter. Its update ``scaling * B' A'`` equals the
    candidate's to float rounding (not bit for bit: for the exact evaluated weights use
    ``save_merged``).
    """
    sft_adapter_dir = Path(sft_adapter_dir)
    with safe_open(str(sft_adapter_dir / ADAPTER_WEIGHTS), framework="pt") as fh:
        keys = list(fh.keys())
        dtypes = {k: fh.get_slice(k).get_dtype() for k in keys}
    factors = space.adapter_factors(x, dtype=_torch_dtype("F64"))
    tensors = {}
    for name, f in factors.items():
        for part, value in (("A", f.A), ("B", f.B)):
            key = f"{PEFT_PREFIX}{name}.lora_{part}.weight"
            if key not in dtypes:
                raise KeyError(f"{sft_adapter_dir / ADAPTER_WEIGHTS} has no tensor {key!r} for module {name!r}")
            tensors[key] = value.to(_torch_dtype(dtypes[key])).contiguous()
    extra = set(keys) - set(tensors)
    if extra:
        raise ValueError(f"SFT adapter has tensors outside the search space: {sorted(extra)[:3]}")
    with atomic_path(out_dir, is_dir=True) as tmp:
        copy_adapter_config(sft_adapter_dir, tmp)
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def save_merged(applier: CandidateApplier, tokenizer, x: np.ndarray, out_dir: str | Path) -> None:
    """Write the model carrying candidate x (the exact evaluated weights) as a transformers checkpoint."""
    from esrepro.models.loading import save_checkpoint

    model = applier.model
    with atomic_path(out_dir, is_dir=True) as tmp, applier.candidate(x):
        save_checkpoint(model, tokenizer, tmp)


def _torch_dtype(name: str):
    import torch

    table = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    if name not in table:
        raise ValueError(f"unsupported adapter dtype {name!r}")
    return table[name]


def save_merged_from_base(space: SingularValueSpace, x: np.ndarray, sft_adapter_dir: str | Path,
                          base_dir: str | Path, out_dir: str | Path, dtype: str = "float32") -> None:
    """Write candidate x merged into the unquantised base (``dtype``, on the CPU) as a transformers checkpoint.

    For runs whose candidates were scored on a quantised base: the checkpoint is the
    candidate's adapter (``save_adapter``) merged by peft into the full-precision base, so it
    loads like every other checkpoint; it is not the quantised model that was scored.
    """
    import tempfile

    from esrepro.essa.lora import load_merged
    from esrepro.models.loading import load_tokenizer, save_checkpoint

    with tempfile.TemporaryDirectory(prefix="essa_adapter_") as tmp:
        save_adapter(space, x, sft_adapter_dir, Path(tmp) / "adapter")
        model = load_merged(base_dir, Path(tmp) / "adapter", dtype=dtype, device="cpu")
    with atomic_path(out_dir, is_dir=True) as out:
        save_checkpoint(model, load_tokenizer(base_dir), out)
