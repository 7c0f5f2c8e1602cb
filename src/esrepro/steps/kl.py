"""Step: KL(fine-tuned || base) of a run's final weights and kept snapshots, with their greedy reward."""

from __future__ import annotations

import json
from pathlib import Path

from esrepro import paths as P
from esrepro.io import read_json, read_jsonl, write_json, write_jsonl
from esrepro.settings.methods import with_former_names
from esrepro.steps import load_examples, set_threads

KEPT = ("reward", "accuracy", "reward_sampled", "mean_tokens")
HYPER = ("sigma", "alpha", "beta", "learning_rate")


def kl(task: str, model: str, method: str, model_dir: str, base_dir: str, data_dir: str, spec: dict, out: str,
       run_dir: str | None = None, dtype: str = "float32", seed: int = 0, threads: int = 1, device: str = "auto", chat: bool = False) -> dict:
    """Measure KL to ``base_dir`` for the final weights and every kept snapshot; writes kl.json and samples.jsonl."""
    from esrepro.kl import ESTIMATORS, measure_checkpoint
    from esrepro.models.loading import load_model
    from esrepro.provenance.manifest import build_manifest, now, verify_inputs
    from esrepro.runtime.devices import pick_device
    from esrepro.settings.pipeline import KLSettings
    from esrepro.steps.train import snapshot_dirs
    from esrepro.tasks import get_task

    set_threads(threads)
    started = now()
    settings = KLSettings.model_validate({k: v for k, v in spec.items() if k != "task_options"})
    task_obj = get_task(task, **spec.get("task_options", {}))
    run = Path(run_dir) if run_dir else None
    final_iteration = len(read_jsonl(run / P.TRAIN_LOG)) if run and (run / P.TRAIN_LOG).exists() else 0
    points = [(it, d) for it, d in (snapshot_dirs(run) if run else []) if it < final_iteration]
    points.append((final_iteration, Path(model_dir)))
    inputs = {"model": model_dir, "base_model": base_dir, "data": Path(data_dir) / f"{settings.split}.jsonl"}
    if run:
        inputs["run_manifest"] = run / P.MANIFEST
        inputs.update({f"snapshot_iter{it}": p for it, p in points[:-1]})
    inputs = verify_inputs(inputs)
    examples = load_examples(task_obj, data_dir, settings.split, settings.limit)
    device = pick_device(device)
    base = load_model(base_dir, dtype=dtype, device=device)
    run_settings = read_json(run / P.MANIFEST)["settings"] if run else {}
    algorithm = run_settings.get("algorithm", method) if run else "base"
    shown = with_former_names(algorithm, run_settings)  # hyper as recorded before any rename: PPO's beta is not GRPO's

    keep = (*KEPT, *ESTIMATORS, *(f"{k}_se" for k in ESTIMATORS), *(f"{k}_per_token" for k in ESTIMATORS))
    checkpoints, final = [], None
    for it, path in points:
        final = measure_checkpoint(path, base, task_obj, examples, settings, dtype=dtype, chat=chat, device=device,
                                   progress=True)
        checkpoints.append({"iteration": it, **{k: final["summary"][k] for k in keep}})
        print(json.dumps(checkpoints[-1]), flush=True)
    assert final is not None
    labels = {"task": task, "split": settings.split, "model": model, "method": method, "seed": seed}
    root = Path(out)
    write_jsonl(root / "samples.jsonl", final["responses"])
    write_json(root / "kl.json", {
        **labels, "algorithm": algorithm, "iteration": final_iteration,
        "hyper": {k: shown[k] for k in HYPER if shown.get(k) is not None},
        **{k: v for k, v in final["summary"].items() if k != "settings"},
        "settings": final["summary"]["settings"],
        "estimator_note": "per-sequence sums over response tokens (EOS included), mean over responses, "
                          "then over prompts; *_se: standard error over all responses",
        "prompts": final["prompts"], "greedy": final["eval"], "checkpoints": checkpoints,
    })
    write_json(root / "manifest.json", build_manifest(
        "kl", inputs=inputs, settings={**labels, **spec, "dtype": dtype, "chat": chat}, started=started,
        outputs={"kl": root / "kl.json", "samples": root / "samples.jsonl"}, extra={"device": device},
    ))
    return final["summary"]
