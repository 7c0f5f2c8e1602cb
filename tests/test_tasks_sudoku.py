"""Sudoku: v2's 4x4 Mini Sudoku through Reasoning Gym: generation, splits, the Fig. 11 prompt, RG's reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esrepro.io import read_jsonl
from esrepro.tasks import get_task, split_sizes, sudoku
from esrepro.tasks.sources import EMBEDDED


def _prepare(out: Path, **source) -> tuple[dict, list[dict], list[dict]]:
    info = sudoku.prepare(out, {"kind": "generated", **source}, 3)
    return info, read_jsonl(out / "train.jsonl"), read_jsonl(out / "test.jsonl")


def _respond(answer: str) -> str:
    return f" First the rows.</think>\n<answer>\n{answer}\n</answer>"


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> dict:
    _, train, _ = _prepare(tmp_path_factory.mktemp("sudoku"), n_train=4, n_test=1)
    return train[0]


def test_puzzles_are_reasoning_gyms_deterministic_distinct_and_split_in_order(tmp_path: Path) -> None:
    import reasoning_gym

    info, train, test = _prepare(tmp_path / "a", n_train=30, n_test=10)
    assert (len(train), len(test)) == (30, 10) and info["splits"]["train"]["n"] == 30
    again = _prepare(tmp_path / "b", n_train=30, n_test=10)[0]
    assert again["splits"] == info["splits"]  # same seed: the same bytes
    other = sudoku.prepare(tmp_path / "c", {"kind": "generated", "n_train": 30, "n_test": 10}, 4)
    assert other["splits"] != info["splits"]
    rows = train + test
    assert len({r["question"] for r in rows}) == 40  # no puzzle twice, none shared by train and test
    assert [r["id"] for r in rows] == [f"sudoku-train-{i}" for i in range(30)] + [f"sudoku-test-{i}" for i in
                                                                                   range(30, 40)]
    # each row is Reasoning Gym's own entry, item source_index of mini_sudoku seeded 3
    ds = reasoning_gym.create_dataset("mini_sudoku", seed=3, size=1000)
    for r in rows:
        entry = ds[r["metadata"]["source_index"]]
        assert (r["question"], r["answer"]) == (entry["question"], entry["answer"])
        assert r["metadata"]["puzzle"] == entry["metadata"]["puzzle"] and r["source"] == EMBEDDED
        assert 8 <= r["metadata"]["num_empty"] <= 12  # Reasoning Gym's default blanks
    assert info["provenance"] == {"kind": "generated", "generator": "reasoning-gym mini_sudoku", "version": "0.1.25",
                                  "config": {"seed": 3, "min_empty": 8, "max_empty": 12},
                                  "items_drawn": rows[-1]["metadata"]["source_index"] + 1}


def test_the_papers_1000_puzzles_split_800_200(tmp_path: Path) -> None:
    source = {"kind": "generated", "n_train": 800, "n_test": 200}
    assert split_sizes("sudoku", source) == {"train": 800, "test": 200}
    info, train, test = _prepare(tmp_path, n_train=800, n_test=200)
    assert (len(train), len(test)) == (800, 200)
    assert len({r["question"] for r in train + test}) == 1000
    assert json.loads(json.dumps(info["provenance"]))["version"] == "0.1.25"


def test_blanks_are_reasoning_gyms_config_and_bad_values_name_the_key(tmp_path: Path) -> None:
    _, train, test = _prepare(tmp_path, n_train=10, n_test=5, min_empty=2, max_empty=4)
    assert all(2 <= r["metadata"]["num_empty"] <= 4 for r in train + test)
    for bad, key in (({"min_empty": 13}, "min_empty"), ({"min_empty": 5, "max_empty": 4}, "max_empty"),
                     ({"max_empty": 13}, "max_empty"), ({"min_empty": -1}, "min_empty")):
        with pytest.raises(ValueError, match=key):
            split_sizes("sudoku", {"kind": "generated", **bad})
    with pytest.raises(ValueError, match="kind"):
        split_sizes("sudoku", {"kind": "local"})


def test_the_prompt_is_figure_11s(example: dict) -> None:
    text = get_task("sudoku").prompt(example)
    grid = "\n".join(" ".join(str(v) if v else "_" for v in row) for row in example["metadata"]["puzzle"])
    assert text == (
        "You are a helpful assistant. You first think about the reasoning process in your mind and then provide the "
        "user with the answer. In 4x4 Mini Sudoku:\n"
        "- Each row must contain each number from 1-4 exactly once\n"
        "- Each column must contain each number 1-4 exactly once\n"
        "- Each 2x2 subgrid must contain each number 1-4 exactly once\n"
        f"Solve this 4x4 Mini Sudoku puzzle:\n{grid}\n"
        "Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, with spaces "
        "separating each number within a row, and newlines separating rows. For example <answer>\n"
        "2 1 4 3\n4 3 2 1\n3 1 4 2\n1 2 3 4 </answer>. Let me solve this step by step.\n<think>")
    assert "Format your response" not in text  # Reasoning Gym's own format line is replaced
    with pytest.raises(ValueError, match="not Reasoning Gym's mini_sudoku text"):
        sudoku.sudoku_prompt("Solve this puzzle: _ 1")


def test_reasoning_gyms_reward_of_correct_wrong_and_malformed_answers(example: dict) -> None:
    task = get_task("sudoku")
    solution = example["answer"]  # "a b c d\n..." as Reasoning Gym writes it
    right = task.score(_respond(solution), example)
    assert (right.reward, right.correct) == (1.0, True)
    assert task.score(task.prompt(example) + sudoku.sft_completion(example), example).correct
    # the last answer block counts; the figure's trailing space before </answer> is stripped
    assert task.score("<answer>1 1 1 1</answer> then <answer>" + solution + " </answer>", example).correct
    # two cells swapped in the first row: 14 of 16 right, 0.9 for the non-standard answer
    rows = [r.split() for r in solution.split("\n")]
    rows[0][0], rows[0][1] = rows[0][1], rows[0][0]
    swapped = task.score(_respond("\n".join(" ".join(r) for r in rows)), example)
    assert swapped.reward == pytest.approx(0.9 * 14 / 16) and not swapped.correct
    # no spaces: every cell right, still not the oracle's format (0.9); Reasoning Gym's length penalty otherwise
    packed = task.score(_respond(solution.replace(" ", "")), example)
    assert packed.reward == pytest.approx(0.9) and not packed.correct
    longer = task.score(_respond(solution + "\ndone"), example)
    assert longer.reward == pytest.approx(0.9 * len(solution) / len(solution + "\ndone")) and not longer.correct
    # malformed: no block, an unclosed block, words
    for text in ("I think it is solved.", "<answer>" + solution, _respond("no idea")):
        score = task.score(text, example)
        assert (score.reward, score.correct) == (0.0, False)
    assert task.score("<answer>" * 20_000 + solution, example).reward == 0.0  # no closing tag: nothing scanned


def test_the_task_takes_no_options() -> None:
    with pytest.raises(ValueError, match="task_options.sudoku: the sudoku task takes no options"):
        get_task("sudoku", partial="cells")


def test_the_paper_config_runs_sudoku_as_v2_states_it() -> None:
    """v2 App. A.8 / Table 3: Qwen2.5-3B-Instruct, 1,000 puzzles (800 / 200), N 32, sigma 0.001, alpha 0.0005,
    2,500 iterations, every iteration scoring the whole training set as one batch; the tiny default too runs
    Reasoning Gym's Mini Sudoku, at a few dozen puzzles."""
    from conftest import REPO
    from esrepro.config import load_yaml
    from esrepro.planning.load import check_config, load_pipeline

    raw = load_yaml(REPO / "config" / "paper.yaml")
    check_config(raw, "paper.yaml", root=REPO)
    paper = load_pipeline(raw, "paper.yaml", root=REPO)
    assert paper.train_models("sudoku") == ["qwen2.5-3b-instruct"] and paper.train_methods("sudoku") == ["es"]
    source = paper.cfg.data["sudoku"].source.model_dump(exclude_none=True)
    assert source == {"kind": "generated", "n_train": 800, "n_test": 200}
    assert split_sizes("sudoku", source) == {"train": 800, "test": 200}
    es = paper.method_settings("qwen2.5-3b-instruct", "sudoku", "es")
    assert (es.population, es.sigma, es.alpha, es.iterations) == (32, 0.001, 0.0005, 2500)
    assert (es.train_examples, es.prompts_per_iteration, es.batch_size) == (800, None, 800)
    assert paper.task_options("sudoku") == {}  # Reasoning Gym's reward
    # 64M completions: the registry's train_es_sudoku layout (2 nodes x 4 GPUs), done within the SLURM profile's
    # three attempts; the model's other ES runs keep its train_es layout
    from esrepro.planning.cluster import ray_layout
    from esrepro.planning.scaling import job_cost

    assert ray_layout(paper, "sudoku", "qwen2.5-3b-instruct", "es") == "2 nodes x 4 GPUs: 8 vllm engines, tp 1"
    assert ray_layout(paper, "countdown", "qwen2.5-3b-instruct", "es") == "1 node x 4 GPUs: 4 vllm engines, tp 1"
    assert job_cost(paper, "sudoku", "qwen2.5-3b-instruct", "es").attempts <= 3
    tiny = load_pipeline(load_yaml(REPO / "config" / "config.yaml"), "config.yaml", root=REPO)
    small = tiny.cfg.data["sudoku"].source.model_dump(exclude_none=True)
    assert sum(split_sizes("sudoku", small).values()) <= 50 and tiny.task_options("sudoku") == {}
