"""Tests of the Countdown task: prompt, rewards, generator, authors' data and prepare."""

from __future__ import annotations

import json
import random
import re
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

from esrepro.data.fetch import ChecksumError, sha256_file
from esrepro.io import read_jsonl
from esrepro.tasks import countdown, get_task
from esrepro.tasks.countdown import (
    CountdownTask,
    answer_reward,
    authors_prompt,
    authors_reward,
    format_reward,
    generate_problems,
    load_authors_json,
    sft_completion,
    tinyzero_equation,
    tinyzero_score,
)
from esrepro.tasks.safe_arith import safe_eval


def prepare(out_dir: Path, source: dict, seed: int) -> dict:
    """The split record (``"splits"``) of :func:`esrepro.tasks.countdown.prepare`."""
    return countdown.prepare(out_dir, source, seed)["splits"]


SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "es-at-scale"
AUTHORS_JSON = SHARED / "countdown.json"
needs_shared = pytest.mark.skipif(not AUTHORS_JSON.exists(), reason="shared data not present")


@pytest.fixture(scope="module")
def authors_raw() -> list[dict]:
    return json.loads(AUTHORS_JSON.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------------
# An independent reference of the authors' grader (countdown/countdown_task.py), regex + eval.

AUTHORS_ALLOWED = r"^[0-9+\-*/() ]+$"


def reference_reward(response: str, numbers: list[int], target: str) -> float:
    text = "<think>" + response
    if re.match(r"^<think>.*?<\/think>\n<answer>.*?<\/answer>$", text, re.DOTALL):
        fmt = 1.0
    else:
        fmt = 0.0
        if re.search(r"<think>.*?<\/think>", text, re.DOTALL):
            fmt += 0.1
        if re.search(r"<answer>.*?<\/answer>", text, re.DOTALL):
            fmt += 0.5
    ans = 0.0
    matches = re.findall(r"<answer>(.*?)<\/answer>", response, re.DOTALL)
    if matches:
        content = matches[-1]
        if content and re.match(AUTHORS_ALLOWED, content):
            if sorted(int(n) for n in re.findall(r"\d+", content)) == sorted(numbers):
                # eval only on whitelisted corruptions of the authors' own solutions
                assert "**" not in content and "//" not in content
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        result = eval(content, {"__builtins__": None}, {})  # noqa: S307
                    ans = 1.0 if abs(float(result) - float(target)) < 1e-5 else 0.0
                except Exception:
                    ans = 0.0
    return fmt * 0.1 + ans


def respond(answer: str) -> str:
    return f" think.</think>\n<answer>{answer}</answer>"


def corruptions(solution: str, numbers: list[int], target: str, rng: random.Random) -> list[str]:
    """Responses built from a trusted solution, each a different way of going wrong."""
    first = re.search(r"\d+", solution)
    assert first is not None
    a, b = first.span()
    ops = [m.start() for m in re.finditer(r"(?<= )[+\-*/](?= )", solution)]
    op_at = rng.choice(ops)
    new_op = rng.choice([o for o in "+-*/" if o != solution[op_at]])
    return [
        respond(solution),
        respond(solution[:a] + str(int(solution[a:b]) + 1) + solution[b:]),  # a number changed
        respond(solution[:a] + solution[b:]),  # a number dropped
        respond(solution[:op_at] + new_op + solution[op_at + 1 :]),  # an operator changed
        respond(f"{solution} + {numbers[0]}"),  # a number used twice
        f" think.</think>\n{solution}",  # answer tags missing
        f"<answer>{solution}</answer>",  # think block missing
        f" think.</think><answer>{solution}</answer>",  # newline missing
        f" think.</think>\n<answer>{solution}</answer>\n",  # trailing newline ($ allows one)
        f" think.</think>\n<answer>{solution}</answer>\n\n",
        f" think.</think>\n<answer>{solution}</answer> done",  # text after the answer
        respond(solution) + "\n<answer>(1 + 2) / 3</answer>",  # a wrong answer last
        "</think>\n<answer>(1 + 2) / 3</answer>" + respond(solution),  # the right answer last
        respond(f" {solution} "),  # padded: eval strips the leading space
        respond(f"{solution}\n"),  # $ matches before the final newline
        respond(f"\n{solution}"),  # a leading newline fails the whitelist
        respond(f"-(-{solution})"),
        respond(f"0{solution[a:]}" if a == 0 else solution[:a] + "0" + solution[a:]),  # leading zero
        respond(solution + ")"),  # unbalanced
        respond(f"{solution} = {target}"),
        respond(""),
        " no tags at all",
        f"<think>{solution}</think>\n<answer>{solution}</answer>",  # a second <think>
    ]


@needs_shared
def test_every_authors_solution_scores_like_the_reference(authors_raw: list[dict]) -> None:
    rng = random.Random(0)
    task = CountdownTask()
    perfect = flawed = 0
    for entry in authors_raw:
        solution, numbers, target = entry["solution"], entry["numbers"], entry["target"]
        if solution is None:
            continue
        example = {"numbers": numbers, "target": target}
        variants = corruptions(solution, numbers, target, rng)
        for response in [variants[0], *rng.sample(variants[1:], 4)]:
            assert authors_reward(response, numbers, target)["reward"] == reference_reward(
                response, numbers, target
            ), (entry["id"], response)
        score = task.score(respond(solution), example)
        uses_numbers = sorted(int(n) for n in re.findall(r"\d+", solution)) == sorted(numbers)
        if uses_numbers:
            assert score.reward == 1.1 and score.correct, entry["id"]
            perfect += 1
        else:  # the authors' file has a few solutions that reuse a number
            assert score.reward == pytest.approx(0.1) and not score.correct, entry["id"]
            flawed += 1
    assert perfect > 2000 and flawed < 50


@needs_shared
def test_authors_prompt_reproduces_every_context(authors_raw: list[dict]) -> None:
    assert len(authors_raw) == 2200
    task = CountdownTask()
    for entry in authors_raw:
        assert authors_prompt(entry["numbers"], entry["target"]) == entry["context"], entry["id"]
        assert task.prompt(entry) == entry["context"]


def test_authors_prompt_pads_numbers_like_numpy() -> None:
    assert "[ 2 54 17]" in authors_prompt([2, 54, 17], "35")
    assert authors_prompt([44, 19, 35], "98").endswith("Let me solve this step by step.\n<think>")


def test_format_scan_equals_the_authors_regexes_on_random_tag_soup() -> None:
    rng = random.Random(1)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "\n", "x", " ", "1+2", "</think>\n<answer>"]
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(9)))
        full = re.match(r"^<think>.*?<\/think>\n<answer>.*?<\/answer>$", text, re.DOTALL)
        ref = 1.0 if full else (
            (0.1 if re.search(r"<think>.*?<\/think>", text, re.DOTALL) else 0.0)
            + (0.5 if re.search(r"<answer>.*?<\/answer>", text, re.DOTALL) else 0.0)
        )
        assert format_reward(text) == ref, repr(text)
        found = re.findall(r"<answer>(.*?)<\/answer>", text, re.DOTALL)
        last = found[-1] if found else None
        assert tinyzero_equation(text, "es") == (None if last is None else last.strip()), repr(text)


