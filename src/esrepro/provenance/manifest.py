"""Run manifests: what a result was computed from (inputs' hashes, settings, code, host)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from esrepro.io import sha256_file

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
    return tree_digest(file_digests(path))


def file_digests(path: str | os.PathLike) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under directory ``path`` (symbolic links followed: a link's
    digest is its target's bytes), its own :data:`UNHASHED` files left out, sorted by path."""
    path = Path(path)
    skip = {path / name for name in UNHASHED}
    files = sorted(p for p in path.rglob("*") if p.is_file() and p not in skip)
    # hashlib releases the GIL on large reads: a sharded checkpoint's files hash in parallel
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(files)))) as pool:
        return {f.relative_to(path).as_posix(): digest
                for f, digest in zip(files, pool.map(sha256_file, files), strict=True)}


def tree_digest(files: dict[str, str]) -> str:
    """A directory's sha256 (:func:`sha256_tree`) from its files' digests (``{relative path: sha256}``), in path
    order (component by component, as paths sort)."""
    h = hashlib.sha256()
    for rel in sorted(files, key=lambda r: PurePosixPath(r).parts):
        h.update(f"{rel}\0{files[rel]}\n".encode())
    return h.hexdigest()


def code_version(repo: str | os.PathLike | None = None) -> dict[str, Any]:
    """The git commit of the code and whether the work tree had uncommitted changes."""
    from esrepro.provenance import REPO

    repo = Path(repo) if repo else REPO
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


def _numerics() -> dict[str, Any]:
    """The CPU numerics in effect (esrepro.runtime.numerics): mode, variables, the kernels torch chose."""
    from esrepro.runtime.numerics import record

    return record()


def now() -> str:
    """Current UTC time, ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class IntegrityError(ValueError):
    """An input's bytes differ from what the step that produced it recorded."""


def _producer(path: Path) -> tuple[dict[str, Any], str, dict[str, Any]] | None:
    """The output record the step which produced ``path`` wrote for it, its manifest's path and the manifest."""
    candidates = ([path / MANIFEST] if path.is_dir() else []) + [path.parent / MANIFEST]
    for manifest in candidates:
        if not manifest.is_file() or manifest.resolve() == path.resolve():
            continue
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            continue
        for rec in (data.get("outputs") or {}).values():
            if isinstance(rec, dict) and rec.get("sha256") and Path(rec.get("path", "")).resolve() == path.resolve():
                return rec, str(manifest), data
    return None


def producer_record(path: str | os.PathLike) -> tuple[str, str] | None:
    """(sha256, manifest) that the step which produced ``path`` recorded for it, if any.

    The producer's manifest is ``path/manifest.json`` (a model directory) or the one beside
    ``path`` (a run's checkpoint, a prepared split).
    """
    found = _producer(Path(path))
    return None if found is None else (found[0]["sha256"], found[1])


def file_changes(now: dict[str, str], recorded: dict[str, str]) -> list[str]:
    """Each file whose digest differs between ``recorded`` and ``now`` (``{relative path: sha256}``), in words."""
    out = []
    for rel in sorted(set(now) | set(recorded), key=lambda r: PurePosixPath(r).parts):
        if rel not in now:
            out.append(f"{rel} is missing (recorded sha256 {recorded[rel]})")
        elif rel not in recorded:
            out.append(f"{rel} is new (sha256 {now[rel]})")
        elif now[rel] != recorded[rel]:
            out.append(f"{rel} changed (sha256 {now[rel]}, recorded {recorded[rel]})")
    return out


def _mismatch(path: Path, got: str, digests: dict[str, str] | None, rec: dict[str, Any], manifest: str,
              data: dict[str, Any]) -> str:
    """Why ``path`` is not what its producer recorded: the files that differ where the record lists them (a model
    folder's, :mod:`esrepro.models.local`: named in the folder it links to, with the registry entry)."""
    recorded = rec.get("files")
    if not isinstance(recorded, dict) or digests is None:
        return f"{path}: sha256 {got} does not match {rec['sha256']} recorded in {manifest}"
    changes = file_changes(digests, recorded)
    source = rec.get("source")
    model = (data.get("settings") or {}).get("model")
    if source and model:
        return (f"model {model!r}: the folder {source} (its registry path) changed since {path} was made from it "
                f"({manifest}): " + "; ".join(f"{Path(source) / c}" for c in changes) + ". Restore it; or, if the "
                f"change is meant, rerun the job that made {path} and every job that read it (snakemake --forcerun "
                f"{path}), which records the folder as it is now")
    return f"{path}: sha256 {got} does not match {rec['sha256']} recorded in {manifest}: " + "; ".join(changes)


def input_record(path: str | os.PathLike) -> dict[str, str]:
    """How a step records one input: its sha256 now, checked against its producer's record.

    Every byte is hashed (a kept modification time cannot hide a change): the cost is one
    read of each input per job, a small fraction of loading and using it. Raises
    :class:`IntegrityError` naming the file, both hashes and the producer's manifest when
    they differ (each file that differs, where the record lists its files' digests), and
    FileNotFoundError when ``path`` is missing.
    """
    path = Path(path)
    digests = file_digests(path) if path.is_dir() else None
    got = tree_digest(digests) if digests is not None else sha256_tree(path)
    found = _producer(path)
    if found is None:
        return {"path": str(path), "sha256": got}
    rec, manifest, data = found
    if rec["sha256"] != got:
        raise IntegrityError(_mismatch(path, got, digests, rec, manifest, data))
    return {"path": str(path), "sha256": got, "verified_against": manifest}


def verify_inputs(inputs: dict[str, str | os.PathLike]) -> dict[str, dict[str, str]]:
    """:func:`input_record` of each input, before a step reads them (pass the result to :func:`build_manifest`)."""
    return {k: input_record(v) for k, v in inputs.items()}


def build_manifest(
    kind: str,
    inputs: dict[str, str | os.PathLike | dict],
    settings: dict[str, Any],
    started: str,
    outputs: dict[str, str | os.PathLike] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A manifest for one step: inputs and outputs with sha256, settings, code, packages, host, times.

    An input given as a dict is a record :func:`verify_inputs` already made; a path is
    verified now.
    """
    return {
        "kind": kind,
        "inputs": {k: v if isinstance(v, dict) else input_record(v) for k, v in inputs.items()},
        "outputs": {k: {"path": str(v), "sha256": sha256_tree(v)} for k, v in (outputs or {}).items()},
        "settings": settings,
        "code": code_version(),
        "packages": package_versions(),
        "host": host_info(),
        "numerics": _numerics(),
        "started": started,
        "ended": now(),
        **(extra or {}),
    }
