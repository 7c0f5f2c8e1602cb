"""Step: prepare a task's data (data/prepared/{task}/{split}.jsonl and its manifest)."""

from __future__ import annotations

from pathlib import Path

from esrepro.io import write_json


def prepare_data(task: str, spec: dict, out: str) -> dict:
    """Write every split of ``task`` from ``spec`` (the config's data.<task>: source and seed) into ``out``."""
    from esrepro.provenance.manifest import build_manifest, now
    from esrepro.tasks import prepare_task

    started = now()
    prepared = prepare_task(task, out, spec["source"], spec.get("seed", 0))
    splits = prepared["splits"]
    root = Path(out)
    write_json(root / "manifest.json", build_manifest(
        "prepare_data", inputs={}, settings={"task": task, **spec}, started=started,
        outputs={f"{s}.jsonl": root / f"{s}.jsonl" for s in splits},
        extra={"splits": splits, "provenance": prepared["provenance"]},
    ))
    return splits
