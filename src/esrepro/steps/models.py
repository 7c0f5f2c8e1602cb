"""Steps: build the tiny model of a registry entry, or fetch a hub model at its revision."""

from __future__ import annotations

import json
from pathlib import Path

from esrepro.io import read_jsonl, write_json
from esrepro.steps import set_threads


def build_tiny(model: str, spec: dict, data_spec: dict, exclude: list[str], out: str, threads: int = 1) -> dict:
    """Build the tiny model of a registry entry (tokenizer, Qwen2 LM, warm-start SFT) into ``out``."""
    from esrepro.models.tiny import build_tiny as build
    from esrepro.provenance.manifest import build_manifest, now

    set_threads(threads)
    started = now()
    if spec["build"]["sft"].get("tasks"):  # v2: several warm-start formats; rows grouped by their task folder
        from esrepro.models.tiny import build_tiny_tasks

        by_task: dict[str, list[dict]] = {}
        for p in exclude:
            by_task.setdefault(Path(p).parent.name, []).extend(read_jsonl(p))
        sources = {t: d.get("source", {}) for t, d in data_spec.get("tasks", {}).items()}
        summary = build_tiny_tasks(spec["build"], by_task, out, data_sources=sources)
    else:
        rows = [row for p in exclude for row in read_jsonl(p)]
        summary = build(spec["build"], rows, out, data_source=data_spec.get("source", {}))
    write_json(Path(out) / "manifest.json", build_manifest(
        "build_tiny", inputs={f"excluded_{Path(p).stem}": p for p in exclude},
        settings={"model": model, **spec, "data": data_spec}, started=started, outputs={"model": out},
        extra={"summary": summary},
    ))
    print(json.dumps(summary, indent=2))
    return summary


def fetch_model(model: str, spec: dict, out: str) -> None:
    """Download a hub model at its registry revision into ``out`` (only the files it needs,
    :data:`esrepro.models.fetch.MODEL_FILES`); the resolved commit, the patterns, the files and their hashes are
    recorded."""
    from esrepro.models.fetch import fetch_hub_model
    from esrepro.provenance.manifest import build_manifest, now

    started = now()
    resolved = fetch_hub_model(model, spec["hub_id"], spec["revision"], out)
    write_json(Path(out) / "manifest.json", build_manifest(
        "fetch_model", {}, {"model": model, **spec}, started, outputs={"model": out}, extra={"resolved": resolved},
    ))
