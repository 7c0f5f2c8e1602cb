"""Task.score as a reward: the same grader ES optimises, in the shapes RL trainers call."""

from __future__ import annotations

import json
from typing import Any, Callable

from esrepro.tasks.base import Task

EXAMPLE_COLUMN = "example_json"


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # [{"role": "assistant", "content": ...}]
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    raise TypeError(f"unexpected completion type {type(completion).__name__}")


def trl_reward_func(task: Task) -> Callable[..., list[float]]:
    """A TRL ``reward_funcs`` entry: ``f(prompts, completions, example_json, **kw) -> rewards``.

    Each dataset row carries its example as JSON in :data:`EXAMPLE_COLUMN` (TRL passes
    extra dataset columns to reward functions as keyword lists).
    """

    def task_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        examples = [json.loads(s) for s in kwargs[EXAMPLE_COLUMN]]
        return [float(task.score(completion_text(c), e).reward) for c, e in zip(completions, examples, strict=True)]

    task_reward.__name__ = f"{task.name}_reward"
    return task_reward
