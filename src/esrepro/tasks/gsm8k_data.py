"""GSM8K data: ``train.jsonl`` and/or ``test.jsonl``.

Source kinds (see :mod:`esrepro.tasks.sources`):

* ``generated``: ``n_train`` (default 64) and ``n_test`` (default 32) seeded word
  problems in GSM8K's format (solution steps with ``<<a*b=c>>`` annotations, ending
  in ``#### <n>``); no question in both splits; ``source`` is ``EMBEDDED``;
* ``local``/``hub``: the splits the source has (the authors' ``train/gsm_8k`` has
  only ``train``, with bare answers); ``n_train``/``n_test`` keep the first rows.

Rows: ``id``, ``problem``, ``answer`` (the gold number), ``solution`` (the full
solution when known, else None), ``source``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from esrepro.tasks.gsm8k import gold_from_solution
from esrepro.tasks.sources import (
    EMBEDDED,
    HubClient,
    first_field,
    hub_defaults,
    hub_splits,
    origin,
    rows_from_source,
    source_count,
    source_kind,
    split_counts,
    write_prepared,
)

TASK = "gsm8k"
SOURCE_KINDS = ("generated", "local", "hub")
DEFAULT_N_TRAIN = 64
DEFAULT_N_TEST = 32

_NAMES = [("Ava", "she"), ("Ben", "he"), ("Chloe", "she"), ("Diego", "he"), ("Emma", "she"),
          ("Farid", "he"), ("Grace", "she"), ("Hiro", "he"), ("Isla", "she"), ("Jonas", "he")]


def generated_item(rng: random.Random) -> tuple[str, str, int]:
    """One generated word problem: (question, solution ending in ``#### n``, n)."""
    name, he = rng.choice(_NAMES)
    kind = rng.randrange(6)
    if kind == 0:
        a, b, c = rng.randint(3, 40), rng.randint(2, 9), rng.randint(2, 12)
        t = a + b * c
        q = f"{name} has {a} marbles. {he.capitalize()} buys {b} bags with {c} marbles in each bag. How many marbles does {he} have now?"
        s = f"{he.capitalize()} buys {b} * {c} = <<{b}*{c}={b * c}>>{b * c} marbles.\nNow {he} has {a} + {b * c} = <<{a}+{b * c}={t}>>{t} marbles."
    elif kind == 1:
        a, d = rng.randint(10, 60), rng.randint(2, 7)
        sold = rng.randint(1, a * d - 1)
        t = a * d - sold
        q = f"A baker makes {a} loaves of bread each day for {d} days and sells {sold} of them. How many loaves are left?"
        s = f"The baker makes {a} * {d} = <<{a}*{d}={a * d}>>{a * d} loaves.\n{a * d} - {sold} = <<{a * d}-{sold}={t}>>{t} loaves are left."
    elif kind == 2:
        w, h, k = rng.randint(8, 30), rng.randint(5, 40), rng.randint(2, 6)
        t = w * h * k
        q = f"{name} earns ${w} per hour and works {h} hours a week. How many dollars does {he} earn in {k} weeks?"
        s = f"In a week {he} earns {w} * {h} = <<{w}*{h}={w * h}>>{w * h} dollars.\nIn {k} weeks {he} earns {w * h} * {k} = <<{w * h}*{k}={t}>>{t} dollars."
    elif kind == 3:
        c, n = rng.randint(3, 12), rng.randint(15, 35)
        p = rng.randint(1, c * n // 4)
        t = c * n - p
        q = f"A school has {c} classes with {n} students each. If {p} students are absent, how many students are present?"
        s = f"The school has {c} * {n} = <<{c}*{n}={c * n}>>{c * n} students.\n{c * n} - {p} = <<{c * n}-{p}={t}>>{t} students are present."
    elif kind == 4:
        a = rng.randint(5, 80)
        t = 3 * a
        q = f"{name} read {a} pages on Monday and twice as many pages on Tuesday. How many pages did {he} read in the two days?"
        s = f"On Tuesday {he} read 2 * {a} = <<2*{a}={2 * a}>>{2 * a} pages.\nIn total {he} read {a} + {2 * a} = <<{a}+{2 * a}={t}>>{t} pages."
    else:
        k, t = rng.randint(2, 12), rng.randint(2, 25)
        m = k * t
        q = f"{m} pencils are shared equally among {k} students. How many pencils does each student get?"
        s = f"Each student gets {m} / {k} = <<{m}/{k}={t}>>{t} pencils."
    return q, f"{s}\n#### {t}", t


def generated_rows(n_train: int, n_test: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, test) of distinct generated problems drawn with ``random.Random(f"gsm8k-{seed}")``."""
    rng = random.Random(f"gsm8k-{seed}")
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < n_train + n_test:
        q, sol, t = generated_item(rng)
        if q in seen:
            continue
        seen.add(q)
        split = "train" if len(rows) < n_train else "test"
        rows.append({"id": f"gsm8k-{split}-{len(rows)}", "problem": q, "answer": str(t), "solution": sol,
                     "source": EMBEDDED})
    return rows[:n_train], rows[n_train:]


def gsm8k_row(row: dict, idx: int, split: str, source: str, fields: dict) -> dict:
    """One prepared row from a raw local or hub row (``source`` becomes its ``source``)."""
    problem = first_field(row, [fields.get("problem", "question"), "question", "problem"], TASK, idx)
    answer = str(first_field(row, [fields.get("answer", "answer"), "answer"], TASK, idx))
    return {"id": f"gsm8k-{split}-{idx}", "problem": str(problem), "answer": gold_from_solution(answer),
            "solution": answer if "####" in answer else None, "source": source}


def prepare(out_dir: str | Path, source: dict, seed: int, *, hub: HubClient | None = None) -> dict[str, Any]:
    """Write the GSM8K splits of ``source`` under ``out_dir``; ``seed`` drives the generator."""
    kind = source_kind(TASK, source, SOURCE_KINDS)
    if kind == "generated":
        n_train = source_count(TASK, source, "n_train", DEFAULT_N_TRAIN)
        n_test = source_count(TASK, source, "n_test", DEFAULT_N_TEST)
        train, test = generated_rows(n_train, n_test, seed)
        return write_prepared(out_dir, {"train": train, "test": test})
    raw, provenance = rows_from_source(TASK, source, ["train", "test"], [], hub)
    label = origin(TASK, source)
    fields = {**hub_defaults(TASK)["fields"], **(source.get("fields") or {})}
    splits = {}
    for split, rows in raw.items():
        n = source_count(TASK, source, f"n_{split}", None)
        out = [gsm8k_row(r, i, split, label, fields) for i, r in enumerate(rows)]
        splits[split] = out[:n] if n is not None else out
    return write_prepared(out_dir, splits, provenance)


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write; None where only the data can tell."""
    kind = source_kind(TASK, source, SOURCE_KINDS)
    counts = split_counts(TASK, source, kind, {"train": DEFAULT_N_TRAIN, "test": DEFAULT_N_TEST})
    if kind == "generated":
        return counts
    splits = hub_splits(TASK, source) if kind == "hub" else ["train", "test"]
    return {split: None for split in splits}
