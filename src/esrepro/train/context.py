"""The trainer seam: what every algorithm's trainer gets and gives back.

A trainer (``Algorithm.trainer``, e.g. ``esrepro.es.train:train_es``) trains one run and
returns its per-iteration log, a way to save the final weights, and what the manifest
should add; the ``train`` step writes the run directory, the same shape for every method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from esrepro.settings.methods import MethodSettings
from esrepro.tasks.base import Task


@dataclass(frozen=True)
class TrainContext:
    """One run's inputs."""

    method: str
    model: str  # registry key
    model_dir: Path  # the base model
    dtype: str
    chat: bool
    settings: MethodSettings
    task: Task
    examples: list[dict]
    seed: int
    run_dir: Path  # where resume state and kept snapshots go
    device: str = "cpu"
    eval_examples: list[dict] = field(default_factory=list)  # the test split, for periodic evaluation (eval_every)
    adapter_dir: Path | None = None  # a peft adapter on model_dir to train instead of every weight (GRPO only)


@dataclass
class TrainOutcome:
    """One run's results: the log (one row per iteration or step), a saver of the final weights, manifest extras."""

    log: list[dict]
    save: Callable[[Path], None]
    extra: dict[str, Any] = field(default_factory=dict)
    finish: Callable[[], None] = lambda: None  # called after the run directory is complete (e.g. drop resume state)


Trainer = Callable[[TrainContext], TrainOutcome]
