"""PRM800K data: the MATH problems of PRM800K's ``math_splits`` as ``train.jsonl`` and ``test.jsonl``.

PRM800K (Lightman et al. 2023, openai/prm800k) re-splits MATH: ``prm800k/math_splits/train.jsonl``
(12,000 problems: MATH's train split and 4,500 of its test problems) and ``test.jsonl`` (the
other 500, the set MATH500 is), each row ``problem``, ``solution``, ``answer``, ``subject``,
``level``, ``unique_id``. ESSA (Korotyshova et al.) fine-tunes on the first problems of the train
split (3,600 for PRM800K: ``sft_examples``) and aligns on the ones after them.

Source kinds (see :mod:`esrepro.tasks.sources`):

* ``generated``: the hand-written MATH-format items of ``data/embedded_prm800k.yaml`` (12 train,
  6 test; NOT PRM800K problems, ``source`` is ``EMBEDDED``); ``n_train``/``n_test`` keep the first;
* ``url``: the release's files at a pinned commit, each verified against its sha256
  (:mod:`esrepro.tasks.url_sources`; ``config/paper.yaml``);
* ``local``: a folder with ``train.jsonl`` and ``test.jsonl`` (the release's ``math_splits``
  folder), a ``save_to_disk`` folder, or one file (train only);
* ``hub``: a dataset repository copy, ``repo_id`` and ``files`` given in the source (no default).

Rows: ``id``, ``problem``, ``solution`` (None when the source has none), ``answer``, ``answers``,
``subject``, ``level``, ``unique_id``, ``source``. Without an ``answer`` field the gold answer is
the last ``\\boxed{}`` of the solution.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from esrepro.tasks.math import last_boxed
from esrepro.tasks.math_answer import clean_answer
from esrepro.tasks.sources import (
    EMBEDDED,
    HubClient,
    capped,
    first_field,
    hub_splits,
    origin,
    rows_from_source,
    source_count,
    source_kind,
    write_prepared,
)
from esrepro.tasks.url_sources import url_files

TASK = "prm800k"
SOURCE_KINDS = ("generated", "local", "url", "hub")
SPLITS = ("train", "test")
EMBEDDED_FILE = "data/embedded_prm800k.yaml"


def embedded_items() -> dict[str, list[dict[str, Any]]]:
    """The hand-written stand-in items per split: ``{"train": [...], "test": [...]}``."""
    import yaml

    text = resources.files("esrepro.tasks").joinpath(EMBEDDED_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _gold(row: dict, idx: int, split: str, solution: str | None) -> str:
    """The row's gold answer: its ``answer`` field, else the last box of its solution."""
    raw = row.get("answer")
    if raw is None and solution is not None:
        raw = last_boxed(solution)
    answer = clean_answer(raw) if raw is not None else ""
    if not answer:
        raise ValueError(f"{TASK}: {split} row {idx} has no answer (no 'answer' field and no \\boxed{{}} in "
                         f"its 'solution'; fields: {sorted(row)})")
    return answer


def prm800k_row(row: dict, idx: int, split: str, label: str) -> dict:
    """One prepared row from a raw ``math_splits`` row (``label`` becomes its ``source``)."""
    if not isinstance(row, dict):
        raise ValueError(f"{TASK}: {split} row {idx} is not an object: {row!r:.80}")
    problem = first_field(row, ["problem", "question"], TASK, idx)
    solution = row.get("solution")
    solution = str(solution) if solution is not None else None
    answer = _gold(row, idx, split, solution)
    return {"id": f"{TASK}-{split}-{idx}", "problem": str(problem), "solution": solution, "answer": answer,
            "answers": [answer], "subject": row.get("subject"), "level": row.get("level"),
            "unique_id": row.get("unique_id"), "source": label}


def _embedded_rows(split: str, n: int | None) -> list[dict]:
    items = embedded_items()[split]
    rows = [prm800k_row({**item, "unique_id": f"embedded/{split}/{i}"}, i, split, EMBEDDED)
            for i, item in enumerate(items)]
    return rows[:n] if n is not None else rows


def prepare(out_dir: str | Path, source: dict, seed: int, *, hub: HubClient | None = None) -> dict[str, Any]:
    """Write the PRM800K splits of ``source`` under ``out_dir``; ``seed`` is unused (no sampling)."""
    kind = source_kind(TASK, source, SOURCE_KINDS)
    counts = {split: source_count(TASK, source, f"n_{split}", None) for split in SPLITS}
    if kind == "generated":
        return write_prepared(out_dir, {split: _embedded_rows(split, counts[split]) for split in SPLITS})
    raw, provenance = rows_from_source(TASK, source, _local_splits(source) if kind == "local" else SPLITS,
                                       ["train"], hub)
    label = origin(TASK, source)
    splits = {}
    for split, rows in raw.items():
        out = [prm800k_row(r, i, split, label) for i, r in enumerate(rows)]
        splits[split] = out[:counts.get(split)]  # n_<split>: the first rows; None: all
    return write_prepared(out_dir, splits, provenance)


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write; None where only the data can tell."""
    kind = source_kind(TASK, source, SOURCE_KINDS)
    counts = {split: source_count(TASK, source, f"n_{split}", None) for split in SPLITS}
    if kind == "generated":
        items = embedded_items()
        return {split: capped(len(items[split]), counts[split]) for split in SPLITS}
    if kind == "url":
        return {split: None for split in url_files(TASK, source)}
    if kind == "hub":
        splits = hub_splits(TASK, source)
        if not source.get("repo_id") or "train" not in splits:
            raise ValueError(f"{TASK}: a hub source needs 'repo_id' and 'files' with a 'train' split "
                             "(PRM800K has no catalogue default)")
        return {split: None for split in splits}
    return {split: None for split in _local_splits(source)}


def _local_splits(source: dict) -> tuple[str, ...]:
    """The splits a local source holds: one file is the train split alone (never train and test both)."""
    path = source.get("path")
    return ("train",) if path is not None and Path(path).is_file() else SPLITS
