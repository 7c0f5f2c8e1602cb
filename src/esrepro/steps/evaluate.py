"""Step: greedy evaluation of a checkpoint on a task split (metrics.json, responses.jsonl, manifest)."""

from __future__ import annotations

import json
from pathlib import Path

from esrepro.io import write_json, write_jsonl
from esrepro.steps import load_examples, set_threads


def evaluate(task: str, model: str, method: str, model_dir: str, data_dir: str, spec: dict, out: str,
             dtype: str = "float32", seed: int = 0, threads: int = 1, device: str = "auto", chat: bool = False) -> dict:
    """Evaluate ``model_dir`` greedily on ``spec``'s split of ``task``; writes ``out``/metrics.json and responses."""
    from esrepro.backends.hf import HFBackend
    from esrepro.evaluate import evaluate as run_evaluation
    from esrepro.provenance.manifest import build_manifest, now, verify_inputs
    from esrepro.runtime.devices import pick_device
    from esrepro.settings.pipeline import EvalSettings
    from esrepro.tasks import get_task

    set_threads(threads)
    started = now()
    settings = EvalSettings.model_validate({k: v for k, v in spec.items() if k != "task_options"})
    inputs = verify_inputs({"model": model_dir, "data": Path(data_dir) / f"{settings.split}.jsonl"})
    task_obj = get_task(task, **spec.get("task_options", {}))
    examples = load_examples(task_obj, data_dir, settings.split, settings.limit)
    device = pick_device(device)
    batch = _generate_batch(model_dir, task, settings, device)
    backend = HFBackend(model_dir, dtype=dtype, device=device, batch_size=batch, chat=chat,
                        max_prompt_tokens=settings.max_prompt_tokens, generation=settings.generation)
    result = run_evaluation(backend, task_obj, examples, settings.max_new_tokens, batch)
    result.metrics["truncated_prompts"] = backend.truncated
    root = Path(out)
    labels = {"task": task, "split": settings.split, "model": model, "method": method, "seed": seed}
    write_jsonl(root / "responses.jsonl", result.responses)
    write_json(root / "metrics.json", {**labels, **result.metrics})
    write_json(root / "manifest.json", build_manifest(
        "evaluate", inputs=inputs,
        settings={**labels, **spec, "dtype": dtype, "chat": chat}, started=started,
        outputs={"metrics": root / "metrics.json", "responses": root / "responses.jsonl"},
        extra={"device": device, "decoding": backend.decoding.as_dict()},
    ))
    print(json.dumps({**labels, **result.metrics}))
    return result.metrics


def _generate_batch(model_dir: str | Path, task: str, settings, device: str) -> int:
    """The evaluation's ``generate`` batch: ``batch_size``, or on a GPU the largest that fits it
    (:func:`esrepro.models.memory.runtime_generate_batch`, the plan check's rule); greedy outputs do not depend on it."""
    from esrepro.models import memory

    prompt = min(memory.prompt_tokens(task), settings.max_prompt_tokens or 10**9)
    batch = memory.runtime_generate_batch(model_dir, settings.batch_size, prompt, settings.max_new_tokens, device)
    if batch < settings.batch_size:
        print(f"evaluate {task}: generating {batch} prompts at a time (batch_size {settings.batch_size} does not fit "
              "the GPU: esrepro.models.memory)", flush=True)
    return batch
