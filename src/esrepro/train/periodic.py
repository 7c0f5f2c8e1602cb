"""Periodic evaluation during training (v2, Figure 7): test accuracy against training-sample evaluations.

A method with ``eval_every: K`` evaluates its current weights greedily on the training task's
test split (the first ``eval_limit`` examples) once before training and after every K
iterations (ES) or optimiser steps (RL), and writes one row per point to
``<run>/periodic_eval.jsonl`` in the format :mod:`esrepro.report.sample_curves` reads::

    {"iteration": int, "samples": int, "accuracy": float, "reward": float, "split": "test", "n": int}

``samples`` counts training-sample evaluations so far (ES: iterations x population x prompts
per iteration; RL: steps x completions per step), so ES and RL share one x axis. Greedy
generation draws no random numbers, so evaluating does not change a run's trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from esrepro.io import write_jsonl
from esrepro.tasks.base import Task

PERIODIC_EVAL = "periodic_eval.jsonl"
SPLIT = "test"


def generation_length(settings: Any) -> int:
    """Tokens a periodic evaluation generates: ``eval_max_new_tokens``, else the method's own generation length."""
    return int(settings.eval_max_new_tokens or settings.max_new_tokens)


@dataclass
class PeriodicEval:
    """The periodic evaluation of one run: its test examples, interval, generation length and the points so far."""

    task: Task
    examples: list[dict]
    every: int
    max_new_tokens: int
    rows: list[dict] = field(default_factory=list)

    def due(self, done: int) -> bool:
        """Whether a point is due after ``done`` iterations or steps (0: the start)."""
        return done == 0 or done % self.every == 0

    def point(self, iteration: int, samples: int, generate: Callable[[list[str], int], list[str]]) -> dict:
        """Evaluate now (``generate(prompts, max_new_tokens)`` gives greedy responses); appends and returns the row."""
        responses = generate([self.task.prompt(e) for e in self.examples], self.max_new_tokens)
        scores = self.task.score_many(responses, self.examples)
        n = len(scores)
        row = {"iteration": int(iteration), "samples": int(samples), "split": SPLIT, "n": n,
               "accuracy": sum(s.correct for s in scores) / n, "reward": sum(float(s.reward) for s in scores) / n}
        self.rows.append(row)
        print(f"periodic evaluation: iteration {iteration}, samples {samples}: accuracy {row['accuracy']:.4f}, "
              f"reward {row['reward']:.4f} (n={n})", flush=True)
        return row


def periodic_of(settings: Any, task: Task, examples: list[dict]) -> PeriodicEval | None:
    """The run's periodic evaluation (None when ``eval_every`` is unset); ``examples``: the test split."""
    if getattr(settings, "eval_every", None) is None:
        return None
    limit = settings.eval_limit
    chosen = examples[:limit] if limit else list(examples)
    if not chosen:
        raise ValueError(f"eval_every is set but the {task.name} {SPLIT} split has no examples to evaluate on")
    return PeriodicEval(task, chosen, int(settings.eval_every), generation_length(settings))


def write_periodic(run_dir: str | Path, rows: list[dict]) -> Path:
    """Write ``<run>/periodic_eval.jsonl`` atomically."""
    path = Path(run_dir) / PERIODIC_EVAL
    write_jsonl(path, rows)
    return path


def clear_periodic(run_dir: str | Path) -> None:
    """Remove a previous run's ``periodic_eval.jsonl`` (a fresh start writes its own)."""
    (Path(run_dir) / PERIODIC_EVAL).unlink(missing_ok=True)


RL_EVAL_BATCH = 64  # prompts per generation batch of an RL run's periodic evaluation (eval_batch_size: null)


def policy_point(evaluation: PeriodicEval, step: int, per_step: int, model: Any, tokenizer: Any, device: str,
                 batch_size: int | None, chat: bool, alone: bool = False) -> dict:
    """A point of an RL run's periodic evaluation after ``step`` optimiser steps of ``per_step`` completions each,
    from the in-memory policy (``batch_size`` None: :data:`RL_EVAL_BATCH`); ``alone``: one process of several
    generates by itself (see :func:`model_generator`)."""
    generate = model_generator(model, tokenizer, device, int(batch_size or RL_EVAL_BATCH), chat, alone=alone)
    return evaluation.point(step, step * per_step, generate)


def model_generator(model: Any, tokenizer: Any, device: str, batch_size: int, chat: bool,
                    max_prompt_tokens: int | None = None, alone: bool = False) -> Callable[[list[str], int], list[str]]:
    """Greedy generation with an in-memory policy (RL trainers), in eval mode, restoring its mode afterwards.

    ``alone``: this process generates while the others wait (an FSDP2 policy whose weights the caller gathered on
    every process): transformers would otherwise step it in sync with the others (``synced_gpus``), which never
    come."""
    from esrepro.backends.hf import HFBackend

    backend = HFBackend.wrap(model, tokenizer, device=device, batch_size=batch_size, chat=chat,
                             max_prompt_tokens=max_prompt_tokens, synced_gpus=False if alone else None)

    def generate(prompts: list[str], max_new_tokens: int) -> list[str]:
        was_training = model.training
        model.eval()
        try:
            return backend.generate(prompts, max_new_tokens)
        finally:
            model.train(was_training)

    return generate
