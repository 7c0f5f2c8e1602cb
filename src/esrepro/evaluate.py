"""Greedy evaluation of a checkpoint on a task split."""

from __future__ import annotations

from dataclasses import dataclass

from tqdm import tqdm

from esrepro.backends.base import Backend
from esrepro.tasks.base import Task


@dataclass(frozen=True)
class EvalResult:
    """Per-example rows (prompt id, response, reward, correct, details) and their summary."""

    responses: list[dict]
    metrics: dict


def evaluate(
    backend: Backend, task: Task, examples: list[dict], max_new_tokens: int, batch_size: int, progress: bool = True
) -> EvalResult:
    """Generate greedily for every example in batches and grade each response."""
    rows: list[dict] = []
    for start in tqdm(range(0, len(examples), batch_size), desc=f"eval {task.name}", disable=not progress):
        chunk = examples[start : start + batch_size]
        outs = backend.generate([task.prompt(e) for e in chunk], max_new_tokens)
        for ex, resp, s in zip(chunk, outs, task.score_many(outs, chunk), strict=True):
            rows.append({"id": ex["id"], "response": resp, "reward": s.reward, "correct": s.correct, "details": s.details})
    n = len(rows)
    metrics = {
        "n": n,
        "accuracy": sum(r["correct"] for r in rows) / n if n else 0.0,
        "mean_reward": sum(r["reward"] for r in rows) / n if n else 0.0,
    }
    return EvalResult(rows, metrics)
