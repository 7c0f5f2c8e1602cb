"""The data files of the mirror: a real copy where one is at hand, else a stand-in built in the same format.

Each builder writes one task's file(s) and says what it was built from. Stand-ins keep the real files' format
and sizes (rows, columns, file type) so the loaders and the run's counts are exercised; their contents are
generated (esrepro's own generators) or converted from shared data, never the papers' data.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

from esrepro.io import sha256_file
from esrepro.tasks import gsm8k_data, math_train
from esrepro.tasks.countdown import authors_prompt, generate_problems
from esrepro.tasks.math_data import EMBEDDED_MATH

#: The shared Arrow member of each math set (the authors' evaluation_suite/math).
MATH_MEMBERS = {"math500": "math500", "aime24": "aime", "amc23": "amc", "minerva": "minerva",
                "olympiad_bench": "olympiad_bench"}
GSM8K_SIZES = {"train": 7473, "test": 1319}
PRM800K_SIZES = {"train": 12000, "test": 500}
MATH_TRAIN_SIZE = 8523  # the authors' math_lvl3to5_8k
COUNTDOWN_SIZE = 2200


def countdown_file(dest: Path, pinned_sha256: str, shared: Path | None, seed: int = 0) -> tuple[str, str]:
    """The authors' countdown.json at ``dest``: the shared copy when it matches the pin, else a stand-in in
    their JSON format from esrepro's generator; (origin, built_from)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    copy = shared / "countdown.json" if shared else None
    if copy is not None and copy.is_file() and sha256_file(copy) == pinned_sha256.lower():
        shutil.copyfile(copy, dest)
        return "copy", str(copy)
    problems = generate_problems(COUNTDOWN_SIZE, seed)
    rows = [{"id": p["id"], "context": authors_prompt(p["numbers"], p["target"]), "numbers": p["numbers"],
             "target": p["target"], "solution": p["solution"]} for p in problems]
    dest.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return "stand-in", f"esrepro.tasks.countdown.generate_problems({COUNTDOWN_SIZE}, seed={seed})"


def prm800k_file(split: str, dest: Path, seed: int = 0) -> tuple[str, str]:
    """A PRM800K ``math_splits/<split>.jsonl`` stand-in: its row count and columns, generated MATH-style
    arithmetic (esrepro.tasks.math_train's generator); (origin, built_from)."""
    rng = random.Random(f"prm800k-stand-in-{split}-{seed}")
    subjects = ["Prealgebra", "Algebra", "Number Theory", "Counting & Probability"]
    seen: set[str] = set()
    lines = []
    while len(lines) < PRM800K_SIZES[split]:
        problem, solution, answer = math_train.generated_problem(rng, 999)
        if problem in seen:
            continue
        seen.add(problem)
        subject = rng.choice(subjects)
        row = {"problem": problem, "solution": solution, "answer": str(answer), "subject": subject,
               "level": rng.randint(1, 5),
               "unique_id": f"{split}/{subject.lower().replace(' ', '_')}/{len(lines)}.json"}
        lines.append(json.dumps(row))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return "stand-in", f"esrepro.tasks.math_train.generated_problem (max_number 999), {len(lines)} rows"


def gsm8k_file(split: str, dest: Path, fields: dict[str, str], seed: int = 0) -> tuple[str, str]:
    """openai/gsm8k's ``main/<split>-00000-of-00001.parquet`` stand-in: its row count and columns (question, answer
    ending in ``#### n``), esrepro's GSM8K-format generator; (origin, built_from)."""
    train, test = gsm8k_data.generated_rows(GSM8K_SIZES["train"], GSM8K_SIZES["test"], seed)
    rows = train if split == "train" else test
    _write_table(dest, [{fields.get("problem", "question"): r["problem"], fields.get("answer", "answer"): r["solution"]}
                        for r in rows])
    return "stand-in", f"esrepro.tasks.gsm8k_data.generated_rows({GSM8K_SIZES['train']}, {GSM8K_SIZES['test']}, " \
                       f"seed={seed}), {split} split"


def math_set_file(task: str, dest: Path, fields: dict[str, str], shared: Path | None) -> tuple[str, str]:
    """A math set's hub file (its format from the path's suffix, its columns from the catalogue's fields): the
    shared Arrow folder's rows when present, else esrepro's hand-written MATH-style items; (origin, built_from)."""
    folder = shared / "datasets" / "evaluation_suite" / "math" / MATH_MEMBERS[task] if shared else None
    if folder is not None and (folder / "state.json").is_file():
        from datasets import load_from_disk

        raw = load_from_disk(str(folder)).to_list()
        source = f"the shared Arrow folder {folder}"
    else:
        raw = EMBEDDED_MATH[task]
        source = f"esrepro's hand-written items (esrepro.tasks.math_data.EMBEDDED_MATH[{task!r}])"
    rows = [{fields.get("problem", "problem"): r["problem"], fields.get("answer", "answer"): r["answer"]} for r in raw]
    _write_table(dest, rows)
    return "stand-in", f"{source}, {len(rows)} rows, columns renamed to the hub file's"


def math_train_folder(dest: Path, seed: int = 0) -> tuple[str, str]:
    """The authors' ``math_lvl3to5_8k`` stand-in: a ``datasets.save_to_disk`` DatasetDict with one ``train`` split of
    its row count and columns (problem, answer), esrepro's MATH-style generator; (origin, built_from)."""
    from datasets import Dataset, DatasetDict

    rows, _ = math_train.generated_rows(MATH_TRAIN_SIZE, 0, seed, max_number=999)
    DatasetDict({"train": Dataset.from_list([{"problem": r["problem"], "answer": r["answer"]} for r in rows])}
                ).save_to_disk(str(dest))
    return "stand-in", f"esrepro.tasks.math_train.generated_rows({MATH_TRAIN_SIZE}, max_number=999, seed={seed})"


def _write_table(dest: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as ``.parquet`` or ``.jsonl`` by ``dest``'s suffix."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), dest)
    elif dest.suffix == ".jsonl":
        dest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        raise ValueError(f"{dest}: no stand-in writer for {dest.suffix!r} files")
