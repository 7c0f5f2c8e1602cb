"""Run manifests: what a result was computed from (inputs' hashes, settings, code, host)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from esrepro.data.fetch import sha256_file

PACKAGES = ("esrepro", "torch", "transformers", "tokenizers", "safetensors", "numpy", "snakemake", "pandas",
            "trl", "accelerate", "peft", "cmaes", "ray", "vllm")


MANIFEST = "manifest.json"
#: Files a directory's hash leaves out: its own manifest, and the empty marker Snakemake
#: drops into every directory() output after the step that wrote it has finished.
UNHASHED = (MANIFEST, ".snakemake_timestamp")


def sha256_tree(path: str | os.PathLike) -> str:
    """sha256 of a file, or of a directory as the sorted (relative path, file sha256) list.

    A directory's own top-level ``manifest.json`` and ``.snakemake_timestamp`` are left
    out: a step that writes its manifest into its output directory records the hash of
    everything else there, and Snakemake's marker appears only after the step ends.
    """
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    if not path.is_dir():
        raise FileNotFoundError(f"cannot hash {path}: not found")
    h = hashlib.sha256()
    skip = {path / name for name in UNHASHED}
    files = (p for p in path.rglob("*") if p.is_file() and p not in skip)
    for f in sorted(files):
        h.update(f"{f.relative_to(path).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def code_version(repo: str | os.PathLike | None = None) -> dict[str, Any]:
    """The git commit of the code and whether the work tree had uncommitted changes."""
    repo = Path(repo) if repo else Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout
        return {"git_commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"git_commit": None, "dirty": None}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of the packages that shape results."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def host_info() -> dict[str, Any]:
    """Host, CPU threads, accelerator, and the SLURM job id when running under SLURM."""
    import torch

    acc = None
    if torch.cuda.is_available():
        acc = {"cuda": torch.version.cuda, "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "accelerator": acc,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def now() -> str:
    """Current UTC time, ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _newest_mtime(path: Path) -> float:
    """Latest modification time of a file, or of any file in a directory (markers left out)."""
    if path.is_file():
        return path.stat().st_mtime
    times = [f.stat().st_mtime for f in path.rglob("*") if f.is_file() and f.name not in UNHASHED]
    return max(times, default=path.stat().st_mtime)


def _recorded(path: Path) -> tuple[str, str] | None:
    """(sha256, manifest) recorded for ``path`` by the step that produced it, when still trustworthy.

    The producer's manifest is ``path/manifest.json`` (a model directory) or the one beside
    ``path`` (a run's checkpoint, a prepared split). Its record is used only if nothing in
    ``path`` changed after the manifest was written; otherwise the caller hashes afresh.
    """
    candidates = ([path / MANIFEST] if path.is_dir() else []) + [path.parent / MANIFEST]
    for manifest in candidates:
        if not manifest.is_file():
            continue
        try:
            outputs = json.loads(manifest.read_text(encoding="utf-8")).get("outputs") or {}
        except (ValueError, OSError):
            continue
        for rec in outputs.values():
            if Path(rec.get("path", "")).resolve() == path.resolve() and rec.get("sha256"):
                if _newest_mtime(path) <= manifest.stat().st_mtime:
                    return rec["sha256"], str(manifest)
    return None


def input_record(path: str | os.PathLike) -> dict[str, str]:
    """How a step records one input: its sha256, cited from its producer's manifest when that is current.

    Hashing once where a file is produced saves every consumer (each evaluation and KL job
    of a checkpoint) from re-reading it; ``esrepro audit`` still re-hashes everything.
    """
    path = Path(path)
    found = _recorded(path) if path.exists() else None
    if found is not None:
        return {"path": str(path), "sha256": found[0], "cited_from": found[1]}
    return {"path": str(path), "sha256": sha256_tree(path)}


def build_manifest(
    kind: str,
    inputs: dict[str, str | os.PathLike],
    settings: dict[str, Any],
    started: str,
    outputs: dict[str, str | os.PathLike] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A manifest for one step: inputs and outputs with sha256, settings, code, packages, host, times."""
    return {
        "kind": kind,
        "inputs": {k: input_record(v) for k, v in inputs.items()},
        "outputs": {k: {"path": str(v), "sha256": sha256_tree(v)} for k, v in (outputs or {}).items()},
        "settings": settings,
        "code": code_version(),
        "packages": package_versions(),
        "host": host_info(),
        "started": started,
        "ended": now(),
        **(extra or {}),
    }
