"""Data of the five math sets (MATH500, Minerva, OlympiadBench, AIME24, AMC23): ``test.jsonl``.

Source kinds (see :mod:`esrepro.tasks.sources`):

* ``generated``: the hand-written MATH-format items of ``data/embedded_math.yaml``
  (twelve per set, NOT benchmark items; ``n_test`` is ignored);
* ``local``/``hub``: rows with fields ``problem`` and ``answer`` (``question`` and
  ``final_answer`` are accepted too, and the catalogue's ``fields`` name the
  columns of each hub set); ``n_test`` keeps the first ``n_test`` rows.

Rows: ``id``, ``problem``, ``answer`` (one string), ``answers`` (every accepted
string: an answer list is kept whole), ``source``; generated rows also ``solution``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from esrepro.tasks.math_answer import clean_answer
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
    write_prepared,
)

MATH_SETS = ("math500", "minerva", "olympiad_bench", "aime24", "amc23")
EMBEDDED_MATH_FILE = "data/embedded_math.yaml"
SOURCE_KINDS = ("generated", "local", "hub")


def _load_embedded_math() -> dict[str, list[dict[str, str]]]:
    import yaml

    text = resources.files("esrepro.tasks").joinpath(EMBEDDED_MATH_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


#: The hand-written items per set: ``[{"problem", "solution", "answer"}, ...]``.
EMBEDDED_MATH: dict[str, list[dict[str, str]]] = _load_embedded_math()


def _check_set(task: str) -> None:
    if task not in MATH_SETS:
        raise NotImplementedError(f"task {task!r} has no math data preparation; math sets: {list(MATH_SETS)}")


def math_row(task: str, row: dict, idx: int, fields: dict, source: str) -> dict:
    """One prepared row from a raw local or hub row (``source`` becomes its ``source``)."""
    problem = first_field(row, [fields.get("problem", "problem"), "problem", "question"], task, idx)
    raw = first_field(row, [fields.get("answer", "answer"), "answer", "final_answer"], task, idx)
    answers = [clean_answer(a) for a in (raw if isinstance(raw, (list, tuple)) else [raw])]
    answers = [a for a in answers if a]
    if not answers:
        raise ValueError(f"{task}: row {idx} has an empty answer")
    return {"id": f"{task}-{idx}", "problem": str(problem), "answer": answers[0], "answers": answers,
            "source": source}


def prepare(task: str, out_dir: str | Path, source: dict, seed: int, *, hub: HubClient | None = None) -> dict[str, Any]:
    """Write ``out_dir/test.jsonl`` for math set ``task``; ``seed`` is unused (no sampling)."""
    _check_set(task)
    kind = source_kind(task, source, SOURCE_KINDS)
    if kind == "generated":
        rows = [{"id": f"{task}-{i}", "problem": item["problem"], "solution": item["solution"],
                 "answer": item["answer"], "answers": [item["answer"]], "source": EMBEDDED}
                for i, item in enumerate(EMBEDDED_MATH[task])]
        return write_prepared(out_dir, {"test": rows})
    raw, provenance = rows_from_source(task, source, ["test"], ["test"], hub)
    fields = {**hub_defaults(task).get("fields", {}), **(source.get("fields") or {})}
    label = origin(task, source)
    rows = [math_row(task, r, i, fields, label) for i, r in enumerate(raw["test"])]
    n = source_count(task, source, "n_test", None)
    return write_prepared(out_dir, {"test": rows[:n] if n is not None else rows}, provenance)


def split_sizes(task: str, source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write; None where only the data can tell."""
    _check_set(task)
    kind = source_kind(task, source, SOURCE_KINDS)
    if kind == "generated":
        return {"test": len(EMBEDDED_MATH[task])}
    source_count(task, source, "n_test", None)
    if kind == "hub" and "test" not in hub_splits(task, source):
        raise ValueError(f"{task}: hub source files have no 'test' split")
    return {"test": None}