def test_reward_components_and_score() -> None:
    example = {"numbers": [1, 2, 3], "target": "9"}
    score = CountdownTask().score(respond("(1 + 2) * 3"), example)
    assert score.reward == 1.1 and score.correct
    assert score.details == {"format": 1.0, "answer": 1.0}
    wrong = CountdownTask().score(respond("(1 + 2) + 3"), example)
    assert wrong.reward == pytest.approx(0.1) and not wrong.correct
    assert answer_reward("<answer>(1 + 2) * 3</answer>", [3, 2, 1], 9) == 1.0
    assert authors_reward("<answer>7 / 2</answer>", [7, 2], "3.5")["answer"] == 1.0


def test_deliberate_deviations_power_and_floor_division_are_refused() -> None:
    # The authors' eval would grant these (both pass their whitelist); we refuse them.
    assert answer_reward("<answer>2**3 - 1</answer>", [2, 3, 1], "7") == 0.0
    assert answer_reward("<answer>7//2</answer>", [7, 2], "3") == 0.0


HOSTILE = {
    "import": ("__import__('os').system('true')", [1, 2, 3]),
    "attribute": ("().__class__.__bases__[0]", [0]),
    "power tower": ("9**9**9**9", [9, 9, 9, 9]),
    "huge literal": ("9" * 10_000, [1, 2, 3]),
    "huge literal matching": ("0" * 10_000 + "44", [44]),
    "deep parens": ("(" * 10_000 + "44 + 19 + 35" + ")" * 10_000, [44, 19, 35]),
    "deep unary": ("-" * 10_000 + "44", [44]),
    "100 kB": ("44 + " + "(" * 100_000, [44]),
    "unbalanced": ("((44 + 19) + 35", [44, 19, 35]),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("reward", ["authors", "tinyzero", "tinyzero_es"])
def test_hostile_answers_score_zero_fast(name: str, reward: str) -> None:
    answer, numbers = HOSTILE[name]
    task = CountdownTask(reward=reward)
    start = time.perf_counter()
    score = task.score(respond(answer), {"numbers": numbers, "target": "98"})
    assert time.perf_counter() - start < 1.0
    assert score.details["answer"] == 0.0 and not score.correct and score.reward <= 0.1 + 1e-12


@pytest.mark.parametrize(
    "text",
    [
        "<think>" * 14_000,  # each unclosed tag costs the lazy regexes a scan to the end
        "<answer>" * 12_000,
        "</think>\n<answer>" * 5_800 + "x",
        "x" * 100_000 + "<answer>44</answer>",
    ],
)
def test_100kb_tag_soup_is_linear(text: str) -> None:
    start = time.perf_counter()
    for reward in ("authors", "tinyzero", "tinyzero_es"):
        CountdownTask(reward=reward).score(text, {"numbers": [44], "target": "44"})
    assert time.perf_counter() - start < 1.0


# --------------------------------------------------------------------------------------------
# TinyZero's compute_score, cases read off its source


def test_tinyzero_upstream() -> None:
    nums, target = [1, 2, 3], 9
    good = "<answer>(1 + 2) * 3</answer>"
    assert tinyzero_score(good, nums, target) == 0  # no "Assistant:" marker -> nothing extracted
    assert tinyzero_score("Assistant: " + good, nums, target) == 1.0
    assert tinyzero_score("<|im_start|>assistant\n" + good, nums, "9") == 1.0
    assert tinyzero_score("Assistant: " + good + "\n", nums, target) == 0  # only the last line is read
    assert tinyzero_score("Assistant: <answer>\n(1+2)*3\n</answer>", nums, target) == 0
    assert tinyzero_score("Assistant: <answer>(1+2)+3</answer>", nums, target) == 0.1  # wrong value
    assert tinyzero_score("Assistant: <answer>(1+2)*4</answer>", nums, target) == 0.1  # wrong numbers
    assert tinyzero_score("Assistant: <answer></answer>", nums, target) == 0.1  # extracted, empty
    assert tinyzero_score("Assistant: <answer>(1+2)*3 = 9</answer>", nums, target) == 0.1
    assert tinyzero_score("Assistant: <answer>x(1+2)*3</answer>", nums, target) == 0.1
    assert tinyzero_score("Assistant: <answer>\t(1 + 2) * 3 </answer>", nums, target) == 1.0  # stripped
    assert tinyzero_score("Assistant: <answer>9</answer><answer>(1+2)*3</answer>", nums, target) == 1.0
    # '.' is allowed and \d+ splits "1.5" into 1 and 5: the decimal uses two numbers.
    assert tinyzero_score("Assistant: <answer>1.5 * 2</answer>", [1, 5, 2], 3) == 1.0
    # eval would compute 2**3; we refuse it, which TinyZero scores as a format-only answer.
    assert tinyzero_score("Assistant: <answer>2**3</answer>", [2, 3], 8) == 0.1
    assert tinyzero_score("Assistant: <answer>1</answer>", [1], 1, format_score=0.2, score=3.0) == 3.0


def test_tinyzero_es_copy() -> None:
    nums, target = [1, 2, 3], 9
    assert tinyzero_score("<answer>(1 + 2) * 3</answer>", nums, target, variant="es") == 1.0
    assert tinyzero_score("<answer>\n(1+2)*3\n</answer>\n", nums, target, variant="es") == 1.0
    assert tinyzero_score("<answer>(1+2)*3 = 9</answer>", nums, target, variant="es") == 1.0
    assert tinyzero_score("no answer", nums, target, variant="es") == 0
    with pytest.raises(ValueError, match="variant"):
        tinyzero_score("", nums, target, variant="nope")


def test_tinyzero_task_rewards() -> None:
    example = {"numbers": [1, 2, 3], "target": "9"}
    up, es = CountdownTask(reward="tinyzero"), CountdownTask(reward="tinyzero_es")
    assert up.score(respond("(1 + 2) * 3"), example).reward == 1.0
    assert es.score(respond("(1 + 2) * 3"), example).correct
    wrong = up.score(respond("1 + 2 + 3"), example)
    assert wrong.reward == 0.1 and wrong.details == {"format": 1.0, "answer": 0.0}
    assert up.score(respond("(1 + 2) * 3") + "\n", example).reward == 0.0
    with pytest.raises(ValueError, match="reward"):
        CountdownTask(reward="nope")
    assert isinstance(get_task("countdown", reward="tinyzero"), CountdownTask)


# --------------------------------------------------------------------------------------------
# Generator and SFT completion


def test_generator_is_seeded_and_valid() -> None:
    problems = generate_problems(300, seed=7)
    assert problems == generate_problems(300, seed=7)
    assert problems[:50] == generate_problems(50, seed=7)
    assert problems != generate_problems(300, seed=8)
    assert len({(tuple(sorted(p["numbers"])), p["target"]) for p in problems}) == 300
    assert [p["id"] for p in problems] == list(range(300))
    for p in problems:
        assert 3 <= len(p["numbers"]) <= 4 and all(1 <= n <= 99 for n in p["numbers"])
        assert isinstance(p["target"], str) and 1 <= int(p["target"]) <= 1000
        assert p["solution"].startswith("(") and p["solution"].endswith(")")
        assert safe_eval(p["solution"]) == int(p["target"])
        assert Counter(map(int, re.findall(r"\d+", p["solution"]))) == Counter(p["numbers"])
        assert authors_reward(sft_completion(p), p["numbers"], p["target"])["reward"] == 1.1
        assert CountdownTask().score(sft_completion(p), p).reward == 1.1


def test_generator_options_and_errors() -> None:
    small = generate_problems(20, seed=1, min_numbers=2, max_numbers=2, max_number=9, max_target=50)
    assert all(len(p["numbers"]) == 2 and int(p["target"]) <= 50 for p in small)
    with pytest.raises(ValueError):
        generate_problems(5, seed=0, min_numbers=1)
    with pytest.raises(RuntimeError):  # only 1 + 1 = 2 (and 1 * 1 = 1, ...) exist: not 10 problems
        generate_problems(10, seed=0, min_numbers=2, max_numbers=2, max_number=1)


def test_sft_completion_needs_a_solution() -> None:
    with pytest.raises(ValueError):
        sft_completion({"id": 3, "numbers": [1], "target": "1", "solution": None})


@needs_shared
def test_sft_completion_on_authors_data() -> None:
    examples = load_authors_json(AUTHORS_JSON)
    good = [e for e in examples if e["solution"]][:100]
    assert all(authors_reward(sft_completion(e), e["numbers"], e["target"])["reward"] in (1.1, 0.1) for e in good)


# --------------------------------------------------------------------------------------------
# Loading and prepare


def _tiny_authors_file(path: Path, n: int = 12) -> Path:
    problems = generate_problems(n, seed=3)
    entries = [
        {"id": p["id"], "context": authors_prompt(p["numbers"], p["target"]), **p} for p in problems
    ]
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


@needs_shared
def test_load_authors_json_keeps_our_fields() -> None:
    examples = load_authors_json(AUTHORS_JSON)
    assert len(examples) == 2200
    assert examples[0] == {"id": 0, "numbers": [44, 19, 35], "target": "98", "solution": "((44 + 19) + 35)"}
    assert all(isinstance(e["target"], str) for e in examples)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e.pop("numbers"), "missing"),
        (lambda e: e.update(numbers=[1, "2"]), "numbers"),
        (lambda e: e.update(target=98), "target"),
        (lambda e: e.update(target="abc"), "target"),
        (lambda e: e.update(solution=5), "solution"),
        (lambda e: e.update(context="Hi"), "context"),
        (lambda e: e.update(id="7"), "id"),
    ],
)
def test_load_authors_json_names_the_bad_entry(tmp_path: Path, change, message: str) -> None:
    path = _tiny_authors_file(tmp_path / "c.json")
    entries = json.loads(path.read_text())
    change(entries[4])
    path.write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=message) as info:
        load_authors_json(path)
    assert str(path) in str(info.value) and "entry 4" in str(info.value)


