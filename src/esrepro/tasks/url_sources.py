"""Task data from files at pinned URLs: a ``kind: url`` source, every file verified before it is used.

Keys:

* ``url``: a template with ``{revision}`` and ``{path}``, e.g. a GitHub repository's Git LFS
  files ``https://media.githubusercontent.com/media/<owner>/<repo>/{revision}/{path}``
  (any urllib scheme, ``file://`` included);
* ``revision``: the commit, 40 hex digits (a branch name is refused: the data must not move);
* ``files``: ``{split: {path, sha256}}``; every file needs its sha256: there is no unverified
  download;
* ``raw_dir``: downloads land at ``raw_dir/<task>/<revision>/<path>``.

A download is hashed before it is moved into place (:func:`esrepro.data.fetch.fetch_url`), so a
wrong, truncated or changed file (or a Git LFS pointer in place of the content) never lands under
``raw_dir``; a copy already there is verified again before it is read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from esrepro.data.fetch import fetch_url

_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def url_files(task: str, source: dict) -> dict[str, dict[str, str]]:
    """Each split's ``{"path", "url", "sha256"}`` of a url source; ValueError naming the key at fault."""
    template, revision, files = source.get("url"), source.get("revision"), source.get("files")
    if not isinstance(template, str) or "{path}" not in template or "{revision}" not in template:
        raise ValueError(f"{task}: url source key 'url' must be a template with {{revision}} and {{path}}, "
                         f"got {template!r}")
    if not isinstance(revision, str) or not _COMMIT.fullmatch(revision):
        raise ValueError(f"{task}: url source key 'revision' must be a commit (40 hex digits), got {revision!r}")
    if not isinstance(files, dict) or not files:
        raise ValueError(f"{task}: url source key 'files' must map each split to {{path, sha256}}, got {files!r}")
    out = {}
    for split, entry in files.items():
        if not isinstance(entry, dict) or not entry.get("path"):
            raise ValueError(f"{task}: url source files.{split} needs 'path'")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha.lower()):
            raise ValueError(f"{task}: url source files.{split}.sha256 is required (64 hex digits; got {sha!r}): "
                             f"{entry['path']} is verified before it is used, never fetched unverified")
        path = str(entry["path"])
        out[split] = {"path": path, "url": template.format(revision=revision, path=path), "sha256": sha.lower()}
    if "raw_dir" not in source:
        raise ValueError(f"{task}: url source needs 'raw_dir'")
    return out


def fetch_urls(task: str, source: dict) -> tuple[dict[str, Path], dict[str, Any]]:
    """Fetch and verify every file of a url source; the local file per split and the provenance record
    (``kind``, ``url``, ``revision``, ``files``: ``{split: {"path", "url", "sha256", "verified"}}``)."""
    files = url_files(task, source)
    local, records = {}, {}
    for split, f in files.items():
        dest = Path(source["raw_dir"]) / task / source["revision"] / f["path"]
        local[split] = fetch_url(f["url"], dest, f["sha256"])
        records[split] = {**f, "verified": True}
    return local, {"kind": "url", "url": source["url"], "revision": source["revision"], "files": records}


def url_origin(source: dict) -> str:
    """The ``source`` field of rows read from a url source: the template at its revision, without a path."""
    return "url:" + str(source["url"]).format(revision=source["revision"], path="")
