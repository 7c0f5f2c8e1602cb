"""An ESSA engine: the SFT model on transformers, candidates applied in place, greedy generation.

``precision: native`` merges the SFT adapter into the base weights (peft ``merge_and_unload``)
in the registry dtype and applies a candidate in residual form to the merged weights
(:class:`~esrepro.essa.svd.CandidateApplier`). ``int8``/``int4`` load the base through
bitsandbytes (``BitsAndBytesConfig``: LLM.int8() or NF4 with bf16 compute) and keep the
LoRA adapter unmerged on top; a candidate rewrites the adapter's factors
(:class:`~esrepro.essa.svd.AdapterApplier`). bitsandbytes runs on CUDA only, so the
quantised precisions are refused on any other device before anything is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from esrepro.backends.hf import HFBackend

PRECISIONS = ("native", "int8", "int4")
QUANTISED = ("int8", "int4")


def check_precision(precision: str, device: str) -> None:
    """Refuse a precision the device cannot run, naming the setting (a one-line ValueError)."""
    if precision not in PRECISIONS:
        raise ValueError(f"ESSA setting precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision in QUANTISED and not str(device).startswith("cuda"):
        raise ValueError(f"ESSA setting precision: {precision} needs a CUDA GPU (bitsandbytes INT8/INT4 inference); "
                         f"this job runs on {device}: use precision: native")


def quantization_config(precision: str, dtype: str) -> Any:
    """The transformers ``BitsAndBytesConfig`` of ``int8`` (LLM.int8()) or ``int4`` (NF4, compute in ``dtype``)."""
    from transformers import BitsAndBytesConfig

    from esrepro.models.loading import DTYPES

    if precision == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    if precision == "int4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_compute_dtype=DTYPES[dtype], bnb_4bit_use_double_quant=False)
    raise ValueError(f"no quantisation for precision {precision!r}")


def load_quantised_with_adapter(model_dir: str | Path, adapter_dir: str | Path, precision: str, dtype: str,
                                device: str) -> torch.nn.Module:
    """The base quantised by bitsandbytes with the LoRA adapter unmerged on top (peft), gradients off."""
    check_precision(precision, device)
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"ESSA setting precision: {precision} needs bitsandbytes (pip install 'esrepro[quant]')") \
            from exc
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from esrepro.models.loading import DTYPES

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype], device_map={"": device},
                                                quantization_config=quantization_config(precision, dtype))
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    model.eval()
    model.requires_grad_(False)
    return model


class ESSAEngine(HFBackend):
    """The SFT model of an ESSA run: ``apply(x)`` / ``generate`` / ``restore()``, a checksum, and saving a candidate."""

    def __init__(self, base_dir: str | Path, adapter_dir: str | Path, space_path: str | Path, *,
                 precision: str = "native", **backend: Any) -> None:
        from esrepro.essa.svd import AdapterApplier, CandidateApplier, SingularValueSpace

        check_precision(precision, str(backend.get("device", "cpu")))
        self.base_dir = Path(base_dir)
        self.adapter_dir = Path(adapter_dir)
        self.precision = precision
        self.dtype = str(backend.get("dtype", "float32"))
        super().__init__(base_dir, **backend)
        self.space = SingularValueSpace.load(space_path)
        applier = CandidateApplier if precision == "native" else AdapterApplier
        self.applier = applier(self.model, self.space)

    def _load_model(self, model_dir: str | Path, dtype: str, device: str) -> torch.nn.Module:
        from esrepro.essa.lora import load_merged

        if self.precision == "native":
            return load_merged(model_dir, self.adapter_dir, dtype=dtype, device=device)
        return load_quantised_with_adapter(model_dir, self.adapter_dir, self.precision, dtype, device)

    def apply(self, x: np.ndarray) -> None:
        """Carry candidate x (replacing any earlier one)."""
        self.applier.apply(x)

    def restore(self) -> None:
        """Back to the SFT weights, bit for bit."""
        self.applier.restore()

    def checksum(self) -> str:
        """sha256 of every tensor of the model as it stands (the SFT weights between candidates)."""
        from esrepro.perturb.weights import hf_checksum

        return hf_checksum(list(self.model.state_dict().items()))

    def save_candidate(self, x: np.ndarray, path: str | Path) -> None:
        """Write the model carrying candidate x as a transformers checkpoint into ``path``.

        Native: the exact weights candidates were scored with. Quantised: the candidate's
        adapter merged into the unquantised base in the registry dtype (a quantised
        checkpoint would not load like the others), see :func:`esrepro.essa.export.save_merged_from_base`.
        """
        from esrepro.essa.export import save_merged, save_merged_from_base

        if self.precision == "native":
            save_merged(self.applier, self.tokenizer, x, path)
        else:
            save_merged_from_base(self.space, x, self.adapter_dir, self.base_dir, path, dtype=self.dtype)
