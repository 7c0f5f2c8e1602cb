"""The Countdown task: combine the given numbers with + - * / to reach a target.

Prompt and reward follow the ES authors' release (VsonicV/es-fine-tuning-paper:
``countdown/countdown_task.py`` and the prompts stored in their ``countdown.json``);
TinyZero's ``compute_score`` is kept as a second, named reward. Model text is
never passed to ``eval``: expressions go through :mod:`esrepro.tasks.safe_arith`.

The authors' regexes are re-implemented with ``str.find`` scans that accept
exactly the same strings: the lazy ``.*?`` patterns cost quadratic time on
adversarial text (many unclosed tags), which a training loop cannot afford.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, ClassVar, Sequence

from esrepro.data.fetch import fetch_url
from esrepro.tasks.base import Score, Task
from esrepro.tasks.safe_arith import try_safe_eval
from esrepro.tasks.sources import write_prepared

# ---------------------------------------------------------------------------------------------
# Prompt

_PROMPT_TEMPLATE = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer.Using the numbers [{numbers}], create an "
    "equation that equals {target}. You can use basic arithmetic operations (+, -, *, /) and "
    "each number can only be used once. Show your work in <think> </think> tags. And return "
    "the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    "Let me solve this step by step.\n<think>"
)


def authors_prompt(numbers: Sequence[int], target: str | int) -> str:
    """The authors' Countdown prompt (their ``context`` field), ending in ``<think>``.

    The numbers are printed as ``str(numpy.array(numbers))`` prints them: right-aligned
    to the widest, so ``[2, 54, 17]`` reads ``[ 2 54 17]``. ``target`` is written as
    given: pass the string from their file (e.g. ``"243.2"``).
    """
    width = max((len(str(n)) for n in numbers), default=0)
    shown = " ".join(str(n).rjust(width) for n in numbers)
    return _PROMPT_TEMPLATE.format(numbers=shown, target=target)


# ---------------------------------------------------------------------------------------------
# Tag scanning (linear-time equivalents of the authors' DOTALL regexes)

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_FULL_FORMAT_MIDDLE = _THINK_CLOSE + "\n" + _ANSWER_OPEN
_AUTHORS_ALLOWED = re.compile(r"^[0-9+\-*/() ]+$")
_TINYZERO_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")
_DIGIT_RUN = re.compile(r"\d+")


def _has_block(text: str, open_tag: str, close_tag: str) -> bool:
    """``re.search(open + ".*?" + close, text, re.DOTALL) is not None``."""
    start = text.find(open_tag)
    return start != -1 and text.find(close_tag, start + len(open_tag)) != -1


def _is_full_format(text: str) -> bool:
    r"""``re.match(r"^<think>.*?</think>\n<answer>.*?</answer>$", text, re.DOTALL)``.

    ``$`` also matches before one final newline, so both ends are tried.
    """
    if not text.startswith(_THINK_OPEN):
        return False
    ends = [len(text)] + ([len(text) - 1] if text.endswith("\n") else [])
    for end in ends:
        if text.endswith(_ANSWER_CLOSE, 0, end):
            middle_end = end - len(_ANSWER_CLOSE)
            if text.find(_FULL_FORMAT_MIDDLE, len(_THINK_OPEN), middle_end) != -1:
                return True
    return False


def _last_answer(text: str) -> str | None:
    """Group 1 of the last match of ``re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)``."""
    last, pos = None, 0
    while (start := text.find(_ANSWER_OPEN, pos)) != -1:
        end = text.find(_ANSWER_CLOSE, start + len(_ANSWER_OPEN))
        if end == -1:  # no later opening tag can be closed either
            break
        last, pos = text[start + len(_ANSWER_OPEN) : end], end + len(_ANSWER_CLOSE)
    return last


def _uses_exactly(expr: str, numbers: Sequence[int]) -> bool:
    r"""``sorted(int(n) for n in re.findall(r"\d+", expr)) == sorted(numbers)``.

    Compared as canonical digit strings, so a huge digit run costs nothing (the
    original ``int()`` raises past 4,300 digits). A run of non-ASCII digits counts
    as a mismatch; the original would accept e.g. Arabic-Indic digits here, but
    such text then fails to evaluate, so every reward comes out the same.
    """
    runs = _DIGIT_RUN.findall(expr)
    if len(runs) != len(numbers) or not all(run.isascii() for run in runs):
        return False
    return sorted(run.lstrip("0") or "0" for run in runs) == sorted(str(int(n)) for n in numbers)


# ---------------------------------------------------------------------------------------------
# The authors' reward


def format_reward(text: str) -> float:
    """The authors' ``format_reward_function``: 1.0 for the full format, else 0.1 + 0.5 parts.

    ``text`` is scored as given; :func:`authors_reward` prepends ``"<think>"``.
    """
    if _is_full_format(text):
        return 1.0
    reward = 0.0
    if _has_block(text, _THINK_OPEN, _THINK_CLOSE):
        reward += 0.1
    if _has_block(text, _ANSWER_OPEN, _ANSWER_CLOSE):
        reward += 0.5
    return reward


def answer_reward(response: str, numbers: Sequence[int], target: str | float) -> float:
    """The authors' ``answer_reward_function``: 1.0 iff the last answer uses exactly
    ``numbers`` and evaluates to within 1e-5 of ``float(target)``."""
    content = _last_answer(response)
    if not content or not _AUTHORS_ALLOWED.match(content) or not _uses_exactly(content, numbers):
        return 0.0
    value = try_safe_eval(content)
    return 1.0 if value is not None and abs(value - float(target)) < 1e-5 else 0.0


def authors_reward(response: str, numbers: Sequence[int], target: str | float) -> dict[str, float]:
    """The authors' ``reward_function`` on a continuation (the prompt ends in ``<think>``).

    Returns ``{"reward": 0.1 * format + answer, "format": ..., "answer": ...}``.
    """
    fmt = format_reward(_THINK_OPEN + response)
    ans = answer_reward(response, numbers, target)
    return {"reward": fmt * 0.1 + ans, "format": fmt, "answer": ans}


# ---------------------------------------------------------------------------------------------
# TinyZero's reward

TINYZERO_VARIANTS = ("upstream", "es")


def tinyzero_equation(solution_str: str, variant: str = "upstream") -> str | None:
    """TinyZero's ``extract_solution``: the stripped content of the last ``<answer>``.

    ``upstream`` (Jiayi-Pan/TinyZero): the text after the first ``"Assistant:"``
    (else after ``"<|im_start|>assistant"``, else ``None``), then only its LAST LINE.
    ``es`` (the authors' copy in ``baselines/PPO``): the whole text when neither
    marker is present, all lines (DOTALL).
    """
    _check_variant(variant)
    text: str | None = solution_str
    for marker in ("Assistant:", "<|im_start|>assistant"):
        if marker in solution_str:
            text = solution_str.split(marker, 1)[1]
            break
    else:
        text = None if variant == "upstream" else solution_str
    if text is None:
        return None
    if variant == "upstream":
        text = text.split("\n")[-1]
    answer = _last_answer(text)
    return None if answer is None else answer.strip()


def tinyzero_score(
    solution_str: str,
    numbers: Sequence[int],
    target: str | float,
    *,
    variant: str = "upstream",
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """TinyZero's ``compute_score``: ``score`` if correct, ``format_score`` if an equation
    was extracted but is wrong, invalid or unevaluable, 0 if none was extracted.

    Differences from the original: evaluation uses :func:`safe_eval` (``**`` and ``//``,
    which ``eval`` would compute, are refused and so earn ``format_score``); ``target``
    may be a string (compared as ``float``); nothing is printed and the global
    ``random`` state is not touched (the original draws ``random.randint`` per call).
    The ``es`` variant cuts the equation at the first ``"="`` before checking it.
    """
    equation = tinyzero_equation(solution_str, variant)
    if equation is None:
        return 0.0
    if variant == "es" and "=" in equation:
        equation = equation.split("=")[0].strip()
    if not _uses_exactly(equation, numbers) or not _TINYZERO_ALLOWED.match(equation):
        return format_score
    value = try_safe_eval(equation, allow_decimal=True)
    if value is None or not abs(value - float(target)) < 1e-5:
        return format_score
    return score


def _check_variant(variant: str) -> None:
    if variant not in TINYZERO_VARIANTS:
        raise ValueError(f"unknown TinyZero variant {variant!r}; known: {TINYZERO_VARIANTS}")


# ---------------------------------------------------------------------------------------------
# The task

REWARDS = ("authors", "tinyzero", "tinyzero_es")


class CountdownTask(Task):
    """Countdown with the authors' prompt.

    Option ``reward``: ``"authors"`` (default; 0.1 * format + answer, max 1.1),
    ``"tinyzero"`` (upstream ``compute_score`` on ``"Assistant:" + response``, i.e. as
    TinyZero sees a continuation of its own prompt) or ``"tinyzero_es"`` (the authors'
    PPO-baseline copy of it, on the response alone). ``correct`` is answer == 1.
    """

    name = "countdown"
    data_module: ClassVar[str | None] = __name__  # prepare() and split_sizes() below

    def __init__(self, reward: str = "authors", **options: Any) -> None:
        if reward not in REWARDS:
            raise ValueError(f"countdown: unknown reward {reward!r}; known: {REWARDS}")
        super().__init__(reward=reward, **options)
        self.reward = reward


    def prompt(self, example: dict) -> str:
        """The authors' prompt for ``example``."""
        return authors_prompt(example["numbers"], example["target"])

    def score(self, response: str, example: dict) -> Score:
        """Grade the generated continuation ``response`` (prompt excluded)."""
        numbers, target = example["numbers"], example["target"]
        if self.reward == "authors":
            r = authors_reward(response, numbers, target)
            return Score(r["reward"], r["answer"] == 1.0, {"format": r["format"], "answer": r["answer"]})
        variant = "upstream" if self.reward == "tinyzero" else "es"
        text = "Assistant:" + response if variant == "upstream" else response
        reward = tinyzero_score(text, numbers, target, variant=variant)
        extracted = tinyzero_equation(text, variant) is not None
        answer = 1.0 if reward == 1.0 else 0.0
        return Score(reward, answer == 1.0, {"format": float(extracted), "answer": answer})


# ---------------------------------------------------------------------------------------------
# Problems: generated and the authors' file

_OPS = ("+", "-", "*", "/")
_MAX_DRAWS_PER_PROBLEM = 10_000


def generate_problems(
    n: int,
    seed: int,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 99,
    max_target: int = 1000,
) -> list[dict]:
    """``n`` distinct, solvable problems drawn with ``random.Random(seed)``.

    Each draws 3-4 numbers in [1, max_number] and combines them all, pairing two
    random items at a time with a random operator (``/`` only when exact), into a
    fully parenthesised solution; draws whose value is not in [1, max_target], or
    that repeat an earlier (numbers, target), are redrawn. Ids run 0..n-1. The
    first k problems of a seed do not depend on ``n``.
    """
    if not 2 <= min_numbers <= max_numbers or max_number < 1 or max_target < 1 or n < 0:
        raise ValueError("need n >= 0, 2 <= min_numbers <= max_numbers, max_number >= 1, max_target >= 1")
    rng = random.Random(seed)
    seen: set[tuple[tuple[int, ...], str]] = set()
    problems: list[dict] = []
    while len(problems) < n:
        numbers, value, solution = _draw_problem(rng, min_numbers, max_numbers, max_number, max_target, seen)
        seen.add(_problem_key(numbers, str(value)))
        problems.append({"id": len(problems), "numbers": numbers, "target": str(value), "solution": solution})
    return problems


def _draw_problem(
    rng: random.Random,
    min_numbers: int,
    max_numbers: int,
    max_number: int,
    max_target: int,
    seen: set[tuple[tuple[int, ...], str]],
) -> tuple[list[int], int, str]:
    """Draw until a new problem with a target in range comes up."""
    for _ in range(_MAX_DRAWS_PER_PROBLEM):
        numbers = [rng.randint(1, max_number) for _ in range(rng.randint(min_numbers, max_numbers))]
        value, solution = _combine(numbers, rng)
        if 1 <= value <= max_target and _problem_key(numbers, str(value)) not in seen:
            return numbers, value, solution
    raise RuntimeError(f"no new countdown problem in {_MAX_DRAWS_PER_PROBLEM} draws; widen the ranges")


def _combine(numbers: list[int], rng: random.Random) -> tuple[int, str]:
    """Combine all numbers pairwise in random order with random exact operators."""
    items = [(n, str(n)) for n in numbers]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a, ea), (b, eb) = items[i], items[j]
        ops = [op for op in _OPS if op != "/" or (b != 0 and a % b == 0)]
        op = rng.choice(ops)
        value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a // b
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(value, f"({ea} {op} {eb})")]
    return items[0]


