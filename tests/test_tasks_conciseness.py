"""Conciseness: packaged data, raw prompts, length reward and correctness notions."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from esrepro.tasks import conciseness, get_task
from esrepro.tasks.conciseness import answer_matches, length_reward, load_data


def prepare_conciseness(out_dir: Path, source: dict, seed: int) -> dict:
    """The split record (``"splits"``) of :func:`esrepro.tasks.conciseness.prepare`."""
    return conciseness.prepare(out_dir, source, seed)["splits"]


def test_packaged_data() -> None:
    assert resources.files("esrepro.tasks").joinpath("data/conciseness.yaml").is_file()
    data = load_data()
    assert [(d["prompt"], d["solution"]) for d in data["train"]] == [
        ("Solve: 3 + 5 =", "8"),
        ("If all birds can fly and penguins are birds, can penguins fly?", "No"),
    ]
    assert [(d["prompt"], d["solution"]) for d in data["eval"]] == [
        ("What is the capital of France?", "Paris"),
        ("Translate 'Hello' to Spanish:", "Hola"),
        ("Name one primary color:", "Red"),
        ("Is the statement 'All cats are mammals' true or false?", "True"),
        # the paper's Table 5 has eight; these four as a third-party reproduction lists them (see the YAML)
        ("Calculate: 12×7=", "84"),
        ("What comes next in the sequence: 2,4,6,8, ?", "10"),
        ("What is 15% of 200?", "30"),
        ("How many days are in a week?", "7"),
    ]
    assert data["paper_text_incomplete"] is False


@pytest.fixture()
def penguins() -> dict:
    return {"prompt": "If all birds can fly and penguins are birds, can penguins fly?", "solution": "No"}


def test_prompt_is_raw_text(penguins: dict) -> None:
    assert get_task("conciseness").prompt(penguins) == penguins["prompt"]


def test_length_reward(penguins: dict) -> None:
    task = get_task("conciseness")
    assert task.score("No", penguins).reward == 0.0
    assert task.score("Yes", penguins).reward == -1.0
    long = "No, because penguins cannot fly."
    assert task.score(long, penguins).reward == -(len(long) - 2)
    assert task.score("", penguins).reward == -2.0
    assert length_reward("x" * 100_000, "No") == -99_998.0


def test_correctness_notions(penguins: dict) -> None:
    task = get_task("conciseness")
    assert task.score(" no.", penguins).correct  # answer check, loose
    same_length_wrong = task.score("Hi", penguins)
    assert same_length_wrong.reward == 0.0 and not same_length_wrong.correct
    assert same_length_wrong.details == {"answer_match": False, "length_match": True, "length": 2}
    by_length = get_task("conciseness", correct_by="length")
    assert by_length.score("Hi", penguins).correct and not by_length.score("No!", penguins).correct
    with pytest.raises(ValueError):
        get_task("conciseness", correct_by="vibes").score("No", penguins)
    color = {"prompt": "Name one primary color:", "solution": "Red", "accept": ["Blue", "Yellow"]}
    assert answer_matches("blue", color) and not answer_matches("Green", color)


def test_authors_length_counts_the_prompt(penguins: dict) -> None:
    task = get_task("conciseness", length_includes_prompt=True)
    score = task.score("No", penguins)
    assert score.reward == -float(len(penguins["prompt"]))
    assert score.correct  # the answer is still right


def test_prepare_conciseness(tmp_path: Path) -> None:
    result = prepare_conciseness(tmp_path, {"kind": "generated"}, 0)
    assert (result["train"]["n"], result["test"]["n"]) == (2, 8)
    task = get_task("conciseness")
    rows = task.load("test", tmp_path)
    assert all(task.score(r["solution"], r).reward == 0.0 and task.score(r["solution"], r).correct for r in rows)
    assert all("paper" in r["source"] for r in rows)
