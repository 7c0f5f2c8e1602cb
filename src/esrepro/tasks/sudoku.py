"""Sudoku: seeded puzzles with unique solutions, a Countdown-style prompt and a strict grader.

Grids are lists of row strings (``"1030"``), ``0`` marking a blank; sizes 4 (2x2
boxes), 6 (2x3) and 9 (3x3). :func:`generate_puzzle` draws a random full grid by
randomised backtracking and then removes givens in random order, keeping a
removal only while :func:`count_solutions` (a bitmask backtracking solver that
stops at 2) still finds exactly one solution. Everything depends only on the seed.

The prompt follows the authors' Countdown prompt (same preamble, ``<think>``
reasoning, answer in ``<answer> </answer>``, ends with ``<think>``). The grader
reads the last ``<answer>...</answer>`` block and parses it strictly: exactly
``size`` non-empty lines (surrounding whitespace of the block and of each line is
ignored), each exactly ``size`` digits in ``1..size``; anything else is
unparseable. Reward:

* default: 1.0 if the grid keeps every given and every row, column and box holds
  each digit once, else 0.0;
* option ``partial=True``: a parseable grid that keeps every given earns the
  fraction of the blanks that hold the (unique) solution's digit; a changed
  given or an unparseable answer earns 0.0.

``Score.correct`` is always the exact verdict.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, ClassVar, Sequence

from esrepro.tasks.base import Score, Task
from esrepro.tasks.sources import EMBEDDED, source_count, source_kind, write_prepared


TASK = "sudoku"
DEFAULT_N_TRAIN = 64
DEFAULT_N_TEST = 32

BOX_SHAPES: dict[int, tuple[int, int]] = {4: (2, 2), 6: (2, 3), 9: (3, 3)}

_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer.Solve this {n}x{n} Sudoku puzzle. Empty cells "
    "are written as 0. Fill them so that every row, every column and every {br}x{bc} box "
    "contains each of the digits 1 to {n} exactly once, without changing the given digits. "
    "The puzzle, one row per line:\n{grid}\nShow your work in <think> </think> tags. And return "
    "the final answer in <answer> </answer> tags: the completed grid with each row on its own "
    "line, written as {n} digits with no spaces or other characters."
    "Let me solve this step by step.\n<think>"
)

Grid = list[list[int]]


def _shape(n: int) -> tuple[int, int]:
    if n not in BOX_SHAPES:
        raise ValueError(f"unsupported Sudoku size {n}; supported: {sorted(BOX_SHAPES)}")
    return BOX_SHAPES[n]


def to_rows(grid: Grid) -> list[str]:
    """A grid as row strings (``0`` for blanks)."""
    return ["".join(str(v) for v in row) for row in grid]


def from_rows(rows: Sequence[str]) -> Grid:
    """Row strings back to a grid of ints."""
    return [[int(c) for c in row] for row in rows]


class _Board:
    """Bitmask bookkeeping for the solver: which digits each row, column and box uses."""

    def __init__(self, grid: Grid) -> None:
        self.n = n = len(grid)
        self.br, self.bc = _shape(n)
        self.grid = [list(r) for r in grid]
        self.rows = [0] * n
        self.cols = [0] * n
        self.boxes = [0] * n
        self.full = (1 << (n + 1)) - 2  # bits 1..n
        self.ok = True
        for r in range(n):
            for c in range(n):
                v = self.grid[r][c]
                if v:
                    bit = 1 << v
                    b = self.box(r, c)
                    if (self.rows[r] | self.cols[c] | self.boxes[b]) & bit:
                        self.ok = False
                    self.rows[r] |= bit
                    self.cols[c] |= bit
                    self.boxes[b] |= bit

    def box(self, r: int, c: int) -> int:
        return (r // self.br) * (self.n // self.bc) + c // self.bc

    def candidates(self, r: int, c: int) -> int:
        return self.full & ~(self.rows[r] | self.cols[c] | self.boxes[self.box(r, c)])

    def place(self, r: int, c: int, v: int) -> None:
        bit = 1 << v
        self.grid[r][c] = v
        self.rows[r] |= bit
        self.cols[c] |= bit
        self.boxes[self.box(r, c)] |= bit

    def unplace(self, r: int, c: int, v: int) -> None:
        mask = ~(1 << v)
        self.grid[r][c] = 0
        self.rows[r] &= mask
        self.cols[c] &= mask
        self.boxes[self.box(r, c)] &= mask

    def most_constrained_blank(self) -> tuple[int, int, int] | None:
        """(row, col, candidate mask) of the blank with fewest candidates, None if full."""
        best: tuple[int, int, int] | None = None
        best_count = self.n + 1
        for r in range(self.n):
            for c in range(self.n):
                if self.grid[r][c] == 0:
                    mask = self.candidates(r, c)
                    count = bin(mask).count("1")
                    if count < best_count:
                        best, best_count = (r, c, mask), count
                        if count <= 1:
                            return best
        return best


def _digits(mask: int) -> list[int]:
    return [v for v in range(1, mask.bit_length()) if mask >> v & 1]


def count_solutions(grid: Grid, limit: int = 2) -> int:
    """Number of completions of ``grid``, counting no further than ``limit``."""
    board = _Board(grid)
    if not board.ok:
        return 0
    found = 0

    def search() -> bool:  # True: stop, limit reached
        nonlocal found
        cell = board.most_constrained_blank()
        if cell is None:
            found += 1
            return found >= limit
        r, c, mask = cell
        for v in _digits(mask):
            board.place(r, c, v)
            stop = search()
            board.unplace(r, c, v)
            if stop:
                return True
        return False

    search()
    return found


def solve(grid: Grid) -> Grid | None:
    """One completion of ``grid`` (the first found), or None."""
    board = _Board(grid)
    if not board.ok:
        return None

    def search() -> bool:
        cell = board.most_constrained_blank()
        if cell is None:
            return True
        r, c, mask = cell
        for v in _digits(mask):
            board.place(r, c, v)
            if search():
                return True
            board.unplace(r, c, v)
        return False

    return [list(r) for r in board.grid] if search() else None


def _random_full_grid(n: int, rng: random.Random) -> Grid:
    board = _Board([[0] * n for _ in range(n)])

    def search() -> bool:
        cell = board.most_constrained_blank()
        if cell is None:
            return True
        r, c, mask = cell
        digits = _digits(mask)
        rng.shuffle(digits)
        for v in digits:
            board.place(r, c, v)
            if search():
                return True
            board.unplace(r, c, v)
        return False

    search()
    return [list(r) for r in board.grid]


def generate_puzzle(size: int, seed: int, max_blanks: int | None = None) -> dict[str, Any]:
    """A puzzle with exactly one solution: ``{"size", "puzzle", "solution", "n_blanks"}``.

    Givens are removed in a seeded random order while the solution stays unique,
    up to ``max_blanks`` blanks (default: as many as uniqueness allows).
    """
    _shape(size)
    rng = random.Random(f"sudoku-{size}-{seed}")
    solution = _random_full_grid(size, rng)
    puzzle = [list(r) for r in solution]
    cells = [(r, c) for r in range(size) for c in range(size)]
    rng.shuffle(cells)
    blanks = 0
    for r, c in cells:
        if max_blanks is not None and blanks >= max_blanks:
            break
        v = puzzle[r][c]
        puzzle[r][c] = 0
        if count_solutions(puzzle, 2) == 1:
            blanks += 1
        else:
            puzzle[r][c] = v
    return {"size": size, "puzzle": to_rows(puzzle), "solution": to_rows(solution), "n_blanks": blanks}


def sudoku_prompt(puzzle_rows: Sequence[str]) -> str:
    """The Countdown-style prompt for a puzzle, ending in ``<think>``."""
    n = len(puzzle_rows)
    br, bc = _shape(n)
    return _PROMPT.format(n=n, br=br, bc=bc, grid="\n".join(puzzle_rows))


#: Longest answer block parsed (whitespace included): bounds the work, not the layout.
MAX_BLOCK_CHARS = 1 << 16


def last_answer_block(text: str) -> str | None:
    """Content of the last complete ``<answer>...</answer>`` block (linear-time scan)."""
    close = text.rfind("</answer>")
    if close == -1:
        return None
    start = text.rfind("<answer>", 0, close)
    return None if start == -1 else text[start + len("<answer>") : close]


def parse_grid(block: str, n: int) -> Grid | None:
    """A strictly formatted ``n``x``n`` grid of digits 1..n from an answer block, or None."""
    if len(block) > MAX_BLOCK_CHARS:
        return None
    lines = block.strip().split("\n", n)  # the cap is on the raw block: indentation is not content
    if len(lines) != n:
        return None
    digits = "123456789"[:n]
    grid = []
    for line in lines:
        line = line.strip()
        if len(line) != n or any(ch not in digits for ch in line):
            return None
        grid.append([int(ch) for ch in line])
    return grid


def is_valid_solution(grid: Grid, puzzle: Grid) -> tuple[bool, bool]:
    """(keeps every given, satisfies every row/column/box constraint)."""
    n = len(puzzle)
    keeps = all(puzzle[r][c] in (0, grid[r][c]) for r in range(n) for c in range(n))
    full = set(range(1, n + 1))
    br, bc = _shape(n)
    rows_ok = all(set(row) == full for row in grid)
    cols_ok = all({grid[r][c] for r in range(n)} == full for c in range(n))
    boxes_ok = all(
        {grid[r][c] for r in range(r0, r0 + br) for c in range(c0, c0 + bc)} == full
        for r0 in range(0, n, br)
        for c0 in range(0, n, bc)
    )
    return keeps, rows_ok and cols_ok and boxes_ok


def cell_fraction(block: str, solution_rows: Sequence[str]) -> float:
    """Fraction of the solution's cells that a leniently read answer holds at the same place: the block's lines
    are read as digit strings (anything else dropped), row r column c compared with the solution's."""
    lines = [[ch for ch in line if ch.isdigit()] for line in block[:MAX_BLOCK_CHARS].split("\n")]
    lines = [line for line in lines if line]
    total = sum(len(r) for r in solution_rows)
    right = sum(1 for r, row in enumerate(solution_rows) if r < len(lines)
                for c, ch in enumerate(row) if c < len(lines[r]) and lines[r][c] == ch)
    return right / total if total else 0.0


