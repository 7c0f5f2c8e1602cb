"""Task registry: ``get_task(name, **options)`` returns a Task instance."""

from __future__ import annotations

from typing import Any

from esrepro.tasks.base import Score, Task

_REGISTRY: dict[str, str] = {
    "countdown": "esrepro.tasks.countdown:CountdownTask",
    "gsm8k": "esrepro.tasks.gsm8k:GSM8KTask",
    "math500": "esrepro.tasks.math:MathTask",
    "minerva": "esrepro.tasks.math:MathTask",
    "olympiad_bench": "esrepro.tasks.math:MathTask",
    "aime24": "esrepro.tasks.math:MathTask",
    "amc23": "esrepro.tasks.math:MathTask",
    "sudoku": "esrepro.tasks.sudoku:SudokuTask",
    "arc": "esrepro.tasks.arc:ArcTask",
    "conciseness": "esrepro.tasks.conciseness:ConcisenessTask",
}


def get_task(name: str, **options: Any) -> Task:
    """Instantiate the task called ``name`` with ``options``."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown task {name!r}; known: {sorted(_REGISTRY)}")
    import importlib

    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = ["Score", "Task", "get_task"]
