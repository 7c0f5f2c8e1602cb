"""Steps: build the tiny model of a registry entry (or copy its pinned build), fetch a hub model at its revision, or
link a model folder on disk; add a model to the registry."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from esrepro.io import atomic_path, read_json, read_jsonl, write_json
from esrepro.models import pinned as pins
from esrepro.models.add import add_model as add_registry_entry
from esrepro.models.entry_check import entry_problems
from esrepro.models.local import link_folder
from esrepro.provenance.manifest import build_manifest, now, sha256_tree, verify_inputs
from esrepro.settings.registry import ModelEntry
from esrepro.steps import set_threads


def _excluded(exclude: list[str]) -> dict[str, str]:
    """``{manifest key: path}`` of the prepared files a warm start stays disjoint from (each task's train and test)."""
    several = len({Path(p).parent for p in exclude}) > 1
    return {pins.excluded_name(p, several): p for p in exclude}


def _pin_check(spec: dict, data_spec: dict, exclude: list[str], pinned: dict | None) -> tuple[dict, str | None]:
    """The excluded splits' input records, and why ``pinned`` was not built from this build (None: it was)."""
    inputs = verify_inputs(_excluded(exclude))
    wanted = pins.built_from(spec["build"], data_spec, {k: v["sha256"] for k, v in inputs.items()})
    return inputs, (pins.mismatch(pinned["path"], wanted) if pinned else "no pinned build in the registry")


def _build(spec: dict, data_spec: dict, exclude: list[str], out: str | Path) -> dict:
    """Build the model of ``spec["build"]`` into ``out``: tokenizer, Qwen2 LM, warm-start SFT; returns its summary."""
    # torch and transformers: loaded only by a job that builds, not by one that copies a pin
    from esrepro.models.tiny import build_tiny as build
    from esrepro.models.tiny import build_tiny_tasks

    if spec["build"]["sft"].get("tasks"):  # v2: several warm-start formats; rows grouped by their task folder
        by_task: dict[str, list[dict]] = {}
        for p in exclude:
            by_task.setdefault(Path(p).parent.name, []).extend(read_jsonl(p))
        sources = {t: d.get("source", {}) for t, d in data_spec.get("tasks", {}).items()}
        return build_tiny_tasks(spec["build"], by_task, out, data_sources=sources)
    rows = [row for p in exclude for row in read_jsonl(p)]
    return build(spec["build"], rows, out, data_source=data_spec.get("source", {}))


def build_tiny(model: str, spec: dict, data_spec: dict, exclude: list[str], out: str, threads: int = 1,
               pinned: dict | None = None) -> dict:
    """Build the tiny model of a registry entry into ``out``; with ``pinned`` (the entry's ``{path, sha256}``),
    copy the pinned build instead when it was built from these settings and this data (checked file by file),
    and build when it was not (saying what differs)."""
    set_threads(threads)
    started = now()
    inputs, why = _pin_check(spec, data_spec, exclude, pinned)
    extra: dict = {}
    if why is None:
        pins.copy_pinned(pinned["path"], pinned["sha256"], out)
        summary = read_json(Path(out) / "build.json")["summary"]
        inputs.update(verify_inputs({"pinned": pinned["path"]}))
        extra["pinned"] = pinned
        print(f"{model}: copied the pinned build {pinned['path']} (sha256 {pinned['sha256']}, every file checked)")
    else:
        if pinned:
            print(f"{model}: the pinned build {pinned['path']} was built from other inputs ({why}); building")
        summary = _build(spec, data_spec, exclude, out)
    write_json(Path(out) / "manifest.json", build_manifest(
        "build_tiny", inputs=inputs, settings={"model": model, **spec, "data": data_spec}, started=started,
        outputs={"model": out}, extra={"summary": summary, **extra},
    ))
    print(json.dumps(summary, indent=2))
    return summary


def verify_build(model: str, spec: dict, data_spec: dict, exclude: list[str], pinned: dict, out: str,
                 threads: int = 1) -> int:
    """Rebuild the tiny model of a registry entry from scratch and compare it with its pinned build: writes the
    comparison to ``out`` (JSON) and returns 1, naming the files that differ, when the rebuild is not the pin."""
    set_threads(threads)
    started = now()
    inputs, why = _pin_check(spec, data_spec, exclude, pinned)
    with tempfile.TemporaryDirectory(prefix=f".{model}-rebuild.", dir=Path(out).parent) as tmp:
        _build(spec, data_spec, exclude, Path(tmp) / "model")
        rebuilt = sha256_tree(Path(tmp) / "model")
        differ = pins.differences(Path(tmp) / "model", pinned["path"])
    same = why is None and not differ and rebuilt == pinned["sha256"]
    write_json(out, {**build_manifest("verify_build", inputs={**inputs, "pinned": pinned["path"]},
                                      settings={"model": model, **spec, "data": data_spec, "pinned": pinned},
                                      started=started),
                     "same": same, "rebuilt_sha256": rebuilt, "pinned_sha256": pinned["sha256"],
                     "settings_differ": why, "files_differ": differ})
    if same:
        print(f"{model}: the rebuild equals the pinned build {pinned['path']} (sha256 {rebuilt})")
        return 0
    print(f"{model}: the rebuild differs from the pinned build {pinned['path']}: "
          + (f"settings: {why}; " if why else "") + f"files: {', '.join(differ) or 'none'}; "
          f"sha256 {rebuilt} against {pinned['sha256']}. If the build changed on purpose, refresh the pin with "
          f"esrepro pin-model and write its sha256 in the registry's pinned.sha256")
    return 1


def pin_model(model: str, model_dir: str, out: str) -> int:
    """Make ``out`` the pinned build of the model a build step wrote into ``model_dir`` (its manifest says what it
    was built from); prints the sha256 for the registry entry's ``pinned``."""
    manifest = read_json(Path(model_dir) / "manifest.json")
    if manifest.get("kind") != "build_tiny" or manifest.get("pinned"):
        raise ValueError(f"{model_dir}: not a model a build step built (kind {manifest.get('kind')!r}"
                         + (", copied from a pin" if manifest.get("pinned") else "") + ")")
    settings = manifest["settings"]
    if sha256_tree(model_dir) != manifest["outputs"]["model"]["sha256"]:
        raise ValueError(f"{model_dir}: its files no longer match its manifest's sha256")
    record = pins.built_from(settings["build"], settings.get("data", {}),
                             {k: v["sha256"] for k, v in manifest["inputs"].items() if k.startswith("excluded_")})
    digest = pins.write_pinned(model_dir, out, {"model": model, **record, "code": manifest.get("code"),
                                                "numerics": manifest.get("numerics")})
    print(f"{model}: pinned {model_dir} in {out}; registry entry: pinned: {{path: {out}, sha256: {digest}}}")
    return 0


def fetch_model(model: str, spec: dict, out: str) -> None:
    """Download a hub model at its registry revision into ``out`` (only the files it needs,
    :data:`esrepro.models.fetch.MODEL_FILES`), its config.json checked against the entry's ``config`` field by field
    (a difference stops the step, nothing written); the resolved commit, the patterns, the files and their hashes
    are recorded."""
    from esrepro.models.fetch import fetch_hub_model

    started = now()
    resolved = fetch_hub_model(model, spec["hub_id"], spec["revision"], out, config=spec.get("config"))
    write_json(Path(out) / "manifest.json", build_manifest(
        "fetch_model", {}, {"model": model, **spec}, started, outputs={"model": out}, extra={"resolved": resolved},
    ))


def local_model(model: str, spec: dict, out: str) -> None:
    """Make ``out`` the base model of a registry entry's folder (``path``): a folder of symbolic links to the files
    the pipeline loads (:mod:`esrepro.models.local`), with a manifest recording every file's sha256, which each job
    that reads the model checks before it starts. The folder is checked first as validation checks it (a causal LM
    transformers builds, weights, a tokenizer, the entry's ``config`` if it states one)."""
    started = now()
    entry = ModelEntry.model_validate({**spec, "resources": {"default": {}}})
    problems = entry_problems(model, entry, "the registry")
    if problems:
        raise ValueError("; ".join(problems))
    with atomic_path(out, is_dir=True) as tmp:
        resolved = link_folder(model, spec["path"], tmp)
        manifest = build_manifest("local_model", {}, {"model": model, **spec}, started, extra={"resolved": resolved})
        # what every job that reads the model checks it against, file by file (esrepro.provenance.manifest)
        manifest["outputs"] = {"model": {"path": str(out), "sha256": resolved["sha256"], "files": resolved["files"],
                                         "source": resolved["path"]}}
        write_json(tmp / "manifest.json", manifest)
    print(f"{model}: {out} links the {len(resolved['files'])} model files of {resolved['path']} "
          f"(sha256 {resolved['sha256']}, every file's in {out}/manifest.json)")


def add_model(key: str, registry: str = "config/models.yaml", hub_id: str | None = None,
              revision: str | None = None, from_dir: str | None = None, display: str | None = None,
              gated: bool = False, force: bool = False, root: str = ".") -> int:
    """Write registry entry ``key`` for a hub model (``hub_id`` at ``revision``, its config.json read through the hub
    API) or a model folder on disk (``from_dir``, offline: a ``path`` entry), with its config facts
    (``config/model_configs/<key>.json`` under ``root``), size, dtype, chat template and resources
    (:mod:`esrepro.models.add`); prints what it wrote."""
    written = add_registry_entry(key, registry, hub_id=hub_id, revision=revision, from_dir=from_dir,
                                 display=display, gated=gated, force=force, root=root)
    print(written.report())
    return 0
