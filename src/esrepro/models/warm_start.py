"""Warm-start data of the tiny model on several task formats (v2): generated (prompt, completion) pairs.

The tiny model knows nothing before its SFT, so ES (which only re-weights what the model
already does) needs a model that answers in each task's format sometimes correctly. Each
task here draws its own generated problems (never the prepared train/test rows: those are
excluded by content) and a correct completion in the format its grader reads:

* ``countdown``: the TinyZero-style generator (with the data source's number options);
* ``math_train``: arithmetic word problems with a worked solution ending in ``\\boxed{}``;
* ``gsm8k``: GSM8K-format word problems, their solution and ``\\boxed{}`` answer;
* ``sudoku``: Reasoning Gym's mini Sudoku puzzles (the data source's blanks), solved in answer tags;
* ``arc``: synthetic ARC-format tasks with simple rules (flips, transpose, recolouring), NOT
  ARC tasks, so ARC's training and evaluation sets stay unseen.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterable

Pair = tuple[str, str]

#: Seed offset of warm-start draws, so they never share a generator stream with prepared data.
SEED_OFFSET = 7_919


GENERATOR_OPTIONS = ("min_numbers", "max_numbers", "max_number", "max_target")


def fresh_countdown(n: int, seed: int, source: dict, exclude: list[dict]) -> list[dict]:
    """``n`` generated Countdown problems (the data source's generator options, ``seed``) none of which is a
    problem of ``exclude`` (same numbers and target): warm-start problems disjoint from the prepared data."""
    from esrepro.tasks.countdown import generate_problems

    banned = {(tuple(sorted(e["numbers"])), str(e["target"])) for e in exclude if "numbers" in e}
    options = {k: v for k, v in source.items() if k in GENERATOR_OPTIONS}
    probs = generate_problems(n + len(banned), seed=seed, **options)
    return [p for p in probs if (tuple(sorted(p["numbers"])), str(p["target"])) not in banned][:n]


def _countdown(n: int, seed: int, source: dict, banned: list[dict]) -> list[Pair]:
    from esrepro.tasks.countdown import CountdownTask, sft_completion

    task = CountdownTask()
    return [(task.prompt(p), sft_completion(p)) for p in fresh_countdown(n, seed + SEED_OFFSET, source, banned)]


def _math_train(n: int, seed: int, source: dict, banned: list[dict]) -> list[Pair]:
    from esrepro.tasks.math import qwen_math_prompt
    from esrepro.tasks.math_train import generated_rows, sft_completion

    seen = {e.get("problem") for e in banned}
    rows, _ = generated_rows(min(n + len(seen), 4 * n + 50), 0, seed + SEED_OFFSET, source.get("max_number", 20))
    keep = [r for r in rows if r["problem"] not in seen][:n]
    return [(qwen_math_prompt(r["problem"]), sft_completion(r)) for r in keep]


def _gsm8k(n: int, seed: int, source: dict, banned: list[dict]) -> list[Pair]:
    from esrepro.tasks.gsm8k_data import generated_rows
    from esrepro.tasks.math import qwen_math_prompt

    seen = {e.get("problem") for e in banned}
    rows, _ = generated_rows(n + len(seen), 0, seed + SEED_OFFSET)
    keep = [r for r in rows if r["problem"] not in seen][:n]
    return [(qwen_math_prompt(r["problem"]), f"{r['solution'].rsplit('####', 1)[0].strip()}\n"
             f"The answer is $\\boxed{{{r['answer']}}}$.") for r in keep]


def _sudoku(n: int, seed: int, source: dict, banned: list[dict]) -> list[Pair]:
    from esrepro.tasks.sudoku import blanks, generate, sft_completion, sudoku_prompt

    lo, hi = blanks(source)
    puzzles = generate(n, seed + SEED_OFFSET, lo, hi, exclude=[e["question"] for e in banned if "question" in e])
    return [(sudoku_prompt(p["question"]), sft_completion(p)) for p in puzzles]


def _arc(n: int, seed: int, source: dict, banned: list[dict]) -> list[Pair]:
    from esrepro.tasks.arc import arc_prompt, sft_completion, synthetic_example

    rng = random.Random(f"arc-warm-start-{seed}")
    out = []
    for _ in range(n):  # grids up to 6x6 and three pairs: prompts about as long as the 384 tokens ARC keeps
        e = synthetic_example(rng, max_side=6, pairs=3)
        out.append((arc_prompt(e), sft_completion(e)))
    return out


#: Task -> generator of ``n`` (prompt, completion) pairs: ``f(n, seed, data source, excluded rows)``.
GENERATORS: dict[str, Callable[[int, int, dict, list[dict]], list[Pair]]] = {
    "countdown": _countdown, "math_train": _math_train, "gsm8k": _gsm8k, "sudoku": _sudoku, "arc": _arc,
}


def task_pairs(task: str, n: int, seed: int, source: dict | None = None, banned: Iterable[dict] = ()) -> list[Pair]:
    """``n`` warm-start (prompt, completion) pairs of ``task``, none of them a row of ``banned``."""
    if task not in GENERATORS:
        raise KeyError(f"no warm-start generator for task {task!r}; known: {', '.join(GENERATORS)}")
    return GENERATORS[task](n, seed, dict(source or {}), list(banned))


def mixed_pairs(counts: dict[str, int], seed: int, sources: dict[str, dict], banned: dict[str, list[dict]],
                ) -> tuple[list[Pair], dict[str, Any], list[str]]:
    """Every task's pairs, shuffled together (seeded); returns (pairs, ``{task: count}``, each pair's task)."""
    tagged: list[tuple[Pair, str]] = []
    made = {}
    for task, n in counts.items():
        got = task_pairs(task, n, seed, sources.get(task, {}), banned.get(task, []))
        made[task] = len(got)
        tagged += [(pair, task) for pair in got]
    random.Random(f"warm-start-mix-{seed}").shuffle(tagged)
    return [p for p, _ in tagged], made, [t for _, t in tagged]
