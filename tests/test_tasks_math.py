"""Math and GSM8K tasks: extraction, grading, prompts, data preparation, hostile output."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO
from esrepro.tasks import get_task, prepare_task
from esrepro.tasks.gsm8k import GSM8KTask, after_hashes, extract_gsm8k_answer, gold_from_solution, last_number
from esrepro.tasks.math import (
    QWEN_MATH_TEMPLATE,
    Math500Task,
    MinervaTask,
    as_number,
    clean_answer,
    grading_pool,
    last_boxed,
    normalize_answer,
    qwen_math_prompt,
    verify_answer,
)
from esrepro.tasks.math_data import EMBEDDED_MATH, MATH_SETS
from esrepro.tasks.sources import EMBEDDED


def prepare_gsm8k(out_dir: Path, source: dict, seed: int) -> dict:
    """The split record (``"splits"``) of :meth:`GSM8KTask.prepare`."""
    return GSM8KTask.prepare(out_dir, source, seed)["splits"]


def prepare_math500(out_dir: Path, source: dict, seed: int) -> dict:
    """The split record (``"splits"``) of :meth:`Math500Task.prepare`."""
    return Math500Task.prepare(out_dir, source, seed)["splits"]


def prepare_minerva(out_dir: Path, source: dict, seed: int) -> dict:
    """The split record (``"splits"``) of :meth:`MinervaTask.prepare`."""
    return MinervaTask.prepare(out_dir, source, seed)["splits"]


SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "es-at-scale"
MATH_DIR = SHARED / "datasets" / "evaluation_suite" / "math"
GSM8K_DIR = SHARED / "datasets" / "train" / "gsm_8k"
needs_shared = pytest.mark.skipif(not MATH_DIR.exists(), reason=f"no shared data at {MATH_DIR}")

# Sizes of the authors' copies.
EXPECTED_ROWS = {"math500": 500, "aime24": 30, "amc23": 83, "minerva": 272, "olympiad_bench": 675}
# Gold answers that math-verify (with the wrapping in esrepro.tasks.math) cannot parse:
# a prose answer and a malformed one (the full-pipeline grader accepts them by string match).
MV_UNPARSEABLE = {
    "olympiad_bench": {
        "f(x)=a x+b, where b is an arbitrary integer, and a is an arbitrary positive integer with \\mho(a)=0",
        "t(0,4]",
    },
}


@pytest.fixture(scope="module", autouse=True)
def warm_pool():
    grading_pool().warm()


# ------------------------------------------------------------------ extraction


def test_last_boxed_takes_the_last_balanced_box() -> None:
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{2}{3}}") == "\\frac{2}{3}"
    assert last_boxed("x \\boxed{a{b{c}}d} y") == "a{b{c}}d"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("so \\boxed 5 apples") == "5"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("\\boxed{1} and \\boxed{2") is None  # the last box is unterminated
    assert last_boxed("no box here") is None
    assert last_boxed("\\boxed{" + "9" * 2000 + "}") is None  # over max_chars
    assert last_boxed("\\boxed{" + "9" * 2000 + "}", max_chars=5000) == "9" * 2000


def test_gsm8k_extraction_order_and_fallbacks() -> None:
    assert extract_gsm8k_answer("#### 5 but \\boxed{7}") == ("7", "boxed")
    assert extract_gsm8k_answer("step 3 = 4\n#### 1,234") == ("1,234", "hashes")
    assert extract_gsm8k_answer("so she has -12 apples.") == ("-12", "last_number")
    assert extract_gsm8k_answer("costs $3.50.") == ("3.50", "last_number")
    assert extract_gsm8k_answer("nothing") == (None, "none")
    assert after_hashes("#### ") is None
    assert last_number("x" + "7" * 5000) is None
    assert gold_from_solution("a\n#### 1,000") == "1000"
    assert gold_from_solution("72") == "72"


def test_normalisation() -> None:
    assert clean_answer(142.0) == "142"
    assert clean_answer(" $\\frac{2}{3}$.\n") == "\\frac{2}{3}"
    assert clean_answer("\\$32") == "\\$32"
    assert normalize_answer("\\text{(C)}") == normalize_answer("(c)")
    assert normalize_answer("30,\\!000") == "30000"
    assert normalize_answer("45^\\circ") == "45"
    assert as_number("1,234.50") == as_number("1234.5")
    assert as_number("\\frac{1}{2}") is None


# ------------------------------------------------------------------ grading


@pytest.mark.parametrize("pred, gold, ok", [
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{1}{2}", "\\frac{1}{2}", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("(1,5)", "(1, 5)", True),
    ("x=3", "3", True),
    ("N=n+1", "N=n", False),  # math-verify alone says True: latex2sympy lower-cases N
    ("\\frac{1}{3}", "0.5", False),
    ("6", "5", False),
    ("", "5", False),
])
def test_verify_answer(pred: str, gold: str, ok: bool) -> None:
    assert verify_answer(pred, [gold])[0] is ok


def test_any_of_several_golds() -> None:
    assert verify_answer("10^{-3}", ["1 \\times 10^{-3}", "0.002"])[0]
    assert verify_answer("0.002", ["1 \\times 10^{-3}", "0.002"])[0]
    assert not verify_answer("0.003", ["1 \\times 10^{-3}", "0.002"])[0]


def test_math_task_prompt_and_score() -> None:
    task = get_task("math500")
    example = {"id": "x", "problem": "What is $1+1$?", "answer": "2"}
    assert task.prompt(example) == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}."
        "<|im_end|>\n<|im_start|>user\nWhat is $1+1$?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert qwen_math_prompt("q") == QWEN_MATH_TEMPLATE.format(problem="q")
    good = task.score("1 + 1 = 2, so the answer is \\boxed{2}.", example)
    assert (good.reward, good.correct) == (1.0, True)
    bad = task.score("\\boxed{3}", example)
    assert (bad.reward, bad.correct) == (0.0, False)
    unboxed = task.score("The answer is 2.", example)
    assert not unboxed.correct and unboxed.details["formatted"] is False


def test_registry_classes() -> None:
    for name in (*MATH_SETS, "gsm8k"):
        task = get_task(name)
        assert task.name == name


def test_scoring_from_worker_threads() -> None:
    task = get_task("minerva")
    cases = [("\\boxed{\\frac{1}{4}}", "0.25", True), ("\\boxed{2e^{3t}}", "2 e^{3 t}", True),
             ("\\boxed{0.3}", "0.25", False), ("\\boxed{x^2}", "x^{3}", False)] * 2
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda c: task.score(c[0], {"answer": c[1]}).correct, cases))
    assert got == [c[2] for c in cases]


# ------------------------------------------------------------------ hostile output


def _nested_frac(depth: int) -> str:
    s = "1"
    for _ in range(depth):
        s = "\\frac{" + s + "}{2}"
    return s


HOSTILE = {
    "million_digit_box": "\\boxed{" + "9" * 1_000_000 + "}",
    "million_digit_text": "so the answer is " + "7" * 1_000_000,
    "million_digit_hashes": "#### " + "1" * 1_000_000,
    "unbalanced_open": "\\boxed{" * 20_000 + "5",
    "unbalanced_close": "}" * 100_000 + "\\boxed{{{5}",
    "100kB_prose": ("lorem ipsum dolor " * 6000)[:100_000],
    "100kB_of_boxes": "\\boxed{1} " * 10_000,
    "frac_nested_1000": "\\boxed{" + _nested_frac(1000) + "}",
    "power_tower": "\\boxed{9^{9^{9^{9^{9}}}}}",
    "huge_factorial": "\\boxed{(10^{10})!}",
    "nested_braces": "\\boxed{" + "{" * 400 + "5" + "}" * 400 + "}",
    "backslashes": "\\boxed{" + "\\" * 100_001 + "}",
    "binary_noise": "".join(chr(random.Random(0).randrange(1, 0x2FFF)) for _ in range(20_000)),
}


@pytest.mark.parametrize("task_name, options, labels", [
    ("math500", {}, list(HOSTILE)),
    ("gsm8k", {}, list(HOSTILE)),
    # a larger cap lets the longest texts reach math-verify, where the timeout stops them
    ("olympiad_bench", {"max_answer_chars": 200_000}, ["frac_nested_1000", "backslashes", "unbalanced_close"]),
])
@pytest.mark.slow
def test_hostile_output_is_graded_wrong_quickly(task_name: str, options: dict, labels: list[str]) -> None:
    task = get_task(task_name, **options)
    example = {"problem": "p", "answer": "4321", "answers": ["4321"]}  # in none of the texts
    pool = grading_pool()
    for label in labels:
        text = HOSTILE[label]
        # After a time-out the killed worker's standby replacement may still be importing
        # (it competes for the CPU with the runaway call); that start-up is pool upkeep,
        # so each item is timed from a ready pool.
        pool.warm()
        start = time.perf_counter()
        score = task.score(text, example)
        elapsed = time.perf_counter() - start
        assert score.reward == 0.0 and not score.correct, label
        assert elapsed < 2.0, f"{task_name} {label}: {elapsed:.2f} s"


def test_gsm8k_task() -> None:
    task = get_task("gsm8k")
    example = {"problem": "q", "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 1,072"}
    assert "q<|im_end|>" in task.prompt(example)
    for text in ("\\boxed{1072}", "\\boxed{1,072}", "so #### 1072", "She has 1072 clips."):
        assert task.score(text, example).correct, text
    for text in ("\\boxed{1073}", "#### 1072.5", "She has 1071 clips.", "none"):
        assert not task.score(text, example).correct, text
    assert task.score("\\boxed{1072}", example).details["extracted_by"] == "boxed"
    strict = get_task("gsm8k", boxed_only=True)
    assert strict.score("\\boxed{1072}", example).correct
    assert not strict.score("so #### 1072", example).correct


# ------------------------------------------------------------------ data preparation (offline)


@pytest.mark.parametrize("task_name", MATH_SETS)
def test_embedded_math_items(tmp_path: Path, task_name: str) -> None:
    result = prepare_task(task_name, tmp_path, {"kind": "generated"}, 0)["splits"]
    assert result["test"]["n"] == len(EMBEDDED_MATH[task_name]) >= 12
    task = get_task(task_name)
    rows = task.load("test", tmp_path)
    assert all(r["source"] == EMBEDDED for r in rows)
    for row in rows:
        assert last_boxed(row["solution"]) == row["answer"]
        assert task.score(row["solution"], row).correct, row["answer"]
        assert not task.score(f"\\boxed{{{row['answer']}+1}}", row).correct, row["answer"]


def test_generated_gsm8k(tmp_path: Path) -> None:
    a = prepare_gsm8k(tmp_path / "a", {"kind": "generated", "n_train": 20, "n_test": 10}, 3)
    b = prepare_gsm8k(tmp_path / "b", {"kind": "generated", "n_train": 20, "n_test": 10}, 3)
    c = prepare_gsm8k(tmp_path / "c", {"kind": "generated", "n_train": 20, "n_test": 10}, 4)
    assert a == b and a != c and a["train"]["n"] == 20 and a["test"]["n"] == 10
    task = get_task("gsm8k")
    train, test = task.load("train", tmp_path / "a"), task.load("test", tmp_path / "a")
    assert not {r["problem"] for r in train} & {r["problem"] for r in test}
    for row in train + test:
        assert row["source"] == EMBEDDED
        assert re.search(r"\n#### \d+$", row["solution"])
        assert task.score(row["solution"], row).correct
        assert task.score(f"\\boxed{{{row['answer']}}}", row).correct
        assert not task.score(f"\\boxed{{{int(row['answer']) + 1}}}", row).correct


def test_local_files_and_errors(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    rows = [{"problem": "p1", "answer": "\\frac{1}{2}"}, {"question": "p2", "final_answer": ["$3$", "3.0"]}]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = prepare_minerva(tmp_path / "out", {"kind": "local", "path": str(folder)}, 0)
    assert result["test"]["n"] == 2
    got = get_task("minerva").load("test", tmp_path / "out")
    assert got[1]["answers"] == ["3", "3.0"] and got[0]["answer"] == "\\frac{1}{2}"
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"math500.*nowhere"):
        prepare_math500(tmp_path / "o2", {"kind": "local", "path": str(missing)}, 0)


def test_local_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "How many?", "answer": "Some steps\n#### 12"}]),
                   tmp_path / "train.parquet")
    result = prepare_gsm8k(tmp_path / "out", {"kind": "local", "path": str(tmp_path)}, 0)
    assert list(result) == ["train"]
    row = get_task("gsm8k").load("train", tmp_path / "out")[0]
    assert row["answer"] == "12" and row["problem"] == "How many?"


def test_unknown_source_kind_is_refused(tmp_path: Path) -> None:
    # Unpinned hub sources are no longer refused: they resolve at fetch time (test_tasks_sources.py).
    with pytest.raises(ValueError, match="kind"):
        prepare_math500(tmp_path, {"kind": "web"}, 0)


# ------------------------------------------------------------------ the authors' data (skipped without it)


def _local_rows(task_name: str, tmp_path: Path) -> list[dict]:
    result = prepare_task(task_name, tmp_path / task_name, {"kind": "local", "path": str(MATH_DIR)}, 0)["splits"]
    assert result["test"]["n"] == EXPECTED_ROWS[task_name]
    return get_task(task_name).load("test", tmp_path / task_name)


def _alter(gold: str) -> str:
    """Change the last digit of a gold answer, or append a term when it has none."""
    for i in range(len(gold) - 1, -1, -1):
        if gold[i].isdigit():
            return gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1 :]
    return gold + "+1"


@needs_shared
@pytest.mark.parametrize("task_name", MATH_SETS)
def test_authors_gold_answers_round_trip(tmp_path: Path, task_name: str) -> None:
    rows = _local_rows(task_name, tmp_path)
    task = get_task(task_name, grading_timeout_s=5.0)
    wrong = [r["answer"] for r in rows
             if not task.score(f"Reasoning... so the answer is \\boxed{{{r['answer']}}}.", r).correct]
    assert wrong == []  # measured: 100% on all five sets

    # Altered answers grade wrong. Numeric golds are decided in-process; of the rest, a
    # seeded sample goes through math-verify (keeps the suite fast).
    rng = random.Random(task_name)
    numeric = [r for r in rows if as_number(r["answer"]) is not None]
    other = [r for r in rows if as_number(r["answer"]) is None]
    checked = numeric + rng.sample(other, min(8, len(other)))
    passed = []
    for r in checked:
        for altered in {_alter(r["answer"]), r["answer"] + "+1"} - set(r["answers"]):
            if task.score(f"\\boxed{{{altered}}}", r).correct:
                passed.append((r["answer"], altered))
    assert passed == []


def _mv_round_trip(rows: list[dict], workers: int = 2) -> list[str]:
    """Golds that fail when only math-verify decides (no string/number shortcut)."""
    pool = grading_pool(workers)
    pool.warm()

    def fails(row: dict) -> str | None:
        ok, _ = verify_answer(last_boxed(f"\\boxed{{{row['answer']}}}"), row["answers"], timeout_s=30.0,
                              use_string_match=False, pool=pool)
        return None if ok else row["answer"]

    with ThreadPoolExecutor(workers) as ex:
        return [a for a in ex.map(fails, rows) if a is not None]


@needs_shared
def test_math_verify_alone_parses_the_gold_answers_sample(tmp_path: Path) -> None:
    """A seeded sample per set plus every known-hard gold, math-verify only."""
    sample = []
    for task_name in MATH_SETS:
        rows = _local_rows(task_name, tmp_path)
        hard = [r for r in rows if re.search(r"E_|_\{?\\|=|\\\$|\\text", r["answer"])
                or r["answer"] in MV_UNPARSEABLE.get(task_name, set())]
        sample += hard + random.Random(1).sample(rows, min(6, len(rows)))
    expected = set().union(*MV_UNPARSEABLE.values())
    assert set(_mv_round_trip(sample)) == expected


@needs_shared
@pytest.mark.slow
@pytest.mark.skipif(
    not (os.environ.get("ESREPRO_FULL_GOLD_CHECK") or os.environ.get("CI")),
    reason="set ESREPRO_FULL_GOLD_CHECK=1 (about 1 min; always on in CI)",
)
@pytest.mark.parametrize("task_name", MATH_SETS)
def test_math_verify_alone_parses_all_gold_answers(tmp_path: Path, task_name: str) -> None:
    rows = _local_rows(task_name, tmp_path)
    assert set(_mv_round_trip(rows)) == MV_UNPARSEABLE.get(task_name, set())


@needs_shared
def test_authors_gsm8k_copy(tmp_path: Path) -> None:
    result = prepare_gsm8k(tmp_path, {"kind": "local", "path": str(GSM8K_DIR)}, 0)
    assert list(result) == ["train"] and result["train"]["n"] == 8792  # openai/gsm8k train + test
    rows = get_task("gsm8k").load("train", tmp_path)
    task = get_task("gsm8k")
    assert all(task.score(f"so the answer is \\boxed{{{r['answer']}}}", r).correct for r in rows)
    assert not any(task.score(f"#### {int(r['answer']) + 1}", r).correct for r in rows[:500])
    assert all(r["source"].startswith("local:") for r in rows)


def test_non_main_thread_grading_under_timeout_reports_timeout() -> None:
    task = get_task("amc23", grading_timeout_s=0.5)
    box = {}
    thread = threading.Thread(target=lambda: box.update(s=task.score("\\boxed{9^{9^{9^{9}}}}", {"answer": "5"})))
    thread.start()
    thread.join(timeout=30)
    assert box["s"].details.get("timed_out") is True and box["s"].reward == 0.0


@pytest.mark.parametrize("response", ["\\boxed{9\x0024}", "\\boxed{9\x00\\$24}", "\\boxed{9\x00$24}"])
def test_nul_byte_does_not_turn_a_wrong_answer_right(response: str) -> None:
    """A NUL in a response is content, not the placeholder of an escaped dollar."""
    task = get_task("math500")
    assert task.score(response, {"answer": "924", "problem": "p"}).reward == 0.0
    assert task.score("\\boxed{924}", {"answer": "924", "problem": "p"}).reward == 1.0
    assert verify_answer("\\$5", ["\\$5"])[0]


_FIRST_GRADES = """
import glob, json, sys
from esrepro.tasks.math import warm_math_verify, math_verify_match
warm_math_verify()
before = set(sys.modules)
for path in sorted(glob.glob(sys.argv[1] + "/*/test.jsonl")):
    for line in open(path):
        row = json.loads(line)
        for gold in row.get("answers") or ([row["answer"]] if isinstance(row.get("answer"), str) else []):
            math_verify_match([gold], "\\\\boxed{111}")
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.startswith("sympy"))))
"""


def test_a_warm_grader_imports_nothing_more_to_grade_the_tiny_defaults_answers():
    """The grading workers' warm-up loads every part of sympy that the tiny default's gold answers reach: a lazy
    import left for the first graded answer (0.03-0.16 s each, measured) counts against its 1-s limit, where a busy
    machine turns it into a time-out and the run's responses differ from the golden ones."""
    prepared = REPO / "golden" / "tiny" / "data" / "prepared"
    assert len(list(prepared.glob("*/test.jsonl"))) >= 8
    out = subprocess.run([sys.executable, "-c", _FIRST_GRADES, str(prepared)], capture_output=True, text=True,
                         timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
