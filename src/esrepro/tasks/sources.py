"""Where task data come from: the shared plumbing of the task preparers.

A task's data are configured as ``data.<task>.source``, a dict whose ``kind`` is

* ``"generated"``: built in and offline; generated and hand-written rows carry
  ``"source": EMBEDDED``;
* ``"local"``: ``path``, a folder saved by ``datasets.save_to_disk`` (one
  ``Dataset`` or a ``DatasetDict`` such as the authors' ``evaluation_suite/math``,
  whose member per split is ``subset``/``subsets`` or the catalogue's default), a
  folder of ``{split}.jsonl``/``.parquet``/``.json`` files, or one such file;
* ``"hub"``: a Hugging Face dataset repository (:func:`fetch_hub`), defaults from
  the catalogue ``data/hub_sources.yaml``;
* ``"url"``: files at a pinned commit, each with its sha256 (:mod:`esrepro.tasks.url_sources`);
* ``"authors"`` (Countdown only): the authors' ``countdown.json``.

Every preparer returns the same shape (:func:`write_prepared`)::

    {"splits": {split: {"n": int, "sha256": str}}, "provenance": {...} or {}}
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Protocol

from esrepro.data.fetch import verify_sha256
from esrepro.io import atomic_path, read_jsonl, sha256_file, write_jsonl
from esrepro.tasks.url_sources import fetch_urls, url_files, url_origin

#: ``source`` of every generated or hand-written row: not the papers' data.
EMBEDDED = "embedded-not-paper-data"
#: The catalogue of hub defaults and local DatasetDict members, a package file.
CATALOGUE_FILE = "data/hub_sources.yaml"
_COMMIT = re.compile(r"[0-9a-f]{40}")
_UNSET = ("", "unverified")

# ------------------------------------------------------------------------------ catalogue


@lru_cache(maxsize=1)
def _catalogue() -> dict[str, Any]:
    import yaml

    text = resources.files("esrepro.tasks").joinpath(CATALOGUE_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def hub_defaults(task: str) -> dict[str, Any]:
    """The catalogue's hub source for ``task`` (repo_id, revision, files, fields); {} if none."""
    return copy.deepcopy(_catalogue()["hub"].get(task, {}))


def local_subsets(task: str) -> dict[str, str]:
    """The catalogue's DatasetDict member per split for a local ``task`` source; {} if none."""
    return dict(_catalogue()["local_subsets"].get(task, {}))


# ------------------------------------------------------------------------------ source keys


def source_kind(task: str, source: dict, known: Iterable[str]) -> str:
    """``source["kind"]``, checked against ``known``."""
    kind = source.get("kind")
    if kind not in known:
        raise ValueError(f"{task} source key 'kind': {kind!r} is not one of {sorted(known)}")
    return kind


def source_count(task: str, source: dict, key: str, default: int | None) -> int | None:
    """``source[key]`` (or ``default``), a non-negative integer or None."""
    value = source.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{task} source key {key!r} must be a non-negative integer, got {value!r}")
    return value


def split_counts(task: str, source: dict, kind: str, generated: dict[str, int]) -> dict[str, int | None]:
    """``n_<split>`` of a source for each split of ``generated``, whose values are the defaults of a generated
    source (other kinds: no default)."""
    return {split: source_count(task, source, f"n_{split}", n if kind == "generated" else None)
            for split, n in generated.items()}


def capped(n: int, cap: int | None) -> int:
    """How many of ``n`` rows remain after ``rows[:cap]``."""
    return n if cap is None else min(n, cap)


def first_field(row: dict, names: Iterable[str], task: str, idx: int) -> Any:
    """The value of the first of ``names`` that ``row`` has (not None)."""
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    raise KeyError(f"{task}: row {idx} has none of the fields {list(names)} (has {sorted(row)})")


def origin(task: str, source: dict) -> str:
    """The ``source`` field of rows read from a local, hub or url source."""
    if source["kind"] == "local":
        return f"local:{source['path']}"
    if source["kind"] == "url":
        return url_origin(source)
    return f"hub:{source.get('repo_id', hub_defaults(task).get('repo_id'))}"


