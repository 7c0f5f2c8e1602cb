"""The ESSA study's GRPO baseline: GRPO from the reference ESSA run's SFT start (ESSA Fig. 8).

The reference run's SFT adapter is merged by peft into the base model (``<run>/sft_start/``,
a transformers checkpoint in the registry dtype): that is where GRPO starts, as ESSA's
CMA-ES starts from the same adapter. GRPO trains on the first ``train_examples`` problems
of the alignment split (the train split after the reference run's ``sft_examples``; by
default its fitness subset), and its kept snapshots and final weights are then scored on
the reference run's held-out problems with the same greedy scoring as ESSA's mean, so the
two curves share their problems and their measure; the x axis is each method's summed
training seconds (start-up, SFT and held-out scoring excluded on both sides; GRPO's step
seconds include writing its kept snapshots, which TRL's callbacks run inside the step, so
``keep_every`` should stay sparse at scale).

The run directory has the shape of every run (``checkpoint/``, ``log.jsonl``,
``manifest.json``) plus ``sft_start/`` and the kept snapshots.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from esrepro import paths as P

SFT_START = "sft_start"


def heldout_reward(model_dir: str | Path, task, examples: list[dict], max_new_tokens: int, fitness: str,
                   dtype: str = "float32", device: str = "cpu", batch_size: int = 32, chat: bool = False) -> float:
    """Mean greedy score of the checkpoint in ``model_dir`` on ``examples`` (accuracy or reward, as ESSA scores)."""
    from esrepro.backends.hf import HFBackend
    from esrepro.population.spec import score_examples

    backend = HFBackend(model_dir, dtype=dtype, device=device, batch_size=batch_size, chat=chat)
    responses = backend.generate([task.prompt(e) for e in examples], max_new_tokens)
    return float(np.mean(score_examples(task, examples, responses, fitness)))


def merge_sft_start(model_dir: str | Path, adapter_dir: str | Path, out: str | Path, dtype: str) -> None:
    """Write the base with the SFT adapter merged in (peft, on the CPU, in ``dtype``) as a checkpoint."""
    from esrepro.essa.lora import load_merged
    from esrepro.io import atomic_path
    from esrepro.models.loading import load_tokenizer, save_checkpoint

    model = load_merged(model_dir, adapter_dir, dtype=dtype, device="cpu")
    with atomic_path(out, is_dir=True) as tmp:
        save_checkpoint(model, load_tokenizer(model_dir), tmp)


def essa_grpo(task: str, model: str, model_dir: str, sft_dir: str, data_dir: str, spec: dict, ref_spec: dict,
              method: str, out: str, dtype: str = "float32", seed: int = 0, threads: int = 1, device: str = "auto",
              chat: bool = False) -> dict:
    """Train the GRPO baseline (``spec``) from the SFT start of the reference ESSA run (``sft_dir``,
    ``ref_spec``) into ``out``: checkpoint/, log.jsonl with held-out scores, manifest.json."""
    from esrepro.devices import pick_device
    from esrepro.essa.train import SFT_ADAPTER, verify_sft
    from esrepro.io import atomic_path, write_json, write_jsonl
    from esrepro.provenance.manifest import build_manifest, now, verify_inputs
    from esrepro.rl.run import train_rl
    from esrepro.settings.methods import ESSASettings, algorithm
    from esrepro.steps import load_examples, set_threads
    from esrepro.steps.train import snapshot_dirs
    from esrepro.tasks import get_task
    from esrepro.train.context import TrainContext

    set_threads(threads)
    started = now()
    verify_sft(Path(sft_dir))
    inputs = verify_inputs({"base_model": model_dir, "sft_adapter": Path(sft_dir) / SFT_ADAPTER,
                            "train_data": Path(data_dir) / "train.jsonl"})
    options = dict(spec.get("task_options", {}))
    settings_in = {k: v for k, v in spec.items() if k != "task_options"}
    algo = algorithm(settings_in.get("algorithm", "grpo"))
    settings = algo.settings.model_validate({"algorithm": algo.name, **settings_in})
    ref = ESSASettings.model_validate({k: v for k, v in ref_spec.items() if k != "task_options"})
    task_obj = get_task(task, **options)
    need = ref.sft_examples + max(settings.train_examples, ref.fitness_examples + ref.val_examples)
    problems = load_examples(task_obj, data_dir, "train", need, f"{method}.train_examples")
    train_examples = problems[ref.sft_examples:ref.sft_examples + settings.train_examples]
    val_start = ref.sft_examples + ref.fitness_examples
    val_examples = problems[val_start:val_start + ref.val_examples]
    run = Path(out)
    device = pick_device(device)
    adapter = Path(sft_dir) / SFT_ADAPTER
    start = run / SFT_START
    t0 = time.perf_counter()
    merge_sft_start(model_dir, adapter, start, dtype)
    seconds_merge = time.perf_counter() - t0

    ctx = TrainContext(method=method, model=model, model_dir=start, dtype=dtype, chat=chat, settings=settings,
                       task=task_obj, examples=train_examples, seed=seed, run_dir=run, device=device)
    outcome = train_rl(ctx)
    with atomic_path(run / P.CHECKPOINT, is_dir=True) as tmp:
        outcome.save(tmp)

    log = [dict(r) for r in outcome.log]
    elapsed = 0.0
    for row in log:
        elapsed += float(row.get("seconds") or 0.0)
        row["elapsed_seconds"] = elapsed
    score = dict(task=task_obj, examples=val_examples, max_new_tokens=ref.max_new_tokens, fitness=ref.fitness,
                 dtype=dtype, device=device, batch_size=ref.batch_size, chat=chat)
    val_sft = heldout_reward(start, **score) if val_examples else None
    if val_examples and log:
        points = [(it, d) for it, d in snapshot_dirs(run) if it <= len(log)] + [(len(log), run / P.CHECKPOINT)]
        for it, path in points:
            t = time.perf_counter()
            log[it - 1]["val_reward"] = heldout_reward(path, **score)
            log[it - 1]["seconds_eval"] = time.perf_counter() - t
    write_jsonl(run / P.TRAIN_LOG, log)
    snapshots = {f"snapshot_{d.name}": d for _, d in snapshot_dirs(run)}
    write_json(run / P.MANIFEST, build_manifest(
        "train", inputs=inputs,
        settings={"method": method, "task": task, "model": model, "dtype": dtype, "chat": chat,
                  "task_options": options, **settings.as_dict()},
        started=started,
        outputs={"checkpoint": run / P.CHECKPOINT, "log": run / P.TRAIN_LOG, "sft_start": start, **snapshots},
        extra={"seed": seed, "train_examples": len(train_examples), "device": device, **outcome.extra,
               "essa_baseline": {"start": "the reference ESSA run's SFT adapter merged into the base",
                                 "alignment_offset": ref.sft_examples, "val_examples": len(val_examples),
                                 "val_reward_sft": val_sft, "fitness": ref.fitness,
                                 "seconds_merge": seconds_merge}},
    ))
    outcome.finish()
    summary = {"method": method, "iterations": len(log), "val_reward_sft": val_sft,
               "final_val_reward": log[-1].get("val_reward") if log else None}
    print(json.dumps(summary))
    return summary
