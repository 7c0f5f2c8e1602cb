"""The mirror's layout on disk and its ``index.json``.

::

    ROOT/index.json                      what the mirror holds (below)
    ROOT/models/<org>/<name>/...         a model repository's files at its one commit
    ROOT/datasets/<org>/<name>/...       a dataset repository's files
    ROOT/urls/<host>/<path>              a plain URL's file (https://host/path)
    ROOT/sources.yaml                    config fragment: the stand-ins' own sha256 pins

``index.json``: ``{"repos": {"<model|dataset>:<repo_id>": record}, "urls": {url: record}}``. A repository
record holds ``type``, ``id``, ``commit`` (40 hex: the configured revision when it is a commit, else derived from
the files), ``branches`` (names resolving to it), ``gated``, ``origin`` (replica, copy or stand-in),
``built_from`` and ``files`` (``{path: {size, sha256, oid, lfs}}``; ``oid`` is the git blob id the hub lists).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from esrepro.io import sha256_file, write_json

INDEX = "index.json"
SOURCES = "sources.yaml"
PINS = "pins.yaml"  # the same pins without `extends`, layered after a run's own config
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: Files the hub keeps in Git LFS (listed with an ``lfs`` block, served with X-Linked-Etag).
LFS_SUFFIXES = (".safetensors", ".pth", ".bin", ".parquet", ".arrow", ".pt")


def repo_dir(root: Path, kind: str, repo_id: str) -> Path:
    """Where repository ``repo_id`` of ``kind`` (model or dataset) lives under ``root``."""
    return Path(root) / f"{kind}s" / repo_id


def url_path(root: Path, url: str) -> Path:
    """Where the file of ``https://host/path`` lives under ``root``."""
    host, _, path = url.split("://", 1)[1].partition("/")
    return Path(root) / "urls" / host / path


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def file_record(path: Path, rel: str) -> dict[str, Any]:
    """A file's size, sha256, git blob id (of its LFS pointer for an LFS file) and whether it is in LFS."""
    size, digest = path.stat().st_size, sha256_file(path)
    lfs = rel.endswith(LFS_SUFFIXES)
    oid = _git_oid(_lfs_pointer(digest, size) if lfs else path.read_bytes())
    return {"size": size, "sha256": digest, "oid": oid, "lfs": lfs}


def repo_record(root: Path, kind: str, repo_id: str, revision: str | None, *, gated: bool = False,
                origin: str, built_from: str = "") -> dict[str, Any]:
    """The index record of the repository already written under ``root``: its files and its one commit."""
    base = repo_dir(root, kind, repo_id)
    files = {p.relative_to(base).as_posix(): file_record(p, p.relative_to(base).as_posix())
             for p in sorted(base.rglob("*")) if p.is_file()}
    if revision and _COMMIT.fullmatch(revision):
        commit = revision
    else:
        listing = json.dumps({k: v["sha256"] for k, v in files.items()}, sort_keys=True)
        commit = hashlib.sha1(f"{kind}:{repo_id}\n{listing}".encode()).hexdigest()
    branches = ["main"] if not revision or revision == commit else sorted({"main", revision})
    return {"type": kind, "id": repo_id, "commit": commit, "branches": branches, "gated": gated,
            "origin": origin, "built_from": built_from, "files": files}


def read_index(root: Path) -> dict[str, Any]:
    """``root/index.json`` (FileNotFoundError naming the mirror when it is not built)."""
    path = Path(root) / INDEX
    if not path.exists():
        raise FileNotFoundError(f"no mirror at {root} (missing {INDEX}; build it with `esrepro mirror-build`)")
    return json.loads(path.read_text(encoding="utf-8"))


def write_index(root: Path, index: dict[str, Any]) -> None:
    write_json(Path(root) / INDEX, index)


def repo_key(kind: str, repo_id: str) -> str:
    return f"{kind}:{repo_id}"