def grade(response: str, example: dict, partial: bool | str = False) -> Score:
    """Grade a response against a puzzle example (see the module docstring)."""
    puzzle = from_rows(example["puzzle"])
    n = len(puzzle)
    block = last_answer_block(response)
    grid = parse_grid(block, n) if block is not None else None
    if partial == "cells":  # v2, a dense signal for the tiny model: any answer block earns its cells that match
        exact = grid is not None and all(is_valid_solution(grid, puzzle))
        reward = 1.0 if exact else (cell_fraction(block, example["solution"]) if block is not None else 0.0)
        return Score(reward, exact, {"formatted": block is not None, "parsed": grid is not None})
    if grid is None:
        return Score(0.0, False, {"formatted": block is not None, "parsed": False})
    keeps, valid = is_valid_solution(grid, puzzle)
    exact = keeps and valid
    reward = 1.0 if exact else 0.0
    details: dict[str, Any] = {"formatted": True, "parsed": True, "keeps_givens": keeps, "valid": valid}
    if partial and keeps and not exact:
        solution = from_rows(example["solution"])
        blanks = [(r, c) for r in range(n) for c in range(n) if puzzle[r][c] == 0]
        right = sum(grid[r][c] == solution[r][c] for r, c in blanks)
        reward = right / len(blanks) if blanks else 1.0
        details["blanks_right"] = right
    return Score(reward, exact, details)


