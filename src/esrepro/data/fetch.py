"""Downloading with pinned revisions and checksums.

Every remote file the pipeline uses is named by (url or hub repo, revision, sha256).
A download is verified before it is moved into place, so a wrong or truncated file
never lands under ``data/raw``.

Offline, plain URLs can come from a local mirror (``esrepro mirror-serve``): with the
environment variable ``ESREPRO_URL_MIRROR`` set to the mirror's base URL, ``fetch_url``
asks for ``https://host/path`` at ``$ESREPRO_URL_MIRROR/urls/host/path`` instead
(:func:`mirrored_url`) and verifies the file against the same sha256. Hub files follow
``HF_ENDPOINT``, which ``huggingface_hub`` reads.
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from pathlib import Path

from esrepro.io import atomic_path, sha256_file

#: Base URL of a mirror that serves ``https://host/path`` at ``<base>/urls/host/path``.
URL_MIRROR_ENV = "ESREPRO_URL_MIRROR"


class ChecksumError(RuntimeError):
    """A file's sha256 differs from the pinned one."""


def verify_sha256(path: str | os.PathLike, expected: str, what: str = "") -> None:
    """Raise ChecksumError naming ``what`` (or the path) when the hash differs."""
    got = sha256_file(path)
    if got != expected.lower():
        raise ChecksumError(f"{what or path}: sha256 {got} does not match pinned {expected}")


def mirrored_url(url: str) -> str:
    """``url`` as the mirror named by ``$ESREPRO_URL_MIRROR`` serves it (``http(s)://host/path`` becomes
    ``<mirror>/urls/host/path``); ``url`` itself when the variable is unset or the scheme is not http(s)."""
    base = os.environ.get(URL_MIRROR_ENV, "").rstrip("/")
    scheme, sep, rest = url.partition("://")
    if not base or not sep or scheme.lower() not in ("http", "https"):
        return url
    return f"{base}/urls/{rest}"


def fetch_url(url: str, dest: str | os.PathLike, sha256: str, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` (any urllib scheme, ``file://`` included) and verify it.

    An existing ``dest`` with the right hash is kept as it is. With ``$ESREPRO_URL_MIRROR`` set, an http(s)
    URL is fetched from that mirror (:func:`mirrored_url`), verified the same way.
    """
    dest = Path(dest)
    if dest.exists():
        verify_sha256(dest, sha256, what=str(dest))
        return dest
    source = mirrored_url(url)
    shown = url if source == url else f"{url} (from the mirror: {source})"
    with atomic_path(dest) as tmp:
        try:
            with urllib.request.urlopen(source, timeout=timeout) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(resp, out)
        except OSError as exc:
            raise OSError(f"could not fetch {shown} for {dest}: {exc}") from exc
        verify_sha256(tmp, sha256, what=shown)
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
