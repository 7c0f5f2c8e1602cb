"""The pipeline's steps: each reads its inputs, calls the library, writes its outputs and a manifest.

Every ``esrepro`` verb (and so every Snakemake rule) is one function here; the library
modules they call know nothing of files, manifests or the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esrepro.io import write_json


def set_threads(n: int) -> None:
    """Use the job's ``n`` CPU threads in torch, shared by its training processes on this node (a distributed
    launcher's ``LOCAL_WORLD_SIZE``; all of them for one process), and deterministic kernels where torch has them."""
    import torch

    from esrepro.runtime.distributed import world

    torch.set_num_threads(max(1, int(n) // world().local_world_size))
    torch.use_deterministic_algorithms(True, warn_only=True)


def load_examples(task: Any, data_dir: str | Path, split: str, limit: int | None, field: str = "") -> list[dict]:
    """The first ``limit`` examples of a prepared split (all when None).

    With ``field`` (the setting that asked for ``limit`` examples) a split holding fewer is an
    error naming it, not a silent shortfall.
    """
    examples = task.load(split, data_dir)
    if limit and field and len(examples) < limit:
        raise ValueError(f"{field}: {limit} examples asked for, but {Path(data_dir) / f'{split}.jsonl'} holds "
                         f"{len(examples)}")
    return examples[:limit] if limit else examples


def report_manifest(kind: str, stem: str | Path, exts: tuple[str, ...], started: str, inputs: dict,
                    settings: dict) -> None:
    """``{stem}.manifest.json`` beside a table's or figure's files: what they were made from."""
    from esrepro.provenance.manifest import build_manifest

    stem = str(stem)
    outputs = {f"{Path(stem).name}{e}": f"{stem}{e}" for e in exts}
    write_json(f"{stem}.manifest.json", build_manifest(kind, inputs, settings, started, outputs=outputs))


def registry_entries(registry: str | Path) -> dict[str, dict]:
    """Every registry entry as plain JSON data (display names and the like for tables and figures)."""
    from esrepro.config import load_registry

    return {k: v.model_dump(mode="json") for k, v in load_registry(registry).items()}


def kl_inputs(kl: list[str]) -> dict[str, str]:
    """A figure's inputs when it reads the sampled responses beside each kl.json: both files of every run."""
    return {p: p for p in [*kl, *(str(Path(k).with_name("samples.jsonl")) for k in kl)]}
