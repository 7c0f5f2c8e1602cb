"""Steps: train one run into a run directory; keep the best grid cell of an RL method."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

from esrepro import paths as P
from esrepro.io import atomic_path, write_json, write_jsonl
from esrepro.steps import load_examples, set_threads


def _trainer(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def train(task: str, model: str, model_dir: str, data_dir: str, spec: dict, method: str, out: str,
          dtype: str = "float32", seed: int = 0, threads: int = 1, device: str = "auto", chat: bool = False) -> dict:
    """Train one run (method x task x model x seed) into ``out``: checkpoint/, log.jsonl, manifest.json.

    Under a distributed launcher every process trains (:mod:`esrepro.runtime.distributed`); only the main one
    writes the run directory, and the manifest records the world size.
    """
    from esrepro.provenance.manifest import build_manifest, now, verify_inputs
    from esrepro.runtime.devices import pick_device
    from esrepro.runtime.distributed import world
    from esrepro.settings.methods import algorithm
    from esrepro.tasks import get_task
    from esrepro.train.context import TrainContext

    here = world()
    set_threads(threads)
    started = now()
    # a run with start_from reads another run's snapshot in place of the base model: its hash is recorded as such
    start = "start_checkpoint" if spec.get("start_from") else "base_model"
    inputs = verify_inputs({start: model_dir, "train_data": Path(data_dir) / "train.jsonl"})
    options = dict(spec.get("task_options", {}))
    settings_in = {k: v for k, v in spec.items() if k != "task_options"}
    algo = algorithm(settings_in.get("algorithm", method))
    settings = algo.settings.model_validate({"algorithm": algo.name, **settings_in})
    task_obj = get_task(task, **options)
    examples = load_examples(task_obj, data_dir, "train", settings.train_examples, f"{method}.train_examples")
    run = Path(out)
    device = here.device(pick_device(device))
    eval_examples = (load_examples(task_obj, data_dir, "test", settings.eval_limit)
                     if settings.eval_every is not None else [])  # v2: periodic evaluation on the test split
    ctx = TrainContext(method=method, model=model, model_dir=Path(model_dir), dtype=dtype, chat=chat,
                       settings=settings, task=task_obj, examples=examples, seed=seed, run_dir=run, device=device,
                       eval_examples=eval_examples)
    outcome = _trainer(algo.trainer)(ctx)
    if not here.is_main:  # the trainer's collective work is done; rank 0 writes the run
        return {"method": method, "rank": here.rank}
    with atomic_path(run / P.CHECKPOINT, is_dir=True) as tmp:
        outcome.save(tmp)
    write_jsonl(run / P.TRAIN_LOG, outcome.log)
    snapshots = {f"snapshot_{d.name}": d for _, d in snapshot_dirs(run)}
    from esrepro.train.periodic import PERIODIC_EVAL

    if (run / PERIODIC_EVAL).exists():
        snapshots["periodic_eval"] = run / PERIODIC_EVAL
    write_json(run / P.MANIFEST, build_manifest(
        "train", inputs=inputs,
        settings={"method": method, "task": task, "model": model, "dtype": dtype, "chat": chat,
                  "task_options": options, **settings.as_dict()},
        started=started,
        outputs={"checkpoint": run / P.CHECKPOINT, "log": run / P.TRAIN_LOG, **snapshots},
        extra={"seed": seed, "train_examples": len(examples), "device": device,
               "world_size": here.world_size, **outcome.extra},
    ))
    outcome.finish()
    summary = {"method": method, "iterations": len(outcome.log),
               "final_reward_mean": outcome.log[-1].get("reward_mean") if outcome.log else None}
    print(json.dumps(summary))
    return summary


def snapshot_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(iteration, path) of the weights a run kept along the way (``checkpoints/iterK``), in order."""
    root = Path(run_dir) / P.SNAPSHOTS
    if not root.is_dir():
        return []
    return sorted((int(d.name[4:]), d) for d in root.iterdir()
                  if d.is_dir() and d.name.startswith("iter") and d.name[4:].isdigit())


def select(task: str, model: str, method: str, grid: dict, cell: list[str], out: str, seed: int = 0) -> dict:
    """Keep the grid cell with the best training reward as the method's run (checkpoint, log, manifest)."""
    from esrepro.provenance.manifest import build_manifest, now
    from esrepro.rl.select import select_run

    started = now()
    cells = named_paths(cell, "--cell", "NAME=RUN_DIR")
    run = Path(out)
    record = select_run(cells, grid, run)
    from esrepro.train.periodic import PERIODIC_EVAL

    periodic = Path(cells[record["winner"]]) / PERIODIC_EVAL  # v2: the kept cell's periodic evaluation goes along
    (run / PERIODIC_EVAL).unlink(missing_ok=True)
    if periodic.exists():
        shutil.copyfile(periodic, run / PERIODIC_EVAL)
    inputs = {f"{c}_log": Path(d) / P.TRAIN_LOG for c, d in cells.items()}
    inputs["winner_checkpoint"] = Path(cells[record["winner"]]) / P.CHECKPOINT
    write_json(run / P.MANIFEST, build_manifest(
        "select", inputs=inputs,
        settings={"method": method, "task": task, "model": model, "grid": grid, **record["settings"]},
        started=started,
        outputs={"checkpoint": run / P.CHECKPOINT, "log": run / P.TRAIN_LOG, "selection": run / P.SELECTION},
        extra={"seed": seed, "winner": record["winner"], "train_reward": record["train_reward"],
               "budget": record["budget"]},
    ))
    print(json.dumps({k: record[k] for k in ("winner", "train_reward")}))
    return record


def named_paths(items: list[str], flag: str, form: str) -> dict[str, str]:
    """``{name: path}`` from repeated ``NAME=PATH`` arguments; a malformed one names the flag."""
    out = {}
    for item in items:
        name, _, path = item.partition("=")
        if not path:
            raise ValueError(f"{flag} expects {form}, got {item!r}")
        out[name] = path
    return out
