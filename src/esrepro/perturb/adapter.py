"""A member's low-rank noise as a peft LoRA adapter: what an engine serving adapters scores for the member.

Member ``seed`` changes every target matrix W (m x n) into W + sigma A Bᵀ / √r (:mod:`esrepro.perturb.lowrank`).
In peft's layout a LoRA module adds ``scaling * lora_B @ lora_A`` with ``lora_A`` (r x in_features) and
``lora_B`` (out_features x r), and with ``use_rslora`` its scaling is ``lora_alpha / √r``. So the member's
adapter holds ``lora_A = Bᵀ``, ``lora_B = A`` (float32, the factors as drawn) and ``lora_alpha = sigma``: sigma
and 1/√r are folded into the scaling, and the adapter's update is the member's perturbation to float rounding.

The factors are drawn on a device, by that device's generator, and the same seed draws other numbers on another
device (CUDA's ``randn`` is not the CPU's). So an adapter is drawn on the device of the weights whose update
regenerates the factors (:func:`esrepro.backends.vllm_layout.lowrank_update_shards_`): the vLLM engine has each
member's adapter written by its workers (:meth:`esrepro.backends.vllm_engine.ESWorkerExtension.
es_write_member_adapter`), on the device their weights live on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import save_file

from esrepro.io import atomic_path, write_json
from esrepro.perturb.lowrank import factors
from esrepro.perturb.noise import NoiseVariant

#: peft's prefix on adapter keys (``base_model.model.<module>.lora_A.weight``).
PEFT_PREFIX = "base_model.model."
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"

#: One target matrix: its HF parameter name (``<module>.weight``), index (the noise key) and shape (m, n).
Target = tuple[str, int, tuple[int, ...]]


def adapter_config(targets: Sequence[Target], sigma: float, rank: int, base: str = "") -> dict:
    """The peft ``adapter_config.json`` of a member: rank r, ``lora_alpha`` sigma with rsLoRA scaling (sigma / √r)."""
    modules = sorted({name.removesuffix(".weight").rsplit(".", 1)[-1] for name, _, _ in targets})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": int(rank),
            "lora_alpha": float(sigma), "use_rslora": True, "lora_dropout": 0.0, "bias": "none",
            "target_modules": modules, "fan_in_fan_out": False, "use_dora": False, "inference_mode": True}


def adapter_tensors(targets: Sequence[Target], seed: int, rank: int, variant: NoiseVariant,
                    device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The member's factors under peft's names: ``lora_A`` = Bᵀ (r x n), ``lora_B`` = A (m x r), float32 on the
    CPU, drawn on ``device`` by its generator (:func:`esrepro.perturb.lowrank.factors`)."""
    out: dict[str, torch.Tensor] = {}
    gen = torch.Generator(device=device)
    for name, index, shape in targets:
        A, B = factors(shape, device, seed, index, rank, variant, gen)
        module = PEFT_PREFIX + name.removesuffix(".weight")
        out[f"{module}.lora_A.weight"] = B.T.contiguous().cpu()
        out[f"{module}.lora_B.weight"] = A.contiguous().cpu()
    return out


def write_member_adapter(out_dir: str | Path, targets: Sequence[Target], seed: int, sigma: float, rank: int,
                         variant: NoiseVariant, base: str = "", device: torch.device | str = "cpu") -> Path:
    """Write member ``seed``'s adapter (config and safetensors) into ``out_dir``, atomically; the folder. The
    factors are drawn on ``device`` (that of the weights the update regenerates them on)."""
    tensors = adapter_tensors(targets, seed, rank, variant, device)
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        write_json(tmp / ADAPTER_CONFIG, adapter_config(targets, sigma, rank, base))
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return Path(out_dir)
