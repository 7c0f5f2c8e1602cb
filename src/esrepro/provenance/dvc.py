"""DVC records of the pipeline's data and checkpoints (Snakemake stays the only DAG engine).

DVC tracks whole folders, one ``.dvc`` pointer file each, written beside the folder:

    data/prepared    -> data/prepared.dvc
    results/models   -> results/models.dvc
    results/runs     -> results/runs.dvc
    results/eval     -> results/eval.dvc

The folders stay git-ignored; the pointer files are committed. ``git commit`` + ``dvc push``
publish a state, ``git checkout`` + ``dvc pull`` restore it. DVC is driven through its
command line, its only stable interface.

DVC lives in its own environment (``.venv-dvc`` beside ``.venv``): it needs hydra-core,
which pins antlr4-python3-runtime 4.9.*, and under that runtime math-verify's LaTeX parser
no longer reads answers such as ``17.5%`` (the grader needs 4.13.2). :func:`dvc_command`
finds it: ``$ESREPRO_DVC``, then ``<repository>/.venv-dvc/bin/dvc``, then ``dvc`` importable
here, then ``dvc`` on PATH.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from esrepro.provenance import REPO

#: The folders the pipeline records by default, in the order they are produced.
DEFAULT_PATHS: tuple[str, ...] = ("data/prepared", "results/models", "results/runs", "results/eval")


class DvcError(RuntimeError):
    """A DVC command failed, or the repository is not set up for DVC."""


DVC_VENV = ".venv-dvc"


def dvc_command() -> list[str]:
    """The DVC command line: ``$ESREPRO_DVC``, ``<repo>/.venv-dvc/bin/dvc``, ``python -m dvc``, ``dvc``."""
    if os.environ.get("ESREPRO_DVC"):
        return shlex.split(os.environ["ESREPRO_DVC"])
    venv = REPO / DVC_VENV / "bin" / "dvc"
    if venv.is_file():
        return [str(venv)]
    if importlib.util.find_spec("dvc") is not None:
        return [sys.executable, "-m", "dvc"]
    found = shutil.which("dvc")
    if found:
        return [found]
    raise DvcError(f"DVC not found: create {REPO / DVC_VENV} (python -m venv {DVC_VENV} && "
                   f"{DVC_VENV}/bin/pip install dvc==3.67.1) or set ESREPRO_DVC to a dvc command")


def run_dvc(args: Sequence[str], root: str | os.PathLike = ".", check: bool = True) -> subprocess.CompletedProcess:
    """Run ``dvc ARGS`` in ``root``; raise :class:`DvcError` with DVC's message when it fails."""
    cmd = dvc_command()
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    if cmd[0] != sys.executable:  # another environment's dvc: keep this one's Python paths out
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(var, None)
    proc = subprocess.run([*cmd, *args], cwd=root, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise DvcError(f"dvc {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _git_ignored(path: str, root: Path) -> bool:
    """Whether git ignores ``path`` (relative to ``root``); False outside a git repository."""
    proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=root, capture_output=True)
    return proc.returncode == 0


def _relative(path: str | os.PathLike, root: Path) -> str:
    p = Path(path)
    full = p if p.is_absolute() else root / p
    try:
        rel = full.resolve().relative_to(root.resolve())
    except ValueError as exc:
        raise ValueError(f"{path}: not inside the repository {root}") from exc
    if not rel.parts:
        raise ValueError(f"{path}: refusing to track the repository root with DVC")
    return rel.as_posix()


def record(paths: list[str], root: str | os.PathLike = ".") -> list[str]:
    """``dvc add`` each path (a folder or file under ``root``); return the ``.dvc`` files written.

    Paths that do not exist raise :class:`FileNotFoundError`. A pointer file that git would
    ignore raises :class:`DvcError` naming the ``.gitignore`` line that un-ignores it (DVC
    refuses such files). Re-recording unchanged data only re-stats it (DVC keeps a state
    database), and the workspace files are left as they are (same inode, same mtime), so
    Snakemake sees nothing new.
    """
    root = Path(root)
    if not (root / ".dvc").is_dir():
        raise DvcError(f"{root.resolve()}: no .dvc folder; run `dvc init` (or restore .dvc/config from git)")
    rels = []
    for path in paths:
        rel = _relative(path, root)
        if not (root / rel).exists():
            raise FileNotFoundError(f"cannot record {rel}: not found")
        if _git_ignored(f"{rel}.dvc", root):
            raise DvcError(f"{rel}.dvc would be git-ignored; add `!/{rel}.dvc` to .gitignore")
        rels.append(rel)
    if not rels:
        return []
    run_dvc(["add", "--quiet", *rels], root)
    return [f"{rel}.dvc" for rel in rels]


def read_pointer(dvc_file: str | os.PathLike) -> dict[str, Any]:
    """The ``outs`` entry of a ``.dvc`` file: md5 (``….dir`` for folders), size, nfiles."""
    with open(dvc_file, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    outs = doc.get("outs") or [{}]
    return dict(outs[0])


def push_pointers(dvc_files: list[str], root: str | os.PathLike = ".", remote: str | None = None) -> None:
    """``dvc push`` the data of ``dvc_files`` to ``remote`` (the default remote when None)."""
    run_dvc(["push", "--quiet", *(["--remote", remote] if remote else []), *dvc_files], root)
