"""ESSA's data: the SFT split, the alignment split's fitness subset and held-out problems, and SFT pairs.

The run reads the first ``sft_examples + fitness_examples + val_examples`` problems of a
task's prepared train split, in order: the LoRA SFT split, then the fixed subset of the
alignment split every candidate is scored on, then held-out alignment problems the
CMA-ES mean is scored on along the way. Each generation scores its candidates on the
whole fitness subset (the ESSA paper's main experiments), or with ``resample_per_step`` on
that many of its problems (the paper's Sec. 5.4), drawn without replacement from a
generator keyed on (run seed, generation): a pure function, so a resumed run draws the
same problems.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

_CALCULATOR = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class ESSASplits:
    """The three parts of an ESSA run's training problems."""

    sft: list[dict]
    fitness: list[dict]
    val: list[dict]


def split_examples(examples: Sequence[dict], sft: int, fitness: int, val: int) -> ESSASplits:
    """The first ``sft`` problems, the next ``fitness`` and the next ``val`` (too few is an error)."""
    need = sft + fitness + val
    if len(examples) < need:
        raise ValueError(f"ESSA needs {need} training problems (sft_examples {sft} + fitness_examples {fitness} + "
                         f"val_examples {val}), got {len(examples)}")
    examples = list(examples)
    return ESSASplits(examples[:sft], examples[sft:sft + fitness], examples[sft + fitness:need])


def generation_subset(seed: int, generation: int, pool: int, k: int | None) -> list[int]:
    """Indices (sorted) of the ``k`` fitness problems generation ``generation`` is scored on (all when None)."""
    if k is None or k >= pool:
        return list(range(pool))
    rng = np.random.default_rng([int(seed), int(generation), 0xE55A])
    return sorted(int(i) for i in rng.choice(pool, size=k, replace=False))


def gsm8k_completion(example: dict) -> str:
    """A worked GSM8K solution as an SFT target: the steps without calculator annotations, then the boxed answer."""
    solution = example.get("solution")
    if not solution:
        raise ValueError(f"gsm8k example {example.get('id')!r} has no worked solution to fine-tune on (hub/local "
                         "sources without solutions cannot feed ESSA's SFT split)")
    steps = _CALCULATOR.sub("", str(solution)).rsplit("####", 1)[0].strip()
    return f"{steps}\nThe answer is \\boxed{{{example['answer']}}}."


def sft_completion(task: str, example: dict) -> str:
    """The SFT target for ``example`` of ``task``: Countdown's warm-start completion, a worked GSM8K solution,
    or a math problem's ``solution`` field."""
    if task == "countdown":
        from esrepro.tasks.countdown import sft_completion as countdown_completion

        return countdown_completion(example)
    if task == "gsm8k":
        return gsm8k_completion(example)
    solution = example.get("solution")
    if isinstance(solution, str) and solution.strip():
        return solution
    raise ValueError(f"task {task!r}: example {example.get('id')!r} has no solution to build an SFT target from")


def sft_pairs(task, examples: Sequence[dict]) -> list[tuple[str, str]]:
    """(prompt, completion) pairs of the SFT split, prompts as the task writes them."""
    return [(task.prompt(e), sft_completion(task.name, e)) for e in examples]


def essa_sample_budget(settings: dict) -> int:
    """Scored training samples of an ESSA run: iterations (CMA-ES generations) x population x problems per
    generation."""
    per_step = settings.get("resample_per_step") or settings["fitness_examples"]
    return int(settings["iterations"]) * int(settings["population"]) * int(per_step)



def alignment_positions(sft: int, fitness: int, val: int, n: int) -> list[int]:
    """Train-split positions of the GRPO baseline's ``n`` problems: the alignment fold (after the ``sft`` SFT
    problems) without its held-out block (``sft + fitness`` to ``sft + fitness + val``): the fitness subset, then
    beyond, so the baseline never trains on the problems its held-out curve is scored on."""
    after = sft + fitness + val
    return [sft + i if i < fitness else after + i - fitness for i in range(n)]


def heldout_positions(sft: int, fitness: int, val: int) -> range:
    """Train-split positions of the reference run's held-out problems."""
    return range(sft + fitness, sft + fitness + val)


def baseline_problems_needed(sft: int, fitness: int, val: int, n: int) -> int:
    """How many train-split problems the GRPO baseline reads (its ``n`` problems and the held-out ones)."""
    positions = alignment_positions(sft, fitness, val, n)
    return max(positions[-1] + 1 if positions else 0, heldout_positions(sft, fitness, val).stop)
