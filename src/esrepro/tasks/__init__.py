"""Task registry: ``get_task(name, **options)`` returns a Task instance."""

from __future__ import annotations

from typing import Any

from esrepro.tasks.base import Score, Task

_REGISTRY: dict[str, str] = {
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
}


# Data preparation per task: ``prepare(out_dir, source, seed) -> {split: {n, sha256}}``.
_PREPARERS: dict[str, str] = {
    "countdown": "esrepro.tasks.countdown:prepare",
    **{
        name: f"esrepro.tasks.task_data:prepare_{name}"
        for name in ("gsm8k", "math500", "minerva", "olympiad_bench", "aime24", "amc23", "sudoku", "arc", "conciseness")
    },
}


def _resolve(spec: str) -> Any:
    import importlib

    module, attr = spec.split(":")
    return getattr(importlib.import_module(module), attr)


def prepare_task(name: str, out_dir: str, source: dict, seed: int) -> dict:
    """Write ``out_dir/{split}.jsonl`` for task ``name`` from its configured ``source``."""
    if name not in _PREPARERS:
        raise KeyError(f"no data preparation for task {name!r}; known: {sorted(_PREPARERS)}")
    return _resolve(_PREPARERS[name])(out_dir, source, seed)


def known_tasks() -> list[str]:
    """Names of every registered task."""
    return sorted(_REGISTRY)


def get_task(name: str, **options: Any) -> Task:
    """Instantiate the task called ``name`` with ``options``."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown task {name!r}; known: {sorted(_REGISTRY)}")
    return _resolve(_REGISTRY[name])(**options)


__all__ = ["Score", "Task", "get_task", "known_tasks", "prepare_task"]