def test_prepare_generated(tmp_path: Path) -> None:
    info = prepare(tmp_path / "a", {"kind": "generated", "n_train": 40, "n_test": 60}, seed=5)
    train, test = read_jsonl(tmp_path / "a" / "train.jsonl"), read_jsonl(tmp_path / "a" / "test.jsonl")
    assert info["train"]["n"] == len(train) == 40 and info["test"]["n"] == len(test) == 60
    assert info["train"]["sha256"] == sha256_file(tmp_path / "a" / "train.jsonl")
    key = lambda p: (tuple(sorted(p["numbers"])), p["target"])  # noqa: E731
    assert not {key(p) for p in train} & {key(p) for p in test}
    assert prepare(tmp_path / "b", {"kind": "generated", "n_train": 40, "n_test": 60}, seed=5) == info
    assert prepare(tmp_path / "c", {"kind": "generated", "n_train": 40, "n_test": 60}, seed=6) != info
    task = CountdownTask()
    assert task.load("test", tmp_path / "a") == test


@needs_shared
def test_prepare_authors_local(tmp_path: Path) -> None:
    info = prepare(tmp_path, {"kind": "authors", "path": str(AUTHORS_JSON)}, seed=0)
    assert info["train"]["n"] == 200 and info["test"]["n"] == 2000
    train, test = read_jsonl(tmp_path / "train.jsonl"), read_jsonl(tmp_path / "test.jsonl")
    assert [e["id"] for e in train] == list(range(200))
    assert [e["id"] for e in test] == list(range(200, 2200))


