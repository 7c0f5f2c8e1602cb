"""Sudoku: v2's 4x4 Mini Sudoku through Reasoning Gym (its puzzles, question text and reward).

The ES paper v2 (App. A.8) generates and scores its Sudoku puzzles with Reasoning Gym's
board-generation logic and reward function (Stojanovski et al., 2025). Here both come from the
``reasoning-gym`` package itself (pinned in pyproject.toml), never re-implemented:

* puzzles: its ``mini_sudoku`` dataset (``reasoning_gym.create_dataset``): item ``k`` of a
  dataset seeded ``s`` is drawn from ``Random(s + k)``: a random full 4x4 grid, then up to a
  random number in ``[min_empty, max_empty]`` of blanks removed while the solution stays unique
  (Reasoning Gym's defaults 8 and 12). :func:`generate` walks items ``0, 1, ...`` and keeps the
  first ``n`` distinct puzzles; :func:`prepare` puts the first ``n_train`` in ``train`` and the
  next ``n_test`` in ``test`` (v2: 1,000 unique puzzles, 800 / 200).
* prompt (v2 Fig. 11): the authors' Countdown preamble, Reasoning Gym's question (its rules and
  the puzzle, ``_`` for blanks) without its closing format line, and the Countdown-style answer
  instruction: ``<think>`` reasoning, the grid in ``<answer> </answer>`` tags, numbers separated
  by spaces and rows by newlines, the figure's example grid; it ends in ``<think>``.
* reward: Reasoning Gym's ``score_answer`` of the last ``<answer>...</answer>`` block, extracted
  by Reasoning Gym's own ``extract_answer`` (whitespace around the block stripped). It gives 1.0
  for the solution written exactly as the oracle (``"2 1 4 3\\n..."``, trailing spaces of a line
  ignored); otherwise 0.9 x the fraction of the 16 cells right, counting only lines with exactly
  four digits, in order (so ``2143`` rows earn at most 0.9); an answer longer than the oracle is
  scaled by ``len(oracle) / len(answer)``; no answer block: 0.0. ES trains on this reward, as v2
  does; accuracy (``Score.correct``) counts a puzzle solved when the score is 1.0.

``reasoning_gym`` takes about a second to import (it loads every one of its datasets), so it is
imported only when puzzles are generated or answers scored.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable

from esrepro.tasks.base import Score, Task
from esrepro.tasks.sources import EMBEDDED, source_count, source_kind, write_prepared

TASK = "sudoku"
DEFAULT_N_TRAIN = 64
DEFAULT_N_TEST = 32

#: Reasoning Gym's distribution name and dataset.
RG_PACKAGE = "reasoning-gym"
RG_DATASET = "mini_sudoku"
#: Reasoning Gym's MiniSudokuConfig defaults (blanks per puzzle) and its bounds (more than 12 blanks
#: cannot have a unique solution).
DEFAULT_MIN_EMPTY = 8
DEFAULT_MAX_EMPTY = 12
MAX_EMPTY = 12

#: The authors' Countdown preamble (v2 Fig. 11 begins with it).
PREAMBLE = ("You are a helpful assistant. You first think about the reasoning process in your mind "
            "and then provide the user with the answer. ")
#: v2 Fig. 11's answer instruction, its example grid included (as printed, not a valid Sudoku).
ANSWER_FORMAT = (
    "Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, "
    "with spaces separating each number within a row, and newlines separating rows. For example <answer>\n"
    "2 1 4 3\n4 3 2 1\n3 1 4 2\n1 2 3 4 </answer>. Let me solve this step by step.\n<think>"
)
#: Reasoning Gym's closing line of the question, which Fig. 11 replaces with ANSWER_FORMAT.
RG_FORMAT_LINE = "Format your response as the puzzle above"


def rg_version() -> str:
    """The installed reasoning-gym's version (its ``__version__`` attribute lags its releases)."""
    from importlib.metadata import version

    return version(RG_PACKAGE)


