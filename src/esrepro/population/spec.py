"""What the population layer is given: an engine recipe (its interface, :class:`EngineRecipe`) and the scoring,
both picklable and built inside whichever process evaluates members."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Sequence


class EngineRecipe(Protocol):
    """What the population layer needs of an engine's recipe (:class:`esrepro.backends.spec.EngineSpec` for ES,
    :class:`esrepro.essa.spec.ESSAEngineSpec` for ESSA): picklable, its torch threads, its backend, and a
    ``build()`` that makes the engine inside the process that evaluates members."""

    threads: int
    backend: str

    def build(self) -> Any: ...


@dataclass(frozen=True)
class Scoring:
    """What a member is scored on: the task (name and options), the training examples, the generation length."""

    task: str
    examples: list[dict]
    max_new_tokens: int
    options: dict = field(default_factory=dict)

    def build(self) -> tuple[list[str], Callable[..., float]]:
        """(prompts, mean reward of the responses to them); ``mean_reward(responses, batch)`` scores the responses
        to the prompts ``batch`` (indices; None: all of them, in order)."""
        from esrepro.tasks import get_task

        task = get_task(self.task, **self.options)
        prompts = [task.prompt(e) for e in self.examples]

        def mean_reward(responses: list[str], batch: Sequence[int] | None = None) -> float:
            import numpy as np

            examples = self.examples if batch is None else [self.examples[i] for i in batch]
            return float(np.mean([s.reward for s in task.score_many(responses, examples)]))

        return prompts, mean_reward


# --- ESSA -----------------------------------------------------------------------------------


def score_examples(task: Any, examples: list[dict], responses: list[str], fitness: str) -> list[float]:
    """Per-example scores: the task's reward, or 1/0 for correct/wrong (``fitness: accuracy``)."""
    scores = task.score_many(responses, examples)
    if fitness == "accuracy":
        return [1.0 if s.correct else 0.0 for s in scores]
    if fitness == "reward":
        return [float(s.reward) for s in scores]
    raise ValueError(f"fitness must be 'accuracy' or 'reward', got {fitness!r}")


@dataclass(frozen=True)
class IndexedScoring:
    """Candidates are scored on chosen examples of a fixed list (a generation's resampled subset, held-out ones)."""

    task: str
    examples: list[dict]
    max_new_tokens: int
    fitness: Literal["accuracy", "reward"] = "accuracy"
    options: dict = field(default_factory=dict)

    def build(self) -> tuple[list[str], Callable[[list[str], list[int]], list[float]]]:
        """(prompts of every example, per-example scores of the responses to the examples at ``indices``)."""
        from esrepro.tasks import get_task

        task = get_task(self.task, **self.options)
        prompts = [task.prompt(e) for e in self.examples]

        def scores(responses: list[str], indices: list[int]) -> list[float]:
            return score_examples(task, [self.examples[i] for i in indices], responses, self.fitness)

        return prompts, scores
