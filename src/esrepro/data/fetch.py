"""Downloading with pinned revisions and checksums.

Every remote file the pipeline uses is named by (url or hub repo, revision, sha256).
A download is verified before it is moved into place, so a wrong or truncated file
never lands under ``data/raw``.
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from pathlib import Path

from esrepro.io import atomic_path, sha256_file


class ChecksumError(RuntimeError):
    """A file's sha256 differs from the pinned one."""


def verify_sha256(path: str | os.PathLike, expected: str, what: str = "") -> None:
    """Raise ChecksumError naming ``what`` (or the path) when the hash differs."""
    got = sha256_file(path)
    if got != expected.lower():
        raise ChecksumError(f"{what or path}: sha256 {got} does not match pinned {expected}")


def fetch_url(url: str, dest: str | os.PathLike, sha256: str, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` (any urllib scheme, ``file://`` included) and verify it.

    An existing ``dest`` with the right hash is kept as it is.
    """
    dest = Path(dest)
    if dest.exists():
        verify_sha256(dest, sha256, what=str(dest))
        return dest
    with atomic_path(dest) as tmp:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(resp, out)
        except OSError as exc:
            raise OSError(f"could not fetch {url} for {dest}: {exc}") from exc
        verify_sha256(tmp, sha256, what=url)
    return dest


def fetch_hub_file(
    repo_id: str,
    filename: str,
    revision: str,
    dest: str | os.PathLike,
    sha256: str,
    repo_type: str = "dataset",
) -> Path:
    """Download one file of a Hugging Face hub repository at a pinned revision and verify it."""
    dest = Path(dest)
    if dest.exists():
        verify_sha256(dest, sha256, what=str(dest))
        return dest
    from huggingface_hub import hf_hub_download

    try:
        cached = hf_hub_download(repo_id, filename, revision=revision, repo_type=repo_type)
    except Exception as exc:  # the hub client raises many types; name what was asked for
        raise OSError(f"could not fetch {repo_type} {repo_id}@{revision}:{filename}: {exc}") from exc
    with atomic_path(dest) as tmp:
        shutil.copyfile(cached, tmp)
        verify_sha256(tmp, sha256, what=f"{repo_id}@{revision}:{filename}")
    return dest