@lru_cache(maxsize=1)
def _rg_score_answer() -> Callable[[str | None, dict], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(RG_DATASET)


def blanks(source: dict) -> tuple[int, int]:
    """(min_empty, max_empty) of a source, checked as Reasoning Gym's MiniSudokuConfig would (with the key named)."""
    lo = source_count(TASK, source, "min_empty", DEFAULT_MIN_EMPTY)
    hi = source_count(TASK, source, "max_empty", DEFAULT_MAX_EMPTY)
    if lo > MAX_EMPTY:
        raise ValueError(f"{TASK} source key 'min_empty': {lo} is more than {MAX_EMPTY} (no unique solution)")
    if not lo <= hi <= MAX_EMPTY:
        raise ValueError(f"{TASK} source key 'max_empty': {hi} must be between min_empty ({lo}) and {MAX_EMPTY}")
    return lo, hi


def generate(n: int, seed: int, min_empty: int = DEFAULT_MIN_EMPTY, max_empty: int = DEFAULT_MAX_EMPTY,
             exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The first ``n`` distinct puzzles of Reasoning Gym's ``mini_sudoku`` seeded ``seed``, skipping those whose
    question is in ``exclude``: its entries (``question``, ``answer``, ``metadata``) as it makes them."""
    import reasoning_gym

    limit = 50 * n + 100
    dataset = reasoning_gym.create_dataset(RG_DATASET, seed=seed, size=limit, min_empty=min_empty,
                                           max_empty=max_empty)
    seen = set(exclude)
    out: list[dict[str, Any]] = []
    for k in range(limit):
        if len(out) == n:
            break
        entry = dataset[k]
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        out.append(entry)
    if len(out) < n:
        raise ValueError(f"{TASK}: cannot draw {n} distinct puzzles with {min_empty}-{max_empty} blanks "
                         f"(found {len(out)} in {limit} draws)")
    return out


def sudoku_prompt(question: str) -> str:
    """v2 Fig. 11's prompt around Reasoning Gym's ``question``, ending in ``<think>``."""
    cut = question.find(RG_FORMAT_LINE)
    if cut == -1:
        raise ValueError(f"{TASK}: the question has no {RG_FORMAT_LINE!r} line to replace: not Reasoning Gym's "
                         f"mini_sudoku text (reasoning-gym {rg_version()})")
    return PREAMBLE + question[:cut] + ANSWER_FORMAT


def sft_completion(example: dict) -> str:
    """A correct continuation of the prompt (which ends in ``<think>``): the solution in the answer format."""
    return " Fill every blank so each row, column and box has each number once.</think>\n<answer>\n" + \
        example["answer"] + "\n</answer>"


def extract(response: str) -> str | None:
    """The last ``<answer>...</answer>`` block, stripped, by Reasoning Gym's ``extract_answer``.

    The text after the last ``</answer>`` is cut first (it cannot change the result), so the regex never
    scans unclosed ``<answer>`` tags to the end again and again: linear in the response."""
    from reasoning_gym.utils import extract_answer

    end = response.rfind("</answer>")
    return None if end == -1 else extract_answer(response[: end + len("</answer>")], tag_name="answer")


def grade(response: str, example: dict) -> Score:
    """Reasoning Gym's reward of the response's answer (see the module docstring); correct when it is 1.0."""
    answer = extract(response)
    reward = float(_rg_score_answer()(answer, {"answer": example["answer"], "metadata": example["metadata"]}))
    return Score(reward, reward == 1.0, {"formatted": answer is not None})


# ---------------------------------------------------------------- data


def _counts(source: dict) -> tuple[int, int]:
    source_kind(TASK, source, ("generated",))
    n_train = source_count(TASK, source, "n_train", DEFAULT_N_TRAIN)
    n_test = source_count(TASK, source, "n_test", DEFAULT_N_TEST)
    return n_train, n_test


def prepare(out_dir: str | Path, source: dict, seed: int) -> dict[str, Any]:
    """Mini Sudoku from Reasoning Gym (``generated`` only) -> ``train.jsonl``, ``test.jsonl``.

    Keys: ``n_train`` (default 64), ``n_test`` (default 32), ``min_empty`` and ``max_empty`` (blanks per puzzle,
    Reasoning Gym's defaults 8 and 12). The ``n_train + n_test`` first distinct puzzles of :func:`generate` with
    ``seed``: train the first ``n_train``, test the rest; no puzzle appears twice. Each row is Reasoning Gym's
    entry (``question``, ``answer``, ``metadata``) with an ``id``; the provenance records the generator, its
    version and configuration.
    """
    n_train, n_test = _counts(source)
    lo, hi = blanks(source)
    entries = generate(n_train + n_test, seed, lo, hi)
    rows = [{"id": f"sudoku-{'train' if i < n_train else 'test'}-{i}", **e, "source": EMBEDDED}
            for i, e in enumerate(entries)]
    provenance = {"kind": "generated", "generator": f"{RG_PACKAGE} {RG_DATASET}", "version": rg_version(),
                  "config": {"seed": seed, "min_empty": lo, "max_empty": hi},
                  "items_drawn": rows[-1]["metadata"]["source_index"] + 1 if rows else 0}
    return write_prepared(out_dir, {"train": rows[:n_train], "test": rows[n_train:]}, provenance)


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write: ``n_train`` and ``n_test``."""
    n_train, n_test = _counts(source)
    blanks(source)
    return {"train": n_train, "test": n_test}


class SudokuTask(Task):
    """v2's 4x4 Mini Sudoku: Reasoning Gym's puzzles and reward, v2 Fig. 11's prompt (module docstring)."""

    name: ClassVar[str] = "sudoku"
    data_module: ClassVar[str | None] = __name__  # prepare() and split_sizes() below
    requires: ClassVar[tuple[str, ...]] = ("reasoning_gym",)  # puzzles and reward

    def __init__(self, **options: Any) -> None:
        if options:  # the reward is Reasoning Gym's, with no variants (the former `partial` options are gone)
            raise ValueError(f"task_options.sudoku: the sudoku task takes no options (got {sorted(options)}); its "
                             "reward is Reasoning Gym's score_answer")
        super().__init__()

    def prompt(self, example: dict) -> str:
        return sudoku_prompt(example["question"])

    def score(self, response: str, example: dict) -> Score:
        return grade(response, example)