def _problem_key(numbers: Sequence[int], target: str) -> tuple[tuple[int, ...], str]:
    return tuple(sorted(numbers)), target


def load_authors_json(path: str | Path) -> list[dict]:
    """Read the authors' ``countdown.json`` into examples {id, numbers, target, solution}.

    Checks every entry (id int, numbers a non-empty list of ints, target a numeric
    string, solution a string or null, context -- when present -- equal to
    :func:`authors_prompt`) and raises ValueError naming the file and the entry.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"countdown data not found: {path}")
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a JSON list of problems, got {type(entries).__name__}")
    return [_authors_entry(entry, k, path) for k, entry in enumerate(entries)]


def _authors_entry(entry: Any, index: int, path: Path) -> dict:
    """Validate and convert entry ``index`` of the authors' file."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: entry {index} (id {entry.get('id') if isinstance(entry, dict) else '?'}): {why}")

    if not isinstance(entry, dict):
        raise bad("not an object")
    missing = [k for k in ("id", "numbers", "target", "solution") if k not in entry]
    if missing:
        raise bad(f"missing {missing}")
    numbers, target, solution = entry["numbers"], entry["target"], entry["solution"]
    if not isinstance(entry["id"], int) or isinstance(entry["id"], bool):
        raise bad("id is not an integer")
    if not isinstance(numbers, list) or not numbers or not all(_is_int(x) for x in numbers):
        raise bad("numbers is not a non-empty list of integers")
    if not isinstance(target, str) or not _is_number(target):
        raise bad(f"target {target!r} is not a numeric string")
    if solution is not None and not isinstance(solution, str):
        raise bad("solution is neither a string nor null")
    if "context" in entry and entry["context"] != authors_prompt(numbers, target):
        raise bad("context differs from the authors' prompt template")
    return {"id": entry["id"], "numbers": list(numbers), "target": target, "solution": solution}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# prepare