def write_prepared(out_dir: str | Path, splits: dict[str, list[dict]],
                   provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``out_dir/{split}.jsonl`` atomically; the preparers' uniform result."""
    info = {}
    for split, rows in splits.items():
        path = Path(out_dir) / f"{split}.jsonl"
        write_jsonl(path, rows)
        info[split] = {"n": len(rows), "sha256": sha256_file(path)}
    return {"splits": info, "provenance": provenance or {}}


# ------------------------------------------------------------------------------ local


def read_table(path: Path) -> list[dict]:
    """Rows of a ``.jsonl``, ``.parquet`` or ``.json`` (a list of records) file."""
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records")
        return data
    raise ValueError(f"{path}: unsupported file type (use .jsonl, .parquet or .json)")


def load_local_split(task: str, root: Path, split: str, subset: str | None, required: bool) -> list[dict] | None:
    """Rows of one split from a local source; None when absent and not ``required``."""
    if not root.exists():
        raise FileNotFoundError(f"{task}: local source not found: looked at {root}")
    if root.is_file():
        return read_table(root)
    if (root / "dataset_dict.json").exists() or (root / "state.json").exists():
        from datasets import DatasetDict, load_from_disk

        data = load_from_disk(str(root))
        if isinstance(data, DatasetDict):
            name = subset or split
            if name not in data:
                if not required:
                    return None
                raise FileNotFoundError(
                    f"{task}: subset {name!r} not found in the DatasetDict at {root} (has {sorted(data)})")
            data = data[name]
        return data.to_list()
    stems = list(dict.fromkeys(s for s in (subset, split) if s))
    for stem in stems:
        for ext in (".jsonl", ".parquet", ".json"):
            path = root / f"{stem}{ext}"
            if path.exists():
                return read_table(path)
    if not required:
        return None
    raise FileNotFoundError(
        f"{task}: no {' or '.join(stems)} .jsonl/.parquet/.json file and no datasets folder at {root}")


def rows_from_source(task: str, source: dict, splits: Iterable[str], required: Iterable[str],
                     hub: HubClient | None = None) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """Raw rows per split of a ``local``, ``hub`` or ``url`` source, and the provenance record.

    A local source reads each of ``splits`` it has (those in ``required`` must be
    there); a hub or url source reads the splits its ``files`` name.
    """
    splits, required = list(splits), set(required)
    out: dict[str, list[dict]] = {}
    provenance: dict[str, Any] = {}
    if source["kind"] == "local":
        if "path" not in source:
            raise ValueError(f"{task}: local source needs 'path'")
        root = Path(source["path"])
        subsets = {**local_subsets(task), **(source.get("subsets") or {})}
        if "subset" in source:
            subsets = {s: source["subset"] for s in splits}
        for split in splits:
            rows = load_local_split(task, root, split, subsets.get(split), split in required)
            if rows is not None:
                out[split] = rows
    else:
        files, provenance = fetch_urls(task, source) if source["kind"] == "url" else fetch_hub(task, source, hub)
        for split, path in files.items():
            out[split] = read_table(path)
    if not out:
        raise FileNotFoundError(f"{task}: the source has none of the splits {sorted(splits)}")
    return out, provenance


def downloads(source: dict) -> bool:
    """Whether preparing from ``source`` downloads (hub, url, the authors' Countdown file by its url)."""
    kind = source.get("kind")
    return kind in ("hub", "url") or (kind == "authors" and "url" in source and "path" not in source)


def download_files(task: str, source: dict) -> list[Path] | None:
    """Where a downloading ``source``'s files land under its ``raw_dir`` (a copy there is used instead of a
    download); None where that needs the hub (a hub source whose revision is not a commit), [] for a source that
    does not download."""
    if not downloads(source):
        return []
    raw = Path(source.get("raw_dir", ""))
    if source["kind"] == "authors":
        return [raw / "countdown.json"]
    if source["kind"] == "url":
        return [raw / task / source["revision"] / f["path"] for f in url_files(task, source).values()]
    spec = {**hub_defaults(task), **source}
    commit = _given(spec.get("revision"))
    if commit is None or not _COMMIT.fullmatch(commit):
        return None
    return [Path(spec.get("raw_dir", "")) / task / commit / f["path"] for f in (spec.get("files") or {}).values()]


def hub_splits(task: str, source: dict) -> list[str]:
    """The splits a hub source will fetch (the keys of its ``files``)."""
    return list(({**hub_defaults(task), **source}.get("files") or {}))


# ------------------------------------------------------------------------------ hub


class HubClient(Protocol):
    """What :func:`fetch_hub` needs of a dataset hub."""

    def resolve(self, repo: str, revision: str) -> str:
        """The commit (40 hex digits) that branch or tag ``revision`` of ``repo`` points to now."""
        ...

    def download(self, repo: str, path: str, commit: str) -> Path:
        """A local copy of file ``path`` of ``repo`` at ``commit``."""
        ...


class HuggingFaceHub:
    """:class:`HubClient` for Hugging Face dataset repositories (``huggingface_hub``)."""

    def resolve(self, repo: str, revision: str) -> str:
        from huggingface_hub import HfApi

        try:
            return HfApi().dataset_info(repo, revision=revision).sha
        except Exception as exc:  # the hub client raises many types; name what was asked for
            raise OSError(f"could not resolve dataset {repo}@{revision}: {exc}") from exc

    def download(self, repo: str, path: str, commit: str) -> Path:
        from huggingface_hub import hf_hub_download

        try:
            return Path(hf_hub_download(repo, path, revision=commit, repo_type="dataset"))
        except Exception as exc:
            raise OSError(f"could not fetch dataset {repo}@{commit}:{path}: {exc}") from exc


def _given(value: Any) -> str | None:
    """A pin from the config, or None when it is missing, empty or "unverified"."""
    return None if value is None or str(value).lower() in _UNSET else str(value)


def fetch_hub(task: str, source: dict, hub: HubClient | None = None) -> tuple[dict[str, Path], dict[str, Any]]:
    """Fetch the files of a hub source into ``raw_dir/<task>/<commit>/``.

    Keys (defaults from :func:`hub_defaults`): ``repo_id``, ``revision``, ``files``
    (``{split: {"path", "sha256"}}``), ``raw_dir``. A ``revision`` that is not a
    commit (missing, ``"main"``, another branch or a tag) is resolved to the commit
    it points to now, with a one-line warning on stderr that the data are not
    pinned. Each file is downloaded at that commit (an existing copy under
    ``raw_dir`` is reused), hashed, and verified when a ``sha256`` is given.

    Returns the local file per split and the provenance record: ``repo_id``,
    ``requested_revision`` (as configured), ``resolved_commit``, ``pinned`` (the
    revision was a commit) and ``files`` (``{split: {"path", "sha256", "verified"}}``).
    ``hub`` defaults to :class:`HuggingFaceHub`.
    """
    spec = {**hub_defaults(task), **source}
    repo_id, files = spec.get("repo_id"), spec.get("files") or {}
    if not repo_id or not files:
        raise ValueError(f"{task}: hub source needs 'repo_id' and 'files'")
    if "raw_dir" not in spec:
        raise ValueError(f"{task}: hub source needs 'raw_dir'")
    client = hub if hub is not None else HuggingFaceHub()
    requested = _given(spec.get("revision"))
    pinned = requested is not None and _COMMIT.fullmatch(requested) is not None
    if pinned:
        commit = requested
    else:
        branch = requested or "main"
        commit = client.resolve(repo_id, branch)
        if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
            raise OSError(f"{task}: {repo_id}@{branch} resolved to {commit!r}, not a commit")
        print(f"WARNING: {task}: hub dataset {repo_id} branch {branch!r} resolved to commit {commit} at fetch "
              f"time; the data are NOT pinned (set revision: {commit} and each file's sha256 to pin them)",
              file=sys.stderr, flush=True)
    local: dict[str, Path] = {}
    records: dict[str, dict[str, Any]] = {}
    for split, entry in files.items():
        if not isinstance(entry, dict) or not entry.get("path"):
            raise ValueError(f"{task}: hub source files.{split} needs 'path'")
        expected = _given(entry.get("sha256"))
        dest = Path(spec["raw_dir"]) / task / commit / entry["path"]
        digest = _fetch_file(client, repo_id, entry["path"], commit, dest, expected)
        local[split] = dest
        records[split] = {"path": entry["path"], "sha256": digest, "verified": expected is not None}
    provenance = {"kind": "hub", "repo_id": repo_id, "requested_revision": spec.get("revision"),
                  "resolved_commit": commit, "pinned": pinned, "files": records}
    return local, provenance


def _fetch_file(client: HubClient, repo: str, path: str, commit: str, dest: Path, expected: str | None) -> str:
    """Put ``repo@commit:path`` at ``dest`` (verified against ``expected`` if given); its sha256.

    Like :func:`esrepro.fetch.fetch_hub_file`, with the download behind ``client`` and
    the checksum optional (the record keeps the hash either way).
    """
    what = f"{repo}@{commit}:{path}"
    if not dest.exists():
        got = client.download(repo, path, commit)
        with atomic_path(dest) as tmp:
            shutil.copyfile(got, tmp)
            if expected is not None:
                verify_sha256(tmp, expected, what=what)
    elif expected is not None:
        verify_sha256(dest, expected, what=str(dest))
    return sha256_file(dest)