# ---------------------------------------------------------------- data


def _counts(source: dict) -> tuple[int, int]:
    source_kind(TASK, source, ("generated",))
    n_train = source_count(TASK, source, "n_train", DEFAULT_N_TRAIN)
    n_test = source_count(TASK, source, "n_test", DEFAULT_N_TEST)
    return n_train, n_test


def prepare(out_dir: str | Path, source: dict, seed: int) -> dict[str, Any]:
    """Sudoku (``generated`` only) -> ``train.jsonl``, ``test.jsonl``.

    Keys: ``n_train`` (default 64), ``n_test`` (default 32), ``size`` (4, 6 or 9;
    default 4), ``max_blanks`` (optional cap on blanks per puzzle). Puzzle ``k`` is
    :func:`generate_puzzle` with seed ``seed * 1_000_003 + k``; no puzzle appears twice.
    """
    n_train, n_test = _counts(source)
    size = source.get("size", 4)
    max_blanks = source_count(TASK, source, "max_blanks", None)
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
    return write_prepared(out_dir, {"train": rows[:n_train], "test": rows[n_train:]})


def split_sizes(source: dict) -> dict[str, int | None]:
    """Rows per split :func:`prepare` will write: ``n_train`` and ``n_test``."""
    n_train, n_test = _counts(source)
    if source.get("size", 4) not in BOX_SHAPES:
        raise ValueError(f"sudoku source key 'size': {source['size']!r} is not one of {sorted(BOX_SHAPES)}")
    source_count(TASK, source, "max_blanks", None)
    return {"train": n_train, "test": n_test}


class SudokuTask(Task):
    """Sudoku; option ``partial`` (bool, default False) as in the module docstring, or ``"cells"``: any answer
    block earns the fraction of the solution's cells it holds in place (:func:`cell_fraction`; v2, a training
    signal for the tiny model). ``correct`` is always the exact verdict."""

    name: ClassVar[str] = "sudoku"
    data_module: ClassVar[str | None] = __name__  # prepare() and split_sizes() below


    def prompt(self, example: dict) -> str:
        return sudoku_prompt(example["puzzle"])

    def score(self, response: str, example: dict) -> Score:
        partial = self.options.get("partial", False)
        return grade(response, example, partial=partial if partial == "cells" else bool(partial))


def sft_completion(example: dict) -> str:
    """A correct continuation of the prompt (which ends in ``<think>``): the solution grid in answer tags."""
    return " Fill every blank so each row, column and box has each digit once.</think>\n<answer>" + \
        "\n".join(example["solution"]) + "</answer>"
