"""The task registry: names, classes, data preparation, split sizes without preparing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esrepro.cli import main
from esrepro.io import read_json
from esrepro.tasks import TASKS, Task, get_task, known_tasks, prepare_task, split_sizes, task_class
from esrepro.tasks.math import MathTask

# (task, generated source) pairs whose split sizes are checked against a real prepare.
GENERATED = [
    ("countdown", {"kind": "generated", "n_train": 7, "n_test": 5}),
    ("gsm8k", {"kind": "generated"}),
    ("gsm8k", {"kind": "generated", "n_train": 3, "n_test": 0}),
    ("math500", {"kind": "generated"}),
    ("minerva", {"kind": "generated", "n_test": 3}),  # embedded items ignore n_test
    ("olympiad_bench", {"kind": "generated"}),
    ("aime24", {"kind": "generated"}),
    ("amc23", {"kind": "generated"}),
    ("sudoku", {"kind": "generated", "n_train": 5, "n_test": 2}),
    ("arc", {"kind": "generated"}),
    ("arc", {"kind": "generated", "n_train": 3, "n_test": 10_000}),
    ("conciseness", {"kind": "generated"}),
    ("math_train", {"kind": "generated"}),
    ("math_train", {"kind": "generated", "n_train": 7, "n_test": 3}),
    ("prm800k", {"kind": "generated"}),
    ("prm800k", {"kind": "generated", "n_train": 4, "n_test": 100}),
]


def test_every_name_maps_to_its_task_class() -> None:
    assert known_tasks() == sorted(TASKS) and len(TASKS) == 12
    for name in known_tasks():
        cls = task_class(name)
        assert issubclass(cls, Task) and cls.name == name
        assert isinstance(get_task(name), cls)


@pytest.mark.parametrize("call", [
    lambda: task_class("nope"),
    lambda: get_task("nope"),
    lambda: prepare_task("nope", "out", {"kind": "generated"}, 0),
    lambda: split_sizes("nope", {"kind": "generated"}),
])
def test_unknown_task_names_the_known_ones(call) -> None:
    with pytest.raises(KeyError, match="unknown task 'nope'.*countdown.*sudoku"):
        call()


def test_base_classes_say_they_prepare_nothing(tmp_path: Path) -> None:
    class Bare(Task):
        name = "bare"

    with pytest.raises(NotImplementedError, match="'bare'"):
        Bare.prepare(tmp_path, {"kind": "generated"}, 0)
    with pytest.raises(NotImplementedError, match="'bare'"):
        Bare.split_sizes({"kind": "generated"})
    with pytest.raises(NotImplementedError, match="'math'.*math500"):
        MathTask.prepare(tmp_path, {"kind": "generated"}, 0)


@pytest.mark.parametrize(("task", "source"), GENERATED, ids=[f"{t}-{i}" for i, (t, _) in enumerate(GENERATED)])
def test_split_sizes_match_what_prepare_writes(tmp_path: Path, task: str, source: dict) -> None:
    sizes = split_sizes(task, source)
    result = prepare_task(task, tmp_path, source, 0)
    assert sizes == {split: info["n"] for split, info in result["splits"].items()}
    if task == "sudoku":  # drawn from a library: the generator and its version are recorded
        assert result["provenance"]["generator"] == "reasoning-gym mini_sudoku"
    else:
        assert result["provenance"] == {}


def test_split_sizes_of_data_known_only_once_prepared() -> None:
    assert split_sizes("countdown", {"kind": "authors", "path": "x.json"}) == {"train": 200, "test": 2000}
    assert split_sizes("countdown", {"kind": "authors", "path": "x.json", "n_train": 10}) == {"train": 10, "test": 2000}
    assert split_sizes("math500", {"kind": "local", "path": "nowhere"}) == {"test": None}
    assert split_sizes("aime24", {"kind": "hub"}) == {"test": None}
    assert split_sizes("gsm8k", {"kind": "local", "path": "nowhere", "n_train": 5}) == {"train": None, "test": None}
    assert split_sizes("gsm8k", {"kind": "hub"}) == {"train": None, "test": None}
    assert split_sizes("gsm8k", {"kind": "hub", "files": {"train": {"path": "t.parquet"}}}) == {"train": None}


@pytest.mark.parametrize(("task", "source", "key"), [
    ("countdown", {"kind": "generated", "n_train": 3}, "n_test"),
    ("countdown", {"kind": "web"}, "kind"),
    ("gsm8k", {"kind": "generated", "n_train": -1}, "n_train"),
    ("gsm8k", {"kind": "local", "n_test": "all"}, "n_test"),
    ("math500", {"kind": "bogus"}, "kind"),
    ("math500", {"kind": "local", "n_test": 1.5}, "n_test"),
    ("sudoku", {"kind": "generated", "max_empty": 13}, "max_empty"),
    ("sudoku", {"kind": "local"}, "kind"),
    ("arc", {"kind": "generated", "n_test": True}, "n_test"),
    ("conciseness", {"kind": "hub"}, "kind"),
    ("prm800k", {"kind": "url", "url": "file:///x/{revision}/{path}", "revision": "main"}, "revision"),
])
def test_split_sizes_refuse_what_prepare_refuses(task: str, source: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        split_sizes(task, source)


def test_prepare_data_manifest_records_splits_and_provenance(tmp_path: Path) -> None:
    spec = {"source": {"kind": "generated"}, "seed": 0}
    assert main(["prepare-data", "--task", "conciseness", "--spec", json.dumps(spec), "--out", str(tmp_path)]) == 0
    manifest = read_json(tmp_path / "manifest.json")
    assert {s: v["n"] for s, v in manifest["splits"].items()} == {"train": 2, "test": 8}
    assert manifest["provenance"] == {} and manifest["outputs"]["test.jsonl"]["sha256"] == manifest["splits"]["test"]["sha256"]
