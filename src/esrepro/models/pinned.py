"""A built tiny model shipped with the repository: the warm start's output, pinned by sha256.

Building a tiny model (tokenizer, initialisation, warm-start SFT) is deterministic (docs/provenance.md), so its
output can be shipped once and checked instead of recomputed by every run. A pinned folder holds the model's files
exactly as the build wrote them, plus :data:`BUILT_FROM`: the build settings, the data settings, the sha256 of the
prepared files the warm start stayed disjoint from, and each file's sha256.

- :func:`mismatch` says whether a pin was built from what a job asks for (else the job builds);
- :func:`copy_pinned` copies it into place after checking every file;
- :func:`write_pinned` makes a pin from a model a build just wrote (``esrepro pin-model``);
- :func:`differences` names the files a rebuild changed (``esrepro verify-build``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from esrepro.io import atomic_path, read_json, sha256_file, write_json
from esrepro.provenance.manifest import UNHASHED, IntegrityError, sha256_tree

#: The pin's record of what it was built from; not part of the model (not copied, not hashed).
BUILT_FROM = "built_from.json"


def model_files(folder: str | os.PathLike) -> dict[str, str]:
    """``{relative path: sha256}`` of a model folder's files, its manifest, Snakemake's marker and the pin's record
    left out (the files :func:`esrepro.provenance.manifest.sha256_tree` hashes)."""
    folder = Path(folder)
    skip = {*UNHASHED, BUILT_FROM}
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and not (p.parent == folder and p.name in skip)}


def built_from(build: dict[str, Any], data: dict[str, Any], excluded: dict[str, str]) -> dict[str, Any]:
    """What decides a build's output: its ``build`` block, the warm-start tasks' ``data`` blocks and the sha256 of
    the prepared files it excluded (``{name: sha256}``, names as :func:`excluded_name` gives them)."""
    return {"build": build, "data": data, "excluded": dict(sorted(excluded.items()))}


def excluded_name(path: str | os.PathLike, several_tasks: bool) -> str:
    """The manifest key of an excluded prepared file: ``excluded_<split>``, or ``excluded_<task>_<split>`` when the
    warm start has several tasks (each task's folder has its own train and test files)."""
    path = Path(path)
    return f"excluded_{path.parent.name}_{path.stem}" if several_tasks else f"excluded_{path.stem}"


def _diff(want: Any, have: Any, where: str = "") -> str | None:
    """The first path where two JSON values differ, with both values."""
    if isinstance(want, dict) and isinstance(have, dict):
        for key in sorted(set(want) | set(have)):
            if key not in have or key not in want:
                return f"{where}{key}: {want.get(key, '(absent)')!r} here, {have.get(key, '(absent)')!r} in the pin"
            found = _diff(want[key], have[key], f"{where}{key}.")
            if found:
                return found
        return None
    return None if want == have else f"{where.rstrip('.')}: {want!r} here, {have!r} in the pin"


def read_pin(folder: str | os.PathLike) -> dict[str, Any]:
    """A pin's :data:`BUILT_FROM` record; FileNotFoundError naming the folder when it is not a pin."""
    record = Path(folder) / BUILT_FROM
    if not record.is_file():
        raise FileNotFoundError(f"{folder}: not a pinned model (no {BUILT_FROM}); make one with esrepro pin-model")
    return read_json(record)


def mismatch(folder: str | os.PathLike, wanted: dict[str, Any]) -> str | None:
    """Why the pin in ``folder`` was not built from ``wanted`` (:func:`built_from`), or None when it was."""
    have = read_pin(folder)
    return _diff(wanted, {k: have.get(k) for k in ("build", "data", "excluded")})


def copy_pinned(folder: str | os.PathLike, sha256: str, out: str | os.PathLike) -> str:
    """Copy the pinned model in ``folder`` to ``out`` (atomically), after checking each file against the pin's
    record and the whole against ``sha256`` (the registry's); returns the sha256. Raises
    :class:`~esrepro.provenance.manifest.IntegrityError` naming the file that differs."""
    folder = Path(folder)
    changed = differences(folder, folder)
    if changed:
        raise IntegrityError(f"pinned model {folder}: {', '.join(changed)} differ from {BUILT_FROM}'s sha256 "
                             "(missing, changed or extra); restore the folder from git")
    with atomic_path(out, is_dir=True) as tmp:
        _copy_files(folder, read_pin(folder)["files"], tmp)  # the files just checked, without hashing them again
        got = sha256_tree(tmp)
        if got != sha256:
            raise IntegrityError(f"pinned model {folder}: sha256 {got}, the registry's pinned.sha256 is {sha256}")
    return got


def write_pinned(model_dir: str | os.PathLike, folder: str | os.PathLike, record: dict[str, Any]) -> str:
    """Make ``folder`` a pin of the built model in ``model_dir`` (its files and :data:`BUILT_FROM`: ``record``
    from :func:`built_from` plus each file's sha256); returns the sha256 to write in the registry's
    ``pinned.sha256``."""
    model_dir = Path(model_dir)
    files = model_files(model_dir)
    with atomic_path(folder, is_dir=True) as tmp:
        _copy_files(model_dir, files, tmp)
        digest = sha256_tree(tmp)
        write_json(tmp / BUILT_FROM, {**record, "sha256": digest, "files": files})
    return digest


def _copy_files(source: Path, files: dict[str, str], dest: Path) -> None:
    """Copy ``files`` (relative paths) from ``source`` into ``dest``, keeping their folders."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, dest / rel)


def differences(rebuilt: str | os.PathLike, folder: str | os.PathLike) -> list[str]:
    """Files whose sha256 differ between a model folder (a rebuild, or the pin itself) and the pin in ``folder``'s
    record (missing on either side included), sorted."""
    recorded = read_pin(folder).get("files", {})
    present = model_files(rebuilt)
    return sorted(f for f in set(recorded) | set(present) if recorded.get(f) != present.get(f))
