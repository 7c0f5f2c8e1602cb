"""MATH training (v2): ES on MATH problems with the 0/1 boxed reward, evaluated on the five math sets.

The task grades like the math sets (:class:`~esrepro.tasks.math.MathTask`: the Qwen2.5-Math
prompt, the last ``\\boxed{}``, math-verify) and owns its training data:

* ``generated``: seeded arithmetic word problems in MATH's format, answered in ``\\boxed{}``
  (``n_train`` default 256, ``n_test`` default 64, operands up to ``max_number``, default 20;
  NOT MATH problems, ``source`` is ``EMBEDDED``): what the tiny model is warm-started on and
  trained with at the tiny scale;
* ``local``: a ``datasets.save_to_disk`` folder (the authors' ``math_lvl3to5_8k``, a
  DatasetDict with one ``train`` split, columns ``problem`` and ``answer``), or a folder or
  file of jsonl/parquet rows; its ``test`` split when it has one, else, when ``n_test`` is
  given, ``n_test`` rows held out of ``train`` by a seeded shuffle (none otherwise);
* ``hub``: a dataset repository with ``files: {train: {path}}`` (and optionally ``test``).

Rows: ``id``, ``problem``, ``answer``, ``answers``, ``source`` (generated rows also ``solution``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from esrepro.tasks.math import MathTask
from esrepro.tasks.math_answer import clean_answer
from esrepro.tasks.sources import (
    EMBEDDED,
    first_field,
    hub_splits,
    origin,
    rows_from_source,
    source_count,
    source_kind,
    split_counts,
    write_prepared,
)

if TYPE_CHECKING:
    from esrepro.tasks.sources import HubClient

TASK = "math_train"
SOURCE_KINDS = ("generated", "local", "hub")
DEFAULT_N_TRAIN = 256
DEFAULT_N_TEST = 64

_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jonas")
_THINGS = ("apples", "marbles", "books", "coins", "stamps", "pencils")


def generated_problem(rng: random.Random, max_number: int = 20) -> tuple[str, str, int]:
    """One arithmetic problem in MATH's style: (problem, worked solution ending in ``\\boxed{n}``, n); operands in
    2..max_number (products: 2..min(12, max_number))."""
    kind = rng.randrange(6)
    top = max(2, int(max_number))
    a, b = rng.randint(2, top), rng.randint(2, top)
    if kind == 0:
        n = a + b
        problem, work = f"Compute ${a} + {b}$.", f"${a} + {b} = {n}$."
    elif kind == 1:
        a, b = max(a, b), min(a, b)
        n = a - b
        problem, work = f"What is ${a} - {b}$?", f"${a} - {b} = {n}$."
    elif kind == 2:
        a, b = rng.randint(2, min(12, top)), rng.randint(2, min(12, top))
        n = a * b
        problem, work = f"Compute ${a} \\times {b}$.", f"${a} \\times {b} = {n}$."
    elif kind == 3:
        n = a + b
        problem, work = f"Find $x$ if $x - {a} = {b}$.", f"$x = {b} + {a} = {n}$."
    elif kind == 4:
        name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
        n = a + b
        problem = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
        work = f"${a} + {b} = {n}$."
    else:
        k, q = rng.randint(2, min(9, top)), rng.randint(2, min(12, top))
        n, a = q, k * q
        problem, work = f"What is ${a} \\div {k}$?", f"${a} \\div {k} = {q}$."
    return problem, f"{work} The answer is $\\boxed{{{n}}}$.", n


def generated_rows(n_train: int, n_test: int, seed: int, max_number: int = 20) -> tuple[list[dict], list[dict]]:
    """(train, test) of distinct generated problems drawn with ``random.Random(f"math_train-{seed}")``."""
    rng = random.Random(f"{TASK}-{seed}")
    seen: set[str] = set()
    rows: list[dict] = []
    tries = 0
    while len(rows) < n_train + n_test:
        tries += 1
        if tries > 200 * (n_train + n_test) + 1000:
            raise ValueError(f"{TASK}: cannot draw {n_train + n_test} distinct generated problems")
        problem, solution, n = generated_problem(rng, max_number)
        if problem in seen:
            continue
        seen.add(problem)
        split = "train" if len(rows) < n_train else "test"
        rows.append({"id": f"{TASK}-{split}-{len(rows)}", "problem": problem, "solution": solution,
                     "answer": str(n), "answers": [str(n)], "source": EMBEDDED})
    return rows[:n_train], rows[n_train:]


def sft_completion(example: dict) -> str:
    """A correct continuation of the Qwen2.5-Math prompt for a generated problem: its worked solution."""
    solution = example.get("solution")
    if not solution:
        raise ValueError(f"{TASK} example {example.get('id')!r} has no solution")
    return solution


def _row(row: dict, idx: int, split: str, label: str) -> dict:
    problem = first_field(row, ["problem", "question", "input"], TASK, idx)
    raw = first_field(row, ["answer", "gt_answer", "ground_truth_answer", "target"], TASK, idx)
    answers = [a for a in (clean_answer(x) for x in (raw if isinstance(raw, (list, tuple)) else [raw])) if a]
    if not answers:
        raise ValueError(f"{TASK}: {split} row {idx} has an empty answer")
    return {"id": f"{TASK}-{split}-{idx}", "problem": str(problem), "answer": answers[0], "answers": answers,
            "source": label}


def prepare(out_dir: str | Path, source: dict, seed: int, *, hub: HubClient | None = None) -> dict[str, Any]:
    """Write ``train.jsonl`` (and ``test.jsonl`` when there is one) for MATH training."""
    kind = source_kind(TASK, source, SOURCE_KINDS)
    if kind == "generated":
        train, test = generated_rows(source_count(TASK, source, "n_train", DEFAULT_N_TRAIN),
                                     source_count(TASK, source, "n_test", DEFAULT_N_TEST), seed,
                                     source_count(TASK, source, "max_number", 20))
        return write_prepared(out_dir, {"train": train, "test": test})
    raw, provenance = rows_from_source(TASK, source, ["train", "test"], ["train"], hub)
    label = origin(TASK, source)
    splits = {split: [_row(r, i, split, label) for i, r in enumerate(rows)] for split, rows in raw.items()}
    n_test = source_count(TASK, source, "n_test", None)
    if "test" not in splits and n_test:
        order = list(range(len(splits["train"])))
        random.Random(f"{TASK}-holdout-{seed}").shuffle(order)
        held = set(order[:n_test])
        splits["test"] = [r for i, r in enumerate(splits["train"]) if i in held]
        splits["train"] = [r for i, r in enumerate(splits["train"]) if i not in held]
        provenance = {**provenance, "test_held_out_of_train": n_test}
    elif "test" in splits and n_test is not None:
        splits["test"] = splits["test"][:n_test]
    n_train = source_count(TASK, source, "n_train", None)
    if n_train is not None:
        splits["train"] = splits["train"][:n_train]
    return write_prepared(out_dir, splits, provenance)


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write; None where only the data can tell."""
    kind = source_kind(TASK, source, SOURCE_KINDS)
    counts = split_counts(TASK, source, kind, {"train": DEFAULT_N_TRAIN, "test": DEFAULT_N_TEST})
    if kind == "generated":
        return counts
    if kind == "hub" and "train" not in hub_splits(TASK, source):
        raise ValueError(f"{TASK}: hub source files have no 'train' split")
    return {"train": None, "test": None}


class MathTrainTask(MathTask):
    """MATH training problems with the authors' 0/1 boxed reward (options as :class:`MathTask`)."""

    name: ClassVar[str] = TASK

    @classmethod
    def prepare(cls, out_dir: str | Path, source: dict, seed: int, *, hub: HubClient | None = None) -> dict[str, Any]:
        """Training data (the module-level :func:`prepare`)."""
        return prepare(out_dir, source, seed, hub=hub)

    @classmethod
    def split_sizes(cls, source: dict) -> dict[str, int | None]:
        """Rows :meth:`prepare` will write (the module-level :func:`split_sizes`)."""
        return split_sizes(source)
