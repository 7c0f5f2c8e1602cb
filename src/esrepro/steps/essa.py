"""The ESSA study's GRPO baseline: GRPO from the reference ESSA run's SFT start (ESSA Fig. 8).

What GRPO optimises (``trains``): ``adapter`` (the default, as the ESSA paper "further optimises
the SFT LoRA adapter"): the policy is the base model with the reference run's SFT adapter loaded
trainable by peft, so only the adapter's LoRA matrices change; ``all``: every weight of the base
with that adapter merged in. Either way GRPO starts from the SFT model, whose held-out score is
taken on ``<run>/sft_start/`` (the adapter merged into the base, a checkpoint in the registry dtype).
With ``beta > 0`` the KL reference is that same SFT start: TRL keeps a frozen copy of the loaded
adapter for a peft policy, and loads ``sft_start/`` again for a full one (:mod:`esrepro.rl.grpo`).

Problems: GRPO trains on the first ``train_examples`` problems of the alignment fold (the train
split after the reference run's ``sft_examples``) without the held-out block, i.e. the fitness
subset first, then the problems after the held-out ones; its kept snapshots and final weights are
scored on the reference run's held-out problems with the same greedy scoring as ESSA's mean, so
the two curves share their problems and their measure, and GRPO never trains on the problems it is
scored on. The x axis is each method's summed training seconds (start-up, SFT, merging and held-out
scoring excluded on both sides; GRPO's step seconds include writing its kept snapshots, which TRL's
callbacks run inside the step, so ``keep_every`` should stay sparse at scale).

The run directory has the shape of every run (``checkpoint/``, ``log.jsonl``, ``manifest.json``)
plus ``sft_start/`` and the kept snapshots; with ``adapter`` the snapshots are peft adapters (each
scored merged into the base), ``adapter/`` holds the trained adapter and ``checkpoint/`` the base
with it merged in.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from esrepro import paths as P

SFT_START = "sft_start"
#: What the baseline's GRPO may train: the SFT LoRA adapter, or every weight of the SFT start.
TRAINS = ("adapter", "all")


def heldout_reward(model_dir: str | Path, task, examples: list[dict], max_new_tokens: int, fitness: str,
                   dtype: str = "float32", device: str = "cpu", batch_size: int = 32, chat: bool = False) -> float:
    """Mean greedy score of the checkpoint in ``model_dir`` on ``examples`` (accuracy or reward, as ESSA scores)."""
    from esrepro.backends.hf import HFBackend
    from esrepro.population.spec import score_examples

    backend = HFBackend(model_dir, dtype=dtype, device=device, batch_size=batch_size, chat=chat)
    responses = backend.generate([task.prompt(e) for e in examples], max_new_tokens)
    return float(np.mean(score_examples(task, examples, responses, fitness)))


def merge_sft_start(model_dir: str | Path, adapter_dir: str | Path, out: str | Path, dtype: str) -> None:
    """Write the base with a peft adapter (the SFT one, a trained one) merged in (peft, on the CPU, in ``dtype``)
    as a checkpoint."""
    from esrepro.essa.lora import load_merged
    from esrepro.io import atomic_path
    from esrepro.models.loading import load_tokenizer, save_checkpoint

    model = load_merged(model_dir, adapter_dir, dtype=dtype, device="cpu")
    with atomic_path(out, is_dir=True) as tmp:
        save_checkpoint(model, load_tokenizer(model_dir), tmp)


def _score_points(run: Path, log: list[dict], score: dict, model_dir: str | Path, dtype: str, adapter: bool) -> None:
    """Held-out score of every kept snapshot and the final checkpoint into their log rows (``val_reward``,
    ``seconds_eval``); a peft snapshot is scored merged into the base (in a temporary directory)."""
    from esrepro.steps.train import snapshot_dirs

    points = [(it, d, adapter) for it, d in snapshot_dirs(run) if it <= len(log)]
    for it, path, merge in points + [(len(log), run / P.CHECKPOINT, False)]:
        t = time.perf_counter()
        if merge:
            with tempfile.TemporaryDirectory(prefix=".merged.", dir=run) as tmp:
                merge_sft_start(model_dir, path, Path(tmp) / "model", dtype)
                log[it - 1]["val_reward"] = heldout_reward(Path(tmp) / "model", **score)
        else:
            log[it - 1]["val_reward"] = heldout_reward(path, **score)
        log[it - 1]["seconds_eval"] = time.perf_counter() - t


def essa_grpo(task: str, model: str, model_dir: str, sft_dir: str, data_dir: str, spec: dict, ref_spec: dict,
              method: str, out: str, dtype: str = "float32", seed: int = 0, threads: int = 1, device: str = "auto",
              chat: bool = False, trains: str = "adapter") -> dict:
    """Train the GRPO baseline (``spec``) from the SFT start of the reference ESSA run (``sft_dir``,
    ``ref_spec``) into ``out``: checkpoint/, log.jsonl with held-out scores, manifest.json (and adapter/
    when ``trains`` is ``adapter``)."""
    from esrepro.essa.data import alignment_positions, baseline_problems_needed, heldout_positions
    from esrepro.essa.train import ADAPTER, SFT_ADAPTER, verify_sft
    from esrepro.io import atomic_path, write_json, write_jsonl
    from esrepro.provenance.manifest import build_manifest, now, verify_inputs
    from esrepro.rl.run import train_rl
    from esrepro.runtime.devices import pick_device
    from esrepro.runtime.distributed import barrier, init_process_group, world
    from esrepro.settings.methods import ESSASettings, algorithm
    from esrepro.steps import load_examples, set_threads
    from esrepro.steps.train import snapshot_dirs
    from esrepro.tasks import get_task
    from esrepro.train.context import TrainContext

    if trains not in TRAINS:
        raise ValueError(f"trains must be one of {', '.join(TRAINS)}, got {trains!r}")
    here = world()  # under torchrun: every process trains, rank 0 writes
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
    fold = (ref.sft_examples, ref.fitness_examples, ref.val_examples)
    positions = alignment_positions(*fold, settings.train_examples)
    held = heldout_positions(*fold)
    need = baseline_problems_needed(*fold, settings.train_examples)
    problems = load_examples(task_obj, data_dir, "train", need, f"{method}.train_examples")
    train_examples = [problems[i] for i in positions]
    val_examples = [problems[i] for i in held]
    run = Path(out)
    device = here.device(pick_device(device))
    init_process_group(device, getattr(settings, "collective_timeout", None))
    adapter = Path(sft_dir) / SFT_ADAPTER
    start = run / SFT_START
    t0 = time.perf_counter()
    if here.is_main:
        merge_sft_start(model_dir, adapter, start, dtype)
    barrier()  # the merged start is whole before any process loads it
    seconds_merge = time.perf_counter() - t0

    on_adapter = trains == "adapter"
    ctx = TrainContext(method=method, model=model, model_dir=Path(model_dir) if on_adapter else start, dtype=dtype,
                       chat=chat, settings=settings, task=task_obj, examples=train_examples, seed=seed, run_dir=run,
                       device=device, adapter_dir=adapter if on_adapter else None)
    outcome = train_rl(ctx)
    if not here.is_main:
        return {"method": method, "rank": here.rank}
    t0 = time.perf_counter()
    if on_adapter:
        with atomic_path(run / ADAPTER, is_dir=True) as tmp:
            outcome.save(tmp)
        merge_sft_start(model_dir, run / ADAPTER, run / P.CHECKPOINT, dtype)
    else:
        shutil.rmtree(run / ADAPTER, ignore_errors=True)  # RL runs do not resume: no stale adapter
        with atomic_path(run / P.CHECKPOINT, is_dir=True) as tmp:
            outcome.save(tmp)
    seconds_final = time.perf_counter() - t0

    log = [dict(r) for r in outcome.log]
    elapsed = 0.0
    for row in log:
        elapsed += float(row.get("seconds") or 0.0)
        row["elapsed_seconds"] = elapsed
    score = dict(task=task_obj, examples=val_examples, max_new_tokens=ref.max_new_tokens, fitness=ref.fitness,
                 dtype=dtype, device=device, batch_size=ref.batch_size, chat=chat)
    val_sft = heldout_reward(start, **score) if val_examples else None
    if val_examples and log:
        _score_points(run, log, score, model_dir, dtype, on_adapter)
    write_jsonl(run / P.TRAIN_LOG, log)
    snapshots = {f"snapshot_{d.name}": d for _, d in snapshot_dirs(run)}
    outputs = {"checkpoint": run / P.CHECKPOINT, "log": run / P.TRAIN_LOG, "sft_start": start, **snapshots}
    if on_adapter:
        outputs["adapter"] = run / ADAPTER
    write_json(run / P.MANIFEST, build_manifest(
        "train", inputs=inputs,
        settings={"method": method, "task": task, "model": model, "dtype": dtype, "chat": chat,
                  "task_options": options, **settings.as_dict()},
        started=started,
        outputs=outputs,
        extra={"seed": seed, "train_examples": len(train_examples), "device": device,
               "world_size": here.world_size, **outcome.extra,
               "essa_baseline": {"start": "the reference ESSA run's SFT adapter merged into the base",
                                 "trains": trains,
                                 "train_problems": "the alignment fold without its held-out problems: "
                                                   f"{len(train_examples)} problems",
                                 "train_positions": _spans(positions),
                                 "alignment_offset": ref.sft_examples, "val_examples": len(val_examples),
                                 "val_positions": _spans(list(held)),
                                 "val_reward_sft": val_sft, "fitness": ref.fitness,
                                 "seconds_merge": seconds_merge, "seconds_final": seconds_final}},
    ))
    outcome.finish()
    summary = {"method": method, "trains": trains, "iterations": len(log), "val_reward_sft": val_sft,
               "final_val_reward": log[-1].get("val_reward") if log else None}
    print(json.dumps(summary))
    return summary


def _spans(positions: list[int]) -> list[list[int]]:
    """Positions as [first, last + 1) spans (the manifest's compact record of which problems a role used)."""
    spans: list[list[int]] = []
    for i in positions:
        if spans and spans[-1][1] == i:
            spans[-1][1] = i + 1
        else:
            spans.append([i, i + 1])
    return spans
