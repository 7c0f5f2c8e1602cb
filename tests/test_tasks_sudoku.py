"""Sudoku: unique-solution generation, prompt, strict parsing and grading."""

from __future__ import annotations

from pathlib import Path

import pytest

from esrepro.tasks import get_task, sudoku
from esrepro.tasks.sudoku import (
    count_solutions,
    from_rows,
    generate_puzzle,
    is_valid_solution,
    parse_grid,
    solve,
    sudoku_prompt,
    to_rows,
)
from esrepro.tasks.sources import EMBEDDED


def prepare_sudoku(out_dir: Path, source: dict, seed: int) -> dict:
    """The split record (``"splits"``) of :func:`esrepro.tasks.sudoku.prepare`."""
    return sudoku.prepare(out_dir, source, seed)["splits"]


def _answer(rows: list[str]) -> str:
    return "I filled it in.</think>\n<answer>\n" + "\n".join(rows) + "\n</answer>"


@pytest.mark.parametrize("size, seeds", [(4, range(30)), (6, range(5)), (9, range(2))])
def test_generated_puzzles_have_exactly_one_solution(size: int, seeds: range) -> None:
    for seed in seeds:
        p = generate_puzzle(size, seed)
        puzzle, solution = from_rows(p["puzzle"]), from_rows(p["solution"])
        assert count_solutions(puzzle, limit=5) == 1
        assert solve(puzzle) == solution
        assert p["n_blanks"] == sum(row.count("0") for row in p["puzzle"]) > 0
        assert is_valid_solution(solution, puzzle) == (True, True)
        # minimal: putting back... removing any further given breaks uniqueness
        if size == 4:
            for r in range(size):
                for c in range(size):
                    if puzzle[r][c]:
                        fewer = [row[:] for row in puzzle]
                        fewer[r][c] = 0
                        assert count_solutions(fewer) == 2


def test_generation_is_deterministic_per_seed() -> None:
    assert generate_puzzle(9, 7) == generate_puzzle(9, 7)
    assert generate_puzzle(4, 1) != generate_puzzle(4, 2)
    capped = generate_puzzle(9, 3, max_blanks=20)
    assert capped["n_blanks"] == 20 and count_solutions(from_rows(capped["puzzle"])) == 1


def test_solver_counts() -> None:
    assert count_solutions([[0] * 4 for _ in range(4)], limit=2) == 2
    assert count_solutions([[1, 1, 0, 0]] + [[0] * 4 for _ in range(3)]) == 0
    with pytest.raises(ValueError):
        generate_puzzle(5, 0)


def test_prompt_is_countdown_style() -> None:
    p = generate_puzzle(4, 0)
    text = sudoku_prompt(p["puzzle"])
    assert text.startswith("You are a helpful assistant.")
    assert text.endswith("Let me solve this step by step.\n<think>")
    assert "\n".join(p["puzzle"]) in text and "<answer> </answer>" in text
    assert get_task("sudoku").prompt(p) == text


@pytest.fixture(scope="module")
def example() -> dict:
    return generate_puzzle(4, 11)


def test_solution_grades_one(example: dict) -> None:
    score = get_task("sudoku").score(_answer(example["solution"]), example)
    assert (score.reward, score.correct) == (1.0, True)
    spaced = "<answer>  \n" + "\n".join("  " + r + " " for r in example["solution"]) + "\n\n </answer>"
    assert get_task("sudoku").score(spaced, example).correct
    later = _answer(["1111"] * 4) + " on reflection " + _answer(example["solution"])
    assert get_task("sudoku").score(later, example).correct  # the last block counts


def test_constraint_violation_grades_zero(example: dict) -> None:
    puzzle, solution = from_rows(example["puzzle"]), from_rows(example["solution"])
    # swap two blanks of one row: rows stay permutations, columns break
    for r, row in enumerate(puzzle):
        blanks = [c for c, v in enumerate(row) if v == 0]
        if len(blanks) >= 2:
            bad = [line[:] for line in solution]
            a, b = blanks[:2]
            bad[r][a], bad[r][b] = bad[r][b], bad[r][a]
            break
    score = get_task("sudoku").score(_answer(to_rows(bad)), example)
    assert (score.reward, score.correct, score.details["valid"]) == (0.0, False, False)
    assert score.details["keeps_givens"]


