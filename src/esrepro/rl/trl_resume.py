"""The resume state of a TRL-trained RL run: TRL's own checkpoints under ``<run>/resume/``, kept whole.

Every ``resume_every`` optimiser steps the Trainer writes ``checkpoint-N`` (weights, optimiser, scheduler,
every process's RNG state, the trainer state), but not after the last step. Its writes are not atomic, so the
checkpoint counts as complete only once :class:`ResumeCallback` (run after the Trainer's save, rank 0) has added :data:`MARKER`: the key of
the settings it was written with, the per-step log rows so far and the periodic-evaluation rows. Then the
older checkpoints are deleted: the folder holds the last complete checkpoint (and, for a moment, the one
being written). A restarted run continues from the last complete checkpoint; a checkpoint written with other
settings is refused with :class:`esrepro.train.resume.ResumeMismatch`, naming the folder to delete.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from esrepro.io import read_json, write_json
from esrepro.train.resume import ResumeMismatch

MARKER = "esrepro_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: Settings that do not change what the run computes (left out of the key).
NOT_IN_KEY = ("resume_every", "collective_timeout")


def resume_key(settings: dict, *, seed: int, steps: int, world_size: int) -> dict:
    """What a checkpoint must have been written with to be continued: the settings (but NOT_IN_KEY), the seed, the
    steps and the number of training processes (each holds its own RNG state and optimiser shard)."""
    key = {**{k: v for k, v in settings.items() if k not in NOT_IN_KEY}, "seed": seed, "steps": steps,
           "world_size": world_size}
    return json.loads(json.dumps(key, sort_keys=True, default=str))  # as the state file holds it


def _checkpoints(resume_dir: Path) -> list[tuple[int, Path]]:
    if not resume_dir.is_dir():
        return []
    found = [(int(m.group(1)), d) for d in resume_dir.iterdir() if d.is_dir() and (m := _CHECKPOINT.match(d.name))]
    return sorted(found)


def last_complete(resume_dir: str | Path) -> Path | None:
    """The newest checkpoint under ``resume_dir`` that was written whole (has :data:`MARKER`), if any."""
    done = [d for _, d in _checkpoints(Path(resume_dir)) if (d / MARKER).exists()]
    return done[-1] if done else None


def open_state(resume_dir: str | Path, key: dict, extra: dict[str, list[dict]] | None = None,
               clean: bool = True) -> tuple[Path | None, list[dict]]:
    """(checkpoint to resume from or None, log rows so far) for a run with ``key``; each ``extra`` list is
    replaced in place by the rows the state holds for it. ``clean`` (the main process): delete checkpoints
    written after the last complete one (an interrupted save)."""
    resume_dir = Path(resume_dir)
    checkpoint = last_complete(resume_dir)
    if clean:
        newest = -1 if checkpoint is None else int(checkpoint.name.split("-")[1])
        for n, d in _checkpoints(resume_dir):
            if n > newest:
                shutil.rmtree(d, ignore_errors=True)
    if checkpoint is None:
        return None, []
    meta = read_json(checkpoint / MARKER)
    if meta.get("config") != key:
        raise ResumeMismatch(f"{resume_dir} holds the resume state of a run with settings {meta.get('config')}, not "
                             f"{key}; delete {resume_dir} to start this run afresh")
    for name, rows in (extra or {}).items():
        rows[:] = list(meta.get("extra", {}).get(name, []))
    return checkpoint, list(meta["log"])


def mark_complete(checkpoint: str | Path, key: dict, step: int, log: list[dict],
                  extra: dict[str, list[dict]] | None = None) -> None:
    """Declare ``checkpoint`` whole (the marker, written atomically, last), then delete every other checkpoint
    beside it."""
    checkpoint = Path(checkpoint)
    write_json(checkpoint / MARKER, {"config": key, "step": step, "log": [r for r in log if r["step"] < step],
                                     "extra": {k: list(v) for k, v in (extra or {}).items()}})
    for _, d in _checkpoints(checkpoint.parent):
        if d != checkpoint:
            shutil.rmtree(d, ignore_errors=True)


def callback(key: dict, log: list[dict], extra: dict[str, list[dict]] | None = None) -> Any:
    """A Trainer callback that marks each checkpoint complete after the Trainer saved it (main process only)."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class ResumeCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001 - Trainer callback signature
            # No state after the last step: the Trainer saves one at the end, but a run resumed from it would train
            # a step beyond max_steps (transformers 5.19); the run directory holds the final weights instead.
            if state.global_step >= state.max_steps:
                control.should_save = False
            return control

        def on_save(self, args, state, control, **kw):  # noqa: ANN001 - Trainer callback signature
            from esrepro.runtime.distributed import barrier

            barrier()  # every process has written its part (RNG state, optimiser shard)
            if state.is_world_process_zero:
                folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
                mark_complete(folder, key, state.global_step, log, extra)

    return ResumeCallback()


def resumable_trainer_class() -> type:
    """TRL's GRPOTrainer with a prompt sampler whose order in epoch ``e`` does not depend on the epochs this process
    iterated: TRL's ``RepeatSampler`` seeds its generator once and draws one permutation per epoch, so a run resumed
    in a later epoch would draw the first epoch's order again. Here ``set_epoch(e)`` (the Trainer calls it before
    each epoch) reseeds and draws the ``e`` earlier permutations, which an uninterrupted run has drawn anyway."""
    import torch
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    class EpochRepeatSampler(RepeatSampler):
        def set_epoch(self, epoch: int) -> None:
            if self.shuffle and self.seed is not None:
                self.generator.manual_seed(self.seed)
                for _ in range(epoch):
                    torch.randperm(self.num_samples, generator=self.generator)

    class ResumableGRPOTrainer(GRPOTrainer):
        def _get_train_sampler(self, dataset: Any = None) -> Any:
            sampler = super()._get_train_sampler(dataset)
            if type(sampler) is RepeatSampler:
                sampler.__class__ = EpochRepeatSampler  # the same sampler, with set_epoch
            return sampler

    return ResumableGRPOTrainer
