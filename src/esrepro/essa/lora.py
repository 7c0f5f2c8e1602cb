"""ESSA's first stage: LoRA supervised fine-tuning on the attention projections, and
reading a saved adapter back as per-module factors (A, B, scaling).

The adapted modules are read off the model (:func:`lora_target_modules`, through
:mod:`esrepro.models.architecture`): by default the linear layers of its decoder blocks' attention (ESSA's
LoRA on the attention projections: q, k, v and o in Qwen2 and Llama, Phi-3's fused ``qkv_proj`` and ``o_proj``),
or every linear of the blocks, or the modules a list names (the ESSA setting ``lora_targets``).

Training goes through TRL's ``SFTTrainer`` with a peft ``LoraConfig``: it is the
maintained tool for this stage at the papers' scale, and on CPU it is deterministic
for a seed (same losses and bit-identical adapter weights, checked by the tests) and
fast enough for the tiny default (about 1.5 s for a few hundred pairs, plus about 4 s
of imports). The loss is on completion tokens only (TRL's ``completion_only_loss`` on
a prompt/completion dataset); TRL appends the EOS token to every completion.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from esrepro.io import atomic_path, read_json, reading, write_json, write_jsonl
from esrepro.models.architecture import ArchitectureError, decoder_linears
from esrepro.models.loading import save_adapter
from esrepro.runtime import numerics
from esrepro.settings.methods import DEFAULT_LORA_TARGETS

#: What ESSA adapts (the setting ``lora_targets``): the decoder blocks' attention linears, all their linears, or
#: the linear modules of the blocks a list names (by their own names, as peft's ``target_modules`` takes them).
LoraTargets = Literal["attention", "all"] | Sequence[str]
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
SUMMARY = "sft_summary.json"
LOG = "sft_log.jsonl"
#: Keys of TRL's log rows that hold wall time or throughput: left out of the log kept beside the adapter, which
#: is part of its recorded sha256 (the adapter of one seed is then the same bytes on every run).
WALL_TIME = re.compile(r"runtime|per_second|preparation_time")
#: peft's prefix on adapter keys: ``base_model.model.<module>.lora_A.weight``.
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraFactors:
    """One adapted linear module: its update is ``scaling * B @ A``.

    ``A`` is (rank, in_features), ``B`` is (out_features, rank), as peft stores them.
    """

    A: torch.Tensor
    B: torch.Tensor
    scaling: float

    @property
    def rank(self) -> int:
        return int(self.A.shape[0])


def lora_target_modules(model: torch.nn.Module, targets: LoraTargets = DEFAULT_LORA_TARGETS) -> list[str]:
    """The module names peft's ``target_modules`` takes for ``targets`` on ``model``: the distinct own names of
    the linear layers :func:`esrepro.models.architecture.decoder_linears` finds in its decoder blocks, in module
    order (Qwen2's attention: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``; Phi-3's: ``o_proj``, ``qkv_proj``).

    A list must name linear layers of the decoder blocks, each of its names; ValueError naming the ESSA setting
    ``lora_targets`` otherwise (and where the model has no such layers at all).
    """
    def own_names(scope: Any) -> list[str]:
        try:
            return list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in decoder_linears(model, scope)))
        except ArchitectureError as exc:
            raise ValueError(f"ESSA setting lora_targets: {exc}") from exc

    if isinstance(targets, str):
        if targets not in ("attention", "all"):
            raise ValueError(f"ESSA setting lora_targets: {targets!r} is neither attention nor all (a list names "
                             "modules: [q_proj, v_proj])")
        return own_names(targets)
    wanted = list(targets)
    if not wanted or not all(isinstance(n, str) and n for n in wanted):
        raise ValueError(f"ESSA setting lora_targets: {wanted!r}: expected a non-empty list of module names")
    known = own_names("all")
    missing = [n for n in wanted if n not in known]
    if missing:
        raise ValueError(f"ESSA setting lora_targets: no linear layer of {type(model).__name__}'s decoder blocks is "
                         f"named {', '.join(missing)} (theirs: {', '.join(known)})")
    return [n for n in known if n in wanted]


def _lora_config(rank: int, alpha: float, targets: Sequence[str]):
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=list(targets),
        bias="none",
        task_type="CAUSAL_LM",
    )


def sft_lora(
    model_dir: str | Path,
    pairs: Sequence[tuple[str, str]],
    *,
    rank: int,
    alpha: float,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    out_dir: str | Path,
    max_length: int | None = None,
    targets: LoraTargets = DEFAULT_LORA_TARGETS,
    dtype: str = "float32",
) -> dict:
    """LoRA-SFT the model in ``model_dir`` on (prompt, completion) pairs; write the adapter to ``out_dir``.

    ``targets`` (the ESSA setting ``lora_targets``) chooses the adapted linear layers, read off the loaded model
    (:func:`lora_target_modules`; refused before any training when they name no linear layer of it).

    ``batch_size`` is the total per optimiser step: under a distributed launcher (one process per GPU,
    :mod:`esrepro.runtime.distributed`) each process takes its share, and only the main process writes ``out_dir``.
    The base is loaded in ``dtype`` (the registry's on a GPU, float32 on CPU); the LoRA matrices are float32
    whatever the base (peft's ``autocast_adapter_dtype``), and a bfloat16/float16 base on CUDA trains under
    the matching autocast.

    ``out_dir`` (written atomically) holds the adapter in peft format
    (``adapter_config.json`` whose ``base_model_name_or_path`` is ``model_dir``, and
    ``adapter_model.safetensors``), ``sft_log.jsonl`` (TRL's per-step log) and
    ``sft_summary.json`` (the settings, the base model's path and sha256, and the
    completion-only loss on ``pairs`` before and after training). Returns the summary.
    The learning rate decays linearly to zero (TRL's default schedule), without warm-up.
    """
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from esrepro.models.loading import load_model, load_tokenizer
    from esrepro.provenance.manifest import sha256_tree
    from esrepro.runtime.distributed import split_batch, world

    model_dir = Path(model_dir)
    if not pairs:
        raise ValueError("sft_lora: no (prompt, completion) pairs to train on")
    if rank < 1:
        raise ValueError(f"sft_lora: rank must be >= 1, got {rank}")
    on_gpu = torch.cuda.is_available()
    if not on_gpu and dtype != "float32":
        raise ValueError(f"sft_lora: dtype {dtype} on CPU; the CPU SFT trains a float32 base")
    place = world()
    per_process = split_batch(batch_size, place.world_size, "sft_prompts_per_step")
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, dtype=dtype)
    modules = lora_target_modules(model, targets)
    if max_length is None:
        max_length = int(model.config.max_position_embeddings)
    too_long = sum(len(tokenizer(p + c)["input_ids"]) >= max_length for p, c in pairs)
    if too_long:
        raise ValueError(f"sft_lora: {too_long} of {len(pairs)} (prompt, completion) pairs reach max_length "
                         f"{max_length} tokens (the model's context in {model_dir}), so their completions would "
                         "be cut: use a model with a longer context or shorter prompts")
    dataset = Dataset.from_list([{"prompt": p, "completion": c} for p, c in pairs])
    with tempfile.TemporaryDirectory(prefix="essa_sft_") as scratch:
        args = SFTConfig(
            output_dir=scratch,
            per_device_train_batch_size=per_process,
            per_device_eval_batch_size=per_process,
            num_train_epochs=epochs,
            learning_rate=learning_rate,
            lr_scheduler_type="linear",
            warmup_steps=0,
            weight_decay=0.0,
            optim=numerics.TRAINER_OPTIM,
            seed=seed,
            data_seed=seed,
            max_length=max_length,
            completion_only_loss=True,
            packing=False,
            use_cpu=not on_gpu,
            bf16=on_gpu and dtype == "bfloat16",
            fp16=on_gpu and dtype == "float16",
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            eval_dataset=dataset,
            processing_class=tokenizer,
            peft_config=_lora_config(rank, alpha, modules),
        )
        trainer.remove_callback(PrinterCallback)
        if trainer.args.n_gpu > 1:  # transformers' nn.DataParallel: n_gpu times the batch on one process
            raise RuntimeError(f"sft_lora: one process sees {trainer.args.n_gpu} GPUs, so the trainer would wrap the "
                               "model in nn.DataParallel and multiply the batch: run one process per GPU "
                               "(esrepro.essa.sft_launch, $ESREPRO_TRAIN_PROCESSES) or restrict CUDA_VISIBLE_DEVICES")
        loss_before = float(trainer.evaluate()["eval_loss"])
        result = trainer.train()
        loss_after = float(trainer.evaluate()["eval_loss"])
        log = [dict(h) for h in trainer.state.log_history]
        if not place.is_main:
            return {}
        summary = {
            "base_model": {"path": str(model_dir), "sha256": sha256_tree(model_dir)},
            "rank": rank,
            "lora_alpha": alpha,
            "scaling": alpha / rank,
            "target_modules": modules,
            "epochs": epochs,
            "learning_rate": learning_rate,
            "batch_size": batch_size,
            "seed": seed,
            "max_length": max_length,
            "pairs": len(pairs),
            "steps": int(result.global_step),
            "train_loss": float(result.training_loss),
            "loss_before": loss_before,
            "loss_after": loss_after,
            "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            **batch_record(trainer),
        }
        with atomic_path(out_dir, is_dir=True) as tmp:
            save_adapter(trainer.model, tmp, base_model=model_dir)
            write_jsonl(tmp / LOG, [{k: v for k, v in row.items() if not WALL_TIME.search(k)} for row in log])
            write_json(tmp / SUMMARY, summary)
    return summary


def batch_record(trainer) -> dict:
    """The batch the trainer actually used, read from its state and arguments: processes, examples per process
    per step (``state.train_batch_size``, DataParallel's multiple included), the total per optimiser step, the
    base's dtype and the LoRA matrices' dtypes."""
    args = trainer.args
    per_process = int(trainer.state.train_batch_size)
    lora = sorted({str(p.dtype).removeprefix("torch.") for p in trainer.model.parameters() if p.requires_grad})
    frozen = sorted({str(p.dtype).removeprefix("torch.") for p in trainer.model.parameters() if not p.requires_grad})
    return {
        "world_size": int(args.world_size),
        "per_process_batch_size": per_process,
        "gradient_accumulation_steps": int(args.gradient_accumulation_steps),
        "total_batch_size": per_process * int(args.gradient_accumulation_steps) * int(args.world_size),
        "base_dtypes": frozen,
        "lora_dtypes": lora,
        "autocast": "bf16" if args.bf16 else "fp16" if args.fp16 else None,
    }


def _weight_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a (possibly sharded) safetensors checkpoint, without loading it."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with reading(f), safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                shapes[key] = tuple(fh.get_slice(key).get_shape())
    return shapes


def natural_key(name: str) -> tuple:
    """Sort key that orders ``layers.2`` before ``layers.10``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def load_lora(model_dir: str | Path, adapter_dir: str | Path) -> dict[str, LoraFactors]:
    """The adapter in ``adapter_dir`` as {module name in the base model: LoraFactors}.

    Module names are those of the plain transformers model (e.g. ``model.layers.0.self_attn.q_proj``),
    in natural layer order. Shapes are checked against the base model's weights in
    ``model_dir`` (read from safetensors headers, no weights loaded). Only plain LoRA on
    linear layers is accepted: no DoRA, no per-module rank/alpha patterns, no
    ``fan_in_fan_out``; scaling is ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA).
    """
    model_dir, adapter_dir = Path(model_dir), Path(adapter_dir)
    cfg_file, weights_file = adapter_dir / ADAPTER_CONFIG, adapter_dir / ADAPTER_WEIGHTS
    for f in (cfg_file, weights_file):
        if not f.exists():
            raise FileNotFoundError(f"no LoRA adapter in {adapter_dir} (missing {f.name})")
    cfg = read_json(cfg_file)
    if cfg.get("peft_type") != "LORA":
        raise ValueError(f"{cfg_file}: peft_type is {cfg.get('peft_type')!r}, expected 'LORA'")
    for key in ("use_dora", "fan_in_fan_out"):
        if cfg.get(key):
            raise ValueError(f"{cfg_file}: {key}=true is not supported by ESSA's SVD parametrisation")
    for key in ("rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise ValueError(f"{cfg_file}: per-module {key} is not supported; every adapter must share r and alpha")
    r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    scaling = alpha / r ** 0.5 if cfg.get("use_rslora") else alpha / r

    with reading(weights_file, "the LoRA adapter"):
        tensors = load_file(str(weights_file))
    pattern = re.compile(r"^(?:" + re.escape(PEFT_PREFIX) + r")?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$")
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = pattern.match(key)
        if m is None:
            raise ValueError(f"{weights_file}: unexpected tensor {key!r} (not a lora_A/lora_B weight)")
        found.setdefault(m.group(1), {})[m.group(2)] = t
    shapes = _weight_shapes(model_dir)
    out: dict[str, LoraFactors] = {}
    for name in sorted(found, key=natural_key):
        ab = found[name]
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{weights_file}: module {name!r} has only lora_{''.join(ab)}")
        A, B = ab["A"], ab["B"]
        weight = f"{name}.weight"
        if weight not in shapes:
            raise KeyError(f"adapter module {name!r} has no weight {weight!r} in the base model {model_dir}")
        out_f, in_f = shapes[weight]
        if A.shape != (r, in_f) or B.shape != (out_f, r):
            raise ValueError(
                f"adapter module {name!r}: A {tuple(A.shape)}, B {tuple(B.shape)} do not fit r={r} and the "
                f"base weight {shapes[weight]} in {model_dir}"
            )
        out[name] = LoraFactors(A=A, B=B, scaling=scaling)
    if not out:
        raise ValueError(f"{weights_file}: no LoRA modules found")
    return out


def load_merged(model_dir: str | Path, adapter_dir: str | Path, dtype: str = "float32",
                device: str = "cpu") -> torch.nn.Module:
    """The base model with the adapter merged in by peft (``merge_and_unload``): the SFT
    weights ``W_merged_sft`` on which ESSA candidates are applied in residual form."""
    from peft import PeftModel

    from esrepro.models.loading import load_model

    base = load_model(model_dir, dtype=dtype, device=device)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.eval()
    merged.requires_grad_(False)
    return merged


def copy_adapter_config(src_dir: str | Path, dst_dir: str | Path) -> None:
    """Copy a peft adapter's config (rank, alpha, targets, base model) to another directory."""
    shutil.copy2(Path(src_dir) / ADAPTER_CONFIG, Path(dst_dir) / ADAPTER_CONFIG)