def test_changing_a_given_grades_zero(example: dict) -> None:
    # relabelling the digits gives a valid Sudoku that changes the givens
    relabel = {1: 2, 2: 3, 3: 4, 4: 1}
    other = [[relabel[v] for v in row] for row in from_rows(example["solution"])]
    score = get_task("sudoku", partial=True).score(_answer(to_rows(other)), example)
    assert score.details["valid"] and not score.details["keeps_givens"]
    assert (score.reward, score.correct) == (0.0, False)


def test_partial_credit(example: dict) -> None:
    puzzle, solution = from_rows(example["puzzle"]), from_rows(example["solution"])
    blanks = [(r, c) for r in range(4) for c in range(4) if puzzle[r][c] == 0]
    wrong = [row[:] for row in solution]
    r, c = blanks[0]
    wrong[r][c] = wrong[r][c] % 4 + 1
    partial = get_task("sudoku", partial=True).score(_answer(to_rows(wrong)), example)
    assert partial.reward == pytest.approx((len(blanks) - 1) / len(blanks)) and not partial.correct
    assert get_task("sudoku").score(_answer(to_rows(wrong)), example).reward == 0.0
    assert get_task("sudoku", partial=True).score(_answer(example["solution"]), example).reward == 1.0


@pytest.mark.parametrize("block", [
    "1234\n3412\n2143",  # too few rows
    "1234\n3412\n2143\n4321\n1234",  # too many rows
    "1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1",  # spaces between digits
    "1234\n3412\n\n2143\n4321",  # blank line inside
    "1234\n3412\n2143\n432a",  # a letter
    "1234\n3412\n2143\n4350",  # digits out of range
    "12345\n3412\n2143\n4321",  # ragged
    "",
])
def test_strict_parsing(block: str) -> None:
    assert parse_grid(block, 4) is None


def test_unparseable_or_missing_answer(example: dict) -> None:
    task = get_task("sudoku", partial=True)
    assert task.score("no answer", example).reward == 0.0
    assert task.score("<answer>" + "1" * 100_000 + "</answer>", example).reward == 0.0
    assert task.score("<answer>\n" + "\n".join(example["solution"]), example).reward == 0.0  # unclosed


def test_prepare_sudoku(tmp_path: Path) -> None:
    a = prepare_sudoku(tmp_path / "a", {"kind": "generated", "n_train": 12, "n_test": 6, "size": 4}, 5)
    b = prepare_sudoku(tmp_path / "b", {"kind": "generated", "n_train": 12, "n_test": 6, "size": 4}, 5)
    assert a == b and (a["train"]["n"], a["test"]["n"]) == (12, 6)
    task = get_task("sudoku")
    rows = task.load("train", tmp_path / "a") + task.load("test", tmp_path / "a")
    assert len({"".join(r["puzzle"]) for r in rows}) == 18
    assert all(r["source"] == EMBEDDED and task.score(_answer(r["solution"]), r).correct for r in rows)
    nine = prepare_sudoku(tmp_path / "c", {"kind": "generated", "n_train": 1, "n_test": 1, "size": 9}, 0)
    assert nine["train"]["n"] == 1
    with pytest.raises(ValueError, match="kind"):
        prepare_sudoku(tmp_path / "d", {"kind": "local"}, 0)


def test_deeply_indented_solution_grades_one(example: dict) -> None:
    """The length cap bounds the raw block, so rows indented by 20 spaces still parse."""
    indented = "<answer>\n" + "\n".join(" " * 20 + r for r in example["solution"]) + "\n</answer>"
    score = get_task("sudoku").score(indented, example)
    assert (score.reward, score.correct) == (1.0, True)
    assert parse_grid("\n".join(" " * 200 + r for r in example["solution"]), 4) is not None
    assert parse_grid(" " * (sudoku.MAX_BLOCK_CHARS + 1) + "\n".join(example["solution"]), 4) is None