def prepare(out_dir: str | Path, source: dict, seed: int) -> dict[str, Any]:
    """Write ``out_dir/train.jsonl`` and ``out_dir/test.jsonl``.

    Returns ``{"splits": {split: {"n", "sha256"}}, "provenance": {}}`` (the shape of
    every task's preparer, :func:`esrepro.tasks.sources.write_prepared`).

    ``source["kind"]``:
      * ``"generated"``: keys ``n_train``, ``n_test`` (optional generator arguments
        ``min_numbers``, ``max_numbers``, ``max_number``, ``max_target``); problems
        from :func:`generate_problems` with ``seed``, no (numbers, target) shared
        between splits.
      * ``"authors"``: ``path`` to a local ``countdown.json``, or ``url`` + ``sha256``
        + ``raw_dir`` to fetch it; train = first ``n_train`` (200), test = last
        ``n_test`` (2000), as in the paper. ``seed`` is unused.
    """
    kind = _require(source, "kind")
    if kind == "generated":
        train, test = _generated_splits(source, seed)
    elif kind == "authors":
        train, test = _authors_splits(source)
    else:
        raise _unknown_kind(kind)
    return write_prepared(out_dir, {"train": train, "test": test})


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write: ``n_train`` and ``n_test``.

    For ``authors`` these are the defaults 200 and 2000 unless given; :func:`prepare`
    fails when the file holds fewer than ``n_train + n_test`` problems.
    """
    kind = _require(source, "kind")
    if kind == "generated":
        return {"train": _count(source, "n_train"), "test": _count(source, "n_test")}
    if kind == "authors":
        return {"train": _count(source, "n_train", 200), "test": _count(source, "n_test", 2000)}
    raise _unknown_kind(kind)


def _unknown_kind(kind: Any) -> ValueError:
    return ValueError(f"countdown source key 'kind': unknown kind {kind!r}; known: 'generated', 'authors'")


def _require(source: dict, key: str) -> Any:
    if key not in source:
        raise ValueError(f"countdown source is missing key {key!r}")
    return source[key]


def _count(source: dict, key: str, default: int | None = None) -> int:
    value = source.get(key, default) if default is not None else _require(source, key)
    if not _is_int(value) or value < 0:
        raise ValueError(f"countdown source key {key!r} must be a non-negative integer, got {value!r}")
    return value


def _generated_splits(source: dict, seed: int) -> tuple[list[dict], list[dict]]:
    n_train, n_test = _count(source, "n_train"), _count(source, "n_test")
    options = {k: source[k] for k in ("min_numbers", "max_numbers", "max_number", "max_target") if k in source}
    problems = generate_problems(n_train + n_test, seed, **options)
    return problems[:n_train], problems[n_train:]


def _authors_splits(source: dict) -> tuple[list[dict], list[dict]]:
    if "path" in source:
        path = Path(source["path"])
    elif "url" in source:
        sha256, raw_dir = _require(source, "sha256"), _require(source, "raw_dir")
        path = fetch_url(source["url"], Path(raw_dir) / "countdown.json", sha256)
    else:
        raise ValueError("countdown source of kind 'authors' needs key 'path' or key 'url'")
    examples = load_authors_json(path)
    n_train, n_test = _count(source, "n_train", 200), _count(source, "n_test", 2000)
    if n_train + n_test > len(examples):
        raise ValueError(f"{path}: n_train + n_test = {n_train + n_test} exceeds its {len(examples)} problems")
    return examples[:n_train], examples[len(examples) - n_test :]


# ---------------------------------------------------------------------------------------------
# Warm-start SFT


def sft_completion(example: dict) -> str:
    """A short correct continuation of the prompt (which ends in ``<think>``); scores 1.1."""
    solution = example.get("solution")
    if not solution:
        raise ValueError(f"countdown example {example.get('id')!r} has no solution")
    numbers = ", ".join(str(n) for n in example["numbers"])
    return f" Use {numbers} to make {example['target']}.</think>\n<answer>{solution}</answer>"
