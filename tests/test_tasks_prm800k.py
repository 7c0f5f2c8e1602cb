"""PRM800K: the tiny stand-in, MATH's grading of PRM800K-format answers, the pinned url source (fetched from
files the tests write, never from the network), the local release folder and the registry entry."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from esrepro.data.fetch import ChecksumError
from esrepro.essa.data import sft_completion
from esrepro.io import read_jsonl
from esrepro.settings.pipeline import DataSource
from esrepro.tasks import get_task, known_tasks, prepare_task, split_sizes, task_class
from esrepro.tasks.math import MathTask, grading_pool, last_boxed, qwen_math_prompt
from esrepro.tasks.prm800k import PRM800KTask
from esrepro.tasks.prm800k_data import embedded_items
from esrepro.tasks.sources import EMBEDDED

REPO = Path(__file__).resolve().parents[1]
REVISION = "7ecc794703b2877f63226f2477a49b34f9b25163"
# Rows in the release's math_splits format (problem, solution, answer, subject, level, unique_id).
TRAIN = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "$\\frac{2}{4} + \\frac{1}{4} = "
     "\\boxed{\\frac{3}{4}}$.", "answer": "\\frac{3}{4}", "subject": "Prealgebra", "level": 2,
     "unique_id": "train/prealgebra/1.json"},
    {"problem": "What is $200 \\cdot 200$?", "solution": "$200^2 = \\boxed{40,\\!000}$.", "answer": "40,\\!000",
     "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/2.json"},
]
TEST = [{"problem": "Compute $2 + 3$.", "solution": "$2 + 3 = \\boxed{5}$.", "answer": "5", "subject": "Algebra",
         "level": 1, "unique_id": "test/algebra/3.json"}]


@pytest.fixture(scope="module", autouse=True)
def warm_pool():
    grading_pool().warm()


def _write_release(root: Path, revision: str = REVISION) -> dict[str, str]:
    """The two math_splits files under ``root/<revision>/prm800k/math_splits/``; their sha256 per split."""
    shas = {}
    for split, rows in (("train", TRAIN), ("test", TEST)):
        path = root / revision / "prm800k" / "math_splits" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        shas[split] = hashlib.sha256(path.read_bytes()).hexdigest()
    return shas


def _url_source(root: Path, raw: Path, shas: dict[str, str]) -> dict:
    return {"kind": "url", "url": root.as_uri() + "/{revision}/{path}", "revision": REVISION, "raw_dir": str(raw),
            "files": {split: {"path": f"prm800k/math_splits/{split}.jsonl", "sha256": sha}
                      for split, sha in shas.items()}}


# ------------------------------------------------------------------ the tiny stand-in


def test_tiny_stand_in_prepares_offline(tmp_path: Path) -> None:
    assert split_sizes("prm800k", {"kind": "generated"}) == {"train": 12, "test": 6}
    result = prepare_task("prm800k", tmp_path, {"kind": "generated"}, 0)
    assert {s: v["n"] for s, v in result["splits"].items()} == {"train": 12, "test": 6}
    assert result["provenance"] == {}
    rows = {s: read_jsonl(tmp_path / f"{s}.jsonl") for s in ("train", "test")}
    assert all(r["source"] == EMBEDDED for split in rows.values() for r in split)
    assert {r["problem"] for r in rows["train"]}.isdisjoint(r["problem"] for r in rows["test"])
    for split, items in rows.items():
        assert [r["id"] for r in items] == [f"prm800k-{split}-{i}" for i in range(len(items))]
        for r in items:  # each worked solution boxes its own answer: the SFT target of ESSA's split
            assert last_boxed(r["solution"]) == r["answer"] and r["answers"] == [r["answer"]]
            assert sft_completion("prm800k", r) == r["solution"]
            assert r["subject"] and r["level"] in (1, 2, 3, 4, 5)
    capped = {"kind": "generated", "n_train": 5, "n_test": 2}
    assert split_sizes("prm800k", capped) == {"train": 5, "test": 2}
    got = prepare_task("prm800k", tmp_path / "capped", capped, 0)
    assert {s: v["n"] for s, v in got["splits"].items()} == {"train": 5, "test": 2}
    assert read_jsonl(tmp_path / "capped" / "train.jsonl") == rows["train"][:5]


def test_stand_in_solutions_are_graded_correct() -> None:
    task = get_task("prm800k")
    for split, items in embedded_items().items():
        for item in items:
            score = task.score(item["solution"], {"answer": item["answer"]})
            assert score.correct, (split, item["problem"], score.details)


# ------------------------------------------------------------------ grading


@pytest.mark.parametrize(("response", "gold", "correct"), [
    ("So the sum is $\\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}", True),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", True),
    ("\\boxed{0.75}", "\\frac{3}{4}", True),
    ("\\boxed{3/4}", "\\frac{3}{4}", True),
    ("\\boxed{\\frac{4}{3}}", "\\frac{3}{4}", False),
    ("\\boxed{40000}", "40,\\!000", True),
    ("\\boxed{40,000}", "40,\\!000", True),
    ("\\boxed{4000}", "40,\\!000", False),
    ("The point is \\boxed{(0,1)}.", "(0, 1)", True),
    ("\\boxed{9\\pi}", "9\\pi", True),
    ("The answer is 3/4.", "\\frac{3}{4}", False),
    ("\\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}", True),
])
def test_prm800k_answers_are_graded_like_math(response: str, gold: str, correct: bool) -> None:
    task = get_task("prm800k")
    score = task.score(response, {"answer": gold, "answers": [gold]})
    assert (score.correct, score.reward) == (correct, 1.0 if correct else 0.0)
    assert task.prompt({"problem": "p"}) == qwen_math_prompt("p")


# ------------------------------------------------------------------ the pinned url source


def test_url_source_is_verified_before_use(tmp_path: Path) -> None:
    release, raw = tmp_path / "release", tmp_path / "raw"
    source = _url_source(release, raw, _write_release(release))
    assert split_sizes("prm800k", source) == {"train": None, "test": None}
    result = prepare_task("prm800k", tmp_path / "out", source, 0)
    assert {s: v["n"] for s, v in result["splits"].items()} == {"train": 2, "test": 1}
    prov = result["provenance"]
    assert prov["kind"] == "url" and prov["revision"] == REVISION
    assert all(f["verified"] and f["sha256"] == source["files"][s]["sha256"] for s, f in prov["files"].items())
    assert (raw / "prm800k" / REVISION / "prm800k" / "math_splits" / "train.jsonl").is_file()
    rows = read_jsonl(tmp_path / "out" / "train.jsonl")
    assert [r["answer"] for r in rows] == ["\\frac{3}{4}", "40,\\!000"]
    assert rows[1]["unique_id"] == "test/prealgebra/2.json" and rows[0]["solution"] == TRAIN[0]["solution"]
    assert rows[0]["source"] == f"url:{release.as_uri()}/{REVISION}/"


def test_url_source_with_a_wrong_checksum_lands_nothing(tmp_path: Path) -> None:
    release, raw = tmp_path / "release", tmp_path / "raw"
    shas = _write_release(release)
    bad = _url_source(release, raw, {**shas, "train": "0" * 64})
    with pytest.raises(ChecksumError, match="train.jsonl: sha256 .* does not match pinned 0{64}"):
        prepare_task("prm800k", tmp_path / "out", bad, 0)
    assert not (raw / "prm800k" / REVISION / "prm800k" / "math_splits" / "train.jsonl").exists()
    assert not (tmp_path / "out" / "train.jsonl").exists()
    good = _url_source(release, raw, shas)
    prepare_task("prm800k", tmp_path / "out", good, 0)
    kept = raw / "prm800k" / REVISION / "prm800k" / "math_splits" / "test.jsonl"
    kept.write_text("tampered\n")  # a copy already under raw_dir is verified again
    with pytest.raises(ChecksumError, match="does not match"):
        prepare_task("prm800k", tmp_path / "again", good, 0)


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s["files"]["train"].pop("sha256"), r"files\.train\.sha256 is required"),
    (lambda s: s["files"]["test"].update(sha256=None), r"files\.test\.sha256 is required"),
    (lambda s: s.update(revision="main"), "'revision' must be a commit"),
    (lambda s: s.pop("revision"), "'revision' must be a commit"),
    (lambda s: s.update(url="https://example.org/train.jsonl"), r"'url' must be a template with \{revision\}"),
    (lambda s: s.update(files={}), "'files'"),
    (lambda s: s["files"]["train"].pop("path"), r"files\.train needs 'path'"),
    (lambda s: s.pop("raw_dir"), "'raw_dir'"),
])
def test_url_source_refuses_to_skip_its_pins(tmp_path: Path, change, message: str) -> None:
    release = tmp_path / "release"
    source = _url_source(release, tmp_path / "raw", _write_release(release))
    change(source)
    with pytest.raises(ValueError, match=message):
        split_sizes("prm800k", source)
    with pytest.raises(ValueError, match=message):
        prepare_task("prm800k", tmp_path / "out", source, 0)
    assert not (tmp_path / "raw").exists()


# ------------------------------------------------------------------ local and hub sources


def test_local_release_folder_and_bad_rows(tmp_path: Path) -> None:
    _write_release(tmp_path)
    folder = tmp_path / REVISION / "prm800k" / "math_splits"
    got = prepare_task("prm800k", tmp_path / "out", {"kind": "local", "path": str(folder), "n_train": 1}, 0)
    assert {s: v["n"] for s, v in got["splits"].items()} == {"train": 1, "test": 1}
    assert read_jsonl(tmp_path / "out" / "test.jsonl")[0]["source"] == f"local:{folder}"
    no_answer = tmp_path / "no_answer.jsonl"  # the gold answer falls back to the solution's last box
    no_answer.write_text(json.dumps({"problem": "p", "solution": "so $\\boxed{\\frac{1}{2}}$."}) + "\n")
    one_file = {"kind": "local", "path": str(no_answer)}
    assert split_sizes("prm800k", one_file) == {"train": None}  # one file is a train split, not a test split too
    assert set(prepare_task("prm800k", tmp_path / "b", one_file, 0)["splits"]) == {"train"}
    assert read_jsonl(tmp_path / "b" / "train.jsonl")[0]["answer"] == "\\frac{1}{2}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "p", "solution": "no box"}) + "\n")
    with pytest.raises(ValueError, match="train row 0 has no answer"):
        prepare_task("prm800k", tmp_path / "c", {"kind": "local", "path": str(bad)}, 0)
    bad.write_text(json.dumps({"question_text": "p", "answer": "1"}) + "\n")
    with pytest.raises(KeyError, match="none of the fields.*problem"):
        prepare_task("prm800k", tmp_path / "c", {"kind": "local", "path": str(bad)}, 0)


def test_hub_and_unknown_kinds_are_refused_without_their_keys() -> None:
    with pytest.raises(ValueError, match="repo_id"):
        split_sizes("prm800k", {"kind": "hub"})
    hub = {"kind": "hub", "repo_id": "someone/math-splits", "files": {"train": {"path": "train.jsonl"}}}
    assert split_sizes("prm800k", hub) == {"train": None}
    with pytest.raises(ValueError, match="kind"):
        split_sizes("prm800k", {"kind": "authors"})


# ------------------------------------------------------------------ registry and config


def test_registry_and_the_papers_source() -> None:
    assert "prm800k" in known_tasks()
    cls = task_class("prm800k")
    assert cls is PRM800KTask and issubclass(cls, MathTask) and cls.name == "prm800k"
    assert cls.score is MathTask.score and cls.prompt is MathTask.prompt
    source = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())["data"]["prm800k"]["source"]
    DataSource.model_validate(source)
    assert source["kind"] == "url" and source["revision"] == REVISION
    assert split_sizes("prm800k", source) == {"train": None, "test": None}
