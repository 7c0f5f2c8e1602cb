"""Building the mirror a config needs: replicas of every hub model it names and every remote data file of its
sources (a real copy or a labelled stand-in), with ``index.json`` and ``sources.yaml``.

``sources.yaml`` extends the config and pins each stand-in by its own sha256 (stand-ins cannot match the real
pins); real copies keep the config's pins, so a copy that is not the pinned file still fails as it would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import yaml

from esrepro.config import read_config
from esrepro.io import atomic_path, sha256_file
from esrepro.planning.load import load_pipeline
from esrepro.rehearsal import stand_ins
from esrepro.rehearsal.mirror_layout import PINS, SOURCES, repo_dir, repo_key, repo_record, url_path, write_index
from esrepro.rehearsal.replicas import build_replica
from esrepro.tasks.sources import hub_defaults
from esrepro.tasks.url_sources import url_files


def build_mirror(root: str | Path, config_path: str | Path, shared_data: str | Path | None = None,
                 workdir: str | Path = ".", seed: int = 0) -> dict[str, Any]:
    """Build the mirror of ``config_path`` (paths in it relative to ``workdir``) at ``root`` (replaced
    atomically); ``shared_data`` is the folder holding the authors' files (``countdown.json``, ``datasets/``).
    Returns the index."""
    config = read_config(config_path, workdir)
    pipeline = load_pipeline(config, config_path, workdir)
    shared = Path(shared_data) if shared_data else None
    index: dict[str, Any] = {"config": str(config_path), "config_sha256": sha256_file(config_path),
                             "root": str(Path(root).resolve()), "repos": {}, "urls": {}, "local": {}}
    pins: dict[str, Any] = {}
    with atomic_path(root, is_dir=True) as tmp:
        for name in pipeline.all_models():
            entry = pipeline.registry[name]
            if entry.hub_id:
                _model(tmp, name, entry, seed, index)
        for task, block in (config.get("data") or {}).items():
            source = (block or {}).get("source") or {}
            builder = {"authors": _authors, "url": _url, "hub": _hub, "local": _local}.get(source.get("kind"))
            if builder is not None:
                builder(tmp, task, source, shared, seed, index, pins)
        write_index(tmp, index)
        _write_sources(tmp / SOURCES, str(config_path), pins)
        _write_sources(tmp / PINS, None, pins)
    return index


def _model(root: Path, name: str, entry: Any, seed: int, index: dict) -> None:
    out = repo_dir(root, "model", entry.hub_id)
    summary = build_replica(name, entry, out, seed)
    record = repo_record(root, "model", entry.hub_id, entry.revision, gated=entry.gated,
                         origin="replica", built_from=f"esrepro.rehearsal.replicas (registry key {name}, seed {seed}, "
                         f"{summary['architecture']}, random weights)")
    index["repos"][repo_key("model", entry.hub_id)] = record


def _authors(root: Path, task: str, source: dict, shared: Path | None, seed: int, index: dict, pins: dict) -> None:
    if task != "countdown" or "url" not in source:
        return
    origin, built_from = stand_ins.countdown_file(url_path(root, source["url"]), source["sha256"], shared, seed)
    digest = _add_url(root, source["url"], origin, built_from, index)
    if origin == "stand-in":
        _pin(pins, task, {"sha256": digest})


def _url(root: Path, task: str, source: dict, shared: Path | None, seed: int, index: dict, pins: dict) -> None:
    if task != "prm800k":
        raise ValueError(f"data.{task}: the mirror has no stand-in for a url source of this task")
    files = {}
    for split, f in url_files(task, source).items():
        origin, built_from = stand_ins.prm800k_file(split, url_path(root, f["url"]), seed)
        files[split] = {"sha256": _add_url(root, f["url"], origin, built_from, index)}
    _pin(pins, task, {"files": files})


def _hub(root: Path, task: str, source: dict, shared: Path | None, seed: int, index: dict, pins: dict) -> None:
    spec = {**hub_defaults(task), **source}
    repo_id, fields = spec["repo_id"], spec.get("fields") or {}
    base = repo_dir(root, "dataset", repo_id)
    made: list[str] = []
    builder: Callable[[str, Path], tuple[str, str]]
    if task == "gsm8k":
        builder = lambda split, dest: stand_ins.gsm8k_file(split, dest, fields, seed)  # noqa: E731
    elif task in stand_ins.MATH_MEMBERS:
        builder = lambda split, dest: stand_ins.math_set_file(task, dest, fields, shared)  # noqa: E731
    else:
        raise ValueError(f"data.{task}: the mirror has no stand-in for a hub source of this task")
    files = {}
    for split, entry in spec["files"].items():
        _, built_from = builder(split, base / entry["path"])
        made.append(f"{split}: {built_from}")
        files[split] = {"path": entry["path"], "sha256": sha256_file(base / entry["path"])}
    revision = spec.get("revision")
    index["repos"][repo_key("dataset", repo_id)] = repo_record(
        root, "dataset", repo_id, revision if isinstance(revision, str) else None, origin="stand-in",
        built_from="; ".join(made))
    _pin(pins, task, {"repo_id": repo_id, "files": files})


def _local(root: Path, task: str, source: dict, shared: Path | None, seed: int, index: dict, pins: dict) -> None:
    """A local folder the run reads (the authors' math_lvl3to5_8k): a stand-in under ``ROOT/local/<task>``, which
    ``sources.yaml`` points the task at (the mirror's absolute path)."""
    if task != "math_train":
        raise ValueError(f"data.{task}: the mirror has no stand-in for a local source of this task")
    dest = root / "local" / task
    origin, built_from = stand_ins.math_train_folder(dest, seed)
    final = Path(index["root"]) / "local" / task
    index["local"][task] = {"path": final.as_posix(), "origin": origin, "built_from": built_from,
                            "replaces": source.get("path")}
    _pin(pins, task, {"path": final.as_posix()})


def _add_url(root: Path, url: str, origin: str, built_from: str, index: dict) -> str:
    path = url_path(root, url)
    digest = sha256_file(path)
    index["urls"][url] = {"path": path.relative_to(root).as_posix(), "sha256": digest, "size": path.stat().st_size,
                          "origin": origin, "built_from": built_from}
    return digest


def _pin(pins: dict, task: str, source: dict) -> None:
    pins.setdefault("data", {}).setdefault(task, {})["source"] = source


def _write_sources(path: Path, config_path: str | None, pins: dict) -> None:
    """The config fragment over ``config_path`` pinning the stand-ins (only them) by their own sha256; without
    ``config_path``, the pins alone, to give after a run's own config (``--configfile CONFIG pins.yaml``)."""
    use = ("Use this file as the run's config, or extend it." if config_path else
           "Give it after the run's config: --configfile CONFIG " + path.name + ".")
    header = ("# Written by `esrepro mirror-build`: the mirror's stand-in data files, pinned by their own sha256\n"
              f"# (real copies keep the config's pins). {use}\n")
    body = yaml.safe_dump({**({"extends": config_path} if config_path else {}), **pins}, sort_keys=False)
    path.write_text(header + body, encoding="utf-8")