def test_prepare_authors_fetched(tmp_path: Path) -> None:
    src = _tiny_authors_file(tmp_path / "src.json")
    source = {"kind": "authors", "url": src.as_uri(), "sha256": sha256_file(src), "raw_dir": str(tmp_path / "raw")}
    info = prepare(tmp_path / "out", {**source, "n_train": 3, "n_test": 5}, seed=0)
    assert (tmp_path / "raw" / "countdown.json").exists()
    assert info["train"]["n"] == 3 and info["test"]["n"] == 5
    assert [e["id"] for e in read_jsonl(tmp_path / "out" / "test.jsonl")] == list(range(7, 12))
    with pytest.raises(ChecksumError):
        prepare(tmp_path / "out2", {**source, "sha256": "0" * 64, "raw_dir": str(tmp_path / "raw2")}, seed=0)
    with pytest.raises(ValueError, match="exceeds"):
        prepare(tmp_path / "out3", {**source, "n_train": 10, "n_test": 10}, seed=0)


@pytest.mark.parametrize(
    ("source", "key"),
    [
        ({"kind": "bogus"}, "kind"),
        ({}, "kind"),
        ({"kind": "generated", "n_test": 3}, "n_train"),
        ({"kind": "generated", "n_train": 3}, "n_test"),
        ({"kind": "generated", "n_train": -1, "n_test": 3}, "n_train"),
        ({"kind": "authors"}, "path"),
        ({"kind": "authors", "url": "file:///x", "raw_dir": "r"}, "sha256"),
        ({"kind": "authors", "url": "file:///x", "sha256": "0" * 64}, "raw_dir"),
    ],
)
def test_prepare_bad_source_names_the_key(tmp_path: Path, source: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        prepare(tmp_path, source, seed=0)


def test_prepare_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json"):
        prepare(tmp_path, {"kind": "authors", "path": str(missing)}, seed=0)
